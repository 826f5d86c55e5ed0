// Preprocessing kernel: one thread per output pixel, three channels, fp32 math, fp16 stores.
#include <cuda_fp16.h>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/preprocess.hpp"

namespace gpuopt::pipeline {
namespace {

struct DeviceParams {
  int source_width, source_height, output_size;
  float scale_x, scale_y;
  float mean[3], inv_std[3];
};

__global__ void k_preprocess_rgb8_to_f16(const std::uint8_t* __restrict__ rgb,
                                         __half* __restrict__ out, DeviceParams p) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= p.output_size || y >= p.output_size) return;
  float fy = fmaxf((y + 0.5f) * p.scale_y - 0.5f, 0.0f);
  int y0 = min(static_cast<int>(fy), p.source_height - 1);
  int y1 = min(y0 + 1, p.source_height - 1);
  float wy = fy - y0;
  float fx = fmaxf((x + 0.5f) * p.scale_x - 0.5f, 0.0f);
  int x0 = min(static_cast<int>(fx), p.source_width - 1);
  int x1 = min(x0 + 1, p.source_width - 1);
  float wx = fx - x0;
  const std::size_t row0 = static_cast<std::size_t>(y0) * p.source_width;
  const std::size_t row1 = static_cast<std::size_t>(y1) * p.source_width;
  const std::size_t pixel = static_cast<std::size_t>(y) * p.output_size + x;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    float a = rgb[(row0 + x0) * 3 + c], b = rgb[(row0 + x1) * 3 + c];
    float d = rgb[(row1 + x0) * 3 + c], e = rgb[(row1 + x1) * 3 + c];
    float top = a + (b - a) * wx;
    float bottom = d + (e - d) * wx;
    float value = top + (bottom - top) * wy;
    // Same operation order as the CPU twin: (v / 255 - mean) / std, with / std as * (1 / std).
    out[pixel * 3 + c] = __float2half_rn((value / 255.0f - p.mean[c]) * p.inv_std[c]);
  }
}

}  // namespace

Status preprocess(const std::uint8_t* rgb_device, std::uint16_t* output_device,
                  const PreprocessParams& params, runtime::StreamHandle stream) {
  GPUOPT_RETURN_IF_ERROR(check_preprocess_params(params));
  if (rgb_device == nullptr || output_device == nullptr) {
    return invalid_argument("preprocess: null device pointer");
  }
  if (stream == nullptr) return invalid_argument("preprocess: needs an explicit stream");
  DeviceParams p{params.source_width,
                 params.source_height,
                 params.output_size,
                 static_cast<float>(params.source_width) / params.output_size,
                 static_cast<float>(params.source_height) / params.output_size,
                 {params.mean[0], params.mean[1], params.mean[2]},
                 {1.0f / params.std[0], 1.0f / params.std[1], 1.0f / params.std[2]}};
  dim3 block(32, 8);
  dim3 grid((params.output_size + block.x - 1) / block.x,
            (params.output_size + block.y - 1) / block.y);
  k_preprocess_rgb8_to_f16<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(
      rgb_device, reinterpret_cast<__half*>(output_device), p);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::pipeline
