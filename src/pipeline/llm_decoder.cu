// LLM stage on the GPU: a Llama-shaped decoder whose every matrix is an int4 (W4A16 tile layout)
// decode GEMM on seeded random weights generated on the device, with a paged KV cache, greedy
// decoding and a pooled embedding; each step one CUDA graph per batch size. docs/llm.md.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "pipeline/llm_argmax.hpp"
#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_pdl.cuh"
#include "pipeline/llm_prefill.hpp"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {
namespace {

constexpr int kRowThreads = 256;  // one block per request row for norms and embeddings

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

using llm_detail::copy_async_16;
using llm_detail::copy_async_wait_all;
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

// Threads of k_llm_attention (a multiple of 32): enough that a context of tens of positions takes
// one round of dot products and a few positions per thread in the weighted sum of v.
constexpr int kDecodeAttentionThreads = 256;

// Shared memory of k_llm_attention for `threads` threads: q, k_new, v_new [head_dim], the partial
// sums [max(head_dim, 2 threads)], scores and cache rows [max_context].
std::size_t decode_attention_shared(int head_dim, int max_context, int threads) {
  return (3 * static_cast<std::size_t>(head_dim) + std::max(head_dim, 2 * threads) +
          2 * static_cast<std::size_t>(max_context)) *
         sizeof(float);
}
// With the earlier positions' K and V rows staged in shared memory (k_llm_attention<true>): 16
// bytes of alignment and fp16 K and V [max_context][head_dim].
std::size_t decode_attention_staged_shared(int head_dim, int max_context, int threads) {
  return decode_attention_shared(head_dim, max_context, threads) + 16 +
         2 * static_cast<std::size_t>(max_context) * head_dim * sizeof(__half);
}
// Contexts whose K and V rows fit in this much shared memory are staged.
constexpr std::size_t kDecodeAttentionStagedBytes = 64 * 1024;

// One block per (query head, request): RoPE (rotate-half pairs) on this head's q and its KV
// head's new k at `position`, the new k (fp16) and v written into the paged cache by the group's
// first head, then fp32 softmax(q·k / sqrt(head_dim)) · v over positions [0, position]. The new
// position's k and v are taken from shared memory (the same fp16 values the cache gets), so no
// block waits on another. Three barriers; the reduction orders are fixed by head_dim and the block
// size alone, never by the batch, the request or the cache's block size:
// - scores: G lanes per position (G the power of two with G * 4 >= head_dim / 2, at most 32), lane
//   j adding the (x, y) products of half2 pairs j, j + G, j + 2G, j + 3G in that order, then a
//   butterfly over the G lanes; every group's k loads are issued before any is used;
// - max and sum: every warp computes both itself (no barrier): lane l takes positions l, l + 32,
//   ... in order, then a butterfly over the warp; so every warp has the same bits;
// - output: thread (part, pair) sums positions part, part + parts, ... (parts = threads / pairs)
//   for its half2 pair of v, and the parts' sums are added in part order.
// kStaged: each earlier position's K and V rows are copied into shared memory (cp.async) by the
// thread that looks the position up, so both arrive in one round trip, together, before the
// first barrier (otherwise K is read after it and V after the softmax: two more round trips).
// The same values in the same order: the same bits.
template <bool kStaged>
__global__ void __launch_bounds__(kDecodeAttentionThreads)
    k_llm_attention(const __half* qkv, const float* cos_table, const float* sin_table,
                    const StepState* state, __half* k_cache, __half* v_cache,
                    const std::int32_t* block_table, int blocks_per_request, int block_tokens,
                    int heads, int kv_heads, int head_dim, __half* out) {
  pdl_trigger();
  pdl_wait();
  const int head = blockIdx.x, b = blockIdx.y;
  const int group = heads / kv_heads;
  const int kvh = head / group;
  const int position = state->position;
  const int half = head_dim / 2;  // half2 pairs of a head
  const int threads = blockDim.x;
  // q (fp32, rotated), k_new (rotated, fp16-rounded), v_new [head_dim]; partial
  // [max(head_dim, 2 threads)]; scores [position + 1]; rows [position] (int: cache row of each)
  extern __shared__ float shared[];
  float* q = shared;
  float* k_new = q + head_dim;
  float* v_new = k_new + head_dim;
  float* partial = v_new + head_dim;
  float* scores = partial + max(head_dim, 2 * threads);
  int* rows = reinterpret_cast<int*>(scores + position + 1);
  // kStaged: K and V rows [position][head_dim] fp16, 16-byte aligned after rows.
  __half* k_rows = reinterpret_cast<__half*>(
      (reinterpret_cast<std::uintptr_t>(rows + position) + 15) & ~std::uintptr_t{15});
  __half* v_rows = k_rows + static_cast<std::size_t>(position) * head_dim;

  const __half* row = qkv + static_cast<std::size_t>(b) * (heads + 2 * kv_heads) * head_dim;
  const float* cs = cos_table + static_cast<std::size_t>(position) * half;
  const float* sn = sin_table + static_cast<std::size_t>(position) * half;
  const bool writer = head % group == 0;  // the group's first head writes the new k and v
  const std::size_t at = writer ? cache_offset(block_table, blocks_per_request, block_tokens,
                                               kv_heads, head_dim, b, kvh, position)
                                : 0;
  for (int i = threadIdx.x; i < half; i += threads) {
    const float qa = __half2float(row[head * head_dim + i]);
    const float qb = __half2float(row[head * head_dim + i + half]);
    q[i] = qa * cs[i] - qb * sn[i];
    q[i + half] = qb * cs[i] + qa * sn[i];
    const float ka = __half2float(row[(heads + kvh) * head_dim + i]);
    const float kb = __half2float(row[(heads + kvh) * head_dim + i + half]);
    const __half k0 = __float2half_rn(ka * cs[i] - kb * sn[i]);
    const __half k1 = __float2half_rn(kb * cs[i] + ka * sn[i]);
    k_new[i] = __half2float(k0);
    k_new[i + half] = __half2float(k1);
    if (writer) {
      k_cache[at + i] = k0;
      k_cache[at + i + half] = k1;
    }
  }
  for (int i = threadIdx.x; i < head_dim; i += threads) {
    const __half v = row[(heads + kv_heads + kvh) * head_dim + i];
    v_new[i] = __half2float(v);
    if (writer) v_cache[at + i] = v;
  }
  for (int t = threadIdx.x; t < position; t += threads) {  // cache_offset / head_dim, in int
    const int block = block_table[b * blocks_per_request + t / block_tokens];
    rows[t] = (block * kv_heads + kvh) * block_tokens + t % block_tokens;
    if constexpr (kStaged) {
      const std::size_t from = static_cast<std::size_t>(rows[t]) * head_dim;
      const std::size_t to = static_cast<std::size_t>(t) * head_dim;
      for (int c = 0; c < head_dim; c += 8) {
        copy_async_16(k_rows + to + c, k_cache + from + c);
        copy_async_16(v_rows + to + c, v_cache + from + c);
      }
    }
  }
  if constexpr (kStaged) copy_async_wait_all();
  __syncthreads();

  // Scores: group g of G lanes takes positions g, g + groups, ... (the bound is the same for
  // every thread, so whole warps run each round and shuffle together).
  int lanes = 1;  // G
  while (lanes < 32 && lanes * 4 < half) lanes *= 2;
  const int groups = threads / lanes;
  const int g = threadIdx.x / lanes, j = threadIdx.x % lanes;
  const float2* q2 = reinterpret_cast<const float2*>(q);
  const float2* k_new2 = reinterpret_cast<const float2*>(k_new);
  const float scale = rsqrtf(static_cast<float>(head_dim));
  for (int first = 0; first <= position; first += groups) {
    const int t = first + g;
    float2 k[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int p = j + m * lanes;
      k[m] = make_float2(0.0f, 0.0f);
      if (t < position && p < half) {
        const __half* k_row = kStaged ? k_rows + static_cast<std::size_t>(t) * head_dim
                                      : k_cache + static_cast<std::size_t>(rows[t]) * head_dim;
        k[m] = __half22float2(reinterpret_cast<const __half2*>(k_row)[p]);
      } else if (t == position && p < half) {
        k[m] = k_new2[p];
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int p = j + m * lanes;
      if (p < half) {
        dot = __fmaf_rn(q2[p].x, k[m].x, dot);
        dot = __fmaf_rn(q2[p].y, k[m].y, dot);
      }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) {
      dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, offset));
    }
    if (t <= position && j == 0) scores[t] = __fmul_rn(dot, scale);
  }
  __syncthreads();

  // Max and sum of exp over the positions, by every warp alike.
  const int lane = threadIdx.x % 32;
  float max_score = -INFINITY;
  for (int t = lane; t <= position; t += 32) max_score = fmaxf(max_score, scores[t]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    max_score = fmaxf(max_score, __shfl_xor_sync(0xffffffffu, max_score, offset));
  }
  float sum = 0.0f;
  for (int t = lane; t <= position; t += 32) sum = __fadd_rn(sum, expf(scores[t] - max_score));
  const float inv_total = 1.0f / warp_sum_fixed(sum);

  // Output: thread (part, pair p) sums positions part, part + parts, ... of v's pair p.
  const int parts = max(1, threads / half);
  const float2* v_new2 = reinterpret_cast<const float2*>(v_new);
  for (int idx = threadIdx.x; idx < parts * half; idx += threads) {
    const int part = idx / half, p = idx - part * half;
    float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll 4
    for (int t = part; t <= position; t += parts) {
      const float e = expf(scores[t] - max_score);
      const __half* v_row = kStaged ? v_rows + static_cast<std::size_t>(t) * head_dim
                                    : v_cache + static_cast<std::size_t>(rows[t]) * head_dim;
      const float2 v =
          t < position ? __half22float2(reinterpret_cast<const __half2*>(v_row)[p]) : v_new2[p];
      acc.x = __fmaf_rn(e, v.x, acc.x);
      acc.y = __fmaf_rn(e, v.y, acc.y);
    }
    partial[part * head_dim + 2 * p] = acc.x;
    partial[part * head_dim + 2 * p + 1] = acc.y;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += threads) {
    float acc = partial[i];
    for (int part = 1; part < parts; ++part) acc = __fadd_rn(acc, partial[part * head_dim + i]);
    out[(static_cast<std::size_t>(b) * heads + head) * head_dim + i] =
        __float2half_rn(acc * inv_total);
  }
}

// ---- prefill kernels: the prompt's rows m = b * prompt_len + t (request b, position t) at once.
// Each mirrors the decode step's arithmetic per row, so a row's values depend on its own request
// only (never on the batch). ----

// residual[m] = token_table[tokens[b][t]] (clamped like k_llm_embed), and its sums of squares per
// 64 columns into ssq[·][m].
__global__ void k_llm_prefill_embed(const std::int32_t* tokens, int max_context, int prompt_len,
                                    const __half* table, int vocab, int hidden, float* residual,
                                    float* ssq, int ssq_stride) {
  const int m = blockIdx.x;
  const int b = m / prompt_len, t = m - b * prompt_len;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int token = tokens[static_cast<std::size_t>(b) * max_context + t];
  token = min(max(token, 0), vocab - 1);
  const __half* row = table + static_cast<std::size_t>(token) * hidden;
  float* out = residual + static_cast<std::size_t>(m) * hidden;
  for (int s = warp; s < hidden / 64; s += warps) {
    const float r0 = __half2float(row[64 * s + lane]);
    const float r1 = __half2float(row[64 * s + lane + 32]);
    out[64 * s + lane] = r0;
    out[64 * s + lane + 32] = r1;
    const float total = warp_sum_fixed(__fadd_rn(__fmul_rn(r0, r0), __fmul_rn(r1, r1)));
    if (lane == 0) ssq[static_cast<std::size_t>(s) * ssq_stride + m] = total;
  }
}

// normed[m] = fp16(residual[m] · inverse RMS), the decode GEMM's normalised input as a tensor:
// [rows][hidden] fp16 for W4A16Gemm.
__global__ void k_llm_prefill_norm(const float* residual, const float* ssq, int ssq_stride,
                                   int hidden, float eps, __half* normed) {
  const int m = blockIdx.x;
  const float inv = inverse_rms(ssq, ssq_stride, m, hidden, eps);
  const float* in = residual + static_cast<std::size_t>(m) * hidden;
  __half* out = normed + static_cast<std::size_t>(m) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[i] = __float2half_rn(__fmul_rn(in[i], inv));
  }
}

// residual[m] += fp32(y[m]) ([rows][n], y fp16) and the new sums of squares per 64 columns.
__global__ void k_llm_prefill_residual(const __half* y, int n, float* residual, float* ssq,
                                       int ssq_stride) {
  const int m = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const __half* in = y + static_cast<std::size_t>(m) * n;
  float* res = residual + static_cast<std::size_t>(m) * n;
  for (int s = warp; s < n / 64; s += warps) {
    const float r0 = __fadd_rn(res[64 * s + lane], __half2float(in[64 * s + lane]));
    const float r1 = __fadd_rn(res[64 * s + lane + 32], __half2float(in[64 * s + lane + 32]));
    res[64 * s + lane] = r0;
    res[64 * s + lane + 32] = r1;
    const float total = warp_sum_fixed(__fadd_rn(__fmul_rn(r0, r0), __fmul_rn(r1, r1)));
    if (lane == 0) ssq[static_cast<std::size_t>(s) * ssq_stride + m] = total;
  }
}

// act[m][i] = fp16(silu(gate) · up), gate = gate_up[m][i], up = gate_up[m][ffn + i] (fp16).
__global__ void k_llm_prefill_silu(const __half* gate_up, int ffn, std::size_t elements,
                                   __half* act) {
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
       e < elements; e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t m = e / ffn;
    const std::size_t i = e - m * ffn;
    const float gate = __half2float(gate_up[m * 2 * ffn + i]);
    const float up = __half2float(gate_up[m * 2 * ffn + ffn + i]);
    const float silu = __fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)));
    act[e] = __float2half_rn(__fmul_rn(silu, up));
  }
}

// One block per (row, KV head): RoPE on the row's k at position t, then k (fp16) and v into the
// paged cache at position t of request b, as k_llm_attention writes a decode step's.
__global__ void k_llm_prefill_kv(const __half* qkv, int prompt_len, const float* cos_table,
                                 const float* sin_table, __half* k_cache, __half* v_cache,
                                 const std::int32_t* block_table, int blocks_per_request,
                                 int block_tokens, int heads, int kv_heads, int head_dim) {
  const int m = blockIdx.x, kvh = blockIdx.y;
  const int b = m / prompt_len, t = m - b * prompt_len;
  const int half = head_dim / 2;
  const __half* row = qkv + static_cast<std::size_t>(m) * (heads + 2 * kv_heads) * head_dim;
  const float* cs = cos_table + static_cast<std::size_t>(t) * half;
  const float* sn = sin_table + static_cast<std::size_t>(t) * half;
  const std::size_t at =
      cache_offset(block_table, blocks_per_request, block_tokens, kv_heads, head_dim, b, kvh, t);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float ka = __half2float(row[(heads + kvh) * head_dim + i]);
    const float kb = __half2float(row[(heads + kvh) * head_dim + i + half]);
    k_cache[at + i] = __float2half_rn(ka * cs[i] - kb * sn[i]);
    k_cache[at + i + half] = __float2half_rn(kb * cs[i] + ka * sn[i]);
  }
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    v_cache[at + i] = row[(heads + kv_heads + kvh) * head_dim + i];
  }
}

// Shared memory of k_llm_prefill_attention for `threads` threads.
std::size_t prefill_attention_shared(int head_dim, int max_context, int threads) {
  return (static_cast<std::size_t>(head_dim) + threads + std::max(head_dim, threads) +
          2 * static_cast<std::size_t>(max_context)) *
         sizeof(float);
}

// Causal attention of the prompt, one block per (row, query head): the row's q rotated to
// position t (fp32), then fp32 softmax(q·k / sqrt(head_dim)) · v over positions [0, t] of its own
// request, read from the cache k_llm_prefill_kv wrote. Each position's cache row is located once
// (rows[]); a thread computes whole dot products (q from shared memory, k as half2), the softmax
// is stabilised by the block's max score, and the weighted sum of v is split over the block's
// threads by position (parts), whose partial sums are added in part order: the result depends on
// neither the batch nor the block's scheduling.
__global__ void k_llm_prefill_attention(const __half* qkv, int prompt_len, const float* cos_table,
                                        const float* sin_table, const __half* k_cache,
                                        const __half* v_cache, const std::int32_t* block_table,
                                        int blocks_per_request, int block_tokens, int heads,
                                        int kv_heads, int head_dim, int max_context, __half* out) {
  // q [head_dim], scratch [blockDim], partial [max(head_dim, blockDim)], scores [max_context],
  // rows [max_context] (int: the cache row of each position)
  extern __shared__ float shared[];
  float* q = shared;
  float* scratch = q + head_dim;
  float* partial = scratch + blockDim.x;
  float* scores = partial + max(head_dim, static_cast<int>(blockDim.x));
  int* rows = reinterpret_cast<int*>(scores + max_context);
  const int m = blockIdx.x, head = blockIdx.y;
  const int b = m / prompt_len, t = m - b * prompt_len;
  const int kvh = head / (heads / kv_heads);
  const int half = head_dim / 2;
  const __half* row = qkv + static_cast<std::size_t>(m) * (heads + 2 * kv_heads) * head_dim;
  const float* cs = cos_table + static_cast<std::size_t>(t) * half;
  const float* sn = sin_table + static_cast<std::size_t>(t) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float qa = __half2float(row[head * head_dim + i]);
    const float qb = __half2float(row[head * head_dim + i + half]);
    q[i] = qa * cs[i] - qb * sn[i];
    q[i + half] = qb * cs[i] + qa * sn[i];
  }
  for (int p = threadIdx.x; p <= t; p += blockDim.x) {
    rows[p] = static_cast<int>(
        cache_offset(block_table, blocks_per_request, block_tokens, kv_heads, head_dim, b, kvh, p) /
        head_dim);
  }
  __syncthreads();
  const float scale = rsqrtf(static_cast<float>(head_dim));
  float local_max = -INFINITY;
  for (int p = threadIdx.x; p <= t; p += blockDim.x) {
    const __half2* k =
        reinterpret_cast<const __half2*>(k_cache + static_cast<std::size_t>(rows[p]) * head_dim);
    float dot = 0.0f;
    for (int i = 0; i < half; ++i) {
      const float2 kk = __half22float2(k[i]);
      dot = __fmaf_rn(q[2 * i], kk.x, dot);
      dot = __fmaf_rn(q[2 * i + 1], kk.y, dot);
    }
    const float score = __fmul_rn(dot, scale);
    scores[p] = score;
    local_max = fmaxf(local_max, score);
  }
  const float max_score = block_reduce(local_max, scratch, 1);  // its barriers order scores
  float local_sum = 0.0f;
  for (int p = threadIdx.x; p <= t; p += blockDim.x) {
    const float e = expf(scores[p] - max_score);
    scores[p] = e;
    local_sum = __fadd_rn(local_sum, e);
  }
  const float inv_total = 1.0f / block_reduce(local_sum, scratch, 0);
  // parts x head_dim threads: thread (part, i) sums positions part, part + parts, ...
  const int parts = max(1, static_cast<int>(blockDim.x) / head_dim);
  for (int idx = threadIdx.x; idx < parts * head_dim; idx += blockDim.x) {
    const int part = idx / head_dim, i = idx - part * head_dim;
    float acc = 0.0f;
    for (int p = part; p <= t; p += parts) {
      acc = __fmaf_rn(scores[p],
                      __half2float(v_cache[static_cast<std::size_t>(rows[p]) * head_dim + i]), acc);
    }
    partial[idx] = acc;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = partial[i];
    for (int part = 1; part < parts; ++part) acc = __fadd_rn(acc, partial[part * head_dim + i]);
    out[(static_cast<std::size_t>(m) * heads + head) * head_dim + i] =
        __float2half_rn(acc * inv_total);
  }
}

// Blocks (request b, 256-column slice): the final RMSNorm of every prompt row added to pooled[b]
// in position order (as the decode steps add theirs), the last prompt row's residual and sums of
// squares into the decode step's buffers (row b) for lm_head, and the step state moved to
// position prompt_len. Dynamic shared memory: the rows' inverse RMS [prompt_len].
__global__ void k_llm_prefill_finish(const float* residual, const float* ssq, int ssq_stride,
                                     int prompt_len, int hidden, float eps, float* pooled,
                                     float* step_residual, float* step_ssq, int step_ssq_stride,
                                     StepState* state) {
  extern __shared__ float inv[];
  const int b = blockIdx.x;
  const int first = b * prompt_len, last = first + prompt_len - 1;
  for (int t = threadIdx.x; t < prompt_len; t += blockDim.x) {
    inv[t] = inverse_rms(ssq, ssq_stride, first + t, hidden, eps);
  }
  __syncthreads();
  const int i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i < hidden) {
    const std::size_t at = static_cast<std::size_t>(b) * hidden + i;
    float sum = pooled[at];
    for (int t = 0; t < prompt_len; ++t) {
      sum = __fadd_rn(
          sum, __fmul_rn(residual[static_cast<std::size_t>(first + t) * hidden + i], inv[t]));
    }
    pooled[at] = sum;
    step_residual[at] = residual[static_cast<std::size_t>(last) * hidden + i];
  }
  if (blockIdx.y == 0) {
    for (int p = threadIdx.x; p < hidden / llm_detail::kSsqColumns; p += blockDim.x) {
      step_ssq[static_cast<std::size_t>(p) * step_ssq_stride + b] =
          ssq[static_cast<std::size_t>(p) * ssq_stride + last];
    }
    if (b == 0 && threadIdx.x == 0) state->position = prompt_len;
  }
}

// Debug: the cache of positions [0, positions) of requests [0, batch) gathered from its blocks
// into [2][layers][batch][kv_heads][positions][head_dim] fp16.
__global__ void k_llm_gather_kv(const __half* k_cache, const __half* v_cache,
                                std::size_t cache_layer, const std::int32_t* block_table,
                                int blocks_per_request, int block_tokens, int layers, int batch,
                                int kv_heads, int positions, int head_dim, __half* out) {
  const std::size_t per_layer = static_cast<std::size_t>(batch) * kv_heads * positions * head_dim;
  const std::size_t total = 2 * layers * per_layer;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::size_t rest = e;
    const int i = static_cast<int>(rest % head_dim);
    rest /= head_dim;
    const int t = static_cast<int>(rest % positions);
    rest /= positions;
    const int kvh = static_cast<int>(rest % kv_heads);
    rest /= kv_heads;
    const int b = static_cast<int>(rest % batch);
    rest /= batch;
    const int l = static_cast<int>(rest % layers);
    const int which = static_cast<int>(rest / layers);
    const __half* cache = (which == 0 ? k_cache : v_cache) + l * cache_layer;
    out[e] = cache[cache_offset(block_table, blocks_per_request, block_tokens, kv_heads, head_dim,
                                b, kvh, t) +
                   i];
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

constexpr int kPrefillAttentionThreads = 128;

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
    if (options_.prefill) {
      GPUOPT_RETURN_IF_ERROR(llm_detail::check_prefill_gemm_rows(options_.prefill_gemm_rows));
    }
    device_sms_ = sms;
    info_.sm_count = options_.sm_count > 0 ? options_.sm_count : sms;
    info_.programmatic_launch = options_.programmatic_launch && major >= 9;
    int cluster_launch = 0;
    GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device));
    info_.cluster_reduction = options_.cluster_reduction && major >= 9 && cluster_launch != 0;
    info_.cuda_graphs = options_.cuda_graphs;
    info_.kv_block_tokens = options_.kv_block_tokens > 0 ? options_.kv_block_tokens : c.max_context;
    info_.prefill = options_.prefill && c.max_context > 1;
    info_.prefill_gemm_rows = info_.prefill ? options_.prefill_gemm_rows : 0;
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
    int first_step = 0;
    if (info_.prefill && prompt_len > 1) {
      // The whole prompt in one forward; it chooses the first generated token (position
      // prompt_len) and leaves the step state there, so decoding goes on from that step.
      GPUOPT_RETURN_IF_ERROR(enqueue_prefill(batch, prompt_len, debug.d_logits,
                                             static_cast<std::size_t>(new_tokens) * c.vocab, stream)
                                 .with_context(where + "prefill"));
      first_step = prompt_len;
    }
    for (int s = first_step; s < steps; ++s) {
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
    if (debug.d_kv_cache != nullptr) {
      const std::size_t elements =
          2 * static_cast<std::size_t>(c.layers) * batch * c.kv_heads * steps * c.head_dim;
      k_llm_gather_kv<<<fill_blocks(elements), 256, 0, stream>>>(
          k_cache_, v_cache_, cache_layer_, block_table_, blocks_per_request_,
          info_.kv_block_tokens, c.layers, batch, c.kv_heads, steps, c.head_dim,
          reinterpret_cast<__half*>(debug.d_kv_cache));
      GPUOPT_CUDA_TRY_LAUNCH();
    }
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

  // The decode GEMM's input and output for a matrix (its kernel instance: clusters are planned
  // for its occupancy).
  struct GemvModes {
    llm_detail::GemvInput input;
    llm_detail::GemvOutput output;
  };
  static constexpr GemvModes kNormedToHalf{llm_detail::GemvInput::kNormed,
                                           llm_detail::GemvOutput::kHalf};
  static constexpr GemvModes kHalfToResidual{llm_detail::GemvInput::kHalf,
                                             llm_detail::GemvOutput::kResidual};
  static constexpr GemvModes kNormedToSiluPair{llm_detail::GemvInput::kNormed,
                                               llm_detail::GemvOutput::kSiluPair};

  Status add_matrix(std::uint32_t id, int k, int n, GemvModes modes, cudaStream_t stream) {
    const bool pair = modes.output == llm_detail::GemvOutput::kSiluPair;
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
    if (info_.cluster_reduction) {
      std::vector<Status> failed;
      m.plan = llm_detail::plan_gemv_cluster(k, n, pair, info_.sm_count, [&](int splits) {
        StatusOr<int> active = llm_detail::gemv_active_clusters(modes.input, modes.output, splits);
        if (!active.ok()) {
          failed.push_back(active.status());
          return 0;
        }
        return *active;
      });
      if (!failed.empty()) return failed.front();
    } else {
      m.plan = llm_detail::plan_gemv(k, n, pair, info_.sm_count);
    }
    GPUOPT_RETURN_IF_ERROR(allocate(m.counters, m.plan.items));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(m.counters, 0, m.plan.items * sizeof(int), stream));
    partial_floats_ = std::max(partial_floats_, m.plan.partial_floats(llm_detail::kGemvMaxRows, n));
    matrices_.push_back(m);
    if (matrices_.size() <= 4 || id == kLlmLmHeadId) {
      static constexpr const char* kNames[] = {"qkv", "o", "gate/up", "down"};
      const char* name = id == kLlmLmHeadId ? "lm_head" : kNames[matrices_.size() - 1];
      info_.gemm_splits += std::string(info_.gemm_splits.empty() ? "" : ", ") + name + " " +
                           std::to_string(m.plan.splits) + (m.plan.cluster ? "c" : "");
    }
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
    GPUOPT_RETURN_IF_ERROR(allocate(argmax_slots_, rows));
    GPUOPT_CUDA_TRY(
        cudaMemsetAsync(argmax_slots_, 0, rows * sizeof(llm_detail::ArgmaxSlot), stream));
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
      GPUOPT_RETURN_IF_ERROR(add_matrix(llm_matrix_id(l, LlmMatrixKind::kQkv), c.hidden, qkv_n,
                                        kNormedToHalf, stream));
      GPUOPT_RETURN_IF_ERROR(add_matrix(llm_matrix_id(l, LlmMatrixKind::kO), c.heads * c.head_dim,
                                        c.hidden, kHalfToResidual, stream));
      GPUOPT_RETURN_IF_ERROR(add_matrix(llm_matrix_id(l, LlmMatrixKind::kGateUp), c.hidden,
                                        2 * c.ffn, kNormedToSiluPair, stream));
      GPUOPT_RETURN_IF_ERROR(add_matrix(llm_matrix_id(l, LlmMatrixKind::kDown), c.ffn, c.hidden,
                                        kHalfToResidual, stream));
    }
    GPUOPT_RETURN_IF_ERROR(add_matrix(kLlmLmHeadId, c.hidden, c.vocab, kNormedToHalf, stream));
    // One partial-sum area for every GEMM: they run one after another, each after the previous
    // has finished (pdl_wait), and each leaves its counters zero.
    GPUOPT_RETURN_IF_ERROR(allocate(partials_, std::max<std::size_t>(partial_floats_, 1)));
    const std::size_t staged =
        decode_attention_staged_shared(c.head_dim, c.max_context, kDecodeAttentionThreads);
    info_.attention_staged = staged <= kDecodeAttentionStagedBytes;
    attention_shared_ = info_.attention_staged ? staged
                                               : decode_attention_shared(c.head_dim, c.max_context,
                                                                         kDecodeAttentionThreads);
    if (attention_shared_ > 48 * 1024) {
      GPUOPT_CUDA_TRY(cudaFuncSetAttribute(
          info_.attention_staged ? k_llm_attention<true> : k_llm_attention<false>,
          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(attention_shared_)));
    }
    if (info_.prefill) {
      prefill_attention_shared_ =
          prefill_attention_shared(c.head_dim, c.max_context, kPrefillAttentionThreads);
      if (prefill_attention_shared_ > 48 * 1024) {
        GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_llm_prefill_attention,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(prefill_attention_shared_)));
      }
      GPUOPT_RETURN_IF_ERROR(build_prefill(stream));
    }
    return ok_status();
  }

  // Prefill buffers for max_batch x max_context rows, and the layers' matrices as W4A16 device
  // weights (views of the decoder's own tiles and scales: no copy).
  Status build_prefill(cudaStream_t stream) {
    const LlmConfig& c = config_;
    prefill_rows_ = c.max_batch * c.max_context;
    const std::size_t rows = static_cast<std::size_t>(prefill_rows_);
    const int qkv_n = (c.heads + 2 * c.kv_heads) * c.head_dim;
    GPUOPT_RETURN_IF_ERROR(allocate(prefill_residual_, rows * c.hidden));
    GPUOPT_RETURN_IF_ERROR(allocate(prefill_ssq_, rows * (c.hidden / llm_detail::kSsqColumns)));
    GPUOPT_RETURN_IF_ERROR(allocate(prefill_qkv_, rows * qkv_n));
    GPUOPT_RETURN_IF_ERROR(allocate(prefill_attention_, rows * c.heads * c.head_dim));
    GPUOPT_RETURN_IF_ERROR(allocate(prefill_act_, rows * c.ffn));
    // Only prompts over 16 tokens use these (W4A16Gemm's fp16 inputs and outputs); a context of
    // at most 16 never has one.
    if (c.max_context > llm_detail::kGemvMaxRows) {
      GPUOPT_RETURN_IF_ERROR(allocate(prefill_normed_, rows * c.hidden));
      GPUOPT_RETURN_IF_ERROR(allocate(prefill_y_, rows * c.hidden));
      GPUOPT_RETURN_IF_ERROR(allocate(prefill_gate_up_, rows * 2 * c.ffn));
    }
    for (std::size_t i = 0; i + 1 < matrices_.size(); ++i) {  // lm_head runs at M = batch
      const Matrix& m = matrices_[i];
      auto view = std::make_unique<kernels::W4A16DeviceWeights>();
      view->k = m.k;
      view->n = m.n;
      view->group_size = kLlmGroupSize;
      view->type = kernels::ActivationType::kFloat16;
      view->has_zeros = false;
      view->tiles = m.tiles;
      view->scales = m.scales;
      weight_views_.push_back(std::move(view));
    }
    (void)stream;
    return ok_status();
  }

  // The W4A16 GEMMs of every layer for slices of `rows` rows (created on first use): one
  // W4A16Gemm per matrix; the layers' GEMMs of one kind (same shape, same rows, so the same plan)
  // share one workspace, as one W4A16Gemm run layer after layer would.
  StatusOr<const std::vector<std::unique_ptr<kernels::W4A16Gemm>>*> prefill_gemms(
      int rows, cudaStream_t stream) {
    auto found = prefill_gemms_.find(rows);
    if (found != prefill_gemms_.end()) return &found->second;
    const LlmConfig& c = config_;
    // The SMs to plan for: the decoder's count, at most the device's (W4A16Gemm's limit).
    const kernels::W4A16Options options =
        llm_detail::prefill_w4a16_options(std::min(info_.sm_count, device_sms_));
    // Per kind: x and y of the first slice (run() moves them per slice with update()).
    const void* x[4] = {prefill_normed_, prefill_attention_, prefill_normed_, prefill_act_};
    void* y[4] = {prefill_qkv_, prefill_y_, prefill_gate_up_, prefill_y_};
    std::vector<std::unique_ptr<kernels::W4A16Gemm>> gemms(4 * static_cast<std::size_t>(c.layers));
    for (int kind = 0; kind < 4; ++kind) {
      void* workspace = nullptr;
      std::size_t workspace_bytes = 0;
      for (int l = 0; l < c.layers; ++l) {
        auto gemm = std::make_unique<kernels::W4A16Gemm>(options);
        kernels::W4A16Gemm::Arguments arguments;
        arguments.m = rows;
        arguments.x = x[kind];
        arguments.y = y[kind];
        arguments.weights = weight_views_[4 * l + kind].get();
        GPUOPT_ASSIGN_OR_RETURN(const std::size_t bytes, gemm->workspace_size(arguments));
        if (l == 0) {
          workspace_bytes = bytes;
          if (bytes > 0) {
            GPUOPT_ASSIGN_OR_RETURN(runtime::DeviceBuffer buffer,
                                    runtime::DeviceBuffer::allocate(bytes));
            workspace = buffer.data();
            info_.workspace_bytes += static_cast<double>(buffer.size_bytes());
            allocations_.push_back(std::move(buffer));
          }
        } else if (bytes != workspace_bytes) {
          return internal_error("prefill W4A16 GEMMs of one shape planned different workspaces");
        }
        GPUOPT_RETURN_IF_ERROR(gemm->initialize(arguments, workspace, stream));
        if (gemm->config().path != kernels::W4A16Path::kTensorCore) {
          // Only where no int4 kernel fits this GPU's shared memory; the dense copy it would
          // keep is what prefill exists to avoid.
          return failed_precondition(
              "prefill GEMM " + std::to_string(weight_views_[4 * l + kind]->k) + " x " +
              std::to_string(weight_views_[4 * l + kind]->n) + " at M=" + std::to_string(rows) +
              ": W4A16Gemm chose dequantise + cuBLAS (a dense fp16 copy); refused");
        }
        gemms[4 * static_cast<std::size_t>(l) + kind] = std::move(gemm);
      }
    }
    auto inserted = prefill_gemms_.emplace(rows, std::move(gemms));
    return &inserted.first->second;
  }

  // The prompt's forward (LlmDecoderOptions::prefill): rows m = b * prompt_len + t, every layer's
  // GEMMs over all rows (the decode GEMM in 16-row slices, or W4A16Gemm in prefill_gemm_rows
  // slices, by prompt length alone), the causal attention writing K/V at positions
  // [0, prompt_len), then lm_head and argmax on each request's last row.
  Status enqueue_prefill(int batch, int prompt_len, float* debug_logits, std::size_t debug_stride,
                         cudaStream_t stream) {
    const LlmConfig& c = config_;
    using llm_detail::GemvInput;
    using llm_detail::GemvOutput;
    const int rows = batch * prompt_len;
    const int qkv_n = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int attention_n = c.heads * c.head_dim;
    const int stride = prefill_rows_;  // of the sums of squares [hidden / 64][rows]
    const bool w4a16 = llm_detail::prefill_gemm_for(prompt_len) == llm_detail::PrefillGemm::kW4A16;
    if (rows > prefill_rows_ || (w4a16 && prefill_gate_up_ == nullptr)) {
      return internal_error("prefill buffers too small for " + std::to_string(rows) + " rows");
    }
    const std::vector<llm_detail::RowSlice> slices = llm_detail::prefill_row_slices(
        rows, w4a16 ? info_.prefill_gemm_rows : llm_detail::kGemvMaxRows);
    // W4A16 GEMMs per distinct slice height (at most two: the full slices and the last one).
    std::map<int, const std::vector<std::unique_ptr<kernels::W4A16Gemm>>*> gemms;
    if (w4a16) {
      for (const llm_detail::RowSlice& slice : slices) {
        if (gemms.count(slice.rows) != 0) continue;
        GPUOPT_ASSIGN_OR_RETURN(gemms[slice.rows], prefill_gemms(slice.rows, stream));
      }
    }
    // One W4A16 GEMM (kind 0..3 of layer l) over every slice: x [rows][K] -> y [rows][N] fp16.
    auto run_w4a16 = [&](int l, int kind, const __half* x, __half* y) -> Status {
      const kernels::W4A16DeviceWeights& w = *weight_views_[4 * l + kind];
      for (const llm_detail::RowSlice& slice : slices) {
        kernels::W4A16Gemm& gemm = *(*gemms[slice.rows])[4 * static_cast<std::size_t>(l) + kind];
        gemm.update(x + static_cast<std::size_t>(slice.first) * w.k,
                    y + static_cast<std::size_t>(slice.first) * w.n);
        GPUOPT_RETURN_IF_ERROR(gemm.run(stream));
      }
      return ok_status();
    };
    // One decode GEMM over every 16-row slice; `fill` sets the slice's inputs and outputs.
    auto run_gemv = [&](const Matrix& matrix, GemvInput input, GemvOutput output,
                        auto&& fill) -> Status {
      for (const llm_detail::RowSlice& slice : slices) {
        llm_detail::GemvArgs a = gemv_args(matrix, slice.rows);
        a.ssq_stride = stride;
        fill(a, static_cast<std::size_t>(slice.first));
        GPUOPT_RETURN_IF_ERROR(llm_detail::launch_gemv(input, output, a, false, stream));
      }
      return ok_status();
    };
    const unsigned row_blocks = static_cast<unsigned>(rows);

    k_llm_prefill_embed<<<row_blocks, kRowThreads, 0, stream>>>(
        tokens_, c.max_context, prompt_len, token_table_, c.vocab, c.hidden, prefill_residual_,
        prefill_ssq_, stride);
    GPUOPT_CUDA_TRY_LAUNCH();
    for (int l = 0; l < c.layers; ++l) {
      __half* k_cache = k_cache_ + l * cache_layer_;
      __half* v_cache = v_cache_ + l * cache_layer_;
      // RMSNorm -> QKV
      if (w4a16) {
        k_llm_prefill_norm<<<row_blocks, kRowThreads, 0, stream>>>(
            prefill_residual_, prefill_ssq_, stride, c.hidden, c.rms_eps, prefill_normed_);
        GPUOPT_CUDA_TRY_LAUNCH();
        GPUOPT_RETURN_IF_ERROR(run_w4a16(l, 0, prefill_normed_, prefill_qkv_));
      } else {
        GPUOPT_RETURN_IF_ERROR(run_gemv(matrices_[4 * l + 0], GemvInput::kNormed, GemvOutput::kHalf,
                                        [&](llm_detail::GemvArgs& a, std::size_t first) {
                                          a.residual = prefill_residual_ + first * c.hidden;
                                          a.ssq = prefill_ssq_ + first;
                                          a.y = prefill_qkv_ + first * qkv_n;
                                        }));
      }
      // RoPE, K/V into the cache, causal attention
      k_llm_prefill_kv<<<dim3(row_blocks, c.kv_heads), 64, 0, stream>>>(
          prefill_qkv_, prompt_len, rope_cos_, rope_sin_, k_cache, v_cache, block_table_,
          blocks_per_request_, info_.kv_block_tokens, c.heads, c.kv_heads, c.head_dim);
      GPUOPT_CUDA_TRY_LAUNCH();
      k_llm_prefill_attention<<<dim3(row_blocks, c.heads), kPrefillAttentionThreads,
                                prefill_attention_shared_, stream>>>(
          prefill_qkv_, prompt_len, rope_cos_, rope_sin_, k_cache, v_cache, block_table_,
          blocks_per_request_, info_.kv_block_tokens, c.heads, c.kv_heads, c.head_dim,
          c.max_context, prefill_attention_);
      GPUOPT_CUDA_TRY_LAUNCH();
      // Output projection + residual
      if (w4a16) {
        GPUOPT_RETURN_IF_ERROR(run_w4a16(l, 1, prefill_attention_, prefill_y_));
        k_llm_prefill_residual<<<row_blocks, kRowThreads, 0, stream>>>(
            prefill_y_, c.hidden, prefill_residual_, prefill_ssq_, stride);
        GPUOPT_CUDA_TRY_LAUNCH();
      } else {
        GPUOPT_RETURN_IF_ERROR(run_gemv(matrices_[4 * l + 1], GemvInput::kHalf,
                                        GemvOutput::kResidual,
                                        [&](llm_detail::GemvArgs& a, std::size_t first) {
                                          a.x = prefill_attention_ + first * attention_n;
                                          a.residual_out = prefill_residual_ + first * c.hidden;
                                          a.ssq_out = prefill_ssq_ + first;
                                        }));
      }
      // RMSNorm -> gate/up -> SiLU(gate)·up
      if (w4a16) {
        k_llm_prefill_norm<<<row_blocks, kRowThreads, 0, stream>>>(
            prefill_residual_, prefill_ssq_, stride, c.hidden, c.rms_eps, prefill_normed_);
        GPUOPT_CUDA_TRY_LAUNCH();
        GPUOPT_RETURN_IF_ERROR(run_w4a16(l, 2, prefill_normed_, prefill_gate_up_));
        const std::size_t elements = static_cast<std::size_t>(rows) * c.ffn;
        k_llm_prefill_silu<<<fill_blocks(elements), 256, 0, stream>>>(prefill_gate_up_, c.ffn,
                                                                      elements, prefill_act_);
        GPUOPT_CUDA_TRY_LAUNCH();
      } else {
        GPUOPT_RETURN_IF_ERROR(run_gemv(matrices_[4 * l + 2], GemvInput::kNormed,
                                        GemvOutput::kSiluPair,
                                        [&](llm_detail::GemvArgs& a, std::size_t first) {
                                          a.residual = prefill_residual_ + first * c.hidden;
                                          a.ssq = prefill_ssq_ + first;
                                          a.y = prefill_act_ + first * c.ffn;
                                        }));
      }
      // Down projection + residual
      if (w4a16) {
        GPUOPT_RETURN_IF_ERROR(run_w4a16(l, 3, prefill_act_, prefill_y_));
        k_llm_prefill_residual<<<row_blocks, kRowThreads, 0, stream>>>(
            prefill_y_, c.hidden, prefill_residual_, prefill_ssq_, stride);
        GPUOPT_CUDA_TRY_LAUNCH();
      } else {
        GPUOPT_RETURN_IF_ERROR(run_gemv(matrices_[4 * l + 3], GemvInput::kHalf,
                                        GemvOutput::kResidual,
                                        [&](llm_detail::GemvArgs& a, std::size_t first) {
                                          a.x = prefill_act_ + first * c.ffn;
                                          a.residual_out = prefill_residual_ + first * c.hidden;
                                          a.ssq_out = prefill_ssq_ + first;
                                        }));
      }
    }
    const unsigned column_blocks =
        static_cast<unsigned>((c.hidden + kRowThreads - 1) / kRowThreads);
    k_llm_prefill_finish<<<dim3(batch, column_blocks), kRowThreads, prompt_len * sizeof(float),
                           stream>>>(prefill_residual_, prefill_ssq_, stride, prompt_len, c.hidden,
                                     c.rms_eps, pooled_, residual_, ssq_, c.max_batch, state_);
    GPUOPT_CUDA_TRY_LAUNCH();
    return enqueue_choice(batch, false, debug_logits, debug_stride, stream);
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
          info_.attention_staged ? k_llm_attention<true> : k_llm_attention<false>,
          dim3(c.heads, batch), dim3(kDecodeAttentionThreads), attention_shared_, stream, pdl, qkv_,
          rope_cos_, rope_sin_, state_, k_cache_ + l * cache_layer_, v_cache_ + l * cache_layer_,
          block_table_, blocks_per_request_, info_.kv_block_tokens, c.heads, c.kv_heads, c.head_dim,
          attention_));
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
    return enqueue_choice(batch, pdl, debug_logits, debug_stride, stream);
  }

  // lm_head on the normalised residual rows [0, batch) and the greedy choice written as the token
  // of position state.position.
  Status enqueue_choice(int batch, bool pdl, float* debug_logits, std::size_t debug_stride,
                        cudaStream_t stream) {
    const LlmConfig& c = config_;
    llm_detail::GemvArgs a = gemv_args(matrices_.back(), batch);
    a.residual = residual_;
    a.ssq = ssq_;
    a.y = logits_;
    GPUOPT_RETURN_IF_ERROR(llm_detail::launch_gemv(llm_detail::GemvInput::kNormed,
                                                   llm_detail::GemvOutput::kHalf, a, pdl, stream));
    llm_detail::ArgmaxArgs choice;
    choice.logits = logits_;
    choice.rows = batch;
    choice.vocab = c.vocab;
    choice.tokens = tokens_;
    choice.max_context = c.max_context;
    choice.position = &state_->position;  // already advanced by k_llm_pool
    choice.debug = debug_logits;
    choice.debug_stride = debug_stride;
    choice.slots = argmax_slots_;
    return llm_detail::launch_argmax(choice, pdl, stream);
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
  llm_detail::ArgmaxSlot* argmax_slots_ = nullptr;  // [max_batch], zero between steps
  std::int32_t* block_table_ = nullptr;             // [max_batch][blocks_per_request]
  int blocks_per_request_ = 0;
  std::size_t cache_layer_ = 0;  // elements of one layer's K (or V) cache
  __half* k_cache_ = nullptr;    // [layer][block][kv_head][block_tokens][head_dim]
  __half* v_cache_ = nullptr;
  std::size_t attention_shared_ = 0;
  std::size_t prefill_attention_shared_ = 0;
  __half* token_table_ = nullptr;  // [vocab][hidden]
  float* projection_ = nullptr;    // [hidden][embed_dim]
  float* rope_cos_ = nullptr;      // [max_context][head_dim / 2]
  float* rope_sin_ = nullptr;
  int device_sms_ = 0;
  // Prefill (LlmDecoderOptions::prefill): buffers for prefill_rows_ = max_batch x max_context rows
  // m = b * prompt_len + t.
  int prefill_rows_ = 0;
  float* prefill_residual_ = nullptr;    // [rows][hidden] fp32 residual stream
  float* prefill_ssq_ = nullptr;         // [hidden / 64][prefill_rows_] sums of squares
  __half* prefill_qkv_ = nullptr;        // [rows][(heads + 2 kv) head_dim]
  __half* prefill_attention_ = nullptr;  // [rows][heads head_dim]
  __half* prefill_act_ = nullptr;        // [rows][ffn] SiLU(gate)·up
  __half* prefill_normed_ = nullptr;     // [rows][hidden] RMSNorm output (W4A16 path)
  __half* prefill_y_ = nullptr;          // [rows][hidden] o / down output (W4A16 path)
  __half* prefill_gate_up_ = nullptr;    // [rows][2 ffn] (W4A16 path)
  // The layers' matrices as W4A16Gemm weights: [layer][qkv, o, gate_up, down], views of matrices_.
  std::vector<std::unique_ptr<kernels::W4A16DeviceWeights>> weight_views_;
  // Slice height -> one W4A16Gemm per matrix, [layer][kind].
  std::map<int, std::vector<std::unique_ptr<kernels::W4A16Gemm>>> prefill_gemms_;
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
