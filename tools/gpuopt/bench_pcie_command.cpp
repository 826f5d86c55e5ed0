// `gpuopt bench pcie [--sizes LIST] [--quick] [--json] [--samples N] [--testcase KEY...]`:
// host<->device bandwidth and latency with a verdict on the PCIe link.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
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
  bool json = false;
  bool list = false;
  int samples = 0;
  int device = 0;
  std::vector<std::string> testcases;
};

int run_bench_pcie(const PcieArgs& args) {
  const std::vector<std::string> keys = bench::pcie::testcase_keys();
  if (args.list) {
    for (const auto& key : keys) std::printf("%s\n", key.c_str());
    return kExitOk;
  }
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  options.progress = isatty(STDERR_FILENO) == 1;
  for (const auto& key : args.testcases) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::fprintf(stderr, "gpuopt bench pcie: unknown testcase '%s' (see --list)\n", key.c_str());
      return kExitToolFailed;
    }
  }
  options.only = args.testcases;
  if (!args.sizes.empty()) {
    auto sizes = bench::parse_sizes(args.sizes);
    if (!sizes.ok()) {
      std::fprintf(stderr, "gpuopt bench pcie: %s\n", sizes.status().message().c_str());
      return kExitToolFailed;
    }
    options.sizes = *sizes;
  }
  if (args.samples < 0) {
    std::fprintf(stderr, "gpuopt bench pcie: --samples must be positive\n");
    return kExitToolFailed;
  }
  const bench::Suite suite = bench::pcie::make_suite(options);
  const std::vector<bench::TestcaseResult> results = run_and_print(suite, options, args.json);
  return bench::pcie::exit_code_for(results);
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
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
  command->add_option("--samples", args->samples, "timed samples per size (default 10, quick 5)");
  command->add_option("--device", args->device, "CUDA device ordinal");
  command->add_option("--testcase", args->testcases, "testcases to run (keys from --list)");
  command->add_flag("--list", args->list, "print the testcase keys and exit");
  command->callback([args, &exit_code] { exit_code = run_bench_pcie(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
