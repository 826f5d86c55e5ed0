// `gpuopt bench vector [--quick] [--json] [--data FILE]`: the vector store's ingest, cold open,
// exact and IVF search (CPU) and exact search (GPU), scored against float64 ground truth.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
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
  bool json = false;
};

int run_bench_vector(const VectorBenchArgs& args) {
  const auto keys = vb::testcase_keys();
  for (const auto& key : args.bench.only) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string known;
      for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "gpuopt bench vector: unknown testcase '%s' (%s)\n", key.c_str(),
                   known.c_str());
      return kExitToolFailed;
    }
  }
  if (!args.vector.queries_path.empty() && args.vector.data_path.empty()) {
    std::fprintf(stderr, "gpuopt bench vector: --queries-file needs --data\n");
    return kExitToolFailed;
  }
  for (std::size_t nprobe : args.vector.nprobes) {
    if (nprobe == 0) {
      std::fprintf(stderr, "gpuopt bench vector: --nprobe values must be at least 1\n");
      return kExitToolFailed;
    }
  }
  bench::Suite suite = vb::make_suite(args.bench, args.vector);
  auto results = run_and_print(suite, args.bench, args.json);
  return vb::exit_code_for(results);
}

GPUOPT_REGISTER_COMMAND("bench", 75, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<VectorBenchArgs>();
  CLI::App* command = parent.add_subcommand(
      "vector",
      "Vector store: ingest, cold open, exact/IVF search on CPU and GPU vs exact ground truth");
  command->add_flag("--quick", args->bench.quick,
                    "Small run: 20000 base vectors, 200 queries, short nprobe sweep");
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
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
  command
      ->add_option("--testcase", args->bench.only,
                   "Run only these: ingest, cold-open, exact-cpu, ivf-cpu, exact-gpu")
      ->delimiter(',');
  command->add_flag("--progress", args->bench.progress, "Progress bar on stderr");
  command->callback([args, &exit_code] { exit_code = run_bench_vector(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
