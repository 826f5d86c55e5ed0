// Collection::query on the GPU engine against the CPU engine's exact search on the same store
// (every metric, filters, upserts, deletes, rows written after the first GPU query), and the ids
// a GpuDataset reports for its rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/test_support.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"

#if GPUOPT_CUDA
namespace gpuopt::vector {
namespace {

using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 40;

// Rank by rank, the GPU's hit has the CPU's distance (recomputed in float64 for each returned id),
// so rows at equal distance may swap and nothing else; no id is deleted, filtered out or repeated.
void expect_same_up_to_ties(const SearchResults& gpu, const SearchResults& cpu,
                            const std::map<std::uint64_t, std::vector<float>>& allowed,
                            const float* queries, Metric metric) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t q = 0; q < gpu.size(); ++q) {
    ASSERT_EQ(gpu[q].size(), cpu[q].size()) << "query " << q;
    std::set<std::uint64_t> seen;
    for (std::size_t i = 0; i < gpu[q].size(); ++i) {
      const auto id = gpu[q][i].id;
      ASSERT_TRUE(allowed.count(id)) << "query " << q << " rank " << i << ": id " << id
                                     << " is deleted, filtered out or unknown";
      EXPECT_TRUE(seen.insert(id).second) << "id " << id << " twice";
      const float* query = queries + q * kDim;
      const double actual = exact_distance_f64(metric, query, allowed.at(id).data(), kDim);
      const double expected =
          exact_distance_f64(metric, query, allowed.at(cpu[q][i].id).data(), kDim);
      EXPECT_NEAR(actual, expected, 1e-4 * std::max(1.0, std::fabs(expected)))
          << "query " << q << " rank " << i;
      EXPECT_NEAR(gpu[q][i].distance, actual, 1e-3 * std::max(1.0, std::fabs(actual)));
    }
  }
}

class CollectionGpuQuery : public ::testing::TestWithParam<Metric> {};

TEST_P(CollectionGpuQuery, EqualsCpuExactSearchIds) {
  GPUOPT_REQUIRE_GPU();
  const Metric metric = GetParam();
  TempDir dir("gpuopt-collection-gpu");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto created = (*store)->create_collection("c", {kDim, metric});
  ASSERT_TRUE(created.ok());
  Collection& c = **created;
  // Ids far from positions, three segments.
  const std::size_t rows = 6000;
  const auto base = random_vectors(rows, kDim, 31);
  std::vector<std::uint64_t> ids(rows);
  std::vector<Metadata> metadata(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    ids[i] = 1'000'000 + 13 * i;
    metadata[i]["bucket"] = double(i % 4);
  }
  std::map<std::uint64_t, std::vector<float>> live;
  std::map<std::uint64_t, double> bucket;
  for (std::size_t first = 0; first < rows; first += 2000) {
    ASSERT_TRUE(c.add(std::span(ids).subspan(first, 2000), &base[first * kDim],
                      std::span(metadata).subspan(first, 2000))
                    .ok());
  }
  for (std::size_t i = 0; i < rows; ++i) {
    live[ids[i]].assign(&base[i * kDim], &base[(i + 1) * kDim]);
    bucket[ids[i]] = double(i % 4);
  }
  const std::size_t query_count = 200;
  const auto queries = random_vectors(query_count, kDim, 32);
  auto compare = [&](const std::string& where, std::size_t k, bool expect_upload) {
    SCOPED_TRACE("where=" + where + " k=" + std::to_string(k));
    QueryOptions options;
    options.k = k;
    options.where_json = where;
    auto cpu = c.query(queries.data(), query_count, options);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    options.engine = QueryEngine::kGpu;
    QueryReport report;
    auto gpu = c.query(queries.data(), query_count, options, &report);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    EXPECT_EQ(report.engine, QueryEngine::kGpu);
    EXPECT_EQ(report.gpu_rows_uploaded > 0, expect_upload);
    std::map<std::uint64_t, std::vector<float>> allowed;
    for (const auto& [id, v] : live) {
      if (where.empty() || bucket.at(id) == 1) allowed[id] = v;
    }
    expect_same_up_to_ties(*gpu, *cpu, allowed, queries.data(), metric);
    // auto picks the GPU here and answers the same.
    options.engine = QueryEngine::kAuto;
    auto automatic = c.query(queries.data(), query_count, options, &report);
    ASSERT_TRUE(automatic.ok());
    EXPECT_EQ(report.engine, QueryEngine::kGpu) << report.fallback_reason;
    expect_same_up_to_ties(*automatic, *cpu, allowed, queries.data(), metric);
  };
  compare("", 10, /*expect_upload=*/true);
  compare("", 100, false);
  compare(R"({"bucket": 1})", 16, false);
  // Upserts, deletes and a new segment after the device copy exists: only the new rows travel,
  // and the superseded and deleted rows never come back.
  const auto replacement = random_vectors(300, kDim, 33);
  std::vector<std::uint64_t> replaced(ids.begin() + 100, ids.begin() + 400);
  std::vector<Metadata> replaced_meta(300);
  for (std::size_t i = 0; i < 300; ++i) replaced_meta[i]["bucket"] = 1.0;
  ASSERT_TRUE(c.upsert(replaced, replacement.data(), replaced_meta).ok());
  for (std::size_t i = 0; i < 300; ++i) {
    live[replaced[i]].assign(&replacement[i * kDim], &replacement[(i + 1) * kDim]);
    bucket[replaced[i]] = 1;
  }
  std::vector<std::uint64_t> removed(ids.begin() + 1000, ids.begin() + 2500);
  ASSERT_TRUE(c.remove(removed).ok());
  for (auto id : removed) live.erase(id);
  // Queries equal to rows that were deleted must not find them.
  std::vector<float> deleted_queries(&base[1000 * kDim], &base[1000 * kDim] + 50 * kDim);
  compare("", 10, /*expect_upload=*/true);
  compare(R"({"bucket": 1})", 10, false);
  QueryOptions options;
  options.k = 5;
  options.engine = QueryEngine::kGpu;
  auto found = c.query(deleted_queries.data(), 50, options);
  ASSERT_TRUE(found.ok());
  for (const auto& hits : *found) {
    for (const auto& hit : hits) ASSERT_TRUE(live.count(hit.id)) << "deleted id " << hit.id;
  }
}

INSTANTIATE_TEST_SUITE_P(Metrics, CollectionGpuQuery,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine));

TEST(CollectionGpuQuery, FewerAllowedRowsThanK) {
  GPUOPT_REQUIRE_GPU();
  TempDir dir("gpuopt-collection-gpu");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  auto created = (*store)->create_collection("c", {kDim, Metric::kL2});
  ASSERT_TRUE(created.ok());
  const auto base = random_vectors(30, kDim, 34);
  const auto ids = id_range(77, 30);
  ASSERT_TRUE((*created)->add(ids, base.data()).ok());
  ASSERT_TRUE((*created)->remove(id_range(80, 20)).ok());
  QueryOptions options;
  options.k = 50;
  options.engine = QueryEngine::kGpu;
  auto found = (*created)->query(base.data(), 2, options);
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  for (const auto& hits : *found) {
    ASSERT_EQ(hits.size(), 10u);
    for (const auto& hit : hits) EXPECT_TRUE(hit.id < 80 || hit.id >= 100) << hit.id;
  }
}

TEST(GpuDatasetIds, SearchReportsTheAppendedIds) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t rows = 3000, query_count = 20, k = 8;
  const auto base = random_vectors(rows, kDim, 35);
  const auto queries = random_vectors(query_count, kDim, 36);
  auto dataset = GpuDataset::create(kDim, Metric::kL2, rows);
  ASSERT_TRUE(dataset.ok());
  std::vector<std::uint64_t> ids(rows / 2);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = 5'000'000 - i;
  EXPECT_EQ(
      (*dataset)->append_host(base.data(), rows / 2, nullptr, std::span(ids).subspan(1)).code(),
      StatusCode::kInvalidArgument);
  ASSERT_TRUE((*dataset)->append_host(base.data(), rows / 2, nullptr, ids).ok());
  // No ids: a row's id is its position.
  ASSERT_TRUE((*dataset)->append_host(&base[rows / 2 * kDim], rows - rows / 2, nullptr).ok());
  GpuSearchOptions options;
  options.k = k;
  auto found = (*dataset)->search(queries.data(), query_count, options, nullptr);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->ids.size(), query_count * k);
  for (std::size_t i = 0; i < query_count * k; ++i) {
    const std::uint64_t p = found->positions[i];
    ASSERT_LT(p, rows);
    EXPECT_EQ(found->ids[i], p < rows / 2 ? ids[p] : p);
  }
}

}  // namespace
}  // namespace gpuopt::vector
#else
TEST(CollectionGpuQuery, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif
