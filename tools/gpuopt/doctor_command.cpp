// `gpuopt doctor`: diagnose the GPU platform (PCIe, IOMMU, ASPM, NVML, leaks, Vulkan); read-only.
#include <unistd.h>

#include <cstdio>

#include "command_registry.hpp"
#include "gpuopt/doctor/doctor.hpp"
#include "numeric_checks.hpp"

namespace {

struct DoctorArguments {
  std::string root = "/";
  bool json = false;
  bool prometheus = false;
  bool all = false;
  bool load = false;
  bool no_vulkan = false;
  double watch_s = 0;
  double duration_s = 0;
};

int run_doctor(const DoctorArguments& arguments) {
  using namespace gpuopt::doctor;
  Options options;
  options.root = arguments.root;
  options.all_devices = arguments.all;
  options.load = arguments.load;
  options.use_vulkan = !arguments.no_vulkan;
  auto collected = collect(options);
  if (!collected.ok()) {
    std::fprintf(stderr, "gpuopt doctor: %s\n", collected.status().message().c_str());
    return gpuopt::cli::kExitToolFailed;
  }
  Report report = std::move(collected).value();
  judge(report);
  std::optional<WatchResult> watched;
  if (arguments.watch_s > 0) {
    double duration = arguments.duration_s > 0 ? arguments.duration_s : arguments.watch_s * 10;
    auto result = watch(options, report, arguments.watch_s, duration);
    if (!result.ok()) {
      std::fprintf(stderr, "gpuopt doctor: %s\n", result.status().message().c_str());
      return gpuopt::cli::kExitToolFailed;
    }
    watched = std::move(result).value();
  }
  if (arguments.json) {
    auto json = to_json(report);
    if (watched) json["watch"] = watch_to_json(*watched);
    std::fputs((dump_json(json) + "\n").c_str(), stdout);
  } else if (arguments.prometheus) {
    std::fputs(render_prometheus(report).c_str(), stdout);
  } else {
    std::fputs(render_text(report, gpuopt::cli::use_color(STDOUT_FILENO)).c_str(), stdout);
    if (watched) std::fputs(render_watch_text(*watched).c_str(), stdout);
  }
  return exit_code(report);
}

GPUOPT_REGISTER_COMMAND("", 10, [](CLI::App& parent, int& exit_code) {
  auto arguments = std::make_shared<DoctorArguments>();
  CLI::App* command = parent.add_subcommand(
      "doctor",
      "Diagnose the GPU platform: PCIe links, IOMMU, ASPM, NVML, leaked contexts, Vulkan");
  command->add_option("--root", arguments->root,
                      "Read /sys, /proc and /etc under DIR (a recorded machine; no NVML)");
  // A missing --root is checked by collect(): the tool's failure (exit 3), as docs/doctor.md says,
  // not a usage error.
  auto* json =
      command->add_flag("--json", arguments->json, "JSON (docs/schemas/doctor.schema.json)");
  command->add_flag("--prometheus", arguments->prometheus, "Prometheus text exposition")
      ->excludes(json);
  command->add_flag("--all", arguments->all,
                    "Describe every PCI device, not only GPUs/accelerators");
  command->add_flag("--load", arguments->load,
                    "Judge the link under a short GPU load (launches a 0.5 s spin kernel)");
  command->add_flag("--no-vulkan", arguments->no_vulkan, "Skip the Vulkan probe");
  command->add_option("--watch", arguments->watch_s, "Sample every SECONDS")
      ->check(gpuopt::cli::finite_number_in(0.01, 86400.0));
  command->add_option("--duration", arguments->duration_s, "Watch for SECONDS (default 10 samples)")
      ->check(gpuopt::cli::finite_number_in(0.01, 1e7));
  command->callback([arguments, &exit_code] { exit_code = run_doctor(*arguments); });
});

}  // namespace
