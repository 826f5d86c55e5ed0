// Direct W4A16 kernel for decode-sized M (<= 16). Every warp is on its own: it takes an equal,
// contiguous share of all (strip, k16 tile) pairs of the layer (stream-K per warp, so every SM gets
// the same bytes whatever N and K) and streams weights and x through a private shared-memory ring
// with cp.async, so the main loop has no block barrier. The weights are the mma A operand (same
// tile layout and fragments as the swapped kernel), x rows the B operand. docs/w4a16-gemm.md,
// "Direct kernel".
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gpuopt/core/cuda_check.hpp"
#include "w4a16_device.cuh"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels::w4a16_detail {
namespace {

struct DirectParams {
  LayerOperands op;     // counters: one per strip
  int groups;           // K / group_size
  int units_per_strip;  // K / (16 * kUnroll)
  int total_units;      // strips * units_per_strip
  int warps;            // in the grid
  int region_bytes;     // shared memory per warp: weight ring + x ring (resident x: ring only)
  int x_bytes;          // resident x: M rows of K + 8 halves at the start of shared memory
};

// Per-column constants of one quantization group for the 8 columns j = 0..7 a lane owns
// (column 8j + lane/4 of the strip): the scales, and what the dequantisation subtracts.
template <typename T, bool kZeros>
struct GroupConstants {
  uint4 scale_bits;  // 8 fp16/bf16 scales, converted to fp32 when a group is flushed
  // With zero-points: fp16 1024 + zero and -(64 + zero), bf16 128 + zero (pairs). Without, the
  // symmetric zero 8 is a constant (sub/nsub below): no registers spent on it.
  std::uint32_t zsub[kZeros ? 8 : 1];
  std::uint32_t znsub[kZeros && std::is_same_v<T, __half> ? 8 : 1];
  __device__ __forceinline__ std::uint32_t sub(int j) const {
    if constexpr (kZeros) return zsub[j];
    return std::is_same_v<T, __half> ? 0x64086408u : 0x43084308u;  // 1032 / 136
  }
  __device__ __forceinline__ std::uint32_t nsub(int j) const {
    if constexpr (kZeros && std::is_same_v<T, __half>) return znsub[j];
    return 0xD480D480u;  // fp16 -72
  }
  __device__ __forceinline__ float scale(int j) const {
    const std::uint32_t w[4] = {scale_bits.x, scale_bits.y, scale_bits.z, scale_bits.w};
    return bits_to_float<T>(w[j / 2] >> (16 * (j % 2)));
  }
};

template <typename T>
__device__ __forceinline__ std::uint32_t pair_bits(float value) {
  return as_bits(float2_to_pair<T>(value, value));
}

template <typename T, bool kZeros>
__device__ __forceinline__ void decode_group(const uint4& scale_bits, const uint2& zero_bits,
                                             GroupConstants<T, kZeros>& out) {
  out.scale_bits = scale_bits;
  if constexpr (kZeros) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t word = j < 4 ? zero_bits.x : zero_bits.y;
      const float zero = static_cast<float>((word >> (8 * (j % 4))) & 0xffu);
      if constexpr (std::is_same_v<T, __half>) {
        out.zsub[j] = pair_bits<T>(1024.0f + zero);
        out.znsub[j] = pair_bits<T>(-(64.0f + zero));
      } else {
        out.zsub[j] = pair_bits<T>(128.0f + zero);
      }
    }
  }
}

// Word i of a lane's 16 bytes -> the A fragment {a0, a1, a2, a3} of m16 tile i (columns 16i..16i+15
// of the strip): nibbles 0/4 -> a0 (column j = 2i, k 2c, 2c+1), 1/5 -> a2 (j = 2i, k + 8),
// 2/6 -> a1 (j = 2i + 1), 3/7 -> a3. Values are q - zero exactly (the scale comes later, in fp32).
template <typename T, bool kZeros>
__device__ __forceinline__ void dequantize(std::uint32_t word, int i,
                                           const GroupConstants<T, kZeros>& g, std::uint32_t* a) {
  using Pair = typename TypeTraits<T>::Pair;
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64006400 | nibble = 1024 + q; the high nibble of a byte gives 1024 + 16q, scaled by 1/16.
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
    const std::uint32_t lo0 = and_or(word, 0x000f000fu, 0x64006400u);
    const std::uint32_t hi0 = and_or(word, 0x00f000f0u, 0x64006400u);
    const std::uint32_t shifted = word >> 8;
    const std::uint32_t lo1 = and_or(shifted, 0x000f000fu, 0x64006400u);
    const std::uint32_t hi1 = and_or(shifted, 0x00f000f0u, 0x64006400u);
    a[0] = as_bits(__hsub2(as_pair<Pair>(lo0), as_pair<Pair>(g.sub(2 * i))));
    a[2] = as_bits(__hfma2(as_pair<Pair>(hi0), sixteenth, as_pair<Pair>(g.nsub(2 * i))));
    a[1] = as_bits(__hsub2(as_pair<Pair>(lo1), as_pair<Pair>(g.sub(2 * i + 1))));
    a[3] = as_bits(__hfma2(as_pair<Pair>(hi1), sixteenth, as_pair<Pair>(g.nsub(2 * i + 1))));
  } else {
    // bf16 has 7 mantissa bits: every nibble is moved to bits 0-3 first (128 + q).
    const std::uint32_t v0 = and_or(word, 0x000f000fu, 0x43004300u);
    const std::uint32_t v1 = and_or(word >> 4, 0x000f000fu, 0x43004300u);
    const std::uint32_t v2 = and_or(word >> 8, 0x000f000fu, 0x43004300u);
    const std::uint32_t v3 = and_or(word >> 12, 0x000f000fu, 0x43004300u);
    a[0] = as_bits(__hsub2(as_pair<Pair>(v0), as_pair<Pair>(g.sub(2 * i))));
    a[2] = as_bits(__hsub2(as_pair<Pair>(v1), as_pair<Pair>(g.sub(2 * i))));
    a[1] = as_bits(__hsub2(as_pair<Pair>(v2), as_pair<Pair>(g.sub(2 * i + 1))));
    a[3] = as_bits(__hsub2(as_pair<Pair>(v3), as_pair<Pair>(g.sub(2 * i + 1))));
  }
}

// kN8: n8 tiles of x rows (8 or 16 rows); kWarps per block; kUnroll: k16 tiles per stage;
// kStages: stages in each warp's ring (kStages - 1 in flight while one is read). kStageGroups:
// quantization groups are whole stages (group_tiles % kUnroll == 0, checked by the host), so group
// boundaries are looked for once per stage instead of once per tile. 4 blocks of 4 warps per SM
// (<= 128 registers) with 8 rows, 3 with 16.
//
// kResidentX (M <= 4 where it fits, one block of 16 warps per SM): all of x is copied into shared
// memory once, at the start (rows of K + 8 halves), so the rings carry weights only: no x copies,
// pointer updates or syncwarp per stage, and ldmatrix reads x at the unit's k. Measured 3-8 %
// faster at M = 1..4 (H200, 2026-11-30 06:41 UTC, docs/PERFORMANCE.md).
template <typename T, int kN8, int kWarps, int kUnroll, int kStages, bool kZeros, bool kStageGroups,
          bool kResidentX = false>
__global__ void __launch_bounds__(32 * kWarps, kResidentX ? 1 : (kN8 == 1 ? 4 : 3))
    k_w4a16_direct(const DirectParams p) {
  static_assert(kUnroll % 2 == 0, "x fragments are loaded for two k16 tiles at a time");
  static_assert(!kResidentX || kN8 == 1, "resident x: up to 8 rows");
  constexpr int kXPitch = kUnroll * kTileK + 8;   // halves; a 16-byte skew: conflict-free ldmatrix
  constexpr int kXChunks = kUnroll * kTileK / 8;  // 16-byte pieces of one x row per stage
  // Per warp: [weights: kStages x kUnroll tiles of 512 bytes][x: kStages x M rows x kXPitch]
  // (resident x: [x: M rows x (K + 8)] first, then each warp's weight ring).
  extern __shared__ __align__(128) unsigned char shared_raw[];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  unsigned char* region = shared_raw + (kResidentX ? p.x_bytes : 0) + warp * p.region_bytes;
  uint4* ring = reinterpret_cast<uint4*>(region);
  T* x_ring = reinterpret_cast<T*>(region + kStages * kUnroll * kTileBytes);
  const int x_stage = p.op.m * kXPitch;   // halves per stage
  const int resident_pitch = p.op.k + 8;  // halves per resident x row (16-byte skew)

  const long long global_warp = static_cast<long long>(blockIdx.x) * kWarps + warp;
  const int u_begin = static_cast<int>(global_warp * p.total_units / p.warps);
  const int u_end = static_cast<int>((global_warp + 1) * p.total_units / p.warps);
  const int count = u_end - u_begin;
  if constexpr (kResidentX) {
    // Every thread copies its share of x first (one commit group, before the rings' groups); the
    // barrier after the ring prologue makes all of it visible. Warps without units leave after.
    const int chunks = p.op.m * (p.op.k / 8);
    for (int c = threadIdx.x; c < chunks; c += 32 * kWarps) {
      const int r = c / (p.op.k / 8);
      const int col = (c - r * (p.op.k / 8)) * 8;
      copy_async_16(static_cast<std::uint32_t>(__cvta_generic_to_shared(
                        reinterpret_cast<T*>(shared_raw) + r * resident_pitch + col)),
                    static_cast<const T*>(p.op.x) + static_cast<std::size_t>(r) * p.op.k + col);
    }
    copy_async_commit();
  } else if (count <= 0) {
    return;  // no block-wide barrier anywhere: a warp may leave early
  }

  // Copies. Weights: this lane's 16 bytes of each of the stage's tiles (consecutive in memory).
  // x: piece c = lane + 32j of the M x kXChunks 16-byte pieces of the stage's k-range (row
  // c / kXChunks); pointers advance by a stage and step back by K where a strip ends.
  const uint4* next_weights = p.op.tiles + static_cast<std::size_t>(u_begin) * kUnroll * 32 + lane;
  uint4* const ring_lane = ring + lane;
  constexpr int kLanePieces = (8 * kN8 * kXChunks + 31) / 32;
  const T* x_piece[kLanePieces];
  std::uint32_t x_target[kLanePieces];
  const int first_k = (u_begin % p.units_per_strip) * kUnroll * kTileK;
  int next_k = first_k;  // k of the next stage to issue
#pragma unroll
  for (int j = 0; j < kLanePieces; ++j) {
    const int c = lane + 32 * j;
    const int r = c / kXChunks;
    const int col = (c % kXChunks) * 8;
    x_piece[j] = c < p.op.m * kXChunks ? static_cast<const T*>(p.op.x) +
                                             static_cast<std::size_t>(r) * p.op.k + first_k + col
                                       : nullptr;
    x_target[j] = static_cast<std::uint32_t>(__cvta_generic_to_shared(x_ring + r * kXPitch + col));
  }
  auto issue = [&](int slot) {
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      copy_async_16(ring_lane + (slot * kUnroll + i) * 32, next_weights + i * 32, true);
    }
    next_weights += kUnroll * 32;
    if constexpr (kResidentX) return;
    const bool wrap = next_k + kUnroll * kTileK == p.op.k;
    next_k = wrap ? 0 : next_k + kUnroll * kTileK;
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      if (x_piece[j] != nullptr) {
        copy_async_16(x_target[j] + static_cast<std::uint32_t>(slot * x_stage * 2), x_piece[j]);
        x_piece[j] += wrap ? kUnroll * kTileK - p.op.k : kUnroll * kTileK;
      }
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) issue(s);
    copy_async_commit();
  }
  int x_k = first_k;  // resident x: k of the stage being consumed
  if constexpr (kResidentX) {
    copy_async_wait<kStages - 1>();  // this thread's x copies (the oldest group) have landed
    __syncthreads();                 // and every other thread's
    if (count <= 0) return;
  }

  // Strip and quantization-group state.
  const int g = lane / 4;
  const std::size_t group_stride = static_cast<std::size_t>(p.op.strips) * 64;
  int strip = u_begin / p.units_per_strip;
  int strip_units_left = p.units_per_strip - (u_begin - strip * p.units_per_strip);
  int strip_first_unit = u_begin;  // this warp's first unit in `strip`
  std::size_t column_offset = 0;
  int group = 0, left = 0;
  GroupConstants<T, kZeros> constants;
  uint4 next_scale = make_uint4(0, 0, 0, 0);
  uint2 next_zero = make_uint2(0, 0);
  auto load_next = [&]() {
    if (group + 1 < p.groups) {
      next_scale = __ldg(
          reinterpret_cast<const uint4*>(p.op.scales + (group + 1) * group_stride + column_offset));
      if constexpr (kZeros) {
        next_zero = __ldg(reinterpret_cast<const uint2*>(p.op.zeros + (group + 1) * group_stride +
                                                         column_offset));
      }
    }
  };
  // Enter `strip` at k16 tile t.
  auto start_strip = [&](int t) {
    column_offset = static_cast<std::size_t>(strip) * 64 + g * 8;
    group = t / p.op.group_tiles;
    left = (group + 1) * p.op.group_tiles - t;
    const uint4 scale =
        __ldg(reinterpret_cast<const uint4*>(p.op.scales + group * group_stride + column_offset));
    uint2 zero = make_uint2(0, 0);
    if constexpr (kZeros) {
      zero =
          __ldg(reinterpret_cast<const uint2*>(p.op.zeros + group * group_stride + column_offset));
    }
    decode_group<T, kZeros>(scale, zero, constants);
    load_next();
  };
  start_strip((u_begin - strip * p.units_per_strip) * kUnroll);

  float acc[kN8][4][4];
  float group_acc[kN8][4][4];
#pragma unroll
  for (int r = 0; r < kN8; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][i][e] = group_acc[r][i][e] = 0.0f;
    }
  }
  auto flush_group = [&]() {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float scale = constants.scale(j);
      const int i = j / 2;
      const int half = j % 2;  // e / 2
#pragma unroll
      for (int r = 0; r < kN8; ++r) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {  // token column: e % 2
          const int e = 2 * half + t;
          acc[r][i][e] += scale * group_acc[r][i][e];
          group_acc[r][i][e] = 0.0f;
        }
      }
    }
  };
  auto next_group = [&]() {
    flush_group();
    ++group;
    left = p.op.group_tiles;
    decode_group<T, kZeros>(next_scale, next_zero, constants);
    load_next();
  };

  // The strip's sums: stored when this warp did all of it, else added into the fp32 workspace;
  // the warp whose units complete the strip's count converts it and leaves the workspace zero.
  T* y = static_cast<T*>(p.op.y);
  auto finish_strip = [&](int units_done) {
    const bool whole = units_done == p.units_per_strip;
    // c0, c1: column 16i + g, rows (tokens) 8r + 2c, 2c+1; c2, c3: column 16i + 8 + g.
#pragma unroll
    for (int r = 0; r < kN8; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 8 * r + 2 * (lane % 4) + e % 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = strip * kTileN + 16 * i + 8 * (e / 2) + g;
          const std::size_t index = static_cast<std::size_t>(row) * p.op.n + col;
          if (row < p.op.m) {
            if (whole) {
              y[index] = float_to_value<T>(acc[r][i][e]);
            } else {
              atomicAdd(p.op.partial + index, acc[r][i][e]);
            }
          }
          acc[r][i][e] = 0.0f;
        }
      }
    }
    if (whole) return;
    __threadfence();
    __syncwarp();
    int before = 0;
    if (lane == 0) {
      before = atomicAdd(p.op.counters + strip, units_done);
      if (before + units_done == p.units_per_strip) p.op.counters[strip] = 0;
    }
    before = __shfl_sync(0xffffffffu, before, 0);
    if (before + units_done != p.units_per_strip) return;
    __threadfence();
    for (int q = lane; q < p.op.m * (kTileN / 4); q += 32) {
      const int row = q / (kTileN / 4);
      const std::size_t index =
          static_cast<std::size_t>(row) * p.op.n + strip * kTileN + (q % (kTileN / 4)) * 4;
      take_partials<T>(p.op.partial, y, index);
    }
  };

  // ldmatrix lane addresses within a stage's x rows. kN8 = 1: four 8x8 matrices = rows 0-7 at
  // k +0, +8, +16, +24 (b0, b1 of two k16 tiles); kN8 = 2: rows 0-7 and 8-15 at k +0, +8 (b0, b1
  // of both n8 tiles of one k16 tile). Only M rows are staged: lanes of rows >= M read row 0,
  // which reaches only output rows >= M (never stored): an mma output column depends on its own
  // B column alone.
  const int x_row = kN8 == 1 ? lane % 8 : lane % 8 + 8 * (lane / 16);
  const int x_column = kN8 == 1 ? 8 * (lane / 8) : 8 * ((lane / 8) % 2);
  const std::uint32_t x_lane =
      kResidentX ? static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_raw)) +
                       ((x_row < p.op.m ? x_row : 0) * resident_pitch + x_column) * 2
                 : static_cast<std::uint32_t>(__cvta_generic_to_shared(x_ring)) +
                       ((x_row < p.op.m ? x_row : 0) * kXPitch + x_column) * 2;

  for (int s = 0; s < count; ++s) {
    // Refill the slot read one stage ago (its reads are done: their values were used) with stage
    // s + kStages - 1, then wait for stage s; x rows were copied by other lanes, hence the
    // syncwarp.
    const int ahead = s + kStages - 1;
    if (ahead < count) issue(ahead % kStages);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    // x rows were copied by other lanes (a lane reads back only its own weight bytes).
    if constexpr (!kResidentX) __syncwarp();
    if (strip_units_left == 0) {
      // This stage starts the next strip.
      if (left != p.op.group_tiles) flush_group();
      finish_strip(u_begin + s - strip_first_unit);
      ++strip;
      strip_first_unit = u_begin + s;
      strip_units_left = p.units_per_strip;
      start_strip(0);
    }
    --strip_units_left;
    const int slot = s % kStages;
    uint4 batch[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) batch[i] = ring_lane[(slot * kUnroll + i) * 32];
    const std::uint32_t x_slot = kResidentX
                                     ? x_lane + static_cast<std::uint32_t>(x_k * 2)
                                     : x_lane + static_cast<std::uint32_t>(slot * x_stage * 2);
    if constexpr (kResidentX) x_k = x_k + kUnroll * kTileK == p.op.k ? 0 : x_k + kUnroll * kTileK;
#pragma unroll
    for (int pair = 0; pair < kUnroll / 2; ++pair) {
      std::uint32_t xf[2][2 * kN8];  // [tile of the pair][b0, b1 per n8 tile]
      if constexpr (kN8 == 1) {
        std::uint32_t f[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                     : "r"(x_slot + 64 * pair));
        xf[0][0] = f[0];
        xf[0][1] = f[1];
        xf[1][0] = f[2];
        xf[1][1] = f[3];
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          std::uint32_t f[4];
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                       : "r"(x_slot + 64 * pair + 32 * h));
          xf[h][0] = f[0];
          xf[h][1] = f[1];
          xf[h][2] = f[2];
          xf[h][3] = f[3];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 q = batch[2 * pair + h];
        const std::uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          std::uint32_t a[4];
          dequantize<T, kZeros>(words[i], i, constants, a);
#pragma unroll
          for (int r = 0; r < kN8; ++r) {
            mma_16816<T>(group_acc[r][i], a, xf[h][2 * r], xf[h][2 * r + 1]);
          }
        }
        if constexpr (!kStageGroups) {
          if (--left == 0) next_group();
        }
      }
    }
    if constexpr (kStageGroups) {
      left -= kUnroll;
      if (left == 0) next_group();
    }
  }
  if (left != p.op.group_tiles) flush_group();  // the range ended inside a group
  finish_strip(u_end - strip_first_unit);
}

// ---- host side ----

constexpr int kDirectWarps = 4;
constexpr int kResidentWarps = 16;  // resident x: one block of 16 warps per SM
constexpr int kResidentMaxM = 4;

using DirectKernel = void (*)(DirectParams);

struct DirectVariant {
  DirectKernel function;
  int n8, unroll, stages, warps;
  bool resident;
};

template <typename T, bool kZeros, int kN8, bool kStageGroups, bool kResident>
DirectVariant make_direct_variant() {
  constexpr int kWarps = kResident ? kResidentWarps : kDirectWarps;
  return {&k_w4a16_direct<T, kN8, kWarps, 4, 4, kZeros, kStageGroups, kResident>,
          kN8,
          /*unroll=*/4,
          /*stages=*/4,
          kWarps,
          kResident};
}

template <typename T, bool kZeros, int kN8>
DirectVariant direct_variant(bool stage_groups, bool resident) {
  if constexpr (kN8 == 1) {
    if (resident) {
      return stage_groups ? make_direct_variant<T, kZeros, 1, true, true>()
                          : make_direct_variant<T, kZeros, 1, false, true>();
    }
  }
  return stage_groups ? make_direct_variant<T, kZeros, kN8, true, false>()
                      : make_direct_variant<T, kZeros, kN8, false, false>();
}

// variant: bit 0 = 16 rows (else 8), bit 1 = per-stage group checks (else per tile), bit 2 =
// resident x (8-row form only).
DirectVariant direct_variant_for(ActivationType type, bool zeros, int variant) {
  const bool sixteen = (variant & 1) != 0;
  const bool stage_groups = (variant & 2) != 0;
  const bool resident = (variant & 4) != 0;
  if (type == ActivationType::kFloat16) {
    if (zeros) {
      return sixteen ? direct_variant<__half, true, 2>(stage_groups, false)
                     : direct_variant<__half, true, 1>(stage_groups, resident);
    }
    return sixteen ? direct_variant<__half, false, 2>(stage_groups, false)
                   : direct_variant<__half, false, 1>(stage_groups, resident);
  }
  if (zeros) {
    return sixteen ? direct_variant<__nv_bfloat16, true, 2>(stage_groups, false)
                   : direct_variant<__nv_bfloat16, true, 1>(stage_groups, resident);
  }
  return sixteen ? direct_variant<__nv_bfloat16, false, 2>(stage_groups, false)
                 : direct_variant<__nv_bfloat16, false, 1>(stage_groups, resident);
}

// Shared memory of one warp: its weight ring and its x ring (M rows of a stage's k-range each);
// resident x: the ring only.
int region_bytes(const DirectVariant& kernel, int m) {
  const int weights = kernel.stages * kernel.unroll * kTileBytes;
  const int x = kernel.resident ? 0 : kernel.stages * m * (kernel.unroll * kTileK + 8) * 2;
  return (weights + x + 127) / 128 * 128;
}

// Resident x at the start of the block's shared memory: M rows of K + 8 halves.
int resident_x_bytes(const DirectVariant& kernel, int m, int k) {
  return kernel.resident ? (m * (k + 8) * 2 + 127) / 128 * 128 : 0;
}

}  // namespace

StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device) {
  if (m > 16) {
    return failed_precondition("W4A16 direct kernel: M=" + std::to_string(m) + " > 16");
  }
  // Per-stage group checks where quantization groups are whole stages (4 k16 tiles).
  const bool stage_groups = (w.group_size / kTileK) % 4 == 0;
  int sms = 0, optin = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int variant = (m > 8 ? 1 : 0) | (stage_groups ? 2 : 0);
  // Resident x for M <= 4 where all of x and 16 warps' rings fit one block's shared memory
  // (GPUOPT_W4A16_DIRECT_RESIDENT=0 turns it off, =1 tries it up to 8 rows for A/B runs).
  const int resident_setting = env_int("GPUOPT_W4A16_DIRECT_RESIDENT", -1);
  if ((resident_setting == 1 && m <= 8) || (resident_setting < 0 && m <= kResidentMaxM)) {
    const DirectVariant candidate = direct_variant_for(w.type, w.has_zeros, variant | 4);
    const std::size_t bytes =
        static_cast<std::size_t>(resident_x_bytes(candidate, m, w.k)) +
        static_cast<std::size_t>(candidate.warps) * region_bytes(candidate, m);
    if (bytes <= static_cast<std::size_t>(optin)) variant |= 4;
  }
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, variant);
  const int strips = w.n / kTileN;
  const int units_per_strip = w.k / (kTileK * kernel.unroll);
  const int total_units = strips * units_per_strip;
  const int threads = 32 * kernel.warps;
  const int region = region_bytes(kernel, m);
  const std::size_t shared = static_cast<std::size_t>(resident_x_bytes(kernel, m, w.k)) +
                             static_cast<std::size_t>(kernel.warps) * region;
  if (shared > static_cast<std::size_t>(optin)) {
    return failed_precondition("W4A16 direct kernel: " + std::to_string(shared) +
                               " bytes of shared memory per block, more than this GPU gives");
  }
  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(kernel.function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)));
  int per_sm = 0;
  GPUOPT_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel.function, threads, shared));
  if (per_sm < 1) return internal_error("W4A16 direct kernel: 0 blocks per SM");
  per_sm = std::clamp(env_int("GPUOPT_W4A16_DIRECT_BPS", per_sm), 1, per_sm);
  // One wave; every warp gets an equal share of all units (at least one).
  const int blocks =
      std::max(1, std::min(per_sm * sms, (total_units + kernel.warps - 1) / kernel.warps));
  KernelPlan plan;
  plan.variant = variant;
  plan.threads = threads;
  plan.blocks_per_sm = per_sm;
  plan.blocks = blocks;
  plan.tiles = strips;
  plan.shared_bytes = shared;
  plan.workspace_bytes = split_workspace_bytes(m, w.n, strips);
  const double units_per_warp = static_cast<double>(total_units) / (blocks * kernel.warps);
  plan.describe = "direct w.x rows" + std::to_string(8 * kernel.n8) +
                  (kernel.resident ? " resident-x " : " ") + std::to_string(kernel.stages) + "x" +
                  std::to_string(kernel.unroll) + "tiles " + std::to_string(threads) + "thr grid" +
                  std::to_string(blocks) + " (" + std::to_string(per_sm) + "/SM) " +
                  std::to_string(static_cast<int>(units_per_warp * kernel.unroll * kTileK)) +
                  " k/warp";
  return plan;
}

Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream) {
  if (workspace == nullptr) return failed_precondition("W4A16 direct kernel: no workspace");
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, plan.variant);
  DirectParams p{};
  p.op = layer_operands(w, m, x, y, workspace);
  p.groups = w.k / w.group_size;
  p.units_per_strip = w.k / (kTileK * kernel.unroll);
  p.total_units = p.op.strips * p.units_per_strip;
  p.warps = plan.blocks * kernel.warps;
  p.region_bytes = region_bytes(kernel, m);
  p.x_bytes = resident_x_bytes(kernel, m, w.k);
  kernel.function<<<plan.blocks, plan.threads, plan.shared_bytes, stream>>>(p);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::kernels::w4a16_detail
