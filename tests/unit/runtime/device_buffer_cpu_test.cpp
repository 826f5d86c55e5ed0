// DeviceBuffer on a machine without a usable GPU: an allocation is an error value, never a crash,
// and an empty buffer is safe to move, reset and destroy.
#include <gtest/gtest.h>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::runtime {
namespace {

TEST(DeviceBufferWithoutGpu, AllocationFailsWithAReason) {
  if (cuda_device_count().ok()) GTEST_SKIP() << "a GPU is present: tests/gpu/runtime covers it";
  auto buffer = DeviceBuffer::allocate(1024);
  ASSERT_FALSE(buffer.ok());
  EXPECT_FALSE(buffer.status().message().empty());
  auto ordered = DeviceBuffer::allocate_async(1024, nullptr);
  EXPECT_FALSE(ordered.ok());
}

TEST(DeviceBufferWithoutGpu, EmptyBufferMovesAndResets) {
  DeviceBuffer a;
  DeviceBuffer b = std::move(a);
  b.reset();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size_bytes(), 0u);
}

}  // namespace
}  // namespace gpuopt::runtime
