// LLM greedy choice on the GPU against a host scan with the decoder's rule (largest logit, lowest
// index on ties, NaN and -inf never taken, vocab - 1 when nothing is): planted maxima in the last
// element and across blocks, ties, NaN, signed zeros, vocabularies that are not a multiple of the
// 8-logit vector, misaligned rows, batches, the fp32 debug copy, the context bound, and repeated
// launches plain, programmatic and replayed from a captured graph (the per-row slots left zero).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/kernels/quant_formats.hpp"
#include "llm_test_support.hpp"
#include "pipeline/llm_argmax.hpp"

namespace gpuopt::pipeline {
namespace {

using kernels::float_to_fp16_bits;
using kernels::fp16_bits_to_float;
using llm_test::TestBuffer;

constexpr std::uint16_t kNan = 0x7e00, kNegativeNan = 0xfe00, kInfinity = 0x7c00,
                        kMinusInfinity = 0xfc00, kMinusZero = 0x8000, kZero = 0x0000;

// The scan the decoder's choice must agree with, written independently of the kernel.
int host_argmax(const std::uint16_t* row, int vocab) {
  float value = -std::numeric_limits<float>::infinity();
  int index = vocab;
  for (int v = 0; v < vocab; ++v) {
    const float x = fp16_bits_to_float(row[v]);
    if (x > value) {
      value = x;
      index = v;
    }
  }
  return std::min(index, vocab - 1);
}

// Row r of a case: random logits in [-8, 8] with something planted, chosen by r.
std::vector<std::uint16_t> make_rows(int rows, int vocab, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-8.0f, 8.0f);
  std::uniform_int_distribution<int> at(0, vocab - 1);
  std::vector<std::uint16_t> logits(static_cast<std::size_t>(rows) * vocab);
  for (auto& x : logits) x = float_to_fp16_bits(value(rng));
  const std::uint16_t top = float_to_fp16_bits(9.5f);
  for (int r = 0; r < rows; ++r) {
    std::uint16_t* row = logits.data() + static_cast<std::size_t>(r) * vocab;
    switch (r % 8) {
      case 0:  // the maximum in the last element
        row[vocab - 1] = top;
        break;
      case 1:  // ties of the maximum spread over the row (different blocks): the lowest wins
        for (int k = 0; k < 5; ++k) row[at(rng)] = top;
        break;
      case 2:  // NaNs (both signs), some right before and after the maximum
        for (int k = 0; k < vocab / 7 + 1; ++k) row[at(rng)] = (k % 2) ? kNan : kNegativeNan;
        row[at(rng)] = top;
        row[0] = kNan;
        break;
      case 3:  // nothing above -inf: vocab - 1
        for (int v = 0; v < vocab; ++v) row[v] = (v % 3 == 0) ? kNan : kMinusInfinity;
        break;
      case 4:  // every value negative but -0 and +0: the first zero wins whatever its sign
        for (int v = 0; v < vocab; ++v) row[v] = float_to_fp16_bits(-1.0f - (v % 5));
        row[vocab / 2] = kMinusZero;
        row[vocab - 1] = kZero;
        if (vocab > 2) row[vocab / 3] = kZero;
        break;
      case 5:  // +inf beats everything; two of them: the first
        row[at(rng)] = kInfinity;
        row[at(rng)] = kInfinity;
        break;
      case 6:  // every logit equal: index 0
        for (int v = 0; v < vocab; ++v) row[v] = float_to_fp16_bits(-3.0f);
        break;
      default:  // random only (many near-ties among fp16 values)
        break;
    }
  }
  return logits;
}

class LlmArgmaxGpu : public llm_test::GpuStreamTest {};

// One case: `rows` rows of `vocab` logits, stored `offset` halves into the buffer (1: rows not
// 16-byte aligned, so the kernel must take its scalar loads), launched `repeats` times with new
// logits each time on the same slots.
void check_case(int rows, int vocab, int offset, bool programmatic, int repeats, unsigned seed,
                cudaStream_t stream) {
  SCOPED_TRACE("rows " + std::to_string(rows) + ", vocab " + std::to_string(vocab) + ", offset " +
               std::to_string(offset) + (programmatic ? ", programmatic" : ""));
  std::mt19937 rng(seed);
  const int max_context = 6, column = 4;
  const std::size_t debug_stride = static_cast<std::size_t>(vocab) + 3;  // padding stays poisoned
  TestBuffer<std::uint16_t> d_logits(static_cast<std::size_t>(rows) * vocab + offset);
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(rows) * max_context);
  TestBuffer<std::int32_t> d_position(1);
  TestBuffer<float> d_debug(rows * debug_stride);
  TestBuffer<llm_detail::ArgmaxSlot> d_slots(rows);
  ASSERT_EQ(cudaMemset(d_slots.data, 0, rows * sizeof(llm_detail::ArgmaxSlot)), cudaSuccess);
  d_position.upload({column});
  for (int repeat = 0; repeat < repeats; ++repeat) {
    SCOPED_TRACE("launch " + std::to_string(repeat));
    std::vector<std::uint16_t> host = make_rows(rows, vocab, rng);
    std::vector<std::uint16_t> stored(offset, kNan);
    stored.insert(stored.end(), host.begin(), host.end());
    d_logits.upload(stored);
    d_tokens.poison();
    d_debug.poison();
    llm_detail::ArgmaxArgs a;
    a.logits = d_logits.data + offset;
    a.rows = rows;
    a.vocab = vocab;
    a.tokens = d_tokens.data;
    a.max_context = max_context;
    a.position = d_position.data;
    a.debug = d_debug.data;
    a.debug_stride = debug_stride;
    a.slots = d_slots.data;
    ASSERT_TRUE(llm_detail::launch_argmax(a, programmatic, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<std::int32_t> tokens = d_tokens.download();
    const std::vector<float> debug = d_debug.download();
    for (int r = 0; r < rows; ++r) {
      const std::uint16_t* row = host.data() + static_cast<std::size_t>(r) * vocab;
      for (int c = 0; c < max_context; ++c) {
        const std::int32_t got = tokens[static_cast<std::size_t>(r) * max_context + c];
        if (c == column) {
          EXPECT_EQ(got, host_argmax(row, vocab)) << "row " << r << " (plant " << r % 8 << ")";
        } else {
          EXPECT_EQ(got, -1) << "row " << r << ": column " << c << " written";
        }
      }
      for (std::size_t v = 0; v < debug_stride; ++v) {
        const float got = debug[r * debug_stride + v];
        std::uint32_t bits = 0;
        std::memcpy(&bits, &got, sizeof(bits));
        if (v >= static_cast<std::size_t>(vocab)) {
          ASSERT_EQ(bits, 0xffffffffu) << "row " << r << ": debug padding " << v << " written";
          continue;
        }
        const float want = fp16_bits_to_float(row[v]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << ", logit " << v;
        } else {
          std::uint32_t want_bits = 0;
          std::memcpy(&want_bits, &want, sizeof(want_bits));
          ASSERT_EQ(bits, want_bits) << "row " << r << ", logit " << v;
        }
      }
    }
  }
  const std::vector<llm_detail::ArgmaxSlot> slots = d_slots.download();
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(slots[r].key, 0u) << "row " << r << ": key not left zero";
    EXPECT_EQ(slots[r].arrived, 0u) << "row " << r << ": arrival count not left zero";
  }
}

TEST_F(LlmArgmaxGpu, MatchesTheHostScan) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 1B vocabulary (multiple of the vector, many blocks); one block exactly; one logit past a
  // block; not a multiple of 8 (scalar loads); tiny.
  for (const int vocab :
       {128256, llm_detail::kArgmaxChunk, llm_detail::kArgmaxChunk + 8, 12345, 512, 7, 1}) {
    check_case(8, vocab, 0, false, 2, seed, stream_);
    if (HasFatalFailure()) return;
  }
  check_case(16, 128256, 0, true, 3, seed + 1, stream_);  // batch 16, programmatic
  check_case(3, 4096, 1, false, 2, seed + 2, stream_);    // misaligned rows: scalar loads
  check_case(1, 128256, 0, true, 4, seed + 3, stream_);   // batch 1, repeated
}

// Past the context nothing is written; the slots are still left zero for the next launch.
TEST_F(LlmArgmaxGpu, WritesNothingPastTheContext) {
  const int rows = 2, vocab = 5000, max_context = 3;
  std::vector<std::uint16_t> host(static_cast<std::size_t>(rows) * vocab, float_to_fp16_bits(1.0f));
  host[17] = float_to_fp16_bits(2.0f);
  TestBuffer<std::uint16_t> d_logits(host.size());
  TestBuffer<std::int32_t> d_tokens(rows * max_context);
  TestBuffer<std::int32_t> d_position(1);
  TestBuffer<llm_detail::ArgmaxSlot> d_slots(rows);
  ASSERT_EQ(cudaMemset(d_slots.data, 0, rows * sizeof(llm_detail::ArgmaxSlot)), cudaSuccess);
  d_logits.upload(host);
  d_tokens.poison();
  llm_detail::ArgmaxArgs a;
  a.logits = d_logits.data;
  a.rows = rows;
  a.vocab = vocab;
  a.tokens = d_tokens.data;
  a.max_context = max_context;
  a.position = d_position.data;
  a.slots = d_slots.data;
  d_position.upload({max_context});
  ASSERT_TRUE(llm_detail::launch_argmax(a, false, stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(d_tokens.download(), std::vector<std::int32_t>(rows * max_context, -1));
  d_position.upload({max_context - 1});
  ASSERT_TRUE(llm_detail::launch_argmax(a, false, stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(d_tokens.download(), (std::vector<std::int32_t>{-1, -1, 17, -1, -1, 0}));
}

// Captured once, replayed with new logits each time: each replay's choice is its own.
TEST_F(LlmArgmaxGpu, GraphReplaysChooseAfresh) {
  const int rows = 4, vocab = 128256, max_context = 2;
  TestBuffer<std::uint16_t> d_logits(static_cast<std::size_t>(rows) * vocab);
  TestBuffer<std::int32_t> d_tokens(rows * max_context);
  TestBuffer<std::int32_t> d_position(1);
  TestBuffer<llm_detail::ArgmaxSlot> d_slots(rows);
  ASSERT_EQ(cudaMemset(d_slots.data, 0, rows * sizeof(llm_detail::ArgmaxSlot)), cudaSuccess);
  d_position.upload({1});
  llm_detail::ArgmaxArgs a;
  a.logits = d_logits.data;
  a.rows = rows;
  a.vocab = vocab;
  a.tokens = d_tokens.data;
  a.max_context = max_context;
  a.position = d_position.data;
  a.slots = d_slots.data;
  cudaStream_t capture = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status launched = llm_detail::launch_argmax(a, true, capture);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(capture, &graph), cudaSuccess);
  ASSERT_TRUE(launched.ok()) << launched.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> at(0, vocab - 1);
  for (int replay = 0; replay < 5; ++replay) {
    std::vector<std::uint16_t> host(static_cast<std::size_t>(rows) * vocab,
                                    float_to_fp16_bits(-1.0f));
    std::vector<std::int32_t> want(rows * max_context, -1);
    for (int r = 0; r < rows; ++r) {
      const int planted = at(rng);
      host[static_cast<std::size_t>(r) * vocab + planted] = float_to_fp16_bits(0.5f * replay);
      want[r * max_context + 1] = planted;
    }
    d_logits.upload(host);
    d_tokens.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(d_tokens.download(), want) << "replay " << replay;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(capture), cudaSuccess);
}

TEST_F(LlmArgmaxGpu, RefusesBadArguments) {
  TestBuffer<std::uint16_t> d_logits(64);
  TestBuffer<std::int32_t> d_tokens(4);
  TestBuffer<std::int32_t> d_position(1);
  TestBuffer<llm_detail::ArgmaxSlot> d_slots(1);
  llm_detail::ArgmaxArgs good;
  good.logits = d_logits.data;
  good.rows = 1;
  good.vocab = 64;
  good.tokens = d_tokens.data;
  good.max_context = 4;
  good.position = d_position.data;
  good.slots = d_slots.data;
  auto code = [&](llm_detail::ArgmaxArgs a) {
    return llm_detail::launch_argmax(a, false, stream_).code();
  };
  llm_detail::ArgmaxArgs a = good;
  a.rows = 0;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument);
  a = good;
  a.vocab = 0;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument);
  a = good;
  a.slots = nullptr;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument);
  a = good;
  a.debug = reinterpret_cast<float*>(d_logits.data);
  a.debug_stride = 63;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::pipeline
