// gpuopt CLI entry point: builds the subcommand tree from the registry, parses, returns the exit
// code.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "command_registry.hpp"

namespace gpuopt::cli {

CommandRegistration::CommandRegistration(std::string group, int order, CommandSetup setup) {
  command_registry().push_back({std::move(group), order, std::move(setup)});
}

std::vector<RegisteredCommand>& command_registry() {
  static std::vector<RegisteredCommand> registry;
  return registry;
}

bool use_color(int fd) { return std::getenv("NO_COLOR") == nullptr && isatty(fd) == 1; }

}  // namespace gpuopt::cli

int main(int argc, char** argv) {
  using namespace gpuopt::cli;
  CLI::App app{"gpuopt: find what slows a GPU machine, measure it, and fix it (read-only)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "gpuopt 0.1.0");

  auto registry = command_registry();
  std::stable_sort(registry.begin(), registry.end(),
                   [](const auto& a, const auto& b) { return a.order < b.order; });
  int exit_code = kExitOk;
  CLI::App* bench = nullptr;
  for (auto& command : registry) {
    if (command.group.empty()) {
      command.setup(app, exit_code);
    } else if (command.group == "bench") {
      if (bench == nullptr) {
        bench = app.add_subcommand("bench", "Measure one part of the stack against a reference");
        bench->require_subcommand(1);
      }
      command.setup(*bench, exit_code);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // A usage error (unknown flag, a value out of range) is the caller's error: exit 2.
    int code = app.exit(error);
    return code == 0 ? kExitOk : kExitErrors;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpuopt: %s\n", error.what());
    return kExitToolFailed;
  }
  return exit_code;
}
