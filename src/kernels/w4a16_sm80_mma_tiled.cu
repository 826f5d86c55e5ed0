// The original W4A16 tensor-core kernels (mma.sync m16n8k16, sm_80+): x rows as the mma A operand,
// or the weights as A (swapped, small M), shared-memory stages filled by cp.async (or, on Hopper,
// bulk copies), stream-K over all SMs. W4A16Gemm runs them where the direct and wgmma kernels do
// not apply (deterministic mode, M > 16 without sm_90a code). Layout and design:
// docs/w4a16-gemm.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_device.cuh"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels::w4a16_detail {
namespace {

// ---- the tensor-core kernel ----

// n / d for n < 2^31 with a multiply-high instead of a division (d is fixed per launch).
struct FastDivisor {
  std::uint32_t divisor = 1, multiplier = 1, shift = 0;
  FastDivisor() = default;
  explicit FastDivisor(std::uint32_t d) : divisor(d) {
    while ((1ull << shift) < d) ++shift;
    multiplier = static_cast<std::uint32_t>(((1ull << 32) * ((1ull << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int divide(int n) const {
    const std::uint32_t t = __umulhi(static_cast<std::uint32_t>(n), multiplier);
    return static_cast<int>((t + static_cast<std::uint32_t>(n)) >> shift);
  }
};

struct KernelParams {
  const void* x;  // [M][K]
  void* y;        // [M][N]
  const uint4* tiles;
  const std::uint16_t* scales;
  const std::uint8_t* zeros;  // null: symmetric
  float* partial;             // [M][N] fp32, zero between runs
  int* counters;              // [tiles], zero between runs
  int m, n, k, group_size;
  int m_blocks, n_blocks;
  FastDivisor group_divisor;
  FastDivisor m_block_divisor;
  int iterations_per_tile;
  int total_iterations;
  int splits;  // > 0: deterministic, block b is split b % splits of tile b / splits
};

// kSwap = false: x rows are the mma A operand (kMTiles m16 tiles of 16 rows) and the weights B
// (8 n8 tiles per warp strip). kSwap = true (small M): the weights are A (4 m16 tiles of 16
// columns per strip, built from the same B fragments: {b0(j), b0(j+1), b1(j), b1(j+1)}) and x is
// B (kMTiles n8 tiles of 8 rows), so M <= 8 needs half the mma instructions and accumulators.
// kStageTiles k16 tiles per stage (kStageK = 64 or, Hopper bulk path, 128 when group_size is a
// multiple of 64 so that a stage spans at most 2 groups).
template <bool kSwap_, int kWarpsN_, int kWarpsK_, int kMTiles_, int kStages_, int kStageTiles_ = 4>
struct Geometry {
  static constexpr bool kSwap = kSwap_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarpsK = kWarpsK_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kStages = kStages_;
  static constexpr int kStageTiles = kStageTiles_;
  static constexpr int kStageK = kStageTiles * kTileK;
  static constexpr int kAPitch = kStageK + 8;  // halves; the 16-byte skew: conflict-free ldmatrix
  static constexpr int kScaleRows = kStageTiles == 4 ? 4 : 2;  // groups a stage spans at most
  static constexpr int kThreads = 32 * kWarpsN * kWarpsK;
  static constexpr int kBlockN = kTileN * kWarpsN;
  static constexpr int kTilesPerWarp = kStageK / kTileK / kWarpsK;  // k16 tiles a warp does a stage
  static constexpr int kRows = (kSwap ? 8 : 16) * kMTiles;
  static constexpr int kXRegs = (kSwap ? 2 : 4) * kMTiles;  // x fragment registers per k16 tile
  static constexpr int kWeightBytes = (kStageK / kTileK) * kWarpsN * kTileBytes;
  static constexpr int kActivationBytes = kRows * kAPitch * 2;
  static constexpr int kScaleBytes = kScaleRows * kBlockN * 2;
  static constexpr int kZeroBytes = kScaleRows * kBlockN;
  static constexpr int kStageBytes = kWeightBytes + kActivationBytes + kScaleBytes + kZeroBytes;
  static constexpr int kAccumulators = kMTiles * (kSwap ? 4 : 8) * 4;
  static constexpr int kGroupAccumulators = kSwap ? kAccumulators : 1;
  static constexpr int kReductionBytes = (kWarpsK - 1) * kWarpsN * 32 * kAccumulators * 4;
  static constexpr int kSharedBytes = kStages * kStageBytes + kReductionBytes;
  static_assert(kTilesPerWarp >= 1 && kTilesPerWarp * kWarpsK * kTileK == kStageK);
  // Weight copies of a stage: 16-byte chunks per thread (cp.async path).
  static constexpr int kWeightChunks = kWeightBytes / 16;
  static constexpr int kWeightCopies = (kWeightChunks + kThreads - 1) / kThreads;
};

// The tile scheduler: where a k-stage (global iteration) sits, advanced one stage at a time so the
// loop divides only at tile changes.
struct Position {
  int tile, kk, n_block, m_block;
};
__device__ __forceinline__ Position position_of(const KernelParams& params, int it) {
  const int ipt = params.iterations_per_tile;
  Position p;
  p.tile = it / ipt;
  p.kk = it - p.tile * ipt;
  p.n_block = params.m_block_divisor.divide(p.tile);
  p.m_block = p.tile - p.n_block * params.m_blocks;
  return p;
}
__device__ __forceinline__ void advance(const KernelParams& params, Position& p) {
  if (++p.kk == params.iterations_per_tile) {
    p.kk = 0;
    ++p.tile;
    if (++p.m_block == params.m_blocks) {
      p.m_block = 0;
      ++p.n_block;
    }
  }
}

// The producer's per-thread state, fixed for the whole kernel: the L2 policy of the weights and
// this thread's parts of the weight chunk addresses. The state lives in the kernel's own variables
// and this names them (as a lambda's captures would): a struct holding the values gave different
// SASS (other register assignments and a few more instructions).
template <typename G>
struct StageLoader {
  std::uint64_t& policy;
  std::uint32_t (&weight_offset)[G::kWeightCopies];
};
template <typename G>
__device__ __forceinline__ void init_stage_loader(const KernelParams& params, int thread,
                                                  StageLoader<G>& loader) {
  static_assert(G::kWeightChunks % G::kThreads == 0);
  const int k_tiles_total = params.k / kTileK;
#pragma unroll
  for (int i = 0; i < G::kWeightCopies; ++i) {
    const int c = thread + i * G::kThreads;
    const int kt = c / (G::kWarpsN * 32);
    const int rest = c - kt * (G::kWarpsN * 32);
    loader.weight_offset[i] =
        static_cast<std::uint32_t>(((rest / 32) * k_tiles_total + kt) * 32 + rest % 32);
  }
}

// Issues the cp.async copies of stage p (one k-stage of one output tile) into `slot`.
template <typename T, typename G>
__device__ __forceinline__ void load_stage(const KernelParams& params, const StageLoader<G>& loader,
                                           unsigned char* shared, int thread, const Position& p,
                                           int slot) {
  constexpr int kStageK = G::kStageK;
  const int k_tiles_total = params.k / kTileK;
  const int strips = params.n / kTileN;
  const T* x = static_cast<const T*>(params.x);
  const int kk = p.kk;
  const int n_block = p.n_block;
  const int m_block = p.m_block;
  const int k0 = kk * kStageK;
  unsigned char* base = shared + slot * G::kStageBytes;
  uint4* weights = reinterpret_cast<uint4*>(base);
  const uint4* source_base =
      params.tiles +
      (static_cast<std::size_t>(n_block) * G::kWarpsN * k_tiles_total + kk * (kStageK / kTileK)) *
          32;
#pragma unroll
  for (int i = 0; i < G::kWeightCopies; ++i) {
    copy_async_16_streaming(weights + thread + i * G::kThreads,
                            source_base + loader.weight_offset[i], loader.policy);
  }
  T* activations = reinterpret_cast<T*>(base + G::kWeightBytes);
  // Only rows < M are copied: the rows past M hold stale data, which reaches only output rows
  // that are never stored (an mma output element depends on its own A row and B column).
  const int activation_chunks = min(G::kRows, params.m - m_block * G::kRows) * (kStageK / 8);
  for (int c = thread; c < activation_chunks; c += G::kThreads) {
    const int r = c / (kStageK / 8);
    const int col = c % (kStageK / 8);
    const int row = m_block * G::kRows + r;
    copy_async_16(activations + r * G::kAPitch + col * 8,
                  x + static_cast<std::size_t>(row) * params.k + k0 + col * 8, true);
  }
  const int first_group = params.group_divisor.divide(k0);
  const int group_rows = params.group_divisor.divide(k0 + kStageK - 1) - first_group + 1;
  std::uint16_t* scales =
      reinterpret_cast<std::uint16_t*>(base + G::kWeightBytes + G::kActivationBytes);
  const int scale_chunks = group_rows * G::kWarpsN * 8;
  for (int c = thread; c < scale_chunks; c += G::kThreads) {
    const int r = c / (G::kWarpsN * 8);
    const int rest = c - r * (G::kWarpsN * 8);
    const std::size_t offset =
        (static_cast<std::size_t>(first_group + r) * strips + n_block * G::kWarpsN) * kTileN +
        rest * 8;
    copy_async_16(scales + r * G::kBlockN + rest * 8, params.scales + offset, true);
  }
  if (params.zeros != nullptr) {
    std::uint8_t* zeros = reinterpret_cast<std::uint8_t*>(base + G::kWeightBytes +
                                                          G::kActivationBytes + G::kScaleBytes);
    const int zero_chunks = group_rows * G::kWarpsN * 4;
    for (int c = thread; c < zero_chunks; c += G::kThreads) {
      const int r = c / (G::kWarpsN * 4);
      const int rest = c - r * (G::kWarpsN * 4);
      const std::size_t offset =
          (static_cast<std::size_t>(first_group + r) * strips + n_block * G::kWarpsN) * kTileN +
          rest * 16;
      copy_async_16(zeros + r * G::kBlockN + rest * 16, params.zeros + offset, true);
    }
  }
}

// kBulk (Hopper): warp 0 fills a stage with one bulk copy per contiguous chunk (a strip's k16
// tiles, an x row, a group row of scales or zeros); weights land strip-major
// ([strip][tile][lane]); a block barrier per stage protects a slot until every warp has read it.
template <typename T, typename G>
__device__ __forceinline__ void load_stage_bulk(const KernelParams& params,
                                                const StageLoader<G>& loader, unsigned char* shared,
                                                std::uint64_t* full, int lane, const Position& p,
                                                int slot) {
  constexpr int kStageK = G::kStageK;
  const int k_tiles_total = params.k / kTileK;
  const int strips = params.n / kTileN;
  const T* x = static_cast<const T*>(params.x);
  const int k0 = p.kk * kStageK;
  unsigned char* base = shared + slot * G::kStageBytes;
  const int rows = min(G::kRows, params.m - p.m_block * G::kRows);
  const int first_group = params.group_divisor.divide(k0);
  const int group_rows = params.group_divisor.divide(k0 + kStageK - 1) - first_group + 1;
  const int zero_rows = params.zeros != nullptr ? group_rows : 0;
  if (lane == 0) {
    barrier_arrive_expect(&full[slot], G::kWeightBytes + rows * kStageK * 2 +
                                           group_rows * G::kBlockN * 2 + zero_rows * G::kBlockN);
  }
  __syncwarp();
  const int copies = G::kWarpsN + rows + group_rows + zero_rows;
  for (int c = lane; c < copies; c += 32) {
    if (c < G::kWarpsN) {
      constexpr int kStripBytes = G::kStageTiles * kTileBytes;
      const uint4* source =
          params.tiles + (static_cast<std::size_t>(p.n_block * G::kWarpsN + c) * k_tiles_total +
                          p.kk * G::kStageTiles) *
                             32;
      bulk_copy(base + c * kStripBytes, source, kStripBytes, &full[slot], loader.policy);
    } else if (c < G::kWarpsN + rows) {
      const int r = c - G::kWarpsN;
      const std::size_t row = static_cast<std::size_t>(p.m_block * G::kRows + r);
      bulk_copy(base + G::kWeightBytes + r * G::kAPitch * 2, x + row * params.k + k0, kStageK * 2,
                &full[slot]);
    } else if (c < G::kWarpsN + rows + group_rows) {
      const int r = c - G::kWarpsN - rows;
      const std::size_t offset =
          (static_cast<std::size_t>(first_group + r) * strips + p.n_block * G::kWarpsN) * kTileN;
      bulk_copy(base + G::kWeightBytes + G::kActivationBytes + r * G::kBlockN * 2,
                params.scales + offset, G::kBlockN * 2, &full[slot], loader.policy);
    } else {
      const int r = c - G::kWarpsN - rows - group_rows;
      const std::size_t offset =
          (static_cast<std::size_t>(first_group + r) * strips + p.n_block * G::kWarpsN) * kTileN;
      bulk_copy(base + G::kWeightBytes + G::kActivationBytes + G::kScaleBytes + r * G::kBlockN,
                params.zeros + offset, G::kBlockN, &full[slot], loader.policy);
    }
  }
}

// The consumer's quantization-group state: per-thread scale and (magic + zero) for its 8 columns,
// reloaded when the group changes. Swapped kernel: the mma takes the exact (q - zero) and the
// scale is applied in fp32 once per group (16 FFMA per group instead of 16 HMUL2 per k16 tile),
// so the group's sums are kept apart in the group accumulators until the group ends. The kernel's
// variables, named as StageLoader names the producer's.
template <typename T>
struct GroupState {
  using Pair = typename TypeTraits<T>::Pair;
  Pair (&scale_pairs)[8];
  std::uint32_t (&zero_pairs)[8];
  Pair (&zero_pairs_high)[8];  // fp16 only: -(64 + zero), for nibbles read at 16x (see below)
  float (&scales_f32)[8];
  int& current_group;
};

// accumulators += scale * group_accumulators; group_accumulators = 0. Element (tt, w, e) is
// column 16w + 8(e/2) + g, whose scale is scales_f32[2w + e/2].
template <typename T, typename G>
__device__ __forceinline__ void apply_group(const GroupState<T>& state,
                                            float (&accumulators)[G::kAccumulators],
                                            float (&group_accumulators)[G::kGroupAccumulators]) {
  if constexpr (G::kSwap) {
#pragma unroll
    for (int i = 0; i < G::kAccumulators; ++i) {
      const int w = (i / 4) % 4;
      const int e = i % 4;
      accumulators[i] =
          fmaf(state.scales_f32[2 * w + e / 2], group_accumulators[i], accumulators[i]);
      group_accumulators[i] = 0.0f;
    }
  }
}

// The main loop's math on the stage in `slot` (k-stage kk of its tile): this warp's k16 tiles of
// it, dequantised and multiplied into the accumulators (swapped: the group accumulators).
template <typename T, typename G, int kBulk>
__device__ __forceinline__ void compute_stage(const KernelParams& params,
                                              const unsigned char* shared, int warp_n, int warp_k,
                                              int lane, int lane_group, int kk, int slot,
                                              GroupState<T>& state,
                                              float (&accumulators)[G::kAccumulators],
                                              float (&group_accumulators)[G::kGroupAccumulators]) {
  using Pair = typename TypeTraits<T>::Pair;
  constexpr int kSwap = G::kSwap;
  constexpr int kMTiles = G::kMTiles;
  constexpr int kStageK = G::kStageK;
  constexpr int kAPitch = G::kAPitch;
  const int k0 = kk * kStageK;
  const int first_group = params.group_divisor.divide(k0);
  const bool one_group = params.group_divisor.divide(k0 + kStageK - 1) == first_group;
  const unsigned char* base = shared + slot * G::kStageBytes;
  const uint4* weights = reinterpret_cast<const uint4*>(base);
  const T* activations = reinterpret_cast<const T*>(base + G::kWeightBytes);
  const std::uint16_t* scales =
      reinterpret_cast<const std::uint16_t*>(base + G::kWeightBytes + G::kActivationBytes);
  const std::uint8_t* zeros = reinterpret_cast<const std::uint8_t*>(
      base + G::kWeightBytes + G::kActivationBytes + G::kScaleBytes);
  // Every shared-memory read of this stage is issued first, so their latencies overlap and the
  // dequantise + mma of a tile does not wait on its own loads.
  uint4 packed[G::kTilesPerWarp];
  std::uint32_t x_fragments[G::kTilesPerWarp][G::kXRegs];
#pragma unroll
  for (int i = 0; i < G::kTilesPerWarp; ++i) {
    const int kt = warp_k * G::kTilesPerWarp + i;
    packed[i] = kBulk ? weights[(warp_n * G::kStageTiles + kt) * 32 + lane]
                      : weights[(kt * G::kWarpsN + warp_n) * 32 + lane];
    if constexpr (kSwap) {
      // B fragments of x: matrix 0 = tokens 0-7 at k 0-7, 1 = same tokens at k 8-15, 2 and 3 =
      // the next 8 tokens; thread (g, c) gets token g, k 2c and 2c+1.
      const int row = 8 * (lane / 16) + lane % 8;
      const int col = kt * kTileK + ((lane / 8) % 2) * 8;
      if constexpr (kMTiles == 1) {
        load_matrix_x2(x_fragments[i], activations + row * kAPitch + col);
      } else {
#pragma unroll
        for (int p = 0; p < kMTiles / 2; ++p) {
          load_matrix_x4(x_fragments[i] + 4 * p, activations + (16 * p + row) * kAPitch + col);
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        load_matrix_x4(x_fragments[i] + 4 * mt, activations + (mt * 16 + lane % 16) * kAPitch +
                                                    kt * kTileK + (lane / 16) * 8);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < G::kTilesPerWarp; ++i) {
    const int kt = warp_k * G::kTilesPerWarp + i;
    const int group = one_group ? first_group : params.group_divisor.divide(k0 + kt * kTileK);
    if (group != state.current_group) {
      if (kSwap && state.current_group >= 0) {
        apply_group<T, G>(state, accumulators, group_accumulators);
      }
      state.current_group = group;
      const int row = group - first_group;
      const uint4 s = *reinterpret_cast<const uint4*>(scales + row * G::kBlockN + warp_n * kTileN +
                                                      lane_group * 8);
      const std::uint32_t s_words[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t half_bits = (s_words[j / 2] >> (16 * (j % 2))) & 0xffffu;
        if constexpr (kSwap) {
          state.scales_f32[j] = bits_to_float<T>(half_bits);
        } else {
          state.scale_pairs[j] = as_pair<Pair>(half_bits | (half_bits << 16));
        }
      }
      if (params.zeros != nullptr) {
        const uint2 z = *reinterpret_cast<const uint2*>(zeros + row * G::kBlockN + warp_n * kTileN +
                                                        lane_group * 8);
        const std::uint32_t z_words[2] = {z.x, z.y};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const std::uint32_t zero = (z_words[j / 4] >> (8 * (j % 4))) & 0xfu;
          state.zero_pairs[j] = TypeTraits<T>::kMagic | (zero * 0x00010001u);
          if constexpr (std::is_same_v<T, __half>) {
            state.zero_pairs_high[j] = __float2half2_rn(-64.0f - static_cast<float>(zero));
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          state.zero_pairs[j] = TypeTraits<T>::kMagic | 0x00080008u;
          if constexpr (std::is_same_v<T, __half>) {
            state.zero_pairs_high[j] = __float2half2_rn(-72.0f);
          }
        }
      }
    }
    const std::uint32_t words[4] = {packed[i].x, packed[i].y, packed[i].z, packed[i].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      std::uint32_t b[4];
      if constexpr (std::is_same_v<T, __half>) {
        // fp16: nibbles at bits 4-7 are taken in place as 1024 + 16q, then q - zero =
        // (1024 + 16q) / 16 - (64 + zero) in one exact fma; one shift serves 4 nibbles.
        const Pair one_sixteenth = __float2half2_rn(0.0625f);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int j = 2 * w + half;
          const std::uint32_t word = words[w] >> (8 * half);
          const Pair low = as_pair<Pair>(and_or(word, 0x000f000fu, TypeTraits<T>::kMagic));
          const Pair high = as_pair<Pair>(and_or(word, 0x00f000f0u, TypeTraits<T>::kMagic));
          const Pair low_value = __hsub2(low, as_pair<Pair>(state.zero_pairs[j]));
          const Pair high_value = __hfma2(high, one_sixteenth, state.zero_pairs_high[j]);
          if constexpr (kSwap) {
            b[2 * half] = as_bits(low_value);
            b[2 * half + 1] = as_bits(high_value);
          } else {
            b[2 * half] = as_bits(__hmul2(low_value, state.scale_pairs[j]));
            b[2 * half + 1] = as_bits(__hmul2(high_value, state.scale_pairs[j]));
          }
        }
      } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int j = 2 * w + s / 2;
          const Pair raw =
              as_pair<Pair>(and_or(words[w] >> (4 * s), 0x000f000fu, TypeTraits<T>::kMagic));
          // (magic + q) - (magic + zero) is exact; one rounding in the scale multiply.
          const Pair value = __hsub2(raw, as_pair<Pair>(state.zero_pairs[j]));
          b[s] = kSwap ? as_bits(value) : as_bits(__hmul2(value, state.scale_pairs[j]));
        }
      }
      // b = {b0(2w), b1(2w), b0(2w+1), b1(2w+1)}.
      if constexpr (kSwap) {
        const std::uint32_t a[4] = {b[0], b[2], b[1], b[3]};
#pragma unroll
        for (int tt = 0; tt < kMTiles; ++tt) {
          mma_16816<T>(group_accumulators + (tt * 4 + w) * 4, a, x_fragments[i][2 * tt],
                       x_fragments[i][2 * tt + 1]);
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(accumulators + (mt * 8 + 2 * w) * 4, x_fragments[i] + 4 * mt, b[0], b[1]);
          mma_16816<T>(accumulators + (mt * 8 + 2 * w + 1) * 4, x_fragments[i] + 4 * mt, b[2],
                       b[3]);
        }
      }
    }
  }
}

// Sums the k-warps' accumulators into warp_k 0's through shared memory (`reduction`).
template <typename G>
__device__ __forceinline__ void reduce_warps_k(float* reduction, int warp_n, int warp_k, int lane,
                                               float (&accumulators)[G::kAccumulators]) {
  if constexpr (G::kWarpsK > 1) {
    if (warp_k > 0) {
      float* mine = reduction + ((warp_k - 1) * G::kWarpsN + warp_n) * 32 * G::kAccumulators;
#pragma unroll
      for (int i = 0; i < G::kAccumulators; ++i) mine[i * 32 + lane] = accumulators[i];
    }
    __syncthreads();
    if (warp_k == 0) {
      for (int other = 1; other < G::kWarpsK; ++other) {
        const float* theirs =
            reduction + ((other - 1) * G::kWarpsN + warp_n) * 32 * G::kAccumulators;
#pragma unroll
        for (int i = 0; i < G::kAccumulators; ++i) accumulators[i] += theirs[i * 32 + lane];
      }
    }
  }
}

// The epilogue of a segment of tile p (warp_k 0): its sums are stored to y when the segment is the
// whole tile, else written to this split's workspace slice (deterministic) or added into the
// workspace.
template <typename T, typename G>
__device__ __forceinline__ void store_segment(const KernelParams& params, int warp_n, int warp_k,
                                              int lane, int lane_group, const Position& p,
                                              bool whole_tile,
                                              const float (&accumulators)[G::kAccumulators]) {
  using Pair = typename TypeTraits<T>::Pair;
  const int n_block = p.n_block;
  const int m_block = p.m_block;
  T* y = static_cast<T*>(params.y);
  if (G::kSwap && warp_k == 0) {
    // c0, c1: column 16w + g, tokens 2c and 2c+1; c2, c3: column 16w + 8 + g.
#pragma unroll
    for (int tt = 0; tt < G::kMTiles; ++tt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m_block * G::kRows + tt * 8 + 2 * (lane % 4) + e % 2;
        if (row >= params.m) continue;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int col =
              n_block * G::kBlockN + warp_n * kTileN + 16 * w + 8 * (e / 2) + lane_group;
          const float v = accumulators[(tt * 4 + w) * 4 + e];
          const std::size_t index = static_cast<std::size_t>(row) * params.n + col;
          if (whole_tile) {
            y[index] = float_to_value<T>(v);
          } else if (params.splits > 0) {
            const std::size_t slice =
                static_cast<std::size_t>(blockIdx.x % params.splits) * params.m * params.n;
            __stcg(params.partial + slice + index, v);
          } else {
            atomicAdd(params.partial + index, v);
          }
        }
      }
    }
  }
  if (!G::kSwap && warp_k == 0) {
#pragma unroll
    for (int mt = 0; mt < G::kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m_block * G::kRows + mt * 16 + lane_group + 8 * half;
        if (row >= params.m) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = n_block * G::kBlockN + warp_n * kTileN + 8 * j + 2 * (lane % 4);
          const float v0 = accumulators[(mt * 8 + j) * 4 + 2 * half];
          const float v1 = accumulators[(mt * 8 + j) * 4 + 2 * half + 1];
          const std::size_t index = static_cast<std::size_t>(row) * params.n + col;
          if (whole_tile) {
            *reinterpret_cast<Pair*>(y + index) = float2_to_pair<T>(v0, v1);
          } else if (params.splits > 0) {
            // Deterministic: this split's own slice, no atomics; summed in split order below.
            const std::size_t slice =
                static_cast<std::size_t>(blockIdx.x % params.splits) * params.m * params.n;
            __stcg(reinterpret_cast<float2*>(params.partial + slice + index), make_float2(v0, v1));
          } else {
            atomicAdd(params.partial + index, v0);
            atomicAdd(params.partial + index + 1, v1);
          }
        }
      }
    }
  }
}

// The fix-up of a segment that was not the whole tile: the block whose stages complete the tile
// (`length` of them here) converts it and leaves the workspace zeroed. is_last_block: a __shared__
// flag of the block.
template <typename T, typename G>
__device__ __forceinline__ void fix_up_segment(const KernelParams& params, int thread,
                                               const Position& p, int length, int& is_last_block) {
  const int tile = p.tile;
  const int n_block = p.n_block;
  const int m_block = p.m_block;
  const int ipt = params.iterations_per_tile;
  T* y = static_cast<T*>(params.y);
  __threadfence();
  __syncthreads();
  if (thread == 0) {
    const int before = atomicAdd(params.counters + tile, length);
    is_last_block = before + length == ipt;
    if (is_last_block) params.counters[tile] = 0;
  }
  __syncthreads();
  if (is_last_block) {
    __threadfence();
    const int rows = min(G::kRows, params.m - m_block * G::kRows);
    const int quads = rows * (G::kBlockN / 4);
    // Deterministic (splits > 0): each quad adds its split slices in split order.
    auto index_of = [&](int q) {
      const int r = q / (G::kBlockN / 4);
      const int c4 = q - r * (G::kBlockN / 4);
      return static_cast<std::size_t>(m_block * G::kRows + r) * params.n + n_block * G::kBlockN +
             c4 * 4;
    };
    fix_up_tile<T, G::kThreads, 4>(thread, quads, index_of, params.partial,
                                   static_cast<std::size_t>(params.m) * params.n,
                                   params.splits > 0 ? params.splits : 1, params.splits == 0, y);
  }
}

// kMinBlocks 2 for small M: at most 128 registers so two blocks share an SM (decode is
// latency-bound).
template <typename T, bool kSwap, int kWarpsN, int kWarpsK, int kMTiles, int kStages,
          int kMinBlocks, int kStageTiles = 4, int kBulk = 0>
__global__ void __launch_bounds__(32 * kWarpsN * kWarpsK, kMinBlocks)
    k_w4a16_gemm(const KernelParams params) {
  using G = Geometry<kSwap, kWarpsN, kWarpsK, kMTiles, kStages, kStageTiles>;
  extern __shared__ __align__(16) unsigned char shared[];

  const int thread = threadIdx.x;
  const int lane = thread % 32;
  const int warp = thread / 32;
  const int warp_n = warp % kWarpsN;
  const int warp_k = warp / kWarpsN;
  const int ipt = params.iterations_per_tile;

  const long long total = params.total_iterations;
  const int begin = static_cast<int>(total * blockIdx.x / gridDim.x);
  const int end = static_cast<int>(total * (blockIdx.x + 1) / gridDim.x);
  if (begin >= end) return;

  std::uint64_t policy = evict_first_policy();
  std::uint32_t weight_offset[G::kWeightCopies];
  StageLoader<G> loader{policy, weight_offset};
  init_stage_loader<G>(params, thread, loader);
  __shared__ __align__(8) std::uint64_t full[kBulk ? kStages : 1];

  // Not swapped: [m-tile][n8 tile j][4]; swapped: [token tile][m16 tile w][4].
  float accumulators[G::kAccumulators];
#pragma unroll
  for (int i = 0; i < G::kAccumulators; ++i) accumulators[i] = 0.0f;
  using Pair = typename TypeTraits<T>::Pair;
  Pair scale_pairs[8];
  std::uint32_t zero_pairs[8];
  Pair zero_pairs_high[8];
  float scales_f32[8];
  int current_group = -1;
  GroupState<T> state{scale_pairs, zero_pairs, zero_pairs_high, scales_f32, current_group};
  float group_accumulators[G::kGroupAccumulators];
  if constexpr (kSwap) {
#pragma unroll
    for (int i = 0; i < G::kAccumulators; ++i) group_accumulators[i] = 0.0f;
  }
  // The B-fragment column within each n8 tile, computed here once: computed inside compute_stage,
  // it moved into the main loop and ptxas allocated the loop differently.
  const int lane_group = lane / 4;

  float* reduction = reinterpret_cast<float*>(shared + kStages * G::kStageBytes);
  __shared__ int is_last_block;

  // Prologue: kStages-1 stages in flight before the first compute.
  Position load_position = position_of(params, begin);
  Position compute_position = load_position;
  if constexpr (kBulk) {
    if (thread < kStages) barrier_init(&full[thread], 1);
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (begin + s < end) {
        if (warp == 0) load_stage_bulk<T, G>(params, loader, shared, full, lane, load_position, s);
        advance(params, load_position);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (begin + s < end) {
        load_stage<T, G>(params, loader, shared, thread, load_position, s);
        advance(params, load_position);
      }
      copy_async_commit();
    }
  }
  int segment_start = begin;
  int read_slot = 0;
  int write_slot = kStages - 1;
  std::uint32_t phases = 0;  // bulk: bit s = parity of slot s's next fill
  // The main loop: one k-stage per trip; a segment (this block's stages of one tile) ends in the
  // epilogue and fix-up.
  for (int it = begin; it < end; ++it) {
    if constexpr (kBulk) {
      barrier_wait(&full[read_slot], (phases >> read_slot) & 1u);
      phases ^= 1u << read_slot;
      // Every warp is done with write_slot (read last iteration) before it is refilled.
      __syncthreads();
      if (it + kStages - 1 < end) {
        if (warp == 0) {
          load_stage_bulk<T, G>(params, loader, shared, full, lane, load_position, write_slot);
        }
        advance(params, load_position);
      }
    } else {
      copy_async_wait<kStages - 2>();
      __syncthreads();
      if (it + kStages - 1 < end) {
        load_stage<T, G>(params, loader, shared, thread, load_position, write_slot);
        advance(params, load_position);
      }
      copy_async_commit();
    }
    write_slot = write_slot + 1 == kStages ? 0 : write_slot + 1;
    compute_stage<T, G, kBulk>(params, shared, warp_n, warp_k, lane, lane_group,
                               compute_position.kk, read_slot, state, accumulators,
                               group_accumulators);
    read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
    if (compute_position.kk + 1 == ipt || it + 1 == end) {
      const int length = it + 1 - segment_start;
      if (kSwap && state.current_group >= 0) {
        apply_group<T, G>(state, accumulators, group_accumulators);
      }
      reduce_warps_k<G>(reduction, warp_n, warp_k, lane, accumulators);
      store_segment<T, G>(params, warp_n, warp_k, lane, lane_group, compute_position, length == ipt,
                          accumulators);
      if (length != ipt) {
        fix_up_segment<T, G>(params, thread, compute_position, length, is_last_block);
      }
#pragma unroll
      for (int i = 0; i < G::kAccumulators; ++i) accumulators[i] = 0.0f;
      state.current_group = -1;
      segment_start = it + 1;
    }
    advance(params, compute_position);
  }
  if constexpr (!kBulk) copy_async_wait<0>();
}

// ---- configuration ----

using KernelFunction = void (*)(KernelParams);

struct Variant {
  KernelFunction function;
  bool swapped;
  int m_tiles, rows, warps_n, warps_k, stages, threads, stage_k;
  std::size_t shared_bytes;
};

template <typename T, bool kSwap, int kWarpsN, int kWarpsK, int kMTiles, int kStages,
          int kMinBlocks, int kStageTiles = 4, int kBulk = 0>
Variant make_variant() {
  using G = Geometry<kSwap, kWarpsN, kWarpsK, kMTiles, kStages, kStageTiles>;
  return Variant{
      &k_w4a16_gemm<T, kSwap, kWarpsN, kWarpsK, kMTiles, kStages, kMinBlocks, kStageTiles, kBulk>,
      kSwap,
      kMTiles,
      G::kRows,
      kWarpsN,
      kWarpsK,
      kStages,
      G::kThreads,
      G::kStageK,
      static_cast<std::size_t>(G::kSharedBytes)};
}

// x-rows kernel: stages per m-tile count, 2 blocks/SM fit for 1-2 m-tiles, one deep pipeline
// for 4. Swapped (weights as A) kernel for small M: 8, 16 or 32 rows a block, and at most ~97 KB
// of shared memory up to 16 rows so that sm_86/89 can run it too; with `bulk_k128` (the 4-strip-
// wide kernel at M <= 16 only) Hopper bulk copies into 128-k stages, a block barrier per stage.
template <typename T>
Variant select_variant(bool swapped, int m_tiles, bool wide, bool bulk_k128) {
  if (swapped) {
    if (wide) {
      // 4 warps, each all four k16 tiles of a stage (the per-stage work amortised over 4 tiles),
      // 4 blocks (16 warps) per SM with 3 stages in flight each.
      if (bulk_k128 && m_tiles == 1) return make_variant<T, true, 4, 1, 1, 3, 3, 8, 1>();
      if (bulk_k128 && m_tiles == 2) return make_variant<T, true, 4, 1, 2, 3, 3, 8, 1>();
      if (m_tiles == 1) return make_variant<T, true, 4, 1, 1, 4, 4>();
      if (m_tiles == 2) return make_variant<T, true, 4, 1, 2, 4, 3>();
      return make_variant<T, true, 4, 2, 4, 6, 1>();
    }
    if (m_tiles == 1) return make_variant<T, true, 1, 4, 1, 7, 2>();
    if (m_tiles == 2) return make_variant<T, true, 1, 4, 2, 6, 2>();
    return make_variant<T, true, 1, 4, 4, 6, 1>();
  }
  if (wide) {
    if (m_tiles == 1) return make_variant<T, false, 4, 2, 1, 6, 2>();
    if (m_tiles == 2) return make_variant<T, false, 4, 2, 2, 4, 1>();
    return make_variant<T, false, 4, 2, 4, 6, 1>();
  }
  if (m_tiles == 1) return make_variant<T, false, 1, 4, 1, 6, 2>();
  if (m_tiles == 2) return make_variant<T, false, 1, 4, 2, 4, 1>();
  return make_variant<T, false, 1, 4, 4, 6, 1>();
}

Variant variant_for(ActivationType type, bool swapped, int m_tiles, bool wide,
                    W4A16Pipeline pipeline = W4A16Pipeline::kCpAsync) {
  const bool bulk_k128 = pipeline == W4A16Pipeline::kBulkK128;
  return type == ActivationType::kFloat16
             ? select_variant<__half>(swapped, m_tiles, wide, bulk_k128)
             : select_variant<__nv_bfloat16>(swapped, m_tiles, wide, bulk_k128);
}

// The swapped kernel's copy pipeline on this device (W4A16Config::pipeline). Bulk copies need
// sm_90 code (not PTX JIT'd from an older arch) and, in their 128-k stages, the 4-strip-wide kernel
// with K % 128 == 0 and groups of a multiple of 64 (a stage then spans at most two groups), at
// M <= 16. Default: bulk at M = 1 on large layers, where the H200 measured 3-5 % less time than
// cp.async; cp.async elsewhere (bulk was slower at M = 8 and 16, and is unmeasured on small
// layers; docs/w4a16-gemm.md). W4A16Tuning::pipeline picks one where it applies, to compare them.
StatusOr<W4A16Pipeline> swapped_pipeline(const W4A16DeviceWeights& w, int m, int m_tiles, bool wide,
                                         int device, const W4A16Tuning& tuning) {
  int major = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9 || m_tiles > 2) return W4A16Pipeline::kCpAsync;
  const bool k128 = wide && w.k % 128 == 0 && w.group_size % 64 == 0;
  const bool large = static_cast<long long>(w.k) * w.n >= (1ll << 27);
  W4A16Pipeline pipeline = tuning.pipeline.value_or(
      m == 1 && k128 && large ? W4A16Pipeline::kBulkK128 : W4A16Pipeline::kCpAsync);
  if (!k128) pipeline = W4A16Pipeline::kCpAsync;
  if (pipeline != W4A16Pipeline::kCpAsync) {
    cudaFuncAttributes attributes{};
    GPUOPT_CUDA_TRY(cudaFuncGetAttributes(
        &attributes, reinterpret_cast<const void*>(
                         variant_for(w.type, true, m_tiles, wide, pipeline).function)));
    if (attributes.binaryVersion < 90) pipeline = W4A16Pipeline::kCpAsync;
  }
  return pipeline;
}

}  // namespace

std::size_t tiled_shared_bytes(ActivationType type, bool swapped, int m_tiles, bool wide) {
  return variant_for(type, swapped, m_tiles, wide).shared_bytes;
}

StatusOr<int> plan_tiled(const W4A16DeviceWeights& w, int m, bool swapped, int m_tiles, bool wide,
                         int device, int sms, const W4A16Options& options, W4A16Config& config) {
  config.kernel = swapped ? W4A16Kernel::kSwapped : W4A16Kernel::kXRows;
  config.m_tiles = m_tiles;
  config.swapped = swapped;
  if (swapped) {
    GPUOPT_ASSIGN_OR_RETURN(config.pipeline,
                            swapped_pipeline(w, m, m_tiles, wide, device, options.tuning));
  }
  const Variant variant = variant_for(w.type, swapped, config.m_tiles, wide, config.pipeline);
  config.block_m = variant.rows;
  config.block_n = variant.warps_n * kTileN;
  config.threads = variant.threads;
  config.stages = variant.stages;
  config.shared_bytes = variant.shared_bytes;
  const int m_blocks = (m + config.block_m - 1) / config.block_m;
  config.tiles = m_blocks * (w.n / config.block_n);
  config.iterations = config.tiles * (w.k / variant.stage_k);

  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(variant.function,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(variant.shared_bytes)));
  int per_sm = 0;
  GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, variant.function, variant.threads, variant.shared_bytes));
  if (per_sm < 1) return internal_error("W4A16 kernel: occupancy calculator says 0 blocks per SM");
  config.blocks_per_sm = per_sm;
  int blocks = stream_k_blocks(per_sm, sms, config.iterations, options.force_blocks);
  int partial_slices = 1;
  if (options.deterministic) {
    // With splits x tiles blocks, the stream-K partition gives block b exactly split b % splits of
    // tile b / splits.
    const int splits = deterministic_splits(sms, w.n / config.block_n, w.k / kStageK);
    config.splits = splits;
    blocks = config.tiles * splits;
    partial_slices = splits;
  }
  config.blocks = blocks;
  return partial_slices;
}

Status run_tiled(const W4A16Config& config, const W4A16DeviceWeights& w, int m, const void* x,
                 void* y, void* partial, void* counters, StreamHandle stream) {
  KernelParams params{};
  params.x = x;
  params.y = y;
  params.tiles = static_cast<const uint4*>(w.tiles);
  params.scales = static_cast<const std::uint16_t*>(w.scales);
  params.zeros = static_cast<const std::uint8_t*>(w.zeros);
  params.partial = static_cast<float*>(partial);
  params.counters = static_cast<int*>(counters);
  params.m = m;
  params.n = w.n;
  params.k = w.k;
  params.group_size = w.group_size;
  params.m_blocks = (m + config.block_m - 1) / config.block_m;
  params.group_divisor = FastDivisor(static_cast<std::uint32_t>(w.group_size));
  params.m_block_divisor = FastDivisor(static_cast<std::uint32_t>(params.m_blocks));
  params.n_blocks = w.n / config.block_n;
  params.total_iterations = config.iterations;
  params.splits = config.splits;
  const Variant variant = variant_for(w.type, config.swapped, config.m_tiles,
                                      config.block_n == 4 * kTileN, config.pipeline);
  params.iterations_per_tile = w.k / variant.stage_k;
  variant.function<<<config.blocks, variant.threads, variant.shared_bytes, stream>>>(params);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::kernels::w4a16_detail
