// Device helpers shared by the W4A16 kernels (mma.sync, cp.async, ldmatrix, int4 magic numbers,
// Hopper bulk copies and mbarriers). Internal: included only by src/kernels/*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels::w4a16_detail {

// ---- device helpers ----

template <typename T>
struct TypeTraits;
template <>
struct TypeTraits<__half> {
  using Pair = __half2;
  // 0x6400 is 1024.0: OR-ing a nibble into the low mantissa bits gives 1024 + q exactly.
  static constexpr std::uint32_t kMagic = 0x64006400u;
};
template <>
struct TypeTraits<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  // 0x4300 is 128.0 in bf16 (7 mantissa bits): 128 + q is exact for q < 16.
  static constexpr std::uint32_t kMagic = 0x43004300u;
};

__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t d;
  // (a & b) | c in one instruction.
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

template <typename Pair>
__device__ __forceinline__ Pair as_pair(std::uint32_t bits) {
  return *reinterpret_cast<Pair*>(&bits);
}
template <typename Pair>
__device__ __forceinline__ std::uint32_t as_bits(Pair pair) {
  return *reinterpret_cast<std::uint32_t*>(&pair);
}

__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared (a shared-window address); src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void copy_async_16(std::uint32_t shared, const void* global,
                                              int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared), "l"(global),
               "r"(src_bytes));
}
__device__ __forceinline__ void copy_async_16(std::uint32_t shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared), "l"(global));
}
__device__ __forceinline__ void copy_async_8(std::uint32_t shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(shared), "l"(global));
}
// The same with an L2 cache policy.
__device__ __forceinline__ void copy_async_16_hint(std::uint32_t shared, const void* global,
                                                   int src_bytes, std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(shared),
               "l"(global), "r"(src_bytes), "l"(policy));
}

__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool valid) {
  copy_async_16(static_cast<std::uint32_t>(__cvta_generic_to_shared(shared)), global,
                valid ? 16 : 0);
}

__device__ __forceinline__ void copy_async_16_streaming(void* shared, const void* global,
                                                        std::uint64_t policy) {
  const std::uint32_t address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(address),
               "l"(global), "l"(policy));
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

__device__ __forceinline__ void load_matrix_x4(std::uint32_t* fragment, const void* shared) {
  const std::uint32_t address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}

// Two 8x8 matrices: lanes 0-7 address the first, 8-15 the second.
__device__ __forceinline__ void load_matrix_x2(std::uint32_t* fragment, const void* shared) {
  const std::uint32_t address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(fragment[0]), "=r"(fragment[1])
               : "r"(address));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float* c, const std::uint32_t* a, std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ typename TypeTraits<T>::Pair float2_to_pair(float a, float b);
template <>
__device__ __forceinline__ __half2 float2_to_pair<__half>(float a, float b) {
  return __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ __nv_bfloat162 float2_to_pair<__nv_bfloat16>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
template <typename T>
__device__ __forceinline__ float bits_to_float(std::uint32_t bits) {
  const unsigned short raw = static_cast<unsigned short>(bits);
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(raw));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(raw));
  }
}
template <typename T>
__device__ __forceinline__ T float_to_value(float a) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(a);
  } else {
    return __float2bfloat16_rn(a);
  }
}

// Four fp32 values as four outputs at `y` (8-byte aligned).
template <typename T>
__device__ __forceinline__ void store_four(T* y, const float4& v) {
  using Pair = typename TypeTraits<T>::Pair;
  Pair* target = reinterpret_cast<Pair*>(y);
  target[0] = float2_to_pair<T>(v.x, v.y);
  target[1] = float2_to_pair<T>(v.z, v.w);
}

// Four fp32 values added into the workspace at `partial` (16-byte aligned), fire-and-forget: one
// 16-byte reduction on sm_90, four 4-byte ones before it.
__device__ __forceinline__ void add_four(float* partial, const float4& v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(partial), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(partial, v.x);
  atomicAdd(partial + 1, v.y);
  atomicAdd(partial + 2, v.z);
  atomicAdd(partial + 3, v.w);
#endif
}

// The fix-up of one split-K output tile, by the block that completed its count: quads
// [0, quads) of 4 outputs, quad q at offset index_of(q) of the workspace and of y. Each quad adds
// `slices` fp32 slices `slice_stride` floats apart in slice order (1 for the atomics' single
// slice), is stored to y, and with `clear` its slice 0 is zeroed for the next run. A thread issues
// the loads of kBatch quads before their stores, one L2 round trip per batch (one quad at a time,
// the wgmma kernel's fix-up was 13 % of its M=64 stall samples); past the end a batch repeats the
// last quad's loads (valid addresses, values not stored) instead of branching around them.
// With `own` (a functor of q returning a float4), the caller's own sums of quad q are added too:
// the block that found every other piece already counted adds its partial here instead of into
// the workspace (see the wgmma kernel's segment end).
struct NoOwnSums {
  __device__ float4 operator()(int) const { return make_float4(0.f, 0.f, 0.f, 0.f); }
};
template <typename T, int kThreads, int kBatch, typename IndexOf, typename Own = NoOwnSums>
__device__ __forceinline__ void fix_up_tile(int thread, int quads, const IndexOf& index_of,
                                            float* partial, std::size_t slice_stride, int slices,
                                            bool clear, T* y, const Own& own = Own{}) {
  for (int q0 = thread; q0 < quads; q0 += kBatch * kThreads) {
    std::size_t index[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      index[j] = index_of(min(q0 + j * kThreads, quads - 1));
      v[j] = __ldcg(reinterpret_cast<const float4*>(partial + index[j]));
    }
    for (int s = 1; s < slices; ++s) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float4 add =
            __ldcg(reinterpret_cast<const float4*>(partial + index[j] + s * slice_stride));
        v[j].x += add.x;
        v[j].y += add.y;
        v[j].z += add.z;
        v[j].w += add.w;
      }
    }
    if constexpr (!std::is_same_v<Own, NoOwnSums>) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float4 add = own(min(q0 + j * kThreads, quads - 1));
        v[j].x += add.x;
        v[j].y += add.y;
        v[j].z += add.z;
        v[j].w += add.w;
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (q0 + j * kThreads >= quads) break;
      if (clear) {
        __stcg(reinterpret_cast<float4*>(partial + index[j]), make_float4(0.f, 0.f, 0.f, 0.f));
      }
      store_four<T>(y + index[j], v[j]);
    }
  }
}

// ---- Hopper bulk copies (cp.async.bulk + mbarrier): one lane per contiguous chunk ----

// Used only by the sm_90 code below; unused (and so marked) when compiling for older archs.
__device__ __forceinline__ __attribute__((unused)) std::uint32_t shared_address(
    const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void barrier_init(std::uint64_t* barrier, int count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)),
               "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival that also raises the phase's expected transaction bytes.
__device__ __forceinline__ void barrier_arrive_expect(std::uint64_t* barrier, int bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)),
      "r"(bytes)
      : "memory");
#endif
}

__device__ __forceinline__ void barrier_arrive(std::uint64_t* barrier) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier))
               : "memory");
#endif
}

__device__ __forceinline__ void barrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
#if __CUDA_ARCH__ >= 900
  const std::uint32_t address = shared_address(barrier);
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global into shared memory; the
// barrier's transaction count drops by bytes when they have landed.
__device__ __forceinline__ void bulk_copy(void* shared, const void* global, int bytes,
                                          std::uint64_t* barrier, std::uint64_t policy) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(shared_address(shared)),
      "l"(global), "r"(bytes), "r"(shared_address(barrier)), "l"(policy)
      : "memory");
#endif
}

// The same without the L2 hint: x is read by every column block, so it should stay in L2.
__device__ __forceinline__ void bulk_copy(void* shared, const void* global, int bytes,
                                          std::uint64_t* barrier) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(shared)),
      "l"(global), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
#endif
}

// ---- what every kernel reads of one run ----

// The common head of the direct and wgmma kernels' parameters.
struct LayerOperands {
  const void* x;  // [M][K]
  void* y;        // [M][N]
  const uint4* tiles;
  const std::uint16_t* scales;  // [G][strips][8 (g)][8 (j)]
  const std::uint8_t* zeros;    // same layout, or null
  float* partial;               // [M][N] fp32, zero between runs (null without a workspace)
  int* counters;                // one per fix-up tile, zero between runs (null without one)
  int m, n, k;
  int group_tiles;  // k16 tiles per quantization group
  int strips;       // N / 64
};

// Host side: the operands of a run of `w` on x [M][K] -> y [M][N], the workspace laid out as
// split_workspace_bytes() says.
inline LayerOperands layer_operands(const W4A16DeviceWeights& w, int m, const void* x, void* y,
                                    void* workspace) {
  LayerOperands op{};
  op.x = x;
  op.y = y;
  op.tiles = static_cast<const uint4*>(w.tiles);
  op.scales = static_cast<const std::uint16_t*>(w.scales);
  op.zeros = static_cast<const std::uint8_t*>(w.zeros);
  if (workspace != nullptr) {
    op.partial = static_cast<float*>(workspace);
    op.counters =
        reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) + partials_bytes(m, w.n));
  }
  op.m = m;
  op.n = w.n;
  op.k = w.k;
  op.group_tiles = w.group_size / kTileK;
  op.strips = w.n / kTileN;
  return op;
}

}  // namespace gpuopt::kernels::w4a16_detail
