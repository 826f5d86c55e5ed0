// On the GPU: a green-context plan gives the critical workload the SMs it asked for, its streams
// run kernels and events across partitions, and no stream can be made outside the plan.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/test_support.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {
namespace {

TEST(PartitionGpu, CriticalAndBackgroundPartitions) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  ASSERT_TRUE(device.ok());
  auto plan = PartitionPlan::create(*device, {{"critical", 8, Priority::kCritical, 1},
                                              {"background", 0, Priority::kBackground, 2}});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::printf("plan: %s\n", (*plan)->describe().c_str());
  if (!(*plan)->isolated()) {
    GTEST_SKIP() << "no green contexts here: " << (*plan)->fallback_reason();
  }
  auto critical = *(*plan)->workload("critical");
  auto background = *(*plan)->workload("background");
  EXPECT_GE(critical->sm_count(), 8);
  // The driver may keep a few SMs out of the groups for alignment, never more than one group's
  // worth.
  EXPECT_LE(critical->sm_count() + background->sm_count(), device->sm_count());
  EXPECT_GE(background->sm_count(), device->sm_count() - critical->sm_count() - 8);

  // While the plan is active, streams only come from it.
  EXPECT_EQ(Stream::create(*device).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(StreamPool::create(*device).status().code(), StatusCode::kFailedPrecondition);

  // Work in both partitions completes, and an event from one orders work in the other.
  auto counter_memory = DeviceBuffer::allocate(sizeof(unsigned long long));
  ASSERT_TRUE(counter_memory.ok()) << counter_memory.status().to_string();
  auto* counter = counter_memory->data_as<unsigned long long>();
  auto bg = static_cast<cudaStream_t>(background->stream(0));
  auto crit = static_cast<cudaStream_t>(critical->stream(0));
  ASSERT_EQ(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), bg), cudaSuccess);
  const int blocks = 3 * background->sm_count();
  ASSERT_TRUE(launch_spin(background->stream(0), blocks, 256, 200'000, counter).ok());
  auto done = Event::create();
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->record(background->stream(0)).ok());
  ASSERT_EQ(cudaStreamWaitEvent(crit, static_cast<cudaEvent_t>(done->handle()), 0), cudaSuccess);
  ASSERT_TRUE(launch_spin(critical->stream(0), 16, 128, 1000, counter).ok());
  unsigned long long host = 0;
  ASSERT_EQ(cudaMemcpyAsync(&host, counter, sizeof(host), cudaMemcpyDeviceToHost, crit),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(crit), cudaSuccess);
  EXPECT_EQ(host, static_cast<unsigned long long>(blocks + 16));
  counter_memory->reset();
  plan->reset();  // ends the plan: its streams and green contexts go
  auto stream = Stream::create(*device);
  EXPECT_TRUE(stream.ok()) << "streams may be made again once the plan is gone";
}

// A stream reports the SMs of its green context (every stream of both workloads), and an
// ordinary stream (here the legacy default stream) the whole device's.
TEST(PartitionGpu, StreamsReportTheirWorkloadsSms) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  ASSERT_TRUE(device.ok());
  auto plan = PartitionPlan::create(*device, {{"critical", 16, Priority::kCritical, 1},
                                              {"background", 0, Priority::kBackground, 2}});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  if (!(*plan)->isolated()) {
    GTEST_SKIP() << "no green contexts here: " << (*plan)->fallback_reason();
  }
  for (const Workload& workload : (*plan)->workloads()) {
    for (int s = 0; s < workload.stream_count(); ++s) {
      const StatusOr<int> sms = stream_sm_count(workload.stream(s));
      ASSERT_TRUE(sms.ok()) << workload.name() << ": " << sms.status().to_string();
      EXPECT_EQ(*sms, workload.sm_count()) << workload.name() << " stream " << s;
    }
  }
  EXPECT_LT((*plan)->workload("critical").value()->sm_count(), device->sm_count());
  const StatusOr<int> whole = stream_sm_count(nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(*whole, device->sm_count());
}

TEST(PartitionGpu, DisabledGreenContextsFallBack) {
  GPUOPT_REQUIRE_GPU();
  auto device = Device::open(0);
  PartitionOptions options;
  options.use_green_contexts = false;
  auto plan = PartitionPlan::create(
      *device,
      {{"critical", 8, Priority::kCritical, 1}, {"background", 0, Priority::kBackground, 1}},
      options);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_FALSE((*plan)->isolated());
  EXPECT_NE((*plan)->fallback_reason().find("use_green_contexts"), std::string::npos);
  int priority = 1;
  auto critical = *(*plan)->workload("critical");
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(critical->stream(0)), &priority),
            cudaSuccess);
  EXPECT_EQ(priority, device->properties().greatest_priority);
  // A priority stream is an ordinary stream: the whole device's SMs, as the workload says.
  const StatusOr<int> sms = stream_sm_count(critical->stream(0));
  ASSERT_TRUE(sms.ok()) << sms.status().to_string();
  EXPECT_EQ(*sms, device->sm_count());
  EXPECT_EQ(critical->sm_count(), device->sm_count());
}

}  // namespace
}  // namespace gpuopt::runtime
