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

std::string_view query_engine_name(QueryEngine engine) {
  switch (engine) {
    case QueryEngine::kCpu:
      return "cpu";
    case QueryEngine::kGpu:
      return "gpu";
    case QueryEngine::kAuto:
      return "auto";
  }
  return "cpu";
}

StatusOr<QueryEngine> parse_query_engine(std::string_view text) {
  if (text == "cpu") return QueryEngine::kCpu;
  if (text == "gpu") return QueryEngine::kGpu;
  if (text == "auto") return QueryEngine::kAuto;
  return invalid_argument(fmt::format("unknown engine \"{}\" (expected cpu, gpu or auto)", text));
}

}  // namespace gpuopt::vector
