// Names of activity kinds, copy directions and API calls, as they appear in JSON and in the trace
// viewer.
#include "gpuopt/trace/trace_types.hpp"

#include <array>
#include <utility>

namespace gpuopt::trace {
namespace {

constexpr std::array<std::pair<ActivityKind, std::string_view>, 7> kKindNames = {{
    {ActivityKind::kKernel, "kernel"},
    {ActivityKind::kMemcpy, "memcpy"},
    {ActivityKind::kMemset, "memset"},
    {ActivityKind::kRuntimeApi, "runtime_api"},
    {ActivityKind::kDriverApi, "driver_api"},
    {ActivityKind::kNvtxRange, "nvtx_range"},
    {ActivityKind::kSynchronization, "synchronization"},
}};

constexpr std::array<std::pair<CopyDirection, std::string_view>, 6> kDirectionNames = {{
    {CopyDirection::kHostToDevice, "H2D"},
    {CopyDirection::kDeviceToHost, "D2H"},
    {CopyDirection::kDeviceToDevice, "D2D"},
    {CopyDirection::kHostToHost, "H2H"},
    {CopyDirection::kPeerToPeer, "P2P"},
    {CopyDirection::kUnknown, "unknown"},
}};

}  // namespace

std::string_view activity_kind_name(ActivityKind kind) {
  for (const auto& [value, name] : kKindNames) {
    if (value == kind) return name;
  }
  return "unknown";
}

std::string_view copy_direction_name(CopyDirection direction) {
  for (const auto& [value, name] : kDirectionNames) {
    if (value == direction) return name;
  }
  return "unknown";
}

namespace {

// Strips one trailing "_v<digits>", "_ptsz" or "_ptds" from `name`; false when there is none.
bool strip_api_suffix(std::string_view& name) {
  for (std::string_view suffix : {std::string_view("_ptsz"), std::string_view("_ptds")}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      name.remove_suffix(suffix.size());
      return true;
    }
  }
  std::size_t digits = 0;
  while (digits < name.size() && name[name.size() - 1 - digits] >= '0' &&
         name[name.size() - 1 - digits] <= '9') {
    ++digits;
  }
  // "_v" + at least one digit, and something left before it.
  if (digits == 0 || name.size() < digits + 3) return false;
  if (name.substr(name.size() - digits - 2, 2) != "_v") return false;
  name.remove_suffix(digits + 2);
  return true;
}

}  // namespace

std::string clean_api_name(std::string_view name) {
  while (strip_api_suffix(name)) {
  }
  return std::string(name);
}

std::optional<ActivityKind> parse_activity_kind(std::string_view name) {
  for (const auto& [value, known] : kKindNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

std::optional<CopyDirection> parse_copy_direction(std::string_view name) {
  for (const auto& [value, known] : kDirectionNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

}  // namespace gpuopt::trace
