// PCIe bench on a real GPU: the fill/verify kernels against their CPU twin, and a small run of
// every testcase that gives verified, sane figures.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "bench/pcie_device.hpp"
#include "common/test_support.hpp"
#include "gpuopt/bench/pcie.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::bench::pcie {
namespace {

#if GPUOPT_CUDA
TEST(PcieGpu, FillAndCountKernelsMatchTheCpuTwin) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  const std::uint64_t seed = random();
  const std::size_t bytes = (1u << 20) + 5;  // a partial last word
  auto device = runtime::DeviceBuffer::allocate(bytes);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  auto stream = detail::Stream::create();
  ASSERT_TRUE(stream.ok());
  ASSERT_EQ(cudaMemsetAsync(device->data(), 0xA5, bytes, stream->get()), cudaSuccess);
  ASSERT_TRUE(detail::launch_fill_pattern(device->data(), bytes, seed, stream->get()).ok());
  std::vector<unsigned char> from_gpu(bytes), expected(bytes);
  ASSERT_EQ(cudaMemcpyAsync(from_gpu.data(), device->data(), bytes, cudaMemcpyDeviceToHost,
                            stream->get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  fill_pattern_reference(expected.data(), bytes, seed);
  EXPECT_EQ(std::memcmp(from_gpu.data(), expected.data(), bytes), 0);

  // Corrupt a few random bytes (and the tail); the GPU must count exactly those.
  std::set<std::size_t> flipped = {bytes - 1};
  while (flipped.size() < 7) flipped.insert(random() % bytes);
  for (std::size_t i : flipped) expected[i] ^= 0x5A;
  ASSERT_EQ(cudaMemcpyAsync(device->data(), expected.data(), bytes, cudaMemcpyHostToDevice,
                            stream->get()),
            cudaSuccess);
  auto mismatches = detail::count_mismatches_on_device(device->data(), bytes, seed, stream->get());
  ASSERT_TRUE(mismatches.ok()) << mismatches.status().to_string();
  EXPECT_EQ(*mismatches, flipped.size());
  EXPECT_EQ(*mismatches, count_mismatches_reference(expected.data(), bytes, seed));
}

TEST(PcieGpu, SmCopyCopiesEveryByteIncludingTheTail) {
  GPUOPT_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  const std::size_t bytes = 3 * 4096 + 9;
  auto src = runtime::DeviceBuffer::allocate(bytes);
  auto dst = runtime::DeviceBuffer::allocate(bytes);
  auto stream = detail::Stream::create();
  ASSERT_TRUE(src.ok() && dst.ok() && stream.ok());
  ASSERT_TRUE(detail::launch_fill_pattern(src->data(), bytes, seed, stream->get()).ok());
  ASSERT_EQ(cudaMemsetAsync(dst->data(), 0, bytes, stream->get()), cudaSuccess);
  ASSERT_TRUE(detail::launch_sm_copy(dst->data(), src->data(), bytes, 4, stream->get()).ok());
  auto mismatches = detail::count_mismatches_on_device(dst->data(), bytes, seed, stream->get());
  ASSERT_TRUE(mismatches.ok());
  EXPECT_EQ(*mismatches, 0u);
}
#endif

TEST(PcieGpu, SmallRunGivesVerifiedSaneFigures) {
  GPUOPT_REQUIRE_GPU();
  BenchOptions options;
  options.sizes = {64 << 10, 16 << 20};
  options.samples = 3;
  BenchContext context(options);
  Suite suite = make_suite(options);
  auto results = suite.run(context);
  for (const auto& result : results) {
    SCOPED_TRACE(result.key);
    EXPECT_NE(result.outcome, Outcome::kFailed) << result.reason;
    if (result.outcome != Outcome::kPassed || !result.data.contains("sizes")) continue;
    for (const auto& row : result.data["sizes"]) {
      EXPECT_EQ(row["verified"], true);
      for (const char* field : {"bandwidth_gbps", "sum_gbps"}) {
        if (!row.contains(field)) continue;
        double median = row[field]["median"];
        // Above 0.05 GB/s and below any memory system today (HBM3e is ~5 TB/s read+write).
        EXPECT_GT(median, 0.05);
        EXPECT_LT(median, 10000.0);
      }
      if (row.contains("round_trip_latency_us")) {
        double us = row["round_trip_latency_us"]["median"];
        EXPECT_GT(us, 0.1);
        EXPECT_LT(us, 10000.0);
      }
    }
  }
  auto verdict = std::find_if(results.begin(), results.end(),
                              [](const auto& r) { return r.key == "pcie_link_verdict"; });
  ASSERT_NE(verdict, results.end());
  EXPECT_EQ(verdict->outcome, Outcome::kPassed) << verdict->reason;
}

}  // namespace
}  // namespace gpuopt::bench::pcie
