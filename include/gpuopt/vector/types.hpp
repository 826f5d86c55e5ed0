// Plain types shared by the vector store: metrics, metadata values, search hits and options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpuopt/core/cancel.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::vector {

// Distances are "smaller is closer" for every metric: squared L2, negative inner product, and
// 1 - cosine similarity.
enum class Metric { kL2, kInnerProduct, kCosine };

std::string_view metric_name(Metric metric);  // "l2", "ip", "cosine"
StatusOr<Metric> parse_metric(std::string_view text);

// A metadata field holds a string or a number (numbers are doubles, as in JSON).
using MetadataValue = std::variant<std::string, double>;
using Metadata = std::map<std::string, MetadataValue, std::less<>>;

struct SearchHit {
  std::uint64_t id = 0;
  float distance = 0;
};

enum class IndexKind { kExact, kIvf };
StatusOr<IndexKind> parse_index_kind(std::string_view text);  // "exact" | "ivf"

// Where Collection::query runs.
enum class QueryEngine {
  kCpu,   // the CPU (SIMD) search, exact or IVF
  kGpu,   // the GPU search, exact or IVF; an error when it cannot answer (no CUDA, no device, k)
  kAuto,  // the GPU when it can answer, else the CPU, with the reason in QueryReport
};

struct IvfParams {
  std::size_t nlist = 0;  // 0 = about 4*sqrt(rows), rounded to a power of two
  int iterations = 10;    // k-means iterations
  std::size_t max_train_points_per_list = 256;
  std::uint64_t seed = 1234;
  // Where k-means runs: kAuto = the GPU when one answers, else the CPU.
  QueryEngine engine = QueryEngine::kAuto;
  int device = 0;
  // Drift thresholds: retraining is recommended once the rows added since training exceed
  // `retrain_growth` times the trained rows, or (with at least nlist of them) their mean squared
  // distance to their centroid exceeds `retrain_distance_ratio` times the training-time mean.
  double retrain_growth = 1.0;
  double retrain_distance_ratio = 1.5;
  bool auto_retrain = false;  // an IVF query retrains first once retraining is recommended
  // Polled between k-means iterations and row chunks of CPU training and assignment (and before
  // and after each GPU step): once set, Collection::build_ivf returns CANCELLED and the saved and
  // loaded index stay as they were. Null = not cancellable. The caller keeps it alive.
  const CancelToken* cancel = nullptr;
};
std::string_view query_engine_name(QueryEngine engine);  // "cpu", "gpu", "auto"
StatusOr<QueryEngine> parse_query_engine(std::string_view text);

enum class GpuPrecision {
  // Exact: the fused fp16 tensor-core pass with a conservative bound + fp64 re-rank (equals float64
  // brute force up to ties) where it applies, else the cuBLAS fp32 path (ties within fp32
  // rounding).
  kFp32,
  kTf32Rerank,  // TF32 tensor-core GEMM picks 4k candidates, re-ranked with fp32 (approximate)
  kFp32Tiled,   // always the cuBLAS fp32 tiles + top-k path (the fallback, kept for comparison)
};

// Settings of the GPU engine behind Collection::query.
struct GpuQueryOptions {
  int device = 0;  // the collection's rows are copied to this device on the first GPU query
  GpuPrecision precision = GpuPrecision::kFp32;
  std::size_t tile_rows = 16384;  // cuBLAS path: rows per GEMM tile
  // Device memory the collection's resident copy may take (0 = no cap). Past it the GPU engine
  // answers RESOURCE_EXHAUSTED naming the bytes needed and the budget; kAuto then falls back to
  // the CPU with that reason in QueryReport.
  std::size_t memory_budget_bytes = 0;
  // Batches of at most this many queries take the small-batch path (rows split across every SM;
  // GpuSearchOptions::small_batch_max_queries, capped at 16); 0 = never.
  std::size_t small_batch_max_queries = 16;
};

struct QueryOptions {
  std::size_t k = 10;
  IndexKind index = IndexKind::kExact;
  std::size_t nprobe = 8;
  IvfParams ivf;           // used when the IVF index has to be (re)built
  std::string where_json;  // Chroma-style `where` filter; empty = none
  int threads = 0;         // 0 = all hardware threads
  QueryEngine engine = QueryEngine::kCpu;
  GpuQueryOptions gpu;  // used when the GPU answers
  // Polled between tiles of the CPU exact scan, between IVF lists, and by an IVF training that the
  // query starts (ivf.cancel when that is null): once set, query returns CANCELLED (a query
  // changes nothing in the store). The GPU engine checks it only before it starts. Null = not
  // cancellable. The caller keeps it alive.
  const CancelToken* cancel = nullptr;
};

// How Collection::query answered.
struct QueryReport {
  QueryEngine engine = QueryEngine::kCpu;  // the engine that answered: kCpu or kGpu
  std::string fallback_reason;   // kAuto answered on the CPU: why the GPU did not; else empty
  bool gpu_fused = false;        // the GPU's fused tensor-core path answered (else cuBLAS tiles)
  bool gpu_small_batch = false;  // ... through its small-batch variant
  std::size_t gpu_fallback_queries = 0;  // queries the fused path handed to the cuBLAS path
  std::size_t gpu_rows_uploaded = 0;     // rows copied to the device by this call
  // Host time of making the device copy and queueing that copy (0 when the rows were resident).
  double gpu_upload_seconds = 0;
  // IVF: no index was saved, so this query trained one and saved it (ivf_retrained: the drift
  // threshold of IvfParams::auto_retrain retrained it); the seconds that took.
  bool ivf_built = false;
  bool ivf_retrained = false;
  double ivf_build_seconds = 0;
  std::size_t ivf_rows_assigned = 0;  // rows written since the index was saved, assigned now
};

// results[q] holds up to k hits for query q, closest first.
using SearchResults = std::vector<std::vector<SearchHit>>;

}  // namespace gpuopt::vector
