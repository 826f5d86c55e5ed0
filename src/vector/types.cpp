// Names and parsers for the vector store's enums.
#include "gpuopt/vector/types.hpp"

#include <fmt/format.h>

namespace gpuopt::vector {

std::string_view metric_name(Metric metric) {
  switch (metric) {
    case Metric::kL2:
      return "l2";
    case Metric::kInnerProduct:
      return "ip";
    case Metric::kCosine:
      return "cosine";
  }
  return "l2";
}

StatusOr<Metric> parse_metric(std::string_view text) {
  if (text == "l2") return Metric::kL2;
  if (text == "ip") return Metric::kInnerProduct;
  if (text == "cosine") return Metric::kCosine;
  return invalid_argument(fmt::format("unknown metric \"{}\" (expected l2, ip or cosine)", text));
}

StatusOr<IndexKind> parse_index_kind(std::string_view text) {
  if (text == "exact") return IndexKind::kExact;
  if (text == "ivf") return IndexKind::kIvf;
  return invalid_argument(fmt::format("unknown index \"{}\" (expected exact or ivf)", text));
}

}  // namespace gpuopt::vector
