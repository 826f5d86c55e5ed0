// LLM decoder on the GPU: the decode GEMM against W4A16's CPU reference, the decoder against its
// CPU twin (tiny config), batch independence, run-to-run reproducibility, graphs vs one-by-one
// launches and paged vs contiguous KV cache (bit for bit), and the 1B- and 8B-shaped configs end to
// end with their step times and HBM roofline fractions printed.
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
#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "llm_test_support.hpp"
#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {
namespace {

using llm_test::random_prompts;
using llm_test::TestBuffer;

// Every prompt token as a decode step of its own: these tests are about the decode step (the
// prefill path has its own suite, llm_prefill_gpu_test.cpp).
LlmDecoderOptions token_by_token() {
  LlmDecoderOptions options;
  options.prefill = false;
  return options;
}

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

class LlmGpu : public llm_test::GpuStreamTest {};

TEST_F(LlmGpu, TinyMatchesTheTwin) {
  auto decoder = LlmDecoder::create(tiny_llm(), token_by_token());
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
  auto decoder = LlmDecoder::create(tiny_llm(), token_by_token());
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

// ---- the decode GEMM alone, against W4A16's CPU reference ----

// A seeded K x N layer in the tile layout (the decoder's own hash), on the host and the device.
struct GemvLayer {
  kernels::W4A16Weights host;
  TestBuffer<std::uint32_t> tiles;
  TestBuffer<std::uint16_t> scales;
  GemvLayer(int k, int n, std::uint32_t id)
      : tiles(static_cast<std::size_t>(k) * n / 8), scales(static_cast<std::size_t>(k / 128) * n) {
    host.k = k;
    host.n = n;
    host.group_size = kLlmGroupSize;
    host.type = kernels::ActivationType::kFloat16;
    host.tiles.resize(tiles.count);
    for (std::size_t i = 0; i < tiles.count; ++i) host.tiles[i] = llm_tile_word(99, id, i);
    host.scales.resize(scales.count);
    for (std::size_t i = 0; i < scales.count; ++i) {
      host.scales[i] = llm_scale_bits(99, id, i, llm_scale_exponent(k));
    }
    tiles.upload(host.tiles);
    scales.upload(host.scales);
  }
};

enum class GemvCase { kHalfToHalf, kNormedToHalf, kHalfToResidual, kNormedToSiluPair };
const char* gemv_case_name(GemvCase c) {
  switch (c) {
    case GemvCase::kHalfToHalf:
      return "fp16 x -> fp16 y";
    case GemvCase::kNormedToHalf:
      return "normed residual -> fp16 y";
    case GemvCase::kHalfToResidual:
      return "fp16 x -> residual add";
    case GemvCase::kNormedToSiluPair:
      return "normed residual -> silu(gate)*up";
  }
  return "?";
}

struct GemvRun {
  std::vector<float> out;  // y (fp16 widened), act, or the new residual, [m][columns]
  std::vector<float> ssq;  // kHalfToResidual: [n/64][16]
};

// Runs one case on `m` rows whose inputs are the rows `first_row..` of a 16-row source.
GemvRun run_gemv(const GemvLayer& layer, GemvCase which, const llm_detail::GemvPlan& plan, int m,
                 int first_row, const std::vector<float>& source, cudaStream_t stream) {
  using llm_detail::GemvInput;
  using llm_detail::GemvOutput;
  const int k = layer.host.k, n = layer.host.n;
  const bool normed = which == GemvCase::kNormedToHalf || which == GemvCase::kNormedToSiluPair;
  const int width = which == GemvCase::kNormedToSiluPair ? n / 2 : n;
  // Inputs: fp16 x, or fp32 residual with its sums of squares per 64 columns (as the decoder
  // keeps).
  std::vector<std::uint16_t> x_bits(static_cast<std::size_t>(m) * k);
  std::vector<float> residual(static_cast<std::size_t>(m) * k);
  std::vector<float> ssq(static_cast<std::size_t>(k / 64) * 16, 0.0f);
  for (int r = 0; r < m; ++r) {
    for (int i = 0; i < k; ++i) {
      const float v = source[static_cast<std::size_t>(first_row + r) * k + i];
      x_bits[static_cast<std::size_t>(r) * k + i] = kernels::float_to_fp16_bits(v);
      residual[static_cast<std::size_t>(r) * k + i] = v;
    }
    for (int p = 0; p < k / 64; ++p) {
      float sum = 0;
      for (int i = 0; i < 64; ++i)
        sum += residual[r * k + 64 * p + i] * residual[r * k + 64 * p + i];
      ssq[p * 16 + r] = sum;
    }
  }
  TestBuffer<std::uint16_t> d_x(x_bits.size());
  TestBuffer<float> d_residual(residual.size()), d_ssq(ssq.size());
  d_x.upload(x_bits);
  d_residual.upload(residual);
  d_ssq.upload(ssq);
  // Residual output: N columns of a residual that starts at 0.25 (so the add is visible).
  TestBuffer<float> d_res_out(static_cast<std::size_t>(m) * n);
  d_res_out.upload(std::vector<float>(d_res_out.count, 0.25f));
  TestBuffer<float> d_ssq_out(static_cast<std::size_t>(n / 64) * 16);
  d_ssq_out.poison();
  TestBuffer<std::uint16_t> d_y(static_cast<std::size_t>(m) * width);
  d_y.poison();
  TestBuffer<float> d_partials(std::max<std::size_t>(plan.partial_floats(16, n), 1));
  TestBuffer<int> d_counters(plan.items);
  d_counters.upload(std::vector<int>(plan.items, 0));

  llm_detail::GemvArgs a;
  a.tiles = layer.tiles.data;
  a.scales = layer.scales.data;
  a.k = k;
  a.n = n;
  a.m = m;
  a.plan = plan;
  a.x = d_x.data;
  a.residual = d_residual.data;
  a.ssq = d_ssq.data;
  a.ssq_stride = 16;
  a.eps = 1e-5f;
  a.y = d_y.data;
  a.residual_out = d_res_out.data;
  a.ssq_out = d_ssq_out.data;
  a.partials = d_partials.data;
  a.counters = d_counters.data;
  const GemvInput input = normed ? GemvInput::kNormed : GemvInput::kHalf;
  const GemvOutput output = which == GemvCase::kHalfToResidual     ? GemvOutput::kResidual
                            : which == GemvCase::kNormedToSiluPair ? GemvOutput::kSiluPair
                                                                   : GemvOutput::kHalf;
  const Status launched = llm_detail::launch_gemv(input, output, a, false, stream);
  EXPECT_TRUE(launched.ok()) << launched.to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(d_counters.download(), std::vector<int>(plan.items, 0)) << "counters not left zero";
  GemvRun run;
  if (which == GemvCase::kHalfToResidual) {
    run.out = d_res_out.download();
    run.ssq = d_ssq_out.download();
  } else {
    const std::vector<std::uint16_t> y = d_y.download();
    run.out.resize(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) run.out[i] = kernels::fp16_bits_to_float(y[i]);
  }
  return run;
}

// The CPU expectation of one case for rows [first_row, first_row + m) of `source`.
std::vector<float> expect_gemv(const GemvLayer& layer, GemvCase which, int m, int first_row,
                               const std::vector<float>& source) {
  const int k = layer.host.k, n = layer.host.n;
  std::vector<std::uint16_t> x_bits(static_cast<std::size_t>(m) * k);
  for (int r = 0; r < m; ++r) {
    std::vector<float> row(source.begin() + static_cast<std::ptrdiff_t>(first_row + r) * k,
                           source.begin() + static_cast<std::ptrdiff_t>(first_row + r + 1) * k);
    if (which == GemvCase::kNormedToHalf || which == GemvCase::kNormedToSiluPair) {
      row = llm_rms_norm_reference(row, 1e-5f);
    }
    for (int i = 0; i < k; ++i)
      x_bits[static_cast<std::size_t>(r) * k + i] = kernels::float_to_fp16_bits(row[i]);
  }
  const std::vector<float> y = kernels::w4a16_reference(layer.host, x_bits.data(), m);
  std::vector<float> out;
  if (which == GemvCase::kNormedToSiluPair) {
    out.resize(static_cast<std::size_t>(m) * n / 2);
    for (int r = 0; r < m; ++r) {
      for (int i = 0; i < n / 2; ++i) {
        const float g = y[static_cast<std::size_t>(r) * n + i];
        const float u = y[static_cast<std::size_t>(r) * n + n / 2 + i];
        out[static_cast<std::size_t>(r) * n / 2 + i] = g / (1.0f + std::exp(-g)) * u;
      }
    }
  } else if (which == GemvCase::kHalfToResidual) {
    out = y;
    for (float& v : out) v += 0.25f;
  } else {
    out = y;
  }
  return out;
}

// Every output mode, M = 1..16 and plans with and without k-splits: values against the CPU
// reference, each row bit-identical to the same row run alone, and a second run bit-identical.
TEST_F(LlmGpu, DecodeGemmMatchesTheReferenceAndIsRowIndependent) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("input seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int k, n;
  };
  int device = 0, major = 0, cluster_launch = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device), cudaSuccess);
  const bool clusters = major >= 9 && cluster_launch != 0;
  int cluster_cases = 0;
  for (const Shape shape : {Shape{256, 128}, Shape{1024, 256}, Shape{2048, 384}}) {
    const GemvLayer layer(shape.k, shape.n, 5);
    std::vector<float> source(static_cast<std::size_t>(16) * shape.k);
    for (float& v : source) v = normal(rng);
    for (GemvCase which : {GemvCase::kHalfToHalf, GemvCase::kNormedToHalf,
                           GemvCase::kHalfToResidual, GemvCase::kNormedToSiluPair}) {
      const bool pair = which == GemvCase::kNormedToSiluPair;
      // splits = 1 (one block per item), the planner's choice for a 132-SM device, and the most.
      for (int target : {1, llm_detail::kGemvBlocksPerSm * 132, 1 << 20}) {
        const llm_detail::GemvPlan plan =
            llm_detail::plan_gemv(shape.k, shape.n, pair, 132, target);
        SCOPED_TRACE(std::string(gemv_case_name(which)) + ", K=" + std::to_string(shape.k) +
                     " N=" + std::to_string(shape.n) + ", splits " + std::to_string(plan.splits));
        std::vector<std::vector<float>> alone(16);
        for (int m : {1, 3, 8, 9, 16}) {
          const GemvRun run = run_gemv(layer, which, plan, m, 0, source, stream_);
          const std::vector<float> want = expect_gemv(layer, which, m, 0, source);
          // sm_90: the same splits as one thread block cluster each, reduced through
          // distributed shared memory: the same additions, so the same bits.
          if (clusters && plan.splits > 1 && plan.splits <= llm_detail::kGemvMaxClusterSplits) {
            llm_detail::GemvPlan in_cluster = plan;
            in_cluster.cluster = true;
            const GemvRun clustered = run_gemv(layer, which, in_cluster, m, 0, source, stream_);
            ASSERT_EQ(clustered.out.size(), run.out.size());
            EXPECT_EQ(0, std::memcmp(clustered.out.data(), run.out.data(),
                                     run.out.size() * sizeof(float)))
                << "M=" << m << ": the cluster reduction differs from the global one";
            ASSERT_EQ(clustered.ssq.size(), run.ssq.size());
            EXPECT_EQ(0, std::memcmp(clustered.ssq.data(), run.ssq.data(),
                                     run.ssq.size() * sizeof(float)))  // rows >= M stay poison
                << "M=" << m << ": sums of squares differ";
            ++cluster_cases;
          }
          ASSERT_EQ(run.out.size(), want.size());
          double diff = 0, norm = 0, worst = 0;
          std::size_t worst_at = 0;
          for (std::size_t i = 0; i < want.size(); ++i) {
            ASSERT_TRUE(std::isfinite(run.out[i]))
                << "M=" << m << " element " << i << " not written";
            const double d = std::abs(double(run.out[i]) - want[i]);
            diff += d * d;
            norm += double(want[i]) * want[i];
            if (d > worst) {
              worst = d;
              worst_at = i;
            }
          }
          const int width = static_cast<int>(want.size()) / m;
          EXPECT_LT(std::sqrt(diff / norm), 2e-3)
              << "M=" << m << ": worst at row " << worst_at / width << " column "
              << worst_at % width << ": gpu " << run.out[worst_at] << ", reference "
              << want[worst_at];
          if (which == GemvCase::kHalfToResidual) {
            for (int r = 0; r < m; ++r) {
              for (int p = 0; p < shape.n / 64; ++p) {
                double sum = 0;
                for (int i = 0; i < 64; ++i) {
                  const double v = run.out[static_cast<std::size_t>(r) * shape.n + 64 * p + i];
                  sum += v * v;
                }
                EXPECT_NEAR(run.ssq[p * 16 + r], sum, 1e-4 * sum + 1e-6)
                    << "M=" << m << " row " << r << " strip " << p;
              }
            }
          }
          // The same rows run one at a time: bit for bit.
          for (int r = 0; r < m; ++r) {
            if (alone[r].empty()) {
              alone[r] = run_gemv(layer, which, plan, 1, r, source, stream_).out;
            }
            EXPECT_EQ(0, std::memcmp(alone[r].data(),
                                     run.out.data() + static_cast<std::size_t>(r) * width,
                                     width * sizeof(float)))
                << "row " << r << " differs between M=" << m << " and M=1";
          }
          const GemvRun again = run_gemv(layer, which, plan, m, 0, source, stream_);
          EXPECT_EQ(0,
                    std::memcmp(again.out.data(), run.out.data(), run.out.size() * sizeof(float)))
              << "M=" << m << ": a second run differs";
        }
      }
    }
  }
  if (clusters) {
    std::cout
        << "[llm] decode GEMM: clusters resident at once by size (fp16 -> residual, normed -> "
           "SiLU pair):";
    for (int splits = 2; splits <= llm_detail::kGemvMaxClusterSplits; ++splits) {
      const StatusOr<int> half = llm_detail::gemv_active_clusters(
          llm_detail::GemvInput::kHalf, llm_detail::GemvOutput::kResidual, splits);
      const StatusOr<int> pair = llm_detail::gemv_active_clusters(
          llm_detail::GemvInput::kNormed, llm_detail::GemvOutput::kSiluPair, splits);
      ASSERT_TRUE(half.ok() && pair.ok());
      std::cout << " " << splits << ": " << *half << ", " << *pair << ";";
    }
    std::cout << "\n";
    EXPECT_GT(cluster_cases, 0);
    std::cout << "[llm] decode GEMM: " << cluster_cases
              << " cases with the cluster reduction, bit-identical to the global fix-up\n";
  } else {
    std::cout << "[llm] decode GEMM: no thread block clusters before sm_90, cluster reduction "
                 "not checked\n";
  }
}

// The decode attention stages the earlier positions' K and V rows in shared memory when a context
// of max_context fits in 64 KB (the tiny model's 32 positions of 32 dimensions do), and reads them
// from the cache otherwise (640 positions: 80 KB). The same values in the same order: the same
// tokens, logits and embeddings bit for bit.
TEST_F(LlmGpu, StagedAndUnstagedAttentionGiveTheSameBits) {
  const LlmConfig staged_config = tiny_llm();
  LlmConfig long_config = staged_config;
  long_config.max_context = 640;
  const int batch = 3, prompt_len = 5, new_tokens = staged_config.max_context - prompt_len;
  const auto prompts =
      random_prompts(batch, prompt_len, staged_config.vocab, std::random_device{}());
  auto staged = LlmDecoder::create(staged_config);
  auto unstaged = LlmDecoder::create(long_config);
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  ASSERT_TRUE(unstaged.ok()) << unstaged.status().to_string();
  ASSERT_TRUE((*staged)->info().attention_staged);
  ASSERT_FALSE((*unstaged)->info().attention_staged);
  const Outputs a = run(**staged, prompts, batch, prompt_len, new_tokens, true, stream_);
  const Outputs b = run(**unstaged, prompts, batch, prompt_len, new_tokens, true, stream_);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.embeddings.data(), b.embeddings.data(),
                           a.embeddings.size() * sizeof(float)));
}

// Graph replay vs one-by-one launches, with and without programmatic launch, over a contiguous and
// several paged KV caches: the same tokens and embeddings bit for bit.
TEST_F(LlmGpu, GraphsAndPagedCacheGiveTheSameBits) {
  const LlmConfig config = tiny_llm();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("prompt seed " + std::to_string(seed));
  const int batch = 5, prompt_len = 7, new_tokens = 20;  // 26 positions: several 4-token blocks
  const auto prompts = random_prompts(batch, prompt_len, config.vocab, seed);
  struct Variant {
    const char* name;
    LlmDecoderOptions options;
  };
  std::vector<Variant> variants;
  variants.push_back({"eager, contiguous cache", {false, false, 0, 0}});
  variants.push_back({"graphs, programmatic launch, 16-token blocks", {true, true, 16, 0}});
  variants.push_back({"graphs, 1-token blocks", {true, false, 1, 0}});
  variants.push_back({"eager, programmatic launch, 4-token blocks", {false, true, 4, 0}});
  variants.push_back({"graphs, programmatic launch, contiguous cache", {true, true, 0, 0}});
  Outputs reference;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    auto decoder = LlmDecoder::create(config, v.options);
    ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
    std::cout << "[llm] " << v.name << ": " << (*decoder)->info().describe() << "\n";
    EXPECT_EQ((*decoder)->info().cuda_graphs, v.options.cuda_graphs);
    // Twice on the same decoder: the second call replays the captured graphs.
    const Outputs first = run(**decoder, prompts, batch, prompt_len, new_tokens, false, stream_);
    const Outputs second = run(**decoder, prompts, batch, prompt_len, new_tokens, false, stream_);
    EXPECT_EQ(first.tokens, second.tokens) << "replay differs from the first run";
    EXPECT_EQ(0, std::memcmp(first.embeddings.data(), second.embeddings.data(),
                             first.embeddings.size() * sizeof(float)));
    if (reference.tokens.empty()) {
      reference = first;
      continue;
    }
    EXPECT_EQ(first.tokens, reference.tokens) << "tokens differ from " << variants[0].name;
    EXPECT_EQ(0, std::memcmp(first.embeddings.data(), reference.embeddings.data(),
                             first.embeddings.size() * sizeof(float)))
        << "embeddings differ from " << variants[0].name;
  }
}

TEST_F(LlmGpu, RefusesBadOptions) {
  LlmDecoderOptions options;
  options.kv_block_tokens = tiny_llm().max_context + 1;
  EXPECT_EQ(LlmDecoder::create(tiny_llm(), options).status().code(), StatusCode::kInvalidArgument);
  options.kv_block_tokens = -1;
  EXPECT_EQ(LlmDecoder::create(tiny_llm(), options).status().code(), StatusCode::kInvalidArgument);
}

// ---- the 1B- and 8B-shaped models: end to end, then step times ----

constexpr double kHbmBytesPerSecond = 4.8e12;  // H200 HBM3e, the roofline the figures quote

// Bytes one decode step must move at least: the int4 weights and scales, the token embedding rows,
// and the KV cache read (context positions) and written (one position), for `batch` requests.
double step_bytes(const LlmConfig& c, int batch, int context) {
  const double kv_token = 2.0 * c.layers * c.kv_heads * c.head_dim * 2.0;  // K and V, fp16
  return llm_weight_bytes(c) + batch * (c.hidden * 2.0 + kv_token * (context + 1));
}

// Times `repeats` decode steps after a warm-up and prints the `[llm] decode step` line that
// scripts/gpu-check.d/llm.sh reads.
void time_steps(LlmDecoder& decoder, int batch, int position, const std::string& label,
                cudaStream_t stream) {
  const LlmConfig& c = decoder.config();
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  const int repeats = 50;
  for (int w = 0; w < 3; ++w) ASSERT_TRUE(decoder.decode_step(batch, position, stream).ok());
  ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  for (int r = 0; r < repeats; ++r) {
    ASSERT_TRUE(decoder.decode_step(batch, position, stream).ok());
  }
  ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  const double step_ms = ms / repeats;
  const double bytes = step_bytes(c, batch, position);
  std::cout << "[llm] decode step batch " << batch << " (" << c.name << label << "): " << step_ms
            << " ms, roofline " << 100.0 * bytes / (step_ms * 1e-3) / kHbmBytesPerSecond << "% ("
            << bytes / 1e6 << " MB moved, context " << position + 1 << ", "
            << llm_decode_step_flops(c, batch, position + 1) / (step_ms * 1e-3) / 1e12
            << " TFLOP/s)\n";
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// Where the decoder reduces its k-splits in clusters: the step without them, then the default
// again, alternated in one process so that the two are compared under the same conditions.
void compare_without_clusters(LlmDecoder& decoder, const LlmConfig& config, cudaStream_t stream) {
  if (!decoder.info().cluster_reduction) return;
  LlmDecoderOptions options;
  options.cluster_reduction = false;
  auto global = LlmDecoder::create(config, options);
  ASSERT_TRUE(global.ok()) << global.status().to_string();
  std::cout << "[llm] " << config.name
            << " without cluster reduction: " << (*global)->info().describe() << "\n";
  for (int batch : {1, 16}) {
    time_steps(**global, batch, 24, ", no cluster reduction", stream);
    time_steps(decoder, batch, 24, ", again", stream);
  }
}

// A batch-16 generate; request 3 alone gives the same bits; the whole generate timed.
void check_shaped(LlmDecoder& decoder, int batch, cudaStream_t stream) {
  const LlmConfig& c = decoder.config();
  const int prompt_len = 8, new_tokens = 16;
  const auto prompts = random_prompts(batch, prompt_len, c.vocab, std::random_device{}());
  const Outputs first = run(decoder, prompts, batch, prompt_len, new_tokens, false, stream);
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
  const int one_of = std::min(3, batch - 1);
  std::vector<std::int32_t> one(prompts.begin() + one_of * prompt_len,
                                prompts.begin() + (one_of + 1) * prompt_len);
  const Outputs alone = run(decoder, one, 1, prompt_len, new_tokens, false, stream);
  EXPECT_TRUE(std::equal(alone.tokens.begin(), alone.tokens.end(),
                         first.tokens.begin() + one_of * new_tokens))
      << "request " << one_of << " alone differs from the batch";
  EXPECT_EQ(0, std::memcmp(alone.embeddings.data(), first.embeddings.data() + one_of * c.embed_dim,
                           c.embed_dim * sizeof(float)));

  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  TestBuffer<std::int32_t> d_prompts(prompts.size());
  TestBuffer<std::int32_t> d_tokens(static_cast<std::size_t>(batch) * new_tokens);
  TestBuffer<float> d_embeddings(static_cast<std::size_t>(batch) * c.embed_dim);
  d_prompts.upload(prompts);
  ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  ASSERT_TRUE(decoder
                  .generate(d_prompts.data, batch, prompt_len, new_tokens, d_tokens.data,
                            d_embeddings.data, stream)
                  .ok());
  ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float generate_ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&generate_ms, start, stop), cudaSuccess);
  std::cout << "[llm] " << c.name << ": generate batch " << batch << ", prompt " << prompt_len
            << ", " << new_tokens << " new tokens (" << prompt_len + new_tokens - 1
            << " steps): " << generate_ms << " ms; int4 weights " << llm_weight_bytes(c) / 1e6
            << " MB; " << decoder.info().describe() << "\n";
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// The 1B-shaped model end to end (batch 16, prompt 8, 16 new tokens), then one decode step at
// batch 1 and 16 (no asserts on time), and the step at batch 16 for each KV block size.
TEST_F(LlmGpu, OneBillionShapedRunsAndReportsItsTime) {
  auto decoder = LlmDecoder::create(llama_1b_shaped());
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  check_shaped(**decoder, 16, stream_);
  for (int batch : {1, 16}) time_steps(**decoder, batch, 24, "", stream_);
  compare_without_clusters(**decoder, llama_1b_shaped(), stream_);
  decoder->reset();
  for (int block : {16, 32, 64}) {
    LlmDecoderOptions options;
    options.kv_block_tokens = block;
    auto paged = LlmDecoder::create(llama_1b_shaped(), options);
    ASSERT_TRUE(paged.ok()) << paged.status().to_string();
    for (int batch : {1, 16}) {
      time_steps(**paged, batch, 60, ", KV block " + std::to_string(block), stream_);
    }
  }
  LlmDecoderOptions eager;
  eager.cuda_graphs = false;
  eager.programmatic_launch = false;
  auto plain = LlmDecoder::create(llama_1b_shaped(), eager);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  for (int batch : {1, 16}) time_steps(**plain, batch, 24, ", no graph", stream_);
}

// For a per-kernel profile under `gpuopt trace` (scripts/gpu-check.d/llm_profile.sh): the step
// graphs without programmatic dependent launch, so no kernel starts (and waits) inside its
// predecessor and each traced duration is the kernel's own. Batch 1 and 16 as separate tests so
// each trace holds one batch size.
void profile_steps(int batch, cudaStream_t stream) {
  LlmDecoderOptions options;
  options.programmatic_launch = false;
  auto decoder = LlmDecoder::create(llama_1b_shaped(), options);
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  time_steps(**decoder, batch, 24, ", no programmatic launch", stream);
}

TEST_F(LlmGpu, OneBillionShapedProfileBatch1) { profile_steps(1, stream_); }
TEST_F(LlmGpu, OneBillionShapedProfileBatch16) { profile_steps(16, stream_); }

TEST_F(LlmGpu, EightBillionShapedRunsAndReportsItsTime) {
  auto decoder = LlmDecoder::create(llama_8b_shaped());
  ASSERT_TRUE(decoder.ok()) << decoder.status().to_string();
  // The model's device memory: what the decoder allocated, beside its parts by arithmetic, and
  // the device's own view of what the process holds.
  const LlmConfig& c = (*decoder)->config();
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const double weights = llm_weight_bytes(c), embedding = llm_embedding_table_bytes(c),
               kv_cache = llm_kv_cache_bytes(c), allocated = (*decoder)->info().workspace_bytes;
  EXPECT_GE(allocated, weights + embedding + kv_cache);
  std::cout << "[llm] memory (" << c.name << "): allocated " << allocated / 1e9
            << " GB = int4 weights + scales " << weights / 1e9 << " GB + embedding "
            << embedding / 1e9 << " GB + KV cache " << kv_cache / 1e9 << " GB (batch "
            << c.max_batch << " x context " << c.max_context << ") + the rest "
            << (allocated - weights - embedding - kv_cache) / 1e9 << " GB; device in use "
            << double(total_bytes - free_bytes) / 1e9 << " GB\n";
  check_shaped(**decoder, 16, stream_);
  for (int batch : {1, 16}) time_steps(**decoder, batch, 24, "", stream_);
  compare_without_clusters(**decoder, llama_8b_shaped(), stream_);
}

}  // namespace
}  // namespace gpuopt::pipeline
