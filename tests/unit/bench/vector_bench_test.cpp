// `gpuopt bench vector`: recall (id overlap and ann-benchmarks' distance rule) on hand-computed
// fixtures with ties, float64 ground truth, data loading, and the suite on a tiny synthetic set.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "common/vector_fixtures.hpp"
#include "gpuopt/bench/vector.hpp"
#include "gpuopt/vector/vector_file.hpp"

namespace gpuopt::bench::vector_bench {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

// 1-D base: rows 1 and 2 tie at distance 1 from the query 0; row 3 is at 1.0005 (inside the
// 1e-3 slack), row 4 at 1.002 (outside), row 5 far.
const std::vector<float> kBase = {0.0f, 1.0f, -1.0f, 1.0005f, -1.002f, 5.0f};
const std::vector<float> kQuery = {0.0f};

GroundTruth truth_k2() {
  return brute_force_truth(kBase.data(), kBase.size(), 1, kQuery.data(), 1, 2, 1);
}

TEST(VectorBenchTruth, TiesGoToTheLowerRowAndDistancesAreEuclidean) {
  GroundTruth truth = truth_k2();
  ASSERT_EQ(truth.ids.size(), 2u);
  EXPECT_EQ(truth.ids[0], 0u);
  EXPECT_EQ(truth.ids[1], 1u);  // row 2 ties at distance 1; the lower row wins
  EXPECT_DOUBLE_EQ(truth.distances[0], 0.0);
  EXPECT_DOUBLE_EQ(truth.distances[1], 1.0);
}

TEST(VectorBenchTruth, MatchesAHandComputedTwoDimensionalFixture) {
  // Query (1, 1); squared distances: row0 (0,0) 2, row1 (3,1) 4, row2 (1,2) 1, row3 (1,1) 0.
  std::vector<float> base = {0, 0, 3, 1, 1, 2, 1, 1};
  std::vector<float> query = {1, 1};
  GroundTruth truth = brute_force_truth(base.data(), 4, 2, query.data(), 1, 3, 2);
  EXPECT_EQ(truth.ids, (std::vector<std::uint64_t>{3, 2, 0}));
  EXPECT_DOUBLE_EQ(truth.distances[2], std::sqrt(2.0));
}

TEST(VectorBenchTruth, FewerRowsThanKLeavesTheRestEmpty) {
  std::vector<float> base = {0, 1};
  std::vector<float> query = {0};
  GroundTruth truth = brute_force_truth(base.data(), 2, 1, query.data(), 1, 3, 1);
  EXPECT_EQ(truth.ids[0], 0u);
  EXPECT_EQ(truth.ids[1], 1u);
  EXPECT_EQ(truth.ids[2], ~std::uint64_t{0});
}

TEST(VectorBenchRecall, IdOverlapCountsCommonIds) {
  GroundTruth truth = truth_k2();
  EXPECT_DOUBLE_EQ(recall_id_overlap({{0, 1}}, truth), 1.0);
  EXPECT_DOUBLE_EQ(recall_id_overlap({{1, 0}}, truth), 1.0);  // order does not matter
  EXPECT_DOUBLE_EQ(recall_id_overlap({{0, 2}}, truth), 0.5);  // the tied row is another id
  EXPECT_DOUBLE_EQ(recall_id_overlap({{5}}, truth), 0.0);
  EXPECT_DOUBLE_EQ(recall_id_overlap({{0, 0}}, truth), 0.5);  // a duplicate counts once
  EXPECT_DOUBLE_EQ(recall_id_overlap({{}}, truth), 0.0);
}

TEST(VectorBenchRecall, DistanceRuleAcceptsTiesAndTheEpsilonSlack) {
  GroundTruth truth = truth_k2();
  auto rule = [&](FoundIds found) {
    return recall_distance_rule(found, truth, kBase.data(), kBase.size(), 1, kQuery.data());
  };
  EXPECT_DOUBLE_EQ(rule({{0, 1}}), 1.0);
  EXPECT_DOUBLE_EQ(rule({{0, 2}}), 1.0);  // the tie counts here, unlike id overlap
  EXPECT_DOUBLE_EQ(rule({{0, 3}}), 1.0);  // 1.0005 <= 1 + 1e-3
  EXPECT_DOUBLE_EQ(rule({{0, 4}}), 0.5);  // 1.002 > 1 + 1e-3
  EXPECT_DOUBLE_EQ(rule({{5, 4}}), 0.0);
  EXPECT_DOUBLE_EQ(rule({{0, 99}}), 0.5);  // an id that is no row never counts
  // Only the first k answers are scored.
  EXPECT_DOUBLE_EQ(rule({{5, 0, 1}}), 0.5);
}

TEST(VectorBenchRecall, AveragesOverQueries) {
  // Two queries: 0 and 5 over the same 1-D base, k = 1.
  std::vector<float> queries = {0.0f, 5.0f};
  GroundTruth truth = brute_force_truth(kBase.data(), kBase.size(), 1, queries.data(), 2, 1, 1);
  EXPECT_EQ(truth.ids, (std::vector<std::uint64_t>{0, 5}));
  FoundIds found = {{0}, {3}};
  EXPECT_DOUBLE_EQ(recall_id_overlap(found, truth), 0.5);
  EXPECT_DOUBLE_EQ(
      recall_distance_rule(found, truth, kBase.data(), kBase.size(), 1, queries.data()), 0.5);
}

TEST(VectorBenchRecall, IdsOfSearchResultsKeepsOrder) {
  vector::SearchResults results = {{{7, 0.5f}, {3, 1.0f}}, {}};
  FoundIds found = ids_of(results);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0], (std::vector<std::uint64_t>{7, 3}));
  EXPECT_TRUE(found[1].empty());
}

TEST(VectorBenchData, SyntheticIsSeededAndSized) {
  Dataset a = synthetic_dataset(100, 7, 5, 42), b = synthetic_dataset(100, 7, 5, 42);
  Dataset c = synthetic_dataset(100, 7, 5, 43);
  EXPECT_EQ(a.base.size(), 500u);
  EXPECT_EQ(a.queries.size(), 35u);
  EXPECT_EQ(a.base, b.base);
  EXPECT_NE(a.base, c.base);
}

TEST(VectorBenchData, DataFileIsSplitIntoBaseAndQueries) {
  TempDir dir("gpuopt-bench-vector-test");
  Dataset source = synthetic_dataset(50, 0, 4, 7);
  ASSERT_TRUE(vector::write_npy(dir.path() / "d.npy", source.base.data(), 50, 4).ok());
  VectorBenchOptions options;
  options.data_path = (dir.path() / "d.npy").string();
  options.queries = 10;
  auto data = load_dataset(options, false);
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->base_rows, 40u);
  EXPECT_EQ(data->query_rows, 10u);
  EXPECT_EQ(data->dim, 4u);
  EXPECT_TRUE(std::equal(data->queries.begin(), data->queries.end(), source.base.begin() + 160));
  options.queries = 50;  // nothing left for the base
  auto too_few = load_dataset(options, false);
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.status().message().find("d.npy"), std::string::npos);
  options.data_path = (dir.path() / "missing.npy").string();
  EXPECT_FALSE(load_dataset(options, false).ok());
}

const TestcaseResult* find(const std::vector<TestcaseResult>& results, const std::string& key) {
  for (const auto& result : results) {
    if (result.key == key) return &result;
  }
  return nullptr;
}

TEST(VectorBenchSuite, ExactSearchOnATinySetHasRecallOne) {
  TempDir dir("gpuopt-bench-vector-test");
  BenchOptions bench;
  VectorBenchOptions options;
  options.synthetic = true;
  options.base_rows = 600;
  options.queries = 25;
  options.synthetic_dim = 12;
  options.nlist = 8;
  options.nprobes = {2, 8, 32};  // 32 > nlist: dropped, it would repeat nprobe 8
  options.single_queries = 5;
  options.threads = 2;
  options.work_dir = dir.path().string();
  options.export_dir = (dir.path() / "export").string();
  Suite suite = make_suite(bench, options);
  BenchContext context(bench);
  auto results = suite.run(context);
  ASSERT_EQ(results.size(), testcase_keys().size());
  for (const auto& result : results) {
    EXPECT_NE(result.outcome, Outcome::kFailed) << result.key << ": " << result.reason;
  }
  const TestcaseResult* exact = find(results, "exact-cpu");
  ASSERT_NE(exact, nullptr);
  EXPECT_DOUBLE_EQ(exact->data["distance_recall"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(exact->data["id_recall"].get<double>(), 1.0);  // random floats: no ties
  EXPECT_TRUE(exact->data["criteria_met"].get<bool>());
  const TestcaseResult* ivf = find(results, "ivf-cpu");
  ASSERT_NE(ivf, nullptr);
  const auto& sweep = ivf->data["sweep"];
  ASSERT_EQ(sweep.size(), 2u);
  EXPECT_EQ(sweep[1]["nprobe"].get<std::size_t>(), 8u);
  // Probing every list is an exact scan.
  EXPECT_DOUBLE_EQ(sweep[1]["distance_recall"].get<double>(), 1.0);
  EXPECT_LE(sweep[0]["distance_recall"].get<double>(), 1.0);
  const TestcaseResult* ingest = find(results, "ingest");
  ASSERT_NE(ingest, nullptr);
  EXPECT_EQ(ingest->data["rows"].get<std::size_t>(), 600u);
  EXPECT_EQ(exit_code_for(results), 0);
  // The exported files are what bench/vector/engines.py reads.
  for (const char* name : {"base.npy", "queries.npy", "truth_ids.npy", "truth_distances.npy"}) {
    EXPECT_TRUE(fs::exists(fs::path(options.export_dir) / name)) << name;
  }
  auto base = vector::read_vector_file(fs::path(options.export_dir) / "base.npy");
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_EQ(base->rows, 600u);
  EXPECT_EQ(base->dim, 12u);
  // The store directory made under work_dir is removed with the suite.
  results.clear();
}

TEST(VectorBenchSuite, FailedAndMissedCriteriaSetTheExitCode) {
  std::vector<TestcaseResult> results(2);
  results[0].data = {{"criteria_met", true}};
  EXPECT_EQ(exit_code_for(results), 0);
  results[1].data = {{"criteria_met", false}};
  EXPECT_EQ(exit_code_for(results), 1);
  results[0].outcome = Outcome::kFailed;
  EXPECT_EQ(exit_code_for(results), 2);
}

}  // namespace
}  // namespace gpuopt::bench::vector_bench
