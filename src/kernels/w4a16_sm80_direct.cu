// Direct W4A16 kernel for decode-sized M (<= 16). Every warp is on its own: it takes an equal,
// contiguous share of the (strip, k16 unit) pairs (stream-K per warp, so every SM gets the same
// bytes whatever N and K) and streams weights (and, with whole-stage groups, their scales) through
// a private shared-memory ring with cp.async, so the main loop has no block barrier. x is resident
// in shared memory: each block (one per SM) copies the x rows of its k-slice once, and the layer's
// units are cut into k-slices where all of x does not fit (otherwise x streams through the rings
// too). The weights are the mma A operand (same tile layout and fragments as the swapped kernel),
// x rows the B operand. Partial strips are added into an fp32 workspace without waiting, and
// counted once at each warp's end. docs/w4a16-gemm.md, "Direct kernel".
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "w4a16_device.cuh"
#include "w4a16_direct_partition.hpp"
#include "w4a16_paths.hpp"

#ifndef GPUOPT_W4A16_DIAGNOSTICS
#define GPUOPT_W4A16_DIAGNOSTICS 0  // src/kernels/CMakeLists.txt: the per-warp timing build
#endif

namespace gpuopt::kernels::w4a16_detail {
namespace {

struct DirectParams {
  LayerOperands op;     // counters: one per strip
  int groups;           // K / group_size
  int units_per_strip;  // K / (16 * kUnroll)
  int slices;           // k-slices: slice s is units [s * ups / slices, (s + 1) * ups / slices)
  int slice_blocks;     // consecutive blocks per slice (gridDim.x / slices)
  int region_bytes;     // shared memory per warp: weight ring + x ring (resident x: ring only)
  int x_bytes;          // resident x: M rows of the slice's k-range at the start of shared memory
  int x_pitch;          // resident x: halves per row (the longest slice's k + 8)
  unsigned long long* timing;  // diagnostics builds (GPUOPT_W4A16_DIAGNOSTICS): kTimingWords per
                               // warp; null otherwise
  // Partial strips in the workspace: 1 = mma fragment layout (16-byte reductions over 512
  // contiguous bytes per warp, all 8 * kN8 rows), 0 = row layout (4-byte reductions, rows < M).
  int fragment_partials;
};

// Diagnostics (builds with GPUOPT_W4A16_DIAGNOSTICS): per warp %globaltimer at its start, when x is
// in shared memory, at its end, its SM, and at the end of its stream (before its last partial sums,
// strip counts and fix-ups).
constexpr int kTimingWords = 5;

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

__device__ __forceinline__ unsigned long long global_timer() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

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
// boundaries are looked for once per stage instead of once per tile, and each stage's ring slot
// also carries the scales (and zero-points) of its group. Without resident x: 4 blocks of 4 warps
// per SM (<= 128 registers) with 8 rows, 3 with 16.
//
// kResidentX (one block per SM, 16 warps with 8 rows, 12 with 16): the x rows of the block's
// k-slice are copied into shared memory once, at the start, so the rings carry no x: no x copies
// or pointer updates per stage, and ldmatrix reads x at the unit's k. The layer's
// k16 units are cut into `slices` k-ranges (1 where all of x fits); `slice_blocks` consecutive
// blocks share a slice, and its (strip, unit) pairs, strip-major, are split equally over their
// warps. Every strip of a sliced layer is finished through the fp32 workspace. docs/w4a16-gemm.md,
// "Direct kernel".
template <typename T_, int kN8_, int kWarps_, int kUnroll_, int kStages_, bool kZeros_,
          bool kStageGroups_, bool kResidentX_>
struct DirectShape {
  using T = T_;
  static constexpr int kN8 = kN8_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kUnroll = kUnroll_;
  static constexpr bool kZeros = kZeros_;
  static constexpr bool kStageGroups = kStageGroups_;
  static constexpr bool kResidentX = kResidentX_;
  static_assert(kUnroll % 2 == 0, "x fragments are loaded for two k16 tiles at a time");
  static constexpr int kXPitch =
      kUnroll * kTileK + 8;  // halves; a 16-byte skew: conflict-free ldmatrix
  static constexpr int kXChunks = kUnroll * kTileK / 8;  // 16-byte pieces of one x row per stage
  static constexpr int kUnitK = kUnroll * kTileK;        // k of one unit (stage)
  // With whole-stage groups, each stage also carries its group's scales (and zero-points) for the
  // warp's 8 column groups: 8 x 16 bytes (+ 8 x 8), copied with the weights, so they arrive as
  // early as the weights do (a plain load one group ahead stalled the warp: 1.9-5.5 us at M =
  // 1-16).
  static constexpr int kScaleSlot = kStageGroups ? 192 : 0;
  static constexpr int kLanePieces = (8 * kN8 * kXChunks + 31) / 32;  // x pieces a lane copies
};

// The tile scheduler: this warp's units are v in [v_begin, v_end) of its slice's strips x
// slice_units, strip-major (one slice of all units_per_strip without resident x).
struct DirectWarpRange {
  int slice_first;  // the slice's first unit of a strip
  int slice_units;  // units of a strip in the slice
  int v_begin, v_end, count;
  int first_strip;
  int first_unit;  // within the slice
};
template <typename S>
__device__ __forceinline__ DirectWarpRange direct_warp_range(const DirectParams& p, int warp) {
  DirectWarpRange range;
  const int slice = S::kResidentX ? static_cast<int>(blockIdx.x) / p.slice_blocks : 0;
  range.slice_first = S::kResidentX ? direct_slice_first(slice, p.slices, p.units_per_strip) : 0;
  range.slice_units =
      S::kResidentX ? direct_slice_first(slice + 1, p.slices, p.units_per_strip) - range.slice_first
                    : p.units_per_strip;
  const long long slice_total = static_cast<long long>(p.op.strips) * range.slice_units;
  const long long slice_warps = static_cast<long long>(p.slice_blocks) * S::kWarps;
  const long long slice_warp =
      static_cast<long long>(blockIdx.x - slice * p.slice_blocks) * S::kWarps + warp;
  range.v_begin = direct_warp_first(slice_warp, slice_warps, slice_total);
  range.v_end = direct_warp_first(slice_warp + 1, slice_warps, slice_total);
  range.count = range.v_end - range.v_begin;
  range.first_strip = range.v_begin / range.slice_units;
  range.first_unit = range.v_begin - range.first_strip * range.slice_units;
  return range;
}

// Resident x: every thread copies its share of the slice's x rows into the start of shared
// memory (one commit group, before the rings' groups).
template <typename S>
__device__ __forceinline__ void direct_copy_resident_x(const DirectParams& p,
                                                       const DirectWarpRange& range,
                                                       unsigned char* shared_raw) {
  using T = typename S::T;
  const int row_chunks = range.slice_units * S::kUnitK / 8;
  const T* x_slice = static_cast<const T*>(p.op.x) + range.slice_first * S::kUnitK;
  for (int c = threadIdx.x; c < p.op.m * row_chunks; c += 32 * S::kWarps) {
    const int r = c / row_chunks;
    const int col = (c - r * row_chunks) * 8;
    copy_async_16(static_cast<std::uint32_t>(__cvta_generic_to_shared(
                      reinterpret_cast<T*>(shared_raw) + r * p.x_pitch + col)),
                  x_slice + static_cast<std::size_t>(r) * p.op.k + col);
  }
  copy_async_commit();
}

// The producer side of a warp's ring. Weights: this lane's 16 bytes of each of the stage's tiles
// (consecutive in memory within a strip's slice; the pointer skips the other slices' units where a
// strip ends). x (not resident; one slice): piece c = lane + 32j of the M x kXChunks 16-byte
// pieces of the stage's k-range (row c / kXChunks); pointers advance by a stage and step back by K
// where a strip ends. Whole-stage groups: the group of the next stage to issue, its tiles left,
// the lane's columns. The state lives in the kernel's own variables and this names them (as a
// lambda's captures would): a struct holding the values instead gave different SASS (ptxas
// assigned registers differently, +30 instructions in the per-tile-group kernels).
template <typename S>
struct DirectCopies {
  uint4*& ring_lane;
  const uint4*& next_weights;
  int& strip_skip;
  int& issue_unit;  // unit within the slice of the next stage to issue
  int& issue_group;
  int& issue_left;
  std::size_t& issue_column;
  std::uint32_t& scale_lane;
  const typename S::T* (&x_piece)[S::kLanePieces];
  std::uint32_t (&x_target)[S::kLanePieces];
  int& next_k;   // k of the next stage to issue
  int& x_stage;  // halves per stage of the x ring
};

template <typename S>
__device__ __forceinline__ void direct_init_copies(const DirectParams& p,
                                                   const DirectWarpRange& range, int lane,
                                                   uint4* ring, unsigned char* scale_ring,
                                                   typename S::T* x_ring, DirectCopies<S>& c) {
  using T = typename S::T;
  const int g = lane / 4;
  c.x_stage = p.op.m * S::kXPitch;
  c.next_weights = p.op.tiles +
                   (static_cast<std::size_t>(range.first_strip) * p.units_per_strip +
                    range.slice_first + range.first_unit) *
                       S::kUnroll * 32 +
                   lane;
  c.strip_skip = (p.units_per_strip - range.slice_units) * S::kUnroll * 32;
  c.issue_unit = range.first_unit;
  c.issue_group = (range.slice_first + range.first_unit) * S::kUnroll / p.op.group_tiles;
  c.issue_left =
      (c.issue_group + 1) * p.op.group_tiles - (range.slice_first + range.first_unit) * S::kUnroll;
  c.issue_column = static_cast<std::size_t>(range.first_strip) * 64 + g * 8;
  c.scale_lane = static_cast<std::uint32_t>(__cvta_generic_to_shared(scale_ring)) + g * 16;
  c.ring_lane = ring + lane;
  const int first_k = (range.slice_first + range.first_unit) * S::kUnitK;
  c.next_k = first_k;
#pragma unroll
  for (int j = 0; j < S::kLanePieces; ++j) {
    const int piece = lane + 32 * j;
    const int r = piece / S::kXChunks;
    const int col = (piece % S::kXChunks) * 8;
    c.x_piece[j] =
        piece < p.op.m * S::kXChunks
            ? static_cast<const T*>(p.op.x) + static_cast<std::size_t>(r) * p.op.k + first_k + col
            : nullptr;
    c.x_target[j] =
        static_cast<std::uint32_t>(__cvta_generic_to_shared(x_ring + r * S::kXPitch + col));
  }
}

// Issues the copies of the next stage into ring slot `slot`.
template <typename S>
__device__ __forceinline__ void direct_issue_stage(const DirectParams& p,
                                                   const DirectWarpRange& range, int lane,
                                                   DirectCopies<S>& c, int slot) {
#pragma unroll
  for (int i = 0; i < S::kUnroll; ++i) {
    copy_async_16(c.ring_lane + (slot * S::kUnroll + i) * 32, c.next_weights + i * 32, true);
  }
  if constexpr (S::kStageGroups) {
    if (lane % 4 == 0) {  // one copy per column group; its four lanes read it
      const int g = lane / 4;
      const std::size_t group_stride = static_cast<std::size_t>(p.op.strips) * 64;
      const std::size_t at =
          static_cast<std::size_t>(c.issue_group) * group_stride + c.issue_column;
      copy_async_16(c.scale_lane + slot * S::kScaleSlot, p.op.scales + at);
      if constexpr (S::kZeros) {  // at 128 + 8g of the slot (scale_lane is 16g in)
        copy_async_8(c.scale_lane + slot * S::kScaleSlot + 128 - g * 8, p.op.zeros + at);
      }
    }
    c.issue_left -= S::kUnroll;
    if (c.issue_left == 0) {
      ++c.issue_group;
      c.issue_left = p.op.group_tiles;
    }
  }
  c.next_weights += S::kUnroll * 32;
  if (++c.issue_unit == range.slice_units) {  // the next strip (resident: skip other slices' units)
    c.issue_unit = 0;
    if constexpr (S::kResidentX) c.next_weights += c.strip_skip;
    if constexpr (S::kStageGroups) {
      c.issue_column += 64;
      c.issue_group = range.slice_first * S::kUnroll / p.op.group_tiles;
      c.issue_left = (c.issue_group + 1) * p.op.group_tiles - range.slice_first * S::kUnroll;
    }
  }
  if constexpr (S::kResidentX) return;
  const bool wrap = c.next_k + S::kUnitK == p.op.k;
  c.next_k = wrap ? 0 : c.next_k + S::kUnitK;
#pragma unroll
  for (int j = 0; j < S::kLanePieces; ++j) {
    if (c.x_piece[j] != nullptr) {
      copy_async_16(c.x_target[j] + static_cast<std::uint32_t>(slot * c.x_stage * 2), c.x_piece[j]);
      c.x_piece[j] += wrap ? S::kUnitK - p.op.k : S::kUnitK;
    }
  }
}

// The consumer's strip and quantization-group state (the kernel's variables, named as
// DirectCopies names the producer's).
template <typename S>
struct DirectGroups {
  std::size_t& column_offset;
  int& group;
  int& left;
  bool& pending;  // whole-stage groups: decode the group's constants from this stage's slot
  GroupConstants<typename S::T, S::kZeros>& constants;
  uint4& next_scale;
  uint2& next_zero;
};

template <typename S>
__device__ __forceinline__ void direct_load_next_group(const DirectParams& p, DirectGroups<S>& gs) {
  const std::size_t group_stride = static_cast<std::size_t>(p.op.strips) * 64;
  if (gs.group + 1 < p.groups) {
    gs.next_scale = __ldg(reinterpret_cast<const uint4*>(
        p.op.scales + (gs.group + 1) * group_stride + gs.column_offset));
    if constexpr (S::kZeros) {
      gs.next_zero = __ldg(reinterpret_cast<const uint2*>(
          p.op.zeros + (gs.group + 1) * group_stride + gs.column_offset));
    }
  }
}

// Enters `strip` at k16 tile t.
template <typename S>
__device__ __forceinline__ void direct_start_strip(const DirectParams& p, int lane, int strip,
                                                   int t, DirectGroups<S>& gs) {
  const std::size_t group_stride = static_cast<std::size_t>(p.op.strips) * 64;
  gs.column_offset = static_cast<std::size_t>(strip) * 64 + (lane / 4) * 8;
  gs.group = t / p.op.group_tiles;
  gs.left = (gs.group + 1) * p.op.group_tiles - t;
  if constexpr (S::kStageGroups) {
    gs.pending = true;
    return;
  }
  const uint4 scale = __ldg(
      reinterpret_cast<const uint4*>(p.op.scales + gs.group * group_stride + gs.column_offset));
  uint2 zero = make_uint2(0, 0);
  if constexpr (S::kZeros) {
    zero = __ldg(
        reinterpret_cast<const uint2*>(p.op.zeros + gs.group * group_stride + gs.column_offset));
  }
  decode_group<typename S::T, S::kZeros>(scale, zero, gs.constants);
  direct_load_next_group(p, gs);
}

// acc += scale * group_acc, group_acc = 0 (the group's sums are kept apart so the mma takes the
// exact q - zero and the scale is applied in fp32 once per group).
template <typename S>
__device__ __forceinline__ void direct_flush_group(
    const GroupConstants<typename S::T, S::kZeros>& constants, float (&acc)[S::kN8][4][4],
    float (&group_acc)[S::kN8][4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float scale = constants.scale(j);
    const int i = j / 2;
    const int half = j % 2;  // e / 2
#pragma unroll
    for (int r = 0; r < S::kN8; ++r) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {  // token column: e % 2
        const int e = 2 * half + t;
        acc[r][i][e] += scale * group_acc[r][i][e];
        group_acc[r][i][e] = 0.0f;
      }
    }
  }
}

template <typename S>
__device__ __forceinline__ void direct_next_group(const DirectParams& p, DirectGroups<S>& gs,
                                                  float (&acc)[S::kN8][4][4],
                                                  float (&group_acc)[S::kN8][4][4]) {
  direct_flush_group<S>(gs.constants, acc, group_acc);
  ++gs.group;
  gs.left = p.op.group_tiles;
  if constexpr (S::kStageGroups) {
    gs.pending = true;
  } else {
    decode_group<typename S::T, S::kZeros>(gs.next_scale, gs.next_zero, gs.constants);
    direct_load_next_group(p, gs);
  }
}

// The main loop's math on one stage: the lane's weights of the stage's kUnroll k16 tiles (batch,
// read from its ring slot), x fragments by ldmatrix at x_slot, dequantisation and mma into
// group_acc; the group advances (and is flushed into acc) where it ends.
template <typename S>
__device__ __forceinline__ void direct_mma_stage(const DirectParams& p,
                                                 const uint4 (&batch)[S::kUnroll],
                                                 std::uint32_t x_slot, DirectGroups<S>& gs,
                                                 float (&acc)[S::kN8][4][4],
                                                 float (&group_acc)[S::kN8][4][4]) {
  constexpr int kN8 = S::kN8;
#pragma unroll
  for (int pair = 0; pair < S::kUnroll / 2; ++pair) {
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
        dequantize<typename S::T, S::kZeros>(words[i], i, gs.constants, a);
#pragma unroll
        for (int r = 0; r < kN8; ++r) {
          mma_16816<typename S::T>(group_acc[r][i], a, xf[h][2 * r], xf[h][2 * r + 1]);
        }
      }
      if constexpr (!S::kStageGroups) {
        if (--gs.left == 0) direct_next_group(p, gs, acc, group_acc);
      }
    }
  }
  if constexpr (S::kStageGroups) {
    gs.left -= S::kUnroll;
    if (gs.left == 0) direct_next_group(p, gs, acc, group_acc);
  }
}

// f(index, r, i, e) for each of a lane's values of strip s (the mma D fragment: c0, c1 at
// column 16i + g, rows 8r + 2c, 2c + 1; c2, c3 at column 16i + 8 + g) in a row below M; index =
// row * N + column, in y and in the row-layout workspace.
template <typename S, typename F>
__device__ __forceinline__ void direct_each_value(const DirectParams& p, int lane, int s, F&& f) {
#pragma unroll
  for (int r = 0; r < S::kN8; ++r) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 8 * r + 2 * (lane % 4) + e % 2;
      if (row >= p.op.m) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = s * kTileN + 16 * i + 8 * (e / 2) + lane / 4;
        f(static_cast<std::size_t>(row) * p.op.n + col, r, i, e);
      }
    }
  }
}

template <typename S>
__device__ __forceinline__ void direct_store_strip(const DirectParams& p, int lane, int s,
                                                   const float (&sums)[S::kN8][4][4]) {
  using T = typename S::T;
  T* y = static_cast<T*>(p.op.y);
  direct_each_value<S>(p, lane, s, [&](std::size_t index, int r, int i, int e) {
    y[index] = float_to_value<T>(sums[r][i][e]);
  });
}

// Partial strips go to the workspace in the mma fragment layout: float4 q of lane L of strip s
// (acc[r][i][0..3] with q = 4r + i) at (s * 4 * kN8 + q) * 128 + 4L floats, so a warp adds a
// strip with 4 * kN8 reductions of 512 contiguous bytes (16-byte red.v4 on sm_90) instead of
// one 4-byte reduction per value; the fix-up reads them back the same way. Rows past M are added
// and cleared too, never stored.
template <typename S>
__device__ __forceinline__ float* direct_fragment(const DirectParams& p, int lane, int s) {
  return p.op.partial + static_cast<std::size_t>(s) * 4 * S::kN8 * 128 + 4 * lane;
}

// The epilogue of a strip: its sums are stored when this warp did all of it, else added into the
// fp32 workspace with fire-and-forget reductions: nothing here waits on memory (with a fence, a
// counter atomic and the fix-up here, each strip piece had cost a warp 1.3-3 us on the H200); the
// strips' counts are taken once, at the warp's end (direct_count_strips). acc is zeroed after.
template <typename S>
__device__ __forceinline__ void direct_finish_strip(const DirectParams& p, int lane, int strip,
                                                    int units_done, float (&acc)[S::kN8][4][4]) {
  if (units_done != p.units_per_strip) {
    if (p.fragment_partials) {
      float* const target = direct_fragment<S>(p, lane, strip);
#pragma unroll
      for (int r = 0; r < S::kN8; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          add_four(target + (4 * r + i) * 128,
                   make_float4(acc[r][i][0], acc[r][i][1], acc[r][i][2], acc[r][i][3]));
        }
      }
    } else {  // row layout: one 4-byte reduction per value of a row below M
      direct_each_value<S>(p, lane, strip, [&](std::size_t index, int r, int i, int e) {
        atomicAdd(p.op.partial + index, acc[r][i][e]);
      });
    }
  } else {
    direct_store_strip<S>(p, lane, strip, acc);
  }
#pragma unroll
  for (int r = 0; r < S::kN8; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][i][e] = 0.0f;
    }
  }
}

// The fix-up, after the last strip (`last_strip`): one fence for all of this warp's partial sums,
// then lane j counts this warp's units of strip first_strip + j (all strips' counter atomics in
// flight together); the warp whose units complete a strip's count converts it (all its loads
// issued before any store) and leaves the workspace and the counter zero. This warp's units of
// strip s are those of [v_begin, v_end) within [s * slice_units, (s + 1) * slice_units).
template <typename S>
__device__ __forceinline__ void direct_count_strips(const DirectParams& p,
                                                    const DirectWarpRange& range, int lane,
                                                    int last_strip) {
  using T = typename S::T;
  T* y = static_cast<T*>(p.op.y);
  __threadfence();
  __syncwarp();
  for (int base = range.first_strip; base <= last_strip; base += 32) {
    const int s = base + lane;
    bool complete = false;
    if (s <= last_strip) {
      const int units_done =
          min(range.v_end, (s + 1) * range.slice_units) - max(range.v_begin, s * range.slice_units);
      if (units_done != p.units_per_strip) {  // else stored whole
        const int before = atomicAdd(p.op.counters + s, units_done);
        complete = before + units_done == p.units_per_strip;
        if (complete) p.op.counters[s] = 0;
      }
    }
    unsigned done = __ballot_sync(0xffffffffu, complete);
    if (done == 0) continue;
    __threadfence();
    while (done != 0) {
      const int c = base + __ffs(done) - 1;
      done &= done - 1;
      if (p.fragment_partials) {
        // The strip's sums in fragment layout: each lane takes back its own 4 * kN8 float4 (all
        // loads before the stores), leaves them zero and stores its fragment.
        float sums[S::kN8][4][4];
        float* const source = direct_fragment<S>(p, lane, c);
#pragma unroll
        for (int r = 0; r < S::kN8; ++r) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(source + (4 * r + i) * 128));
            sums[r][i][0] = v.x;
            sums[r][i][1] = v.y;
            sums[r][i][2] = v.z;
            sums[r][i][3] = v.w;
          }
        }
#pragma unroll
        for (int q = 0; q < 4 * S::kN8; ++q) {
          __stcg(reinterpret_cast<float4*>(source + q * 128), make_float4(0.f, 0.f, 0.f, 0.f));
        }
        direct_store_strip<S>(p, lane, c, sums);
        continue;
      }
      // Row layout: M x 64 fp32 = M x 16 float4 per strip; lane q takes float4 q, q + 32, ...
      constexpr int kPer = S::kN8 * 4;  // 8 rows x 16 / 32 lanes per n8 tile
      float4 v[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int q = lane + 32 * j;
        if (q < p.op.m * (kTileN / 4)) {
          v[j] = __ldcg(reinterpret_cast<const float4*>(
              p.op.partial + static_cast<std::size_t>(q / (kTileN / 4)) * p.op.n + c * kTileN +
              (q % (kTileN / 4)) * 4));
        }
      }
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int q = lane + 32 * j;
        if (q < p.op.m * (kTileN / 4)) {
          const std::size_t index = static_cast<std::size_t>(q / (kTileN / 4)) * p.op.n +
                                    c * kTileN + (q % (kTileN / 4)) * 4;
          __stcg(reinterpret_cast<float4*>(p.op.partial + index), make_float4(0.f, 0.f, 0.f, 0.f));
          store_four<T>(y + index, v[j]);
        }
      }
    }
  }
}

__device__ __forceinline__ void direct_record_time(const DirectParams& p, int lane, int warp,
                                                   int warps, int word) {
  if (p.timing != nullptr && lane == 0) {
    p.timing[kTimingWords * (static_cast<long long>(blockIdx.x) * warps + warp) + word] =
        global_timer();
  }
}

template <typename T, int kN8, int kWarps, int kUnroll, int kStages, bool kZeros, bool kStageGroups,
          bool kResidentX = false>
__global__ void __launch_bounds__(32 * kWarps, kResidentX ? 1 : (kN8 == 1 ? 4 : 3))
    k_w4a16_direct(const DirectParams p) {
  using S = DirectShape<T, kN8, kWarps, kUnroll, kStages, kZeros, kStageGroups, kResidentX>;
  // Per warp: [weights: kStages x kUnroll tiles of 512 bytes][scales: kStages x 192 bytes, with
  // whole-stage groups][x: kStages x M rows x kXPitch] (resident x: [x: M rows x x_pitch] first,
  // then each warp's weights and scales).
  extern __shared__ __align__(128) unsigned char shared_raw[];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  unsigned char* region = shared_raw + (kResidentX ? p.x_bytes : 0) + warp * p.region_bytes;
  uint4* ring = reinterpret_cast<uint4*>(region);
  unsigned char* const scale_ring = region + kStages * kUnroll * kTileBytes;
  T* x_ring = reinterpret_cast<T*>(scale_ring + kStages * S::kScaleSlot);

  const DirectWarpRange range = direct_warp_range<S>(p, warp);
  if (p.timing != nullptr && lane == 0) {
    unsigned long long* t =
        p.timing + kTimingWords * (static_cast<long long>(blockIdx.x) * kWarps + warp);
    t[0] = global_timer();
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t[3] = sm;
  }
  if constexpr (kResidentX) {
    // The barrier after the ring prologue makes all of x visible; warps without units leave
    // after it.
    direct_copy_resident_x<S>(p, range, shared_raw);
  } else if (range.count <= 0) {
    return;  // no block-wide barrier anywhere: a warp may leave early
  }

  // Prologue: kStages - 1 stages in flight.
  uint4* ring_lane;
  const uint4* next_weights;
  int strip_skip, issue_unit, issue_group, issue_left;
  std::size_t issue_column;
  std::uint32_t scale_lane;
  const T* x_piece[S::kLanePieces];
  std::uint32_t x_target[S::kLanePieces];
  int next_k, x_stage;
  DirectCopies<S> copies{ring_lane,   next_weights, strip_skip,   issue_unit,
                         issue_group, issue_left,   issue_column, scale_lane,
                         x_piece,     x_target,     next_k,       x_stage};
  direct_init_copies<S>(p, range, lane, ring, scale_ring, x_ring, copies);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < range.count) direct_issue_stage<S>(p, range, lane, copies, s);
    copy_async_commit();
  }
  int x_k = range.first_unit * S::kUnitK;  // resident x: k within the slice of the stage consumed
  if constexpr (kResidentX) {
    copy_async_wait<kStages - 1>();  // this thread's x copies (the oldest group) have landed
    __syncthreads();                 // and every other thread's
    direct_record_time(p, lane, warp, kWarps, 1);
    if (range.count <= 0) return;
  }

  // Strip and quantization-group state.
  int strip = range.first_strip;
  int strip_units_left = range.slice_units - range.first_unit;
  int strip_first_unit = range.v_begin;  // this warp's first unit in `strip`
  std::size_t column_offset = 0;
  int group = 0, left = 0;
  bool pending = true;
  GroupConstants<T, kZeros> constants;
  uint4 next_scale = make_uint4(0, 0, 0, 0);
  uint2 next_zero = make_uint2(0, 0);
  DirectGroups<S> groups{column_offset, group, left, pending, constants, next_scale, next_zero};
  direct_start_strip<S>(p, lane, strip, (range.slice_first + range.first_unit) * kUnroll, groups);

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

  // ldmatrix lane addresses within a stage's x rows. kN8 = 1: four 8x8 matrices = rows 0-7 at
  // k +0, +8, +16, +24 (b0, b1 of two k16 tiles); kN8 = 2: rows 0-7 and 8-15 at k +0, +8 (b0, b1
  // of both n8 tiles of one k16 tile). Only M rows are staged: lanes of rows >= M read row 0,
  // which reaches only output rows >= M (never stored): an mma output column depends on its own
  // B column alone.
  const int x_row = kN8 == 1 ? lane % 8 : lane % 8 + 8 * (lane / 16);
  const int x_column = kN8 == 1 ? 8 * (lane / 8) : 8 * ((lane / 8) % 2);
  const std::uint32_t x_lane =
      kResidentX ? static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_raw)) +
                       ((x_row < p.op.m ? x_row : 0) * p.x_pitch + x_column) * 2
                 : static_cast<std::uint32_t>(__cvta_generic_to_shared(x_ring)) +
                       ((x_row < p.op.m ? x_row : 0) * S::kXPitch + x_column) * 2;

  // The main loop: one stage per trip.
  for (int s = 0; s < range.count; ++s) {
    // Refill the slot read one stage ago (its reads are done: their values were used) with stage
    // s + kStages - 1, then wait for stage s; x rows were copied by other lanes, hence the
    // syncwarp.
    const int ahead = s + kStages - 1;
    // With whole-stage groups the slot refilled here held scales that other lanes read one
    // stage ago: they must have read them before its copying lane overwrites them (racecheck
    // warned of this intra-warp hazard without the syncwarp).
    if constexpr (kStageGroups) __syncwarp();
    if (ahead < range.count) direct_issue_stage<S>(p, range, lane, copies, ahead % kStages);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    // x rows were copied by other lanes (a lane reads back only its own weight bytes).
    // (and, with whole-stage groups, the scales by the first lane of each column group).
    if constexpr (!kResidentX || kStageGroups) __syncwarp();
    if (strip_units_left == 0) {
      // This stage starts the next strip.
      if (groups.left != p.op.group_tiles) direct_flush_group<S>(groups.constants, acc, group_acc);
      direct_finish_strip<S>(p, lane, strip, range.v_begin + s - strip_first_unit, acc);
      ++strip;
      strip_first_unit = range.v_begin + s;
      strip_units_left = range.slice_units;
      direct_start_strip<S>(p, lane, strip, range.slice_first * kUnroll, groups);
    }
    --strip_units_left;
    const int slot = s % kStages;
    if constexpr (kStageGroups) {
      if (groups.pending) {
        const unsigned char* slot_scales = scale_ring + slot * S::kScaleSlot;
        const uint4 scale = *reinterpret_cast<const uint4*>(slot_scales + (lane / 4) * 16);
        uint2 zero = make_uint2(0, 0);
        if constexpr (kZeros) {
          zero = *reinterpret_cast<const uint2*>(slot_scales + 128 + (lane / 4) * 8);
        }
        decode_group<T, kZeros>(scale, zero, groups.constants);
        groups.pending = false;
      }
    }
    uint4 batch[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) batch[i] = copies.ring_lane[(slot * kUnroll + i) * 32];
    const std::uint32_t x_slot =
        kResidentX ? x_lane + static_cast<std::uint32_t>(x_k * 2)
                   : x_lane + static_cast<std::uint32_t>(slot * copies.x_stage * 2);
    if constexpr (kResidentX) {
      x_k = x_k + S::kUnitK == range.slice_units * S::kUnitK ? 0 : x_k + S::kUnitK;
    }
    direct_mma_stage<S>(p, batch, x_slot, groups, acc, group_acc);
  }
  direct_record_time(p, lane, warp, kWarps, 4);  // the stream's end: the last stage computed
  // The epilogue: the last strip's sums, then the fix-up of the strips this warp completed.
  if (groups.left != p.op.group_tiles) {
    direct_flush_group<S>(groups.constants, acc, group_acc);  // the range ended inside a group
  }
  direct_finish_strip<S>(p, lane, strip, range.v_end - strip_first_unit, acc);
  direct_count_strips<S>(p, range, lane, strip);
  direct_record_time(p, lane, warp, kWarps, 2);
}

// ---- host side ----

constexpr int kDirectWarps = 4;
// Resident x: one block per SM, as many warps as the registers allow (8 rows: <= 128 registers,
// 16 rows: <= 168).
constexpr int kResidentWarps8 = 16;
constexpr int kResidentWarps16 = 12;

// Partial strips in the fragment layout from M = 3: 16-byte reductions of whole 8-row fragments
// measured faster there (H200, 2026-11-30: M=8 41.0 -> 39.2 us, M=16 47.2 -> 44.1 on 8192 x 28672;
// docs/PERFORMANCE.md), the 4-byte row reductions of the M real rows at M = 1-2 (37.5 vs 36.8 us at
// M = 1). W4A16Tuning::direct_fragment_partials forces one.
constexpr int kDirectFragmentPartials = 1;  // KernelPlan::flags bit
bool direct_fragment_partials(int m, const W4A16Tuning& tuning) {
  return tuning.direct_fragment_partials.value_or(m > 2);
}

using DirectKernel = void (*)(DirectParams);

struct DirectVariant {
  DirectKernel function;
  int n8, unroll, stages, warps;
  bool resident, stage_groups;
};

template <typename T, bool kZeros, int kN8, bool kStageGroups, bool kResident, int kUnroll = 4>
DirectVariant make_direct_variant() {
  constexpr int kWarps = kResident ? (kN8 == 1 ? kResidentWarps8 : kResidentWarps16) : kDirectWarps;
  // Resident x, 8 rows: 3 stages (2 in flight per warp) measured 1-3 % faster than 4 at M = 1..8,
  // and 5, 6 or 8 stages (also with 12 or 8 warps) 1-10 % slower; 16 rows: 3 and 4 tie, 5 to 8
  // slower; 16 rows with 8 k16 tiles per stage: 3 stages (H200, 2026-11-30, docs/PERFORMANCE.md).
  constexpr int kStages = kResident && (kN8 == 1 || kUnroll == 8) ? 3 : 4;
  return {&k_w4a16_direct<T, kN8, kWarps, kUnroll, kStages, kZeros, kStageGroups, kResident>,
          kN8,
          kUnroll,
          kStages,
          kWarps,
          kResident,
          kStageGroups};
}

template <typename T, bool kZeros, int kN8>
DirectVariant direct_variant(bool stage_groups, bool resident) {
  if (resident) {
    return stage_groups ? make_direct_variant<T, kZeros, kN8, true, true>()
                        : make_direct_variant<T, kZeros, kN8, false, true>();
  }
  return stage_groups ? make_direct_variant<T, kZeros, kN8, true, false>()
                      : make_direct_variant<T, kZeros, kN8, false, false>();
}

template <typename T>
DirectVariant direct_variant_of(bool zeros, bool sixteen, bool stage_groups, bool resident,
                                bool tiles8) {
  if (tiles8) {  // 16 rows, resident x, whole-stage groups of 8 k16 tiles
    return zeros ? make_direct_variant<T, true, 2, true, true, 8>()
                 : make_direct_variant<T, false, 2, true, true, 8>();
  }
  if (zeros) {
    return sixteen ? direct_variant<T, true, 2>(stage_groups, resident)
                   : direct_variant<T, true, 1>(stage_groups, resident);
  }
  return sixteen ? direct_variant<T, false, 2>(stage_groups, resident)
                 : direct_variant<T, false, 1>(stage_groups, resident);
}

// variant: bit 0 = 16 rows (else 8), bit 1 = per-stage group checks (else per tile), bit 2 =
// resident x, bit 3 = stages of 8 k16 tiles (with bits 0-2 only).
DirectVariant direct_variant_for(ActivationType type, bool zeros, int variant) {
  const bool sixteen = (variant & 1) != 0;
  const bool stage_groups = (variant & 2) != 0;
  const bool resident = (variant & 4) != 0;
  const bool tiles8 = (variant & 15) == 15;
  return type == ActivationType::kFloat16
             ? direct_variant_of<__half>(zeros, sixteen, stage_groups, resident, tiles8)
             : direct_variant_of<__nv_bfloat16>(zeros, sixteen, stage_groups, resident, tiles8);
}

// Shared memory of one warp: its weight ring (with whole-stage groups, each stage's scales and
// zero-points too) and its x ring (M rows of a stage's k-range each); resident x: no x ring.
int region_bytes(const DirectVariant& kernel, int m) {
  const int weights =
      kernel.stages * (kernel.unroll * kTileBytes + (kernel.stage_groups ? 192 : 0));
  const int x = kernel.resident ? 0 : kernel.stages * m * (kernel.unroll * kTileK + 8) * 2;
  return (weights + x + 127) / 128 * 128;
}

// Resident x: M rows of the longest slice's k + 8 halves (a 16-byte skew per row: conflict-free
// ldmatrix) at the start of the block's shared memory.
int resident_x_pitch(const DirectVariant& kernel, int units_per_strip, int slices) {
  return ((units_per_strip + slices - 1) / slices) * kernel.unroll * kTileK + 8;
}
std::size_t resident_x_bytes(int m, int pitch) {
  return (static_cast<std::size_t>(m) * pitch * 2 + 127) / 128 * 128;
}

// The k-slicing of the resident-x kernel: `slices` k-ranges of slice_blocks blocks each (one
// block per SM). Modelled time of a warp, in units (2 KB of weights): its units (the longest
// slice's share), plus (0.6 + 0.15 M) per strip piece it adds into the workspace (the partial sums
// and their count at the end; a warp whose range is whole strip-slices has the fewest), plus 0.035
// per KB of x the block copies before its first unit. The weights are fitted by hand to the H200
// slice sweeps of 2026-11-30 (docs/PERFORMANCE.md), where neighbouring choices differ by 1-3 %;
// the fewest slices among the cheapest.
struct Slicing {
  int slices = 0, slice_blocks = 0, pitch = 0;
  std::size_t shared = 0;
};
Slicing choose_slicing(const DirectVariant& kernel, int m, int strips, int units_per_strip, int sms,
                       int optin, int forced, int forced_blocks) {
  Slicing best;
  double best_cost = 0.0;
  const std::size_t rings = static_cast<std::size_t>(kernel.warps) * region_bytes(kernel, m);
  const double piece_cost = 0.6 + 0.15 * m;
  for (int slices = 1; slices <= std::min({units_per_strip, sms, forced > 0 ? forced : 64});
       ++slices) {
    if (forced > 0 && slices != forced) continue;
    const int slice_blocks =
        forced_blocks > 0 ? std::min(forced_blocks, sms / slices) : sms / slices;
    if (slice_blocks < 1) break;
    const int pitch = resident_x_pitch(kernel, units_per_strip, slices);
    const std::size_t shared = resident_x_bytes(m, pitch) + rings;
    if (shared > static_cast<std::size_t>(optin)) continue;
    // The kernel's partition, warp by warp: the longest share and the partial pieces.
    const long long warps = static_cast<long long>(slice_blocks) * kernel.warps;
    long long longest = 0, pieces = 0, working = 0;
    for (int slice = 0; slice < slices; ++slice) {
      const int units = direct_slice_first(slice + 1, slices, units_per_strip) -
                        direct_slice_first(slice, slices, units_per_strip);
      const long long total = static_cast<long long>(strips) * units;
      for (long long w = 0; w < warps; ++w) {
        const long long begin = direct_warp_first(w, warps, total);
        const long long end = direct_warp_first(w + 1, warps, total);
        if (end <= begin) continue;
        ++working;
        longest = std::max(longest, end - begin);
        const long long first_strip = begin / units, last_strip = (end - 1) / units;
        if (slices > 1) {
          pieces += last_strip - first_strip + 1;
        } else {  // whole strips are stored, not added: only a partial first and last strip
          pieces += (begin % units != 0 ? 1 : 0) +
                    (end % units != 0 && (last_strip != first_strip || begin % units == 0) ? 1 : 0);
        }
      }
    }
    const double x_kb = static_cast<double>(resident_x_bytes(m, pitch)) / 1024.0;
    const double cost = static_cast<double>(longest) +
                        piece_cost * static_cast<double>(pieces) / std::max(1LL, working) +
                        0.035 * x_kb;
    if (best.slices == 0 || cost < best_cost - 1e-9) {
      best = {slices, slice_blocks, pitch, shared};
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace

StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device, int sms,
                                 const W4A16Tuning& tuning) {
  if (m > 16) {
    return failed_precondition("W4A16 direct kernel: M=" + std::to_string(m) + " > 16");
  }
  // Per-stage group checks where quantization groups are whole stages (4 k16 tiles).
  const bool stage_groups = (w.group_size / kTileK) % 4 == 0;
  int optin = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int variant = (m > 8 ? 1 : 0) | (stage_groups ? 2 : 0);
  // 16 rows with resident x: stages of 8 k16 tiles on layers with K * N >= 2^27 where K and the
  // groups allow (whole 128-k units, groups of a multiple of 8 tiles): 1-3 % faster than 4 tiles
  // at M = 9-16 on the 70B shapes, 3 % slower at M = 12-16 on 4096 x 14336 (H200, 2026-11-30,
  // docs/PERFORMANCE.md). W4A16Tuning::direct_tiles8 turns it off, or on wherever it applies.
  const bool tiles8 =
      m > 8 && w.k % (8 * kTileK) == 0 && (w.group_size / kTileK) % 8 == 0 &&
      tuning.direct_tiles8.value_or(static_cast<long long>(w.k) * w.n >= (1LL << 27));
  const int strips = w.n / kTileN;
  // Resident x (k-sliced where all of x does not fit) wherever one block's shared memory holds a
  // slice and the rings; W4A16Tuning::direct_resident_x = false turns it off, direct_slices and
  // direct_slice_blocks force the slicing, for A/B runs and tests.
  Slicing slicing;
  if (tuning.direct_resident_x) {
    const DirectVariant candidate =
        direct_variant_for(w.type, w.has_zeros, variant | 4 | (tiles8 ? 8 : 0));
    slicing = choose_slicing(candidate, m, strips, w.k / (kTileK * candidate.unroll), sms, optin,
                             tuning.direct_slices, tuning.direct_slice_blocks);
    if (slicing.slices > 0) variant |= 4 | (tiles8 ? 8 : 0);
  }
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, variant);
  const int units_per_strip = w.k / (kTileK * kernel.unroll);
  const int total_units = strips * units_per_strip;
  const int threads = 32 * kernel.warps;
  const std::size_t shared = kernel.resident
                                 ? slicing.shared
                                 : static_cast<std::size_t>(kernel.warps) * region_bytes(kernel, m);
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
  KernelPlan plan;
  if (kernel.resident) {
    // One block per SM; slice s is blocks [s * slice_blocks, (s + 1) * slice_blocks).
    per_sm = 1;
    plan.splits = slicing.slices;
    plan.blocks = slicing.slices * slicing.slice_blocks;
  } else {
    if (tuning.direct_blocks_per_sm > 0) {
      per_sm = std::clamp(tuning.direct_blocks_per_sm, 1, per_sm);
    }
    // One wave; every warp gets an equal share of all units (at least one).
    plan.splits = 1;
    plan.blocks =
        std::max(1, std::min(per_sm * sms, (total_units + kernel.warps - 1) / kernel.warps));
  }
  plan.variant = variant;
  plan.threads = threads;
  plan.blocks_per_sm = per_sm;
  plan.tiles = strips;
  plan.shared_bytes = shared;
  plan.flags = direct_fragment_partials(m, tuning) ? kDirectFragmentPartials : 0;
  // Partial strips: the fragment layout takes 8 or 16 rows per strip whatever M (the row layout
  // M <= 8 * n8 rows).
  plan.workspace_bytes = split_workspace_bytes(8 * kernel.n8, w.n, strips);
  const double units_per_warp = static_cast<double>(total_units) / (plan.blocks * kernel.warps);
  plan.describe = "direct w.x rows" + std::to_string(8 * kernel.n8) +
                  (kernel.resident ? " resident-x " + std::to_string(plan.splits) + "-slice "
                                   : std::string(" ")) +
                  std::to_string(kernel.stages) + "x" + std::to_string(kernel.unroll) + "tiles " +
                  std::to_string(threads) + "thr grid" + std::to_string(plan.blocks) + " (" +
                  std::to_string(per_sm) + "/SM) " +
                  std::to_string(static_cast<int>(units_per_warp * kernel.unroll * kTileK)) +
                  " k/warp" + (plan.flags & kDirectFragmentPartials ? " frag-partials" : "");
  return plan;
}

#if GPUOPT_W4A16_DIAGNOSTICS
namespace {

// Diagnostics builds only (the CMake option GPUOPT_W4A16_DIAGNOSTICS): every direct launch records
// every warp's start, x-ready and end (%globaltimer) and SM, and is summarised on stderr after the
// launch (this synchronises the stream); where GPUOPT_W4A16_DIAGNOSTICS_CSV names a file at
// configure time, each warp's record is also appended there as CSV (launch, warp, block, sm, start,
// ready, end, stream end in ns from the first start). The record buffer grows as needed and is kept
// for the process.
struct WarpTiming {
  runtime::DeviceBuffer buffer;
  int launches = 0;
};
WarpTiming& warp_timing() {
  static WarpTiming* timing = new WarpTiming();  // never freed: no CUDA call at process exit
  return *timing;
}

Status report_warp_timing(const unsigned long long* device_timing, int warps, int warps_per_block,
                          StreamHandle stream) {
  std::vector<unsigned long long> t(kTimingWords * static_cast<std::size_t>(warps));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(t.data(), device_timing, t.size() * sizeof(t[0]),
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  unsigned long long first = ~0ull;
  for (int i = 0; i < warps; ++i) {
    if (t[kTimingWords * i] != 0) first = std::min(first, t[kTimingWords * i]);
  }
  const int launch = ++warp_timing().launches;
  const char* path = GPUOPT_W4A16_DIAGNOSTICS_CSV;
  std::FILE* file = *path != '\0' ? std::fopen(path, "a") : nullptr;
  std::vector<double> ready, ends, streams;
  for (int i = 0; i < warps; ++i) {
    const unsigned long long* w = &t[kTimingWords * static_cast<std::size_t>(i)];
    if (w[0] == 0) continue;
    const double start_ns = static_cast<double>(w[0] - first);
    const double ready_ns = w[1] != 0 ? static_cast<double>(w[1] - first) : -1.0;
    const double end_ns = w[2] != 0 ? static_cast<double>(w[2] - first) : -1.0;
    const double stream_ns = w[4] != 0 ? static_cast<double>(w[4] - first) : -1.0;
    if (file != nullptr) {
      std::fprintf(file, "%d,%d,%d,%llu,%.0f,%.0f,%.0f,%.0f\n", launch, i, i / warps_per_block,
                   w[3], start_ns, ready_ns, end_ns, stream_ns);
    }
    if (w[2] == 0) continue;  // no units
    if (w[1] != 0) ready.push_back(ready_ns / 1000.0);
    ends.push_back(end_ns / 1000.0);
    streams.push_back(stream_ns / 1000.0);
  }
  if (file != nullptr) std::fclose(file);
  if (ends.empty()) return ok_status();
  std::sort(ready.begin(), ready.end());
  std::sort(ends.begin(), ends.end());
  std::sort(streams.begin(), streams.end());
  const auto at = [](const std::vector<double>& v, double q) {
    return v.empty() ? 0.0 : v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  };
  std::fprintf(stderr,
               "direct timing: %zu warps, x ready us p50 %.2f max %.2f; stream end us p10 %.2f p50 "
               "%.2f p90 %.2f max %.2f; end us min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f\n",
               ends.size(), at(ready, 0.5), at(ready, 1.0), at(streams, 0.1), at(streams, 0.5),
               at(streams, 0.9), streams.back(), ends.front(), at(ends, 0.1), at(ends, 0.5),
               at(ends, 0.9), ends.back());
  return ok_status();
}

}  // namespace
#endif  // GPUOPT_W4A16_DIAGNOSTICS

Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream) {
  if (workspace == nullptr) return failed_precondition("W4A16 direct kernel: no workspace");
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, plan.variant);
  DirectParams p{};
  p.op = layer_operands(w, m, x, y, workspace);
  // The partials take 8 * n8 rows in either layout (plan_direct's workspace_bytes).
  p.op.counters = reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) +
                                         partials_bytes(8 * kernel.n8, w.n));
  p.fragment_partials = (plan.flags & kDirectFragmentPartials) != 0 ? 1 : 0;
  p.groups = w.k / w.group_size;
  p.units_per_strip = w.k / (kTileK * kernel.unroll);
  p.slices = std::max(1, plan.splits);
  p.slice_blocks = plan.blocks / p.slices;
  p.region_bytes = region_bytes(kernel, m);
  p.x_pitch = kernel.resident ? resident_x_pitch(kernel, p.units_per_strip, p.slices) : 0;
  p.x_bytes = kernel.resident ? static_cast<int>(resident_x_bytes(m, p.x_pitch)) : 0;
#if GPUOPT_W4A16_DIAGNOSTICS
  const int warps = plan.blocks * kernel.warps;
  const std::size_t timing_bytes = kTimingWords * sizeof(unsigned long long) * warps;
  runtime::DeviceBuffer& timing = warp_timing().buffer;
  if (timing.size_bytes() < timing_bytes) {
    timing.reset();
    GPUOPT_ASSIGN_OR_RETURN(timing, runtime::DeviceBuffer::allocate(timing_bytes));
  }
  GPUOPT_CUDA_TRY(cudaMemsetAsync(timing.data(), 0, timing_bytes, stream));
  p.timing = timing.data_as<unsigned long long>();
#endif
  kernel.function<<<plan.blocks, plan.threads, plan.shared_bytes, stream>>>(p);
  GPUOPT_CUDA_TRY_LAUNCH();
#if GPUOPT_W4A16_DIAGNOSTICS
  return report_warp_timing(p.timing, warps, kernel.warps, stream);
#else
  return ok_status();
#endif
}

}  // namespace gpuopt::kernels::w4a16_detail
