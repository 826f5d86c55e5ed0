// `gpuopt bench scaler [--json] [--quick]`: the loss scaler's fused kernel against a device copy.
#include <cstdio>
#include <memory>
#include <string>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/scaler.hpp"

namespace gpuopt::cli {
namespace {

struct ScalerArgs {
  bool json = false;
  bool quick = false;
  int samples = 0;
  int device = 0;
};

int run_bench_scaler(const ScalerArgs& args) {
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  const bench::Suite suite = bench::scaler::make_suite();
  const std::vector<bench::TestcaseResult> results = run_and_print(suite, options, args.json);
  return bench::scaler::exit_code_for(results);
}

GPUOPT_REGISTER_COMMAND("bench", 60, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<ScalerArgs>();
  CLI::App* command = parent.add_subcommand(
      "scaler", "Loss scaler: fused fp16 unscale/overflow kernel over 1 GiB vs a device copy");
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
  command->add_flag("--quick", args->quick, "fewer samples");
  command->add_option("--samples", args->samples, "timed samples (default 40, quick 10)");
  command->add_option("--device", args->device, "CUDA device ordinal");
  command->callback([args, &exit_code] { exit_code = run_bench_scaler(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
