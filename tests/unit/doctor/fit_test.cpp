// `doctor --fit`'s estimator against hand-computed figures and the published parameter counts of
// real model families (Llama-3 8B and 70B, Qwen2.5 7B; configs in tests/data/fit).
#include "gpuopt/doctor/fit.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/test_support.hpp"

namespace gpuopt::doctor {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string fit_dir(const std::string& name) {
  return gpuopt::testing::test_data_dir() + "/fit/" + name;
}

ModelShape shape_of(const std::string& name) {
  std::ifstream in(fit_dir(name) + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  auto shape = parse_model_config(text.str(), name);
  EXPECT_TRUE(shape.ok()) << shape.status().to_string();
  return shape.ok() ? *shape : ModelShape{};
}

// Published parameter counts: 8,030,261,248 (Meta-Llama-3-8B), 70,553,706,496 (Meta-Llama-3-70B),
// 7,615,616,512 (Qwen2.5-7B, whose q/k/v carry biases).
TEST(DoctorFit, ParameterCountsMatchThePublishedOnes) {
  EXPECT_EQ(count_parameters(shape_of("llama-3-8b")).total(), 8'030'261'248);
  EXPECT_EQ(count_parameters(shape_of("llama-3-70b")).total(), 70'553'706'496);
  ModelShape qwen = shape_of("qwen2.5-7b");
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_EQ(count_parameters(qwen).total(), 7'615'616'512);
}

TEST(DoctorFit, KvCachePerToken) {
  // layers x 2 x kv_heads x head_dim x 2 bytes.
  EXPECT_EQ(kv_cache_bytes_per_token(shape_of("llama-3-8b"), 2), 32u * 2 * 8 * 128 * 2);  // 128 KiB
  EXPECT_EQ(kv_cache_bytes_per_token(shape_of("llama-3-70b"), 2),
            80u * 2 * 8 * 128 * 2);                                                       // 320 KiB
  EXPECT_EQ(kv_cache_bytes_per_token(shape_of("qwen2.5-7b"), 2), 28u * 2 * 4 * 128 * 2);  // 56 KiB
  EXPECT_EQ(kv_cache_bytes_per_token(shape_of("qwen2.5-7b"), 1), 28u * 2 * 4 * 128);
}

TEST(DoctorFit, QuantisedWeightBytes) {
  ParameterCount llama70 = count_parameters(shape_of("llama-3-70b"));
  // Linear: 70,553,706,496 - 2 x 128,256 x 8192 (embeddings) - (80 x 2 + 1) x 8192 (norms).
  EXPECT_EQ(llama70.linear, 68'451'041'280);
  EXPECT_EQ(weight_bytes(llama70, WeightFormat::kBFloat16), 2 * 70'553'706'496ull);
  // int4 group 128: linear x 4 bits + linear / 128 groups x 20 bits, rest in bf16.
  EXPECT_EQ(weight_bytes(llama70, WeightFormat::kInt4),
            (68'451'041'280ull * 4 + 534'773'760ull * 20) / 8 + 2 * 2'102'665'216ull);
  EXPECT_EQ(weight_bytes(llama70, WeightFormat::kInt4), 39'767'785'472ull);
  // int8: one byte a weight plus an fp16 scale per output row.
  EXPECT_EQ(weight_bytes(llama70, WeightFormat::kInt8),
            68'451'041'280ull + 2 * static_cast<std::uint64_t>(llama70.linear_rows) +
                2 * 2'102'665'216ull);
  // Rows per block: q 8192 + k 1024 + v 1024 + o 8192 + gate, up 2 x 28672 + down 8192.
  EXPECT_EQ(llama70.linear_rows, 80 * (8192 + 1024 + 1024 + 8192 + 2 * 28672 + 8192));
}

// Llama-3 8B in bf16 at batch 1 x 8192 tokens on a 24 GiB card, every term by hand.
TEST(DoctorFit, Llama3_8BOnA24GiBCard) {
  FitOptions options;
  options.batch = 1;
  options.context = 8192;
  options.free_bytes = 24 * kGiB;
  auto estimate = estimate_fit(fit_dir("llama-3-8b") + "/config.json", options);
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_EQ(estimate->weight_bytes, 16'060'522'496ull);  // 2 x 8,030,261,248
  EXPECT_EQ(estimate->kv_cache_bytes, 131'072ull * 8192);
  // (4 x 4096 + (32 + 16) x 128 + 2 x 14336) x 2 = 102,400 bytes a token, + 128,256 x 4 logits.
  EXPECT_EQ(estimate->activation_bytes, 102'400ull * 8192 + 128'256ull * 4);
  EXPECT_EQ(estimate->reserve_bytes, kGiB);
  EXPECT_EQ(estimate->total_bytes, 19'047'379'968ull);
  EXPECT_EQ(estimate->verdict, FitVerdict::kFits);
  EXPECT_EQ(fit_exit_code(*estimate), 0);
  // (24 GiB - weights - 1 GiB) / ((131,072 + 102,400) x 8192 + 513,024) = 4.51.
  EXPECT_EQ(estimate->max_batch, 4);
  // At batch 1 the context is capped by max_position_embeddings (8192).
  EXPECT_EQ(estimate->max_context, 8192);
  EXPECT_EQ(estimate->weights_source, "config.json shapes x bf16");
}

TEST(DoctorFit, BatchTooLargeSuggestsTheLargestThatFits) {
  FitOptions options;
  options.batch = 8;
  options.context = 8192;
  options.free_bytes = 24 * kGiB;
  auto estimate = estimate_fit(shape_of("llama-3-8b"), {}, options);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->verdict, FitVerdict::kDoesNotFit);
  EXPECT_EQ(fit_exit_code(*estimate), 2);
  EXPECT_EQ(estimate->max_batch, 4);
  // (24 GiB - 17,134,264,320 - 8 x 513,024) / (8 x 233,472) = 4621.2.
  EXPECT_EQ(estimate->max_context, 4621);
  ASSERT_FALSE(estimate->advice.empty());
  EXPECT_EQ(estimate->advice[0], "lower the batch to 4 (at context 8192)");
  EXPECT_EQ(estimate->advice[1], "shorten the context to 4621 tokens (at batch 8)");
  // int4 weights save 16,060,522,496 - 5,727,854,592 bytes and then batch 8 fits.
  bool int4_fits = false;
  for (const auto& alternative : estimate->alternatives) {
    if (alternative.format == "int4 weights") {
      EXPECT_EQ(alternative.weight_bytes, 5'727'854'592ull);
      EXPECT_EQ(alternative.saved_bytes, 16'060'522'496ull - 5'727'854'592ull);
      int4_fits = alternative.fits;
    }
  }
  EXPECT_TRUE(int4_fits);
}

TEST(DoctorFit, WeightsAloneDoNotFit) {
  FitOptions options;
  options.free_bytes = 80 * kGiB;
  auto estimate = estimate_fit(shape_of("llama-3-70b"), {}, options);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->verdict, FitVerdict::kDoesNotFit);
  EXPECT_EQ(estimate->max_batch, 0);
  EXPECT_EQ(estimate->max_context, 0);
  EXPECT_NE(estimate->advice[0].find("the weights alone"), std::string::npos);
}

TEST(DoctorFit, TightIsAWarning) {
  FitOptions options;
  options.batch = 1;
  options.context = 1024;
  auto loose = estimate_fit(shape_of("qwen2.5-7b"), {}, options);
  ASSERT_TRUE(loose.ok());
  options.free_bytes = loose->total_bytes + loose->total_bytes / 20;  // 5 % headroom
  auto estimate = estimate_fit(shape_of("qwen2.5-7b"), {}, options);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->verdict, FitVerdict::kTight);
  EXPECT_EQ(fit_exit_code(*estimate), 1);
}

TEST(DoctorFit, UnknownFreeMemoryGivesNoVerdict) {
  auto estimate = estimate_fit(shape_of("qwen2.5-7b"), {}, FitOptions{});
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->verdict, FitVerdict::kUnknown);
  EXPECT_FALSE(estimate->max_batch.has_value());
  EXPECT_EQ(fit_exit_code(*estimate), 0);
}

TEST(DoctorFit, ExplicitFormatForAConfigAlone) {
  FitOptions options;
  options.weight_format = WeightFormat::kInt4;
  auto estimate = estimate_fit(fit_dir("llama-3-8b") + "/config.json", options);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->weight_bytes, 5'727'854'592ull);
  EXPECT_EQ(estimate->weights_source, "config.json shapes x int4");
}

// tiny-llama: hidden 32, intermediate 64, 2 layers, 4 heads (2 KV) x 8, vocab 128, bf16.
// Parameters: 2 x 128 x 32 + 2 x (1024 + 512 + 512 + 1024 + 3 x 2048 + 64) + 32 = 26,784.
TEST(DoctorFit, SafetensorsShardsAreSummedFromTheirHeaders) {
  auto estimate = estimate_fit(fit_dir("tiny-llama"), FitOptions{});
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_EQ(estimate->parameters.total(), 26'784);
  EXPECT_EQ(estimate->checkpoint_parameters, 26'784);
  EXPECT_EQ(estimate->weight_bytes, 2u * 26'784);
  EXPECT_EQ(estimate->weight_bytes_by_dtype.at("BF16"), 2u * 26'784);
  EXPECT_EQ(estimate->weights_source, "safetensors headers (21 tensors in 2 files)");
}

// GPTQ, group 16: a linear of R x C stores C/8 x R words of qweight (C x R / 2 bytes), C/16 x R/8
// words of qzeros (C x R / 32 bytes) and C/16 x R fp16 scales (C x R / 8 bytes). 9216 linear
// weights a block -> 6048 bytes; embeddings, lm_head and norms stay bf16: 2 x (8192 + 160).
TEST(DoctorFit, QuantisedCheckpointUsesStoredSizes) {
  auto estimate = estimate_fit(fit_dir("tiny-llama-int4"), FitOptions{});
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_EQ(estimate->shape.quantized_bits, 4);
  EXPECT_EQ(estimate->shape.quantized_group_size, 16);
  EXPECT_EQ(estimate->weight_bytes, 2u * 6048 + 2 * (8192 + 160));
  EXPECT_EQ(estimate->weight_bytes_by_dtype.at("I32"), 2u * 9216 * 17 / 32);  // qweight, qzeros
  // Already 4-bit: quantising again is not offered, only the fp8 KV cache.
  ASSERT_EQ(estimate->alternatives.size(), 1u);
  EXPECT_EQ(estimate->alternatives[0].format, "fp8 KV cache");
}

TEST(DoctorFit, TruncatedShardIsDataLoss) {
  auto estimate = estimate_fit(fit_dir("truncated"), FitOptions{});
  ASSERT_FALSE(estimate.ok());
  EXPECT_EQ(estimate.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(estimate.status().message().find("model-00002-of-00002.safetensors"),
            std::string::npos);
  EXPECT_NE(estimate.status().message().find("truncated"), std::string::npos);
}

TEST(DoctorFit, BadInputIsNamed) {
  auto missing = parse_model_config(R"({"hidden_size": 64})", "c.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("intermediate_size"), std::string::npos);
  auto negative = parse_model_config(
      R"({"hidden_size": -1, "intermediate_size": 1, "num_hidden_layers": 1,
          "num_attention_heads": 1, "vocab_size": 1})",
      "c.json");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("hidden_size"), std::string::npos);
  auto heads = parse_model_config(
      R"({"hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1,
          "num_attention_heads": 6, "num_key_value_heads": 4, "vocab_size": 1})",
      "c.json");
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.status().message().find("num_key_value_heads"), std::string::npos);
  EXPECT_FALSE(parse_model_config("[1, 2]", "c.json").ok());
  EXPECT_FALSE(parse_weight_format("int3").ok());
  EXPECT_EQ(estimate_fit("/no/such/checkpoint", FitOptions{}).status().code(),
            StatusCode::kNotFound);
  FitOptions zero_batch;
  zero_batch.batch = 0;
  EXPECT_EQ(estimate_fit(shape_of("llama-3-8b"), {}, zero_batch).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DoctorFit, ImplausibleSizesAreRefusedNotOverflowed) {
  // Every dimension within its own bound, the product beyond any model.
  auto huge = parse_model_config(
      R"({"hidden_size": 4194304, "intermediate_size": 4194304, "num_hidden_layers": 4096,
          "num_attention_heads": 16384, "head_dim": 65536, "vocab_size": 4194304})",
      "c.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("parameters"), std::string::npos);
  FitOptions options;
  options.batch = 1 << 20;
  options.context = std::int64_t{1} << 30;
  auto estimate = estimate_fit(shape_of("llama-3-70b"), {}, options);
  ASSERT_FALSE(estimate.ok());
  EXPECT_EQ(estimate.status().code(), StatusCode::kInvalidArgument);
}

TEST(DoctorFit, HostileHeadersAreRefused) {
  // data_offsets that disagree with shape x dtype, an unknown dtype, a shape that overflows.
  EXPECT_FALSE(parse_safetensors_header(
                   R"({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 6]}})", 1000, "x")
                   .ok());
  EXPECT_FALSE(parse_safetensors_header(
                   R"({"w": {"dtype": "Q3", "shape": [4], "data_offsets": [0, 6]}})", 1000, "x")
                   .ok());
  EXPECT_FALSE(parse_safetensors_header(
                   R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                       "data_offsets": [0, 0]}})",
                   1000, "x")
                   .ok());
  auto fine = parse_safetensors_header(
      R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F8_E4M3", "shape": [2, 3],
          "data_offsets": [0, 6]}})",
      4096, "x");
  ASSERT_TRUE(fine.ok()) << fine.status().to_string();
  ASSERT_EQ(fine->size(), 1u);
  EXPECT_EQ((*fine)[0].bytes, 6u);
}

// The seed case: the model does not fit because an idle notebook kernel holds 60 GiB; --fit reads
// free memory from the recorded machine and says that ending the kernel makes room.
TEST(DoctorFit, IdleHolderIsWhatToEnd) {
  Options doctor_options;
  doctor_options.root = gpuopt::testing::test_data_dir() + "/doctor/idle-memory-holder";
  auto report = collect(doctor_options);
  ASSERT_TRUE(report.ok());
  judge(*report);
  auto options = fit_memory_from_report(*report, 0, FitOptions{});
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  // 140 GiB - (138 GiB + 600 MiB) used - 512 MiB reserved.
  EXPECT_EQ(options->free_bytes, (140ull << 30) - (138ull << 30) - (600ull << 20) - (512ull << 20));
  ASSERT_EQ(options->reclaimable.size(), 1u);
  EXPECT_EQ(options->reclaimable[0].holder, "python3 (pid 5100)");
  EXPECT_EQ(options->reclaimable[0].finding, "gpu.idle_memory_holder");
  EXPECT_EQ(options->reclaimable[0].bytes, 60ull << 30);
  auto estimate = estimate_fit(shape_of("qwen2.5-7b"), {}, *options);
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->verdict, FitVerdict::kDoesNotFit);
  ASSERT_FALSE(estimate->advice.empty());
  EXPECT_EQ(estimate->advice[0],
            "end python3 (pid 5100) (60.00 GiB, gpu.idle_memory_holder): that frees 60.00 GiB and "
            "then it fits");
  EXPECT_FALSE(fit_memory_from_report(*report, 3, FitOptions{}).ok());
}

TEST(DoctorFit, JsonCarriesTheEstimate) {
  FitOptions options;
  options.free_bytes = 24 * kGiB;
  options.context = 8192;
  auto estimate = estimate_fit(shape_of("llama-3-8b"), {}, options);
  ASSERT_TRUE(estimate.ok());
  auto json = fit_to_json(*estimate);
  EXPECT_EQ(json["schema_version"], kFitSchemaVersion);
  EXPECT_EQ(json["bytes"]["total"], estimate->total_bytes);
  EXPECT_EQ(json["verdict"], "fits");
  EXPECT_EQ(json["max_batch"], 4);
  EXPECT_NE(render_fit_text(*estimate).find("FITS"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::doctor
