// Shared by the W4A16 GPU tests: formats, a case, and check_case (build a random layer through its
// checkpoint format, run the GPU GEMM, compare every run with the CPU twin).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

namespace gpuopt::kernels::w4a16_test {

struct Format {
  const char* name;
  QuantFormat format;
  GptqZeros zeros;
  bool has_zeros;
  bool act_order;
};
inline constexpr Format kFormats[] = {
    {"gptq_sym", QuantFormat::kGptq, GptqZeros::kV1MinusOne, false, false},
    {"gptq_v1_zp", QuantFormat::kGptq, GptqZeros::kV1MinusOne, true, false},
    {"gptq_v2_actorder", QuantFormat::kGptq, GptqZeros::kV2, true, true},
    {"awq", QuantFormat::kAwq, GptqZeros::kV2, true, false},
};

struct Case {
  ActivationType type;
  Format format;
  int group_size;  // -1 = per-channel
  int m, k, n;
  W4A16Options options;
};

inline std::string case_name(const Case& c) {
  return std::string(activation_type_name(c.type)) + "_" + c.format.name + "_g" +
         (c.group_size < 0 ? std::string("channel") : std::to_string(c.group_size)) + "_m" +
         std::to_string(c.m) + "_k" + std::to_string(c.k) + "_n" + std::to_string(c.n) +
         (c.options.force_path == W4A16ForcePath::kAuto
              ? ""
              : "_" + std::string(w4a16_force_path_name(c.options.force_path))) +
         (c.options.force_blocks > 0 ? "_grid" + std::to_string(c.options.force_blocks) : "");
}

// A stream and the device buffers of one test, freed at scope exit (the buffers first).
struct Device {
  cudaStream_t stream = nullptr;
  std::vector<runtime::DeviceBuffer> buffers;
  ~Device() {
    buffers.clear();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  // At least 256 bytes, so that a zero-byte workspace is still a valid pointer; null on failure
  // (the test fails).
  void* allocate(std::size_t bytes) {
    StatusOr<runtime::DeviceBuffer> buffer =
        runtime::DeviceBuffer::allocate(std::max<std::size_t>(bytes, 256));
    EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
    if (!buffer.ok()) return nullptr;
    buffers.push_back(std::move(*buffer));
    return buffers.back().data();
  }
};

// Builds the layer through the checkpoint format (pack, unpack), runs it `runs` times (the
// stream-K workspace must be left clean), and compares each output with the CPU twin. With
// `describe_has`, the chosen configuration's describe() must contain it (the kernel meant to run).
// With `on_stream`, everything runs on that stream (e.g. one of a green-context partition) instead
// of a new one.
inline void check_case(const Case& c, int runs = 1, const char* describe_has = nullptr,
                       cudaStream_t on_stream = nullptr) {
  std::random_device seed_source;
  const std::uint64_t seed = (static_cast<std::uint64_t>(seed_source()) << 32) | seed_source();
  SCOPED_TRACE(case_name(c) + " seed " + std::to_string(seed));
  const UnpackedLayer layer =
      random_unpacked_layer(c.k, c.n, c.group_size, c.format.has_zeros, c.format.act_order, seed);
  auto packed = pack_checkpoint_layer(layer, c.format.format, c.format.zeros);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  auto unpacked = unpack_checkpoint_layer(*packed);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().to_string();
  auto weights = repack_for_kernel(*unpacked, c.type);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();

  std::mt19937 random(static_cast<unsigned>(seed));
  std::vector<std::uint16_t> x(static_cast<std::size_t>(c.m) * c.k);
  for (auto& v : x) {
    const float value = std::uniform_real_distribution<float>(-1, 1)(random);
    v = c.type == ActivationType::kFloat16 ? float_to_fp16_bits(value) : float_to_bf16_bits(value);
  }
  const std::vector<float> expected = w4a16_reference(*weights, x.data(), c.m);

  Device device;
  if (on_stream == nullptr) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), cudaSuccess);
  }
  const cudaStream_t stream = on_stream != nullptr ? on_stream : device.stream;
  auto device_weights = W4A16DeviceWeights::upload(*weights, stream);
  ASSERT_TRUE(device_weights.ok()) << device_weights.status().to_string();
  void* dx = device.allocate(x.size() * 2);
  const std::size_t y_bytes = static_cast<std::size_t>(c.m) * c.n * 2;
  void* dy = device.allocate(y_bytes);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);

  W4A16Gemm gemm(c.options);
  W4A16Gemm::Arguments arguments{c.m, dx, dy, &*device_weights};
  ASSERT_TRUE(W4A16Gemm::can_implement(arguments).ok());
  auto workspace_bytes = gemm.workspace_size(arguments);
  ASSERT_TRUE(workspace_bytes.ok()) << workspace_bytes.status().to_string();
  void* workspace = device.allocate(*workspace_bytes);
  ASSERT_TRUE(gemm.initialize(arguments, workspace, stream).ok());
  if (c.options.force_path == W4A16ForcePath::kDequantCublas) {
    EXPECT_EQ(gemm.config().path, W4A16Path::kDequantCublas);
  }
  if (describe_has != nullptr) {
    EXPECT_NE(gemm.config().describe().find(describe_has), std::string::npos)
        << gemm.config().describe() << " has no \"" << describe_has << "\"";
  }

  const double tolerance = c.type == ActivationType::kFloat16 ? 1e-3 : 5e-3;
  for (int run = 0; run < runs; ++run) {
    // Poison: 0xFFFF is NaN in fp16 and bf16, so an unwritten element fails the comparison.
    ASSERT_EQ(cudaMemsetAsync(dy, 0xff, y_bytes, stream), cudaSuccess);
    const Status status = gemm.run(stream);
    ASSERT_TRUE(status.ok()) << status.to_string();
    std::vector<std::uint16_t> y(static_cast<std::size_t>(c.m) * c.n);
    ASSERT_EQ(cudaMemcpyAsync(y.data(), dy, y_bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    double diff = 0, norm = 0;
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float actual =
          c.type == ActivationType::kFloat16 ? fp16_bits_to_float(y[i]) : bf16_bits_to_float(y[i]);
      if (!std::isfinite(actual)) ++non_finite;
      diff += (actual - expected[i]) * static_cast<double>(actual - expected[i]);
      norm += static_cast<double>(expected[i]) * expected[i];
    }
    EXPECT_EQ(non_finite, 0u) << "run " << run << " config " << gemm.config().describe();
    const double relative = std::sqrt(diff / norm);
    EXPECT_LT(relative, tolerance) << "run " << run << " config " << gemm.config().describe();
  }
}

}  // namespace gpuopt::kernels::w4a16_test
#endif  // GPUOPT_CUDA
