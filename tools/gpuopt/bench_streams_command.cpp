// `gpuopt bench streams [--json] [--quick] [--only KEYS] [--list]`: critical-task latency under
// background load per isolation mode (priority streams, SM partitions), and eager launch vs CUDA
// Graph replay.
#include <memory>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/streams.hpp"

namespace gpuopt::cli {
namespace {

struct StreamsArgs {
  bool quick = false;
  int samples = 0;
  int device = 0;
  bool no_green_contexts = false;
  BenchCommandArgs common;
};

int run_bench_streams(const StreamsArgs& args) {
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  options.use_green_contexts = !args.no_green_contexts;
  const BenchFamily family{"streams", [] { return bench::streams::make_suite(); }, nullptr,
                           bench::streams::exit_code_for};
  return run_bench_command(family, options, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 45, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<StreamsArgs>();
  CLI::App* command = parent.add_subcommand(
      "streams",
      "Critical-task latency vs background kernels per isolation mode (same stream, priorities, "
      "SM partition) and eager launch vs CUDA Graph replay");
  command->add_flag("--quick", args->quick, "0.4 s per mode instead of 2 s (under 10 s in all)");
  command->add_option("--samples", args->samples, "graph_launch samples (default 15, quick 5)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device", args->device, "CUDA device ordinal");
  command->add_flag("--no-green-contexts", args->no_green_contexts,
                    "sm_partition mode on priority streams even where green contexts exist");
  add_bench_flags(*command, args->common, "contention,graph_launch");
  command->callback([args, &exit_code] { exit_code = run_bench_streams(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
