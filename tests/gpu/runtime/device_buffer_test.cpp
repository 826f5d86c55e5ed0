// On the GPU: DeviceBuffer allocates, zeroes, copies and frees, synchronously and stream-ordered;
// moves transfer ownership; an impossible size is RESOURCE_EXHAUSTED, not a crash.
#include "gpuopt/runtime/device_buffer.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "common/test_support.hpp"

namespace gpuopt::runtime {
namespace {

std::vector<std::uint32_t> read_back(const DeviceBuffer& buffer, cudaStream_t stream) {
  std::vector<std::uint32_t> host(buffer.size_bytes() / sizeof(std::uint32_t), 0xdeadbeef);
  EXPECT_EQ(cudaMemcpyAsync(host.data(), buffer.data(), buffer.size_bytes(), cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

TEST(DeviceBuffer, AllocateCopyZeroAndMove) {
  GPUOPT_REQUIRE_GPU();
  auto stream = Stream::create(*Device::open(0));
  ASSERT_TRUE(stream.ok());
  auto s = static_cast<cudaStream_t>(stream->handle());
  std::vector<std::uint32_t> values(4097);
  std::iota(values.begin(), values.end(), 7u);
  auto buffer = DeviceBuffer::allocate(values.size() * sizeof(std::uint32_t));
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  EXPECT_EQ(buffer->size_bytes(), values.size() * sizeof(std::uint32_t));
  EXPECT_EQ(buffer->stream(), nullptr);
  ASSERT_TRUE(buffer->copy_from_host(values.data(), buffer->size_bytes(), s).ok());
  EXPECT_EQ(read_back(*buffer, s), values);

  DeviceBuffer moved = std::move(*buffer);
  EXPECT_TRUE(buffer->empty());
  EXPECT_EQ(buffer->size_bytes(), 0u);
  EXPECT_EQ(read_back(moved, s), values);
  ASSERT_TRUE(moved.zero(s).ok());
  EXPECT_EQ(read_back(moved, s), std::vector<std::uint32_t>(values.size(), 0u));

  EXPECT_FALSE(moved.copy_from_host(values.data(), moved.size_bytes() + 4, s).ok());
  moved.reset();
  EXPECT_TRUE(moved.empty());
}

TEST(DeviceBuffer, StreamOrderedLifetime) {
  GPUOPT_REQUIRE_GPU();
  auto stream = Stream::create(*Device::open(0));
  ASSERT_TRUE(stream.ok());
  auto s = static_cast<cudaStream_t>(stream->handle());
  std::vector<std::uint32_t> values(1000, 42u);
  {
    auto buffer = DeviceBuffer::allocate_async(values.size() * sizeof(std::uint32_t), s);
    ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
    EXPECT_EQ(buffer->stream(), stream->handle());
    ASSERT_TRUE(buffer->copy_from_host(values.data(), buffer->size_bytes(), s).ok());
    EXPECT_EQ(read_back(*buffer, s), values);
  }  // freed on the stream
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_FALSE(DeviceBuffer::allocate_async(16, nullptr).ok());
}

TEST(DeviceBuffer, ImpossibleSizeIsResourceExhausted) {
  GPUOPT_REQUIRE_GPU();
  auto buffer = DeviceBuffer::allocate(std::size_t{1} << 60);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), StatusCode::kResourceExhausted) << buffer.status().to_string();
  // The failure leaves no sticky error behind.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(DeviceBuffer::allocate(0).ok());
}

}  // namespace
}  // namespace gpuopt::runtime
