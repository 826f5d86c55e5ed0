// Subcommands register themselves here, so each layer's CLI lives in its own file
// (tools/gpuopt/<name>_command.cpp) and main.cpp never needs editing for a new one.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace gpuopt::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitWarnings = 1;
inline constexpr int kExitErrors = 2;
inline constexpr int kExitToolFailed = 3;

// Adds one subcommand to `parent`; its callback must store its exit code in `exit_code`.
using CommandSetup = std::function<void(CLI::App& parent, int& exit_code)>;

struct CommandRegistration {
  // `group` is "" for a top-level command, or "bench" for `gpuopt bench NAME`.
  CommandRegistration(std::string group, int order, CommandSetup setup);
};

struct RegisteredCommand {
  std::string group;
  int order;
  CommandSetup setup;
};

std::vector<RegisteredCommand>& command_registry();

// True when stdout is a terminal and NO_COLOR is unset.
bool use_color(int fd);

}  // namespace gpuopt::cli

#define GPUOPT_CLI_CONCAT_INNER(a, b) a##b
#define GPUOPT_CLI_CONCAT(a, b) GPUOPT_CLI_CONCAT_INNER(a, b)
// GPUOPT_REGISTER_COMMAND("bench", 10, [](CLI::App& parent, int& exit_code) { ... });
#define GPUOPT_REGISTER_COMMAND(group, order, setup)                                      \
  static ::gpuopt::cli::CommandRegistration GPUOPT_CLI_CONCAT(gpuopt_command_, __LINE__)( \
      group, order, setup)
