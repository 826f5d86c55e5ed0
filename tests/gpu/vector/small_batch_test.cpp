// The small-batch GPU exact search (batches of up to 16 queries, rows split across every SM) vs
// float64 brute force: every metric, batch 1, 2, 7 and 16 (and 32, which takes the batched path),
// k = 1, 10, 100, deletes and filters as masks, row counts that are not a multiple of the block's
// step or smaller than the SM count, duplicate rows, and the near-tie fallback; the device-in /
// device-out entry points; the memory budget of a dataset and of a collection.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>

#include "common/test_support.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"

#if GPUOPT_CUDA
namespace gpuopt::vector {
namespace {

constexpr std::uint64_t kNone = ~std::uint64_t{0};

std::vector<float> normal_vectors(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Rank by rank the GPU's row has the truth's float64 distance (rows at exactly equal distance may
// swap), rows are distinct and allowed, missing ranks are ~0 / FLT_MAX, reported distances are the
// float64 ones rounded.
void expect_exact(const GpuSearchResult& gpu, const GpuSearchResult& truth,
                  const std::vector<float>& base, const std::vector<float>& queries,
                  std::size_t query_count, std::size_t dim, std::size_t k, Metric metric,
                  const std::uint64_t* mask) {
  const std::size_t rows = base.size() / dim;
  ASSERT_EQ(gpu.positions.size(), query_count * k);
  for (std::size_t q = 0; q < query_count; ++q) {
    std::set<std::uint64_t> seen;
    for (std::size_t i = 0; i < k; ++i) {
      const std::uint64_t p = gpu.positions[q * k + i];
      const std::uint64_t t = truth.positions[q * k + i];
      if (t == kNone) {
        EXPECT_EQ(p, kNone) << "query " << q << " rank " << i << ": no row expected";
        EXPECT_EQ(gpu.distances[q * k + i], FLT_MAX) << "query " << q << " rank " << i;
        continue;
      }
      ASSERT_LT(p, rows) << "query " << q << " rank " << i << " unwritten";
      ASSERT_TRUE(seen.insert(p).second) << "query " << q << " row " << p << " twice";
      if (mask != nullptr) {
        ASSERT_TRUE((mask[p / 64] >> (p % 64)) & 1) << "query " << q << " masked row " << p;
      }
      const double actual = exact_distance_f64(metric, &queries[q * dim], &base[p * dim], dim);
      const double expected = exact_distance_f64(metric, &queries[q * dim], &base[t * dim], dim);
      ASSERT_NEAR(actual, expected, 1e-9 * std::max(1.0, std::fabs(expected)))
          << "query " << q << " rank " << i << " row " << p << " truth row " << t;
      EXPECT_NEAR(gpu.distances[q * k + i], actual, 1e-5 * std::max(1.0, std::fabs(actual)))
          << "query " << q << " rank " << i << ": reported distance";
    }
  }
}

struct Case {
  std::size_t rows, dim, queries, k;
  Metric metric;
  double keep = 1.0;               // fraction of rows the mask keeps (1 = no mask)
  std::size_t duplicates = 0;      // rows copied over other rows (ties)
  bool queries_from_rows = false;  // queries equal to rows (distance-0 ties)
};

GpuSearchResult run_case(const Case& c, std::uint64_t seed, bool expect_small_batch = true) {
  auto base = normal_vectors(c.rows * c.dim, seed);
  auto queries = normal_vectors(c.queries * c.dim, seed + 1);
  std::mt19937_64 rng(seed + 2);
  for (std::size_t d = 0; d < c.duplicates; ++d) {
    const std::size_t from = rng() % c.rows, to = rng() % c.rows;
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
  auto dataset = GpuDataset::create(c.dim, c.metric, 16);  // forces growth
  EXPECT_TRUE(dataset.ok()) << dataset.status().to_string();
  if (!dataset.ok()) return {};
  const std::size_t half = c.rows / 3;
  EXPECT_TRUE((*dataset)->append_host(base.data(), half, nullptr).ok());
  EXPECT_TRUE((*dataset)->append_host(&base[half * c.dim], c.rows - half, nullptr).ok());
  GpuSearchOptions options;
  options.k = c.k;
  options.allow_mask = mask_pointer;
  auto gpu = (*dataset)->search(queries.data(), c.queries, options, nullptr);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!gpu.ok()) return {};
  EXPECT_TRUE(gpu->fused);
  EXPECT_EQ(gpu->small_batch, expect_small_batch);
  const auto truth = exact_search_reference(base.data(), c.rows, c.dim, c.metric, queries.data(),
                                            c.queries, c.k, mask_pointer);
  expect_exact(*gpu, truth, base, queries, c.queries, c.dim, c.k, c.metric, mask_pointer);
  return std::move(*gpu);
}

class SmallBatch : public ::testing::TestWithParam<Metric> {};

TEST_P(SmallBatch, EveryBatchAndKEqualsFloat64) {
  GPUOPT_REQUIRE_GPU();
  // 20011 rows: not a multiple of the 16-row warp tile or the 128-row block step; dim 100 pads to
  // 128; duplicate rows give exact ties.
  for (std::size_t batch : {1, 2, 7, 16, 32}) {
    for (std::size_t k : {1, 10, 100}) {
      SCOPED_TRACE("batch " + std::to_string(batch) + " k " + std::to_string(k));
      run_case({20011, 100, batch, k, GetParam(), 1.0, 300, false}, 100 + batch * 7 + k,
               batch <= kGpuSmallBatchMaxQueries);
    }
  }
}

TEST_P(SmallBatch, DeletesAndFilterMasks) {
  GPUOPT_REQUIRE_GPU();
  for (std::size_t batch : {1, 7}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    run_case({30000, 64, batch, 10, GetParam(), 0.6}, 21 + batch);     // deletes
    run_case({30000, 64, batch, 10, GetParam(), 0.01}, 22 + batch);    // a selective filter
    run_case({30000, 64, batch, 10, GetParam(), 0.0002}, 23 + batch);  // fewer rows than k
  }
}

TEST_P(SmallBatch, FewRowsAndEveryDimension) {
  GPUOPT_REQUIRE_GPU();
  // Fewer rows than SMs, than a warp tile, than k; one row.
  for (std::size_t rows : {1, 5, 17, 100, 131}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    run_case({rows, 32, 3, 10, GetParam()}, 40 + rows);
  }
  for (std::size_t dim : {1, 7, 31, 32, 33, 64, 65, 96, 97, 128}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    run_case({5000, dim, 2, 10, GetParam()}, 60 + dim);
  }
}

TEST_P(SmallBatch, QueriesThatAreRows) {
  GPUOPT_REQUIRE_GPU();
  run_case({40000, 128, 5, 10, GetParam(), 1.0, 0, true}, 81);
}

TEST_P(SmallBatch, ManyTiesFallBackAndStayExact) {
  GPUOPT_REQUIRE_GPU();
  // 3000 copies of one vector and a query equal to it: far more near-ties than a block's list
  // holds, so the query is handed to the cuBLAS path and still answered exactly.
  const std::size_t rows = 20000, dim = 32, k = 10;
  auto base = normal_vectors(rows * dim, 91);
  for (std::size_t r = 0; r < 3000; ++r) std::copy_n(&base[0], dim, &base[(r * 6) * dim]);
  std::vector<float> queries(&base[0], &base[dim]);
  auto dataset = GpuDataset::create(dim, GetParam(), rows);
  ASSERT_TRUE(dataset.ok());
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows, nullptr).ok());
  GpuSearchOptions options;
  options.k = k;
  auto gpu = (*dataset)->search(queries.data(), 1, options, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_TRUE(gpu->small_batch);
  EXPECT_EQ(gpu->fallback_queries, 1u);
  for (std::size_t i = 0; i < k; ++i) {
    const std::uint64_t p = gpu->positions[i];
    ASSERT_LT(p, rows);
    EXPECT_NEAR(exact_distance_f64(GetParam(), queries.data(), &base[p * dim], dim),
                exact_distance_f64(GetParam(), queries.data(), base.data(), dim), 1e-4)
        << "rank " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Metrics, SmallBatch,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine));

TEST(SmallBatchOptions, ThresholdZeroTakesTheBatchedPath) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t rows = 4000, dim = 48;
  const auto base = normal_vectors(rows * dim, 5);
  const auto queries = normal_vectors(4 * dim, 6);
  auto dataset = GpuDataset::create(dim, Metric::kL2, rows);
  ASSERT_TRUE(dataset.ok());
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows, nullptr).ok());
  GpuSearchOptions options;
  options.small_batch_max_queries = 0;
  auto batched = (*dataset)->search(queries.data(), 4, options, nullptr);
  ASSERT_TRUE(batched.ok());
  EXPECT_FALSE(batched->small_batch);
  options.small_batch_max_queries = 4;
  auto small = (*dataset)->search(queries.data(), 4, options, nullptr);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->small_batch);
  EXPECT_EQ(small->positions, batched->positions);
  EXPECT_EQ(small->distances, batched->distances);
}

// Device memory for a test, freed at scope end.
template <typename T>
struct DeviceArray {
  T* data = nullptr;
  explicit DeviceArray(std::size_t n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data); }
  std::vector<T> download(std::size_t n) const {
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

TEST(GpuSearchDevice, DeviceQueriesAndResultsMatchTheHostSearch) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t rows = 25000, dim = 128, k = 10;
  const auto base = normal_vectors(rows * dim, 7);
  std::vector<std::uint64_t> ids(rows);
  for (std::size_t i = 0; i < rows; ++i) ids[i] = 9'000'000 + 3 * i;
  std::vector<std::uint64_t> mask((rows + 63) / 64, 0);
  for (std::size_t r = 0; r < rows; ++r) {
    if (r % 3 != 0) mask[r / 64] |= std::uint64_t{1} << (r % 64);
  }
  auto dataset = GpuDataset::create(dim, Metric::kL2, rows);
  ASSERT_TRUE(dataset.ok());
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows, nullptr, ids).ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<std::uint64_t> device_mask(mask.size());
  ASSERT_EQ(cudaMemcpy(device_mask.data, mask.data(), mask.size() * 8, cudaMemcpyHostToDevice),
            cudaSuccess);
  for (std::size_t batch : {1, 5, 40}) {  // 40 takes the batched fused path
    for (bool masked : {false, true}) {
      for (bool flags : {false, true}) {
        SCOPED_TRACE("batch " + std::to_string(batch) + (masked ? " masked" : "") +
                     (flags ? " with unresolved flags" : ""));
        const auto queries = normal_vectors(batch * dim, 8 + batch);
        GpuSearchOptions options;
        options.k = k;
        options.allow_mask = masked ? mask.data() : nullptr;
        auto host = (*dataset)->search(queries.data(), batch, options, stream);
        ASSERT_TRUE(host.ok()) << host.status().to_string();
        DeviceArray<float> device_queries(batch * dim);
        ASSERT_EQ(cudaMemcpy(device_queries.data, queries.data(), queries.size() * 4,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
        DeviceArray<float> distances(batch * k);
        DeviceArray<std::uint64_t> out_ids(batch * k), positions(batch * k);
        DeviceArray<std::int32_t> unresolved(batch);
        GpuDeviceResults results;
        results.distances = distances.data;
        results.ids = out_ids.data;
        results.positions = positions.data;
        results.unresolved = flags ? unresolved.data : nullptr;
        GpuSearchOptions device_options = options;
        device_options.allow_mask = nullptr;
        device_options.device_allow_mask = masked ? device_mask.data : nullptr;
        ASSERT_TRUE((*dataset)
                        ->search_device(device_queries.data, batch, device_options, results, stream)
                        .ok());
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(positions.download(batch * k), host->positions);
        EXPECT_EQ(distances.download(batch * k), host->distances);
        EXPECT_EQ(out_ids.download(batch * k), host->ids);
        if (flags) {
          for (auto flag : unresolved.download(batch)) EXPECT_EQ(flag, 0);
        }
        // The same through DLPack.
        std::int64_t shape[2] = {std::int64_t(batch), std::int64_t(dim)};
        DLTensor tensor{device_queries.data, {2, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
        ASSERT_EQ(cudaMemset(out_ids.data, 0, batch * k * 8), cudaSuccess);
        ASSERT_TRUE((*dataset)->search_dlpack(tensor, device_options, results, stream).ok());
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(out_ids.download(batch * k), host->ids);
      }
    }
  }
  // Host memory where device memory is expected, and a DLPack tensor on the CPU.
  const auto queries = normal_vectors(dim, 99);
  DeviceArray<float> distances(k);
  GpuDeviceResults results;
  results.distances = distances.data;
  GpuSearchOptions options;
  options.k = k;
  EXPECT_EQ((*dataset)->search_device(queries.data(), 1, options, results, stream).code(),
            StatusCode::kInvalidArgument);
  std::int64_t shape[2] = {1, std::int64_t(dim)};
  DLTensor cpu_tensor{const_cast<float*>(queries.data()), {1, 0}, 2, {2, 32, 1}, shape, nullptr, 0};
  EXPECT_EQ((*dataset)->search_dlpack(cpu_tensor, options, results, stream).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      (*dataset)->search_device(queries.data(), 1, options, GpuDeviceResults{}, stream).code(),
      StatusCode::kInvalidArgument);
  cudaStreamDestroy(stream);
}

TEST(GpuMemoryBudget, AppendPastTheBudgetSaysHowMuch) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t dim = 64, per_row = GpuDataset::device_bytes_per_row(dim);
  EXPECT_EQ(per_row, dim * 4 + 8 + 64 * 2 + 8);
  auto dataset = GpuDataset::create(dim, Metric::kL2, 100);
  ASSERT_TRUE(dataset.ok());
  (*dataset)->set_memory_budget(1000 * per_row);
  const auto base = normal_vectors(2000 * dim, 3);
  ASSERT_TRUE((*dataset)->append_host(base.data(), 900, nullptr).ok());
  EXPECT_LE((*dataset)->device_bytes(), 1000 * per_row);  // doubling stopped at the budget
  Status over = (*dataset)->append_host(base.data(), 200, nullptr);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find(std::to_string(1100 * per_row)), std::string::npos)
      << over.message();
  EXPECT_NE(over.message().find(std::to_string(1000 * per_row)), std::string::npos)
      << over.message();
  EXPECT_EQ((*dataset)->rows(), 900u);
}

TEST(GpuMemoryBudget, CollectionFallsBackToTheCpuUnderAuto) {
  GPUOPT_REQUIRE_GPU();
  gpuopt::testing::TempDir dir("gpuopt-small-batch-budget");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  const std::size_t dim = 16, rows = 500;
  auto created = (*store)->create_collection("c", {dim, Metric::kL2});
  ASSERT_TRUE(created.ok());
  const auto base = normal_vectors(rows * dim, 4);
  ASSERT_TRUE((*created)->add(gpuopt::testing::id_range(0, rows), base.data()).ok());
  QueryOptions options;
  options.k = 3;
  options.engine = QueryEngine::kGpu;
  options.gpu.memory_budget_bytes = 1000;
  QueryReport report;
  auto refused = (*created)->query(base.data(), 1, options, &report);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string needed = std::to_string(rows * GpuDataset::device_bytes_per_row(dim));
  EXPECT_NE(refused.status().message().find(needed), std::string::npos)
      << refused.status().message();
  options.engine = QueryEngine::kAuto;
  auto fallback = (*created)->query(base.data(), 1, options, &report);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(report.engine, QueryEngine::kCpu);
  EXPECT_NE(report.fallback_reason.find("budget"), std::string::npos) << report.fallback_reason;
  ASSERT_FALSE((*fallback)[0].empty());
  EXPECT_EQ((*fallback)[0][0].id, 0u);  // the query is row 0
  options.gpu.memory_budget_bytes = 0;
  auto gpu = (*created)->query(base.data(), 1, options, &report);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(report.engine, QueryEngine::kGpu);
  EXPECT_TRUE(report.gpu_small_batch);
  EXPECT_EQ((*gpu)[0][0].id, 0u);
}

// Wall time per call of GpuDataset::search at small batches (upload, search, download), p50/p99,
// on the files named by GPUOPT_VECTOR_TIMING_BASE / _QUERIES (scripts/gpu-check.d/vector.sh).
TEST(SmallBatchTiming, NpyFiles) {
  GPUOPT_REQUIRE_GPU();
  const char* base_path = std::getenv("GPUOPT_VECTOR_TIMING_BASE");
  const char* query_path = std::getenv("GPUOPT_VECTOR_TIMING_QUERIES");
  if (base_path == nullptr || query_path == nullptr) GTEST_SKIP() << "timing files not given";
  auto base = read_vector_file(base_path);
  auto queries = read_vector_file(query_path);
  ASSERT_TRUE(base.ok() && queries.ok());
  ASSERT_EQ(base->dim, queries->dim);
  auto dataset = GpuDataset::create(base->dim, Metric::kL2, base->rows);
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  ASSERT_TRUE((*dataset)->append_host(base->values.data(), base->rows, nullptr).ok());
  GpuSearchOptions options;
  options.k = 10;
  for (std::size_t batch : {1, 4, 16}) {
    std::vector<double> us;
    const std::size_t calls = std::min<std::size_t>(1000, queries->rows / batch);
    for (std::size_t c = 0; c <= calls; ++c) {
      const std::size_t first = (c % calls) * batch;
      const auto start = std::chrono::steady_clock::now();
      auto found = (*dataset)->search(&queries->values[first * base->dim], batch, options, nullptr);
      const double elapsed =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      ASSERT_TRUE(found.ok()) << found.status().to_string();
      ASSERT_TRUE(found->small_batch);
      if (c > 0) us.push_back(elapsed);  // the first call allocates the scratch
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "RESULT: gpuopt exact small-batch %zux%zu batch=%zu k=10: per call p50 %.1f us, p99 %.1f "
        "us, min %.1f us (%zu calls, upload + search + download)\n",
        base->rows, base->dim, batch, us[us.size() / 2], us[us.size() * 99 / 100], us.front(),
        us.size());
  }
}

// A profile window for `gpuopt trace` (scripts/gpu-check.d/vector_batch1_profile.sh): the same
// number of batch-1 calls through GpuDataset::search, then through Collection::query on a store
// holding the same rows, each bracketed by cudaProfilerStart/Stop so that the records of one
// window are those of exactly `calls` queries (nsys --capture-range=cudaProfilerApi takes the same
// windows). Prints the wall time per call of each window.
TEST(SmallBatchProfile, Batch1) {
  GPUOPT_REQUIRE_GPU();
  const char* base_path = std::getenv("GPUOPT_VECTOR_TIMING_BASE");
  const char* query_path = std::getenv("GPUOPT_VECTOR_TIMING_QUERIES");
  if (base_path == nullptr || query_path == nullptr) GTEST_SKIP() << "timing files not given";
  const char* calls_text = std::getenv("GPUOPT_VECTOR_PROFILE_CALLS");
  const std::size_t calls = calls_text != nullptr ? std::strtoul(calls_text, nullptr, 10) : 200;
  ASSERT_GT(calls, 0u);
  auto base = read_vector_file(base_path);
  auto queries = read_vector_file(query_path);
  ASSERT_TRUE(base.ok() && queries.ok());
  ASSERT_EQ(base->dim, queries->dim);
  const std::size_t dim = base->dim;
  auto median_us = [](std::vector<double> us) {
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  GpuSearchOptions options;
  options.k = 10;
  {
    auto dataset = GpuDataset::create(dim, Metric::kL2, base->rows);
    ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
    ASSERT_TRUE((*dataset)->append_host(base->values.data(), base->rows, nullptr).ok());
    for (int warm = 0; warm < 10; ++warm) {
      ASSERT_TRUE((*dataset)->search(queries->values.data(), 1, options, nullptr).ok());
    }
    std::vector<double> us;
    ASSERT_EQ(cudaProfilerStart(), cudaSuccess);
    for (std::size_t c = 0; c < calls; ++c) {
      const float* query = &queries->values[(c % queries->rows) * dim];
      const auto start = std::chrono::steady_clock::now();
      auto found = (*dataset)->search(query, 1, options, nullptr);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
      ASSERT_TRUE(found.ok() && found->small_batch) << found.status().to_string();
    }
    ASSERT_EQ(cudaProfilerStop(), cudaSuccess);
    std::printf(
        "PROFILE: window 1 GpuDataset::search %zux%zu batch=1 k=10: %zu calls, p50 %.1f us\n",
        base->rows, dim, calls, median_us(us));
  }
  gpuopt::testing::TempDir dir("gpuopt-small-batch-profile");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto collection = (*store)->create_collection("c", {dim, Metric::kL2});
  ASSERT_TRUE(collection.ok()) << collection.status().to_string();
  std::vector<std::uint64_t> ids(base->rows);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  ASSERT_TRUE((*collection)->add(ids, base->values.data()).ok());
  QueryOptions query_options;
  query_options.k = 10;
  query_options.engine = QueryEngine::kGpu;
  for (int warm = 0; warm < 10; ++warm) {
    ASSERT_TRUE((*collection)->query(queries->values.data(), 1, query_options).ok());
  }
  std::vector<double> us;
  ASSERT_EQ(cudaProfilerStart(), cudaSuccess);
  for (std::size_t c = 0; c < calls; ++c) {
    const float* query = &queries->values[(c % queries->rows) * dim];
    const auto start = std::chrono::steady_clock::now();
    QueryReport report;
    auto found = (*collection)->query(query, 1, query_options, &report);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count());
    ASSERT_TRUE(found.ok() && report.gpu_small_batch) << found.status().to_string();
  }
  ASSERT_EQ(cudaProfilerStop(), cudaSuccess);
  std::printf("PROFILE: window 2 Collection::query %zux%zu batch=1 k=10: %zu calls, p50 %.1f us\n",
              base->rows, dim, calls, median_us(us));
}

}  // namespace
}  // namespace gpuopt::vector
#else
TEST(SmallBatch, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif
