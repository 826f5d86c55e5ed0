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

struct IvfParams {
  std::size_t nlist = 0;  // 0 = about 4*sqrt(rows), rounded to a power of two
  int iterations = 10;    // k-means iterations
  std::size_t max_train_points_per_list = 256;
  std::uint64_t seed = 1234;
};

struct QueryOptions {
  std::size_t k = 10;
  IndexKind index = IndexKind::kExact;
  std::size_t nprobe = 8;
  IvfParams ivf;           // used when the IVF index has to be (re)built
  std::string where_json;  // Chroma-style `where` filter; empty = none
  int threads = 0;         // 0 = all hardware threads
};

// results[q] holds up to k hits for query q, closest first.
using SearchResults = std::vector<std::vector<SearchHit>>;

}  // namespace gpuopt::vector
