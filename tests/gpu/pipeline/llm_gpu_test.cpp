// LLM decoder on the GPU against its CPU twin (tiny config), batch independence, run-to-run
// reproducibility, and the 1B-shaped config end to end with its step times printed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::pipeline {
namespace {

// A typed runtime::DeviceBuffer with checked synchronous upload, download and poisoning.
template <typename T>
struct TestBuffer {
  runtime::DeviceBuffer owned;
  T* data = nullptr;
  std::size_t count = 0;
  explicit TestBuffer(std::size_t n) : count(n) {
    auto buffer = runtime::DeviceBuffer::allocate(std::max<std::size_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
    if (buffer.ok()) {
      owned = std::move(buffer).value();
      data = owned.data_as<T>();
    }
  }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  void poison() { EXPECT_EQ(cudaMemset(data, 0xff, count * sizeof(T)), cudaSuccess); }  // -1 / NaN
};

struct Outputs {
  std::vector<std::int32_t> tokens;
  std::vector<float> embeddings;
  std::vector<float> logits;
};

Outputs run(LlmDecoder& decoder, const std::vector<std::int32_t>& prompts, int batch,
            int prompt_len, int new_tokens, bool want_logits, cudaStream_t stream) {
  const LlmConfig& c = decoder.config();
  TestBuffer<std::int32_t> d_prompts(prompts.size());
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(batch) * new_tokens);
  TestBuffer<float> d_embeddings(static_cast<std::size_t>(batch) * c.embed_dim);
  TestBuffer<float> d_logits(want_logits ? static_cast<std::size_t>(batch) * new_tokens * c.vocab
                                         : 0);
  d_prompts.upload(prompts);
  d_tokens.poison();
  d_embeddings.poison();
  d_logits.poison();
  LlmDebugOutputs debug;
  if (want_logits) debug.d_logits = d_logits.data;
  const Status status = decoder.generate(d_prompts.data, batch, prompt_len, new_tokens,
                                         d_tokens.data, d_embeddings.data, debug, stream);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Outputs out;
  out.tokens = d_tokens.download();
  out.embeddings = d_embeddings.download();
  if (want_logits) out.logits = d_logits.download();
  return out;
}

std::vector<std::int32_t> random_prompts(int batch, int prompt_len, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<std::int32_t> prompts(static_cast<std::size_t>(batch) * prompt_len);
  for (auto& t : prompts) t = token(rng);
  return prompts;
}

class LlmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUOPT_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(LlmGpu, TinyMatchesTheTwin) {
  auto decoder = LlmDecoder::create(tiny_llm());
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  const LlmConfig& c = (*decoder)->config();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("prompt seed " + std::to_string(seed));
  const int batch = 8, prompt_len = 6, new_tokens = 12;
  const auto prompts = random_prompts(batch, prompt_len, c.vocab, seed);
  const Outputs gpu = run(**decoder, prompts, batch, prompt_len, new_tokens, true, stream_);
  // The twin follows the GPU's tokens, so one near-tie does not derail every later position.
  auto twin = llm_generate_reference(c, prompts, batch, prompt_len, new_tokens, &gpu.tokens);
  ASSERT_TRUE(twin.ok()) << twin.status().to_string();

  // Tokens: compared where the twin's top two logits are further apart than fp16 activations
  // can move them (logits are O(1); fp16 rounding through the layers moves them ~1e-2 at most).
  const float tie_margin = 0.03f;
  int checked = 0, skipped = 0, mismatched = 0;
  for (std::size_t i = 0; i < gpu.tokens.size(); ++i) {
    if (twin->top2_margin[i] <= tie_margin) {
      ++skipped;
      continue;
    }
    ++checked;
    if (gpu.tokens[i] != twin->tokens[i]) {
      ++mismatched;
      ADD_FAILURE() << "position " << i << ": gpu " << gpu.tokens[i] << ", twin " << twin->tokens[i]
                    << " (margin " << twin->top2_margin[i] << ")";
    }
  }
  std::cout << "[llm] tokens: " << checked << " checked, " << skipped
            << " skipped as near-ties (top-2 margin <= " << tie_margin << "), " << mismatched
            << " mismatched\n";
  EXPECT_GE(checked, static_cast<int>(0.6 * gpu.tokens.size()));  // "most"

  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < gpu.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu.logits[i])) << "logit " << i << " unwritten or not finite";
    diff += (gpu.logits[i] - twin->logits[i]) * double(gpu.logits[i] - twin->logits[i]);
    norm += twin->logits[i] * double(twin->logits[i]);
  }
  const double relative = std::sqrt(diff / norm);
  std::cout << "[llm] logits relative error " << relative << "\n";
  EXPECT_LT(relative, 1e-2);

  for (int b = 0; b < batch; ++b) {
    double unit = 0, max_diff = 0;
    for (int k = 0; k < c.embed_dim; ++k) {
      const float g = gpu.embeddings[b * c.embed_dim + k];
      ASSERT_TRUE(std::isfinite(g));
      unit += g * double(g);
      max_diff = std::max(max_diff, std::abs(double(g) - twin->embeddings[b * c.embed_dim + k]));
    }
    EXPECT_NEAR(unit, 1.0, 1e-4) << "request " << b;
    EXPECT_LT(max_diff, 1e-2) << "request " << b;
  }
}

TEST_F(LlmGpu, BatchedEqualsOneAtATimeAndRunsRepeat) {
  auto decoder = LlmDecoder::create(tiny_llm());
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  const LlmConfig& c = (*decoder)->config();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("prompt seed " + std::to_string(seed));
  const int batch = 8, prompt_len = 5, new_tokens = 10;
  const auto prompts = random_prompts(batch, prompt_len, c.vocab, seed);
  const Outputs all = run(**decoder, prompts, batch, prompt_len, new_tokens, false, stream_);
  const Outputs again = run(**decoder, prompts, batch, prompt_len, new_tokens, false, stream_);
  EXPECT_EQ(all.tokens, again.tokens);
  EXPECT_EQ(0, std::memcmp(all.embeddings.data(), again.embeddings.data(),
                           all.embeddings.size() * sizeof(float)));
  // Different prompts usually lead to different instructions: the outputs are not constant.
  bool any_different = false;
  for (int b = 1; b < batch; ++b) {
    any_different |= !std::equal(all.tokens.begin(), all.tokens.begin() + new_tokens,
                                 all.tokens.begin() + b * new_tokens);
  }
  EXPECT_TRUE(any_different);
  for (int b = 0; b < batch; ++b) {
    std::vector<std::int32_t> one(prompts.begin() + b * prompt_len,
                                  prompts.begin() + (b + 1) * prompt_len);
    const Outputs alone = run(**decoder, one, 1, prompt_len, new_tokens, false, stream_);
    EXPECT_TRUE(
        std::equal(alone.tokens.begin(), alone.tokens.end(), all.tokens.begin() + b * new_tokens))
        << "request " << b;
    EXPECT_EQ(0, std::memcmp(alone.embeddings.data(), all.embeddings.data() + b * c.embed_dim,
                             c.embed_dim * sizeof(float)))
        << "request " << b;
  }
}

TEST_F(LlmGpu, RefusesBadRequests) {
  auto decoder = LlmDecoder::create(tiny_llm());
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  const LlmConfig& c = (*decoder)->config();
  TestBuffer<std::int32_t> buffer(1024);
  TestBuffer<float> embeddings(1024);
  auto code = [&](int batch, int prompt_len, int new_tokens) {
    return (*decoder)
        ->generate(buffer.data, batch, prompt_len, new_tokens, buffer.data + 512, embeddings.data,
                   stream_)
        .code();
  };
  EXPECT_EQ(code(0, 4, 4), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c.max_batch + 1, 4, 4), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(1, c.max_context, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(1, 0, 4), StatusCode::kInvalidArgument);
  EXPECT_EQ((*decoder)->decode_step(1, c.max_context, stream_).code(),
            StatusCode::kInvalidArgument);
}

// The 1B-shaped model end to end: batch 16, prompt 8, 16 new tokens. Prints times (no asserts on
// them): one whole generate, and one decode step at batch 1 and 16 (the GEMMs run at M = 16 both
// times; docs/llm.md).
TEST_F(LlmGpu, OneBillionShapedRunsAndReportsItsTime) {
  const LlmConfig config = llama_1b_shaped();
  auto decoder = LlmDecoder::create(config);
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  const LlmConfig& c = (*decoder)->config();
  const int batch = 16, prompt_len = 8, new_tokens = 16;
  const auto prompts = random_prompts(batch, prompt_len, c.vocab, std::random_device{}());
  const Outputs first = run(**decoder, prompts, batch, prompt_len, new_tokens, false, stream_);
  for (std::int32_t t : first.tokens) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, c.vocab);
  }
  for (int b = 0; b < batch; ++b) {
    double unit = 0;
    for (int k = 0; k < c.embed_dim; ++k)
      unit += first.embeddings[b * c.embed_dim + k] * double(first.embeddings[b * c.embed_dim + k]);
    EXPECT_NEAR(unit, 1.0, 1e-4) << "request " << b;
  }
  // Request 3 alone: bitwise the same as inside the batch of 16.
  std::vector<std::int32_t> one(prompts.begin() + 3 * prompt_len, prompts.begin() + 4 * prompt_len);
  const Outputs alone = run(**decoder, one, 1, prompt_len, new_tokens, false, stream_);
  EXPECT_TRUE(
      std::equal(alone.tokens.begin(), alone.tokens.end(), first.tokens.begin() + 3 * new_tokens));
  EXPECT_EQ(0, std::memcmp(alone.embeddings.data(), first.embeddings.data() + 3 * c.embed_dim,
                           c.embed_dim * sizeof(float)));

  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  TestBuffer<std::int32_t> d_prompts(prompts.size());
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(batch) * new_tokens);
  TestBuffer<float> d_embeddings(static_cast<std::size_t>(batch) * c.embed_dim);
  d_prompts.upload(prompts);
  ASSERT_EQ(cudaEventRecord(start, stream_), cudaSuccess);
  ASSERT_TRUE((*decoder)
                  ->generate(d_prompts.data, batch, prompt_len, new_tokens, d_tokens.data,
                             d_embeddings.data, stream_)
                  .ok());
  ASSERT_EQ(cudaEventRecord(stop, stream_), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float generate_ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&generate_ms, start, stop), cudaSuccess);
  std::cout << "[llm] " << c.name << ": generate batch " << batch << ", prompt " << prompt_len
            << ", " << new_tokens << " new tokens (" << prompt_len + new_tokens - 1
            << " steps): " << generate_ms << " ms; int4 weights " << llm_weight_bytes(c) / 1e6
            << " MB\n";
  for (int step_batch : {1, 16}) {
    const int position = 24, repeats = 20;
    ASSERT_TRUE((*decoder)->decode_step(step_batch, position, stream_).ok());  // warm-up
    ASSERT_EQ(cudaEventRecord(start, stream_), cudaSuccess);
    for (int r = 0; r < repeats; ++r) {
      ASSERT_TRUE((*decoder)->decode_step(step_batch, position, stream_).ok());
    }
    ASSERT_EQ(cudaEventRecord(stop, stream_), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0;
    ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    const double step_ms = ms / repeats;
    std::cout << "[llm] " << c.name << ": decode step batch " << step_batch << " (context "
              << position + 1 << "): " << step_ms << " ms, "
              << llm_weight_bytes(c) / (step_ms * 1e-3) / 1e9 << " GB/s of int4 weights, "
              << llm_decode_step_flops(c, step_batch, position + 1) / (step_ms * 1e-3) / 1e12
              << " TFLOP/s\n";
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace gpuopt::pipeline
