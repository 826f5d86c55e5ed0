// Shared by the LLM GPU tests: a typed device buffer with checked synchronous copies and
// poisoning, and seeded random prompts.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::pipeline::llm_test {

// A typed runtime::DeviceBuffer with checked synchronous upload, download and poisoning. Upload and
// poisoning run on the legacy default stream, which does not order work on the tests' non-blocking
// streams: each waits for the device, so a kernel launched next never races them.
template <typename T>
struct TestBuffer {
  runtime::DeviceBuffer owned;
  T* data = nullptr;
  std::size_t count = 0;
  explicit TestBuffer(std::size_t n) : count(n) {
    auto buffer = runtime::DeviceBuffer::allocate(std::max<std::size_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
    if (buffer.ok()) {
      owned = std::move(buffer).value();
      data = owned.data_as<T>();
    }
  }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a pageable copy may still be in flight
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  void poison() {  // -1 / NaN
    EXPECT_EQ(cudaMemset(data, 0xff, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // cudaMemset is asynchronous to the host
  }
};

inline std::vector<std::int32_t> random_prompts(int batch, int prompt_len, int vocab,
                                                unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<std::int32_t> prompts(static_cast<std::size_t>(batch) * prompt_len);
  for (auto& t : prompts) t = token(rng);
  return prompts;
}

// A test that needs a GPU (skipped with the reason otherwise) and a non-blocking stream of its own.
class GpuStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUOPT_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace gpuopt::pipeline::llm_test
