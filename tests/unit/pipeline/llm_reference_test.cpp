// LLM stage on the CPU: config arithmetic, the seeded weight hash, and the twin's pieces (RMSNorm,
// RoPE, attention) against hand-computed fixtures, plus the twin's own invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {
namespace {

TEST(LlmConfig, TinyWeightBytesAndFlops) {
  const LlmConfig c = tiny_llm();
  ASSERT_TRUE(check_llm_config(c).ok());
  // Σ K·N: per layer qkv 128·256 + o 128·128 + gate_up 128·512 + down 256·128 = 147456, two
  // layers, + lm_head 128·512 = 360448. Bytes: K·N/2 nibbles + K·N/128 fp16 scales.
  EXPECT_DOUBLE_EQ(llm_weight_bytes(c), 360448.0 / 2 + 360448.0 / 128 * 2);
  // Batch 3 over 5 positions: 3·(2·360448 + 4·2 layers·4 heads·32·5).
  EXPECT_DOUBLE_EQ(llm_decode_step_flops(c, 3, 5), 3.0 * (2 * 360448.0 + 4.0 * 2 * 4 * 32 * 5));
  EXPECT_DOUBLE_EQ(llm_embedding_table_bytes(c), 512.0 * 128 * 2);
  EXPECT_DOUBLE_EQ(llm_kv_cache_bytes(c), 2.0 * 2 * 8 * 2 * 32 * 32 * 2);
}

TEST(LlmConfig, OneBillionShapedBytes) {
  const LlmConfig c = llama_1b_shaped();
  ASSERT_TRUE(check_llm_config(c).ok());
  // Per layer: 2048·3072 + 2048·2048 + 2048·16384 + 8192·2048 = 60817408; ×16 + 2048·128256.
  const double kn = 16.0 * 60817408 + 2048.0 * 128256;
  EXPECT_DOUBLE_EQ(kn, 1235746816.0);
  EXPECT_DOUBLE_EQ(llm_weight_bytes(c), 637181952.0);  // kn · (1/2 + 2/128)
  EXPECT_DOUBLE_EQ(llm_decode_step_flops(c, 1, 0), 2 * kn);
}

TEST(LlmConfig, EightBillionShapedBytes) {
  const LlmConfig c = llama_8b_shaped();
  ASSERT_TRUE(check_llm_config(c).ok());
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.head_dim * c.heads, 4096);
  // Per layer: 4096·6144 (q 32 + k 8 + v 8 heads of 128) + 4096·4096 + 4096·28672 + 14336·4096
  // = 218103808; ×32 + 4096·128256 (lm_head).
  const double kn = 32.0 * 218103808 + 4096.0 * 128256;
  EXPECT_DOUBLE_EQ(llm_weight_bytes(c), kn * (0.5 + 2.0 / 128));
  EXPECT_DOUBLE_EQ(llm_decode_step_flops(c, 1, 0), 2 * kn);
}

// The decode GEMM's launch shape: columns covered exactly, at most one warp of a split idle,
// and, for the 1B shapes on a 132-SM H200, the splits worked out by hand.
TEST(LlmGemvPlan, CoversTheLayerAndGivesEveryWarpWork) {
  using llm_detail::plan_gemv;
  for (int sms : {1, 46, 108, 132, 200}) {
    for (int k : {128, 256, 2048, 8192, 14336}) {
      for (int n : {128, 256, 3072, 16384, 128256 / 64 * 64}) {
        for (bool pair : {false, true}) {
          if (pair && n % 128 != 0) continue;
          const llm_detail::GemvPlan plan = plan_gemv(k, n, pair, sms);
          SCOPED_TRACE("sms " + std::to_string(sms) + " K " + std::to_string(k) + " N " +
                       std::to_string(n) + (pair ? " pair" : ""));
          EXPECT_EQ(plan.parts, pair ? 2 : 1);
          EXPECT_EQ(plan.items * 64 * plan.parts, n);
          const int groups = k / 128, warps_per_strip = 4 / plan.parts;
          EXPECT_GE(plan.splits, 1);
          EXPECT_LE(plan.splits, groups);
          // The smallest split has groups/splits groups, one per warp but for at most one.
          if (plan.splits > 1) EXPECT_GE(groups / plan.splits + 1, warps_per_strip);
          EXPECT_EQ(plan.partial_floats(16, n),
                    plan.splits > 1 ? static_cast<std::size_t>(plan.splits) * 16 * n : 0u);
        }
      }
    }
  }
  EXPECT_EQ(plan_gemv(2048, 3072, false, 132).splits, 4);    // qkv: 48 strips, 16 groups / 4 warps
  EXPECT_EQ(plan_gemv(2048, 2048, false, 132).splits, 4);    // o
  EXPECT_EQ(plan_gemv(2048, 16384, true, 132).splits, 3);    // gate/up: 128 pairs, 396 / 128
  EXPECT_EQ(plan_gemv(8192, 2048, false, 132).splits, 12);   // down: 32 strips, 396 / 32
  EXPECT_EQ(plan_gemv(2048, 128256, false, 132).splits, 1);  // lm_head: 2004 strips fill the GPU
  EXPECT_EQ(plan_gemv(2048, 3072, false, 132, 1).splits, 1);
}

// With clusters: plan_gemv's splits capped at a cluster's 8, in clusters when all the items'
// clusters are resident at once, else plan_gemv's plan. The fake device holds what the H200
// reported (132 SMs, 3 blocks per SM): 198, 124, 92, 69, 62, 47, 45 clusters of 2..8 blocks.
TEST(LlmGemvPlan, ClustersWhereTheyFitInOneWave) {
  using llm_detail::plan_gemv;
  using llm_detail::plan_gemv_cluster;
  std::vector<int> asked;
  auto h200 = [&](int splits) {
    asked.push_back(splits);
    static constexpr int kActive[] = {0, 0, 198, 124, 92, 69, 62, 47, 45};
    return kActive[splits];
  };
  // 1B shapes: qkv 48 items x 4, o 32 x 4 fit; down's 12 splits capped at 8 (32 clusters of 8
  // fit); gate/up's 128 clusters of 3 do not (124): 3 splits, global; lm_head one split.
  llm_detail::GemvPlan plan = plan_gemv_cluster(2048, 3072, false, 132, h200);
  EXPECT_EQ(plan.splits, 4);
  EXPECT_TRUE(plan.cluster);
  EXPECT_EQ(plan.partial_floats(16, 3072), 0u);
  plan = plan_gemv_cluster(8192, 2048, false, 132, h200);
  EXPECT_EQ(plan.splits, 8);
  EXPECT_TRUE(plan.cluster);
  plan = plan_gemv_cluster(2048, 16384, true, 132, h200);
  EXPECT_EQ(plan.splits, 3);
  EXPECT_FALSE(plan.cluster);
  EXPECT_EQ(plan.partial_floats(16, 16384), 3u * 16 * 16384);
  asked.clear();
  plan = plan_gemv_cluster(2048, 128256, false, 132, h200);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_FALSE(plan.cluster);
  EXPECT_TRUE(asked.empty());  // one split: nothing to ask
  // 8B shapes: qkv 96 items x 4 (92 fit), o and down 64 x 6 (62 fit): all global, as planned.
  for (const auto& [k, n] : {std::pair{4096, 6144}, {4096, 4096}, {14336, 4096}}) {
    plan = plan_gemv_cluster(k, n, false, 132, h200);
    const llm_detail::GemvPlan global = plan_gemv(k, n, false, 132);
    EXPECT_FALSE(plan.cluster) << k << " x " << n;
    EXPECT_EQ(plan.splits, global.splits) << k << " x " << n;
  }
}

TEST(LlmConfig, RejectsShapesTheGemmCannotRun) {
  LlmConfig c = tiny_llm();
  c.hidden = 100;
  Status s = check_llm_config(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("K=100"), std::string::npos) << s.message();
  c = tiny_llm();
  c.vocab = 1000;
  s = check_llm_config(c);
  EXPECT_NE(s.message().find("lm_head: N=1000"), std::string::npos) << s.message();
  c = tiny_llm();
  c.kv_heads = 3;
  EXPECT_EQ(check_llm_config(c).code(), StatusCode::kInvalidArgument);
  c = tiny_llm();
  c.max_batch = 0;
  EXPECT_EQ(check_llm_config(c).code(), StatusCode::kInvalidArgument);
}

TEST(LlmWeights, ScalesAreExactFp16OfTheIntendedSize) {
  for (int k : {128, 2048, 8192}) {
    const int e = llm_scale_exponent(k);
    double mean = 0;
    for (std::uint64_t i = 0; i < 4096; ++i) {
      const std::uint16_t bits = llm_scale_bits(99, 3, i, e);
      const float value = kernels::fp16_bits_to_float(bits);
      const double m = value / std::ldexp(1.0, e);
      ASSERT_EQ(m, std::floor(m)) << "not m·2^e at k=" << k;
      ASSERT_GE(m, 32);
      ASSERT_LE(m, 63);
      mean += value / 4096.0;
    }
    // Target 1/sqrt(17.5 K) within the factor √2 a power-of-two exponent allows.
    const double target = 1.0 / std::sqrt(17.5 * k);
    EXPECT_GT(mean, target / 1.5) << k;
    EXPECT_LT(mean, target * 1.5) << k;
  }
  // Nibbles: never 0 (q = -8), symmetric q = nibble - 8 has mean 0 and mean square 17.5.
  std::vector<int> histogram(16, 0);
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const std::uint32_t w = llm_tile_word(5, 9, i);
    for (int p = 0; p < 8; ++p) ++histogram[(w >> (4 * p)) & 15u];
  }
  EXPECT_EQ(histogram[0], 0);
  double mean = 0, square = 0;
  for (int v = 0; v < 16; ++v) {
    mean += (v - 8) * histogram[v] / 160000.0;
    square += (v - 8) * (v - 8) * histogram[v] / 160000.0;
  }
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(square, 17.5, 0.3);
  EXPECT_GT(histogram[8], histogram[7] * 1.8);  // 0 and 8 both land on 8
  // Different tensors and seeds give different words.
  EXPECT_NE(llm_tile_word(1, 0, 5), llm_tile_word(1, 1, 5));
  EXPECT_NE(llm_tile_word(1, 0, 5), llm_tile_word(2, 0, 5));
  const float t = llm_token_embedding(3, 17);
  EXPECT_EQ(kernels::fp16_bits_to_float(kernels::float_to_fp16_bits(t)), t);  // exact in fp16
}

TEST(LlmReference, RmsNormHandComputed) {
  // [3, 4]: mean square 12.5, rms 3.5355339.
  const std::vector<float> y = llm_rms_norm_reference({3.0f, 4.0f}, 0.0f);
  EXPECT_NEAR(y[0], 0.8485281f, 1e-6);
  EXPECT_NEAR(y[1], 1.1313708f, 1e-6);
  // eps enters under the root: [0, 0] stays finite.
  const std::vector<float> z = llm_rms_norm_reference({0.0f, 0.0f}, 1e-5f);
  EXPECT_EQ(z[0], 0.0f);
}

TEST(LlmReference, RopeHandComputed) {
  // head_dim 4: pairs (0, 2) at frequency 1 and (1, 3) at 10000^(-1/2) = 0.01.
  float a[4] = {1, 0, 0, 0};
  llm_rope_reference(a, 4, 1, 10000.0);
  EXPECT_NEAR(a[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(a[2], std::sin(1.0), 1e-6);
  EXPECT_NEAR(a[1], 0.0, 1e-7);
  float b[4] = {0, 1, 0, 2};
  llm_rope_reference(b, 4, 3, 10000.0);
  EXPECT_NEAR(b[1], std::cos(0.03) - 2 * std::sin(0.03), 1e-6);
  EXPECT_NEAR(b[3], 2 * std::cos(0.03) + std::sin(0.03), 1e-6);
  float c[4] = {1, 2, 3, 4};
  llm_rope_reference(c, 4, 0, 500000.0);  // position 0: identity
  EXPECT_EQ(c[3], 4.0f);
  std::vector<float> cos_table, sin_table;
  llm_rope_table(4, 4, 10000.0, cos_table, sin_table);
  ASSERT_EQ(cos_table.size(), 8u);
  EXPECT_NEAR(cos_table[3 * 2 + 1], std::cos(0.03), 1e-7);
  EXPECT_NEAR(sin_table[2 * 2 + 0], std::sin(2.0), 1e-7);
}

TEST(LlmReference, AttentionHandComputed) {
  const float q[2] = {1, 0};
  const float keys[4] = {1, 0, 0, 1};
  const float values[4] = {1, 2, 3, 4};
  // scores 1/√2 and 0: weights 1/(1 + e^(-1/√2)) and the rest.
  const double w0 = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  const std::vector<float> out = llm_attention_reference(q, keys, values, 2, 2);
  EXPECT_NEAR(out[0], w0 * 1 + (1 - w0) * 3, 1e-6);
  EXPECT_NEAR(out[1], w0 * 2 + (1 - w0) * 4, 1e-6);
  const std::vector<float> one = llm_attention_reference(q, keys, values, 1, 2);
  EXPECT_EQ(one[0], 1.0f);  // a single position returns its value
  EXPECT_EQ(one[1], 2.0f);
}

TEST(LlmReference, TwinIsPerRequestAndItsEmbeddingsUnitNorm) {
  const LlmConfig c = tiny_llm();
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> token(0, c.vocab - 1);
  const int batch = 3, prompt_len = 4, new_tokens = 5;
  std::vector<std::int32_t> prompts(batch * prompt_len);
  for (auto& t : prompts) t = token(rng);
  auto both = llm_generate_reference(c, prompts, batch, prompt_len, new_tokens, nullptr);
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  const LlmReferenceResult& r = *both;
  ASSERT_EQ(r.tokens.size(), static_cast<std::size_t>(batch * new_tokens));
  for (int b = 0; b < batch; ++b) {
    double norm = 0;
    for (int k = 0; k < c.embed_dim; ++k)
      norm += r.embeddings[b * c.embed_dim + k] * r.embeddings[b * c.embed_dim + k];
    EXPECT_NEAR(norm, 1.0, 1e-5);
    for (int j = 0; j < new_tokens; ++j) {
      const std::int32_t t = r.tokens[b * new_tokens + j];
      ASSERT_GE(t, 0);
      ASSERT_LT(t, c.vocab);
      EXPECT_GE(r.top2_margin[b * new_tokens + j], 0.0f);
      // The token is the logits' argmax.
      const float* row = &r.logits[(static_cast<std::size_t>(b) * new_tokens + j) * c.vocab];
      EXPECT_EQ(std::max_element(row, row + c.vocab) - row, t);
    }
  }
  // Request 1 alone gives the same answer.
  std::vector<std::int32_t> single(prompts.begin() + prompt_len, prompts.begin() + 2 * prompt_len);
  auto alone = llm_generate_reference(c, single, 1, prompt_len, new_tokens, nullptr);
  ASSERT_TRUE(alone.ok());
  for (int j = 0; j < new_tokens; ++j) EXPECT_EQ(alone->tokens[j], r.tokens[new_tokens + j]);
  for (int k = 0; k < c.embed_dim; ++k) {
    EXPECT_EQ(alone->embeddings[k], r.embeddings[c.embed_dim + k]);
  }
  // Forcing the twin's own tokens changes nothing; forcing others changes later logits.
  auto forced = llm_generate_reference(c, prompts, batch, prompt_len, new_tokens, &r.tokens);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->logits, r.logits);
  std::vector<std::int32_t> other = r.tokens;
  other[0] = (other[0] + 1) % c.vocab;
  auto changed = llm_generate_reference(c, prompts, batch, prompt_len, new_tokens, &other);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed->logits, r.logits);
}

TEST(LlmReference, RejectsBadRequests) {
  const LlmConfig c = tiny_llm();
  std::vector<std::int32_t> prompts(4, 1);
  EXPECT_EQ(llm_generate_reference(c, prompts, 1, 4, c.max_context, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(llm_generate_reference(c, prompts, 2, 4, 2, nullptr).status().code(),
            StatusCode::kInvalidArgument);  // 4 tokens for 2 x 4
  prompts[2] = c.vocab;
  EXPECT_EQ(llm_generate_reference(c, prompts, 1, 4, 2, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LlmDecoder, CreateSaysWhyItCannotRunOrRuns) {
  auto decoder = LlmDecoder::create(tiny_llm());
  if (decoder.ok()) {
    EXPECT_EQ((*decoder)->config().hidden, 128);
  } else {
    // CPU-only build: UNIMPLEMENTED; CUDA build without a device: UNAVAILABLE.
    EXPECT_TRUE(decoder.status().code() == StatusCode::kUnimplemented ||
                decoder.status().code() == StatusCode::kUnavailable)
        << decoder.status().to_string();
  }
  LlmConfig bad = tiny_llm();
  bad.ffn = 100;
#if GPUOPT_CUDA
  EXPECT_EQ(LlmDecoder::create(bad).status().code(), StatusCode::kInvalidArgument);
#else
  EXPECT_EQ(LlmDecoder::create(bad).status().code(), StatusCode::kUnimplemented);
#endif
}

}  // namespace
}  // namespace gpuopt::pipeline
