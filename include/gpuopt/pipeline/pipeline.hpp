// The multi-camera pipeline scenario (issue 9): synthetic camera frames through upload →
// preprocessing → detector → segmenter → result decode, in a baseline mode (what the seed's users
// do) and an optimized mode (gpuopt's runtime parts). Both modes do the same work and produce the
// same per-frame results, compared by checksum.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::pipeline {

enum class PipelineMode { kBaseline, kOptimized };
std::string_view mode_name(PipelineMode mode);

struct PipelineOptions {
  PipelineMode mode = PipelineMode::kOptimized;
  int cameras = 10;
  double fps = 30;     // per camera
  double seconds = 5;  // frames arrive for this long; then the queue drains
  int width = 1920, height = 1080;
  int network_size = 640;  // detector/segmenter input, square
  int workers = 4;         // optimized mode: streams (one worker thread each)
  std::uint64_t seed = 2026;
};

// INVALID_ARGUMENT naming the bad option.
Status check_pipeline_options(const PipelineOptions& options);

struct StageTime {
  std::string name;
  double mean_ms = 0;  // GPU time between events around the stage, per frame
};

struct PipelineResult {
  PipelineMode mode = PipelineMode::kOptimized;
  int cameras = 0;
  std::uint64_t frames = 0;
  double wall_s = 0;
  double throughput_fps = 0;
  double offered_fps = 0;
  double latency_p50_ms = 0, latency_p99_ms = 0, latency_mean_ms = 0;
  std::vector<StageTime> stages;
  std::optional<double> gpu_util_percent;  // NVML, sampled over the run; null without NVML
  std::string gpu_util_note;
  std::uint64_t checksum = 0;  // over per-frame results, in (camera, index) order
  std::uint64_t frames_with_detections = 0;
};

nlohmann::json to_json(const PipelineResult& result);

// Runs one mode. UNIMPLEMENTED without CUDA, UNAVAILABLE without a device.
StatusOr<PipelineResult> run_pipeline(const PipelineOptions& options);

// Deterministic synthetic camera frame (interleaved RGB8): a gradient, per-camera tint and a few
// moving rectangles, so frames differ by camera and time.
void synthesize_frame(int camera, std::uint64_t index, int width, int height, std::uint8_t* rgb);

// FNV-1a over the per-frame results in order: (detections, 8 class-histogram bins) per frame.
std::uint64_t checksum_results(const std::vector<std::vector<std::uint32_t>>& per_frame);

}  // namespace gpuopt::pipeline
