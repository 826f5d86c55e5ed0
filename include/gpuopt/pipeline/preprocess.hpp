// Frame preprocessing for the pipeline's detector: bilinear resize (OpenCV INTER_LINEAR
// convention: half-pixel centres, edge clamp) of an interleaved RGB8 frame to a square network
// input, then per-channel (x / 255 - mean) / std, written planar (NCHW) as fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::pipeline {

struct PreprocessParams {
  int source_width = 1920;
  int source_height = 1080;
  int output_size = 640;  // square output, output_size × output_size
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};

// INVALID_ARGUMENT naming the bad field (sizes must be positive, at most 8192; std non-zero).
Status check_preprocess_params(const PreprocessParams& params);

// CPU twin: [H, W, 3] uint8 → [S, S, 3] float32 (the oracle for the GPU kernel).
std::vector<float> preprocess_reference(const std::uint8_t* rgb, const PreprocessParams& params);

// GPU: `rgb_device` [H, W, 3] uint8 and `output_device` [S, S, 3] fp16 (as uint16 bits), both
// device pointers; enqueued on `stream`. UNIMPLEMENTED in a CPU-only build.
Status preprocess(const std::uint8_t* rgb_device, std::uint16_t* output_device,
                  const PreprocessParams& params, runtime::StreamHandle stream);

}  // namespace gpuopt::pipeline
