// `gpuopt bench scaler [--json] [--quick] [--only KEYS] [--list]`: the loss scaler's fused kernel
// against a device copy.
#include <memory>
#include <string>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/scaler.hpp"

namespace gpuopt::cli {
namespace {

struct ScalerArgs {
  bool quick = false;
  int samples = 0;
  int device = 0;
  BenchCommandArgs common;
};

int run_bench_scaler(const ScalerArgs& args) {
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  const BenchFamily family{"scaler", [] { return bench::scaler::make_suite(); }, nullptr,
                           bench::scaler::exit_code_for};
  return run_bench_command(family, options, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 60, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<ScalerArgs>();
  CLI::App* command = parent.add_subcommand(
      "scaler", "Loss scaler: fused fp16 unscale/overflow kernel over 1 GiB vs a device copy");
  command->add_flag("--quick", args->quick, "fewer samples");
  command->add_option("--samples", args->samples, "timed samples (default 40, quick 10)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device", args->device, "CUDA device ordinal");
  add_bench_flags(*command, args->common, "unscale_fp16");
  command->callback([args, &exit_code] { exit_code = run_bench_scaler(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
