// Pipeline pieces that need no GPU: options, frame synthesis, prompts, checksums, JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

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
  if (o.llm_model != "llama-3.2-1b-shaped" && o.llm_model != "tiny") {
    return invalid_argument(
        fmt::format("pipeline: --llm '{}' is not one of llama-3.2-1b-shaped, tiny", o.llm_model));
  }
  if (o.llm_max_batch < 1 || o.llm_max_batch > 64) {
    return invalid_argument(fmt::format("pipeline: --llm-batch {} not in 1..64", o.llm_max_batch));
  }
  if (o.new_tokens < 1 || o.new_tokens + kPromptTokens > 64) {
    return invalid_argument(
        fmt::format("pipeline: --new-tokens {} not in 1..{} (prompt {} + new tokens <= 64 context)",
                    o.new_tokens, 64 - kPromptTokens, kPromptTokens));
  }
  if (o.archive_cases < 1 || o.archive_cases > 10'000'000) {
    return invalid_argument(
        fmt::format("pipeline: --archive {} not in 1..10000000", o.archive_cases));
  }
  if (o.retrieve_k < 1 || o.retrieve_k > 64 ||
      static_cast<std::size_t>(o.retrieve_k) > o.archive_cases) {
    return invalid_argument(
        fmt::format("pipeline: retrieve k {} not in 1..64 or above the {} archive cases",
                    o.retrieve_k, o.archive_cases));
  }
  if (o.overlay_every < 0) {
    return invalid_argument(
        fmt::format("pipeline: --overlay-every {} is negative", o.overlay_every));
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

namespace {

template <typename T>
nlohmann::json optional_json(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json to_json(const PipelineResult& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& stage : r.stages)
    stages.push_back({{"stage", stage.name}, {"mean_ms", stage.mean_ms}, {"calls", stage.calls}});
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
          {"frames_with_detections", r.frames_with_detections},
          {"gpu_busy_percent", optional_json(r.gpu_busy_percent)},
          {"gpu_busy_percent_of_active", optional_json(r.gpu_busy_percent_of_active)},
          {"gpu_any_engine_busy_percent", optional_json(r.gpu_any_engine_busy_percent)},
          {"traced_kernels", optional_json(r.traced_kernels)},
          {"trace_note", r.trace_note},
          {"trace_file", r.trace_file},
          {"device_memory_used_mib", optional_json(r.device_memory_used_mib)},
          {"llm_model", r.llm_model},
          {"llm_requests", r.llm_requests},
          {"llm_batches", r.llm_batches},
          {"llm_mean_batch",
           r.llm_batches ? static_cast<double>(r.llm_requests) / static_cast<double>(r.llm_batches)
                         : 0.0},
          {"archive_cases", r.archive_cases},
          {"cases_added", r.cases_added},
          {"graphs_used", r.graphs_used},
          {"graphs_note", r.graphs_note},
          {"output_dir", r.output_dir},
          {"records_written", r.records_written},
          {"overlays_written", r.overlays_written}};
}

StatusOr<std::array<std::int32_t, kPromptTokens>> derive_prompt(
    int camera, std::span<const std::uint32_t> vision, int vocab) {
  if (vision.size() < static_cast<std::size_t>(kVisionWords)) {
    return invalid_argument(
        fmt::format("derive_prompt: {} vision words, need {}", vision.size(), kVisionWords));
  }
  if (camera < 0 || camera > 63) {
    return invalid_argument(fmt::format("derive_prompt: camera {} not in 0..63", camera));
  }
  if (vocab < 256) {
    return invalid_argument(fmt::format("derive_prompt: vocabulary {} under 256", vocab));
  }
  // Classes by pixel count, largest first; stable so ties keep the lower class first.
  std::array<int, kSegmentClassCount> classes{};
  for (int c = 0; c < kSegmentClassCount; ++c) classes[c] = c;
  std::stable_sort(classes.begin(), classes.end(),
                   [&](int a, int b) { return vision[1 + a] > vision[1 + b]; });
  std::uint64_t pixels = 0;
  for (int c = 0; c < kSegmentClassCount; ++c) pixels += vision[1 + c];
  const int share_tenths =
      pixels ? static_cast<int>(std::uint64_t{vision[1 + classes[0]]} * 10 / pixels) : 0;
  const int detections = static_cast<int>(std::min<std::uint32_t>(vision[0], 63));
  // Disjoint token ranges per field, so no two fields can collide.
  return std::array<std::int32_t, kPromptTokens>{1,
                                                 2 + camera,
                                                 66 + detections,
                                                 130 + classes[0],
                                                 138 + classes[1],
                                                 146 + classes[2],
                                                 154 + share_tenths,
                                                 165};
}

nlohmann::json to_json(const FrameRecord& r) {
  return {{"sequence", r.sequence},
          {"camera", r.camera},
          {"index", r.index},
          {"detections", r.vision[0]},
          {"class_pixels", std::vector<std::uint32_t>(r.vision.begin() + 1, r.vision.end())},
          {"prompt", r.prompt},
          {"tokens", r.tokens},
          {"retrieved", r.retrieved},
          {"retrieved_distances", r.retrieved_distances},
          {"latency_ms", r.latency_ms},
          {"overlay", r.overlay}};
}

StatusOr<FrameRecord> frame_record_from_json(const nlohmann::json& json) {
  if (!json.is_object()) return invalid_argument("frame record: not a JSON object");
  FrameRecord r;
  std::string field;
  try {
    field = "sequence";
    r.sequence = json.at(field).get<std::uint64_t>();
    field = "camera";
    r.camera = json.at(field).get<int>();
    field = "index";
    r.index = json.at(field).get<std::uint64_t>();
    field = "detections";
    r.vision[0] = json.at(field).get<std::uint32_t>();
    field = "class_pixels";
    auto pixels = json.at(field).get<std::vector<std::uint32_t>>();
    if (pixels.size() != static_cast<std::size_t>(kSegmentClassCount)) {
      return invalid_argument(fmt::format("frame record: class_pixels has {} entries, not {}",
                                          pixels.size(), kSegmentClassCount));
    }
    std::copy(pixels.begin(), pixels.end(), r.vision.begin() + 1);
    field = "prompt";
    r.prompt = json.at(field).get<std::vector<std::int32_t>>();
    field = "tokens";
    r.tokens = json.at(field).get<std::vector<std::int32_t>>();
    field = "retrieved";
    r.retrieved = json.at(field).get<std::vector<std::uint64_t>>();
    field = "retrieved_distances";
    r.retrieved_distances = json.at(field).get<std::vector<float>>();
    field = "latency_ms";
    r.latency_ms = json.at(field).get<double>();
    field = "overlay";
    r.overlay = json.at(field).get<std::string>();
  } catch (const nlohmann::json::exception& error) {
    return invalid_argument(fmt::format("frame record: field '{}': {}", field, error.what()));
  }
  return r;
}

std::vector<std::uint32_t> checksum_words(const FrameRecord& r) {
  std::vector<std::uint32_t> words(r.vision.begin(), r.vision.end());
  for (std::int32_t token : r.tokens) words.push_back(static_cast<std::uint32_t>(token));
  for (std::uint64_t id : r.retrieved) {
    words.push_back(static_cast<std::uint32_t>(id));
    words.push_back(static_cast<std::uint32_t>(id >> 32));
  }
  return words;
}

std::string embedding_to_json_text(std::span<const float> embedding) {
  return nlohmann::json{{"embedding", std::vector<float>(embedding.begin(), embedding.end())}}
      .dump();
}

StatusOr<std::vector<float>> embedding_from_json_text(std::string_view text) {
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument("embedding JSON: not valid JSON");
  if (!json.is_object() || !json.contains("embedding") || !json["embedding"].is_array()) {
    return invalid_argument("embedding JSON: no \"embedding\" array");
  }
  std::vector<float> values;
  values.reserve(json["embedding"].size());
  for (const auto& value : json["embedding"]) {
    if (!value.is_number()) return invalid_argument("embedding JSON: a value is not a number");
    values.push_back(value.get<float>());
  }
  return values;
}

std::vector<float> seeded_past_cases(std::size_t count, int dim, std::uint64_t seed) {
  std::vector<float> vectors(count * static_cast<std::size_t>(dim));
  std::mt19937_64 engine(seed);
  // Box-Muller by hand: std::normal_distribution's output is implementation-defined.
  auto uniform = [&] { return (static_cast<double>(engine() >> 11) + 0.5) * 0x1.0p-53; };
  for (std::size_t row = 0; row < count; ++row) {
    float* v = vectors.data() + row * dim;
    double norm = 0;
    for (int i = 0; i < dim; ++i) {
      double g = std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
      v[i] = static_cast<float>(g);
      norm += g * g;
    }
    const double scale = norm > 0 ? 1.0 / std::sqrt(norm) : 0.0;
    for (int i = 0; i < dim; ++i) v[i] = static_cast<float>(v[i] * scale);
  }
  return vectors;
}

}  // namespace gpuopt::pipeline
