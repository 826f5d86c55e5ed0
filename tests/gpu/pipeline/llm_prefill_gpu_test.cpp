// LLM prefill on the GPU: the prompt as one forward (LlmDecoderOptions::prefill) against
// token-by-token decoding of the same prompt (tokens, logits, embeddings, KV cache within stated
// tolerances), against the CPU twin, paged vs contiguous caches and batched vs one-at-a-time bit
// for bit, on the tiny and 1B-shaped configs, for both prefill GEMMs (the decode GEMM up to 16
// prompt tokens, W4A16Gemm above); then prefill vs token-by-token time (`[llm] prefill` lines for
// scripts/gpu-check.d/llm_prefill.sh).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "llm_test_support.hpp"

namespace gpuopt::pipeline {
namespace {

using llm_test::random_prompts;
using llm_test::TestBuffer;

struct Outputs {
  std::vector<std::int32_t> tokens;  // [batch][new_tokens]
  std::vector<float> embeddings;     // [batch][embed_dim]
  std::vector<float> logits;         // [batch][new_tokens][vocab]
  std::vector<float> kv_cache;       // [2][layers][batch][kv_heads][positions][head_dim]
};

// generate() with every debug output, all outputs poisoned first.
Outputs run(LlmDecoder& decoder, const std::vector<std::int32_t>& prompts, int batch,
            int prompt_len, int new_tokens, cudaStream_t stream) {
  const LlmConfig& c = decoder.config();
  const int positions = prompt_len + new_tokens - 1;
  TestBuffer<std::int32_t> d_prompts(prompts.size());
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(batch) * new_tokens);
  TestBuffer<float> d_embeddings(static_cast<std::size_t>(batch) * c.embed_dim);
  TestBuffer<float> d_logits(static_cast<std::size_t>(batch) * new_tokens * c.vocab);
  TestBuffer<std::uint16_t> d_cache(2 * static_cast<std::size_t>(c.layers) * batch * c.kv_heads *
                                    positions * c.head_dim);
  d_prompts.upload(prompts);
  d_tokens.poison();
  d_embeddings.poison();
  d_logits.poison();
  d_cache.poison();
  LlmDebugOutputs debug;
  debug.d_logits = d_logits.data;
  debug.d_kv_cache = d_cache.data;
  const Status status = decoder.generate(d_prompts.data, batch, prompt_len, new_tokens,
                                         d_tokens.data, d_embeddings.data, debug, stream);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Outputs out;
  out.tokens = d_tokens.download();
  out.embeddings = d_embeddings.download();
  out.logits = d_logits.download();
  const std::vector<std::uint16_t> cache = d_cache.download();
  out.kv_cache.resize(cache.size());
  for (std::size_t i = 0; i < cache.size(); ++i) {
    out.kv_cache[i] = kernels::fp16_bits_to_float(cache[i]);
  }
  return out;
}

float top2_margin(const float* row, int vocab) {
  float best = -INFINITY, second = -INFINITY;
  for (int v = 0; v < vocab; ++v) {
    if (row[v] > best) {
      second = best;
      best = row[v];
    } else if (row[v] > second) {
      second = row[v];
    }
  }
  return best - second;
}

// Relative RMS difference and worst absolute difference of `got` against `want` over the
// positions [0, compare) of a [2][layers][batch][kv_heads][positions][head_dim] cache; every
// compared element of `got` must be finite (written).
struct CacheDiff {
  double relative = 0, worst = 0, largest = 0;
  bool all_finite = true;
};
CacheDiff compare_cache(const LlmConfig& c, const std::vector<float>& got,
                        const std::vector<float>& want, int batch, int positions, int compare) {
  CacheDiff d;
  double diff = 0, norm = 0;
  const std::size_t heads = 2 * static_cast<std::size_t>(c.layers) * batch * c.kv_heads;
  for (std::size_t h = 0; h < heads; ++h) {
    for (int t = 0; t < compare; ++t) {
      for (int i = 0; i < c.head_dim; ++i) {
        const std::size_t at = (h * positions + t) * c.head_dim + i;
        if (!std::isfinite(got[at])) d.all_finite = false;
        const double e = std::abs(double(got[at]) - want[at]);
        diff += e * e;
        norm += double(want[at]) * want[at];
        d.worst = std::max(d.worst, e);
        d.largest = std::max(d.largest, std::abs(double(want[at])));
      }
    }
  }
  d.relative = std::sqrt(diff / std::max(norm, 1e-30));
  return d;
}

// Prefill against a reference run of the same requests (token-by-token decoding, or the twin
// following prefill's tokens). Per request, positions are compared while the tokens agree; where
// they first differ the reference must have had a near-tie there. Logits of the compared
// positions, embeddings of requests whose tokens all agree, and the cache's prompt positions
// within the tolerances stated here.
void expect_close(const LlmConfig& c, const Outputs& prefill,
                  const std::vector<std::int32_t>& ref_tokens, const std::vector<float>& ref_logits,
                  const std::vector<float>& ref_embeddings, const std::vector<float>& ref_cache,
                  int batch, int prompt_len, int new_tokens, float tie_margin,
                  const std::string& what) {
  SCOPED_TRACE(what);
  double diff = 0, norm = 0;
  int compared = 0, diverged = 0;
  for (int b = 0; b < batch; ++b) {
    bool same = true;
    for (int j = 0; j < new_tokens; ++j) {
      const std::size_t at = static_cast<std::size_t>(b) * new_tokens + j;
      const float* want = &ref_logits[at * c.vocab];
      const float* got = &prefill.logits[at * c.vocab];
      for (int v = 0; v < c.vocab; ++v) {
        ASSERT_TRUE(std::isfinite(got[v])) << "request " << b << " token " << j << " logit " << v;
        diff += (got[v] - want[v]) * double(got[v] - want[v]);
        norm += want[v] * double(want[v]);
      }
      ++compared;
      if (prefill.tokens[at] != ref_tokens[at]) {
        const float margin = top2_margin(want, c.vocab);
        EXPECT_LE(margin, tie_margin)
            << "request " << b << " token " << j << ": prefill chose " << prefill.tokens[at]
            << ", reference " << ref_tokens[at] << " with a top-2 margin of " << margin;
        ++diverged;
        same = false;
        break;  // later positions follow different tokens
      }
    }
    if (same) {
      double worst = 0;
      for (int k = 0; k < c.embed_dim; ++k) {
        const float g = prefill.embeddings[b * c.embed_dim + k];
        ASSERT_TRUE(std::isfinite(g)) << "request " << b << " embedding " << k;
        worst = std::max(worst, std::abs(double(g) - ref_embeddings[b * c.embed_dim + k]));
      }
      EXPECT_LT(worst, 1e-2) << "request " << b << " embedding";
    }
  }
  const double relative = std::sqrt(diff / std::max(norm, 1e-30));
  const int positions = prompt_len + new_tokens - 1;
  const CacheDiff cache =
      compare_cache(c, prefill.kv_cache, ref_cache, batch, positions, prompt_len);
  std::cout << "[llm] " << what << ": logits relative error " << relative << " over " << compared
            << " positions (" << diverged << " requests diverged at a near-tie); KV cache of "
            << prompt_len << " prompt positions: relative error " << cache.relative << ", worst "
            << cache.worst << " (largest value " << cache.largest << ")\n";
  EXPECT_LT(relative, 1e-2);
  EXPECT_TRUE(cache.all_finite) << "KV cache positions unwritten (poison left)";
  // K/V are fp16 and O(1): fp16 rounding through the layers moves them by ~1e-3 relative.
  EXPECT_LT(cache.relative, 1e-2);
  EXPECT_LT(cache.worst, 5e-2 * std::max(1.0, cache.largest));
  EXPECT_LE(diverged, std::max(1, batch / 2)) << "too many requests diverged";
}

class LlmPrefillGpu : public llm_test::GpuStreamTest {};

LlmDecoderOptions with_prefill(bool prefill) {
  LlmDecoderOptions options;
  options.prefill = prefill;
  return options;
}

// (a) and (b): prefill + decode against token-by-token decoding of the same prompts, for both
// prefill GEMMs and a prompt filling the context.
void check_against_token_by_token(const LlmConfig& config, int batch, int prompt_len,
                                  int new_tokens, int gemm_rows, float tie_margin,
                                  cudaStream_t stream) {
  LlmDecoderOptions options = with_prefill(true);
  options.prefill_gemm_rows = gemm_rows;
  auto prefill = LlmDecoder::create(config, options);
  ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
  auto stepwise = LlmDecoder::create(config, with_prefill(false));
  ASSERT_TRUE(stepwise.ok()) << stepwise.status().to_string();
  EXPECT_TRUE((*prefill)->info().prefill);
  EXPECT_FALSE((*stepwise)->info().prefill);
  const unsigned seed = std::random_device{}();
  const std::string what = config.name + ", batch " + std::to_string(batch) + ", prompt " +
                           std::to_string(prompt_len) + ", GEMM rows " + std::to_string(gemm_rows) +
                           ", prompt seed " + std::to_string(seed) + ": prefill vs token-by-token";
  const auto prompts = random_prompts(batch, prompt_len, config.vocab, seed);
  const Outputs fast = run(**prefill, prompts, batch, prompt_len, new_tokens, stream);
  const Outputs slow = run(**stepwise, prompts, batch, prompt_len, new_tokens, stream);
  expect_close(config, fast, slow.tokens, slow.logits, slow.embeddings, slow.kv_cache, batch,
               prompt_len, new_tokens, tie_margin, what);
  const bool identical =
      fast.tokens == slow.tokens &&
      0 == std::memcmp(fast.logits.data(), slow.logits.data(), fast.logits.size() * sizeof(float));
  std::cout << "[llm] " << what << ": " << (identical ? "bit-identical" : "not bit-identical")
            << "\n";
  // The same prefill decoder again: the same bits (no state leaks between calls).
  const Outputs again = run(**prefill, prompts, batch, prompt_len, new_tokens, stream);
  EXPECT_EQ(again.tokens, fast.tokens);
  EXPECT_EQ(
      0, std::memcmp(again.logits.data(), fast.logits.data(), fast.logits.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(again.kv_cache.data(), fast.kv_cache.data(),
                           fast.kv_cache.size() * sizeof(float)));
}

TEST_F(LlmPrefillGpu, TinyMatchesTokenByToken) {
  const LlmConfig c = tiny_llm();                                  // max_batch 8, max_context 32
  check_against_token_by_token(c, 8, 6, 8, 256, 0.03f, stream_);   // decode GEMM slices
  check_against_token_by_token(c, 1, 2, 4, 256, 0.03f, stream_);   // the shortest prefill
  check_against_token_by_token(c, 8, 16, 8, 256, 0.03f, stream_);  // 16 tokens: decode GEMM
  check_against_token_by_token(c, 8, 17, 8, 256, 0.03f, stream_);  // 17: W4A16Gemm
  check_against_token_by_token(c, 3, 24, 8, 32, 0.03f, stream_);   // 72 rows: 32, 32, 8
  check_against_token_by_token(c, 8, 31, 1, 256, 0.03f, stream_);  // the whole context
  check_against_token_by_token(c, 5, 20, 12, 16, 0.03f, stream_);  // 16-row W4A16 slices
}

TEST_F(LlmPrefillGpu, OneBillionShapedMatchesTokenByToken) {
  const LlmConfig c = llama_1b_shaped();                            // max_context 64
  check_against_token_by_token(c, 16, 8, 8, 256, 0.05f, stream_);   // the pipeline's shape
  check_against_token_by_token(c, 4, 40, 8, 256, 0.05f, stream_);   // W4A16Gemm, 160 rows
  check_against_token_by_token(c, 16, 60, 4, 256, 0.05f, stream_);  // 960 rows in 4 slices
}

// (c): prefill against the CPU twin (which follows prefill's tokens), KV cache included.
TEST_F(LlmPrefillGpu, TinyMatchesTheTwin) {
  const LlmConfig c = tiny_llm();
  auto decoder = LlmDecoder::create(c, with_prefill(true));
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  for (const int prompt_len : {6, 20, 30}) {
    const int batch = 8, new_tokens = c.max_context - prompt_len;
    const unsigned seed = std::random_device{}();
    const std::string what = "tiny, batch 8, prompt " + std::to_string(prompt_len) +
                             ", prompt seed " + std::to_string(seed) + ": prefill vs the twin";
    const auto prompts = random_prompts(batch, prompt_len, c.vocab, seed);
    const Outputs gpu = run(**decoder, prompts, batch, prompt_len, new_tokens, stream_);
    auto twin = llm_generate_reference(c, prompts, batch, prompt_len, new_tokens, &gpu.tokens);
    ASSERT_TRUE(twin.ok()) << twin.status().to_string();
    // The twin follows the GPU's tokens, so every position is compared; the tokens where the
    // twin's own choice had a clear margin must agree.
    for (std::size_t i = 0; i < gpu.tokens.size(); ++i) {
      if (twin->top2_margin[i] > 0.03f) {
        EXPECT_EQ(gpu.tokens[i], twin->tokens[i]) << what << ": position " << i;
      }
    }
    expect_close(c, gpu, gpu.tokens, twin->logits, twin->embeddings, twin->kv_cache, batch,
                 prompt_len, new_tokens, 0.03f, what);
    // The generated positions' cache too (the twin fed the same tokens).
    const CacheDiff all = compare_cache(c, gpu.kv_cache, twin->kv_cache, batch,
                                        prompt_len + new_tokens - 1, prompt_len + new_tokens - 1);
    EXPECT_TRUE(all.all_finite);
    EXPECT_LT(all.relative, 1e-2) << what << ": whole cache";
  }
}

// (d): paged caches of several block sizes and a contiguous one, graphs on and off: the same bits
// (tokens, embeddings, logits, cache), for both prefill GEMMs.
TEST_F(LlmPrefillGpu, PagedAndContiguousCacheGiveTheSameBits) {
  const LlmConfig c = tiny_llm();
  struct Variant {
    const char* name;
    int block_tokens;
    bool graphs;
  };
  const Variant variants[] = {{"contiguous", 0, true},
                              {"1-token blocks", 1, true},
                              {"4-token blocks, no graphs", 4, false},
                              {"16-token blocks", 16, true}};
  for (const int prompt_len : {7, 21}) {
    const unsigned seed = std::random_device{}();
    SCOPED_TRACE("prompt " + std::to_string(prompt_len) + ", seed " + std::to_string(seed));
    const int batch = 5, new_tokens = c.max_context - prompt_len - 1;
    const auto prompts = random_prompts(batch, prompt_len, c.vocab, seed);
    Outputs reference;
    for (const Variant& v : variants) {
      SCOPED_TRACE(v.name);
      LlmDecoderOptions options = with_prefill(true);
      options.kv_block_tokens = v.block_tokens;
      options.cuda_graphs = v.graphs;
      auto decoder = LlmDecoder::create(c, options);
      ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
      const Outputs out = run(**decoder, prompts, batch, prompt_len, new_tokens, stream_);
      if (reference.tokens.empty()) {
        reference = out;
        continue;
      }
      EXPECT_EQ(out.tokens, reference.tokens);
      EXPECT_EQ(0, std::memcmp(out.embeddings.data(), reference.embeddings.data(),
                               out.embeddings.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(out.logits.data(), reference.logits.data(),
                               out.logits.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(out.kv_cache.data(), reference.kv_cache.data(),
                               out.kv_cache.size() * sizeof(float)));
    }
  }
}

// Each request's bits do not depend on the batch with prefill either: both prefill GEMMs, W4A16
// slices that cut through requests.
TEST_F(LlmPrefillGpu, BatchedEqualsOneAtATime) {
  const LlmConfig c = tiny_llm();
  LlmDecoderOptions options = with_prefill(true);
  options.prefill_gemm_rows = 48;
  auto decoder = LlmDecoder::create(c, options);
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  for (const int prompt_len : {9, 20}) {
    const unsigned seed = std::random_device{}();
    SCOPED_TRACE("prompt " + std::to_string(prompt_len) + ", seed " + std::to_string(seed));
    const int batch = 7, new_tokens = 6;
    const auto prompts = random_prompts(batch, prompt_len, c.vocab, seed);
    const Outputs all = run(**decoder, prompts, batch, prompt_len, new_tokens, stream_);
    for (int b = 0; b < batch; ++b) {
      const std::vector<std::int32_t> one(prompts.begin() + b * prompt_len,
                                          prompts.begin() + (b + 1) * prompt_len);
      const Outputs alone = run(**decoder, one, 1, prompt_len, new_tokens, stream_);
      EXPECT_TRUE(
          std::equal(alone.tokens.begin(), alone.tokens.end(), all.tokens.begin() + b * new_tokens))
          << "request " << b;
      EXPECT_EQ(0, std::memcmp(alone.embeddings.data(), all.embeddings.data() + b * c.embed_dim,
                               c.embed_dim * sizeof(float)))
          << "request " << b;
      EXPECT_EQ(0,
                std::memcmp(alone.logits.data(),
                            all.logits.data() + static_cast<std::size_t>(b) * new_tokens * c.vocab,
                            static_cast<std::size_t>(new_tokens) * c.vocab * sizeof(float)))
          << "request " << b;
    }
  }
}

TEST_F(LlmPrefillGpu, RefusesBadOptions) {
  LlmDecoderOptions options = with_prefill(true);
  options.prefill_gemm_rows = 24;
  EXPECT_EQ(LlmDecoder::create(tiny_llm(), options).status().code(), StatusCode::kInvalidArgument);
  options.prefill_gemm_rows = 0;
  EXPECT_EQ(LlmDecoder::create(tiny_llm(), options).status().code(), StatusCode::kInvalidArgument);
  options.prefill = false;  // the rows are not read without prefill
  EXPECT_TRUE(LlmDecoder::create(tiny_llm(), options).ok());
}

// Median of `repeats` timed generate() calls (one new token: the prompt's forward and the first
// choice) after one warm-up call, in ms.
double time_generate(LlmDecoder& decoder, const std::vector<std::int32_t>& prompts, int batch,
                     int prompt_len, cudaStream_t stream) {
  const LlmConfig& c = decoder.config();
  TestBuffer<std::int32_t> d_prompts(prompts.size());
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(batch));
  TestBuffer<float> d_embeddings(static_cast<std::size_t>(batch) * c.embed_dim);
  d_prompts.upload(prompts);
  cudaEvent_t start, stop;
  EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
  std::vector<double> times;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(cudaEventRecord(start, stream), cudaSuccess);
    const Status status = decoder.generate(d_prompts.data, batch, prompt_len, 1, d_tokens.data,
                                           d_embeddings.data, stream);
    EXPECT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    if (r > 0) times.push_back(ms);  // the first call captures graphs and plans GEMMs
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Prefill vs token-by-token time of the 1B-shaped model's prompt (generate with one new token) at
// batch 1 and 16, prompts of 8, 64 and 512 tokens; no asserts on time.
TEST_F(LlmPrefillGpu, OneBillionShapedPrefillTime) {
  LlmConfig c = llama_1b_shaped();
  c.max_context = 520;
  auto prefill = LlmDecoder::create(c, with_prefill(true));
  ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
  auto stepwise = LlmDecoder::create(c, with_prefill(false));
  ASSERT_TRUE(stepwise.ok()) << stepwise.status().to_string();
  for (const int batch : {1, 16}) {
    for (const int prompt_len : {8, 64, 512}) {
      const auto prompts = random_prompts(batch, prompt_len, c.vocab, 11);
      const double fast = time_generate(**prefill, prompts, batch, prompt_len, stream_);
      const double slow = time_generate(**stepwise, prompts, batch, prompt_len, stream_);
      const double tokens = static_cast<double>(batch) * prompt_len;
      std::cout << "[llm] prefill batch " << batch << " prompt " << prompt_len << " (" << c.name
                << "): prefill " << fast << " ms, token-by-token " << slow << " ms, " << slow / fast
                << "x, " << tokens / (fast * 1e-3) << " prompt tokens/s; "
                << (*prefill)->info().describe() << "\n";
    }
  }
}

}  // namespace
}  // namespace gpuopt::pipeline
