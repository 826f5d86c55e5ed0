// Result decode kernels: detection count and per-class histogram of the segmentation argmax.
#include <cuda_fp16.h>

#include "decode.hpp"
#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::pipeline::detail {
namespace {

__global__ void k_count_detections_f16(const __half* __restrict__ detector, int boxes,
                                       int per_anchor, float threshold, std::uint32_t* result) {
  int box = blockIdx.x * blockDim.x + threadIdx.x;
  bool above = box < boxes &&
               __half2float(detector[static_cast<std::size_t>(box) * per_anchor + 4]) > threshold;
  // One atomic per warp.
  unsigned votes = __ballot_sync(0xffffffffu, above);
  if ((threadIdx.x & 31) == 0 && votes != 0) atomicAdd(&result[0], __popc(votes));
}

__global__ void k_class_histogram_f16(const __half* __restrict__ segmenter, std::size_t pixels,
                                      std::uint32_t* result) {
  __shared__ std::uint32_t bins[kSegmentClasses];
  if (threadIdx.x < kSegmentClasses) bins[threadIdx.x] = 0;
  __syncthreads();
  for (std::size_t p = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; p < pixels;
       p += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const __half* scores = segmenter + p * kSegmentClasses;
    int best = 0;
    float best_score = __half2float(scores[0]);
#pragma unroll
    for (int c = 1; c < kSegmentClasses; ++c) {
      float score = __half2float(scores[c]);
      if (score > best_score) {  // ties keep the lower class, as the CPU argmax does
        best = c;
        best_score = score;
      }
    }
    atomicAdd(&bins[best], 1u);
  }
  __syncthreads();
  if (threadIdx.x < kSegmentClasses && bins[threadIdx.x] != 0) {
    atomicAdd(&result[1 + threadIdx.x], bins[threadIdx.x]);
  }
}

}  // namespace

Status decode_results(const std::uint16_t* detector, int cells, int anchors, int per_anchor,
                      float threshold, const std::uint16_t* segmenter, std::size_t pixels,
                      std::uint32_t* result, runtime::StreamHandle stream) {
  auto s = static_cast<cudaStream_t>(stream);
  GPUOPT_CUDA_TRY(cudaMemsetAsync(result, 0, kResultWords * sizeof(std::uint32_t), s));
  const int boxes = cells * anchors;
  k_count_detections_f16<<<(boxes + 255) / 256, 256, 0, s>>>(
      reinterpret_cast<const __half*>(detector), boxes, per_anchor, threshold, result);
  GPUOPT_CUDA_TRY_LAUNCH();
  k_class_histogram_f16<<<264, 256, 0, s>>>(reinterpret_cast<const __half*>(segmenter), pixels,
                                            result);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::pipeline::detail
