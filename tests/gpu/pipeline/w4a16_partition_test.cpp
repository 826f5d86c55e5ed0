// The W4A16 wgmma kernel's shared fix-up (k-splits whose blocks wait for each other, launched
// cooperatively) run on a stream of a green-context partition smaller than the GPU it was planned
// for: the cooperative launch is refused there, and run() takes the same grid with the atomic
// partial sums instead. Results match the CPU twin run after run (the workspace stays usable).
// compute-sanitizer lists each refused launch as an API error (720), not a memory error.
// Here rather than in gpu_kernels: it needs the runtime's partitions (this binary links both).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/test_support.hpp"
#include "gpu/kernels/w4a16_check.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::kernels {
namespace {

using namespace w4a16_test;  // NOLINT: Case, check_case, kFormats, ScopedEnv

TEST(W4A16PartitionGpu, SharedFixUpOnASmallerPartitionFallsBack) {
  GPUOPT_REQUIRE_GPU();
  int device_index = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device_index), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index),
            cudaSuccess);
  if (major != 9 || minor != 0)
    GTEST_SKIP() << "wgmma kernel needs sm_90, not sm_" << major << minor;
  auto device = runtime::Device::open(device_index);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  auto plan =
      runtime::PartitionPlan::create(*device, {{"small", 8, runtime::Priority::kCritical, 1},
                                               {"rest", 0, runtime::Priority::kBackground, 1}});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  if (!(*plan)->isolated()) GTEST_SKIP() << "no green contexts: " << (*plan)->fallback_reason();
  auto small = (*plan)->workload("small");
  ASSERT_TRUE(small.ok());
  std::printf("partition: %d of %d SMs\n", (*small)->sm_count(), device->sm_count());
  ASSERT_LT((*small)->sm_count() * 2, 64) << "the partition must be too small for 64 blocks";

  // 8 column tiles x 8 k-splits = 64 blocks: one wave on the whole H200 (the plan takes the shared
  // fix-up), more than the partition holds at once.
  ScopedEnv forced({{"GPUOPT_W4A16_WGMMA_VARIANT", "8"}, {"GPUOPT_W4A16_WGMMA_SPLITS", "8"}});
  W4A16Options options;
  options.force_path = 5;
  const auto stream = static_cast<cudaStream_t>((*small)->stream(0));
  check_case({ActivationType::kFloat16, kFormats[0], 128, 64, 3072, 2048, options}, 3,
             "shared-fixup", stream);
  check_case({ActivationType::kBFloat16, kFormats[2], 64, 50, 1344, 1984, options}, 2,
             "shared-fixup", stream);
}

}  // namespace
}  // namespace gpuopt::kernels
