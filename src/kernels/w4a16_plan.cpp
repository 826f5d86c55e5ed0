// W4A16 host planning that needs no device: the option names and their checks.
#include <fmt/format.h>

#include <array>
#include <string>
#include <utility>

#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::kernels {
namespace {

constexpr std::array<std::pair<W4A16ForcePath, std::string_view>, 7> kForcePathNames = {{
    {W4A16ForcePath::kAuto, "auto"},
    {W4A16ForcePath::kTensorCore, "tensor-core"},
    {W4A16ForcePath::kDequantCublas, "dequant-cublas"},
    {W4A16ForcePath::kXRows, "x-rows"},
    {W4A16ForcePath::kSwapped, "swapped"},
    {W4A16ForcePath::kDirect, "direct"},
    {W4A16ForcePath::kWgmma, "wgmma"},
}};

constexpr std::array<std::pair<W4A16Pipeline, std::string_view>, 2> kPipelineNames = {{
    {W4A16Pipeline::kCpAsync, "cp-async"},
    {W4A16Pipeline::kBulkK128, "bulk-k128"},
}};

template <typename Enum, std::size_t kCount>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, kCount>& names,
                         Enum value) {
  for (const auto& [known, name] : names) {
    if (known == value) return name;
  }
  return "unknown";
}

template <typename Enum, std::size_t kCount>
StatusOr<Enum> parse(const std::array<std::pair<Enum, std::string_view>, kCount>& names,
                     std::string_view what, std::string_view text) {
  std::string valid;
  for (const auto& [value, name] : names) {
    if (name == text) return value;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  return invalid_argument(fmt::format("unknown {} '{}' (one of: {})", what, text, valid));
}

template <typename Enum, std::size_t kCount>
bool known(const std::array<std::pair<Enum, std::string_view>, kCount>& names, Enum value) {
  for (const auto& entry : names) {
    if (entry.first == value) return true;
  }
  return false;
}

Status non_negative(const char* field, int value, const char* zero_means) {
  if (value >= 0) return ok_status();
  return invalid_argument(
      fmt::format("W4A16{}={}: must be 0 ({}) or positive", field, value, zero_means));
}

}  // namespace

std::string_view w4a16_force_path_name(W4A16ForcePath path) {
  return name_of(kForcePathNames, path);
}
StatusOr<W4A16ForcePath> parse_w4a16_force_path(std::string_view name) {
  return parse(kForcePathNames, "W4A16 path", name);
}
std::string_view w4a16_pipeline_name(W4A16Pipeline pipeline) {
  return name_of(kPipelineNames, pipeline);
}
StatusOr<W4A16Pipeline> parse_w4a16_pipeline(std::string_view name) {
  return parse(kPipelineNames, "W4A16 copy pipeline", name);
}

Status check_w4a16_options(const W4A16Options& options) {
  if (options.fallback_min_m < W4A16Options::kAutoFallback) {
    return invalid_argument(fmt::format(
        "W4A16Options::fallback_min_m={}: must be kAutoFallback (-1), 0 (never) or an M",
        options.fallback_min_m));
  }
  if (!known(kForcePathNames, options.force_path)) {
    return invalid_argument(fmt::format("W4A16Options::force_path={} is not a W4A16ForcePath",
                                        static_cast<int>(options.force_path)));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Options::force_blocks", options.force_blocks, "occupancy x SMs"));
  if (options.sm_count < 0) {
    return invalid_argument(
        fmt::format("W4A16Options::sm_count={}: must be 0 (the device's) or 1..the device's SMs",
                    options.sm_count));
  }
  const W4A16Tuning& tuning = options.tuning;
  if (tuning.pipeline && !known(kPipelineNames, *tuning.pipeline)) {
    return invalid_argument(fmt::format("W4A16Tuning::pipeline={} is not a W4A16Pipeline",
                                        static_cast<int>(*tuning.pipeline)));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_slices", tuning.direct_slices, "the cost model's choice"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_slice_blocks", tuning.direct_slice_blocks, "SMs / slices"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_blocks_per_sm", tuning.direct_blocks_per_sm, "the occupancy"));
  if (tuning.wgmma_variant && (*tuning.wgmma_variant < 7 || *tuning.wgmma_variant > 9)) {
    return invalid_argument(
        fmt::format("W4A16Tuning::wgmma_variant={}: must be 7, 8 or 9", *tuning.wgmma_variant));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::wgmma_splits", tuning.wgmma_splits, "the wave-fill choice"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::wgmma_stream_k_blocks", tuning.wgmma_stream_k_blocks, "one wave"));
  return ok_status();
}

}  // namespace gpuopt::kernels
