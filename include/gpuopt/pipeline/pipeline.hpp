// The multi-camera pipeline scenario (issue 9): synthetic camera frames through upload →
// preprocessing → detector → segmenter → result decode and, for frames with detections, an LLM
// instruction → embedding → retrieval of past cases → results written by a writer thread. A
// baseline mode (what the seed's users do) and an optimized mode (gpuopt's runtime parts) do the
// same work and produce the same per-frame results, compared by checksum.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::pipeline {

enum class PipelineMode { kBaseline, kOptimized };
std::string_view mode_name(PipelineMode mode);

inline constexpr int kSegmentClassCount = 8;
inline constexpr int kPromptTokens = 8;
// Per-frame vision result words: [0] detections, [1..8] pixels per segment class.
inline constexpr int kVisionWords = 1 + kSegmentClassCount;

struct PipelineOptions {
  PipelineMode mode = PipelineMode::kOptimized;
  int cameras = 10;
  double fps = 30;     // per camera
  double seconds = 5;  // frames arrive for this long; then the queue drains
  int width = 1920, height = 1080;
  int network_size = 640;  // detector/segmenter input, square
  int workers = 4;         // optimized mode: vision streams (one worker thread each)
  std::uint64_t seed = 2026;

  // LLM instruction + retrieval stages, for frames with detections. Off: vision stages only.
  bool llm = true;
  std::string llm_model = "llama-3.2-1b-shaped";  // or "tiny" (tests)
  int llm_max_batch = 16;  // optimized mode: requests decoded together (baseline: always 1)
  int new_tokens = 16;     // generated per request
  std::size_t archive_cases = 100'000;  // seeded past cases retrieval searches
  int retrieve_k = 5;
  int overlay_every = 100;  // an overlay image for every Nth frame (0 = none)
  std::string output_dir;   // the writer's folder; empty = a temporary folder removed at the end
  bool graphs = true;       // optimized mode: CUDA graphs for the repeated vision stages
  bool trace_busy = true;   // CUPTI tracer over the run for GPU busy time
  std::string trace_path;   // non-empty: write the Perfetto (Chrome JSON) trace here
};

// INVALID_ARGUMENT naming the bad option.
Status check_pipeline_options(const PipelineOptions& options);

struct StageTime {
  std::string name;
  double mean_ms = 0;  // GPU time between events around the stage, per call
  std::uint64_t calls = 0;
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
  // CUPTI tracer over the run: union of kernel time over the traced window, and over the span from
  // the first to the last device activity. Null when tracing was off or failed (trace_note says).
  std::optional<double> gpu_busy_percent;
  std::optional<double> gpu_busy_percent_of_active;
  std::optional<double> gpu_any_engine_busy_percent;  // kernels, copies or memsets
  std::optional<std::int64_t> traced_kernels;
  std::string trace_note;
  std::string trace_file;                        // written Perfetto trace, if any
  std::optional<double> device_memory_used_mib;  // cudaMemGetInfo at the end of the run
  std::uint64_t checksum = 0;                    // over per-frame results, in (camera, index) order
  std::uint64_t frames_with_detections = 0;
  // LLM + retrieval.
  std::string llm_model;
  std::uint64_t llm_requests = 0, llm_batches = 0;
  std::size_t archive_cases = 0;
  std::size_t cases_added = 0;  // rows in the new-case store at the end
  bool graphs_used = false;
  std::string graphs_note;  // why graphs were not used, when asked for
  std::string output_dir;   // empty when the temporary folder was removed
  std::uint64_t records_written = 0, overlays_written = 0;
};

nlohmann::json to_json(const PipelineResult& result);

// Runs one mode. UNIMPLEMENTED without CUDA, UNAVAILABLE without a device.
StatusOr<PipelineResult> run_pipeline(const PipelineOptions& options);

// Deterministic synthetic camera frame (interleaved RGB8): a gradient, per-camera tint and a few
// moving rectangles, so frames differ by camera and time.
void synthesize_frame(int camera, std::uint64_t index, int width, int height, std::uint8_t* rgb);

// FNV-1a over the per-frame words in order.
std::uint64_t checksum_results(const std::vector<std::vector<std::uint32_t>>& per_frame);

// The LLM prompt of a frame with detections, a pure function of the camera, the detection count
// and the three largest segment classes (ties to the lower class), so both modes ask the same.
// Token layout: BOS, camera, detections (capped at 63), three top classes, the largest class's
// pixel share in tenths, an end-of-prompt marker. Every token is in [1, 256).
// `vision`: kVisionWords words. INVALID_ARGUMENT for a short `vision`, camera outside 0..63, or a
// vocabulary under 256.
StatusOr<std::array<std::int32_t, kPromptTokens>> derive_prompt(
    int camera, std::span<const std::uint32_t> vision, int vocab);

// One frame's results as the writer stores them (a JSON line each).
struct FrameRecord {
  std::uint64_t sequence = 0;  // arrival order: index * cameras + camera
  int camera = 0;
  std::uint64_t index = 0;  // frame number within the camera
  std::array<std::uint32_t, kVisionWords> vision{};
  std::vector<std::int32_t> prompt;      // empty without detections (or with the LLM off)
  std::vector<std::int32_t> tokens;      // generated instruction tokens
  std::vector<std::uint64_t> retrieved;  // archive case ids, nearest first
  std::vector<float>
      retrieved_distances;  // squared L2 (not in the checksum: float, batch-dependent)
  double latency_ms = 0;
  std::string overlay;  // overlay image file name, empty when none
};

nlohmann::json to_json(const FrameRecord& record);
// INVALID_ARGUMENT naming the missing or ill-typed field.
StatusOr<FrameRecord> frame_record_from_json(const nlohmann::json& json);
// The words a frame contributes to the checksum: vision words, then tokens, then retrieved ids.
std::vector<std::uint32_t> checksum_words(const FrameRecord& record);

// The baseline's store path: an embedding as JSON text ({"embedding":[...]}) and back. Floats
// round-trip exactly. INVALID_ARGUMENT for text that is not such an object.
std::string embedding_to_json_text(std::span<const float> embedding);
StatusOr<std::vector<float>> embedding_from_json_text(std::string_view text);

// The seeded past cases retrieval searches: `count` unit vectors of `dim` floats, [count, dim].
std::vector<float> seeded_past_cases(std::size_t count, int dim, std::uint64_t seed);

}  // namespace gpuopt::pipeline
