// Direct W4A16 kernel for decode-sized M (<= 16): each warp streams one 64-column strip of int4
// weights from global memory straight into registers, so the main loop has no shared-memory
// staging of weights and no block barrier; x for the block's k-range is copied into shared memory
// once. The weights are the mma A operand (as in the swapped kernel, same tile layout), x rows the
// B operand. docs/w4a16-gemm.md, "Direct kernel".
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
  const void* x;  // [M][K]
  void* y;        // [M][N]
  const uint4* tiles;
  const std::uint16_t* scales;  // [G][strips][8 (g)][8 (j)]
  const std::uint8_t* zeros;    // same layout, or null
  float* partial;               // [M][N] fp32, zero between runs
  int* counters;                // [strip groups], zero between runs
  int m, n, k;
  int group_tiles;  // k16 tiles per quantization group
  int groups;       // K / group_size
  int strips;       // N / 64
  int k_tiles;      // K / 16
  int units;        // K / (16 * kUnroll): the k-split granularity
  int splits;       // k-splits per strip group
  int x_pitch;      // halves per x row in shared memory
};

// 16 bytes of weights, read once: no L1 allocation, first out of L2.
__device__ __forceinline__ uint4 load_streaming(const uint4* pointer, std::uint64_t policy) {
  uint4 v;
  asm volatile(
      "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(pointer), "l"(policy));
  return v;
}

// Per-column constants of one quantization group for the 8 columns j = 0..7 a lane owns
// (column 8j + lane/4 of the strip): the scale in fp32 and what the dequantisation subtracts.
template <typename T>
struct GroupConstants {
  float scale[8];
  std::uint32_t sub[8];   // fp16: 1024 + zero; bf16: 128 + zero (pairs)
  std::uint32_t nsub[8];  // fp16 high nibble: -(64 + zero) (pairs); unused for bf16
};

template <typename T>
__device__ __forceinline__ std::uint32_t pair_bits(float value) {
  return as_bits(float2_to_pair<T>(value, value));
}

template <typename T, bool kZeros>
__device__ __forceinline__ void decode_group(const uint4& scale_bits, const uint2& zero_bits,
                                             GroupConstants<T>& out) {
  const std::uint32_t s[4] = {scale_bits.x, scale_bits.y, scale_bits.z, scale_bits.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    out.scale[j] = bits_to_float<T>(s[j / 2] >> (16 * (j % 2)));
    float zero = 8.0f;
    if constexpr (kZeros) {
      const std::uint32_t word = j < 4 ? zero_bits.x : zero_bits.y;
      zero = static_cast<float>((word >> (8 * (j % 4))) & 0xffu);
    }
    if constexpr (std::is_same_v<T, __half>) {
      out.sub[j] = pair_bits<T>(1024.0f + zero);
      out.nsub[j] = pair_bits<T>(-(64.0f + zero));
    } else {
      out.sub[j] = pair_bits<T>(128.0f + zero);
      out.nsub[j] = 0;
    }
  }
}

// Word i of a lane's 16 bytes -> the A fragment {a0, a1, a2, a3} of m16 tile i (columns 16i..16i+15
// of the strip): nibbles 0/4 -> a0 (column j = 2i, k 2c, 2c+1), 1/5 -> a2 (j = 2i, k + 8),
// 2/6 -> a1 (j = 2i + 1), 3/7 -> a3. Values are q - zero exactly (the scale comes later, in fp32).
template <typename T>
__device__ __forceinline__ void dequantize(std::uint32_t word, int i, const GroupConstants<T>& g,
                                           std::uint32_t* a) {
  using Pair = typename TypeTraits<T>::Pair;
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64006400 | nibble = 1024 + q; the high nibble of a byte gives 1024 + 16q, scaled by 1/16.
    const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
    const std::uint32_t lo0 = and_or(word, 0x000f000fu, 0x64006400u);
    const std::uint32_t hi0 = and_or(word, 0x00f000f0u, 0x64006400u);
    const std::uint32_t shifted = word >> 8;
    const std::uint32_t lo1 = and_or(shifted, 0x000f000fu, 0x64006400u);
    const std::uint32_t hi1 = and_or(shifted, 0x00f000f0u, 0x64006400u);
    a[0] = as_bits(__hsub2(as_pair<Pair>(lo0), as_pair<Pair>(g.sub[2 * i])));
    a[2] = as_bits(__hfma2(as_pair<Pair>(hi0), sixteenth, as_pair<Pair>(g.nsub[2 * i])));
    a[1] = as_bits(__hsub2(as_pair<Pair>(lo1), as_pair<Pair>(g.sub[2 * i + 1])));
    a[3] = as_bits(__hfma2(as_pair<Pair>(hi1), sixteenth, as_pair<Pair>(g.nsub[2 * i + 1])));
  } else {
    // bf16 has 7 mantissa bits: every nibble is moved to bits 0-3 first (128 + q).
    const std::uint32_t v0 = and_or(word, 0x000f000fu, 0x43004300u);
    const std::uint32_t v1 = and_or(word >> 4, 0x000f000fu, 0x43004300u);
    const std::uint32_t v2 = and_or(word >> 8, 0x000f000fu, 0x43004300u);
    const std::uint32_t v3 = and_or(word >> 12, 0x000f000fu, 0x43004300u);
    a[0] = as_bits(__hsub2(as_pair<Pair>(v0), as_pair<Pair>(g.sub[2 * i])));
    a[2] = as_bits(__hsub2(as_pair<Pair>(v1), as_pair<Pair>(g.sub[2 * i])));
    a[1] = as_bits(__hsub2(as_pair<Pair>(v2), as_pair<Pair>(g.sub[2 * i + 1])));
    a[3] = as_bits(__hsub2(as_pair<Pair>(v3), as_pair<Pair>(g.sub[2 * i + 1])));
  }
}

// kN8: n8 tiles of x rows (8 or 16 rows); kWarps: strips per block (one per warp); kUnroll: k16
// tiles per register batch (two batches in flight per warp).
template <typename T, int kN8, int kWarps, int kUnroll, bool kZeros>
__global__ void __launch_bounds__(32 * kWarps, 4) k_w4a16_direct(const DirectParams p) {
  constexpr int kRows = 8 * kN8;
  static_assert(kUnroll % 2 == 0, "x fragments are loaded for two k16 tiles at a time");
  extern __shared__ __align__(16) unsigned char shared_x[];
  T* xs = reinterpret_cast<T*>(shared_x);
  __shared__ int is_last;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int strip_group = blockIdx.x / p.splits;
  const int split = blockIdx.x - strip_group * p.splits;
  const int u0 = static_cast<int>(static_cast<long long>(split) * p.units / p.splits);
  const int u1 = static_cast<int>(static_cast<long long>(split + 1) * p.units / p.splits);
  const int t0 = u0 * kUnroll;
  const int t1 = u1 * kUnroll;
  const int k0 = t0 * kTileK;
  const int strip = strip_group * kWarps + warp;
  const bool active = strip < p.strips && t1 > t0;

  // x[rows][k0, k0 + klen) into shared memory; rows >= M are zero.
  {
    const int chunks_per_row = (t1 - t0) * kTileK / 8;
    const T* x = static_cast<const T*>(p.x);
    for (int c = threadIdx.x; c < kRows * chunks_per_row; c += 32 * kWarps) {
      const int r = c / chunks_per_row;
      const int col = (c - r * chunks_per_row) * 8;
      const bool valid = r < p.m;
      copy_async_16(xs + r * p.x_pitch + col,
                    x + static_cast<std::size_t>(valid ? r : 0) * p.k + k0 + col, valid);
    }
    copy_async_commit();
  }

  const std::uint64_t policy = evict_first_policy();
  const uint4* weights =
      p.tiles + (static_cast<std::size_t>(active ? strip : 0) * p.k_tiles) * 32 + lane;
  uint4 batch0[kUnroll], batch1[kUnroll];
  if (active) {
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) batch0[i] = load_streaming(weights + (t0 + i) * 32, policy);
  }

  // The group constants of the current group, and the raw bits of the next one in flight.
  const int g = lane / 4;
  const std::size_t group_stride = static_cast<std::size_t>(p.strips) * 64;
  const std::size_t column_offset = static_cast<std::size_t>(active ? strip : 0) * 64 + g * 8;
  int group = t0 / p.group_tiles;
  int left = (group + 1) * p.group_tiles - t0;  // tiles of the current group still to do
  GroupConstants<T> constants;
  uint4 next_scale = make_uint4(0, 0, 0, 0);
  uint2 next_zero = make_uint2(0, 0);
  if (active) {
    const uint4 scale = __ldg(reinterpret_cast<const uint4*>(p.scales + group * group_stride +
                                                             column_offset));
    uint2 zero = make_uint2(0, 0);
    if constexpr (kZeros) {
      zero = __ldg(reinterpret_cast<const uint2*>(p.zeros + group * group_stride + column_offset));
    }
    decode_group<T, kZeros>(scale, zero, constants);
    if (group + 1 < p.groups) {
      next_scale = __ldg(reinterpret_cast<const uint4*>(p.scales + (group + 1) * group_stride +
                                                        column_offset));
      if constexpr (kZeros) {
        next_zero = __ldg(
            reinterpret_cast<const uint2*>(p.zeros + (group + 1) * group_stride + column_offset));
      }
    }
  }

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

  copy_async_wait<0>();
  __syncthreads();

  // ldmatrix addresses. kN8 = 1: four 8x8 matrices = rows 0-7 at k +0, +8, +16, +24 (b0, b1 of two
  // k16 tiles). kN8 = 2: rows 0-7 and 8-15 at k +0, +8 (b0, b1 of both n8 tiles of one k16 tile).
  const std::uint32_t x_shared = static_cast<std::uint32_t>(__cvta_generic_to_shared(xs));
  const std::uint32_t x_lane =
      kN8 == 1 ? x_shared + ((lane % 8) * p.x_pitch + 8 * (lane / 8)) * 2
               : x_shared + ((lane % 8 + 8 * (lane / 16)) * p.x_pitch + 8 * ((lane / 8) % 2)) * 2;

  auto flush_group = [&]() {
#pragma unroll
    for (int r = 0; r < kN8; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[r][i][e] += constants.scale[2 * i + e / 2] * group_acc[r][i][e];
          group_acc[r][i][e] = 0.0f;
        }
      }
    }
  };

  auto process = [&](const uint4* batch, int t) {
#pragma unroll
    for (int pair = 0; pair < kUnroll / 2; ++pair) {
      std::uint32_t xf[2][2 * kN8];  // [tile of the pair][b0, b1 per n8 tile]
      const std::uint32_t column_bytes = static_cast<std::uint32_t>((t - t0 + 2 * pair) * 32);
      if constexpr (kN8 == 1) {
        std::uint32_t f[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                     : "r"(x_lane + column_bytes));
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
                       : "r"(x_lane + column_bytes + 32 * h));
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
          dequantize<T>(words[i], i, constants, a);
#pragma unroll
          for (int r = 0; r < kN8; ++r) {
            mma_16816<T>(group_acc[r][i], a, xf[h][2 * r], xf[h][2 * r + 1]);
          }
        }
        if (--left == 0) {
          // The group ends with this tile: scale its sums into acc, move to the next group.
          flush_group();
          ++group;
          left = p.group_tiles;
          decode_group<T, kZeros>(next_scale, next_zero, constants);
          if (group + 1 < p.groups) {
            next_scale = __ldg(reinterpret_cast<const uint4*>(
                p.scales + (group + 1) * group_stride + column_offset));
            if constexpr (kZeros) {
              next_zero = __ldg(reinterpret_cast<const uint2*>(
                  p.zeros + (group + 1) * group_stride + column_offset));
            }
          }
        }
      }
    }
  };

  if (active) {
    int t = t0;
    for (;;) {
      const bool more = t + kUnroll < t1;
      if (more) {
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          batch1[i] = load_streaming(weights + (t + kUnroll + i) * 32, policy);
        }
      }
      process(batch0, t);
      t += kUnroll;
      if (!more) break;
      const bool more2 = t + kUnroll < t1;
      if (more2) {
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          batch0[i] = load_streaming(weights + (t + kUnroll + i) * 32, policy);
        }
      }
      process(batch1, t);
      t += kUnroll;
      if (!more2) break;
    }
    if (left != p.group_tiles) flush_group();  // the range ended inside a group
  }

  // c0, c1: column 16i + g, rows (tokens) 8r + 2c, 2c+1; c2, c3: column 16i + 8 + g.
  T* y = static_cast<T*>(p.y);
  const bool whole = p.splits == 1;
  if (active) {
#pragma unroll
    for (int r = 0; r < kN8; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 8 * r + 2 * (lane % 4) + e % 2;
        if (row >= p.m) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = strip * kTileN + 16 * i + 8 * (e / 2) + g;
          const std::size_t index = static_cast<std::size_t>(row) * p.n + col;
          if (whole) {
            y[index] = float_to_value<T>(acc[r][i][e]);
          } else {
            atomicAdd(p.partial + index, acc[r][i][e]);
          }
        }
      }
    }
  }
  if (whole) return;
  // The block that completes the strip group's count converts it and leaves the workspace zero.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int before = atomicAdd(p.counters + strip_group, 1);
    is_last = before == p.splits - 1;
    if (is_last) p.counters[strip_group] = 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int first_column = strip_group * kWarps * kTileN;
  const int columns = min(kWarps * kTileN, p.n - first_column);
  const int quads = p.m * (columns / 4);
  for (int q = threadIdx.x; q < quads; q += 32 * kWarps) {
    const int row = q / (columns / 4);
    const int c4 = q - row * (columns / 4);
    const std::size_t index = static_cast<std::size_t>(row) * p.n + first_column + c4 * 4;
    float4* source = reinterpret_cast<float4*>(p.partial + index);
    const float4 v = __ldcg(source);
    __stcg(source, make_float4(0.f, 0.f, 0.f, 0.f));
    using Pair = typename TypeTraits<T>::Pair;
    Pair* target = reinterpret_cast<Pair*>(y + index);
    target[0] = float2_to_pair<T>(v.x, v.y);
    target[1] = float2_to_pair<T>(v.z, v.w);
  }
}

// ---- host side ----

constexpr int kDirectWarps = 4;

using DirectKernel = void (*)(DirectParams);

struct DirectVariant {
  DirectKernel function;
  int n8, unroll;
};

// variant: bit 0 = 16 rows (two n8 tiles), bit 1 = 8-tile batches (else 4).
template <typename T, bool kZeros>
DirectVariant direct_variant(int variant) {
  switch (variant) {
    case 0:
      return {&k_w4a16_direct<T, 1, kDirectWarps, 4, kZeros>, 1, 4};
    case 2:
      return {&k_w4a16_direct<T, 1, kDirectWarps, 8, kZeros>, 1, 8};
    default:
      return {&k_w4a16_direct<T, 2, kDirectWarps, 4, kZeros>, 2, 4};
  }
}

DirectVariant direct_variant_for(ActivationType type, bool zeros, int variant) {
  if (type == ActivationType::kFloat16) {
    return zeros ? direct_variant<__half, true>(variant) : direct_variant<__half, false>(variant);
  }
  return zeros ? direct_variant<__nv_bfloat16, true>(variant)
               : direct_variant<__nv_bfloat16, false>(variant);
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return std::atoi(value);
}

struct DirectGeometry {
  int splits = 1, units = 0, max_k = 0, x_pitch = 0;
  std::size_t shared_bytes = 0;
};

DirectGeometry direct_geometry(const W4A16DeviceWeights& w, int unroll, int rows, int splits) {
  DirectGeometry geometry;
  geometry.units = w.k / (kTileK * unroll);
  geometry.splits = std::clamp(splits, 1, geometry.units);
  const int max_units = (geometry.units + geometry.splits - 1) / geometry.splits;
  geometry.max_k = max_units * unroll * kTileK;
  geometry.x_pitch = geometry.max_k + 8;  // a 16-byte skew: conflict-free ldmatrix rows
  geometry.shared_bytes = static_cast<std::size_t>(rows) * geometry.x_pitch * 2;
  return geometry;
}

std::size_t align256(std::size_t value) { return (value + 255) / 256 * 256; }

}  // namespace

StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device) {
  if (m > 16) {
    return failed_precondition("W4A16 direct kernel: M=" + std::to_string(m) + " > 16");
  }
  int variant = m > 8 ? 1 : (w.k % 128 == 0 ? 2 : 0);
  if (const int forced = env_int("GPUOPT_W4A16_DIRECT_VARIANT", -1); forced >= 0 && m <= 8) {
    if (forced == 0 || (forced == 2 && w.k % 128 == 0)) variant = forced;
  }
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, variant);
  const int rows = 8 * kernel.n8;
  const int strips = w.n / kTileN;
  const int strip_groups = (strips + kDirectWarps - 1) / kDirectWarps;
  int sms = 0, optin = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GPUOPT_CUDA_TRY(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int threads = 32 * kDirectWarps;
  // Blocks per SM the registers allow, then k-splits for one wave of that many blocks (fewer
  // where x for a split's k-range would not fit in shared memory beside them).
  int per_sm = 0;
  GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel.function, threads,
                                                                0));
  if (per_sm < 1) return internal_error("W4A16 direct kernel: 0 blocks per SM");
  per_sm = std::clamp(env_int("GPUOPT_W4A16_DIRECT_BPS", per_sm), 1, per_sm);
  // One wave: `target` blocks per SM the registers allow, k-split so that strip groups x splits
  // fills them; where x for a split's k-range leaves room for fewer blocks, fewer per SM (and so
  // fewer, longer splits); where not even one fits, more splits.
  DirectGeometry geometry;
  int fit = 0;
  const int forced_splits = env_int("GPUOPT_W4A16_DIRECT_SPLITS", 0);
  for (int target = per_sm; target >= 1 && fit < target; --target) {
    const int splits = forced_splits > 0 ? forced_splits
                                         : (target * sms + strip_groups - 1) / strip_groups;
    geometry = direct_geometry(w, kernel.unroll, rows, splits);
    fit = 0;
    if (geometry.shared_bytes <= static_cast<std::size_t>(optin)) {
      GPUOPT_CUDA_TRY(cudaFuncSetAttribute(kernel.function,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(geometry.shared_bytes)));
      GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &fit, kernel.function, threads, geometry.shared_bytes));
    }
    if (forced_splits > 0) break;
  }
  for (int splits = geometry.splits * 2; fit < 1 && geometry.splits < geometry.units;
       splits *= 2) {
    geometry = direct_geometry(w, kernel.unroll, rows, splits);
    if (geometry.shared_bytes > static_cast<std::size_t>(optin)) continue;
    GPUOPT_CUDA_TRY(cudaFuncSetAttribute(kernel.function,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(geometry.shared_bytes)));
    GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel.function, threads,
                                                                  geometry.shared_bytes));
  }
  if (fit < 1) {
    return failed_precondition("W4A16 direct kernel: x rows for a k-split need " +
                               std::to_string(geometry.shared_bytes) +
                               " bytes of shared memory, more than this GPU gives a block");
  }
  per_sm = std::min(per_sm, fit);
  KernelPlan plan;
  plan.variant = variant;
  plan.threads = threads;
  plan.blocks_per_sm = per_sm;
  plan.splits = geometry.splits;
  plan.tiles = strip_groups;
  plan.blocks = strip_groups * geometry.splits;
  plan.shared_bytes = geometry.shared_bytes;
  plan.workspace_bytes =
      geometry.splits > 1
          ? align256(static_cast<std::size_t>(m) * w.n * sizeof(float)) + strip_groups * sizeof(int)
          : 0;
  plan.describe = "direct w.x rows" + std::to_string(rows) + " batch" +
                  std::to_string(kernel.unroll) + " " + std::to_string(threads) + "thr grid" +
                  std::to_string(plan.blocks) + " (" + std::to_string(per_sm) + "/SM) " +
                  std::to_string(geometry.splits) + " k-splits x" + std::to_string(geometry.max_k);
  return plan;
}

Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream) {
  const DirectVariant kernel = direct_variant_for(w.type, w.has_zeros, plan.variant);
  DirectParams p{};
  p.x = x;
  p.y = y;
  p.tiles = static_cast<const uint4*>(w.tiles);
  p.scales = static_cast<const std::uint16_t*>(w.scales);
  p.zeros = static_cast<const std::uint8_t*>(w.zeros);
  p.m = m;
  p.n = w.n;
  p.k = w.k;
  p.group_tiles = w.group_size / kTileK;
  p.groups = w.k / w.group_size;
  p.strips = w.n / kTileN;
  p.k_tiles = w.k / kTileK;
  p.units = w.k / (kTileK * kernel.unroll);
  p.splits = plan.splits;
  const DirectGeometry geometry = direct_geometry(w, kernel.unroll, 8 * kernel.n8, plan.splits);
  p.x_pitch = geometry.x_pitch;
  if (plan.splits > 1) {
    if (workspace == nullptr) return failed_precondition("W4A16 direct kernel: no workspace");
    p.partial = static_cast<float*>(workspace);
    p.counters = reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) +
                                        align256(static_cast<std::size_t>(m) * w.n * 4));
  }
  kernel.function<<<plan.blocks, plan.threads, plan.shared_bytes, stream>>>(p);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::kernels::w4a16_detail
