// The W4A16 path for large M: the int4 weights dequantised once into a dense fp16/bf16 copy, then
// cuBLAS; and CublasGemm, the dense reference of the benchmark.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_device.cuh"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels {
namespace {
using namespace w4a16_detail;  // NOLINT: the kernel below is written in its terms

// Writes the dense weight w[N][K] (nn.Linear layout) for cuBLAS: one thread per 16-byte chunk.
template <typename T>
__global__ void k_w4a16_dequantize(const uint4* __restrict__ tiles,
                                   const std::uint16_t* __restrict__ scales,
                                   const std::uint8_t* __restrict__ zeros, T* __restrict__ w, int n,
                                   int k, int group_size) {
  using Pair = typename TypeTraits<T>::Pair;
  const int k_tiles = k / kTileK;
  const std::size_t chunks = static_cast<std::size_t>(n / kTileN) * k_tiles * 32;
  for (std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(c % 32);
    const std::size_t tile_index = c / 32;
    const int strip = static_cast<int>(tile_index / k_tiles);
    const int t = static_cast<int>(tile_index % k_tiles);
    const int g = lane / 4;
    const int quad = lane % 4;
    const int group = t * kTileK / group_size;
    const uint4 packed = tiles[c];
    const std::uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    const std::size_t group_base =
        (static_cast<std::size_t>(group) * (n / kTileN) + strip) * kTileN + g * 8;
#pragma unroll
    for (int word = 0; word < 4; ++word) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int j = 2 * word + s / 2;
        const std::uint32_t zero = zeros != nullptr ? zeros[group_base + j] : 8u;
        const std::uint32_t scale_bits = scales[group_base + j];
        const Pair raw =
            as_pair<Pair>(and_or(words[word] >> (4 * s), 0x000f000fu, TypeTraits<T>::kMagic));
        const Pair value =
            __hmul2(__hsub2(raw, as_pair<Pair>(TypeTraits<T>::kMagic | (zero * 0x00010001u))),
                    as_pair<Pair>(scale_bits | (scale_bits << 16)));
        const int col = strip * kTileN + 8 * j + g;
        const int row = t * kTileK + 2 * quad + 8 * (s % 2);
        *reinterpret_cast<Pair*>(w + static_cast<std::size_t>(col) * k + row) = value;
      }
    }
  }
}

Status cublas_status(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
  const StatusCode code = status == CUBLAS_STATUS_ALLOC_FAILED      ? StatusCode::kResourceExhausted
                          : status == CUBLAS_STATUS_NOT_INITIALIZED ? StatusCode::kUnavailable
                                                                    : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + cublasGetStatusName(status) + " (" +
                          cublasGetStatusString(status) + ")");
}

}  // namespace

namespace w4a16_detail {

StatusOr<void*> create_cublas_handle() {
  cublasHandle_t handle = nullptr;
  GPUOPT_RETURN_IF_ERROR(cublas_status(cublasCreate(&handle), "cublasCreate"));
  return static_cast<void*>(handle);
}

void destroy_cublas_handle(void* handle) {
  if (handle == nullptr) return;
  const cublasStatus_t status = cublasDestroy(static_cast<cublasHandle_t>(handle));
  if (status != CUBLAS_STATUS_SUCCESS) report_unreturnable(cublas_status(status, "cublasDestroy"));
}

Status dequantize_weights(const W4A16DeviceWeights& w, void* dense, StreamHandle stream) {
  const std::size_t chunks = static_cast<std::size_t>(w.n / kTileN) * (w.k / kTileK) * 32;
  const int blocks = static_cast<int>(std::min<std::size_t>(65536, (chunks + 255) / 256));
  const auto* tiles = static_cast<const uint4*>(w.tiles);
  const auto* scales = static_cast<const std::uint16_t*>(w.scales);
  const auto* zeros = static_cast<const std::uint8_t*>(w.zeros);
  if (w.type == ActivationType::kFloat16) {
    k_w4a16_dequantize<<<blocks, 256, 0, stream>>>(
        tiles, scales, zeros, static_cast<__half*>(dense), w.n, w.k, w.group_size);
  } else {
    k_w4a16_dequantize<<<blocks, 256, 0, stream>>>(
        tiles, scales, zeros, static_cast<__nv_bfloat16*>(dense), w.n, w.k, w.group_size);
  }
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status run_dequantized(void* cublas, const W4A16DeviceWeights& w, int m, const void* x,
                       const void* dense, void* y, StreamHandle stream) {
  cublasHandle_t handle = static_cast<cublasHandle_t>(cublas);
  GPUOPT_RETURN_IF_ERROR(cublas_status(cublasSetStream(handle, stream), "cublasSetStream"));
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t data = w.type == ActivationType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  return cublas_status(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, w.n, m, w.k, &alpha, dense, data, w.k, x, data,
                   w.k, &beta, y, data, w.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx (W4A16 fallback)");
}

}  // namespace w4a16_detail

// ---- CublasGemm ----

CublasGemm::~CublasGemm() {
  if (handle_ != nullptr) {
    const cublasStatus_t status = cublasDestroy(static_cast<cublasHandle_t>(handle_));
    if (status != CUBLAS_STATUS_SUCCESS)
      report_unreturnable(cublas_status(status, "cublasDestroy"));
  }
}

Status CublasGemm::run(ActivationType type, int m, int n, int k, const void* x, const void* w_nk,
                       void* y, StreamHandle stream) {
  if (handle_ == nullptr) {
    cublasHandle_t handle = nullptr;
    GPUOPT_RETURN_IF_ERROR(cublas_status(cublasCreate(&handle), "cublasCreate"));
    handle_ = handle;
  }
  cublasHandle_t handle = static_cast<cublasHandle_t>(handle_);
  GPUOPT_RETURN_IF_ERROR(cublas_status(cublasSetStream(handle, stream), "cublasSetStream"));
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t data = type == ActivationType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  return cublas_status(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w_nk, data, k, x, data, k,
                   &beta, y, data, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

}  // namespace gpuopt::kernels
