// Metadata filters: the subset of Chroma's `where` language the store supports
// ($eq $ne $gt $gte $lt $lte $in $nin $and $or), parsed from JSON and evaluated per record.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector {

// A parsed `where` clause. Semantics: a field that is absent, or holds a value of another type,
// fails every comparison except $ne and $nin (which it passes). $gt/$gte/$lt/$lte need numbers.
class Filter {
 public:
  enum class Op { kEq, kNe, kGt, kGte, kLt, kLte, kIn, kNin, kAnd, kOr };

  // Parses e.g. {"genre": "jazz", "year": {"$gte": 1990}} or {"$or": [{...}, {...}]}. Errors name
  // the JSON path and the bad operator or value, e.g. `where.year: unknown operator "$gtx"`.
  static StatusOr<Filter> parse(std::string_view json_text);

  bool matches(const Metadata& metadata) const;
  bool empty() const { return nodes_.empty(); }

 private:
  struct Node {
    Op op = Op::kAnd;
    std::string field;                  // comparisons
    std::vector<MetadataValue> values;  // one for $eq..$lte, many for $in/$nin
    std::vector<int> children;          // $and/$or: indices into nodes_
  };
  bool evaluate(int node, const Metadata& metadata) const;
  friend class FilterParser;
  std::vector<Node> nodes_;  // nodes_[0] is the root when not empty
};

// Metadata to/from a JSON object text ({"genre": "jazz", "year": 1990}); nested values rejected.
StatusOr<Metadata> parse_metadata(std::string_view json_text);
std::string metadata_to_json(const Metadata& metadata);

}  // namespace gpuopt::vector
