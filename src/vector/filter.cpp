// Parses Chroma-style `where` filters into a flat node list and evaluates them against metadata.
#include "gpuopt/vector/filter.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace gpuopt::vector {

namespace {

using Json = nlohmann::json;

StatusOr<MetadataValue> scalar_value(const Json& value, const std::string& path) {
  if (value.is_string()) return MetadataValue(value.get<std::string>());
  if (value.is_number()) return MetadataValue(value.get<double>());
  if (value.is_boolean()) return MetadataValue(value.get<bool>() ? 1.0 : 0.0);
  return invalid_argument(
      fmt::format("{}: expected a string or a number, got {}", path, value.type_name()));
}

}  // namespace

class FilterParser {
 public:
  explicit FilterParser(Filter& filter) : filter_(filter) {}

  // A `where` object: {field: value | {op: value}, "$and": [...], "$or": [...]}. Several keys in
  // one object are an implicit $and, as in Chroma.
  StatusOr<int> parse_object(const Json& object, const std::string& path) {
    if (!object.is_object()) {
      return invalid_argument(
          fmt::format("{}: expected an object, got {}", path, object.type_name()));
    }
    if (object.empty()) return invalid_argument(fmt::format("{}: empty filter object", path));
    std::vector<int> parts;
    for (const auto& [key, value] : object.items()) {
      std::string child_path = path + "." + key;
      if (key == "$and" || key == "$or") {
        if (!value.is_array() || value.empty()) {
          return invalid_argument(
              fmt::format("{}: {} needs a non-empty array of filters", child_path, key));
        }
        Filter::Node node;
        node.op = key == "$and" ? Filter::Op::kAnd : Filter::Op::kOr;
        for (std::size_t i = 0; i < value.size(); ++i) {
          GPUOPT_ASSIGN_OR_RETURN(int child,
                                  parse_object(value[i], fmt::format("{}[{}]", child_path, i)));
          node.children.push_back(child);
        }
        parts.push_back(add(std::move(node)));
      } else if (!key.empty() && key[0] == '$') {
        return invalid_argument(
            fmt::format("{}: unknown logical operator \"{}\" (expected $and or $or)", path, key));
      } else {
        GPUOPT_ASSIGN_OR_RETURN(int child, parse_field(key, value, child_path));
        parts.push_back(child);
      }
    }
    if (parts.size() == 1) return parts[0];
    Filter::Node node;
    node.op = Filter::Op::kAnd;
    node.children = std::move(parts);
    return add(std::move(node));
  }

 private:
  StatusOr<int> parse_field(const std::string& field, const Json& value, const std::string& path) {
    if (!value.is_object()) {  // shorthand {"field": value} means $eq
      GPUOPT_ASSIGN_OR_RETURN(MetadataValue scalar, scalar_value(value, path));
      Filter::Node node;
      node.op = Filter::Op::kEq;
      node.field = field;
      node.values.push_back(std::move(scalar));
      return add(std::move(node));
    }
    if (value.size() != 1) {
      return invalid_argument(
          fmt::format("{}: expected exactly one operator, got {}", path, value.size()));
    }
    // Iterate the object itself: a binding into *items().begin() would outlive the temporary
    // proxy it refers to (found by ASan).
    const auto first = value.begin();
    const std::string op_name = first.key();
    const Json& operand = first.value();
    std::string op_path = path + "." + op_name;
    static const std::pair<const char*, Filter::Op> kOps[] = {
        {"$eq", Filter::Op::kEq},   {"$ne", Filter::Op::kNe},  {"$gt", Filter::Op::kGt},
        {"$gte", Filter::Op::kGte}, {"$lt", Filter::Op::kLt},  {"$lte", Filter::Op::kLte},
        {"$in", Filter::Op::kIn},   {"$nin", Filter::Op::kNin}};
    Filter::Node node;
    node.field = field;
    bool known = false;
    for (const auto& [name, op] : kOps) {
      if (op_name == name) {
        node.op = op;
        known = true;
      }
    }
    if (!known) {
      return invalid_argument(
          fmt::format("{}: unknown operator \"{}\" (expected $eq $ne $gt $gte $lt $lte $in $nin)",
                      path, op_name));
    }
    if (node.op == Filter::Op::kIn || node.op == Filter::Op::kNin) {
      if (!operand.is_array() || operand.empty()) {
        return invalid_argument(fmt::format("{}: expected a non-empty array", op_path));
      }
      for (std::size_t i = 0; i < operand.size(); ++i) {
        GPUOPT_ASSIGN_OR_RETURN(MetadataValue scalar,
                                scalar_value(operand[i], fmt::format("{}[{}]", op_path, i)));
        node.values.push_back(std::move(scalar));
      }
    } else {
      GPUOPT_ASSIGN_OR_RETURN(MetadataValue scalar, scalar_value(operand, op_path));
      bool ordered = node.op == Filter::Op::kGt || node.op == Filter::Op::kGte ||
                     node.op == Filter::Op::kLt || node.op == Filter::Op::kLte;
      if (ordered && !std::holds_alternative<double>(scalar)) {
        return invalid_argument(fmt::format("{}: {} needs a number", op_path, op_name));
      }
      node.values.push_back(std::move(scalar));
    }
    return add(std::move(node));
  }

  int add(Filter::Node node) {
    filter_.nodes_.push_back(std::move(node));
    return static_cast<int>(filter_.nodes_.size() - 1);
  }

  Filter& filter_;
};

StatusOr<Filter> Filter::parse(std::string_view json_text) {
  Filter filter;
  if (json_text.find_first_not_of(" \t\r\n") == std::string_view::npos) return filter;
  Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("where: not valid JSON");
  // Root goes last in nodes_; move it to the front so evaluation starts at 0.
  FilterParser parser(filter);
  GPUOPT_ASSIGN_OR_RETURN(int root, parser.parse_object(json, "where"));
  Filter ordered;
  ordered.nodes_ = std::move(filter.nodes_);
  // Swap the root into slot 0 and fix up references to either slot.
  if (root != 0) {
    std::swap(ordered.nodes_[0], ordered.nodes_[root]);
    for (auto& node : ordered.nodes_) {
      for (int& child : node.children) {
        if (child == 0) {
          child = root;
        } else if (child == root) {
          child = 0;
        }
      }
    }
  }
  return ordered;
}

bool Filter::matches(const Metadata& metadata) const {
  return nodes_.empty() || evaluate(0, metadata);
}

bool Filter::evaluate(int index, const Metadata& metadata) const {
  const Node& node = nodes_[static_cast<std::size_t>(index)];
  switch (node.op) {
    case Op::kAnd:
      for (int child : node.children) {
        if (!evaluate(child, metadata)) return false;
      }
      return true;
    case Op::kOr:
      for (int child : node.children) {
        if (evaluate(child, metadata)) return true;
      }
      return false;
    default:
      break;
  }
  auto found = metadata.find(node.field);
  const MetadataValue* value = found == metadata.end() ? nullptr : &found->second;
  auto same_type = [&](const MetadataValue& other) {
    return value != nullptr && value->index() == other.index();
  };
  auto equal = [&](const MetadataValue& other) { return same_type(other) && *value == other; };
  auto compare = [&](auto predicate) {
    if (!same_type(node.values[0]) || !std::holds_alternative<double>(*value)) return false;
    return predicate(std::get<double>(*value), std::get<double>(node.values[0]));
  };
  switch (node.op) {
    case Op::kEq:
      return equal(node.values[0]);
    case Op::kNe:
      return !equal(node.values[0]);
    case Op::kGt:
      return compare([](double a, double b) { return a > b; });
    case Op::kGte:
      return compare([](double a, double b) { return a >= b; });
    case Op::kLt:
      return compare([](double a, double b) { return a < b; });
    case Op::kLte:
      return compare([](double a, double b) { return a <= b; });
    case Op::kIn:
      for (const auto& candidate : node.values) {
        if (equal(candidate)) return true;
      }
      return false;
    case Op::kNin:
      for (const auto& candidate : node.values) {
        if (equal(candidate)) return false;
      }
      return true;
    default:
      return false;
  }
}

StatusOr<Metadata> parse_metadata(std::string_view json_text) {
  Metadata metadata;
  if (json_text.find_first_not_of(" \t\r\n") == std::string_view::npos) return metadata;
  Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("metadata: not valid JSON");
  if (json.is_null()) return metadata;
  if (!json.is_object()) return invalid_argument("metadata: expected a JSON object");
  for (const auto& [key, value] : json.items()) {
    GPUOPT_ASSIGN_OR_RETURN(MetadataValue scalar, scalar_value(value, "metadata." + key));
    metadata.emplace(key, std::move(scalar));
  }
  return metadata;
}

std::string metadata_to_json(const Metadata& metadata) {
  Json json = Json::object();
  for (const auto& [key, value] : metadata) {
    if (std::holds_alternative<double>(value)) {
      json[key] = std::get<double>(value);
    } else {
      json[key] = std::get<std::string>(value);
    }
  }
  return json.dump();
}

}  // namespace gpuopt::vector
