// GPU exact search vs its CPU twin on fresh random data (ties allowed), and ingest from a device
// pointer and a DLPack tensor.
#include "gpuopt/vector/gpu_search.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/test_support.hpp"
#include "vector/search_kernels.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

namespace gpuopt::vector {
namespace {

std::vector<float> random_vectors(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Rank-by-rank: the GPU's i-th hit has the reference's i-th distance (recomputed directly for the
// returned row), so equal-distance rows may swap but nothing else.
void expect_matches(const GpuSearchResult& gpu, const GpuSearchResult& cpu, const float* base,
                    const float* queries, std::size_t query_count, std::size_t dim, std::size_t k,
                    Metric metric, std::size_t rows) {
  for (std::size_t q = 0; q < query_count; ++q) {
    for (std::size_t i = 0; i < k; ++i) {
      std::uint64_t p = gpu.positions[q * k + i];
      ASSERT_LT(p, rows) << "query " << q << " rank " << i << " unwritten";
      float actual = detail::direct_distance(metric, queries + q * dim, base + p * dim, dim);
      float expected = detail::direct_distance(metric, queries + q * dim,
                                               base + cpu.positions[q * k + i] * dim, dim);
      EXPECT_NEAR(actual, expected, 1e-3f * std::max(1.0f, std::fabs(expected)))
          << "query " << q << " rank " << i;
    }
  }
}

class GpuExactSearch : public ::testing::TestWithParam<std::tuple<Metric, GpuPrecision>> {};

TEST_P(GpuExactSearch, MatchesCpuTwin) {
  GPUOPT_REQUIRE_GPU();
  auto [metric, precision] = GetParam();
  const std::size_t rows = 40000, dim = 96, query_count = 300, k = 10;
  auto base = random_vectors(rows * dim, 1);
  auto queries = random_vectors(query_count * dim, 2);
  auto dataset = GpuDataset::create(dim, metric, 1000);  // forces growth
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows / 2, stream).ok());
  ASSERT_TRUE((*dataset)->append_host(base.data() + rows / 2 * dim, rows - rows / 2, stream).ok());
  GpuSearchOptions options;
  options.k = k;
  options.precision = precision;
  options.tile_rows = 7000;  // uneven last tile
  auto gpu = (*dataset)->search(queries.data(), query_count, options, stream);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu = exact_search_reference(base.data(), rows, dim, metric, queries.data(), query_count, k);
  expect_matches(*gpu, cpu, base.data(), queries.data(), query_count, dim, k, metric, rows);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    All, GpuExactSearch,
    ::testing::Combine(::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine),
                       ::testing::Values(GpuPrecision::kFp32, GpuPrecision::kTf32Rerank)));

TEST(GpuIngest, DevicePointerAndDlpackMatchHostIngest) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t rows = 5000, dim = 32;
  auto base = random_vectors(rows * dim, 3);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), rows * dim * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, base.data(), rows * dim * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto dataset = GpuDataset::create(dim, Metric::kL2, rows);
  ASSERT_TRUE(dataset.ok());
  ASSERT_TRUE((*dataset)->append_device(device, rows / 2, stream).ok());
  std::int64_t shape[2] = {static_cast<std::int64_t>(rows - rows / 2),
                           static_cast<std::int64_t>(dim)};
  DLTensor tensor{device + rows / 2 * dim, {2, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
  ASSERT_TRUE((*dataset)->append_dlpack(tensor, stream).ok());
  EXPECT_FALSE((*dataset)->append_device(base.data(), 1, stream).ok()) << "host pointer accepted";
  std::vector<float> copy(rows * dim, -1.0f), norms(rows, -1.0f);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(copy.data(), (*dataset)->device_vectors(), copy.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(norms.data(), (*dataset)->device_norms(), rows * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(copy, base);
  for (std::size_t r = 0; r < rows; ++r) {
    float expected = 0;
    for (std::size_t t = 0; t < dim; ++t) expected += base[r * dim + t] * base[r * dim + t];
    ASSERT_NEAR(norms[r], expected, 1e-4f * expected) << r;
  }
  cudaFree(device);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace gpuopt::vector
#else
TEST(GpuVector, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif
