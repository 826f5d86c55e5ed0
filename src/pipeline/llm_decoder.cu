// LLM stage on the GPU: a Llama-shaped decoder whose every matrix is an int4 (W4A16 tile layout)
// decode GEMM on seeded random weights generated on the device, with a paged KV cache, greedy
// decoding and a pooled embedding; each step one CUDA graph per batch size. docs/llm.md.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_pdl.cuh"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {
namespace {

constexpr int kRowThreads = 256;  // one block per request row for norms, embeddings, argmax

// ---- weight generation (the same hash as the CPU twin: llm_weights.hpp) ----

__global__ void k_llm_fill_tiles(std::uint32_t* tiles, std::size_t words, std::uint64_t seed,
                                 std::uint32_t id) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    tiles[i] = llm_tile_word(seed, id, i);
  }
}

__global__ void k_llm_fill_scales(std::uint16_t* scales, std::size_t count, std::uint64_t seed,
                                  std::uint32_t id, int exponent) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    scales[i] = llm_scale_bits(seed, id, i, exponent);
  }
}

__global__ void k_llm_fill_token_table(__half* table, std::size_t count, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    table[i] = __float2half_rn(llm_token_embedding(seed, i));  // exact: k/1024 values
  }
}

__global__ void k_llm_fill_projection(float* projection, std::size_t count, std::uint64_t seed,
                                      float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    projection[i] = llm_projection(seed, i, scale);
  }
}

// ---- per-step kernels. Every reduction has a fixed order that depends on neither the batch nor
// the other rows, so each request's bits are the same whether it runs alone or in a batch. Every
// kernel waits for the previous one (pdl_wait) before touching the step's buffers. ----

using llm_detail::pdl_trigger;
using llm_detail::pdl_wait;

// Step state in device memory, so that one captured graph serves every position.
struct StepState {
  int position;  // the position this step feeds (and whose K, V it writes)
  int pad[3];
};

__device__ __forceinline__ float warp_sum_fixed(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Fixed-shape block reduction (blockDim.x a power of two): a shared-memory tree, same order every
// run. `op` 0: sum, 1: max.
__device__ float block_reduce(float value, float* scratch, int op) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = scratch[threadIdx.x + stride];
      scratch[threadIdx.x] =
          op == 0 ? __fadd_rn(scratch[threadIdx.x], other) : fmaxf(scratch[threadIdx.x], other);
    }
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}

// The inverse RMS of row `row` from its sums of squares per 64 columns; the decode GEMM's normed
// input computes it with the same operations (llm_gemv.cu).
__device__ __forceinline__ float inverse_rms(const float* ssq, int ssq_stride, int row, int n,
                                             float eps) {
  float sum = 0.0f;
  for (int p = 0; p < n / llm_detail::kSsqColumns; ++p) {
    sum = __fadd_rn(sum, ssq[static_cast<std::size_t>(p) * ssq_stride + row]);
  }
  return rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(n)), eps));
}

__global__ void k_llm_set_position(StepState* state, int position) {
  pdl_wait();
  state->position = position;
}

// residual[b] = token_table[tokens[b][position]] (clamped to the vocabulary: an out-of-range id
// cannot be reported without a host sync; docs/llm.md), and its sums of squares per 64 columns.
__global__ void k_llm_embed(const std::int32_t* tokens, int max_context, const StepState* state,
                            const __half* table, int vocab, int hidden, float* residual, float* ssq,
                            int ssq_stride) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int token = tokens[static_cast<std::size_t>(b) * max_context + state->position];
  token = min(max(token, 0), vocab - 1);
  const __half* row = table + static_cast<std::size_t>(token) * hidden;
  float* out = residual + static_cast<std::size_t>(b) * hidden;
  for (int s = warp; s < hidden / 64; s += warps) {
    const float r0 = __half2float(row[64 * s + lane]);
    const float r1 = __half2float(row[64 * s + lane + 32]);
    out[64 * s + lane] = r0;
    out[64 * s + lane + 32] = r1;
    const float total = warp_sum_fixed(__fadd_rn(__fmul_rn(r0, r0), __fmul_rn(r1, r1)));
    if (lane == 0) ssq[static_cast<std::size_t>(s) * ssq_stride + b] = total;
  }
}

// Physical offset (in elements) of token t of request b, KV head kvh, in one layer's paged cache
// [blocks][kv_heads][block_tokens][head_dim]; block_table [max_batch][blocks_per_request].
__device__ __forceinline__ std::size_t cache_offset(const std::int32_t* block_table,
                                                    int blocks_per_request, int block_tokens,
                                                    int kv_heads, int head_dim, int b, int kvh,
                                                    int t) {
  const int block = block_table[b * blocks_per_request + t / block_tokens];
  return ((static_cast<std::size_t>(block) * kv_heads + kvh) * block_tokens + t % block_tokens) *
         head_dim;
}

// One block per (query head, request): RoPE (rotate-half pairs) on this head's q and its KV
// head's new k at `position`, the new k (fp16) and v written into the paged cache by the group's
// first head, then fp32 softmax(q·k / sqrt(head_dim)) · v over positions [0, position]. The new
// position's k and v are taken from registers (the same fp16 values the cache gets). Dot products
// are split over a warp's lanes, the max and the sum over the block, each in a fixed order, and
// the output sums positions in order, so the result does not depend on the block size.
__global__ void k_llm_attention(const __half* qkv, const float* cos_table, const float* sin_table,
                                const StepState* state, __half* k_cache, __half* v_cache,
                                const std::int32_t* block_table, int blocks_per_request,
                                int block_tokens, int heads, int kv_heads, int head_dim,
                                __half* out) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float shared[];  // q, k, v [head_dim] each, scratch [blockDim], scores
  float* q = shared;
  float* k_new = q + head_dim;
  float* v_new = k_new + head_dim;
  float* scratch = v_new + head_dim;
  float* scores = scratch + blockDim.x;
  const int head = blockIdx.x, b = blockIdx.y;
  const int group = heads / kv_heads;
  const int kvh = head / group;
  const int position = state->position;
  const int half = head_dim / 2;
  const __half* row = qkv + static_cast<std::size_t>(b) * (heads + 2 * kv_heads) * head_dim;
  const float* cs = cos_table + static_cast<std::size_t>(position) * half;
  const float* sn = sin_table + static_cast<std::size_t>(position) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float qa = __half2float(row[head * head_dim + i]);
    const float qb = __half2float(row[head * head_dim + i + half]);
    q[i] = qa * cs[i] - qb * sn[i];
    q[i + half] = qb * cs[i] + qa * sn[i];
    const float ka = __half2float(row[(heads + kvh) * head_dim + i]);
    const float kb = __half2float(row[(heads + kvh) * head_dim + i + half]);
    k_new[i] = __half2float(__float2half_rn(ka * cs[i] - kb * sn[i]));
    k_new[i + half] = __half2float(__float2half_rn(kb * cs[i] + ka * sn[i]));
  }
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    v_new[i] = __half2float(row[(heads + kv_heads + kvh) * head_dim + i]);
  }
  __syncthreads();
  if (head % group == 0) {
    const std::size_t at = cache_offset(block_table, blocks_per_request, block_tokens, kv_heads,
                                        head_dim, b, kvh, position);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
      k_cache[at + i] = __float2half_rn(k_new[i]);
      v_cache[at + i] = __float2half_rn(v_new[i]);
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const float scale = rsqrtf(static_cast<float>(head_dim));
  for (int t = warp; t <= position; t += warps) {
    float dot = 0.0f;
    if (t == position) {
      for (int i = lane; i < head_dim; i += 32) dot = __fmaf_rn(q[i], k_new[i], dot);
    } else {
      const __half* k = k_cache + cache_offset(block_table, blocks_per_request, block_tokens,
                                               kv_heads, head_dim, b, kvh, t);
      for (int i = lane; i < head_dim; i += 32) dot = __fmaf_rn(q[i], __half2float(k[i]), dot);
    }
    dot = warp_sum_fixed(dot);
    if (lane == 0) scores[t] = __fmul_rn(dot, scale);
  }
  __syncthreads();
  float local_max = -INFINITY;
  for (int t = threadIdx.x; t <= position; t += blockDim.x) local_max = fmaxf(local_max, scores[t]);
  const float max_score = block_reduce(local_max, scratch, 1);
  float local_sum = 0.0f;
  for (int t = threadIdx.x; t <= position; t += blockDim.x) {
    const float e = expf(scores[t] - max_score);
    scores[t] = e;
    local_sum = __fadd_rn(local_sum, e);
  }
  const float inv_total = 1.0f / block_reduce(local_sum, scratch, 0);  // its barriers order scores
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int t = 0; t < position; ++t) {
      const __half* v = v_cache + cache_offset(block_table, blocks_per_request, block_tokens,
                                               kv_heads, head_dim, b, kvh, t);
      acc = __fmaf_rn(scores[t], __half2float(v[i]), acc);
    }
    acc = __fmaf_rn(scores[position], v_new[i], acc);
    out[(static_cast<std::size_t>(b) * heads + head) * head_dim + i] =
        __float2half_rn(acc * inv_total);
  }
}

// The final RMSNorm's fp32 output added to pooled[b] (the embedding is its mean); block 0 then
// moves the step state to the next position (nothing after this kernel reads K/V positions).
__global__ void k_llm_pool(const float* residual, const float* ssq, int ssq_stride, int hidden,
                           float eps, float* pooled, StepState* state) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.x;
  const float inv = inverse_rms(ssq, ssq_stride, b, hidden, eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const std::size_t at = static_cast<std::size_t>(b) * hidden + i;
    pooled[at] = __fadd_rn(pooled[at], __fmul_rn(residual[at], inv));
  }
  if (b == 0 && threadIdx.x == 0) state->position += 1;
}

// Greedy choice: the largest logit, the lowest index on ties, written as the token of the next
// position (tokens[b][state.position], the position already advanced by k_llm_pool) when that is
// inside the context. Logits copied to debug[b * debug_stride ...] as fp32 when debug is not null.
__global__ void k_llm_argmax(const __half* logits, int vocab, std::int32_t* tokens, int max_context,
                             const StepState* state, float* debug, std::size_t debug_stride) {
  pdl_trigger();
  pdl_wait();
  __shared__ float best_value[kRowThreads];
  __shared__ int best_index[kRowThreads];
  const int b = blockIdx.x;
  const __half* row = logits + static_cast<std::size_t>(b) * vocab;
  float value = -INFINITY;
  int index = vocab;  // larger than any real index: loses every tie
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float x = __half2float(row[v]);
    if (x > value) {  // strict: within a thread the indices rise, so the first stays
      value = x;
      index = v;
    }
    if (debug != nullptr) debug[b * debug_stride + v] = x;
  }
  best_value[threadIdx.x] = value;
  best_index[threadIdx.x] = index;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float ov = best_value[threadIdx.x + s];
      const int oi = best_index[threadIdx.x + s];
      if (ov > best_value[threadIdx.x] ||
          (ov == best_value[threadIdx.x] && oi < best_index[threadIdx.x])) {
        best_value[threadIdx.x] = ov;
        best_index[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int column = state->position;
  if (threadIdx.x == 0 && column < max_context) {
    tokens[static_cast<std::size_t>(b) * max_context + column] = min(best_index[0], vocab - 1);
  }
}

// embedding[b] = normalise((pooled[b] / steps) @ projection), projection [hidden][embed_dim].
__global__ void k_llm_embedding(const float* pooled, int steps, const float* projection, int hidden,
                                int embed_dim, float* embedding) {
  extern __shared__ float values[];  // [embed_dim]
  __shared__ float scratch[kRowThreads];
  const int b = blockIdx.x;
  const float* row = pooled + static_cast<std::size_t>(b) * hidden;
  float sum = 0.0f;
  for (int k = threadIdx.x; k < embed_dim; k += blockDim.x) {
    float e = 0.0f;
    for (int i = 0; i < hidden; ++i) {
      e += (row[i] / static_cast<float>(steps)) *
           projection[static_cast<std::size_t>(i) * embed_dim + k];
    }
    values[k] = e;
    sum += e * e;
  }
  const float norm = sqrtf(block_reduce(sum, scratch, 0));
  const float inv = 1.0f / fmaxf(norm, 1e-15f);
  for (int k = threadIdx.x; k < embed_dim; k += blockDim.x) {
    embedding[static_cast<std::size_t>(b) * embed_dim + k] = values[k] * inv;
  }
}

int fill_blocks(std::size_t count) {
  return static_cast<int>(std::min<std::size_t>(8192, (count + 255) / 256));
}

struct Matrix {
  const std::uint32_t* tiles = nullptr;
  const std::uint16_t* scales = nullptr;
  int k = 0, n = 0;
  llm_detail::GemvPlan plan;
  int* counters = nullptr;  // plan.items, zero between runs
};

constexpr int kAttentionThreads = 128;

class CudaLlmDecoder final : public LlmDecoder {
 public:
  CudaLlmDecoder(const LlmConfig& config, const LlmDecoderOptions& options)
      : config_(config), options_(options) {}
  ~CudaLlmDecoder() override {
    for (auto& per_kind : graphs_) {
      for (cudaGraphExec_t& exec : per_kind) {
        if (exec != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaGraphExecDestroy(exec));
      }
    }
    if (capture_stream_ != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(capture_stream_));
    allocations_.clear();
  }

  const LlmConfig& config() const override { return config_; }
  const LlmDecoderInfo& info() const override { return info_; }

  Status build() {
    const LlmConfig& c = config_;
    if (options_.kv_block_tokens < 0 || options_.kv_block_tokens > c.max_context) {
      return invalid_argument(
          "LlmDecoderOptions::kv_block_tokens=" + std::to_string(options_.kv_block_tokens) +
          ": must be 0 or 1.." + std::to_string(c.max_context) + " (max_context)");
    }
    int device = 0, sms = 0, major = 0;
    GPUOPT_CUDA_TRY(cudaGetDevice(&device));
    GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major < 8) {
      return failed_precondition("the decode GEMM needs sm_80 or newer (mma.sync m16n8k16)");
    }
    if (options_.sm_count < 0) {
      return invalid_argument("LlmDecoderOptions::sm_count must be >= 0");
    }
    info_.sm_count = options_.sm_count > 0 ? options_.sm_count : sms;
    info_.programmatic_launch = options_.programmatic_launch && major >= 9;
    info_.cuda_graphs = options_.cuda_graphs;
    info_.kv_block_tokens = options_.kv_block_tokens > 0 ? options_.kv_block_tokens : c.max_context;
    GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    cudaStream_t stream = capture_stream_;
    Status status = build_on(stream);
    const Status synced = GPUOPT_CUDA_STATUS(cudaStreamSynchronize(stream));
    GPUOPT_RETURN_IF_ERROR(status);
    GPUOPT_RETURN_IF_ERROR(synced);
    return ok_status();
  }

  Status generate(const std::int32_t* d_prompts, int batch, int prompt_len, int new_tokens,
                  std::int32_t* d_tokens, float* d_embeddings,
                  runtime::StreamHandle stream) override {
    return generate(d_prompts, batch, prompt_len, new_tokens, d_tokens, d_embeddings,
                    LlmDebugOutputs{}, stream);
  }

  Status generate(const std::int32_t* d_prompts, int batch, int prompt_len, int new_tokens,
                  std::int32_t* d_tokens, float* d_embeddings, const LlmDebugOutputs& debug,
                  runtime::StreamHandle stream_handle) override {
    const LlmConfig& c = config_;
    const std::string where = "LlmDecoder(" + c.name + ")::generate: ";
    if (batch < 1 || batch > c.max_batch) {
      return invalid_argument(where + "batch=" + std::to_string(batch) + " outside [1, " +
                              std::to_string(c.max_batch) + "]");
    }
    if (prompt_len < 1 || new_tokens < 1 || prompt_len + new_tokens > c.max_context) {
      return invalid_argument(
          where + "prompt_len=" + std::to_string(prompt_len) +
          ", new_tokens=" + std::to_string(new_tokens) +
          ": both must be >= 1 and their sum <= max_context=" + std::to_string(c.max_context));
    }
    if (d_prompts == nullptr || d_tokens == nullptr || d_embeddings == nullptr) {
      return invalid_argument(where + "d_prompts, d_tokens and d_embeddings must not be null");
    }
    auto stream = static_cast<cudaStream_t>(stream_handle);
    // The prompt into columns [0, prompt_len) of the token buffer; each step reads column
    // `position` and writes its choice into column position + 1.
    GPUOPT_CUDA_TRY(cudaMemcpy2DAsync(
        tokens_, c.max_context * sizeof(std::int32_t), d_prompts, prompt_len * sizeof(std::int32_t),
        prompt_len * sizeof(std::int32_t), batch, cudaMemcpyDeviceToDevice, stream));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(
        pooled_, 0, static_cast<std::size_t>(batch) * c.hidden * sizeof(float), stream));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(state_, 0, sizeof(StepState), stream));
    const int steps = prompt_len + new_tokens - 1;
    for (int s = 0; s < steps; ++s) {
      const bool choose = s >= prompt_len - 1;  // this step's logits pick a generated token
      if (debug.d_logits != nullptr) {
        // Debug logits: launched one by one (their pointer changes every step); the same
        // kernels as the graphs, so the same bits.
        float* logits = nullptr;
        if (choose) {
          logits = debug.d_logits + static_cast<std::size_t>(s - (prompt_len - 1)) * c.vocab;
        }
        GPUOPT_RETURN_IF_ERROR(enqueue_step(
            batch, choose, logits, static_cast<std::size_t>(new_tokens) * c.vocab, stream));
      } else {
        GPUOPT_RETURN_IF_ERROR(run_step(batch, choose, stream));
      }
    }
    k_llm_embedding<<<batch, kRowThreads, c.embed_dim * sizeof(float), stream>>>(
        pooled_, steps, projection_, c.hidden, c.embed_dim, d_embeddings);
    GPUOPT_CUDA_TRY_LAUNCH();
    GPUOPT_CUDA_TRY(cudaMemcpy2DAsync(d_tokens, new_tokens * sizeof(std::int32_t),
                                      tokens_ + prompt_len, c.max_context * sizeof(std::int32_t),
                                      new_tokens * sizeof(std::int32_t), batch,
                                      cudaMemcpyDeviceToDevice, stream));
    return ok_status();
  }

  Status decode_step(int batch, int position, runtime::StreamHandle stream_handle) override {
    const LlmConfig& c = config_;
    if (batch < 1 || batch > c.max_batch || position < 0 || position >= c.max_context) {
      return invalid_argument("LlmDecoder(" + c.name +
                              ")::decode_step: batch=" + std::to_string(batch) +
                              " or position=" + std::to_string(position) + " out of range");
    }
    auto stream = static_cast<cudaStream_t>(stream_handle);
    k_llm_set_position<<<1, 1, 0, stream>>>(state_, position);
    GPUOPT_CUDA_TRY_LAUNCH();
    return run_step(batch, true, stream);
  }

 private:
  template <typename T>
  Status allocate(T*& pointer, std::size_t count) {
    GPUOPT_ASSIGN_OR_RETURN(
        runtime::DeviceBuffer buffer,
        runtime::DeviceBuffer::allocate(std::max<std::size_t>(count * sizeof(T), 16)));
    pointer = buffer.data_as<T>();
    info_.workspace_bytes += static_cast<double>(buffer.size_bytes());
    allocations_.push_back(std::move(buffer));
    return ok_status();
  }

  Status add_matrix(std::uint32_t id, int k, int n, bool pair, cudaStream_t stream) {
    Matrix m;
    const std::size_t words = static_cast<std::size_t>(k) * n / 8;
    const std::size_t scales = static_cast<std::size_t>(k / kLlmGroupSize) * n;
    std::uint32_t* tiles = nullptr;
    std::uint16_t* scale_bits = nullptr;
    GPUOPT_RETURN_IF_ERROR(allocate(tiles, words));
    GPUOPT_RETURN_IF_ERROR(allocate(scale_bits, scales));
    k_llm_fill_tiles<<<fill_blocks(words), 256, 0, stream>>>(tiles, words, config_.seed, id);
    GPUOPT_CUDA_TRY_LAUNCH();
    k_llm_fill_scales<<<fill_blocks(scales), 256, 0, stream>>>(scale_bits, scales, config_.seed, id,
                                                               llm_scale_exponent(k));
    GPUOPT_CUDA_TRY_LAUNCH();
    m.tiles = tiles;
    m.scales = scale_bits;
    m.k = k;
    m.n = n;
    m.plan = llm_detail::plan_gemv(k, n, pair, info_.sm_count);
    GPUOPT_RETURN_IF_ERROR(allocate(m.counters, m.plan.items));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(m.counters, 0, m.plan.items * sizeof(int), stream));
    partial_floats_ = std::max(partial_floats_, m.plan.partial_floats(llm_detail::kGemvMaxRows, n));
    matrices_.push_back(m);
    return ok_status();
  }

  Status build_on(cudaStream_t stream) {
    const LlmConfig& c = config_;
    const std::size_t rows = static_cast<std::size_t>(c.max_batch);
    const int qkv_n = (c.heads + 2 * c.kv_heads) * c.head_dim;
    GPUOPT_RETURN_IF_ERROR(allocate(residual_, rows * c.hidden));
    GPUOPT_RETURN_IF_ERROR(allocate(ssq_, rows * (c.hidden / llm_detail::kSsqColumns)));
    GPUOPT_RETURN_IF_ERROR(allocate(pooled_, rows * c.hidden));
    GPUOPT_RETURN_IF_ERROR(allocate(qkv_, rows * qkv_n));
    GPUOPT_RETURN_IF_ERROR(allocate(attention_, rows * c.heads * c.head_dim));
    GPUOPT_RETURN_IF_ERROR(allocate(act_, rows * c.ffn));
    GPUOPT_RETURN_IF_ERROR(allocate(logits_, rows * c.vocab));
    GPUOPT_RETURN_IF_ERROR(allocate(tokens_, rows * c.max_context));
    GPUOPT_RETURN_IF_ERROR(allocate(state_, 1));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(tokens_, 0, rows * c.max_context * sizeof(int), stream));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(state_, 0, sizeof(StepState), stream));

    // Paged KV cache: block j of request b is physical block j * max_batch + b (interleaved, so
    // that the block table is really followed), [block][kv_head][block_tokens][head_dim].
    const int block_tokens = info_.kv_block_tokens;
    blocks_per_request_ = (c.max_context + block_tokens - 1) / block_tokens;
    std::vector<std::int32_t> table(rows * blocks_per_request_);
    for (int b = 0; b < c.max_batch; ++b) {
      for (int j = 0; j < blocks_per_request_; ++j) {
        table[static_cast<std::size_t>(b) * blocks_per_request_ + j] = j * c.max_batch + b;
      }
    }
    GPUOPT_RETURN_IF_ERROR(allocate(block_table_, table.size()));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(block_table_, table.data(), table.size() * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice, stream));
    cache_layer_ = rows * blocks_per_request_ * c.kv_heads * block_tokens * c.head_dim;
    const std::size_t cache = static_cast<std::size_t>(c.layers) * cache_layer_;
    GPUOPT_RETURN_IF_ERROR(allocate(k_cache_, cache));
    GPUOPT_RETURN_IF_ERROR(allocate(v_cache_, cache));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(k_cache_, 0, cache * sizeof(__half), stream));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(v_cache_, 0, cache * sizeof(__half), stream));

    const std::size_t table_size = static_cast<std::size_t>(c.vocab) * c.hidden;
    GPUOPT_RETURN_IF_ERROR(allocate(token_table_, table_size));
    k_llm_fill_token_table<<<fill_blocks(table_size), 256, 0, stream>>>(token_table_, table_size,
                                                                        c.seed);
    GPUOPT_CUDA_TRY_LAUNCH();
    const std::size_t projection = static_cast<std::size_t>(c.hidden) * c.embed_dim;
    GPUOPT_RETURN_IF_ERROR(allocate(projection_, projection));
    k_llm_fill_projection<<<fill_blocks(projection), 256, 0, stream>>>(
        projection_, projection, c.seed, llm_projection_scale(c.hidden));
    GPUOPT_CUDA_TRY_LAUNCH();

    std::vector<float> cos_table, sin_table;
    llm_rope_table(c.max_context, c.head_dim, c.rope_theta, cos_table, sin_table);
    GPUOPT_RETURN_IF_ERROR(allocate(rope_cos_, cos_table.size()));
    GPUOPT_RETURN_IF_ERROR(allocate(rope_sin_, sin_table.size()));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(rope_cos_, cos_table.data(), cos_table.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(rope_sin_, sin_table.data(), sin_table.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));  // the host tables die with this function

    for (int l = 0; l < c.layers; ++l) {
      GPUOPT_RETURN_IF_ERROR(
          add_matrix(llm_matrix_id(l, LlmMatrixKind::kQkv), c.hidden, qkv_n, false, stream));
      GPUOPT_RETURN_IF_ERROR(add_matrix(llm_matrix_id(l, LlmMatrixKind::kO), c.heads * c.head_dim,
                                        c.hidden, false, stream));
      GPUOPT_RETURN_IF_ERROR(
          add_matrix(llm_matrix_id(l, LlmMatrixKind::kGateUp), c.hidden, 2 * c.ffn, true, stream));
      GPUOPT_RETURN_IF_ERROR(
          add_matrix(llm_matrix_id(l, LlmMatrixKind::kDown), c.ffn, c.hidden, false, stream));
    }
    GPUOPT_RETURN_IF_ERROR(add_matrix(kLlmLmHeadId, c.hidden, c.vocab, false, stream));
    // One partial-sum area for every GEMM: they run one after another, each after the previous
    // has finished (pdl_wait), and each leaves its counters zero.
    GPUOPT_RETURN_IF_ERROR(allocate(partials_, std::max<std::size_t>(partial_floats_, 1)));
    attention_shared_ =
        (3 * static_cast<std::size_t>(c.head_dim) + kAttentionThreads + c.max_context) *
        sizeof(float);
    if (attention_shared_ > 48 * 1024) {
      GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_llm_attention,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(attention_shared_)));
    }
    return ok_status();
  }

  llm_detail::GemvArgs gemv_args(const Matrix& m, int batch) const {
    llm_detail::GemvArgs a;
    a.tiles = m.tiles;
    a.scales = m.scales;
    a.k = m.k;
    a.n = m.n;
    a.m = batch;
    a.plan = m.plan;
    a.ssq_stride = config_.max_batch;
    a.eps = config_.rms_eps;
    a.partials = partials_;
    a.counters = m.counters;
    return a;
  }

  // The step's kernels, in order, on `stream` (captured into a graph or launched directly).
  // `choose`: run lm_head and argmax (the step's token is chosen); `debug_logits`: fp32 copy.
  Status enqueue_step(int batch, bool choose, float* debug_logits, std::size_t debug_stride,
                      cudaStream_t stream) {
    const LlmConfig& c = config_;
    const bool pdl = info_.programmatic_launch;
    using llm_detail::GemvInput;
    using llm_detail::GemvOutput;
    using llm_detail::launch_kernel;
    GPUOPT_RETURN_IF_ERROR(launch_kernel(k_llm_embed, dim3(batch), dim3(kRowThreads), 0, stream,
                                         pdl, tokens_, c.max_context, state_, token_table_, c.vocab,
                                         c.hidden, residual_, ssq_, c.max_batch));
    for (int l = 0; l < c.layers; ++l) {
      const Matrix& qkv = matrices_[4 * l + 0];
      const Matrix& o = matrices_[4 * l + 1];
      const Matrix& gate_up = matrices_[4 * l + 2];
      const Matrix& down = matrices_[4 * l + 3];
      llm_detail::GemvArgs a = gemv_args(qkv, batch);
      a.residual = residual_;
      a.ssq = ssq_;
      a.y = qkv_;
      GPUOPT_RETURN_IF_ERROR(
          llm_detail::launch_gemv(GemvInput::kNormed, GemvOutput::kHalf, a, pdl, stream));
      GPUOPT_RETURN_IF_ERROR(launch_kernel(
          k_llm_attention, dim3(c.heads, batch), dim3(kAttentionThreads), attention_shared_, stream,
          pdl, qkv_, rope_cos_, rope_sin_, state_, k_cache_ + l * cache_layer_,
          v_cache_ + l * cache_layer_, block_table_, blocks_per_request_, info_.kv_block_tokens,
          c.heads, c.kv_heads, c.head_dim, attention_));
      a = gemv_args(o, batch);
      a.x = attention_;
      a.residual_out = residual_;
      a.ssq_out = ssq_;
      GPUOPT_RETURN_IF_ERROR(
          llm_detail::launch_gemv(GemvInput::kHalf, GemvOutput::kResidual, a, pdl, stream));
      a = gemv_args(gate_up, batch);
      a.residual = residual_;
      a.ssq = ssq_;
      a.y = act_;
      GPUOPT_RETURN_IF_ERROR(
          llm_detail::launch_gemv(GemvInput::kNormed, GemvOutput::kSiluPair, a, pdl, stream));
      a = gemv_args(down, batch);
      a.x = act_;
      a.residual_out = residual_;
      a.ssq_out = ssq_;
      GPUOPT_RETURN_IF_ERROR(
          llm_detail::launch_gemv(GemvInput::kHalf, GemvOutput::kResidual, a, pdl, stream));
    }
    GPUOPT_RETURN_IF_ERROR(launch_kernel(k_llm_pool, dim3(batch), dim3(kRowThreads), 0, stream, pdl,
                                         residual_, ssq_, c.max_batch, c.hidden, c.rms_eps, pooled_,
                                         state_));
    if (!choose) return ok_status();
    llm_detail::GemvArgs a = gemv_args(matrices_.back(), batch);
    a.residual = residual_;
    a.ssq = ssq_;
    a.y = logits_;
    GPUOPT_RETURN_IF_ERROR(
        llm_detail::launch_gemv(GemvInput::kNormed, GemvOutput::kHalf, a, pdl, stream));
    return launch_kernel(k_llm_argmax, dim3(batch), dim3(kRowThreads), 0, stream, pdl, logits_,
                         c.vocab, tokens_, c.max_context, state_, debug_logits, debug_stride);
  }

  // One step: the captured graph for (batch, choose), captured on first use.
  Status run_step(int batch, bool choose, cudaStream_t stream) {
    if (!info_.cuda_graphs) return enqueue_step(batch, choose, nullptr, 0, stream);
    cudaGraphExec_t& exec = graphs_[choose ? 1 : 0][batch];
    if (exec == nullptr) {
      GPUOPT_CUDA_TRY(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
      const Status enqueued = enqueue_step(batch, choose, nullptr, 0, capture_stream_);
      cudaGraph_t graph = nullptr;
      const Status ended = GPUOPT_CUDA_STATUS(cudaStreamEndCapture(capture_stream_, &graph));
      GPUOPT_RETURN_IF_ERROR(enqueued.with_context("capturing the decode step"));
      GPUOPT_RETURN_IF_ERROR(ended);
      const Status made = GPUOPT_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
      GPUOPT_CUDA_TRY(cudaGraphDestroy(graph));
      if (!made.ok()) {
        exec = nullptr;
        return made;
      }
    }
    GPUOPT_CUDA_TRY(cudaGraphLaunch(exec, stream));
    return ok_status();
  }

  LlmConfig config_;
  LlmDecoderOptions options_;
  LlmDecoderInfo info_;
  std::vector<runtime::DeviceBuffer> allocations_;
  std::vector<Matrix> matrices_;  // [layer][qkv, o, gate_up, down], lm_head
  // graphs_[choose][batch]: the step without / with lm_head and argmax.
  std::vector<cudaGraphExec_t> graphs_[2] = {std::vector<cudaGraphExec_t>(config_.max_batch + 1),
                                             std::vector<cudaGraphExec_t>(config_.max_batch + 1)};
  cudaStream_t capture_stream_ = nullptr;  // build work and graph capture
  std::size_t partial_floats_ = 0;
  float* partials_ = nullptr;    // the GEMMs' k-split partial sums [splits][16][N]
  float* residual_ = nullptr;    // [max_batch][hidden] fp32 residual stream
  float* ssq_ = nullptr;         // [hidden / 64][max_batch] residual sums of squares per 64 columns
  float* pooled_ = nullptr;      // [max_batch][hidden] sum of final normalised states
  __half* qkv_ = nullptr;        // [max_batch][(heads + 2 kv) head_dim]
  __half* attention_ = nullptr;  // [max_batch][heads head_dim]
  __half* act_ = nullptr;        // [max_batch][ffn] SiLU(gate)·up
  __half* logits_ = nullptr;     // [max_batch][vocab]
  std::int32_t* tokens_ = nullptr;  // [max_batch][max_context]: prompt, then the chosen tokens
  StepState* state_ = nullptr;
  std::int32_t* block_table_ = nullptr;  // [max_batch][blocks_per_request]
  int blocks_per_request_ = 0;
  std::size_t cache_layer_ = 0;  // elements of one layer's K (or V) cache
  __half* k_cache_ = nullptr;    // [layer][block][kv_head][block_tokens][head_dim]
  __half* v_cache_ = nullptr;
  std::size_t attention_shared_ = 0;
  __half* token_table_ = nullptr;  // [vocab][hidden]
  float* projection_ = nullptr;    // [hidden][embed_dim]
  float* rope_cos_ = nullptr;      // [max_context][head_dim / 2]
  float* rope_sin_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<LlmDecoder>> LlmDecoder::create(const LlmConfig& config) {
  return create(config, LlmDecoderOptions{});
}

StatusOr<std::unique_ptr<LlmDecoder>> LlmDecoder::create(const LlmConfig& config,
                                                         const LlmDecoderOptions& options) {
  GPUOPT_RETURN_IF_ERROR(check_llm_config(config));
  GPUOPT_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  if (devices < 1) return unavailable(config.name + ": no CUDA device");
  auto decoder = std::make_unique<CudaLlmDecoder>(config, options);
  Status status = decoder->build();
  if (!status.ok()) return status.with_context("building LLM decoder '" + config.name + "'");
  return std::unique_ptr<LlmDecoder>(std::move(decoder));
}

}  // namespace gpuopt::pipeline
