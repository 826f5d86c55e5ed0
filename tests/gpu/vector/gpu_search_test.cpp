// GPU exact search vs float64 brute force on fresh random data (ties, duplicates, odd sizes, masks,
// every metric; the fused tensor-core path and the cuBLAS fallback), and ingest from a device
// pointer and a DLPack tensor.
#include "gpuopt/vector/gpu_search.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>

#include "common/test_support.hpp"
#include "gpuopt/vector/vector_file.hpp"
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

// The fused path must equal float64 brute force: the i-th returned row's float64 distance is the
// truth's i-th distance (only rows at exactly equal distance may swap), rows are distinct and
// allowed, and missing ranks (fewer allowed rows than k) are ~0 / FLT_MAX.
void expect_exact(const GpuSearchResult& gpu, const GpuSearchResult& truth,
                  const std::vector<float>& base, const std::vector<float>& queries,
                  std::size_t query_count, std::size_t dim, std::size_t k, Metric metric,
                  const std::uint64_t* mask, double tolerance) {
  std::size_t rows = base.size() / dim;
  for (std::size_t q = 0; q < query_count; ++q) {
    std::set<std::uint64_t> seen;
    for (std::size_t i = 0; i < k; ++i) {
      std::uint64_t p = gpu.positions[q * k + i];
      std::uint64_t t = truth.positions[q * k + i];
      if (t == ~std::uint64_t{0}) {
        EXPECT_EQ(p, ~std::uint64_t{0}) << "query " << q << " rank " << i << ": no row expected";
        EXPECT_EQ(gpu.distances[q * k + i], FLT_MAX) << "query " << q << " rank " << i;
        continue;
      }
      ASSERT_LT(p, rows) << "query " << q << " rank " << i << " unwritten";
      ASSERT_TRUE(seen.insert(p).second) << "query " << q << " row " << p << " twice";
      if (mask != nullptr) {
        ASSERT_TRUE((mask[p / 64] >> (p % 64)) & 1) << "query " << q << " masked row " << p;
      }
      double actual = exact_distance_f64(metric, &queries[q * dim], &base[p * dim], dim);
      double expected = exact_distance_f64(metric, &queries[q * dim], &base[t * dim], dim);
      ASSERT_NEAR(actual, expected, tolerance * std::max(1.0, std::fabs(expected)))
          << "query " << q << " rank " << i << " row " << p << " truth row " << t;
      EXPECT_NEAR(gpu.distances[q * k + i], actual, 1e-5 * std::max(1.0, std::fabs(actual)))
          << "query " << q << " rank " << i << ": reported distance";
    }
  }
}

struct ExactCase {
  std::size_t rows, dim, queries, k;
  Metric metric;
  double keep = 1.0;               // fraction of rows the allow mask keeps (1 = no mask)
  std::size_t duplicates = 0;      // rows copied over other rows (ties)
  bool queries_from_rows = false;  // queries are copies of database rows (distance-0 ties)
};

struct ExactOutcome {
  GpuSearchResult gpu;
};

ExactOutcome run_exact_case(const ExactCase& c, std::uint64_t seed, GpuPrecision precision,
                            double tolerance) {
  auto base = random_vectors(c.rows * c.dim, seed);
  auto queries = random_vectors(c.queries * c.dim, seed + 1);
  std::mt19937_64 rng(seed + 2);
  for (std::size_t d = 0; d < c.duplicates; ++d) {
    std::size_t from = rng() % c.rows, to = rng() % c.rows;
    std::copy_n(&base[from * c.dim], c.dim, &base[to * c.dim]);
  }
  if (c.queries_from_rows) {
    for (std::size_t q = 0; q < c.queries; ++q) {
      std::copy_n(&base[(rng() % c.rows) * c.dim], c.dim, &queries[q * c.dim]);
    }
  }
  std::vector<std::uint64_t> mask;
  if (c.keep < 1.0) {
    mask.assign((c.rows + 63) / 64, 0);
    std::bernoulli_distribution keep(c.keep);
    for (std::size_t r = 0; r < c.rows; ++r) {
      if (keep(rng)) mask[r / 64] |= std::uint64_t{1} << (r % 64);
    }
  }
  const std::uint64_t* mask_pointer = mask.empty() ? nullptr : mask.data();
  ExactOutcome outcome;
  auto dataset = GpuDataset::create(c.dim, c.metric, 16);  // forces growth
  EXPECT_TRUE(dataset.ok()) << dataset.status().to_string();
  if (!dataset.ok()) return outcome;
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::size_t half = c.rows / 3;
  EXPECT_TRUE((*dataset)->append_host(base.data(), half, stream).ok());
  EXPECT_TRUE((*dataset)->append_host(base.data() + half * c.dim, c.rows - half, stream).ok());
  GpuSearchOptions options;
  options.k = c.k;
  options.precision = precision;
  options.allow_mask = mask_pointer;
  options.tile_rows = 7000;
  auto gpu = (*dataset)->search(queries.data(), c.queries, options, stream);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  cudaStreamDestroy(stream);
  if (!gpu.ok()) return outcome;
  auto truth = exact_search_reference(base.data(), c.rows, c.dim, c.metric, queries.data(),
                                      c.queries, c.k, mask_pointer);
  expect_exact(*gpu, truth, base, queries, c.queries, c.dim, c.k, c.metric, mask_pointer,
               tolerance);
  outcome.gpu = std::move(*gpu);
  return outcome;
}

class FusedExactSearch : public ::testing::TestWithParam<Metric> {};

TEST_P(FusedExactSearch, EqualsFloat64BruteForceWithTies) {
  GPUOPT_REQUIRE_GPU();
  // n not a multiple of the 64-row tile, dim padded (100 -> 128), duplicate rows.
  ExactCase c{50003, 100, 257, 10, GetParam(), 1.0, 500, false};
  auto outcome = run_exact_case(c, 11, GpuPrecision::kFp32, 1e-9);
  EXPECT_TRUE(outcome.gpu.fused);
  EXPECT_EQ(outcome.gpu.fallback_queries, 0u);
}

TEST_P(FusedExactSearch, QueriesThatAreRows) {
  GPUOPT_REQUIRE_GPU();
  // Each query equals a database row (distance 0 for L2/cosine), some rows duplicated.
  ExactCase c{20000, 64, 100, 16, GetParam(), 1.0, 300, true};
  auto outcome = run_exact_case(c, 21, GpuPrecision::kFp32, 1e-9);
  EXPECT_TRUE(outcome.gpu.fused);
}

TEST_P(FusedExactSearch, MaskRemovesMostRows) {
  GPUOPT_REQUIRE_GPU();
  ExactCase c{100000, 128, 64, 10, GetParam(), 0.01, 0, false};
  auto outcome = run_exact_case(c, 31, GpuPrecision::kFp32, 1e-9);
  EXPECT_TRUE(outcome.gpu.fused);
}

TEST_P(FusedExactSearch, KLargerThanAllowedRows) {
  GPUOPT_REQUIRE_GPU();
  // 37 rows (less than one tile), 1 query, k = 50: 37 answers, then empty ranks.
  run_exact_case({37, 24, 1, 50, GetParam()}, 41, GpuPrecision::kFp32, 1e-9);
  // 5000 rows with a mask keeping about 3 of them.
  run_exact_case({5000, 32, 7, 10, GetParam(), 0.0006}, 42, GpuPrecision::kFp32, 1e-9);
}

TEST_P(FusedExactSearch, LargeK) {
  GPUOPT_REQUIRE_GPU();
  auto outcome =
      run_exact_case({30011, 96, 70, 100, GetParam(), 0.5, 100}, 51, GpuPrecision::kFp32, 1e-9);
  EXPECT_TRUE(outcome.gpu.fused);
}

TEST_P(FusedExactSearch, EveryDimension) {
  GPUOPT_REQUIRE_GPU();
  for (std::size_t dim : {1, 7, 16, 33, 64, 65, 96, 127, 128}) {
    SCOPED_TRACE(dim);
    // At dim <= 8 many rows crowd within the bound of the k-th distance, so queries may go to
    // the fp32 fallback (ties within fp32 rounding).
    auto outcome = run_exact_case({3001, dim, 33, 5, GetParam()}, 60 + dim, GpuPrecision::kFp32,
                                  dim <= 8 ? 1e-5 : 1e-9);
    EXPECT_TRUE(outcome.gpu.fused);
  }
}

TEST_P(FusedExactSearch, ManyTiesFallBackAndStayExact) {
  GPUOPT_REQUIRE_GPU();
  // 400 copies of row 0 and queries equal to it: more exact ties than the lists hold, so the
  // queries are answered by the fp32 cuBLAS path (ties within fp32 rounding).
  const std::size_t rows = 20000, dim = 64, query_count = 4, k = 10;
  auto base = random_vectors(rows * dim, 71);
  for (std::size_t r = 1; r <= 400; ++r) std::copy_n(&base[0], dim, &base[r * 37 % rows * dim]);
  std::vector<float> queries(query_count * dim);
  for (std::size_t q = 0; q < query_count; ++q) std::copy_n(&base[0], dim, &queries[q * dim]);
  auto dataset = GpuDataset::create(dim, GetParam(), rows);
  ASSERT_TRUE(dataset.ok());
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows, nullptr).ok());
  GpuSearchOptions options;
  options.k = k;
  options.small_batch_max_queries = 0;  // the batched fused kernel, whose lists overflow here
  auto gpu = (*dataset)->search(queries.data(), query_count, options, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_GT(gpu->fallback_queries, 0u);
  auto truth =
      exact_search_reference(base.data(), rows, dim, GetParam(), queries.data(), query_count, k);
  // fp32 distances of equal vectors: |q|^2 + |x|^2 - 2 q.x cancels to about 1e-5 of |q|^2.
  expect_exact(*gpu, truth, base, queries, query_count, dim, k, GetParam(), nullptr, 1e-4 * dim);
  // The small-batch path (4 queries) keeps every tie it cannot separate: exact as well.
  options.small_batch_max_queries = 16;
  auto small = (*dataset)->search(queries.data(), query_count, options, nullptr);
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  expect_exact(*small, truth, base, queries, query_count, dim, k, GetParam(), nullptr, 1e-4 * dim);
}

INSTANTIATE_TEST_SUITE_P(All, FusedExactSearch,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine));

TEST(TiledExactSearch, MaskAndLargeDimensionFallBack) {
  GPUOPT_REQUIRE_GPU();
  // dim 200 is beyond the fused path; the cuBLAS path must honour the mask and k up to 128.
  ExactCase c{9000, 200, 20, 120, Metric::kL2, 0.3, 0, false};
  auto outcome = run_exact_case(c, 81, GpuPrecision::kFp32, 1e-4);
  EXPECT_FALSE(outcome.gpu.fused);
  ExactCase tf32{9000, 64, 20, 10, Metric::kCosine, 0.3, 0, false};
  // The forced cuBLAS fp32 path at a dimension the fused path would take.
  auto approximate = run_exact_case(tf32, 82, GpuPrecision::kFp32Tiled, 1e-4);
  EXPECT_FALSE(approximate.gpu.fused);
}

INSTANTIATE_TEST_SUITE_P(
    All, GpuExactSearch,
    ::testing::Combine(::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine),
                       ::testing::Values(GpuPrecision::kFp32, GpuPrecision::kTf32Rerank)));

// Timing harness for scripts/gpu-check.d/vector.sh (skipped unless GPUOPT_VECTOR_TIMING_BASE is
// set): exact search over .npy base/queries, wall-clock per call (query upload and result download
// included), median of 20 after a warm-up; prints one RESULT line and writes the ids (int64
// [nq, k]) to $GPUOPT_VECTOR_TIMING_IDS for the float64 check.
TEST(FusedSearchTiming, NpyFiles) {
  GPUOPT_REQUIRE_GPU();
  const char* base_path = std::getenv("GPUOPT_VECTOR_TIMING_BASE");
  const char* query_path = std::getenv("GPUOPT_VECTOR_TIMING_QUERIES");
  const char* ids_path = std::getenv("GPUOPT_VECTOR_TIMING_IDS");
  if (base_path == nullptr || query_path == nullptr) GTEST_SKIP() << "timing files not given";
  auto base = read_vector_file(base_path);
  auto queries = read_vector_file(query_path);
  ASSERT_TRUE(base.ok() && queries.ok());
  ASSERT_EQ(base->dim, queries->dim);
  const std::size_t k = 10;
  auto dataset = GpuDataset::create(base->dim, Metric::kL2, base->rows);
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  ASSERT_TRUE((*dataset)->append_host(base->values.data(), base->rows, nullptr).ok());
  auto time_search = [&](GpuPrecision precision, int repeat, GpuSearchResult* last) {
    GpuSearchOptions options;
    options.k = k;
    options.precision = precision;
    std::vector<double> ms;
    for (int r = 0; r <= repeat; ++r) {
      auto start = std::chrono::steady_clock::now();
      auto found = (*dataset)->search(queries->values.data(), queries->rows, options, nullptr);
      double elapsed =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      EXPECT_TRUE(found.ok()) << found.status().to_string();
      if (!found.ok()) return ms;
      if (r > 0) ms.push_back(elapsed);
      if (last != nullptr) *last = std::move(*found);
    }
    std::sort(ms.begin(), ms.end());
    return ms;
  };
  GpuSearchResult fused;
  auto fused_ms = time_search(GpuPrecision::kFp32, 20, &fused);
  auto tiled_ms = time_search(GpuPrecision::kFp32Tiled, 5, nullptr);
  ASSERT_FALSE(fused_ms.empty() || tiled_ms.empty());
  std::printf(
      "RESULT: gpuopt exact fused %zux%zu nq=%zu k=%zu: median %.3f ms of %zu (min %.3f, max "
      "%.3f; fused=%d, fallback queries %zu); cuBLAS fp32 tiles median %.3f ms of %zu\n",
      base->rows, base->dim, queries->rows, k, fused_ms[fused_ms.size() / 2], fused_ms.size(),
      fused_ms.front(), fused_ms.back(), int(fused.fused), fused.fallback_queries,
      tiled_ms[tiled_ms.size() / 2], tiled_ms.size());
  if (ids_path != nullptr) {
    std::vector<std::int64_t> ids(fused.positions.begin(), fused.positions.end());
    std::ofstream out(ids_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(std::int64_t));
  }
}

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
