// `gpuopt bench vector`: the vector store measured on one data set against exact ground truth
// (recall@k by id overlap and by ann-benchmarks' distance rule, QPS at batch 1 and batch 1000,
// latency percentiles, IVF build time and its QPS–recall sweep over nprobe, cold open, ingest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::bench::vector_bench {

// Where Debian's dataset-fashion-mnist package puts the IDX files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct VectorBenchOptions {
  std::string data_path;      // fvecs/npy/IDX base vectors; empty = Fashion-MNIST or synthetic
  std::string queries_path;   // optional separate query file; empty = split from the data
  bool synthetic = false;     // force the seeded synthetic set
  std::size_t base_rows = 0;  // 0 = all the data has (quick: 20000)
  std::size_t queries = 0;    // 0 = 1000 (quick: 200)
  std::size_t synthetic_dim = 128;  // dimension of the synthetic set
  std::size_t k = 10;
  std::size_t nlist = 0;             // 0 = the store's default, 4*sqrt(rows) (quick: 256)
  std::vector<std::size_t> nprobes;  // empty = 1,2,4,...,64 (quick: 1,4,16,64)
  std::size_t single_queries = 0;    // queries timed one at a time; 0 = 200 (quick: 100)
  int threads = 0;                   // 0 = all hardware threads
  std::string work_dir;              // where the bench store goes; empty = a temp dir, removed
  std::string export_dir;  // when set: writes base/queries/truth .npy for bench/vector/engines.py
};

// Base vectors and queries, both [rows, dim] row-major fp32.
struct Dataset {
  std::string name;  // "fashion-mnist", "synthetic", or the file name
  std::size_t dim = 0;
  std::size_t base_rows = 0;
  std::size_t query_rows = 0;
  std::vector<float> base;
  std::vector<float> queries;
};

// Seeded Gaussian clusters (so IVF has structure to find), deterministic for a seed.
Dataset synthetic_dataset(std::size_t base_rows, std::size_t query_rows, std::size_t dim,
                          std::uint64_t seed = 1234);
// Fashion-MNIST / a file / synthetic, as the options say (quick picks the small defaults).
StatusOr<Dataset> load_dataset(const VectorBenchOptions& options, bool quick);

// Exact k nearest neighbours under squared L2, accumulated in float64; ties go to the lower row.
struct GroundTruth {
  std::size_t k = 0;
  std::size_t query_rows = 0;
  std::vector<std::uint64_t> ids;  // [query_rows, k] row numbers
  std::vector<double> distances;   // [query_rows, k] Euclidean (not squared), ascending
};
GroundTruth brute_force_truth(const float* base, std::size_t base_rows, std::size_t dim,
                              const float* queries, std::size_t query_rows, std::size_t k,
                              int threads = 0);

// found[q] = ids returned for query q (ids are row numbers of `base`), closest first.
using FoundIds = std::vector<std::vector<std::uint64_t>>;
FoundIds ids_of(const vector::SearchResults& results);

// Recall@k as id overlap: |found[:k] ∩ truth[:k]| / k, averaged over queries. A tie at the k-th
// distance can make an exact answer score below 1 here.
double recall_id_overlap(const FoundIds& found, const GroundTruth& truth);
// ann-benchmarks' k-nn rule: a returned id counts when its true Euclidean distance (recomputed in
// float64) is at most the k-th true distance + epsilon; ties therefore count.
double recall_distance_rule(const FoundIds& found, const GroundTruth& truth, const float* base,
                            std::size_t base_rows, std::size_t dim, const float* queries,
                            double epsilon = 1e-3);

// Peak resident set of this process so far (getrusage ru_maxrss), MiB.
double peak_rss_mib();

// Testcases: ingest, cold-open, exact-cpu, ivf-cpu, exact-gpu (waived without a GPU).
Suite make_suite(const BenchOptions& bench, const VectorBenchOptions& options);
std::vector<std::string> testcase_keys();
// 2 when a testcase failed, 1 when one missed its criterion, else 0.
int exit_code_for(const std::vector<TestcaseResult>& results);

}  // namespace gpuopt::bench::vector_bench
