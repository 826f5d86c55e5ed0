// `gpuopt bench vector [--quick] [--json] [--data FILE] [--only KEYS] [--list]`: the vector store's
// ingest, cold open, exact and IVF search (CPU) and exact search (GPU), scored against float64
// ground truth.
#include <memory>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/vector.hpp"

namespace gpuopt::cli {
namespace {

namespace vb = bench::vector_bench;

struct VectorBenchArgs {
  bench::BenchOptions bench;
  vb::VectorBenchOptions vector;
  BenchCommandArgs common;
  bool progress = false;  // the old --progress: the progress line now follows the terminal
};

int run_bench_vector(const VectorBenchArgs& args) {
  // Usage errors: exit 2 before anything runs, like an unknown --only name.
  if (!args.vector.queries_path.empty() && args.vector.data_path.empty()) {
    print_error("bench vector", invalid_argument("--queries-file needs --data"));
    return kExitErrors;
  }
  for (std::size_t nprobe : args.vector.nprobes) {
    if (nprobe == 0) {
      print_error("bench vector", invalid_argument("--nprobe values must be at least 1"));
      return kExitErrors;
    }
  }
  // The suite's testcases load their data on first use, so the catalogue touches no file or
  // device: --list and the --only check answer at once.
  const BenchFamily family{"vector", [&args] { return vb::make_suite(args.bench, args.vector); },
                           nullptr, vb::exit_code_for};
  return run_bench_command(family, args.bench, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 75, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<VectorBenchArgs>();
  CLI::App* command = parent.add_subcommand(
      "vector",
      "Vector store: ingest, cold open, exact/IVF search on CPU and GPU vs exact ground truth");
  command->add_flag("--quick", args->bench.quick,
                    "Small run: 20000 base vectors, 200 queries, short nprobe sweep");
  command->add_option("--data", args->vector.data_path,
                      "Base vectors (fvecs, npy, IDX); default Fashion-MNIST when installed, "
                      "else synthetic. Without --queries-file the last rows become the queries");
  command->add_option("--queries-file", args->vector.queries_path, "Query vectors (same formats)");
  command->add_flag("--synthetic", args->vector.synthetic, "Seeded synthetic clustered data");
  command->add_option("--rows", args->vector.base_rows, "Base vectors to use (0 = all)");
  command->add_option("--queries", args->vector.queries, "Queries (default 1000, quick 200)");
  command->add_option("--dim", args->vector.synthetic_dim, "Dimension of the synthetic set")
      ->check(CLI::Range(1, 65536));
  command->add_option("--k", args->vector.k, "Neighbours per query")->check(CLI::Range(1, 64));
  command->add_option("--nlist", args->vector.nlist, "IVF lists (0 = about 4*sqrt(rows))");
  command->add_option("--nprobe", args->vector.nprobes, "IVF nprobe values to sweep")
      ->delimiter(',');
  command->add_option("--single", args->vector.single_queries,
                      "Queries timed one at a time (default 200, quick 100)");
  command->add_option("--threads", args->vector.threads, "CPU threads (0 = all)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--work-dir", args->vector.work_dir,
                      "Where the bench store is made (default a temp dir); removed after");
  command->add_option("--export", args->vector.export_dir,
                      "Write base/queries/truth .npy here for bench/vector/engines.py");
  command->add_option("--device", args->bench.device, "CUDA device ordinal");
  add_bench_flags(*command, args->common, "ingest,exact-cpu");
  command->add_flag("--progress", args->progress)->group("");
  command->callback([args, &exit_code] { exit_code = run_bench_vector(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
