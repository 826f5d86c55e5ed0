// PartitionPlan against a fake driver: SM groups, the fallback to priority streams with its
// message, spec validation, and that no stream can be made outside an active plan.
#include "gpuopt/runtime/partition.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::runtime {
namespace {

// A device of `sms` SMs whose driver rounds every group up to a multiple of 8, as Hopper does.
struct FakeDriver {
  int sms = 132;
  bool has_green_contexts = true;
  int groups = 0;
  int destroyed_groups = 0;
  std::vector<StreamHandle> live_streams;
  std::vector<std::pair<int, int>> group_streams;  // (group, priority)
  std::vector<int> fallback_priorities;
  std::uintptr_t next_handle = 0x1000;

  std::shared_ptr<SmPartitionBackend> backend() {
    auto b = std::make_shared<SmPartitionBackend>();
    b->least_priority = 0;
    b->greatest_priority = -5;
    b->probe = [this]() -> Status {
      return has_green_contexts
                 ? ok_status()
                 : unavailable("the driver supports CUDA 12.2; green contexts need 12.4");
    };
    b->total_sms = [this] { return sms; };
    b->split = [this](const std::vector<int>& min_sms) -> StatusOr<std::vector<int>> {
      std::vector<int> counts(min_sms.size(), 0);
      int left = sms;
      for (std::size_t i = 0; i < min_sms.size(); ++i) {
        if (min_sms[i] == 0) continue;
        counts[i] = (min_sms[i] + 7) / 8 * 8;
        if (counts[i] > left) return resource_exhausted("not enough SMs");
        left -= counts[i];
      }
      for (std::size_t i = 0; i < min_sms.size(); ++i) {
        if (min_sms[i] == 0) {
          if (left == 0) return resource_exhausted("not enough SMs for the rest");
          counts[i] = left;
        }
      }
      groups = static_cast<int>(min_sms.size());
      return counts;
    };
    b->group_stream = [this](int group, int priority) -> StatusOr<StreamHandle> {
      group_streams.emplace_back(group, priority);
      return make_stream();
    };
    b->priority_stream = [this](int priority) -> StatusOr<StreamHandle> {
      fallback_priorities.push_back(priority);
      return make_stream();
    };
    b->destroy_stream = [this](StreamHandle stream) {
      auto it = std::find(live_streams.begin(), live_streams.end(), stream);
      ASSERT_NE(it, live_streams.end()) << "destroyed a stream twice or one never made";
      live_streams.erase(it);
    };
    b->destroy_groups = [this] { destroyed_groups = groups; };
    return b;
  }
  StreamHandle make_stream() {
    auto handle = reinterpret_cast<StreamHandle>(next_handle += 16);
    live_streams.push_back(handle);
    return handle;
  }
};

std::vector<WorkloadSpec> critical_and_background() {
  return {{"critical", 8, Priority::kCritical, 1}, {"background", 0, Priority::kBackground, 2}};
}

TEST(PartitionPlan, GreenContextsGiveEachWorkloadItsSms) {
  FakeDriver driver;
  {
    auto plan = PartitionPlan::create(3, critical_and_background(), driver.backend());
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_TRUE((*plan)->isolated());
    EXPECT_TRUE((*plan)->fallback_reason().empty());
    auto critical = (*plan)->workload("critical");
    auto background = (*plan)->workload("background");
    ASSERT_TRUE(critical.ok() && background.ok());
    EXPECT_EQ((*critical)->sm_count(), 8);
    EXPECT_EQ((*background)->sm_count(), 124);
    EXPECT_EQ((*critical)->stream_count(), 1);
    EXPECT_EQ((*background)->stream_count(), 2);
    EXPECT_EQ((*critical)->priority(), -5);
    EXPECT_EQ((*background)->priority(), 0);
    ASSERT_EQ(driver.group_streams.size(), 3u);
    EXPECT_EQ(driver.group_streams[0], std::make_pair(0, -5));
    EXPECT_EQ(driver.group_streams[1], std::make_pair(1, 0));
    EXPECT_TRUE(partition_plan_active(3));
    EXPECT_NE((*plan)->describe().find("critical: 8 SMs"), std::string::npos);
    EXPECT_EQ((*plan)->workload("training").status().code(), StatusCode::kNotFound);
  }
  EXPECT_FALSE(partition_plan_active(3));
  EXPECT_TRUE(driver.live_streams.empty()) << "the plan must destroy every stream it made";
  EXPECT_EQ(driver.destroyed_groups, 2);
}

TEST(PartitionPlan, RoundsUpToTheDriversGranularity) {
  FakeDriver driver;
  auto plan = PartitionPlan::create(
      0, {{"critical", 5, Priority::kCritical, 1}, {"rest", 0, Priority::kNormal, 1}},
      driver.backend());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*(*plan)->workload("critical"))->sm_count(), 8);
  EXPECT_EQ((*(*plan)->workload("rest"))->sm_count(), 124);
}

TEST(PartitionPlan, FallsBackToPriorityStreamsWithAReason) {
  FakeDriver driver;
  driver.has_green_contexts = false;
  auto plan = PartitionPlan::create(0, critical_and_background(), driver.backend());
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_FALSE((*plan)->isolated());
  EXPECT_NE((*plan)->fallback_reason().find("12.4"), std::string::npos);
  EXPECT_NE((*plan)->fallback_reason().find("priority streams"), std::string::npos);
  EXPECT_EQ(driver.fallback_priorities, (std::vector<int>{-5, 0, 0}));
  EXPECT_TRUE(driver.group_streams.empty());
  EXPECT_EQ((*(*plan)->workload("critical"))->sm_count(), 132);
}

TEST(PartitionPlan, NoFallbackWhenRefused) {
  FakeDriver driver;
  driver.has_green_contexts = false;
  auto plan = PartitionPlan::create(0, critical_and_background(), driver.backend(), false);
  EXPECT_EQ(plan.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(partition_plan_active(0));
}

TEST(PartitionPlan, GreenContextsTurnedOffFallBackOnADriverThatHasThem) {
  FakeDriver driver;
  PartitionOptions options;
  options.use_green_contexts = false;
  {
    auto plan = PartitionPlan::create(0, critical_and_background(), driver.backend(), options);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_FALSE((*plan)->isolated());
    EXPECT_NE((*plan)->fallback_reason().find("use_green_contexts"), std::string::npos);
    EXPECT_TRUE(driver.group_streams.empty()) << "no green-context stream may be made";
    EXPECT_EQ(driver.fallback_priorities, (std::vector<int>{-5, 0, 0}));
    EXPECT_EQ((*(*plan)->workload("critical"))->sm_count(), 132);
  }
  options.allow_fallback = false;
  auto refused = PartitionPlan::create(0, critical_and_background(), driver.backend(), options);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(partition_plan_active(0));
}

TEST(PartitionPlan, SplitFailureFallsBack) {
  FakeDriver driver;
  driver.sms = 16;
  auto plan = PartitionPlan::create(
      0, {{"a", 9, Priority::kHigh, 1}, {"b", 0, Priority::kNormal, 1}}, driver.backend());
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_FALSE((*plan)->isolated());
  EXPECT_NE((*plan)->fallback_reason().find("not enough SMs"), std::string::npos);
}

TEST(PartitionPlan, RejectsBadSpecs) {
  FakeDriver driver;
  auto code = [&](std::vector<WorkloadSpec> specs) {
    return PartitionPlan::create(0, specs, driver.backend()).status().code();
  };
  EXPECT_EQ(code({}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"", 8}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", 8}, {"a", 0}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", 0}, {"b", 0}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", 200}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", 132}, {"b", 0}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", -1}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", 8, Priority::kHigh, 0}}), StatusCode::kInvalidArgument);
  EXPECT_TRUE(driver.live_streams.empty());
  EXPECT_FALSE(partition_plan_active(0));
}

TEST(PartitionPlan, OnePlanPerDevice) {
  FakeDriver driver;
  auto first = PartitionPlan::create(1, critical_and_background(), driver.backend());
  ASSERT_TRUE(first.ok());
  auto second = PartitionPlan::create(1, critical_and_background(), driver.backend());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  auto other_device = PartitionPlan::create(2, critical_and_background(), driver.backend());
  EXPECT_TRUE(other_device.ok());
}

// Without a usable device a stream's SM count is a clear error (the runtime's reason), not a
// crash or a made-up count. (On the GPU machine, gpu_runtime checks the counts themselves.)
TEST(StreamSmCount, WithoutADeviceIsAnError) {
  if (cuda_device_count().ok()) GTEST_SKIP() << "a GPU is present; gpu_runtime tests the counts";
  const StatusOr<int> sms = stream_sm_count(nullptr);
  ASSERT_FALSE(sms.ok());
  EXPECT_TRUE(sms.status().code() == StatusCode::kUnavailable ||
              sms.status().code() == StatusCode::kUnimplemented)
      << sms.status().to_string();
  EXPECT_FALSE(sms.status().message().empty());
}

}  // namespace
}  // namespace gpuopt::runtime
