// gpuopt CLI entry point: builds the subcommand tree from the registry, parses, returns the exit
// code.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/version.hpp"
#include "unbuilt_commands.hpp"
#include "usage_hint.hpp"

namespace gpuopt::build_info {
// Defined in the source cmake/GitRevision.cmake writes at build time.
const char* git_revision();
}  // namespace gpuopt::build_info
#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt::cli {

CommandRegistration::CommandRegistration(std::string group, int order, CommandSetup setup) {
  command_registry().push_back({std::move(group), order, std::move(setup)});
}

std::vector<RegisteredCommand>& command_registry() {
  static std::vector<RegisteredCommand> registry;
  return registry;
}

bool use_color(int fd) { return std::getenv("NO_COLOR") == nullptr && isatty(fd) == 1; }

namespace {

// The end of `gpuopt --help`; README.md ("Conventions") carries the same table.
constexpr const char* kExitCodeTable =
    "Output: -o/--output FILE for a command's output (its text, or JSON with --json; '-' = "
    "stdout), --out-dir DIR where it writes several files; every bench takes --only NAMES and "
    "--list.\n"
    "Exit codes:\n"
    "  0  healthy: nothing wrong found (info and notes at most); --help, --list, --version\n"
    "  1  warnings: something runs below what the hardware and its anchors allow\n"
    "  2  errors found (failing: a fault, a broken link, wrong results), or a usage error (an "
    "unknown command, flag or testcase, a value out of range, an output path that cannot be "
    "written)\n"
    "  3  gpuopt itself failed (a command left out of this build, a file it could not write, a "
    "stage it could not start)\n"
    "  gpuopt trace exits with the traced command's own status (128 + N after passing on signal "
    "N), or 2 or 3 when gpuopt fails before or after it.";

// What `gpuopt --version` prints: the version, the revision and how this binary was built.
std::string version_text() {
  std::string text = std::string("gpuopt ") + build_info::kVersion + "\n";
  text += std::string("git revision: ") + build_info::git_revision() + "\n";
  if (build_info::kCuda) {
    text += std::string("CUDA: on (CUDA ") + build_info::kCudaVersion + ")\n";
    text += std::string("GPU architectures: ") + build_info::kCudaArchitectures + "\n";
  } else {
    text += "CUDA: off\nGPU architectures: none\n";
  }
  text += std::string("x86 SIMD: ") + (build_info::kX86Simd ? "on" : "off") + "\n";
  text += std::string("modules: ") + build_info::kModules;
  return text;
}

// A command of a module this build leaves out: it keeps its name, takes any arguments, and says
// which option left it out instead of failing as an unknown word.
void add_unbuilt_command(CLI::App& app, const UnbuiltCommand& command, int& exit_code) {
  CLI::App* sub =
      app.add_subcommand(command.name, std::string("(not in this build: ") + command.options + ")");
  sub->prefix_command();
  sub->callback([&exit_code, command] {
    std::fprintf(stderr,
                 "gpuopt: '%s' is not in this build: it needs %s, which the configure left out "
                 "(%s); configure without that option to build it\n",
                 command.name, command.modules, command.options);
    exit_code = kExitToolFailed;
  });
}

}  // namespace

// GPUOPT_DISABLE_<TAG>=1: run as if that optional library were absent (docs/doctor.md).
void disable_libraries_from_environment() {
  for (const char* tag : {"NVML", "VULKAN", "CUFILE"}) {
    const char* value = std::getenv((std::string("GPUOPT_DISABLE_") + tag).c_str());
    if (value != nullptr && std::string(value) == "1")
      gpuopt::DynamicLibrary::set_disabled(tag, true);
  }
}

}  // namespace gpuopt::cli

int main(int argc, char** argv) {
  using namespace gpuopt::cli;
  disable_libraries_from_environment();
  CLI::App app{"gpuopt: find what slows a GPU machine, measure it, and fix it (read-only)"};
  app.footer(kExitCodeTable);
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());

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
  for (const UnbuiltCommand& command : kUnbuiltCommands) {
    if (command.name != nullptr) add_unbuilt_command(app, command, exit_code);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // A usage error (unknown flag, a value out of range) is the caller's error: exit 2.
    if (auto hint = usage_hint(app, argc, argv)) std::fprintf(stderr, "%s\n", hint->c_str());
    int code = app.exit(error);
    return code == 0 ? kExitOk : kExitErrors;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpuopt: %s\n", error.what());
    return kExitToolFailed;
  }
  return exit_code;
}
