// Vector store: persistence, ids and metadata, tombstones, corruption detection, exact and IVF
// search against brute force.
#include "gpuopt/vector/store.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/filter.hpp"
#include "vector/search_kernels.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

// Brute force in double precision over (id, vector, metadata) rows that pass `keep`.
struct Row {
  std::uint64_t id;
  const float* vector;
  Metadata metadata;
};
std::vector<float> brute_force_distances(const std::vector<Row>& rows, const float* query,
                                         std::size_t dim, Metric metric, std::size_t k,
                                         const Filter& filter) {
  std::vector<float> d;
  for (const auto& row : rows) {
    if (!filter.matches(row.metadata)) continue;
    d.push_back(detail::direct_distance(metric, query, row.vector, dim));
  }
  std::sort(d.begin(), d.end());
  if (d.size() > k) d.resize(k);
  return d;
}

// Exact results equal brute force up to ties: the i-th returned distance (recomputed directly for
// the returned id) matches the i-th brute-force distance within a relative tolerance.
void expect_exact(const std::vector<SearchHit>& hits, const std::vector<float>& truth,
                  const std::map<std::uint64_t, const float*>& by_id, const float* query,
                  std::size_t dim, Metric metric) {
  ASSERT_EQ(hits.size(), truth.size());
  std::set<std::uint64_t> seen;
  for (std::size_t i = 0; i < hits.size(); ++i) {
    ASSERT_TRUE(by_id.count(hits[i].id)) << "returned unknown or deleted id " << hits[i].id;
    EXPECT_TRUE(seen.insert(hits[i].id).second) << "id returned twice";
    float actual = detail::direct_distance(metric, query, by_id.at(hits[i].id), dim);
    float tolerance = 1e-4f * std::max(1.0f, std::fabs(truth[i]));
    EXPECT_NEAR(actual, truth[i], tolerance) << "rank " << i;
    EXPECT_NEAR(hits[i].distance, actual, 1e-3f * std::max(1.0f, std::fabs(actual)));
  }
}

TEST(VectorStore, AddGetPersistsAcrossReopen) {
  TempDir dir("gpuopt-vector-test");
  const std::size_t dim = 12;
  auto vectors = random_vectors(5, dim, 1);
  std::vector<std::uint64_t> ids = {10, 20, 30, 40, std::uint64_t{1} << 63};
  std::vector<Metadata> metadata(5);
  metadata[1]["genre"] = std::string("jazz");
  metadata[1]["year"] = 1990.0;
  {
    auto store = Store::open(dir.path(), {.create = true});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    auto collection = (*store)->create_collection("c", {dim, Metric::kL2});
    ASSERT_TRUE(collection.ok()) << collection.status().to_string();
    ASSERT_TRUE((*collection)->add(ids, vectors.data(), metadata).ok());
    EXPECT_EQ((*collection)->size(), 5u);
    auto again = (*collection)->add(std::span(ids).subspan(0, 1), vectors.data());
    EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  }
  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto collection = (*store)->collection("c");
  ASSERT_TRUE(collection.ok());
  EXPECT_EQ((*collection)->size(), 5u);
  auto record = (*collection)->get(20);
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  EXPECT_EQ(record->vector, std::vector<float>(vectors.begin() + dim, vectors.begin() + 2 * dim));
  EXPECT_EQ(std::get<std::string>(record->metadata.at("genre")), "jazz");
  EXPECT_EQ(std::get<double>(record->metadata.at("year")), 1990.0);
  auto big = (*collection)->get(std::uint64_t{1} << 63);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->vector[0], vectors[4 * dim]);
  EXPECT_EQ((*collection)->get(99).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE((*collection)->verify().ok());
}

TEST(VectorStore, OpenMissingStoreIsNotFound) {
  TempDir dir("gpuopt-vector-test");
  auto store = Store::open(dir.path() / "nothing");
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound);
  EXPECT_NE(store.status().message().find("nothing"), std::string::npos);
}

TEST(VectorStore, RejectsBadInput) {
  TempDir dir("gpuopt-vector-test");
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE((*store)->create_collection("bad/name", {4, Metric::kL2}).ok());
  EXPECT_FALSE((*store)->create_collection("zero", {0, Metric::kL2}).ok());
  auto c = (*store)->create_collection("c", {2, Metric::kL2});
  ASSERT_TRUE(c.ok());
  std::vector<float> nan = {1.0f, std::nanf("")};
  std::vector<std::uint64_t> one = {1};
  EXPECT_EQ((*c)->add(one, nan.data()).code(), StatusCode::kInvalidArgument);
  std::vector<float> two(4, 1.0f);
  std::vector<std::uint64_t> dup = {7, 7};
  EXPECT_EQ((*c)->add(dup, two.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->size(), 0u);
}

TEST(VectorStore, UpsertAndDeleteAreHonouredBySearchAndSurviveReopen) {
  TempDir dir("gpuopt-vector-test");
  const std::size_t dim = 8;
  auto base = random_vectors(300, dim, 2);
  std::vector<std::uint64_t> ids(300);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + i;
  auto replacement = random_vectors(50, dim, 3);
  std::vector<std::uint64_t> replaced_ids(ids.begin(), ids.begin() + 50);
  std::vector<std::uint64_t> deleted_ids(ids.begin() + 50, ids.begin() + 120);
  {
    auto store = Store::open(dir.path(), {.create = true});
    ASSERT_TRUE(store.ok());
    auto c = (*store)->create_collection("c", {dim, Metric::kL2});
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->add(std::span(ids).subspan(0, 150), base.data()).ok());
    ASSERT_TRUE((*c)->add(std::span(ids).subspan(150), base.data() + 150 * dim).ok());
    ASSERT_TRUE((*c)->upsert(replaced_ids, replacement.data()).ok());
    auto removed = (*c)->remove(deleted_ids);
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 70u);
    EXPECT_EQ((*c)->size(), 230u);
  }
  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->size(), 230u);
  EXPECT_EQ((*c)->stats().deleted, 120u);
  std::map<std::uint64_t, const float*> live;
  std::vector<Row> rows;
  for (std::size_t i = 0; i < 300; ++i) {
    if (i >= 50 && i < 120) continue;
    const float* v = i < 50 ? &replacement[i * dim] : &base[i * dim];
    live[ids[i]] = v;
    rows.push_back({ids[i], v, {}});
  }
  auto queries = random_vectors(20, dim, 4);
  for (auto index : {IndexKind::kExact, IndexKind::kIvf}) {
    QueryOptions options;
    options.k = 10;
    options.index = index;
    options.nprobe = 1000;  // every list: IVF must then be exact too
    options.ivf.nlist = 8;
    auto results = (*c)->query(queries.data(), 20, options);
    ASSERT_TRUE(results.ok()) << results.status().to_string();
    for (std::size_t q = 0; q < 20; ++q) {
      auto truth = brute_force_distances(rows, &queries[q * dim], dim, Metric::kL2, 10, Filter());
      expect_exact((*results)[q], truth, live, &queries[q * dim], dim, Metric::kL2);
    }
  }
}

class ExactSearchTest : public ::testing::TestWithParam<std::tuple<Metric, std::size_t>> {};

TEST_P(ExactSearchTest, MatchesBruteForceWithFilters) {
  auto [metric, dim] = GetParam();
  TempDir dir("gpuopt-vector-test");
  const std::size_t rows_count = 2500;
  auto vectors = random_vectors(rows_count, dim, 10 + dim);
  std::vector<std::uint64_t> ids(rows_count);
  std::vector<Metadata> metadata(rows_count);
  const char* colours[] = {"red", "green", "blue"};
  for (std::size_t i = 0; i < rows_count; ++i) {
    ids[i] = i * 7 + 3;
    metadata[i]["n"] = double(i % 100);
    if (i % 5 != 0) metadata[i]["colour"] = std::string(colours[i % 3]);
  }
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  auto c = (*store)->create_collection("c", {dim, metric});
  ASSERT_TRUE(c.ok());
  for (std::size_t start = 0; start < rows_count; start += 1000) {
    std::size_t n = std::min<std::size_t>(1000, rows_count - start);
    ASSERT_TRUE((*c)->add(std::span(ids).subspan(start, n), &vectors[start * dim],
                          std::span(metadata).subspan(start, n))
                    .ok());
  }
  std::map<std::uint64_t, const float*> by_id;
  std::vector<Row> rows;
  for (std::size_t i = 0; i < rows_count; ++i) {
    by_id[ids[i]] = &vectors[i * dim];
    rows.push_back({ids[i], &vectors[i * dim], metadata[i]});
  }
  const std::size_t query_count = 37;
  auto queries = random_vectors(query_count, dim, 99);
  const char* filters[] = {
      "",
      R"({"colour": "red"})",
      R"({"n": {"$gte": 10}, "colour": {"$ne": "blue"}})",
      R"({"$or": [{"n": {"$lt": 3}}, {"colour": {"$in": ["green", "purple"]}}]})",
      R"({"$and": [{"n": {"$nin": [1, 2, 3]}}, {"n": {"$lte": 50}}, {"n": {"$gt": 0}}]})",
      R"({"colour": {"$eq": "none"}})"};
  for (const char* where : filters) {
    auto filter = Filter::parse(where);
    ASSERT_TRUE(filter.ok()) << where;
    for (std::size_t k : {1u, 10u, 64u}) {
      QueryOptions options;
      options.k = k;
      options.where_json = where;
      auto results = (*c)->query(queries.data(), query_count, options);
      ASSERT_TRUE(results.ok()) << results.status().to_string();
      std::map<std::uint64_t, const float*> allowed;
      for (const auto& row : rows) {
        if (filter->matches(row.metadata)) allowed[row.id] = row.vector;
      }
      for (std::size_t q = 0; q < query_count; ++q) {
        auto truth = brute_force_distances(rows, &queries[q * dim], dim, metric, k, *filter);
        SCOPED_TRACE(::testing::Message() << "where=" << where << " k=" << k << " q=" << q);
        expect_exact((*results)[q], truth, allowed, &queries[q * dim], dim, metric);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Metrics, ExactSearchTest,
    ::testing::Combine(::testing::Values(Metric::kL2, Metric::kInnerProduct, Metric::kCosine),
                       ::testing::Values(std::size_t{1}, std::size_t{13}, std::size_t{64})));

TEST(VectorStore, IvfRecallIsHighOnClusteredData) {
  TempDir dir("gpuopt-vector-test");
  const std::size_t dim = 32, rows_count = 8000, clusters = 40;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto centres = random_vectors(clusters, dim, 6);
  std::vector<float> vectors(rows_count * dim);
  for (std::size_t i = 0; i < rows_count; ++i) {
    for (std::size_t t = 0; t < dim; ++t) {
      vectors[i * dim + t] = 4.0f * centres[(i % clusters) * dim + t] + normal(rng);
    }
  }
  std::vector<std::uint64_t> ids(rows_count);
  std::iota(ids.begin(), ids.end(), 0);
  auto store = Store::open(dir.path(), {.create = true});
  ASSERT_TRUE(store.ok());
  auto c = (*store)->create_collection("c", {dim, Metric::kL2});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->add(ids, vectors.data()).ok());
  const std::size_t query_count = 100;
  std::vector<float> queries(vectors.begin(), vectors.begin() + query_count * dim);
  for (auto& x : queries) x += 0.1f * normal(rng);
  QueryOptions exact;
  exact.k = 10;
  auto truth = (*c)->query(queries.data(), query_count, exact);
  ASSERT_TRUE(truth.ok());
  QueryOptions ivf = exact;
  ivf.index = IndexKind::kIvf;
  ivf.ivf.nlist = 64;
  ivf.nprobe = 8;
  auto approx = (*c)->query(queries.data(), query_count, ivf);
  ASSERT_TRUE(approx.ok()) << approx.status().to_string();
  std::size_t overlap = 0;
  for (std::size_t q = 0; q < query_count; ++q) {
    std::set<std::uint64_t> expected;
    for (auto& hit : (*truth)[q]) expected.insert(hit.id);
    for (auto& hit : (*approx)[q]) overlap += expected.count(hit.id);
  }
  EXPECT_GE(double(overlap) / double(query_count * 10), 0.9);
}

// Flips one byte of a segment's vectors: open still works (it reads no vectors), the first
// query reports DATA_LOSS naming the file, and verify() does too.
TEST(VectorStore, CorruptSegmentIsReportedNotRead) {
  TempDir dir("gpuopt-vector-test");
  auto vectors = random_vectors(100, 4, 7);
  std::vector<std::uint64_t> ids(100);
  std::iota(ids.begin(), ids.end(), 0);
  {
    auto store = Store::open(dir.path(), {.create = true});
    auto c = (*store)->create_collection("c", {4, Metric::kL2});
    ASSERT_TRUE((*c)->add(ids, vectors.data()).ok());
  }
  fs::path segment;
  for (const auto& entry : fs::directory_iterator(dir.path() / "segments")) segment = entry.path();
  ASSERT_FALSE(segment.empty());
  {
    std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4096 + 17);
    char byte = 0x5a;
    file.write(&byte, 1);
  }
  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  QueryOptions options;
  auto results = (*c)->query(vectors.data(), 1, options);
  EXPECT_EQ(results.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(results.status().message().find(segment.filename().string()), std::string::npos);
  EXPECT_EQ((*c)->verify().code(), StatusCode::kDataLoss);
}

TEST(VectorStore, TruncatedSegmentFailsOpen) {
  TempDir dir("gpuopt-vector-test");
  auto vectors = random_vectors(100, 4, 7);
  std::vector<std::uint64_t> ids(100);
  std::iota(ids.begin(), ids.end(), 0);
  {
    auto store = Store::open(dir.path(), {.create = true});
    auto c = (*store)->create_collection("c", {4, Metric::kL2});
    ASSERT_TRUE((*c)->add(ids, vectors.data()).ok());
  }
  fs::path segment;
  for (const auto& entry : fs::directory_iterator(dir.path() / "segments")) segment = entry.path();
  fs::resize_file(segment, fs::file_size(segment) - 4096);
  auto store = Store::open(dir.path());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find("truncated"), std::string::npos);
}

TEST(VectorStore, CorruptHeaderFailsOpen) {
  TempDir dir("gpuopt-vector-test");
  auto vectors = random_vectors(10, 4, 7);
  std::vector<std::uint64_t> ids(10);
  std::iota(ids.begin(), ids.end(), 0);
  {
    auto store = Store::open(dir.path(), {.create = true});
    auto c = (*store)->create_collection("c", {4, Metric::kL2});
    ASSERT_TRUE((*c)->add(ids, vectors.data()).ok());
  }
  fs::path segment;
  for (const auto& entry : fs::directory_iterator(dir.path() / "segments")) segment = entry.path();
  {
    std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(20);
    char byte = 0x7f;
    file.write(&byte, 1);
  }
  auto store = Store::open(dir.path());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace gpuopt::vector
