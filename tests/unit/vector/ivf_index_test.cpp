// The saved IVF index: file round trip and validation, reuse across opens without retraining,
// rows added after training assigned to their nearest centroid, deletes, reindex and drift.
#include "vector/ivf_index.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::TempDir;

// Four tight 2-D clusters at the corners of a 10 x 10 square, `per` rows each, ids 0.. in order.
constexpr float kCorners[4][2] = {{0, 0}, {10, 0}, {0, 10}, {10, 10}};
std::vector<float> corner_rows(std::size_t per, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> jitter(-0.5f, 0.5f);
  std::vector<float> rows;
  for (std::size_t c = 0; c < 4; ++c) {
    for (std::size_t i = 0; i < per; ++i) {
      rows.push_back(kCorners[c][0] + jitter(rng));
      rows.push_back(kCorners[c][1] + jitter(rng));
    }
  }
  return rows;
}

IvfParams cpu_params(std::size_t nlist) {
  IvfParams params;
  params.nlist = nlist;
  params.engine = QueryEngine::kCpu;
  return params;
}

QueryOptions ivf_query(std::size_t k, std::size_t nprobe) {
  QueryOptions options;
  options.k = k;
  options.index = IndexKind::kIvf;
  options.nprobe = nprobe;
  options.ivf = cpu_params(4);
  return options;
}

std::vector<fs::path> index_files(const fs::path& store) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(store / "segments")) {
    if (entry.path().extension() == ".ivf") files.push_back(entry.path());
  }
  return files;
}

std::set<std::uint64_t> ids_of(const std::vector<SearchHit>& hits) {
  std::set<std::uint64_t> ids;
  for (const auto& hit : hits) ids.insert(hit.id);
  return ids;
}

struct CornerStore {
  TempDir dir{"gpuopt-ivf-test"};
  std::unique_ptr<Store> store;
  Collection* collection = nullptr;
  std::vector<float> rows = corner_rows(50, 7);
  void open(bool create) {
    collection = nullptr;
    store.reset();
    OpenOptions options;
    options.create = create;
    auto opened = Store::open(dir.path(), options);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    store = std::move(*opened);
    if (create) {
      auto made = store->create_collection("c", {2, Metric::kL2});
      ASSERT_TRUE(made.ok()) << made.status().to_string();
      collection = *made;
      auto ids = id_range(0, 200);
      ASSERT_TRUE(collection->add(ids, rows.data()).ok());
    } else {
      auto found = store->collection("c");
      ASSERT_TRUE(found.ok()) << found.status().to_string();
      collection = *found;
    }
  }
};

TEST(IvfIndex, ReopenReusesTheSavedIndexWithoutRetraining) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  auto trained = s.collection->build_ivf(cpu_params(4));
  ASSERT_TRUE(trained.ok()) << trained.status().to_string();
  auto before = s.collection->ivf_stats();
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(before->present);
  EXPECT_EQ(before->nlist, 4u);
  EXPECT_EQ(before->trained_rows, 200u);
  EXPECT_EQ(before->trainings, 1u);
  EXPECT_EQ(before->train_engine, "cpu");
  ASSERT_EQ(index_files(s.dir.path()).size(), 1u);
  const float queries[] = {0.2f, 0.1f, 9.8f, 10.3f, 5.0f, 5.0f};
  auto first = s.collection->query(queries, 3, ivf_query(5, 1));
  ASSERT_TRUE(first.ok()) << first.status().to_string();

  ASSERT_NO_FATAL_FAILURE(s.open(false));
  QueryReport report;
  auto second = s.collection->query(queries, 3, ivf_query(5, 1), &report);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_FALSE(report.ivf_built);
  auto after = s.collection->ivf_stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->trainings, 0u) << "the reopened collection retrained";
  EXPECT_EQ(after->generation, before->generation);
  EXPECT_EQ(after->file, before->file);
  EXPECT_NEAR(after->trained_mean_distance, before->trained_mean_distance, 1e-9);
  for (std::size_t q = 0; q < 3; ++q) {
    ASSERT_EQ((*first)[q].size(), (*second)[q].size());
    for (std::size_t i = 0; i < (*first)[q].size(); ++i) {
      EXPECT_EQ((*first)[q][i].id, (*second)[q][i].id);
      EXPECT_EQ((*first)[q][i].distance, (*second)[q][i].distance);
    }
  }
}

// A compaction renumbers positions: the saved index is rebuilt by id on the next load, without
// retraining, and still answers every live row (deleted ones never).
TEST(IvfIndex, CompactionKeepsTheSavedIndexUsable) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  auto more = corner_rows(25, 11);  // a second segment, so there is something to merge
  auto more_ids = id_range(200, 100);
  ASSERT_TRUE(s.collection->add(more_ids, more.data()).ok());
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  std::vector<std::uint64_t> gone;
  for (std::uint64_t id = 0; id < 300; id += 3) gone.push_back(id);
  ASSERT_TRUE(s.collection->remove(gone).ok());
  auto compacted = s.collection->compact({.target_rows = 1000});
  ASSERT_TRUE(compacted.ok()) << compacted.status().to_string();

  ASSERT_NO_FATAL_FAILURE(s.open(false));
  std::vector<float> all = s.rows;
  all.insert(all.end(), more.begin(), more.end());
  for (std::uint64_t id = 0; id < 300; ++id) {
    QueryReport report;
    auto found = s.collection->query(&all[id * 2], 1, ivf_query(1, 4), &report);  // every list
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    EXPECT_FALSE(report.ivf_built) << "compaction made the index unusable";
    ASSERT_FALSE((*found)[0].empty());
    if (id % 3 == 0) {
      EXPECT_NE((*found)[0][0].id, id) << "a deleted row came back";
    } else {
      EXPECT_EQ((*found)[0][0].id, id);
      EXPECT_EQ((*found)[0][0].distance, 0.0f);
    }
  }
  auto stats = s.collection->ivf_stats();
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(stats->trainings, 0u);
}

TEST(IvfIndex, FirstIvfQueryBuildsAndSavesOnce) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  const float query[] = {10.1f, 0.2f};
  QueryReport report;
  ASSERT_TRUE(s.collection->query(query, 1, ivf_query(3, 1), &report).ok());
  EXPECT_TRUE(report.ivf_built);
  ASSERT_TRUE(s.collection->query(query, 1, ivf_query(3, 1), &report).ok());
  EXPECT_FALSE(report.ivf_built);
  EXPECT_EQ(s.collection->ivf_stats()->trainings, 1u);
  EXPECT_EQ(index_files(s.dir.path()).size(), 1u);
}

TEST(IvfIndex, AddedRowsJoinTheNearestCentroidsList) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  // k-means on four tight corners puts one centroid on each corner. A row near (10, 0) must land
  // in that corner's list: probing only the nearest list from (10, 0) finds it first, probing only
  // the nearest list from (0, 0) never does.
  const float added[] = {9.9f, 0.05f};
  const std::uint64_t added_id = 1000;
  ASSERT_TRUE(s.collection->add({&added_id, 1}, added).ok());
  const float at_corner[] = {9.9f, 0.05f, 0.0f, 0.0f};
  for (bool reopen : {false, true}) {
    if (reopen) ASSERT_NO_FATAL_FAILURE(s.open(false));
    auto found = s.collection->query(at_corner, 2, ivf_query(200, 1));
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    ASSERT_FALSE((*found)[0].empty());
    EXPECT_EQ((*found)[0][0].id, added_id) << "reopen " << reopen;
    EXPECT_EQ((*found)[0][0].distance, 0.0f);
    EXPECT_EQ((*found)[0].size(), 51u) << "the (10, 0) list holds its 50 rows and the new one";
    EXPECT_FALSE(ids_of((*found)[1]).count(added_id));
    auto stats = s.collection->ivf_stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->rows_since_training, 1u);
    EXPECT_EQ(stats->trainings, 0u + (reopen ? 0 : 1));
  }
}

TEST(IvfIndex, DeletesAndFiltersAreHonoured) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  std::vector<std::uint64_t> gone = id_range(50, 25);  // half of the (10, 0) corner
  auto removed = s.collection->remove(gone);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 25u);
  const float query[] = {10.0f, 0.0f};
  auto found = s.collection->query(query, 1, ivf_query(200, 4));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)[0].size(), 175u);
  for (auto id : gone) EXPECT_FALSE(ids_of((*found)[0]).count(id)) << id;
}

TEST(IvfIndex, ReindexRetrainsAndReplacesTheFile) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  auto old_files = index_files(s.dir.path());
  auto more = corner_rows(50, 8);
  ASSERT_TRUE(s.collection->add(id_range(500, 200), more.data()).ok());
  auto drift = s.collection->ivf_stats();
  ASSERT_TRUE(drift.ok());
  EXPECT_EQ(drift->rows_since_training, 200u);
  EXPECT_DOUBLE_EQ(drift->growth, 1.0);
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(8)).ok());
  auto stats = s.collection->ivf_stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->nlist, 8u);
  EXPECT_EQ(stats->trained_rows, 400u);
  EXPECT_EQ(stats->rows_since_training, 0u);
  EXPECT_GT(stats->generation, drift->generation);
  auto files = index_files(s.dir.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0], old_files[0]);
  ASSERT_NO_FATAL_FAILURE(s.open(false));
  EXPECT_EQ(s.collection->ivf_stats()->nlist, 8u);
}

TEST(IvfIndex, DriftIsReportedAndAutoRetrainActsOnIt) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  auto fresh = s.collection->ivf_stats();
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->retrain_recommended);
  EXPECT_GT(fresh->trained_mean_distance, 0.0);
  // Rows far from every centroid: few (growth 0.05) but each much farther than the trained rows.
  std::vector<float> far;
  for (int i = 0; i < 10; ++i) {
    far.push_back(30.0f + float(i));
    far.push_back(-30.0f);
  }
  ASSERT_TRUE(s.collection->add(id_range(900, 10), far.data()).ok());
  auto drift = s.collection->ivf_stats();
  ASSERT_TRUE(drift.ok());
  EXPECT_EQ(drift->rows_since_training, 10u);
  EXPECT_NEAR(drift->growth, 0.05, 1e-12);
  EXPECT_GT(drift->distance_ratio, 100.0);
  EXPECT_TRUE(drift->retrain_recommended);
  IvfParams lenient;
  lenient.retrain_distance_ratio = 1e9;
  EXPECT_FALSE(s.collection->ivf_stats(lenient)->retrain_recommended);
  // auto_retrain: the next IVF query retrains first.
  QueryOptions options = ivf_query(1, 1);
  options.ivf.auto_retrain = true;
  options.ivf.nlist = 5;
  QueryReport report;
  const float query[] = {35.0f, -30.0f};
  auto found = s.collection->query(query, 1, options, &report);
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_TRUE(report.ivf_retrained);
  EXPECT_EQ((*found)[0][0].id, 905u);
  auto after = s.collection->ivf_stats();
  EXPECT_EQ(after->trainings, 2u);
  EXPECT_EQ(after->trained_rows, 210u);
  EXPECT_FALSE(after->retrain_recommended);
}

// Corrupts the published index file with `damage`, reopens, and expects IVF queries to fail with
// DATA_LOSS naming the file while exact queries still answer.
void expect_refused(const std::function<void(const fs::path&)>& damage, const char* what) {
  CornerStore s;
  ASSERT_NO_FATAL_FAILURE(s.open(true));
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok());
  auto files = index_files(s.dir.path());
  ASSERT_EQ(files.size(), 1u);
  damage(files[0]);
  ASSERT_NO_FATAL_FAILURE(s.open(false));
  const float query[] = {1.0f, 1.0f};
  auto refused = s.collection->query(query, 1, ivf_query(3, 1));
  ASSERT_FALSE(refused.ok()) << what;
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << what;
  EXPECT_NE(refused.status().message().find(files[0].filename().string()), std::string::npos)
      << what << ": " << refused.status().message();
  auto stats = s.collection->stats();
  EXPECT_FALSE(stats.ivf.error.empty()) << what;
  QueryOptions exact;
  exact.k = 3;
  EXPECT_TRUE(s.collection->query(query, 1, exact).ok()) << what;
  // reindex replaces the damaged file.
  ASSERT_TRUE(s.collection->build_ivf(cpu_params(4)).ok()) << what;
  EXPECT_TRUE(s.collection->query(query, 1, ivf_query(3, 1)).ok()) << what;
}

TEST(IvfIndex, CorruptTruncatedOrMissingFilesAreDataLoss) {
  auto flip = [](std::uint64_t offset) {
    return [offset](const fs::path& path) {
      std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(static_cast<std::streamoff>(offset));
      char byte = 0;
      file.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x40);
      file.seekp(static_cast<std::streamoff>(offset));
      file.write(&byte, 1);
    };
  };
  expect_refused(flip(12), "header byte");
  expect_refused(flip(200), "data byte");
  expect_refused([](const fs::path& path) { fs::resize_file(path, fs::file_size(path) - 8); },
                 "truncated");
  expect_refused(
      [](const fs::path& path) {
        std::ofstream(path, std::ios::app | std::ios::binary) << "extra";
      },
      "extra bytes");
  expect_refused([](const fs::path& path) { fs::remove(path); }, "missing");
}

detail::IvfFileContents small_contents() {
  detail::IvfFileContents contents;
  contents.dim = 2;
  contents.metric = Metric::kL2;
  contents.nlist = 2;
  contents.generation = 3;
  contents.trained_rows = 3;
  contents.covered_rows = 4;
  contents.trained_mean_distance = 0.25;
  contents.added_distance_sum = 1.5;
  contents.centroids = {0, 0, 1, 1};
  contents.list_offsets = {0, 1, 4};
  contents.positions = {2, 0, 1, 3};
  contents.ids = {12, 10, 11, 13};
  return contents;
}

TEST(IvfIndexFile, RoundTripsAndChecksStructure) {
  TempDir dir("gpuopt-ivf-file");
  const fs::path path = dir.path() / "x.ivf";
  auto written = detail::write_ivf_file(path, small_contents());
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  EXPECT_FALSE(fs::exists(dir.path() / "x.ivf.tmp"));
  auto read = detail::read_ivf_file(path, *written, 2, Metric::kL2);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(read->positions, small_contents().positions);
  EXPECT_EQ(read->ids, small_contents().ids);
  EXPECT_EQ(read->centroids, small_contents().centroids);
  EXPECT_EQ(read->generation, 3u);
  EXPECT_DOUBLE_EQ(read->added_distance_sum, 1.5);
  // The wrong collection: dimension, metric, or a catalogue entry for another file.
  EXPECT_EQ(detail::read_ivf_file(path, *written, 3, Metric::kL2).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(detail::read_ivf_file(path, *written, 2, Metric::kCosine).status().code(),
            StatusCode::kDataLoss);
  detail::IvfFileInfo other = *written;
  other.generation = 4;
  EXPECT_EQ(detail::read_ivf_file(path, other, 2, Metric::kL2).status().code(),
            StatusCode::kDataLoss);
  // A position listed twice is refused even with a valid checksum.
  auto twice = small_contents();
  twice.positions = {2, 0, 0, 3};
  auto bad = detail::write_ivf_file(path, twice);
  ASSERT_TRUE(bad.ok());
  auto refused = detail::read_ivf_file(path, *bad, 2, Metric::kL2);
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("x.ivf"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::vector
