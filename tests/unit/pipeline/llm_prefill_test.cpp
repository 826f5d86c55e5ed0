// LLM prefill on the CPU: the host planning (GEMM choice by prompt length, row slices, W4A16
// options) and the twin's KV cache, whose causal invariants the GPU prefill must also keep.
#include "pipeline/llm_prefill.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/pipeline/llm.hpp"

namespace gpuopt::pipeline {
namespace {

using llm_detail::PrefillGemm;
using llm_detail::RowSlice;

TEST(LlmPrefillPlan, GemmFollowsThePromptLengthOnly) {
  EXPECT_EQ(llm_detail::prefill_gemm_for(2), PrefillGemm::kDecodeGemm);
  EXPECT_EQ(llm_detail::prefill_gemm_for(16), PrefillGemm::kDecodeGemm);
  EXPECT_EQ(llm_detail::prefill_gemm_for(17), PrefillGemm::kW4A16);
  EXPECT_EQ(llm_detail::prefill_gemm_for(512), PrefillGemm::kW4A16);
}

TEST(LlmPrefillPlan, SlicesCoverTheRowsOnceInOrder) {
  for (int rows : {1, 15, 16, 17, 255, 256, 257, 1000, 8192}) {
    for (int slice : {16, 64, 256}) {
      const std::vector<RowSlice> slices = llm_detail::prefill_row_slices(rows, slice);
      ASSERT_EQ(slices.size(), static_cast<std::size_t>((rows + slice - 1) / slice))
          << rows << " rows, slices of " << slice;
      int next = 0;
      for (std::size_t i = 0; i < slices.size(); ++i) {
        EXPECT_EQ(slices[i].first, next);
        EXPECT_GE(slices[i].rows, 1);
        EXPECT_LE(slices[i].rows, slice);
        if (i + 1 < slices.size()) EXPECT_EQ(slices[i].rows, slice);
        next += slices[i].rows;
      }
      EXPECT_EQ(next, rows);
    }
  }
  EXPECT_TRUE(llm_detail::prefill_row_slices(0, 16).empty());
  // 1000 rows in 256-row slices: 256, 256, 256, 232 (hand-computed).
  const std::vector<RowSlice> s = llm_detail::prefill_row_slices(1000, 256);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[3].first, 768);
  EXPECT_EQ(s[3].rows, 232);
}

TEST(LlmPrefillPlan, GemmRowsMustBeAMultipleOf16) {
  EXPECT_TRUE(llm_detail::check_prefill_gemm_rows(16).ok());
  EXPECT_TRUE(llm_detail::check_prefill_gemm_rows(256).ok());
  for (int bad : {0, -16, 8, 24, 100}) {
    const Status status = llm_detail::check_prefill_gemm_rows(bad);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("prefill_gemm_rows"), std::string::npos);
  }
}

TEST(LlmPrefillPlan, W4A16OptionsAreDeterministicInt4Only) {
  const kernels::W4A16Options options = llm_detail::prefill_w4a16_options(132);
  EXPECT_TRUE(options.deterministic);    // row bits independent of M: batch-independent requests
  EXPECT_EQ(options.fallback_min_m, 0);  // never the dense fp16 copy
  EXPECT_EQ(options.force_path, kernels::W4A16ForcePath::kAuto);
  EXPECT_EQ(options.sm_count, 132);
  EXPECT_TRUE(kernels::check_w4a16_options(options).ok());
}

std::vector<std::int32_t> random_tokens(int count, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<std::int32_t> tokens(count);
  for (auto& t : tokens) t = token(rng);
  return tokens;
}

// kv_cache [2][layers][batch][kv_heads][positions][head_dim]
float cache_at(const LlmConfig& c, const std::vector<float>& cache, int batch, int positions,
               int which, int l, int b, int kvh, int t, int i) {
  const std::size_t at =
      ((((static_cast<std::size_t>(which) * c.layers + l) * batch + b) * c.kv_heads + kvh) *
           positions +
       t) *
          c.head_dim +
      i;
  return cache[at];
}

// Causality, the property prefill's attention must keep: the cache at positions [0, p) depends on
// the first p tokens alone, so a prompt and its prefix write the same values there.
TEST(LlmReferenceCache, PositionsDependOnEarlierTokensOnly) {
  const LlmConfig c = tiny_llm();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int long_len = 9, short_len = 5;
  const std::vector<std::int32_t> prompt = random_tokens(long_len, c.vocab, rng);
  const std::vector<std::int32_t> prefix(prompt.begin(), prompt.begin() + short_len);
  auto full = llm_generate_reference(c, prompt, 1, long_len, 1, nullptr);
  auto part = llm_generate_reference(c, prefix, 1, short_len, 1, nullptr);
  ASSERT_TRUE(full.ok() && part.ok());
  ASSERT_EQ(full->kv_cache.size(),
            2u * c.layers * c.kv_heads * long_len * static_cast<std::size_t>(c.head_dim));
  ASSERT_EQ(part->kv_cache.size(),
            2u * c.layers * c.kv_heads * short_len * static_cast<std::size_t>(c.head_dim));
  for (int which = 0; which < 2; ++which) {
    for (int l = 0; l < c.layers; ++l) {
      for (int kvh = 0; kvh < c.kv_heads; ++kvh) {
        for (int t = 0; t < short_len; ++t) {
          for (int i = 0; i < c.head_dim; ++i) {
            ASSERT_EQ(cache_at(c, full->kv_cache, 1, long_len, which, l, 0, kvh, t, i),
                      cache_at(c, part->kv_cache, 1, short_len, which, l, 0, kvh, t, i))
                << (which == 0 ? "K" : "V") << " layer " << l << " head " << kvh << " position "
                << t;
          }
        }
      }
    }
  }
  // And the later positions do see the earlier tokens: changing token 0 changes layer 1's V at
  // the last position.
  std::vector<std::int32_t> changed = prompt;
  changed[0] = (changed[0] + 1) % c.vocab;
  auto other = llm_generate_reference(c, changed, 1, long_len, 1, nullptr);
  ASSERT_TRUE(other.ok());
  double moved = 0;
  for (int i = 0; i < c.head_dim; ++i) {
    moved += std::abs(cache_at(c, full->kv_cache, 1, long_len, 1, 1, 0, 0, long_len - 1, i) -
                      cache_at(c, other->kv_cache, 1, long_len, 1, 1, 0, 0, long_len - 1, i));
  }
  EXPECT_GT(moved, 0.0);
}

// Layer 0's V at a position is a function of that position's token alone, and its K the same
// vector rotated by the position (RoPE keeps each pair's length): a hand-checkable layout check
// of the cache the GPU tests compare with.
TEST(LlmReferenceCache, LayerZeroFollowsTheTokenAndRotatesK) {
  const LlmConfig c = tiny_llm();
  const std::int32_t token = 37;
  const std::vector<std::int32_t> prompt = {5, token, 9, 11, token};  // token at 1 and 4
  auto r = llm_generate_reference(c, prompt, 1, 5, 1, nullptr);
  ASSERT_TRUE(r.ok());
  const int half = c.head_dim / 2;
  for (int kvh = 0; kvh < c.kv_heads; ++kvh) {
    for (int i = 0; i < c.head_dim; ++i) {
      EXPECT_EQ(cache_at(c, r->kv_cache, 1, 5, 1, 0, 0, kvh, 1, i),
                cache_at(c, r->kv_cache, 1, 5, 1, 0, 0, kvh, 4, i))
          << "V head " << kvh << " element " << i;
    }
    for (int i = 0; i < half; ++i) {
      auto pair_length = [&](int t) {
        const float a = cache_at(c, r->kv_cache, 1, 5, 0, 0, 0, kvh, t, i);
        const float b = cache_at(c, r->kv_cache, 1, 5, 0, 0, 0, kvh, t, i + half);
        return std::sqrt(a * a + b * b);
      };
      EXPECT_NEAR(pair_length(1), pair_length(4), 1e-5f * (1 + pair_length(1)))
          << "K head " << kvh << " pair " << i;
    }
  }
}

}  // namespace
}  // namespace gpuopt::pipeline
