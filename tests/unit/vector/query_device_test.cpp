// Collection::query_device and gpu_residency on a machine without a GPU: the argument checks
// answer before any device is touched, a device query fails with the GPU's reason (never a
// crash), and nothing is resident. Against a GPU,
// tests/gpu/vector/collection_device_query_test.cpp.
#include <gtest/gtest.h>

#include "common/vector_fixtures.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

TEST(QueryDevice, ChecksArgumentsAndReportsWhyTheGpuCannotAnswer) {
  constexpr std::size_t kDim = 8;
  TempDir dir("gpuopt-query-device");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto created = (*store)->create_collection("c", {kDim, Metric::kL2});
  ASSERT_TRUE(created.ok());
  Collection& c = **created;
  const auto base = random_vectors(40, kDim, 7);
  ASSERT_TRUE(c.add(id_range(0, 40), base.data()).ok());
  std::int64_t shape[2] = {2, std::int64_t(kDim)};
  DLTensor queries{const_cast<float*>(base.data()), {1, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
  std::uint64_t ids[2 * 200];
  float distances[2 * 200];
  GpuDeviceResults results;
  results.ids = ids;
  results.distances = distances;
  QueryOptions options;
  options.index = IndexKind::kIvf;
  EXPECT_EQ(c.query_device(queries, options, results, nullptr).code(), StatusCode::kUnimplemented);
  options.index = IndexKind::kExact;
  options.k = kGpuMaxK + 1;
  Status large_k = c.query_device(queries, options, results, nullptr);
  EXPECT_EQ(large_k.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(large_k.message().find("k 129"), std::string::npos) << large_k.to_string();
  if (cuda_device_count().ok()) GTEST_SKIP() << "a GPU answers here";
  options.k = 5;
  QueryReport report;
  Status no_gpu = c.query_device(queries, options, results, nullptr, &report);
  EXPECT_TRUE(no_gpu.code() == StatusCode::kUnimplemented ||
              no_gpu.code() == StatusCode::kUnavailable)
      << no_gpu.to_string();
  const GpuResidency residency = c.gpu_residency();
  EXPECT_FALSE(residency.exact);
  EXPECT_FALSE(residency.ivf);
  EXPECT_EQ(residency.device, -1);
  c.release_gpu();  // nothing to free
  // The host query path is unaffected.
  auto found = c.query(base.data(), 1, options);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)[0][0].id, 0u);
}

}  // namespace
}  // namespace gpuopt::vector
