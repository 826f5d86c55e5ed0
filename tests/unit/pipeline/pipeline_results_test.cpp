// Pipeline pieces that need no GPU: option checks, prompt derivation, checksums, the JSON forms of
// frame records and embeddings, the seeded archive, box decoding and the result writer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "gpuopt/pipeline/pipeline.hpp"
#include "pipeline/pipeline_writer.hpp"

namespace gpuopt::pipeline {
namespace {

TEST(PipelineOptions, DefaultsAreValidAndEachBadFieldIsNamed) {
  EXPECT_TRUE(check_pipeline_options({}).ok());
  struct Case {
    const char* needle;
    void (*edit)(PipelineOptions&);
  };
  const Case cases[] = {
      {"--streams", [](PipelineOptions& o) { o.cameras = 0; }},
      {"--fps", [](PipelineOptions& o) { o.fps = 0; }},
      {"--seconds", [](PipelineOptions& o) { o.seconds = -1; }},
      {"--workers", [](PipelineOptions& o) { o.workers = 33; }},
      {"--llm", [](PipelineOptions& o) { o.llm_model = "gpt-17"; }},
      {"--llm-batch", [](PipelineOptions& o) { o.llm_max_batch = 0; }},
      {"--new-tokens", [](PipelineOptions& o) { o.new_tokens = 57; }},
      {"--archive", [](PipelineOptions& o) { o.archive_cases = 0; }},
      {"retrieve k", [](PipelineOptions& o) { o.retrieve_k = 65; }},
      {"--overlay-every", [](PipelineOptions& o) { o.overlay_every = -1; }},
      {"network size", [](PipelineOptions& o) { o.network_size = 100; }},
  };
  for (const auto& c : cases) {
    PipelineOptions options;
    c.edit(options);
    Status status = check_pipeline_options(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(status.message().find(c.needle), std::string::npos) << status.message();
  }
  PipelineOptions edge;
  edge.new_tokens = 64 - kPromptTokens;  // exactly fills the context
  edge.retrieve_k = 5;
  edge.archive_cases = 5;
  EXPECT_TRUE(check_pipeline_options(edge).ok());
}

TEST(Prompt, HandComputedTokens) {
  // 7 detections; class pixels: class 3 largest (600), then 5 and 1 tied at 200 (1 wins the tie).
  std::array<std::uint32_t, kVisionWords> vision = {7, 0, 200, 0, 600, 0, 200, 0, 0};
  auto prompt = derive_prompt(4, vision, 512);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  const std::array<std::int32_t, kPromptTokens> expected = {
      1, 2 + 4, 66 + 7, 130 + 3, 138 + 1, 146 + 5, 154 + 6 /* 600/1000 */, 165};
  EXPECT_EQ(*prompt, expected);
}

TEST(Prompt, CapsDetectionsStaysInRangeAndRejectsBadInput) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    std::array<std::uint32_t, kVisionWords> vision{};
    for (auto& v : vision) v = rng() % 100000;
    const int camera = static_cast<int>(rng() % 64);
    auto prompt = derive_prompt(camera, vision, 256);
    ASSERT_TRUE(prompt.ok());
    for (std::int32_t token : *prompt) {
      EXPECT_GE(token, 1);
      EXPECT_LT(token, 256);
    }
    EXPECT_EQ((*prompt)[2], 66 + static_cast<int>(std::min<std::uint32_t>(vision[0], 63)));
    // Same inputs, same prompt (both modes must ask the same).
    EXPECT_EQ(*prompt, *derive_prompt(camera, vision, 256));
  }
  std::array<std::uint32_t, kVisionWords> vision{};
  EXPECT_FALSE(derive_prompt(64, vision, 512).ok());
  EXPECT_FALSE(derive_prompt(0, vision, 255).ok());
  EXPECT_FALSE(derive_prompt(0, std::span<const std::uint32_t>(vision.data(), 4), 512).ok());
}

FrameRecord sample_record() {
  FrameRecord r;
  r.sequence = 1234567890123ull;
  r.camera = 9;
  r.index = 123456789012ull;
  r.vision = {3, 1, 2, 3, 4, 5, 6, 7, 4000000000u};
  r.prompt = {1, 11, 69, 130, 140, 150, 160, 165};
  r.tokens = {5, 0, 511, 17};
  r.retrieved = {99999, 0, (1ull << 40) + 7};
  r.retrieved_distances = {0.125f, 1.0f / 3.0f, 3.4e38f};
  r.latency_ms = 12.375;
  r.overlay = "overlay-00000001.jpg";
  return r;
}

TEST(FrameRecordJson, RoundTripsExactly) {
  const FrameRecord r = sample_record();
  auto back = frame_record_from_json(nlohmann::json::parse(to_json(r).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->sequence, r.sequence);
  EXPECT_EQ(back->camera, r.camera);
  EXPECT_EQ(back->index, r.index);
  EXPECT_EQ(back->vision, r.vision);
  EXPECT_EQ(back->prompt, r.prompt);
  EXPECT_EQ(back->tokens, r.tokens);
  EXPECT_EQ(back->retrieved, r.retrieved);
  EXPECT_EQ(back->retrieved_distances, r.retrieved_distances);
  EXPECT_EQ(back->latency_ms, r.latency_ms);
  EXPECT_EQ(back->overlay, r.overlay);
  EXPECT_EQ(checksum_words(*back), checksum_words(r));
}

TEST(FrameRecordJson, NamesTheBadField) {
  nlohmann::json json = to_json(sample_record());
  json.erase("tokens");
  auto missing = frame_record_from_json(json);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tokens"), std::string::npos);
  json = to_json(sample_record());
  json["class_pixels"] = {1, 2};
  EXPECT_FALSE(frame_record_from_json(json).ok());
  json = to_json(sample_record());
  json["camera"] = "nine";
  auto typed = frame_record_from_json(json);
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("camera"), std::string::npos);
  EXPECT_FALSE(frame_record_from_json(nlohmann::json::array()).ok());
}

TEST(Checksum, WordsAreVisionThenTokensThenIdHalves) {
  const FrameRecord r = sample_record();
  std::vector<std::uint32_t> expected(r.vision.begin(), r.vision.end());
  for (auto t : r.tokens) expected.push_back(static_cast<std::uint32_t>(t));
  for (auto id : r.retrieved) {
    expected.push_back(static_cast<std::uint32_t>(id & 0xFFFFFFFFu));
    expected.push_back(static_cast<std::uint32_t>(id >> 32));
  }
  EXPECT_EQ(checksum_words(r), expected);
}

TEST(Checksum, Fnv1aOfBytesAndSensitiveToEveryChange) {
  // FNV-1a 64 of the little-endian bytes 01 00 00 00, by hand.
  std::uint64_t h = 1469598103934665603ull;
  for (std::uint8_t byte : {1, 0, 0, 0}) {
    h ^= byte;
    h *= 1099511628211ull;
  }
  EXPECT_EQ(checksum_results({{1u}}), h);
  const FrameRecord r = sample_record();
  const std::uint64_t base = checksum_results({checksum_words(r)});
  FrameRecord token = r;
  token.tokens[2] += 1;
  FrameRecord id = r;
  id.retrieved[1] = 1;
  FrameRecord distance = r;
  distance.retrieved_distances[0] = 7;  // not part of the checksum
  EXPECT_NE(checksum_results({checksum_words(token)}), base);
  EXPECT_NE(checksum_results({checksum_words(id)}), base);
  EXPECT_EQ(checksum_results({checksum_words(distance)}), base);
  // Frame order matters: results are compared in (camera, index) order.
  EXPECT_NE(checksum_results({{1u}, {2u}}), checksum_results({{2u}, {1u}}));
}

TEST(EmbeddingJson, RoundTripsBitwiseOnRandomFloats) {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> values(128);
  for (auto& v : values) {
    std::uint32_t bits;
    do {
      bits = rng();
      std::memcpy(&v, &bits, 4);
    } while (!std::isfinite(v));
  }
  values[0] = 0.1f;
  values[1] = -0.0f;
  auto back = embedding_from_json_text(embedding_to_json_text(values));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), values.size());
  EXPECT_EQ(std::memcmp(back->data(), values.data(), values.size() * 4), 0);
  EXPECT_FALSE(embedding_from_json_text("{\"embedding\": [1, \"x\"]}").ok());
  EXPECT_FALSE(embedding_from_json_text("[1,2]").ok());
  EXPECT_FALSE(embedding_from_json_text("{not json").ok());
}

TEST(PastCases, SeededUnitVectorsDifferBySeed) {
  auto a = seeded_past_cases(50, 128, 7);
  auto b = seeded_past_cases(50, 128, 7);
  auto c = seeded_past_cases(50, 128, 8);
  ASSERT_EQ(a.size(), 50u * 128);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int row = 0; row < 50; ++row) {
    double norm = 0;
    for (int i = 0; i < 128; ++i) norm += double(a[row * 128 + i]) * a[row * 128 + i];
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
}

TEST(Overlay, HalfConversionAndBoxDecodeByHand) {
  EXPECT_EQ(detail::half_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(detail::half_bits_to_float(0xC000), -2.0f);
  EXPECT_EQ(detail::half_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(detail::half_bits_to_float(0x4200), 3.0f);
  // 2×2 grid on a 64² input (stride 32), 1 anchor of 6 values; only cell (1, 0) passes (logit 3).
  detail::DetectorLayout layout;
  layout.grid_h = layout.grid_w = 2;
  layout.anchors = 1;
  layout.per_anchor = 6;
  layout.network_size = 64;
  std::vector<std::uint16_t> det(2 * 2 * 6, 0);  // zeros: logit 0, below 2.2
  std::uint16_t* cell = &det[(0 * 2 + 1) * 6];   // row 0, column 1
  cell[4] = 0x4200;                              // objectness logit 3
  auto boxes = detail::decode_boxes(det.data(), layout, 128, 64);
  ASSERT_EQ(boxes.size(), 1u);
  // Centre (1 + sigmoid(0)) * 32 = 48, 16; anchor 116×90 at exp(0); frame scale x2 in x, x1 in y.
  EXPECT_EQ(boxes[0].x0, 0);    // (48 - 58) * 2 < 0, clamped
  EXPECT_EQ(boxes[0].x1, 127);  // (48 + 58) * 2 = 212, clamped
  EXPECT_EQ(boxes[0].y0, 0);
  EXPECT_EQ(boxes[0].y1, 61);  // 16 + 45
  int w = 0, h = 0;
  std::vector<std::uint8_t> frame(128 * 64 * 3, 10);
  auto image = detail::render_overlay(frame.data(), 128, 64, 2, boxes, w, h);
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 32);
  EXPECT_EQ(image[(0 * 64 + 10) * 3 + 0], 255);  // top edge painted
  EXPECT_EQ(image[(10 * 64 + 10) * 3 + 0], 10);  // inside untouched
}

TEST(ResultWriter, WritesOneParsableLinePerFrameAndSampledOverlays) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gpuopt-writer-test-" + std::to_string(std::random_device{}()));
  detail::DetectorLayout layout;
  layout.grid_h = layout.grid_w = 2;
  layout.anchors = 1;
  layout.per_anchor = 6;
  layout.network_size = 64;
  std::vector<std::uint8_t> frame(128 * 64 * 3, 80);
  {
    detail::ResultWriter writer;
    ASSERT_TRUE(writer.start(dir, layout, 128, 64).ok());
    for (std::uint64_t i = 0; i < 5; ++i) {
      detail::WriterItem item;
      item.record = sample_record();
      item.record.sequence = i;
      item.record.overlay.clear();
      if (i == 2) {
        item.detector.assign(24, 0);
        item.detector[4] = 0x4200;
        item.frame = frame.data();
      }
      writer.push(std::move(item));
    }
    ASSERT_TRUE(writer.finish().ok());
    EXPECT_EQ(writer.records_written(), 5u);
    EXPECT_EQ(writer.overlays_written(), 1u);
  }
  std::ifstream lines(dir / "frames.jsonl");
  std::string line;
  std::uint64_t expected = 0;
  while (std::getline(lines, line)) {
    auto record = frame_record_from_json(nlohmann::json::parse(line));
    ASSERT_TRUE(record.ok());
    EXPECT_EQ(record->sequence, expected);
    EXPECT_EQ(record->overlay.empty(), expected != 2);
    if (!record->overlay.empty()) {
      std::ifstream jpeg(dir / record->overlay, std::ios::binary);
      unsigned char magic[2] = {0, 0};
      jpeg.read(reinterpret_cast<char*>(magic), 2);
      EXPECT_EQ(magic[0], 0xFF);
      EXPECT_EQ(magic[1], 0xD8);
    }
    ++expected;
  }
  EXPECT_EQ(expected, 5u);
  std::filesystem::remove_all(dir);
}

TEST(PipelineResultJson, CarriesTheNewFieldsWithNullsForAbsentMetrics) {
  PipelineResult r;
  r.stages = {{"llm (per request)", 1.5, 3}};
  r.llm_requests = 12;
  r.llm_batches = 4;
  r.gpu_busy_percent_of_active = 91.0;
  auto json = to_json(r);
  EXPECT_TRUE(json["gpu_busy_percent"].is_null());
  EXPECT_EQ(json["gpu_busy_percent_of_active"].get<double>(), 91.0);
  EXPECT_TRUE(json["device_memory_used_mib"].is_null());
  EXPECT_EQ(json["llm_mean_batch"].get<double>(), 3.0);
  EXPECT_EQ(json["stages"][0]["calls"].get<std::uint64_t>(), 3u);
}

}  // namespace
}  // namespace gpuopt::pipeline
