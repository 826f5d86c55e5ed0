// Named priority levels onto a device's stream priority range, and the CPU-only behaviour.
#include <gtest/gtest.h>

#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {
namespace {

TEST(PriorityValue, SpreadsLevelsOverTheRange) {
  // Hopper and Ampere report least = 0, greatest = -5.
  EXPECT_EQ(priority_value(Priority::kCritical, 0, -5), -5);
  EXPECT_EQ(priority_value(Priority::kBackground, 0, -5), 0);
  int high = priority_value(Priority::kHigh, 0, -5);
  int normal = priority_value(Priority::kNormal, 0, -5);
  EXPECT_LT(-5, high);
  EXPECT_LT(high, normal);
  EXPECT_LT(normal, 0);
}

TEST(PriorityValue, NarrowAndEmptyRanges) {
  EXPECT_EQ(priority_value(Priority::kCritical, 0, 0), 0);
  EXPECT_EQ(priority_value(Priority::kBackground, 0, 0), 0);
  EXPECT_EQ(priority_value(Priority::kCritical, 0, -1), -1);
  EXPECT_EQ(priority_value(Priority::kBackground, 0, -1), 0);
  for (int level = 0; level < kPriorityLevels; ++level) {
    int value = priority_value(static_cast<Priority>(level), 0, -1);
    EXPECT_TRUE(value == 0 || value == -1);
  }
}

TEST(PriorityNames, RoundTrip) {
  for (int level = 0; level < kPriorityLevels; ++level) {
    auto priority = static_cast<Priority>(level);
    auto parsed = parse_priority(priority_name(priority));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, priority);
  }
  auto bad = parse_priority("urgent");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("urgent"), std::string::npos);
}

#if !GPUOPT_CUDA
TEST(Device, CpuOnlyBuildSaysUnimplemented) {
  EXPECT_EQ(Device::open(0).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(Event::create().status().code(), StatusCode::kUnimplemented);
}
#endif

}  // namespace
}  // namespace gpuopt::runtime
