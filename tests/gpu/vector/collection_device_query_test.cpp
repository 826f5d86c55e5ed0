// Collection::query_device (queries and results in device memory) against a float64 brute force
// over the live rows that pass the filter, for batch 1, 16 and 300 (small-batch and batched
// paths), after deletes and a segment written after the first query; and its refusals.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "common/test_support.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 48;

struct DeviceArray {
  void* data = nullptr;
  explicit DeviceArray(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceArray() { cudaFree(data); }
};

// Checks the device answers rank by rank against float64 brute force over `allowed`.
void expect_brute_force(const std::vector<std::uint64_t>& ids, const std::vector<float>& distances,
                        const std::map<std::uint64_t, std::vector<float>>& allowed,
                        const std::vector<float>& queries, std::size_t query_count, std::size_t k,
                        Metric metric) {
  for (std::size_t q = 0; q < query_count; ++q) {
    const float* query = &queries[q * kDim];
    std::vector<double> truth;
    for (const auto& [id, row] : allowed) {
      truth.push_back(exact_distance_f64(metric, query, row.data(), kDim));
    }
    std::sort(truth.begin(), truth.end());
    for (std::size_t i = 0; i < k; ++i) {
      const std::uint64_t id = ids[q * k + i];
      if (i >= truth.size()) {
        EXPECT_EQ(id, ~std::uint64_t{0}) << "query " << q << " rank " << i;
        EXPECT_EQ(distances[q * k + i], FLT_MAX);
        continue;
      }
      ASSERT_TRUE(allowed.count(id)) << "query " << q << " rank " << i << ": id " << id
                                     << " is deleted, filtered out or unknown";
      const double actual = exact_distance_f64(metric, query, allowed.at(id).data(), kDim);
      EXPECT_NEAR(actual, truth[i], 1e-9 * std::max(1.0, std::fabs(truth[i])))
          << "query " << q << " rank " << i;
      EXPECT_NEAR(distances[q * k + i], actual, 1e-5 * std::max(1.0, std::fabs(actual)));
    }
  }
}

class CollectionDeviceQuery : public ::testing::TestWithParam<Metric> {};

TEST_P(CollectionDeviceQuery, EqualsFloat64BruteForceWithFiltersAndDeletes) {
  GPUOPT_REQUIRE_GPU();
  const Metric metric = GetParam();
  TempDir dir("gpuopt-collection-device");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto created = (*store)->create_collection("c", {kDim, metric});
  ASSERT_TRUE(created.ok());
  Collection& c = **created;
  const std::size_t rows = 5000;
  const auto base = random_vectors(rows, kDim, 41);
  std::vector<std::uint64_t> ids(rows);
  std::vector<Metadata> metadata(rows);
  std::map<std::uint64_t, std::vector<float>> live;
  std::map<std::uint64_t, int> bucket;
  for (std::size_t i = 0; i < rows; ++i) {
    ids[i] = 9'000'000 + 7 * i;
    metadata[i]["bucket"] = double(i % 3);
    if (i < 3000) live[ids[i]].assign(&base[i * kDim], &base[(i + 1) * kDim]);  // added first
    bucket[ids[i]] = int(i % 3);
  }
  ASSERT_TRUE(c.add(std::span(ids).first(3000), base.data(), std::span(metadata).first(3000)).ok());

  const std::size_t max_queries = 300, k = 10;
  // Queries equal to rows that get deleted below: they must not find themselves.
  auto queries = random_vectors(max_queries, kDim, 42);
  std::copy_n(&base[100 * kDim], 4 * kDim, queries.begin());
  DeviceArray device_queries(max_queries * kDim * sizeof(float));
  DeviceArray device_ids(max_queries * k * sizeof(std::uint64_t));
  DeviceArray device_distances(max_queries * k * sizeof(float));
  ASSERT_EQ(cudaMemcpy(device_queries.data, queries.data(), queries.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  auto check = [&](std::size_t query_count, const std::string& where, bool expect_upload) {
    SCOPED_TRACE("batch " + std::to_string(query_count) + " where " + where);
    std::int64_t shape[2] = {std::int64_t(query_count), std::int64_t(kDim)};
    DLTensor tensor{device_queries.data, {2, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
    GpuDeviceResults results;
    results.ids = static_cast<std::uint64_t*>(device_ids.data);
    results.distances = static_cast<float*>(device_distances.data);
    QueryOptions options;
    options.k = k;
    options.where_json = where;
    QueryReport report;
    Status status = c.query_device(tensor, options, results, stream, &report);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(report.engine, QueryEngine::kGpu);
    EXPECT_EQ(report.gpu_rows_uploaded > 0, expect_upload);
    std::vector<std::uint64_t> got_ids(query_count * k);
    std::vector<float> got_distances(query_count * k);
    ASSERT_EQ(cudaMemcpyAsync(got_ids.data(), device_ids.data, got_ids.size() * 8,
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(got_distances.data(), device_distances.data, got_distances.size() * 4,
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::map<std::uint64_t, std::vector<float>> allowed;
    for (const auto& [id, row] : live) {
      if (where.empty() || bucket.at(id) == 2) allowed[id] = row;
    }
    expect_brute_force(got_ids, got_distances, allowed, queries, query_count, k, metric);
  };
  check(1, "", /*expect_upload=*/true);
  check(16, "", false);
  check(300, "", false);
  check(16, R"({"bucket": 2})", false);
  // Deletes and a segment written after the copy exists: only the new rows travel.
  ASSERT_TRUE(
      c.add(std::span(ids).subspan(3000), &base[3000 * kDim], std::span(metadata).subspan(3000))
          .ok());
  for (std::size_t i = 3000; i < rows; ++i)
    live[ids[i]].assign(&base[i * kDim], &base[(i + 1) * kDim]);
  std::vector<std::uint64_t> removed(ids.begin() + 100, ids.begin() + 600);
  ASSERT_TRUE(c.remove(removed).ok());
  for (auto id : removed) live.erase(id);
  check(1, "", /*expect_upload=*/true);
  check(16, R"({"bucket": 2})", false);
  check(300, R"({"bucket": 2})", false);
  check(300, "", false);
  const GpuResidency residency = c.gpu_residency();
  EXPECT_TRUE(residency.exact);
  EXPECT_EQ(residency.rows, rows);
  EXPECT_GT(residency.device_bytes, 0u);
  c.release_gpu();
  EXPECT_FALSE(c.gpu_residency().exact);
  check(16, "", /*expect_upload=*/true);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Metrics, CollectionDeviceQuery,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine));

TEST(CollectionDeviceQuery, RefusesIvfLargeKAndHostQueries) {
  GPUOPT_REQUIRE_GPU();
  TempDir dir("gpuopt-collection-device");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  auto created = (*store)->create_collection("c", {kDim, Metric::kL2});
  ASSERT_TRUE(created.ok());
  const auto base = random_vectors(100, kDim, 43);
  ASSERT_TRUE((*created)->add(gpuopt::testing::id_range(0, 100), base.data()).ok());
  std::int64_t shape[2] = {2, std::int64_t(kDim)};
  DLTensor host{const_cast<float*>(base.data()), {1, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
  DeviceArray out(2 * 200 * sizeof(std::uint64_t));
  GpuDeviceResults results;
  results.ids = static_cast<std::uint64_t*>(out.data);
  QueryOptions options;
  options.index = IndexKind::kIvf;
  EXPECT_EQ((*created)->query_device(host, options, results, nullptr).code(),
            StatusCode::kUnimplemented);
  options.index = IndexKind::kExact;
  options.k = 200;
  EXPECT_EQ((*created)->query_device(host, options, results, nullptr).code(),
            StatusCode::kInvalidArgument);
  options.k = 5;
  EXPECT_EQ((*created)->query_device(host, options, results, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::vector
