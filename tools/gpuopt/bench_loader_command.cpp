// `gpuopt bench loader [--cpu] [--quick] [--json] [--only KEYS] [--list]`: the adaptive prefetch
// loader against fixed depths 2 and 8, for a constant and a bursty producer feeding a consumer of
// set duration; with
// `--record-file PATH --io auto|pread|cufile|compare`, the record-file read paths instead (pread +
// pinned staging + H2D against cuFile straight into device batches).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/loader.hpp"
#include "gpuopt/data/dataset.hpp"
#include "numeric_checks.hpp"

namespace gpuopt::cli {
namespace {

struct RecordArgs {
  std::string io;              // auto, pread, cufile, compare; empty = the synthetic suite
  std::size_t create_mib = 0;  // > 0: write this many MiB of random records first
  bench::loader::RecordIoBenchOptions options;
};

struct LoaderArgs {
  bench::BenchOptions bench;
  bench::loader::LoaderBenchOptions loader;
  std::string producer_cost = "sleep";
  RecordArgs record;
  BenchCommandArgs common;
};

int run_record_file_bench(const LoaderArgs& args) {
  const RecordArgs& record = args.record;
  if (record.options.path.empty()) {
    std::fprintf(stderr, "gpuopt bench loader: --io needs --record-file PATH\n");
    return kExitErrors;
  }
  auto paths = bench::loader::record_io_paths(record.io);
  if (!paths.ok()) {
    std::fprintf(stderr, "gpuopt bench loader: --io: %s (or compare)\n",
                 paths.status().message().c_str());
    return kExitErrors;
  }
  const BenchFamily family{
      "loader",
      [&record, &paths] { return bench::loader::make_record_io_suite(record.options, *paths); },
      nullptr, bench::loader::record_io_exit_code_for};
  // Work starts below: --output is checked first, and --list needs no record file.
  if (!output_usable("bench loader", args.common.output)) return kExitErrors;
  if (args.common.list) return run_bench_command(family, args.bench, args.common);
  if (record.create_mib > 0) {
    Status created = bench::loader::create_record_file(record.options.path, record.create_mib);
    if (!created.ok()) {
      print_error("bench loader", created);
      return exit_code_for_error(created);
    }
  }
  // --io cufile insists: a machine without cuFile is an error here, not a waiver.
  if (record.io == "cufile") {
    auto opened = data::open_record_file(
        {record.options.path, record.options.record_bytes, data::RecordIo::kCufile});
    if (!opened.ok()) {
      print_error("bench loader", opened.status());
      return kExitErrors;
    }
  }
  return run_bench_command(family, args.bench, args.common);
}

int run_bench_loader(LoaderArgs args) {
  if (!args.record.io.empty() || !args.record.options.path.empty())
    return run_record_file_bench(args);
  if (args.producer_cost == "busy") {
    args.loader.producer_cost = data::CostMode::kBusyWait;
  } else if (args.producer_cost != "sleep") {
    std::fprintf(stderr, "gpuopt bench loader: --producer-cost must be sleep or busy, not '%s'\n",
                 args.producer_cost.c_str());
    return kExitErrors;
  }
  const BenchFamily family{"loader",
                           [&args] { return bench::loader::make_suite(args.bench, args.loader); },
                           nullptr, bench::loader::exit_code_for};
  return run_bench_command(family, args.bench, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 50, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<LoaderArgs>();
  CLI::App* command = parent.add_subcommand(
      "loader", "Adaptive prefetch loader vs fixed depth 2 and 8 (constant and bursty producers)");
  command->add_flag("--cpu", args->loader.cpu, "Host consumer (busy-wait) even when a GPU exists");
  command->add_flag("--quick", args->bench.quick, "Fewer batches per run");
  command->add_option("--consumer-us", args->loader.consumer_us, "Consumer time per batch (us)")
      ->check(finite_number_in(0.001, 1e9));
  command->add_option("--batches", args->loader.batches,
                      "Batches per run (default 800, quick 300)");
  command->add_option("--batch-size", args->loader.batch_size, "Samples per batch")
      ->check(CLI::PositiveNumber);
  command->add_option("--sample-bytes", args->loader.sample_bytes,
                      "Bytes per sample (default 16 KiB CPU, 64 KiB GPU)");
  command->add_option("--workers", args->loader.workers, "Loader worker threads")
      ->check(CLI::Range(1, 1024));
  command->add_option("--sample-us", args->loader.sample_us, "Producer cost per sample (us)")
      ->check(finite_number_in(0.0, 1e9));
  command->add_option("--stall-every", args->loader.stall_every,
                      "Bursty: one sample in this many stalls");
  command->add_option("--stall-us", args->loader.stall_us, "Bursty: stall length (us)")
      ->check(finite_number_in(0.0, 1e9));
  command->add_option("--producer-cost", args->producer_cost,
                      "sleep (models I/O, default) or busy (burns CPU)");
  command->add_option("--device", args->bench.device, "CUDA device ordinal");
  add_bench_flags(*command, args->common, "constant,bursty");
  command->add_option("--record-file", args->record.options.path,
                      "Read this record file through the loader instead of the synthetic suite");
  command->add_option("--io", args->record.io,
                      "Record-file read path: auto, pread, cufile, or compare (pread and cufile)");
  command
      ->add_option("--record-bytes", args->record.options.record_bytes,
                   "Record-file mode: bytes per record (default 512 KiB)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--record-batch", args->record.options.batch_size,
                   "Record-file mode: records per batch (default 8)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--record-workers", args->record.options.workers,
                   "Record-file mode: loader workers (default 8)")
      ->check(CLI::Range(1, 1024));
  command->add_option("--create-mib", args->record.create_mib,
                      "Record-file mode: first write this many MiB of random records to the file");
  command
      ->add_option("--repeats", args->record.options.repeats,
                   "Record-file mode: passes over the file per path (default 3)")
      ->check(CLI::Range(1, 100));
  command->callback([args, &exit_code] { exit_code = run_bench_loader(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
