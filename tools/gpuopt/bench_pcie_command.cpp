// `gpuopt bench pcie [--sizes LIST] [--quick] [--json] [--samples N] [--only KEYS] [--list]`:
// host<->device bandwidth and latency with a verdict on the PCIe link.
#include <memory>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/pcie.hpp"

namespace gpuopt::cli {
namespace {

struct PcieArgs {
  std::string sizes;
  bool quick = false;
  int samples = 0;
  int device = 0;
  BenchCommandArgs common;
};

int run_bench_pcie(const PcieArgs& args) {
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  if (!args.sizes.empty()) {
    auto sizes = bench::parse_sizes(args.sizes);
    if (!sizes.ok()) {
      print_error("bench pcie", sizes.status());
      return kExitErrors;
    }
    options.sizes = *sizes;
  }
  const BenchFamily family{"pcie", [] { return bench::pcie::make_catalogue(); },
                           [&options] { return bench::pcie::make_suite(options); },
                           bench::pcie::exit_code_for};
  return run_bench_command(family, options, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 10, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<PcieArgs>();
  CLI::App* command = parent.add_subcommand(
      "pcie",
      "Host<->device bandwidth (pinned, pageable, remote NUMA node, bidirectional, SM copies), "
      "device copies and latency, with a verdict on the PCIe link");
  command->add_option("--sizes", args->sizes,
                      "transfer sizes, e.g. 4K,1M,256M,1G (default 4K,64K,1M,16M,256M,1G; "
                      "--quick: 1M,256M)");
  command->add_flag("--quick", args->quick, "short run for audit (fewer sizes and samples)");
  command->add_option("--samples", args->samples, "timed samples per size (default 10, quick 5)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device", args->device, "CUDA device ordinal");
  add_bench_flags(*command, args->common, "host_device_latency_ce");
  command->callback([args, &exit_code] { exit_code = run_bench_pcie(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
