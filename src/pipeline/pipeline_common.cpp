// Pipeline pieces that need no GPU: options, frame synthesis, checksums, JSON.
#include <fmt/format.h>

#include <cmath>

#include "gpuopt/pipeline/pipeline.hpp"

namespace gpuopt::pipeline {

std::string_view mode_name(PipelineMode mode) {
  return mode == PipelineMode::kBaseline ? "baseline" : "optimized";
}

Status check_pipeline_options(const PipelineOptions& o) {
  if (o.cameras < 1 || o.cameras > 64) {
    return invalid_argument(fmt::format("pipeline: --streams {} not in 1..64", o.cameras));
  }
  if (!(o.fps > 0) || o.fps > 240) {
    return invalid_argument(fmt::format("pipeline: --fps {} not in (0, 240]", o.fps));
  }
  if (!(o.seconds > 0) || o.seconds > 600) {
    return invalid_argument(fmt::format("pipeline: --seconds {} not in (0, 600]", o.seconds));
  }
  if (o.width < 64 || o.height < 64 || o.width > 7680 || o.height > 4320) {
    return invalid_argument(
        fmt::format("pipeline: frame {}x{} not within 64x64..7680x4320", o.width, o.height));
  }
  if (o.network_size < 64 || o.network_size > 2048 || o.network_size % 32 != 0) {
    return invalid_argument(fmt::format(
        "pipeline: network size {} must be a multiple of 32 in 64..2048", o.network_size));
  }
  if (o.workers < 1 || o.workers > 32) {
    return invalid_argument(fmt::format("pipeline: --workers {} not in 1..32", o.workers));
  }
  return ok_status();
}

void synthesize_frame(int camera, std::uint64_t index, int width, int height, std::uint8_t* rgb) {
  const int tint = (camera * 53) % 256;
  for (int y = 0; y < height; ++y) {
    std::uint8_t* row = rgb + static_cast<std::size_t>(y) * width * 3;
    for (int x = 0; x < width; ++x) {
      row[x * 3 + 0] = static_cast<std::uint8_t>((x * 255) / width);
      row[x * 3 + 1] = static_cast<std::uint8_t>((y * 255) / height);
      row[x * 3 + 2] = static_cast<std::uint8_t>(tint);
    }
  }
  // Three rectangles moving with time, at camera-specific speeds.
  for (int r = 0; r < 3; ++r) {
    int w = width / (6 + r), h = height / (5 + r);
    int x0 = static_cast<int>((index * (7 + 3 * r + camera) + r * 400) %
                              static_cast<std::uint64_t>(width - w));
    int y0 = static_cast<int>((index * (5 + 2 * r) + r * 300 + camera * 17) %
                              static_cast<std::uint64_t>(height - h));
    for (int y = y0; y < y0 + h; ++y) {
      for (int x = x0; x < x0 + w; ++x) {
        std::uint8_t* p = rgb + (static_cast<std::size_t>(y) * width + x) * 3;
        p[0] = static_cast<std::uint8_t>(40 + 80 * r);
        p[1] = static_cast<std::uint8_t>(220 - 60 * r);
        p[2] = static_cast<std::uint8_t>(30 * r + camera);
      }
    }
  }
}

std::uint64_t checksum_results(const std::vector<std::vector<std::uint32_t>>& per_frame) {
  std::uint64_t hash = 1469598103934665603ull;
  for (const auto& frame : per_frame) {
    for (std::uint32_t value : frame) {
      for (int byte = 0; byte < 4; ++byte) {
        hash ^= (value >> (8 * byte)) & 0xFFu;
        hash *= 1099511628211ull;
      }
    }
  }
  return hash;
}

nlohmann::json to_json(const PipelineResult& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& stage : r.stages)
    stages.push_back({{"stage", stage.name}, {"mean_ms", stage.mean_ms}});
  return {{"mode", mode_name(r.mode)},
          {"cameras", r.cameras},
          {"frames", r.frames},
          {"wall_s", r.wall_s},
          {"offered_fps", r.offered_fps},
          {"throughput_fps", r.throughput_fps},
          {"latency_p50_ms", r.latency_p50_ms},
          {"latency_p99_ms", r.latency_p99_ms},
          {"latency_mean_ms", r.latency_mean_ms},
          {"stages", stages},
          {"gpu_util_percent", r.gpu_util_percent ? nlohmann::json(*r.gpu_util_percent) : nullptr},
          {"gpu_util_note", r.gpu_util_note},
          {"checksum", fmt::format("{:016x}", r.checksum)},
          {"frames_with_detections", r.frames_with_detections}};
}

}  // namespace gpuopt::pipeline
