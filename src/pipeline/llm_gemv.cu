// LLM stage: the decode GEMM (llm_gemv.hpp). One block per (item, k-split); an item is one
// 64-column strip of the W4A16 tile layout (or a gate strip and its up strip). The block's warps
// take the split's quantization groups in turn, streaming each group's eight 512-byte k16 tiles
// straight into registers (the next group's loads in flight while one is multiplied) as the mma A
// operand, the x rows as the B operand (rows >= M are zero), fp32 sums per group times the group's
// scales. Warps are added in warp order in shared memory, splits in split order by the block that
// finishes last, so every row's bits are fixed by (K, N, plan) alone.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "gpuopt/core/cuda_check.hpp"
#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_pdl.cuh"

namespace gpuopt::pipeline::llm_detail {
namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ std::uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<std::uint32_t*>(&h);
}
__device__ __forceinline__ __half2 bits_half2(std::uint32_t u) {
  return *reinterpret_cast<__half2*>(&u);
}

// Word j of a lane's 16 bytes of one k16 tile -> the A fragment of m16 tile j (strip columns
// 16j..16j+15), values q - 8 exactly: nibbles 0/4 -> a0 (column 16j + g, k 2c, 2c+1), 2/6 -> a1
// (column 16j + 8 + g), 1/5 -> a2 (k + 8), 3/7 -> a3. docs/w4a16-gemm.md, the tile layout.
__device__ __forceinline__ void dequantize(std::uint32_t w, std::uint32_t* a) {
  const __half2 bias = bits_half2(0x64086408u);       // 1032 = 1024 + zero 8
  const __half2 sixteenth = bits_half2(0x2C002C00u);  // 1/16
  const __half2 minus72 = bits_half2(0xD480D480u);    // (1024 + 16q)/16 - 72 = q - 8
  const std::uint32_t lo0 = (w & 0x000f000fu) | 0x64006400u;
  const std::uint32_t hi0 = (w & 0x00f000f0u) | 0x64006400u;
  const std::uint32_t s = w >> 8;
  const std::uint32_t lo1 = (s & 0x000f000fu) | 0x64006400u;
  const std::uint32_t hi1 = (s & 0x00f000f0u) | 0x64006400u;
  a[0] = half2_bits(__hsub2(bits_half2(lo0), bias));
  a[1] = half2_bits(__hsub2(bits_half2(lo1), bias));
  a[2] = half2_bits(__hfma2(bits_half2(hi0), sixteenth, minus72));
  a[3] = half2_bits(__hfma2(bits_half2(hi1), sixteenth, minus72));
}

__device__ __forceinline__ void mma_16816(float* d, const std::uint32_t* a,
                                          const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Sum of 32 lanes' values in a fixed butterfly order; lane 0's result is the one used.
__device__ __forceinline__ float warp_sum_fixed(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GPUOPT_GEMV_CLUSTER 1
// Thread block clusters (sm_90): the barrier over every thread of the cluster's blocks (release /
// acquire at cluster scope), and a float in another block's shared memory.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ std::uint32_t cluster_address(const void* shared, unsigned rank) {
  const auto local = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ float load_cluster(std::uint32_t address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(address) : "memory");
  return v;
}
#else
#define GPUOPT_GEMV_CLUSTER 0
#endif

// One warp's staged x for one quantization group: rows [kRows][128 k] (+ padding so that the B
// fragment reads of the eight rows g = 0..7 fall in distinct banks), fp32 residual for kNormed,
// fp16 x for kHalf. The same bytes hold the warp's fp32 sums [kRows][64] after the main loop.
template <int kRows, GemvInput kIn>
struct GemvStage {
  static constexpr int kFloatStride = kGemvGroupK + 8;  // fp32 row: 136 floats
  static constexpr int kHalfStride = kGemvGroupK + 8;   // fp16 row: 136 halves
  static constexpr int kXBytes =
      kIn == GemvInput::kNormed ? kRows * kFloatStride * 4 : kRows * kHalfStride * 2;
  static constexpr int kSumBytes = kRows * 64 * 4;
  static constexpr int kBytes = kXBytes > kSumBytes ? kXBytes : kSumBytes;
};

// kCluster: the item's splits are one thread block cluster (GemvPlan::cluster, sm_90).
template <int kN8, GemvInput kIn, GemvOutput kOut, bool kCluster>
__global__ void __launch_bounds__(32 * kGemvWarps, kGemvBlocksPerSm) k_llm_gemv(const GemvArgs a) {
  constexpr int kParts = kOut == GemvOutput::kSiluPair ? 2 : 1;
  constexpr int kWarpsPerStrip = kGemvWarps / kParts;
  constexpr int kRows = 8 * kN8;
  using Stage = GemvStage<kRows, kIn>;
  __shared__ __align__(16) unsigned char stage[kGemvWarps][Stage::kBytes];
  __shared__ float final_sums[kParts][kRows][64];
  __shared__ float inv_rows[kRows];
  __shared__ int is_last;
  // kResidual: the rows' residual over this strip, fetched at the start (see below).
  __shared__ __align__(16) float residual_rows[kOut == GemvOutput::kResidual ? kRows : 1][64];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  const int splits = a.plan.splits;
  const int item = blockIdx.x / splits;
  const int split = blockIdx.x - item * splits;
  const int part = warp / kWarpsPerStrip;
  const int strips = a.n / 64;
  const int strip = item + part * (kParts == 2 ? strips / 2 : 0);
  const int groups = a.k / kGemvGroupK;
  const int g0 = static_cast<int>(static_cast<long long>(split) * groups / splits);
  const int g1 = static_cast<int>(static_cast<long long>(split + 1) * groups / splits);
  const uint4* weights =
      static_cast<const uint4*>(a.tiles) + static_cast<std::size_t>(strip) * (a.k / 16) * 32 + lane;
  const uint4* scales =
      static_cast<const uint4*>(a.scales) + static_cast<std::size_t>(strip) * 8 + g;
  const std::size_t scale_stride = static_cast<std::size_t>(strips) * 8;  // uint4 per group

  uint4 current[8], next[8];
  uint4 scale_current = make_uint4(0, 0, 0, 0), scale_next = make_uint4(0, 0, 0, 0);
  int group = g0 + warp % kWarpsPerStrip;
  // The weights never change: their first loads go out before the previous kernel has finished.
  if (group < g1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      current[i] = load_stream(weights + (static_cast<std::size_t>(group) * 8 + i) * 32);
    }
    scale_current = __ldg(scales + group * scale_stride);
  }
  pdl_trigger();
  pdl_wait();

  // The residual the epilogue adds to, copied into shared memory now, beside the x rows, so that
  // the add after the reduction does not wait on another L2 round trip. Every block fetches every
  // row (at most 4 KB): which block writes which row is known only at the end.
  if constexpr (kOut == GemvOutput::kResidual) {
    for (int idx = threadIdx.x; idx < a.m * 16; idx += blockDim.x) {
      const int row = idx / 16, chunk = idx % 16;
      copy_async_16(&residual_rows[row][4 * chunk],
                    a.residual_out + static_cast<std::size_t>(row) * a.n + strip * 64 + 4 * chunk);
    }
  }

  // The group's x rows < M into this warp's stage, 16 bytes per lane per copy: a fp32 row of the
  // group is 32 lanes x 4 floats, a fp16 row 16 lanes x 8 halves (two rows per copy).
  const int m = a.m;
  unsigned char* const my_stage = stage[warp];
  auto stage_x = [&](int grp) {
    const int k0 = grp * kGemvGroupK;
    if constexpr (kIn == GemvInput::kNormed) {
      float* xs = reinterpret_cast<float*>(my_stage);
#pragma unroll
      for (int row = 0; row < kRows; ++row) {
        if (row < m) {
          copy_async_16(xs + row * Stage::kFloatStride + 4 * lane,
                        a.residual + static_cast<std::size_t>(row) * a.k + k0 + 4 * lane);
        }
      }
    } else {
      __half* xs = reinterpret_cast<__half*>(my_stage);
      const __half* x = static_cast<const __half*>(a.x);
#pragma unroll
      for (int pair = 0; pair < kRows / 2; ++pair) {
        const int row = 2 * pair + lane / 16;
        if (row < m) {
          copy_async_16(xs + row * Stage::kHalfStride + 8 * (lane % 16),
                        x + static_cast<std::size_t>(row) * a.k + k0 + 8 * (lane % 16));
        }
      }
    }
  };
  if (group < g1) stage_x(group);

  // RMSNorm: 1/rms of each row from the hidden/64 partial sums of squares, row r by warp r % 4,
  // lane l adding partials l, l + 32, ... in order, then a fixed butterfly (the same bits for a row
  // whatever M or the block).
  if constexpr (kIn == GemvInput::kNormed) {
    const int partials = a.k / kSsqColumns;
    if constexpr (kN8 == 1) {  // up to 8 rows: at most two per warp, one at a time
      for (int row = warp; row < m; row += kGemvWarps) {
        float sum = 0.0f;
        for (int p = lane; p < partials; p += 32) {
          sum = __fadd_rn(sum, a.ssq[static_cast<std::size_t>(p) * a.ssq_stride + row]);
        }
        sum = warp_sum_fixed(sum);
        if (lane == 0) {
          inv_rows[row] = rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(a.k)), a.eps));
        }
      }
    } else {
      // Up to 16 rows: a warp's rows side by side, so their loads are in flight together (the
      // same additions in the same order as one row at a time).
      constexpr int kRowsPerWarp = kRows / kGemvWarps;
      float sums[kRowsPerWarp];
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) sums[q] = 0.0f;
      for (int p = lane; p < partials; p += 32) {
        const float* column = a.ssq + static_cast<std::size_t>(p) * a.ssq_stride;
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) {
          const int row = warp + q * kGemvWarps;
          if (row < m) sums[q] = __fadd_rn(sums[q], column[row]);
        }
      }
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q) {
        const int row = warp + q * kGemvWarps;
        const float sum = warp_sum_fixed(sums[q]);
        if (lane == 0 && row < m) {
          inv_rows[row] = rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(a.k)), a.eps));
        }
      }
    }
  }
  copy_async_wait_all();
  __syncthreads();  // inv_rows, and every lane's staged x, visible to the warp

  float inv[kN8];
  bool live[kN8];
#pragma unroll
  for (int r = 0; r < kN8; ++r) {
    const int row = 8 * r + g;
    live[r] = row < m;
    inv[r] = 0.0f;
    if constexpr (kIn == GemvInput::kNormed) {
      if (live[r]) inv[r] = inv_rows[row];
    }
  }
  // B fragment word: x[row][k], x[row][k + 1] (k even) from the stage, normalised as fp16.
  auto load_b = [&](int r, int k) -> std::uint32_t {
    if (!live[r]) return 0u;
    const int row = 8 * r + g;
    if constexpr (kIn == GemvInput::kNormed) {
      const float2 v = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(my_stage) +
                                                        row * Stage::kFloatStride + k);
      return half2_bits(__floats2half2_rn(__fmul_rn(v.x, inv[r]), __fmul_rn(v.y, inv[r])));
    } else {
      return *reinterpret_cast<const std::uint32_t*>(reinterpret_cast<const __half*>(my_stage) +
                                                     row * Stage::kHalfStride + k);
    }
  };

  float acc[kN8][4][4];
#pragma unroll
  for (int r = 0; r < kN8; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.0f;
    }
  }
  for (; group < g1; group += kWarpsPerStrip) {
    const int following = group + kWarpsPerStrip;
    if (following < g1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        next[i] = load_stream(weights + (static_cast<std::size_t>(following) * 8 + i) * 32);
      }
      scale_next = __ldg(scales + following * scale_stride);
    }
    float group_acc[kN8][4][4];
#pragma unroll
    for (int r = 0; r < kN8; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) group_acc[r][j][e] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      std::uint32_t b[kN8][2];
#pragma unroll
      for (int r = 0; r < kN8; ++r) {
        b[r][0] = load_b(r, i * 16 + 2 * c);
        b[r][1] = load_b(r, i * 16 + 2 * c + 8);
      }
      const std::uint32_t words[4] = {current[i].x, current[i].y, current[i].z, current[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t frag[4];
        dequantize(words[j], frag);
#pragma unroll
        for (int r = 0; r < kN8; ++r) mma_16816(group_acc[r][j], frag, b[r]);
      }
    }
    // The next group's x: up to 8 rows staged before this group's scale multiply, above 8 after it.
    // H200, one run, staging after the multiply at every row count against before it: 1B step
    // batch 1 0.490 against 0.483 ms (slower), batch 16 0.917 against 0.929 ms (faster).
    if (kN8 == 1 && following < g1) {
      __syncwarp();  // every lane has read this group's x
      stage_x(following);
    }
    const std::uint32_t scale_words[4] = {scale_current.x, scale_current.y, scale_current.z,
                                          scale_current.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // Scale 2j: column 16j + g (c0, c1); scale 2j + 1: column 16j + 8 + g (c2, c3).
      const float lo = __half2float(__ushort_as_half(static_cast<unsigned short>(scale_words[j])));
      const float hi =
          __half2float(__ushort_as_half(static_cast<unsigned short>(scale_words[j] >> 16)));
#pragma unroll
      for (int r = 0; r < kN8; ++r) {
        acc[r][j][0] = __fmaf_rn(lo, group_acc[r][j][0], acc[r][j][0]);
        acc[r][j][1] = __fmaf_rn(lo, group_acc[r][j][1], acc[r][j][1]);
        acc[r][j][2] = __fmaf_rn(hi, group_acc[r][j][2], acc[r][j][2]);
        acc[r][j][3] = __fmaf_rn(hi, group_acc[r][j][3], acc[r][j][3]);
      }
    }
    if (following < g1) {
      if constexpr (kN8 > 1) {
        __syncwarp();  // every lane has read this group's x
        stage_x(following);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) current[i] = next[i];
      scale_current = scale_next;
      copy_async_wait_all();
      __syncwarp();  // the next group's x visible to every lane
    }
  }
  __syncwarp();  // the stage's x is read; it now takes the warp's sums
  float(*reduce_rows)[64] = reinterpret_cast<float(*)[64]>(my_stage);

  // D fragment: c0/c1 at (column 16j + g, rows 8r + 2c, 2c + 1), c2/c3 at column 16j + 8 + g.
#pragma unroll
  for (int r = 0; r < kN8; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        reduce_rows[8 * r + 2 * c + (e & 1)][16 * j + g + 8 * (e >> 1)] = acc[r][j][e];
      }
    }
  }
  __syncthreads();

  const int elements = kParts * m * 64;
  for (int idx = threadIdx.x; idx < elements; idx += blockDim.x) {
    const int p = kParts == 2 && idx >= m * 64 ? 1 : 0;
    const int rest = idx - p * m * 64;
    const int row = rest / 64, col = rest % 64;
    auto sums = [&](int w) {
      return reinterpret_cast<const float(*)[64]>(stage[p * kWarpsPerStrip + w])[row][col];
    };
    float v = sums(0);
#pragma unroll
    for (int w = 1; w < kWarpsPerStrip; ++w) v = __fadd_rn(v, sums(w));
    final_sums[p][row][col] = v;
  }
  // The output of rows row0, row0 + row_step, ... < m from sums [kParts][kRows][64].
  auto epilogue = [&](const float* sums_base, int row0, int row_step) {
    auto sums = [&](int p, int row, int col) { return sums_base[(p * kRows + row) * 64 + col]; };
    const int rows = m > row0 ? (m - row0 + row_step - 1) / row_step : 0;
    if constexpr (kOut == GemvOutput::kHalf) {
      __half* y = static_cast<__half*>(a.y);
      for (int idx = threadIdx.x; idx < rows * 64; idx += blockDim.x) {
        const int row = row0 + (idx / 64) * row_step, col = idx % 64;
        y[static_cast<std::size_t>(row) * a.n + strip * 64 + col] =
            __float2half_rn(sums(0, row, col));
      }
    } else if constexpr (kOut == GemvOutput::kSiluPair) {
      __half* act = static_cast<__half*>(a.y);
      const int width = a.n / 2;
      for (int idx = threadIdx.x; idx < rows * 64; idx += blockDim.x) {
        const int row = row0 + (idx / 64) * row_step, col = idx % 64;
        const float gate = sums(0, row, col);
        const float up = sums(1, row, col);
        const float silu = __fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)));
        act[static_cast<std::size_t>(row) * width + item * 64 + col] =
            __float2half_rn(__fmul_rn(silu, up));
      }
    } else {
      // One warp per row: the new residual and its sum of squares over this strip's 64 columns.
      for (int r = warp; r < rows; r += kGemvWarps) {
        const int row = row0 + r * row_step;
        float* res = a.residual_out + static_cast<std::size_t>(row) * a.n + strip * 64;
        const float r0 = __fadd_rn(residual_rows[row][lane], sums(0, row, lane));
        const float r1 = __fadd_rn(residual_rows[row][lane + 32], sums(0, row, lane + 32));
        res[lane] = r0;
        res[lane + 32] = r1;
        const float total = warp_sum_fixed(__fadd_rn(__fmul_rn(r0, r0), __fmul_rn(r1, r1)));
        if (lane == 0) a.ssq_out[static_cast<std::size_t>(strip) * a.ssq_stride + row] = total;
      }
    }
  };

  if constexpr (kCluster) {
#if GPUOPT_GEMV_CLUSTER
    // The cluster is this item's splits, rank = split. Every block's sums are in its shared
    // memory; block `split` adds rows split, split + splits, ... of every split in split order
    // (the additions of the global fix-up below, so the same bits) and writes their output. No
    // global round trip, fence or counter.
    static_assert(kParts * kRows * 64 * 4 <= kGemvWarps * Stage::kBytes,
                  "the reduced rows fit in the warps' stages");
    cluster_arrive();
    cluster_wait();  // every split's final_sums written and visible
    float* reduced = reinterpret_cast<float*>(&stage[0][0]);  // free: its sums are in final_sums
    const float* own = &final_sums[0][0][0];
    std::uint32_t peer[kGemvMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kGemvMaxClusterSplits; ++s) {
      peer[s] = s < splits ? cluster_address(own, static_cast<unsigned>(s)) : 0u;
    }
    const int rows = m > split ? (m - split + splits - 1) / splits : 0;
    for (int idx = threadIdx.x; idx < kParts * rows * 64; idx += blockDim.x) {
      const int p = kParts == 2 && idx >= rows * 64 ? 1 : 0;
      const int rest = idx - p * rows * 64;
      const int row = split + (rest / 64) * splits, col = rest % 64;
      const int offset = (p * kRows + row) * 64 + col;
      float part[kGemvMaxClusterSplits];
#pragma unroll
      for (int s = 0; s < kGemvMaxClusterSplits; ++s) {
        part[s] = s < splits ? load_cluster(peer[s] + 4u * offset) : 0.0f;
      }
      float v = part[0];
#pragma unroll
      for (int s = 1; s < kGemvMaxClusterSplits; ++s) {
        if (s < splits) v = __fadd_rn(v, part[s]);
      }
      reduced[offset] = v;
    }
    cluster_arrive();  // this block is done reading its peers' sums
    __syncthreads();
    epilogue(reduced, split, splits);
    cluster_wait();  // the peers are done reading this block's: its shared memory may go
#else
    __trap();  // launch_gemv never launches a cluster plan before sm_90
#endif
    return;
  }
  if (splits > 1) {
    // Every split writes its sums; the block that finishes last adds them in split order.
    for (int idx = threadIdx.x; idx < elements; idx += blockDim.x) {
      const int p = kParts == 2 && idx >= m * 64 ? 1 : 0;
      const int rest = idx - p * m * 64;
      const int row = rest / 64, col = rest % 64;
      const int column = (item + p * (kParts == 2 ? strips / 2 : 0)) * 64 + col;
      const float v = final_sums[p][row][col];
      __stcg(a.partials + (static_cast<std::size_t>(split) * kGemvMaxRows + row) * a.n + column, v);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int done = atomicAdd(a.counters + item, 1);
      is_last = done == splits - 1 ? 1 : 0;
    }
    __syncthreads();
    if (is_last == 0) return;
    __threadfence();
    // Up to 8 rows a thread has at most one element, so there is nothing to load side by side:
    // the batched form below measured slower there on the H200 (1B step 0.571 against 0.542 ms).
    if constexpr (kN8 == 1) {
      for (int idx = threadIdx.x; idx < elements; idx += blockDim.x) {
        const int p = kParts == 2 && idx >= m * 64 ? 1 : 0;
        const int rest = idx - p * m * 64;
        const int row = rest / 64, col = rest % 64;
        const int column = (item + p * (kParts == 2 ? strips / 2 : 0)) * 64 + col;
        float v = __ldcg(a.partials + static_cast<std::size_t>(row) * a.n + column);
        for (int s = 1; s < splits; ++s) {
          v = __fadd_rn(
              v, __ldcg(a.partials + (static_cast<std::size_t>(s) * kGemvMaxRows + row) * a.n +
                        column));
        }
        final_sums[p][row][col] = v;
      }
    } else {
      // Up to 16 rows: each thread's elements side by side, one L2 round trip per split rather
      // than per element and split (the same additions in the same order).
      constexpr int kPerThread = (kParts * kRows * 64 + 32 * kGemvWarps - 1) / (32 * kGemvWarps);
      float total[kPerThread];
      std::size_t offset[kPerThread];
#pragma unroll
      for (int e = 0; e < kPerThread; ++e) {
        const int idx = threadIdx.x + e * blockDim.x;
        const int p = kParts == 2 && idx >= m * 64 ? 1 : 0;
        const int rest = idx - p * m * 64;
        const int row = rest / 64, col = rest % 64;
        const int column = (item + p * (kParts == 2 ? strips / 2 : 0)) * 64 + col;
        offset[e] = static_cast<std::size_t>(row) * a.n + column;
        total[e] = idx < elements ? __ldcg(a.partials + offset[e]) : 0.0f;
      }
      for (int s = 1; s < splits; ++s) {
        const float* split_sums = a.partials + static_cast<std::size_t>(s) * kGemvMaxRows * a.n;
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
          if (threadIdx.x + e * blockDim.x < elements) {
            total[e] = __fadd_rn(total[e], __ldcg(split_sums + offset[e]));
          }
        }
      }
#pragma unroll
      for (int e = 0; e < kPerThread; ++e) {
        const int idx = threadIdx.x + e * blockDim.x;
        if (idx < elements) {
          const int p = kParts == 2 && idx >= m * 64 ? 1 : 0;
          const int rest = idx - p * m * 64;
          final_sums[p][rest / 64][rest % 64] = total[e];
        }
      }
    }
    if (threadIdx.x == 0) a.counters[item] = 0;  // ready for the next run
  }
  __syncthreads();
  epilogue(&final_sums[0][0][0], 0, 1);
}

template <int kN8, GemvInput kIn, GemvOutput kOut>
Status launch_typed(const GemvArgs& args, bool programmatic, cudaStream_t stream) {
  const int blocks = args.plan.items * args.plan.splits;
  if (args.plan.cluster) {
    return launch_kernel_clustered(k_llm_gemv<kN8, kIn, kOut, true>, dim3(blocks),
                                   dim3(32 * kGemvWarps), 0, stream, programmatic, args.plan.splits,
                                   args);
  }
  return launch_kernel(k_llm_gemv<kN8, kIn, kOut, false>, dim3(blocks), dim3(32 * kGemvWarps), 0,
                       stream, programmatic, args);
}

// Clusters of `splits` blocks of one instance resident at once on the current device.
template <int kN8, GemvInput kIn, GemvOutput kOut>
StatusOr<int> active_clusters_typed(int splits) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(splits));
  config.blockDim = dim3(32 * kGemvWarps);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(splits);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int clusters = 0;
  GPUOPT_CUDA_TRY(
      cudaOccupancyMaxActiveClusters(&clusters, k_llm_gemv<kN8, kIn, kOut, true>, &config));
  return clusters;
}

template <GemvInput kIn, GemvOutput kOut>
StatusOr<int> active_clusters_rows(int splits) {
  GPUOPT_ASSIGN_OR_RETURN(const int one, (active_clusters_typed<1, kIn, kOut>(splits)));
  GPUOPT_ASSIGN_OR_RETURN(const int two, (active_clusters_typed<2, kIn, kOut>(splits)));
  return std::min(one, two);
}

template <GemvInput kIn, GemvOutput kOut>
Status launch_rows(const GemvArgs& args, bool programmatic, cudaStream_t stream) {
  return args.m > 8 ? launch_typed<2, kIn, kOut>(args, programmatic, stream)
                    : launch_typed<1, kIn, kOut>(args, programmatic, stream);
}

}  // namespace

Status launch_gemv(GemvInput input, GemvOutput output, const GemvArgs& a, bool programmatic,
                   CUstream_st* stream_handle) {
  auto bad = [](const std::string& what) { return invalid_argument("LLM decode GEMM: " + what); };
  if (a.m < 1 || a.m > kGemvMaxRows) return bad("M=" + std::to_string(a.m) + " outside [1, 16]");
  const bool pair = output == GemvOutput::kSiluPair;
  if (a.k <= 0 || a.k % kGemvGroupK != 0)
    return bad("K=" + std::to_string(a.k) + " not a multiple of 128");
  if (a.n <= 0 || a.n % (pair ? 128 : 64) != 0) {
    return bad("N=" + std::to_string(a.n) + " not a multiple of " + (pair ? "128" : "64"));
  }
  if (a.tiles == nullptr || a.scales == nullptr) return bad("no weights");
  if (a.plan.parts != (pair ? 2 : 1) || a.plan.items * 64 * a.plan.parts != a.n ||
      a.plan.splits < 1 || a.plan.splits > a.k / kGemvGroupK) {
    return bad("plan does not fit the layer (items " + std::to_string(a.plan.items) + ", splits " +
               std::to_string(a.plan.splits) + ")");
  }
  if (a.plan.cluster && a.plan.splits > kGemvMaxClusterSplits) {
    return bad("a cluster holds at most " + std::to_string(kGemvMaxClusterSplits) +
               " splits, not " + std::to_string(a.plan.splits));
  }
  if (a.plan.splits > 1 && !a.plan.cluster && (a.partials == nullptr || a.counters == nullptr)) {
    return bad("k-splits need partials and counters");
  }
  if (input == GemvInput::kHalf && a.x == nullptr) return bad("no x");
  if (input == GemvInput::kNormed &&
      (a.residual == nullptr || a.ssq == nullptr || a.ssq_stride < a.m)) {
    return bad("normalised input needs residual, ssq and ssq_stride >= M");
  }
  if (output == GemvOutput::kResidual &&
      (a.residual_out == nullptr || a.ssq_out == nullptr || a.ssq_stride < a.m)) {
    return bad("residual output needs residual_out, ssq_out and ssq_stride >= M");
  }
  if (output != GemvOutput::kResidual && a.y == nullptr) return bad("no y");
  if (output == GemvOutput::kResidual &&
      reinterpret_cast<std::uintptr_t>(a.residual_out) % 16 != 0) {
    return bad("residual_out not 16-byte aligned");
  }
  // The x rows are staged with 16-byte copies.
  const void* rows = input == GemvInput::kHalf ? a.x : static_cast<const void*>(a.residual);
  if (reinterpret_cast<std::uintptr_t>(rows) % 16 != 0) {
    return bad(std::string(input == GemvInput::kHalf ? "x" : "residual") + " not 16-byte aligned");
  }
  auto stream = static_cast<cudaStream_t>(stream_handle);
  if (input == GemvInput::kHalf) {
    switch (output) {
      case GemvOutput::kHalf:
        return launch_rows<GemvInput::kHalf, GemvOutput::kHalf>(a, programmatic, stream);
      case GemvOutput::kResidual:
        return launch_rows<GemvInput::kHalf, GemvOutput::kResidual>(a, programmatic, stream);
      case GemvOutput::kSiluPair:
        return bad("fp16 input with the SiLU pair output is not built");
    }
  }
  switch (output) {
    case GemvOutput::kHalf:
      return launch_rows<GemvInput::kNormed, GemvOutput::kHalf>(a, programmatic, stream);
    case GemvOutput::kSiluPair:
      return launch_rows<GemvInput::kNormed, GemvOutput::kSiluPair>(a, programmatic, stream);
    case GemvOutput::kResidual:
      return bad("normalised input with the residual output is not built");
  }
  return bad("unknown mode");
}

StatusOr<int> gemv_active_clusters(GemvInput input, GemvOutput output, int splits) {
  if (splits < 1 || splits > kGemvMaxClusterSplits) {
    return invalid_argument("LLM decode GEMM: cluster of " + std::to_string(splits) +
                            " splits outside [1, " + std::to_string(kGemvMaxClusterSplits) + "]");
  }
  int device = 0, supported = 0;
  GPUOPT_CUDA_TRY(cudaGetDevice(&device));
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device));
  if (supported == 0) return 0;
  if (input == GemvInput::kHalf) {
    if (output == GemvOutput::kHalf) {
      return active_clusters_rows<GemvInput::kHalf, GemvOutput::kHalf>(splits);
    }
    if (output == GemvOutput::kResidual) {
      return active_clusters_rows<GemvInput::kHalf, GemvOutput::kResidual>(splits);
    }
  } else {
    if (output == GemvOutput::kHalf) {
      return active_clusters_rows<GemvInput::kNormed, GemvOutput::kHalf>(splits);
    }
    if (output == GemvOutput::kSiluPair) {
      return active_clusters_rows<GemvInput::kNormed, GemvOutput::kSiluPair>(splits);
    }
  }
  return invalid_argument("LLM decode GEMM: this input and output pair is not built");
}

}  // namespace gpuopt::pipeline::llm_detail
