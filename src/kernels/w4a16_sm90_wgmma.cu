// Hopper W4A16 kernel for M = 32..256+: the int4 weights, dequantised and scaled in registers, are
// the A operand of wgmma (the "RS" form: A from registers, B = x tokens from shared memory), so the
// tensor cores run at wgmma rates instead of mma.sync's. docs/w4a16-gemm.md, "Hopper wgmma kernel".
//
// wgmma needs the arch-specific sm_90a target: src/kernels/CMakeLists.txt compiles this file with
// 90a in place of 90 and defines GPUOPT_WGMMA_SM90A; without it the kernel body is empty and
// plan_wgmma refuses.
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
#include "w4a16_wgmma_partition.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GPUOPT_WGMMA_DEVICE 1
#else
#define GPUOPT_WGMMA_DEVICE 0
#endif

namespace gpuopt::kernels::w4a16_detail {
namespace {

// A block covers 4 strips (256 columns) x kTokens tokens of one k-split. Its warpgroups split the
// strips (kStrips each) and share the x tile in shared memory.
constexpr int kBlockStrips = 4;
[[maybe_unused]] constexpr int kBlockColumns = kBlockStrips * kTileN;
constexpr int kStageTiles = kStageK / kTileK;  // k16 tiles per 64-k stage

struct WgmmaParams {
  LayerOperands op;  // counters: [column tiles x token tiles]
  int k_tiles;       // K / 16
  int k_stages;      // K / 64
  int splits;        // k-splits per output tile
  int token_tiles;   // ceil(M / kTokens)
  int tiles;         // column tiles x token tiles
  // k16 tile t's quantization group without a division: t >> group_shift when group_tiles is a
  // power of two, else __umulhi(t, group_magic) (exact for t, group_tiles < 2^16; host-checked).
  int group_shift;  // -1: use group_magic
  std::uint32_t group_magic;
  // 0: block b is split b % splits of tile b / splits (token tiles fastest). 1 (stream-K): the
  // grid is one wave and block b takes the (tile, 64-k stage) units [b T / B, (b + 1) T / B) of
  // all T = tiles x k_stages laid end to end, one segment per tile it touches.
  int stream_k;
  // The shared fix-up of k-splits (the kScatter instances; the others add 16-byte atomics into one
  // [M][N] sum, the tile's last piece converting it): each of the `splits` pieces has a slice of
  // slice_stride floats in the workspace; it stores its partial there, fences and counts, waits for
  // the tile's other splits and converts its share, adding the slices in split order; `done` counts
  // the shares and the last resets both counters. Needs every block resident at once: run_wgmma
  // launches it cooperatively.
  std::size_t slice_stride;
  int* done;  // [tiles]
};

#if GPUOPT_WGMMA_DEVICE
__device__ __forceinline__ int group_of(const WgmmaParams& p, int t) {
  return p.group_shift >= 0 ? t >> p.group_shift
                            : static_cast<int>(__umulhi(static_cast<unsigned>(t), p.group_magic));
}
#endif

// One pipeline stage in shared memory (offsets in bytes; the x tile first, 1024-aligned for the
// 128-byte swizzle):
//   x       [kTokens][64 k] fp16/bf16, row r's 16-byte chunk c at r*128 + ((c ^ r%8) * 16)
//   weights [4 strips][4 k16 tiles][512 bytes]   (the global tile layout, strip-major)
//   scales  [4 k16 tiles][4 strips][8 g][8 j]    (the group of each k16 tile)
//   zeros   [4 k16 tiles][4 strips][8 g][8 j] bytes
template <int kTokens>
struct StageLayout {
  [[maybe_unused]] static constexpr int kX = 0;
  static constexpr int kWeights = kTokens * 128;
  static constexpr int kScales = kWeights + kBlockStrips * kStageTiles * kTileBytes;
  static constexpr int kZeros = kScales + kStageTiles * kBlockStrips * 64 * 2;
  static constexpr int kBytes = kZeros + kStageTiles * kBlockStrips * 64;
  static_assert(kBytes % 1024 == 0 && kX % 1024 == 0,
                "stages must keep the x tile 1024-byte aligned");
};

#if GPUOPT_WGMMA_DEVICE
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
__device__ __forceinline__ void pin(float& value) { asm volatile("" : "+f"(value)::"memory"); }

// A counter read with acquire semantics at GPU scope (the shared fix-up's wait).
__device__ __forceinline__ int load_acquire(const int* counter) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(counter) : "memory");
  return value;
}

// Writes by the generic proxy (cp.async) made visible to the async proxy (wgmma's operand reads).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One asm statement per N, the operand type spliced in ("f16" or "bf16"); the accumulator list
// grows with N (16, 32 or 64 registers per thread).
#define GPUOPT_WGMMA_RS_N32(TYPE)                                                               \
  asm volatile(                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                              \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE                               \
      " "                                                                                       \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                \
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                             \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15])                                                                \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)                           \
      : "memory")
#define GPUOPT_WGMMA_RS_N64(TYPE)                                                                  \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                  \
      " "                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
      "%19, "                                                                                      \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                              \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)                              \
      : "memory")
#define GPUOPT_WGMMA_RS_N128(TYPE)                                                                 \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                                 \
      " "                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
      "%19, "                                                                                      \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
      "%56, %57, %58, %59, %60, %61, %62, %63}, "                                                  \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                                \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)                              \
      : "memory")

// wgmma m64nNk16, A (4 registers per thread: the mma.m16n8k16 A fragment of the warp's 16 rows),
// B from a shared-memory descriptor (K-major, 128-byte swizzle), D += A * B in fp32.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_rs(float* d, const std::uint32_t* a, std::uint64_t desc) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "token tiles of 32, 64 or 128");
#define GPUOPT_WGMMA_RS_BY_N(TYPE) \
  if constexpr (kN == 32) {        \
    GPUOPT_WGMMA_RS_N32(TYPE);     \
  } else if constexpr (kN == 64) { \
    GPUOPT_WGMMA_RS_N64(TYPE);     \
  } else {                         \
    GPUOPT_WGMMA_RS_N128(TYPE);    \
  }
  if constexpr (std::is_same_v<T, __half>) {
    GPUOPT_WGMMA_RS_BY_N("f16");
  } else {
    GPUOPT_WGMMA_RS_BY_N("bf16");
  }
#undef GPUOPT_WGMMA_RS_BY_N
}
#undef GPUOPT_WGMMA_RS_N32
#undef GPUOPT_WGMMA_RS_N64
#undef GPUOPT_WGMMA_RS_N128

// Per-group constants of the kS words a warp decodes: entry 2i is for rows g of wgmma i (column
// 16(word_base + i) + g of the strip, j = 2(word_base + i)), entry 2i + 1 for rows g + 8 (j + 1).
template <int kS>
struct Constants {
  std::uint32_t scale[2 * kS];  // scale pairs
  std::uint32_t sub[2 * kS];    // pairs of fp16 1024 + zero, bf16 128 + zero
  std::uint32_t nsub[2 * kS];   // fp16 only: pairs of -(64 + zero), for the high nibbles
};

template <typename T, int kTokens, int kS, bool kZeros>
__device__ __forceinline__ void load_constants(const unsigned char* stage, int kk, int strip_local,
                                               int word_base, int g, Constants<kS>& out) {
  using Layout = StageLayout<kTokens>;
  const int entry = (kk * kBlockStrips + strip_local) * 64 + g * 8 + 2 * word_base;
  static_assert(kS == 2, "a warp decodes 2 words of its lane's 16 bytes");
  std::uint32_t scale_words[kS];
  const uint2 v = *reinterpret_cast<const uint2*>(stage + Layout::kScales + entry * 2);
  scale_words[0] = v.x;
  scale_words[1] = v.y;
  std::uint32_t zero_words[2] = {0x08080808u, 0x08080808u};  // symmetric: zero 8
  if constexpr (kZeros) {
    zero_words[0] = *reinterpret_cast<const std::uint32_t*>(stage + Layout::kZeros + entry);
  }
#pragma unroll
  for (int e = 0; e < 2 * kS; ++e) {
    out.scale[e] = __byte_perm(scale_words[e / 2], 0, e % 2 == 0 ? 0x1010 : 0x3232);
    const std::uint32_t zero = (zero_words[e / 4] >> (8 * (e % 4))) & 0xffu;
    // The magic number plus zero, built like the weights: 1024 + zero (fp16), 128 + zero (bf16).
    out.sub[e] = TypeTraits<T>::kMagic | (zero * 0x00010001u);
    if constexpr (std::is_same_v<T, __half>) {
      out.nsub[e] = as_bits(__float2half2_rn(-(64.0f + static_cast<float>(zero))));
    }
  }
}

// Word `word` of a lane's 16 bytes -> the A fragment {a0, a1, a2, a3} of its m16 tile (as in
// w4a16_sm80_direct.cu: nibbles 0/4 -> a0, 1/5 -> a2, 2/6 -> a1, 3/7 -> a3), times the group scale:
// (q - zero) is exact, the scale multiply the only rounding (as in the CPU twin).
template <typename T, int kS>
__device__ __forceinline__ void dequantize_scaled(std::uint32_t word, const Constants<kS>& k, int i,
                                                  std::uint32_t* a) {
  using Pair = typename TypeTraits<T>::Pair;
  const Pair s0 = as_pair<Pair>(k.scale[2 * i]);
  const Pair s1 = as_pair<Pair>(k.scale[2 * i + 1]);
  const std::uint32_t magic = TypeTraits<T>::kMagic;
  if constexpr (std::is_same_v<T, __half>) {
    // fp16: the odd nibbles stay in bits 4-7 of their half (1024 + 16 q, exact), and one fma by
    // 1/16 gives 64 + q - (64 + zero) = q - zero exactly: one shift per word instead of three
    // (measured 2026-11-30, docs/PERFORMANCE.md).
    const Pair sixteenth = __float2half2_rn(1.0f / 16.0f);
    const std::uint32_t lo0 = and_or(word, 0x000f000fu, magic);
    const std::uint32_t hi0 = and_or(word, 0x00f000f0u, magic);
    const std::uint32_t shifted = word >> 8;
    const std::uint32_t lo1 = and_or(shifted, 0x000f000fu, magic);
    const std::uint32_t hi1 = and_or(shifted, 0x00f000f0u, magic);
    a[0] = as_bits(__hmul2(__hsub2(as_pair<Pair>(lo0), as_pair<Pair>(k.sub[2 * i])), s0));
    a[2] =
        as_bits(__hmul2(__hfma2(as_pair<Pair>(hi0), sixteenth, as_pair<Pair>(k.nsub[2 * i])), s0));
    a[1] = as_bits(__hmul2(__hsub2(as_pair<Pair>(lo1), as_pair<Pair>(k.sub[2 * i + 1])), s1));
    a[3] = as_bits(
        __hmul2(__hfma2(as_pair<Pair>(hi1), sixteenth, as_pair<Pair>(k.nsub[2 * i + 1])), s1));
    return;
  }
  // bf16 (7 mantissa bits): bit 7 of a half is the exponent's lowest bit, so every nibble is moved
  // to bits 0-3 first.
  const std::uint32_t v0 = and_or(word, 0x000f000fu, magic);
  const std::uint32_t v1 = and_or(word >> 4, 0x000f000fu, magic);
  const std::uint32_t v2 = and_or(word >> 8, 0x000f000fu, magic);
  const std::uint32_t v3 = and_or(word >> 12, 0x000f000fu, magic);
  a[0] = as_bits(__hmul2(__hsub2(as_pair<Pair>(v0), as_pair<Pair>(k.sub[2 * i])), s0));
  a[2] = as_bits(__hmul2(__hsub2(as_pair<Pair>(v1), as_pair<Pair>(k.sub[2 * i])), s0));
  a[1] = as_bits(__hmul2(__hsub2(as_pair<Pair>(v2), as_pair<Pair>(k.sub[2 * i + 1])), s1));
  a[3] = as_bits(__hmul2(__hsub2(as_pair<Pair>(v3), as_pair<Pair>(k.sub[2 * i + 1])), s1));
}

// A tile's fp32 quads (4 columns of one token) in the fix-ups, in two numberings. Slots: q = row *
// 64 + c4 over the block's full 256 columns, quad q present when c4 < row_quads (the last column
// tile of N % 256 != 0 has fewer): shifts and masks only. Compact (fix_up_tile's): q = row *
// row_quads + c4, every q < quads present. index is the [M][N] index, offset the place in the
// partial tile in shared memory (rows of `pitch` floats). (A division by the runtime row_quads in
// the shared fix-up's loops had ptxas move the wgmma main loop's group constants out of uniform
// registers into constant-bank loads, 288 -> 290 SASS instructions a stage with 12 more loads.)
struct TileQuads {
  static constexpr int kRowSlots = kBlockColumns / 4;
  std::size_t first;  // [M][N] index of the tile's first element
  int n, row_quads, rows, pitch;
  __device__ __forceinline__ int slots() const { return rows * kRowSlots; }
  __device__ __forceinline__ bool present(int q) const { return q % kRowSlots < row_quads; }
  __device__ __forceinline__ std::size_t index(int q) const {
    return first + static_cast<std::size_t>(q / kRowSlots) * n + (q % kRowSlots) * 4;
  }
  __device__ __forceinline__ int offset(int q) const {
    return (q / kRowSlots) * pitch + (q % kRowSlots) * 4;
  }
  __device__ __forceinline__ int quads() const { return rows * row_quads; }
  __device__ __forceinline__ int compact(int q) const {  // compact -> slot numbering
    const int row = q / row_quads;
    return row * kRowSlots + (q - row * row_quads);
  }
};

__device__ __forceinline__ TileQuads tile_quads(int m, int n, int token0, int first_column,
                                                int tokens, int pitch) {
  const int columns = min(kBlockColumns, n - first_column);
  const int rows = min(tokens, m - token0);
  return {static_cast<std::size_t>(token0) * n + first_column, n, columns / 4, rows, pitch};
}

// The shared fix-up (WgmmaParams::slice_stride) of a k-split's piece of a tile, its fp32 partial
// in shared memory (`tile`, rows of tq.pitch floats), in two steps. store_piece: the piece stores
// its partial into its slice (all but its own share of the conversion, which it reads from shared
// memory), fences and counts. convert_share: waits until every piece is counted and converts its
// share of the tile's quads (4 columns of one token), adding the slices in slot order.
template <int kThreads>
__device__ __forceinline__ void store_piece(const float* tile, TileQuads tq, float* slices,
                                            std::size_t slice_stride, int* counter, int stages,
                                            WgmmaPieces pieces) {
  const int tid = threadIdx.x;
  const WgmmaShare share = wgmma_share(tq.slots(), pieces.slot, pieces.pieces);
  __syncthreads();  // the partial tile is whole in shared memory
  float* const own_slice = slices + pieces.slot * slice_stride;
  for (int q = tid; q < tq.slots(); q += kThreads) {
    if ((q >= share.begin && q < share.end) || !tq.present(q)) continue;
    __stcg(reinterpret_cast<float4*>(own_slice + tq.index(q)),
           *reinterpret_cast<const float4*>(tile + tq.offset(q)));
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) atomicAdd(counter, stages);
}

template <typename T, int kThreads>
__device__ __forceinline__ void convert_share(const float* tile, TileQuads tq, const float* slices,
                                              std::size_t slice_stride, int* counter, int* done,
                                              int k_stages, WgmmaPieces pieces, T* y) {
  const int tid = threadIdx.x;
  const WgmmaShare share = wgmma_share(tq.slots(), pieces.slot, pieces.pieces);
  if (tid == 0) {
    while (load_acquire(counter) < k_stages) __nanosleep(32);
  }
  __syncthreads();
  __threadfence();
  // Every slice added in slot order (the same sums in the same order every run).
  for (int q = share.begin + tid; q < share.end; q += kThreads) {
    if (!tq.present(q)) continue;
    const std::size_t index = tq.index(q);
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int first = 0; first < pieces.pieces; first += 8) {
      float4 part[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int slot = first + j;
        part[j] =
            slot >= pieces.pieces ? make_float4(0.f, 0.f, 0.f, 0.f)
            : slot == pieces.slot
                ? *reinterpret_cast<const float4*>(tile + tq.offset(q))
                : __ldcg(reinterpret_cast<const float4*>(slices + slot * slice_stride + index));
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sum.x += part[j].x;
        sum.y += part[j].y;
        sum.z += part[j].z;
        sum.w += part[j].w;
      }
    }
    store_four<T>(y + index, sum);
  }
  __syncthreads();
  if (tid == 0 && atomicAdd(done, 1) == pieces.pieces - 1) {
    *counter = 0;  // every share is converted: ready for the next run
    *done = 0;
  }
}

// The copies of stage `stage` into ring slot `slot`: x rows and weights from the segment's running
// sources (each stepped by a stage), scales and zeros of the k16 tiles where the decode loop loads
// constants (a group's first, the segment's first: k-stage s0). The copy state is the segment's
// own variables, named here as a lambda's captures would name them.
template <typename T, int kXCopies, int kWeightCopies>
struct WgmmaCopies {
  const T* (&x_next)[kXCopies];
  int (&x_step)[kXCopies];
  const uint4* (&w_next)[kWeightCopies];
  int (&w_step)[kWeightCopies];
  const std::uint64_t& policy;
  const std::uint32_t& x_dst;  // this thread's x chunk within a slot's x tile
  const int& sc_kk;            // scales: this thread's k16 tile and strip
  const int& sc_strip;
  const int& z_kk;  // zeros: the same
  const int& z_strip;
};
template <typename T, int kThreads, int kTokens, bool kZeros, int kXCopies, int kWeightCopies>
__device__ __forceinline__ void wgmma_load_stage(const WgmmaParams& p,
                                                 const WgmmaCopies<T, kXCopies, kWeightCopies>& c,
                                                 std::uint32_t base_address, int s0, int slot,
                                                 int stage) {
  using Layout = StageLayout<kTokens>;
  const int tid = threadIdx.x;
  const std::uint32_t slot_address = base_address + slot * Layout::kBytes;
  const int t0 = stage * kStageTiles;
#pragma unroll
  for (int j = 0; j < kXCopies; ++j) {
    copy_async_16(slot_address + Layout::kX + c.x_dst + j * kThreads * 16, c.x_next[j],
                  c.x_step[j] != 0 ? 16 : 0);
    c.x_next[j] += c.x_step[j];
  }
#pragma unroll
  for (int j = 0; j < kWeightCopies; ++j) {
    copy_async_16_hint(slot_address + Layout::kWeights + (tid + j * kThreads) * 16, c.w_next[j],
                       c.w_step[j] != 0 ? 16 : 0, c.policy);
    c.w_next[j] += c.w_step[j];
  }
  if (tid < kStageTiles * kBlockStrips * 8) {
    const int t = t0 + c.sc_kk;
    const int group = group_of(p, t);
    // Only the tiles where the decode loop loads constants: a group's first, the split's first.
    if (t == group * p.op.group_tiles || t == s0 * kStageTiles) {
      const bool valid = c.sc_strip < p.op.strips;
      copy_async_16(
          slot_address + Layout::kScales + tid * 16,
          p.op.scales +
              (static_cast<std::size_t>(group) * p.op.strips + (valid ? c.sc_strip : 0)) * 64 +
              (tid % 8) * 8,
          valid ? 16 : 0);
    }
  }
  if constexpr (kZeros) {
    if (tid < kStageTiles * kBlockStrips * 4) {
      const int t = t0 + c.z_kk;
      const int group = group_of(p, t);
      if (t == group * p.op.group_tiles || t == s0 * kStageTiles) {
        const bool valid = c.z_strip < p.op.strips;
        copy_async_16(
            slot_address + Layout::kZeros + tid * 16,
            p.op.zeros +
                (static_cast<std::size_t>(group) * p.op.strips + (valid ? c.z_strip : 0)) * 64 +
                (tid % 4) * 16,
            valid ? 16 : 0);
      }
    }
  }
}

// The epilogue of a whole tile: acc stored to y. D fragment: acc[i][4 jn + e] is row
// 16 w + g + 8 (e / 2) of wgmma i (column 16 (word_base + i) + g + 8 (e / 2) of the strip), column
// (token) 8 jn + 2 c + e % 2.
template <typename T, int kTokens, int kS>
__device__ __forceinline__ void wgmma_store_tile(const WgmmaParams& p,
                                                 const float (&acc)[kS][kTokens / 2], int token0,
                                                 int strip, int word_base, int g, int c) {
  T* y = static_cast<T*>(p.op.y);
#pragma unroll
  for (int i = 0; i < kS; ++i) {
#pragma unroll
    for (int jn = 0; jn < kTokens / 8; ++jn) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = token0 + 8 * jn + 2 * c + e % 2;
        if (token >= p.op.m) continue;
        const int column = strip * kTileN + 16 * (word_base + i) + g + 8 * (e / 2);
        const std::size_t index = static_cast<std::size_t>(token) * p.op.n + column;
        y[index] = float_to_value<T>(acc[i][4 * jn + e]);
      }
    }
  }
}

// The epilogue of a piece of a tile: its fp32 partial (acc) into shared memory, `tile` =
// [kTokens][kPitch] fp32 (the pad spreads the 32 lanes of a store over 32 banks), read back 4
// columns at a time by the fix-up.
template <int kTokens, int kS, int kPitch>
__device__ __forceinline__ void wgmma_stage_partial(const float (&acc)[kS][kTokens / 2],
                                                    float* tile, int strip_local, int word_base,
                                                    int g, int c) {
#pragma unroll
  for (int i = 0; i < kS; ++i) {
#pragma unroll
    for (int jn = 0; jn < kTokens / 8; ++jn) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 8 * jn + 2 * c + e % 2;
        const int column = strip_local * kTileN + 16 * (word_base + i) + g + 8 * (e / 2);
        tile[row * kPitch + column] = acc[i][4 * jn + e];
      }
    }
  }
}

// The fix-up of a piece of tile tile_index (k-stages [s0, s1), its partial in shared memory at
// `tile`) with the 16-byte atomic sums: the block that completes the tile's count converts it
// (4 columns a quad, kBatch = 8 quads a thread in flight) and leaves the workspace and the counter
// zero. is_last: a __shared__ flag of the block.
template <typename T, int kThreads, int kTokens>
__device__ __forceinline__ void wgmma_count_and_fix_up(const WgmmaParams& p, int tile_index,
                                                       int token0, int first_strip, int s0, int s1,
                                                       int& is_last) {
  const int tid = threadIdx.x;
  T* y = static_cast<T*>(p.op.y);
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    // The counter adds up the k-stages of the tile's segments; the one that completes K fixes up.
    const int before = atomicAdd(p.op.counters + tile_index, s1 - s0);
    is_last = before + (s1 - s0) == p.k_stages;
    if (is_last) p.op.counters[tile_index] = 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const TileQuads tq = tile_quads(p.op.m, p.op.n, token0, first_strip * kTileN, kTokens, 0);
  fix_up_tile<T, kThreads, 8>(
      tid, tq.quads(), [&](int q) { return tq.index(tq.compact(q)); }, p.op.partial, 0, 1, true, y);
}

// The fix-up side of a piece of a tile whose partial is in shared memory (`tile`, rows of kPitch
// floats; tq its quads): kScatter: store the piece into its slice and convert its share (a
// block's only segment). Else the piece adds its partial into the workspace with 16-byte atomics,
// unless it is the tile's last (see below), when it converts the tile itself. True when the
// segment is done (no count to take).
template <typename T, int kThreads, bool kScatter>
__device__ __forceinline__ bool wgmma_add_partial(const WgmmaParams& p, const float* tile,
                                                  const TileQuads& tq, int tile_index, int s0,
                                                  int s1, bool last_of_block, int& is_last) {
  const int tid = threadIdx.x;
  T* y = static_cast<T*>(p.op.y);
  if constexpr (kScatter) {  // k-splits: a block's only segment
    const WgmmaPieces pieces =
        wgmma_split_pieces(static_cast<int>(blockIdx.x), p.splits, p.token_tiles);
    store_piece<kThreads>(tile, tq, p.op.partial, p.slice_stride, p.op.counters + tile_index,
                          s1 - s0, pieces);
    convert_share<T, kThreads>(tile, tq, p.op.partial, p.slice_stride, p.op.counters + tile_index,
                               p.done + tile_index, p.k_stages, pieces, y);
    return true;
  }
  // The last segment of a stream-K block looks at its tile's counter first: the tile's
  // later k-stages are often counted early, by the next block's first segment. If every
  // other piece is counted (their sums landed: each fences before counting), this block is
  // the tile's last and nobody else touches it, so it adds its partial to theirs while
  // converting, skipping its own reductions, fence and count (H200: M=64 73.3-73.7 ->
  // 70.8-71.0 us on 8192 x 28672). Not for k-splits, whose pieces all end
  // together: there it cost 0.3-1.0 us at M = 32-64 (the look presumably rarely succeeds).
  if (tid == 0) {
    is_last = 0;
    if (last_of_block) {
      const int counted = *reinterpret_cast<volatile int*>(p.op.counters + tile_index);
      is_last = counted + (s1 - s0) == p.k_stages;
    }
  }
  __syncthreads();
  if (is_last) {
    __threadfence();
    fix_up_tile<T, kThreads, 8>(
        tid, tq.quads(), [&](int q) { return tq.index(tq.compact(q)); }, p.op.partial, 0, 1, true,
        y,
        [&](int q) { return *reinterpret_cast<const float4*>(tile + tq.offset(tq.compact(q))); });
    if (tid == 0) p.op.counters[tile_index] = 0;
    return true;  // (the next segment starts with a barrier before reusing the tile's memory)
  }
  for (int q = tid; q < tq.slots(); q += kThreads) {
    if (!tq.present(q)) continue;
    atomicAdd(reinterpret_cast<float4*>(p.op.partial + tq.index(q)),
              *reinterpret_cast<const float4*>(tile + tq.offset(q)));
  }
  return false;
}

#endif  // GPUOPT_WGMMA_DEVICE

// kWarpgroups x kS = 4 strips per block; kTokens tokens per block (the wgmma N); kStages 64-k
// shared-memory stages, kStages - 2 in flight (a slot is refilled two stages after its last
// wgmma was issued, so one wgmma group may still be running on the previous slot).
//
// Warp w of a warpgroup loads the kS words [word_base, word_base + kS) of its lane's 16 bytes of
// strip w % kS (word_base = (w / kS) * kS), and wgmma i takes word word_base + i from every warp:
// its 64 rows are, per warp, the 16 columns 16(word_base + i)..+15 of that warp's strip. So every
// weight byte in shared memory is read once, by one lane, with one LDS.
//
// kFastCopy (the copy form of every variant): a generic copy loop per stage compiled to ~700 SASS
// instructions a stage (runtime div/mod, 64-bit index math and spills per 16-byte copy, in partly
// unrolled loops), more than the decode and wgmma issue of the stage. The fast form fixes each
// thread's copies once (compile-time counts, per-thread bases) so a stage only adds its k offset,
// and copies a k16 tile's scales/zeros only where the decode loop reads them (the first tile of
// the split and of each group), not for every k16 tile.

// kScatter: the shared fix-up of k-splits (WgmmaParams::slice_stride)
// in place of the atomic partial sums. A template parameter, not a runtime branch: in the same
// kernel its code changed ptxas's allocation of the main loop (1-10 % more SASS instructions a
// stage depending on the form, or the group constants reloaded from the constant bank), and the
// 64-token variant ran 5-10 % slower on the H200 even where the fix-up was not taken. The kScatter
// instance's own loop was 301 instructions at 64 tokens while WgmmaParams carried an unused int for
// it; without that field it is 286 (the others 287), and 28672 x 8192 M=64 ran 69.6 -> 67.1 us.
template <typename T, int kWarpgroups, int kS, int kTokens, int kStages, int kMinBlocks,
          bool kZeros, bool kFastCopy = false, bool kScatter = false>
__global__ void __launch_bounds__(128 * kWarpgroups, kMinBlocks)
    k_w4a16_wgmma(const WgmmaParams p) {
#if GPUOPT_WGMMA_DEVICE
  using Layout = StageLayout<kTokens>;
  constexpr int kThreads = 128 * kWarpgroups;
  static_assert(kWarpgroups * kS == kBlockStrips, "a block covers 4 strips");
  static_assert(kS == 2 && kFastCopy, "2 warpgroups x 2 strips, per-thread copy bases");
  static_assert(kStages >= 3, "one stage computing, one draining, one or more loading");
  extern __shared__ unsigned char shared_raw[];
  __shared__ int is_last;
  // The 128-byte swizzle repeats every 1024 bytes: stage bases must be 1024-aligned.
  const std::uint32_t raw_address = shared_address(shared_raw);
  const std::uint32_t base_address = (raw_address + 1023u) & ~1023u;
  unsigned char* const base = shared_raw + (base_address - raw_address);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int w = warp % 4;
  const int g = lane / 4;
  const int c = lane % 4;
  const int strip_local = (warp / 4) * kS + w % kS;
  const int word_base = (w / kS) * kS;

  // One segment: the k-stages [s0, s1) of one output tile, then its store or its fp32 partial.
  // last_of_block: the block's last segment of a stream-K grid (where its tile's other pieces are
  // often already counted: see the look at the counter below).
  auto segment = [&](const int token_tile, const int column_tile, const int s0, const int s1,
                     const bool last_of_block) {
    const int token0 = token_tile * kTokens;
    const int first_strip = column_tile * kBlockStrips;

    const std::uint64_t policy = evict_first_policy();
    const T* x = static_cast<const T*>(p.op.x);

    // ---- per-thread copy bases ----
    constexpr int kXCopies = kTokens * 8 / kThreads;
    constexpr int kWeightCopies = kBlockStrips * kStageTiles * 32 / kThreads;
    static_assert(kTokens * 8 % kThreads == 0 && kThreads % 128 == 0, "whole copies per thread");
    // x: thread tid copies chunk tid % 8 of rows tid / 8 + j * kThreads / 8; kThreads / 8 is a
    // multiple of 8, so the swizzle (chunk ^ row % 8) is the same for every j.
    const int x_row = tid / 8;
    const int x_chunk = tid % 8;
    const std::uint32_t x_dst = x_row * 128 + ((x_chunk ^ (x_row % 8)) * 16);
    const T* const x_src = x + static_cast<std::size_t>(token0 + x_row) * p.op.k + x_chunk * 8;
    const int x_rows_left = p.op.m - token0 - x_row;  // copy j is real when j * kThreads / 8 < this
    // Weights: copy j is 16-byte chunk q = tid + j * kThreads of the stage's [4 strips][4 k16][512
    // B] (strip q / 128, offset q % 128 in the strip's contiguous 2 KB of the stage).
    const uint4* const w_src =
        p.op.tiles + (static_cast<std::size_t>(first_strip + tid / 128) * p.k_tiles) * 32 +
        tid % 128;
    const int w_strips_left = p.op.strips - first_strip - tid / 128;
    // Scales (tid < 128): k16 tile tid / 32, strip (tid / 8) % 4, chunk tid % 8; zeros (tid < 64):
    // tile tid / 16, strip (tid / 4) % 4, chunk tid % 4.
    const int sc_kk = tid / 32;
    const int sc_strip = first_strip + (tid / 8) % kBlockStrips;
    const int z_kk = tid / 16;
    const int z_strip = first_strip + (tid / 4) % kBlockStrips;

    // Running sources: stages are loaded in order (s0, s0 + 1, ...), so each copy's source is set
    // once per segment and stepped by a stage; a copy with no data (rows past M, the last column
    // tile of N % 256 != 0) reads 0 bytes from the layer's base and does not step. (Computing each
    // address from the stage index took ~60 instructions a stage at M=64, a fifth of the loop.)
    const T* x_next[kXCopies];
    int x_step[kXCopies];
#pragma unroll
    for (int j = 0; j < kXCopies; ++j) {
      const bool valid = j * (kThreads / 8) < x_rows_left;  // rows past M are zero
      x_next[j] =
          valid ? x_src + static_cast<std::size_t>(j) * (kThreads / 8) * p.op.k + s0 * kStageK : x;
      x_step[j] = valid ? kStageK : 0;
    }
    const uint4* w_next[kWeightCopies];
    int w_step[kWeightCopies];
#pragma unroll
    for (int j = 0; j < kWeightCopies; ++j) {
      const bool valid = j * (kThreads / 128) < w_strips_left;
      w_next[j] = valid ? w_src + static_cast<std::size_t>(j) * (kThreads / 128) * p.k_tiles * 32 +
                              s0 * kStageTiles * 32
                        : p.op.tiles;
      w_step[j] = valid ? kStageTiles * 32 : 0;
    }

    const WgmmaCopies<T, kXCopies, kWeightCopies> copies{x_next, x_step, w_next,   w_step, policy,
                                                         x_dst,  sc_kk,  sc_strip, z_kk,   z_strip};
    auto load = [&](int slot, int stage) {
      wgmma_load_stage<T, kThreads, kTokens, kZeros>(p, copies, base_address, s0, slot, stage);
    };

    float acc[kS][kTokens / 2];
#pragma unroll
    for (int i = 0; i < kS; ++i) {
#pragma unroll
      for (int e = 0; e < kTokens / 2; ++e) acc[i][e] = 0.0f;
    }
    Constants<kS> constants;
    std::uint32_t a[2][kS][4];

#pragma unroll
    for (int i = 0; i < kStages - 2; ++i) {
      if (s0 + i < s1) load(i, s0 + i);
      copy_async_commit();
    }

    // Shared-memory matrix descriptor: 128-byte swizzle (bits 62-63 = 1), 8-row groups 1024 bytes
    // apart (stride, bits 32-45), leading offset unused for swizzled K-major (1), start address
    // >> 4 in bits 0-13; a k16 step inside the 64-k row adds 32 bytes to the start.
    const std::uint64_t descriptor_base =
        (1ull << 62) | (static_cast<std::uint64_t>(1024 >> 4) << 32) | (1ull << 16);
    int left = 0;  // k16 tiles left in the group whose constants are loaded
    int slot = 0;
    // The main loop stays written out here: as a __device__ function taking acc, the A registers
    // and the constants by reference, the 64-token instance at 128 registers spilled 45 times
    // instead of 6 (stack 16 -> 48 bytes), though its SASS was otherwise alike.
    for (int stage = s0; stage < s1; ++stage) {
      copy_async_wait<kStages - 3>();
      fence_proxy_async();
      __syncthreads();
      // Refill the slot of stage - 2: its wgmmas completed (at most the last group of stage - 1 is
      // still running), and every warp has read its weights and constants (the barrier above).
      {
        const int next = stage + kStages - 2;
        if (next < s1) load(slot + kStages - 2 >= kStages ? slot - 2 : slot + kStages - 2, next);
        copy_async_commit();
      }
      const unsigned char* stage_memory = base + slot * Layout::kBytes;
      // The x tile's descriptor for this slot; k16 tile kk starts 32 bytes (2 in the descriptor's
      // 16-byte units) further along the swizzled 128-byte rows.
      const std::uint64_t slot_descriptor =
          descriptor_base | ((base_address + slot * Layout::kBytes + Layout::kX) >> 4);
      // The stage's weight words read up front, so one shared-memory latency per stage (not one
      // per k16 tile between a wgmma wait and the next decode).
      std::uint32_t stage_words[kStageTiles][kS];
#pragma unroll
      for (int kk = 0; kk < kStageTiles; ++kk) {
        const unsigned char* weights = stage_memory + Layout::kWeights +
                                       (strip_local * kStageTiles + kk) * kTileBytes + lane * 16 +
                                       word_base * 4;
        const uint2 v = *reinterpret_cast<const uint2*>(weights);
        stage_words[kk][0] = v.x;
        stage_words[kk][1] = v.y;
      }
#pragma unroll
      for (int kk = 0; kk < kStageTiles; ++kk) {
        if (left == 0) {
          const int t = stage * kStageTiles + kk;
          load_constants<T, kTokens, kS, kZeros>(stage_memory, kk, strip_local, word_base, g,
                                                 constants);
          left = (group_of(p, t) + 1) * p.op.group_tiles - t;
        }
        --left;
#pragma unroll
        for (int i = 0; i < kS; ++i) {
          dequantize_scaled<T, kS>(stage_words[kk][i], constants, i, a[kk % 2][i]);
        }
        wgmma_fence();
        const std::uint64_t descriptor = slot_descriptor + 2 * kk;
#pragma unroll
        for (int i = 0; i < kS; ++i) wgmma_rs<T, kTokens>(acc[i], a[kk % 2][i], descriptor);
        wgmma_commit();
        // The group of the previous k16 tile is done: its A registers may be rewritten.
        wgmma_wait<1>();
      }
      slot = slot + 1 == kStages ? 0 : slot + 1;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
#pragma unroll
      for (int e = 0; e < kTokens / 2; ++e) pin(acc[i][e]);
    }

    // The epilogue: a whole tile is stored; a piece's partial goes through shared memory to the
    // fix-up: the k-splits' shared one (kScatter), else 16-byte atomic sums into the workspace
    // (instead of 4 scalar ones: the fp32 atomics of 7 splits at M=64 are ~13 M L2 operations on
    // 8192x28672) and the tile's count.
    const bool whole = s0 == 0 && s1 == p.k_stages;
    const int strip = first_strip + strip_local;
    constexpr int kPitch = kBlockColumns + 4;
    static_assert(kTokens * kPitch * 4 <= kStages * Layout::kBytes, "partial tile fits the stages");
    if (!whole) {
      copy_async_wait<0>();
      __syncthreads();  // every warp is done with the stages
      float* tile = reinterpret_cast<float*>(base);
      wgmma_stage_partial<kTokens, kS, kPitch>(acc, tile, strip_local, word_base, g, c);
      const int tile_index = column_tile * p.token_tiles + token_tile;
      const TileQuads tq =
          tile_quads(p.op.m, p.op.n, token0, first_strip * kTileN, kTokens, kPitch);
      if (wgmma_add_partial<T, kThreads, kScatter>(p, tile, tq, tile_index, s0, s1, last_of_block,
                                                   is_last)) {
        return;
      }
    }
    if (strip < p.op.strips && whole) {
      wgmma_store_tile<T, kTokens, kS>(p, acc, token0, strip, word_base, g, c);
    }
    if (whole) return;
    wgmma_count_and_fix_up<T, kThreads, kTokens>(p, column_tile * p.token_tiles + token_tile,
                                                 token0, first_strip, s0, s1, is_last);
  };  // segment

  // This block's units (w4a16_wgmma_partition.hpp): one split of one tile, or with stream-K an
  // equal share of all of them, computed a segment (one tile's stages) at a time.
  const WgmmaUnits units =
      wgmma_block_units(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), p.tiles,
                        p.k_stages, p.splits, p.token_tiles, p.stream_k != 0);
  for (long long u = units.begin; u < units.end;) {
    const WgmmaSegment piece = wgmma_segment(u, units.end, p.k_stages);
    __syncthreads();  // the previous segment's partial tile has been read out of shared memory
    segment(piece.tile % p.token_tiles, piece.tile / p.token_tiles, piece.s0, piece.s1,
            p.stream_k != 0 && u + (piece.s1 - piece.s0) == units.end);
    u += piece.s1 - piece.s0;
  }
#endif  // GPUOPT_WGMMA_DEVICE
}

// ---- host side ----

using WgmmaKernel = void (*)(WgmmaParams);

struct WgmmaVariant {
  WgmmaKernel function;
  int warpgroups, tokens, stages;
  std::size_t shared_bytes;
};

template <typename T, int kWarpgroups, int kS, int kTokens, int kStages, int kMinBlocks,
          bool kZeros, bool kFastCopy = false, bool kScatter = false>
WgmmaVariant make_variant() {
  return {
      &k_w4a16_wgmma<T, kWarpgroups, kS, kTokens, kStages, kMinBlocks, kZeros, kFastCopy, kScatter>,
      kWarpgroups, kTokens, kStages,
      // + 1024: the kernel aligns the stages' base up to 1024 bytes.
      static_cast<std::size_t>(kStages) * StageLayout<kTokens>::kBytes + 1024};
}

// 7, 8, 9: 32, 64 and 128 tokens with 2 warpgroups x 2 strips (accumulators: 2 x 16, 2 x 32 and
// 2 x 64 fp32 per thread), the first two with <= 128 registers (2 blocks = 16 warps per SM, to hide
// latency), all with kFastCopy. The numbers are those of the configuration strings and of the
// figures measured since these variants came in; the forms they replaced (a 1-warpgroup x 4-strip
// tile and the generic copy loop; a warp-specialised producer/consumer form) measured slower at
// every M on the H200 and were removed.
constexpr int kFirstVariant = 7;
constexpr int kLastVariant = 9;

template <typename T, bool kZeros>
WgmmaVariant wgmma_variant(int variant, bool scatter) {
  if (scatter) {  // k-splits with the shared fix-up (plan_wgmma)
    switch (variant) {
      case 7:
        return make_variant<T, 2, 2, 32, 6, 2, kZeros, true, true>();
      case 8:
        return make_variant<T, 2, 2, 64, 5, 2, kZeros, true, true>();
      default:
        return make_variant<T, 2, 2, 128, 5, 1, kZeros, true, true>();
    }
  }
  switch (variant) {
    case 7:
      return make_variant<T, 2, 2, 32, 6, 2, kZeros, true>();
    case 8:
      return make_variant<T, 2, 2, 64, 5, 2, kZeros, true>();
    default:
      return make_variant<T, 2, 2, 128, 5, 1, kZeros, true>();
  }
}

WgmmaVariant wgmma_variant_for(ActivationType type, bool zeros, int variant, bool scatter) {
  if (type == ActivationType::kFloat16) {
    return zeros ? wgmma_variant<__half, true>(variant, scatter)
                 : wgmma_variant<__half, false>(variant, scatter);
  }
  return zeros ? wgmma_variant<__nv_bfloat16, true>(variant, scatter)
               : wgmma_variant<__nv_bfloat16, false>(variant, scatter);
}

// The shared fix-up's workspace: a [M][N] fp32 slice per split, then a counter and a share count
// per tile. The counters' offset (the whole is that plus two ints per tile).
std::size_t scatter_counters_offset(int splits, int m, int n) {
  return static_cast<std::size_t>(splits) * partials_bytes(m, n);
}

int column_tiles(const W4A16DeviceWeights& w) {
  return (w.n / kTileN + kBlockStrips - 1) / kBlockStrips;
}

}  // namespace

StatusOr<KernelPlan> plan_wgmma(const W4A16DeviceWeights& w, int m, int device, int sms,
                                const W4A16Tuning& tuning) {
#if !defined(GPUOPT_WGMMA_SM90A)
  (void)w;
  (void)m;
  (void)device;
  (void)sms;
  (void)tuning;
  return failed_precondition(
      "W4A16 wgmma kernel: this build has no sm_90a code (wgmma needs the arch-specific target; "
      "src/kernels/CMakeLists.txt adds it when CMAKE_CUDA_ARCHITECTURES lists 90)");
#else
  if (m < 1) return failed_precondition("W4A16 wgmma kernel: M=" + std::to_string(m) + " < 1");
  if (w.k / kTileK >= (1 << 16)) {
    return failed_precondition("W4A16 wgmma kernel: K=" + std::to_string(w.k) +
                               " has 65536 or more k16 tiles");
  }
  int major = 0, minor = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    return failed_precondition(
        "W4A16 wgmma kernel: needs compute capability 9.0 (sm_90a), this "
        "GPU is " +
        std::to_string(major) + "." + std::to_string(minor));
  }
  // Measured on the H200 (docs/w4a16-gemm.md): 2 warpgroups x 2 strips with 2 blocks per SM (16
  // warps) beat 1 warpgroup x 4 strips at M <= 64; 128 tokens per block beat 2 x 64 above; the
  // fast-copy forms beat the generic copy loop at every M = 32..256 on both 70B shapes (H200,
  // 2026-11-30, same splits: 8192x28672 M=64 108.6 vs 147.4 us, 28672x8192 M=256 248.7 vs 333.5).
  int variant = m <= 32 ? 7 : m <= 64 ? 8 : 9;
  if (tuning.wgmma_variant) {
    if (*tuning.wgmma_variant < kFirstVariant || *tuning.wgmma_variant > kLastVariant) {
      return invalid_argument("W4A16Tuning::wgmma_variant=" +
                              std::to_string(*tuning.wgmma_variant) + ": must be 7, 8 or 9");
    }
    variant = *tuning.wgmma_variant;
  }
  const WgmmaVariant kernel = wgmma_variant_for(w.type, w.has_zeros, variant, false);
  cudaFuncAttributes attributes{};
  GPUOPT_CUDA_TRY(
      cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel.function)));
  if (attributes.binaryVersion < 90) {
    return failed_precondition("W4A16 wgmma kernel: the loaded code is for sm_" +
                               std::to_string(attributes.binaryVersion) + ", not sm_90a");
  }
  int optin = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (kernel.shared_bytes > static_cast<std::size_t>(optin)) {
    return failed_precondition("W4A16 wgmma kernel: needs " + std::to_string(kernel.shared_bytes) +
                               " bytes of shared memory per block, this GPU gives " +
                               std::to_string(optin));
  }
  const int threads = 128 * kernel.warpgroups;
  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(kernel.function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kernel.shared_bytes)));
  int per_sm = 0;
  GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel.function, threads,
                                                                kernel.shared_bytes));
  if (per_sm < 1) return internal_error("W4A16 wgmma kernel: 0 blocks per SM");

  // k-splits by wave fill (choose_wgmma_splits, w4a16_plan.cpp).
  const int token_tiles = (m + kernel.tokens - 1) / kernel.tokens;
  const int tiles = column_tiles(w) * token_tiles;
  const int k_stages = w.k / kStageK;
  const int slots = per_sm * sms;
  const WgmmaSplits chosen = choose_wgmma_splits(tiles, k_stages, slots, sms, kernel.tokens, m);
  int splits = chosen.splits;
  if (tuning.wgmma_splits > 0) splits = std::min(tuning.wgmma_splits, k_stages);
  // Stream-K: one wave of blocks, each an equal run of the tiles' k-stages laid end to end (so
  // every SM gets the same weight bytes), where the k-splits leave more than a tenth of the wave
  // idle, for 32- and 64-token tiles, and where each block gets at least 12 stages: measured on
  // the H200 (2026-11-30 09:21-09:30 UTC, docs/PERFORMANCE.md) 8192x28672 M=32 67.6 vs 74.2 us
  // (4 k-splits, 85 % fill), M=64 91.3 vs 98.2; at 97 % fill (28672x8192) a tie; with 128-token
  // tiles slower (155.6 vs 116.6 us: each partial tile is 128 KB of fp32 atomics) unless the
  // k-splits spill over one wave at M <= 256 (3584x18944 M=65..128, 3 splits over two waves:
  // 52.3-63.0 vs 40.8-48.0 us, 2026-12-04); 4096x14336 M=32 (13.6 stages a block) 29.3 vs 33.1 us;
  // on 4096x4096 (3.9 stages a block) slower than cuBLAS at M=32 (19.8 vs 17.2 us).
  // W4A16Tuning::wgmma_stream_k forces it off/on; forced k-splits turn the automatic choice off.
  const bool stream_k_fits = wgmma_stream_k_fits(kernel.tokens, chosen, tiles, k_stages, slots, m);
  const bool stream_k = tuning.wgmma_stream_k.value_or(stream_k_fits && tuning.wgmma_splits <= 0);

  long long blocks = stream_k ? std::min<long long>(slots, static_cast<long long>(tiles) * k_stages)
                              : static_cast<long long>(tiles) * splits;
  // Tests: a stream-K grid of any size (over a wave, later blocks start after the pieces before
  // them have finished, so a block's first piece is often the last of its tile to be counted).
  if (stream_k && tuning.wgmma_stream_k_blocks > 0) {
    blocks =
        std::min<long long>(tuning.wgmma_stream_k_blocks, static_cast<long long>(tiles) * k_stages);
  }

  // The shared fix-up (kScatter instances): for the fast-copy variants' k-splits when
  // every block is resident at once (one wave, launched cooperatively), at most 16 splits and 64
  // MiB of slices (the workspace holds a [M][N] fp32 slice per split: 16.8 MB on 28672 x 8192 at
  // M=64, against 2.1 MB for the atomic sums). W4A16Tuning::wgmma_shared_fixup = false keeps the
  // atomic partial sums. (Stream-K keeps them: with the shared fix-up on the H200, 8192 x 28672 was
  // no faster at M=64 and 1.1-2.1 us slower at M=32; its tiles' pieces end at different times.)
  int scatter_slots = 0;
  int cooperative = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  if (!stream_k && splits > 1 && splits <= 16 && blocks <= slots &&
      scatter_counters_offset(splits, m, w.n) <= (std::size_t{64} << 20) && cooperative != 0 &&
      tuning.wgmma_shared_fixup) {
    // Its own kernel instance (kScatter): the same shared memory, and as many blocks per SM, or
    // the one wave would not be resident at once.
    const WgmmaVariant scatter_kernel = wgmma_variant_for(w.type, w.has_zeros, variant, true);
    GPUOPT_CUDA_TRY(cudaFuncSetAttribute(scatter_kernel.function,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(scatter_kernel.shared_bytes)));
    int scatter_per_sm = 0;
    GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &scatter_per_sm, scatter_kernel.function, threads, scatter_kernel.shared_bytes));
    if (scatter_per_sm >= per_sm) scatter_slots = splits;
  }

  KernelPlan plan;
  plan.variant = variant;
  plan.flags = scatter_slots;
  plan.threads = threads;
  plan.blocks_per_sm = per_sm;
  plan.splits = stream_k ? 0 : splits;  // 0: stream-K (as W4A16Config::splits says)
  plan.tiles = tiles;
  plan.blocks = static_cast<int>(blocks);
  plan.shared_bytes = kernel.shared_bytes;
  plan.workspace_bytes = scatter_slots > 0 ? scatter_counters_offset(scatter_slots, m, w.n) +
                                                 2 * static_cast<std::size_t>(tiles) * sizeof(int)
                         : stream_k || splits > 1 ? split_workspace_bytes(m, w.n, tiles)
                                                  : 0;
  plan.describe = "wgmma v" + std::to_string(variant) + " 256x" + std::to_string(kernel.tokens) +
                  " " + std::to_string(threads) + "thr " + std::to_string(kernel.stages) +
                  "st grid" + std::to_string(plan.blocks) + " (" + std::to_string(per_sm) +
                  "/SM) " +
                  (stream_k ? std::string("stream-K") : std::to_string(splits) + " k-splits") +
                  (scatter_slots > 0 ? " shared-fixup" + std::to_string(scatter_slots) : "");
  return plan;
#endif
}

Status run_wgmma(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x, void* y,
                 void* workspace, StreamHandle stream) {
  const bool stream_k = plan.splits == 0;
  if (plan.variant < kFirstVariant || plan.variant > kLastVariant || plan.splits < 0) {
    return failed_precondition("W4A16 wgmma kernel: run without a plan from plan_wgmma");
  }
  const WgmmaVariant kernel = wgmma_variant_for(w.type, w.has_zeros, plan.variant, plan.flags > 0);
  const bool fixup = stream_k || plan.splits > 1;
  if (fixup && workspace == nullptr) {
    return failed_precondition("W4A16 wgmma kernel: no workspace");
  }
  WgmmaParams p{};
  // Without a k-split there is no fix-up: partials and counters stay null.
  p.op = layer_operands(w, m, x, y, fixup ? workspace : nullptr);
  p.k_tiles = w.k / kTileK;
  p.k_stages = w.k / kStageK;
  p.splits = stream_k ? 1 : plan.splits;
  p.stream_k = stream_k ? 1 : 0;
  p.token_tiles = (m + kernel.tokens - 1) / kernel.tokens;
  p.tiles = column_tiles(w) * p.token_tiles;
  const unsigned group_tiles = static_cast<unsigned>(w.group_size / kTileK);
  if (p.k_tiles >= (1 << 16) || group_tiles >= (1u << 16)) {
    return failed_precondition("W4A16 wgmma kernel: K=" + std::to_string(w.k) +
                               " has 65536 or more k16 tiles");
  }
  p.group_shift = -1;
  for (int shift = 0; shift < 16; ++shift) {
    if (group_tiles == (1u << shift)) p.group_shift = shift;
  }
  // ceil(2^32 / d): floor(t * magic / 2^32) == t / d for t, d < 2^16.
  p.group_magic =
      p.group_shift >= 0 ? 0u : static_cast<std::uint32_t>(0xffffffffu / group_tiles + 1);
  if (plan.tiles != p.tiles || (!stream_k && plan.blocks != p.tiles * plan.splits)) {
    return failed_precondition("W4A16 wgmma kernel: the plan was made for another M or layer");
  }
  if (plan.flags > 0) {
    // The shared fix-up (plan.flags = its splits): slices, then the counters and the share counts.
    p.slice_stride = partials_bytes(m, w.n) / sizeof(float);
    p.op.partial = static_cast<float*>(workspace);
    p.op.counters = reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) +
                                           scatter_counters_offset(plan.flags, m, w.n));
    p.done = p.op.counters + p.tiles;
    // Its pieces wait for each other: every block must be resident at once, which a cooperative
    // launch guarantees (or refuses).
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(plan.blocks));
    config.blockDim = dim3(static_cast<unsigned>(plan.threads));
    config.dynamicSmemBytes = plan.shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const cudaError_t launched = cudaLaunchKernelEx(&config, kernel.function, p);
    if (launched != cudaErrorCooperativeLaunchTooLarge) {
      GPUOPT_CUDA_TRY(launched);
      return ok_status();
    }
    // The blocks cannot all be resident on this stream's SMs (a green-context partition smaller
    // than the GPU the plan was made for): the same grid with the atomic partial sums instead,
    // into slice 0 zeroed here (that kernel leaves it zero) and the same counters (zero between
    // runs either way).
    (void)cudaGetLastError();
    GPUOPT_CUDA_TRY(
        cudaMemsetAsync(workspace, 0, static_cast<std::size_t>(m) * w.n * sizeof(float), stream));
    const WgmmaVariant atomic = wgmma_variant_for(w.type, w.has_zeros, plan.variant, false);
    atomic.function<<<plan.blocks, plan.threads, plan.shared_bytes, stream>>>(p);
    GPUOPT_CUDA_TRY_LAUNCH();
    return ok_status();
  }
  kernel.function<<<plan.blocks, plan.threads, plan.shared_bytes, stream>>>(p);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::kernels::w4a16_detail
