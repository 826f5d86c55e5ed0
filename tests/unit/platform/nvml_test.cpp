// NVML loader behaviour that needs no driver: disabled/missing library, name tables, and
// DCGM's replay budget.
#include "gpuopt/platform/nvml.hpp"

#include <gtest/gtest.h>

namespace gpuopt::platform {
namespace {

TEST(Nvml, MissingOrDisabledIsUnavailableWithAReason) {
  // This runs with no NVIDIA driver here; on the GPU machine NVML loads. Both must be clean.
  auto nvml = Nvml::instance();
  if (nvml.ok()) {
    auto count = (*nvml)->device_count();
    ASSERT_TRUE(count.ok()) << count.status().to_string();
    EXPECT_FALSE((*nvml)->library_name().empty());
  } else {
    EXPECT_EQ(nvml.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(nvml.status().message().find("NVML"), std::string::npos) << nvml.status().message();
  }
  // The second call returns the same cached answer.
  auto again = Nvml::instance();
  EXPECT_EQ(again.ok(), nvml.ok());
}

TEST(Nvml, ClockEventNames) {
  EXPECT_TRUE(clock_event_names(0).empty());
  auto names = clock_event_names(kClockEventGpuIdle | kClockEventSwPowerCap |
                                 kClockEventHwThermalSlowdown | 0x10000);
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0], "gpu_idle");
  EXPECT_EQ(names[1], "sw_power_cap");
  EXPECT_EQ(names[2], "hw_thermal_slowdown");
  EXPECT_EQ(names[3], "0x10000");
}

TEST(Nvml, ReplayBudgetFollowsBer1e12) {
  // Gen5 x16: 32e9 × 16 bit/s × 1e-12 × 60 s = 30.72 per minute.
  EXPECT_NEAR(*replay_budget_per_minute(5, 16), 30.72, 1e-9);
  // Gen4 x8: 16e9 × 8 × 1e-12 × 60 = 7.68.
  EXPECT_NEAR(*replay_budget_per_minute(4, 8), 7.68, 1e-9);
  EXPECT_FALSE(replay_budget_per_minute(0, 16).has_value());
  EXPECT_FALSE(replay_budget_per_minute(5, 0).has_value());
}

}  // namespace
}  // namespace gpuopt::platform
