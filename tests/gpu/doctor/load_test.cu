// doctor --load on a real GPU: the spin kernel runs for the requested time, NVML sees the GPU
// busy while it does, and the live report names every NVML GPU with its link.
#include <gtest/gtest.h>

#include "common/test_support.hpp"
#include "gpuopt/doctor/doctor.hpp"
#include "gpuopt/doctor/load.hpp"

namespace gpuopt::doctor {
namespace {

TEST(DoctorLoad, SpinKernelRunsForTheRequestedTime) {
  GPUOPT_REQUIRE_GPU();
  auto nvml = platform::Nvml::instance();
  if (!nvml.ok()) GTEST_SKIP() << nvml.status().to_string();
  auto handle = (*nvml)->device_by_index(0);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  auto bdf = (*nvml)->pci_bus_id(*handle);
  ASSERT_TRUE(bdf.ok()) << bdf.status().to_string();
  std::optional<int> pstate_during;
  bool called = false;
  auto observed = run_under_load(*bdf, 300, [&] {
    called = true;
    if (auto state = (*nvml)->performance_state(*handle); state.ok()) pstate_during = *state;
  });
  ASSERT_TRUE(observed.ok()) << observed.status().to_string();
  EXPECT_TRUE(called);
  EXPECT_GE(*observed, 300LL * 1000 * 1000);
  EXPECT_LT(*observed, 30LL * 1000 * 1000 * 1000);
  if (pstate_during) EXPECT_LE(*pstate_during, 2);  // busy GPUs leave their idle states
}

TEST(DoctorLoad, LiveReportMatchesNvml) {
  GPUOPT_REQUIRE_GPU();
  auto nvml = platform::Nvml::instance();
  if (!nvml.ok()) GTEST_SKIP() << nvml.status().to_string();
  auto report = collect(Options{});
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  judge(*report);
  ASSERT_TRUE(report->nvml.available);
  ASSERT_EQ(report->nvml.gpus.size(), *(*nvml)->device_count());
  for (const auto& gpu : report->nvml.gpus) {
    EXPECT_TRUE(gpu.max_generation.has_value()) << gpu.bdf;
    EXPECT_TRUE(gpu.bar1.has_value()) << gpu.bdf;
    EXPECT_TRUE(gpu.persistence_mode.has_value()) << gpu.bdf;
    bool in_pci = false;
    for (const auto& device : report->pci.devices) in_pci |= device.bdf == gpu.bdf;
    EXPECT_TRUE(in_pci) << gpu.bdf << " from NVML is not among the sysfs devices";
  }
  EXPECT_LT(report->elapsed_ms, 1000.0);  // the doctor's own budget, also checked by gpu-check
}

}  // namespace
}  // namespace gpuopt::doctor
