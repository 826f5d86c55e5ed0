// `gpuopt bench loader [--cpu] [--quick] [--json]`: the adaptive prefetch loader against fixed
// depths 2 and 8, for a constant and a bursty producer feeding a consumer of set duration.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command_registry.hpp"
#include "gpuopt/bench/loader.hpp"

namespace gpuopt::cli {
namespace {

struct LoaderArgs {
  bench::BenchOptions bench;
  bench::loader::LoaderBenchOptions loader;
  std::string producer_cost = "sleep";
  bool json = false;
};

int run_bench_loader(LoaderArgs args) {
  if (args.producer_cost == "busy") {
    args.loader.producer_cost = data::CostMode::kBusyWait;
  } else if (args.producer_cost != "sleep") {
    std::fprintf(stderr, "gpuopt bench loader: --producer-cost must be sleep or busy, not '%s'\n",
                 args.producer_cost.c_str());
    return kExitToolFailed;
  }
  for (const auto& key : args.bench.only) {
    auto keys = bench::loader::testcase_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::fprintf(stderr, "gpuopt bench loader: unknown testcase '%s' (constant, bursty)\n",
                   key.c_str());
      return kExitToolFailed;
    }
  }
  bench::Suite suite = bench::loader::make_suite(args.bench, args.loader);
  bench::BenchContext context(args.bench);
  auto results = suite.run(context);
  if (args.json) {
    std::cout << bench::to_json(suite.name(), results).dump(2) << "\n";
  } else {
    std::cout << bench::render_text(suite.name(), results);
  }
  return bench::loader::exit_code_for(results);
}

GPUOPT_REGISTER_COMMAND("bench", 50, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<LoaderArgs>();
  CLI::App* command = parent.add_subcommand(
      "loader", "Adaptive prefetch loader vs fixed depth 2 and 8 (constant and bursty producers)");
  command->add_flag("--cpu", args->loader.cpu, "Host consumer (busy-wait) even when a GPU exists");
  command->add_flag("--quick", args->bench.quick, "Fewer batches per run");
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
  command->add_option("--consumer-us", args->loader.consumer_us, "Consumer time per batch (us)")
      ->check(CLI::PositiveNumber);
  command->add_option("--batches", args->loader.batches,
                      "Batches per run (default 800, quick 300)");
  command->add_option("--batch-size", args->loader.batch_size, "Samples per batch")
      ->check(CLI::PositiveNumber);
  command->add_option("--sample-bytes", args->loader.sample_bytes,
                      "Bytes per sample (default 16 KiB CPU, 64 KiB GPU)");
  command->add_option("--workers", args->loader.workers, "Loader worker threads")
      ->check(CLI::Range(1, 1024));
  command->add_option("--sample-us", args->loader.sample_us, "Producer cost per sample (us)");
  command->add_option("--stall-every", args->loader.stall_every,
                      "Bursty: one sample in this many stalls");
  command->add_option("--stall-us", args->loader.stall_us, "Bursty: stall length (us)");
  command->add_option("--producer-cost", args->producer_cost,
                      "sleep (models I/O, default) or busy (burns CPU)");
  command->add_option("--device", args->bench.device, "CUDA device ordinal");
  command->add_option("--testcase", args->bench.only, "Run only these: constant, bursty");
  command->callback([args, &exit_code] { exit_code = run_bench_loader(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
