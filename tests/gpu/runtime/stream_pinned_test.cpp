// On the GPU: device properties, event dependencies between streams, and that PinnedPool never
// hands out a block whose queued copy has not yet read it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/pinned_pool.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {
namespace {

cudaStream_t raw(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle()); }

TEST(RuntimeDevice, PropertiesAndPriorityPool) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  const auto& p = device->properties();
  EXPECT_GT(p.sm_count, 0);
  EXPECT_LE(p.greatest_priority, p.least_priority);
  EXPECT_FALSE(p.name.empty());
  auto pool = StreamPool::create(*device, 2);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_EQ(pool->priority_value(Priority::kCritical), p.greatest_priority);
  EXPECT_EQ(pool->priority_value(Priority::kBackground), p.least_priority);
  const Stream& a = pool->next(Priority::kCritical);
  const Stream& b = pool->next(Priority::kCritical);
  EXPECT_NE(a.handle(), b.handle());
  int queried = 1;
  ASSERT_EQ(cudaStreamGetPriority(raw(a), &queried), cudaSuccess);
  EXPECT_EQ(queried, p.greatest_priority);
  EXPECT_EQ(Device::open(p.ordinal + 1000).status().code(), StatusCode::kInvalidArgument);
}

TEST(RuntimeStream, WaitOrdersWorkAcrossStreams) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  ASSERT_TRUE(device.ok());
  auto producer = Stream::create(*device);
  auto consumer = Stream::create(*device);
  auto done = Event::create();
  ASSERT_TRUE(producer.ok() && consumer.ok() && done.ok());
  auto flag_memory = DeviceBuffer::allocate(sizeof(int));
  auto counter_memory = DeviceBuffer::allocate(sizeof(unsigned long long));
  ASSERT_TRUE(flag_memory.ok() && counter_memory.ok());
  int* flag = flag_memory->data_as<int>();
  auto* counter = counter_memory->data_as<unsigned long long>();
  ASSERT_EQ(cudaMemsetAsync(flag, 0, sizeof(int), raw(*producer)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), raw(*producer)), cudaSuccess);
  std::mt19937 rng(std::random_device{}());
  const int value = 2 + static_cast<int>(rng() % 1000000);
  // Pinned staging value, so the async copy reads it at execution time.
  int* staged = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&staged), sizeof(int)), cudaSuccess);
  *staged = value - 1;
  const int& value_minus_one = *staged;
  // ~10 ms of spinning, then the store (counter = value after one block adds 1 to value - 1).
  ASSERT_EQ(cudaMemcpyAsync(counter, &value_minus_one, sizeof(int), cudaMemcpyHostToDevice,
                            raw(*producer)),
            cudaSuccess);
  ASSERT_TRUE(launch_spin(producer->handle(), 1, 32, 20'000'000,
                          reinterpret_cast<unsigned long long*>(counter))
                  .ok());
  ASSERT_EQ(cudaMemcpyAsync(flag, counter, sizeof(int), cudaMemcpyDeviceToDevice, raw(*producer)),
            cudaSuccess);
  ASSERT_TRUE(done->record(*producer).ok());
  ASSERT_TRUE(consumer->wait(*done).ok());
  int host = -1;
  ASSERT_EQ(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, raw(*consumer)),
            cudaSuccess);
  ASSERT_TRUE(consumer->synchronize().ok());
  EXPECT_EQ(host, value);
  auto finished = done->query();
  ASSERT_TRUE(finished.ok());
  EXPECT_TRUE(*finished);
  cudaFreeHost(staged);
}

TEST(RuntimeStream, TimingEvents) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  auto stream = Stream::create(*device);
  auto start = Event::create(true);
  auto end = Event::create(true);
  auto untimed = Event::create(false);
  ASSERT_TRUE(stream.ok() && start.ok() && end.ok() && untimed.ok());
  ASSERT_TRUE(start->record(*stream).ok());
  ASSERT_TRUE(launch_spin(stream->handle(), 1, 32, 2'000'000).ok());
  ASSERT_TRUE(end->record(*stream).ok());
  ASSERT_TRUE(end->synchronize().ok());
  auto ms = Event::elapsed_ms(*start, *end);
  ASSERT_TRUE(ms.ok());
  EXPECT_GT(*ms, 0.0f);
  EXPECT_EQ(Event::elapsed_ms(*start, *untimed).status().code(), StatusCode::kInvalidArgument);
}

TEST(RuntimePinnedPool, BlockIsNotReusedBeforeItsCopyRan) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  auto stream = Stream::create(*device);
  ASSERT_TRUE(stream.ok());
  constexpr std::size_t kBytes = 1 << 20;
  // Budget of one block: the second acquire can only be served by the released one.
  auto pool = PinnedPool::create({kBytes, kBytes, HostMemory::kPinned});
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  EXPECT_TRUE((*pool)->pinned());
  std::mt19937 rng(std::random_device{}());
  std::vector<unsigned char> expected(kBytes);
  for (auto& byte : expected) byte = static_cast<unsigned char>(rng());

  auto device_memory = DeviceBuffer::allocate(kBytes);
  ASSERT_TRUE(device_memory.ok()) << device_memory.status().to_string();
  auto* device_buffer = device_memory->data_as<unsigned char>();
  ASSERT_EQ(cudaMemsetAsync(device_buffer, 0x5a, kBytes, raw(*stream)), cudaSuccess);
  auto block = (*pool)->acquire(kBytes, stream->handle());
  ASSERT_TRUE(block.ok()) << block.status().to_string();
  void* first = block->data;
  std::memcpy(block->data, expected.data(), kBytes);
  // The copy waits behind ~20 ms of spinning, so it is still pending when the host reacquires.
  ASSERT_TRUE(launch_spin(stream->handle(), 1, 32, 40'000'000).ok());
  ASSERT_EQ(
      cudaMemcpyAsync(device_buffer, block->data, kBytes, cudaMemcpyHostToDevice, raw(*stream)),
      cudaSuccess);
  (*pool)->release(std::move(*block), stream->handle());

  auto again = (*pool)->acquire(kBytes, stream->handle());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->data, first);
  EXPECT_EQ((*pool)->stats().host_waits, 1u);
  std::memset(again->data, 0xee, kBytes);  // would corrupt the copy had it not run yet

  std::vector<unsigned char> got(kBytes, 0);
  ASSERT_EQ(
      cudaMemcpyAsync(got.data(), device_buffer, kBytes, cudaMemcpyDeviceToHost, raw(*stream)),
      cudaSuccess);
  ASSERT_TRUE(stream->synchronize().ok());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kBytes), 0);
  (*pool)->release(std::move(*again), nullptr);
}

}  // namespace
}  // namespace gpuopt::runtime
