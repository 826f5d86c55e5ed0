// The W4A16 wgmma kernel's shared fix-up (k-splits whose blocks wait for each other, launched
// cooperatively) run on a stream of a green-context partition smaller than the GPU it was planned
// for: the cooperative launch is refused there, and run() takes the same grid with the atomic
// partial sums instead. Results match the CPU twin run after run (the workspace stays usable).
// compute-sanitizer lists each refused launch as an API error (720), not a memory error. Planned
// for the partition (W4A16Options::sm_count) the grids fit it and nothing is refused; an sm_count
// beyond the device is refused up front. Here rather than in gpu_kernels: it needs the runtime's
// partitions (this binary links both).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/test_support.hpp"
#include "gpu/kernels/w4a16_check.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::kernels {
namespace {

using namespace w4a16_test;  // NOLINT: Case, check_case, kFormats, Device

// An 8-SM green-context partition ("small") and the rest of the GPU; skipped without green
// contexts.
class W4A16PartitionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUOPT_REQUIRE_GPU();
    int device_index = 0;
    ASSERT_EQ(cudaGetDevice(&device_index), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&major_, cudaDevAttrComputeCapabilityMajor, device_index),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&minor_, cudaDevAttrComputeCapabilityMinor, device_index),
              cudaSuccess);
    auto device = runtime::Device::open(device_index);
    ASSERT_TRUE(device.ok()) << device.status().to_string();
    device_sms_ = device->sm_count();
    auto plan =
        runtime::PartitionPlan::create(*device, {{"small", 8, runtime::Priority::kCritical, 1},
                                                 {"rest", 0, runtime::Priority::kBackground, 1}});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    plan_ = std::move(*plan);
    if (!plan_->isolated()) GTEST_SKIP() << "no green contexts: " << plan_->fallback_reason();
    auto small = plan_->workload("small");
    ASSERT_TRUE(small.ok());
    small_ = *small;
    std::printf("partition: %d of %d SMs\n", small_->sm_count(), device_sms_);
  }
  bool sm90() const { return major_ == 9 && minor_ == 0; }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(small_->stream(0)); }

  int major_ = 0, minor_ = 0, device_sms_ = 0;
  std::unique_ptr<runtime::PartitionPlan> plan_;
  const runtime::Workload* small_ = nullptr;
};

TEST_F(W4A16PartitionGpu, SharedFixUpOnASmallerPartitionFallsBack) {
  if (!sm90()) GTEST_SKIP() << "wgmma kernel needs sm_90, not sm_" << major_ << minor_;
  ASSERT_LT(small_->sm_count() * 2, 64) << "the partition must be too small for 64 blocks";

  // 8 column tiles x 8 k-splits = 64 blocks: one wave on the whole H200 (the plan takes the shared
  // fix-up), more than the partition holds at once.
  W4A16Options options;
  options.force_path = W4A16ForcePath::kWgmma;
  options.tuning.wgmma_variant = 8;
  options.tuning.wgmma_splits = 8;
  check_case({ActivationType::kFloat16, kFormats[0], 128, 64, 3072, 2048, options}, 3,
             "shared-fixup", stream());
  check_case({ActivationType::kBFloat16, kFormats[2], 64, 50, 1344, 1984, options}, 2,
             "shared-fixup", stream());
}

// The same partition with W4A16Options::sm_count = its SM count, as the stream reports it
// (runtime::stream_sm_count): the plans are one wave of the partition (the shared fix-up's grid
// fits it, so its cooperative launch is not refused), and the direct, wgmma and deterministic
// kernels match the CPU twin on the partition's stream.
TEST_F(W4A16PartitionGpu, PlannedForThePartition) {
  const StatusOr<int> stream_sms = runtime::stream_sm_count(small_->stream(0));
  ASSERT_TRUE(stream_sms.ok()) << stream_sms.status().to_string();
  ASSERT_EQ(*stream_sms, small_->sm_count());
  const int sms = *stream_sms;
  W4A16Options options;
  options.sm_count = sms;

  // The direct kernel (M <= 16): one block per SM of the partition (its k-slices share them).
  options.force_path = W4A16ForcePath::kDirect;
  check_case({ActivationType::kFloat16, kFormats[0], 128, 1, 2048, 1024, options}, 2, "direct",
             stream());
  check_case({ActivationType::kBFloat16, kFormats[2], 64, 16, 1024, 2048, options}, 2, nullptr,
             stream());
  // Deterministic mode: its k-split comes from the partition's SMs.
  W4A16Options deterministic = options;
  deterministic.force_path = W4A16ForcePath::kAuto;
  deterministic.deterministic = true;
  check_case({ActivationType::kFloat16, kFormats[1], 128, 5, 2048, 1024, deterministic}, 2, nullptr,
             stream());
  if (!sm90()) return;  // the wgmma kernel needs sm_90
  // 4 column tiles at M=33..64: 2 x sms / 4 k-splits fill the partition's 2 x sms slots in one
  // wave, with the shared fix-up (planned for the whole H200 it would take 8 k-splits, 32 blocks:
  // more than an 8-SM partition holds at once, so its cooperative launch would be refused).
  options.force_path = W4A16ForcePath::kWgmma;
  const int splits = 2 * sms / 4;
  const std::string fixup = "grid" + std::to_string(4 * splits) + " (2/SM) " +
                            std::to_string(splits) + " k-splits shared-fixup";
  check_case({ActivationType::kFloat16, kFormats[0], 128, 64, 3072, 1024, options}, 3,
             fixup.c_str(), stream());
  check_case({ActivationType::kBFloat16, kFormats[3], 64, 40, 3072, 1024, options}, 2,
             fixup.c_str(), stream());
}

// sm_count outside 0..the device's SMs is refused, by the plan (naming the option and the count)
// and by auto_fallback_min_m.
TEST(W4A16SmCountGpu, BeyondTheDeviceIsRefused) {
  GPUOPT_REQUIRE_GPU();
  const UnpackedLayer layer = random_unpacked_layer(256, 128, 128, false, false, 5);
  auto packed = pack_checkpoint_layer(layer, kFormats[0].format, kFormats[0].zeros);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  auto unpacked = unpack_checkpoint_layer(*packed);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().to_string();
  auto weights = repack_for_kernel(*unpacked, ActivationType::kFloat16);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  auto device_weights = W4A16DeviceWeights::upload(*weights, nullptr);
  ASSERT_TRUE(device_weights.ok()) << device_weights.status().to_string();
  Device buffers;
  void* x = buffers.allocate(256 * 2);
  void* y = buffers.allocate(128 * 2);
  for (int sm_count : {-1, 1 << 20}) {
    const StatusOr<int> from = W4A16Gemm::auto_fallback_min_m(*device_weights, 0, sm_count);
    ASSERT_FALSE(from.ok()) << "sm_count " << sm_count;
    EXPECT_EQ(from.status().code(), StatusCode::kInvalidArgument);
    W4A16Options options;
    options.sm_count = sm_count;
    W4A16Gemm gemm(options);
    W4A16Gemm::Arguments arguments{1, x, y, &*device_weights};
    const auto bytes = gemm.workspace_size(arguments);
    ASSERT_FALSE(bytes.ok()) << "sm_count " << sm_count;
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("sm_count=" + std::to_string(sm_count)),
              std::string::npos)
        << bytes.status().to_string();
  }
}

}  // namespace
}  // namespace gpuopt::kernels
