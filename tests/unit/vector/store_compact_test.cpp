// Segment compaction: merged segments keep every live id with its vector and metadata and drop
// deleted rows; compaction past a segment count happens by itself; a reader in another Store
// follows it; a saved IVF index is saved again for the new layout (by the compaction, or else by
// the next query of a writable store); and a compaction killed with SIGKILL at random points
// leaves a store that opens, verifies and holds every row.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 6;

std::size_t segment_files(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir / "segments")) n += entry.is_regular_file();
  return n;
}

// Fills collection "c": 40 batches of 5 rows (ids 0..199, vectors random seed id), metadata
// {"batch": b}, then upserts ids 10..19 with new vectors and deletes ids 50..59. Returns the
// expected vector of each live id.
std::map<std::uint64_t, std::vector<float>> fill(Collection& c) {
  std::map<std::uint64_t, std::vector<float>> expected;
  for (int b = 0; b < 40; ++b) {
    auto v = random_vectors(5, kDim, 100 + b);
    std::vector<Metadata> metadata(5);
    for (auto& m : metadata) m["batch"] = double(b);
    EXPECT_TRUE(c.add(id_range(b * 5, 5), v.data(), metadata).ok());
    for (int i = 0; i < 5; ++i)
      expected[b * 5 + i].assign(v.begin() + i * kDim, v.begin() + (i + 1) * kDim);
  }
  auto moved = random_vectors(10, kDim, 7);
  EXPECT_TRUE(c.upsert(id_range(10, 10), moved.data()).ok());
  for (int i = 0; i < 10; ++i) {
    expected[10 + i].assign(moved.begin() + i * kDim, moved.begin() + (i + 1) * kDim);
  }
  auto removed = id_range(50, 10);
  EXPECT_EQ(c.remove(removed).value_or(0), 10u);
  for (auto id : removed) expected.erase(id);
  return expected;
}

void expect_holds(Collection& c, const std::map<std::uint64_t, std::vector<float>>& expected) {
  ASSERT_EQ(c.size(), expected.size());
  for (const auto& [id, vector] : expected) {
    auto record = c.get(id);
    ASSERT_TRUE(record.ok()) << id << ": " << record.status().to_string();
    ASSERT_EQ(record->vector, vector) << id;
  }
  // Each live row finds itself; deleted ids never come back.
  QueryOptions options;
  options.k = 3;
  for (const auto& [id, vector] : expected) {
    auto hits = c.query(vector.data(), 1, options);
    ASSERT_TRUE(hits.ok());
    ASSERT_EQ((*hits)[0][0].id, id);
    for (const auto& hit : (*hits)[0]) ASSERT_TRUE(expected.count(hit.id)) << hit.id;
  }
  EXPECT_TRUE(c.verify().ok()) << c.verify().to_string();
}

TEST(VectorCompact, MergesSegmentsKeepsRowsAndMetadataDropsDeletedRows) {
  TempDir dir("gpuopt-compact");
  std::map<std::uint64_t, std::vector<float>> expected;
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    expected = fill(**c);
    ASSERT_EQ((*c)->stats().segments.size(), 41u);
    auto report = (*c)->compact({.target_rows = 64});
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_EQ(report->segments_before, 41u);
    EXPECT_EQ(report->rows_dropped, 20u);  // 10 superseded by upsert, 10 deleted
    // 190 live rows in runs of at most 64: 3 full segments and one of the rest.
    EXPECT_EQ(report->segments_after, 4u);
    EXPECT_EQ((*c)->stats().deleted, 0u);
    ASSERT_NO_FATAL_FAILURE(expect_holds(**c, expected));
    // Filters still see each row's metadata after its row moved.
    QueryOptions options;
    options.k = 200;
    options.where_json = R"({"batch": 5})";
    auto hits = (*c)->query(expected.at(25).data(), 1, options);
    ASSERT_TRUE(hits.ok());
    std::set<std::uint64_t> batch5;
    for (const auto& hit : (*hits)[0]) batch5.insert(hit.id);
    EXPECT_EQ(batch5, (std::set<std::uint64_t>{25, 26, 27, 28, 29}));
    // Nothing left to do.
    auto again = (*c)->compact({.target_rows = 64});
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->segments_after, again->segments_before);
  }
  EXPECT_EQ(segment_files(dir.path()), 4u) << "old segment files left behind";
  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  ASSERT_NO_FATAL_FAILURE(expect_holds(**c, expected));
  // Writes go on after a compaction.
  auto v = random_vectors(1, kDim, 9);
  std::vector<std::uint64_t> id = {1000};
  EXPECT_TRUE((*c)->add(id, v.data()).ok());
}

TEST(VectorCompact, CompactsByItselfPastTheSegmentCount) {
  TempDir dir("gpuopt-compact");
  auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 8});
  auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
  std::map<std::uint64_t, std::vector<float>> expected;
  for (int b = 0; b < 50; ++b) {
    auto v = random_vectors(2, kDim, 300 + b);
    ASSERT_TRUE((*c)->add(id_range(b * 2, 2), v.data()).ok());
    for (int i = 0; i < 2; ++i)
      expected[b * 2 + i].assign(v.begin() + i * kDim, v.begin() + (i + 1) * kDim);
    ASSERT_LE((*c)->stats().segments.size(), 8u) << "after batch " << b;
  }
  ASSERT_NO_FATAL_FAILURE(expect_holds(**c, expected));
  EXPECT_LE(segment_files(dir.path()), 8u);
}

TEST(VectorCompact, ReaderInAnotherStoreFollowsTheCompaction) {
  TempDir dir("gpuopt-compact");
  std::map<std::uint64_t, std::vector<float>> expected;
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    expected = fill(**c);
  }
  auto reader_store = Store::open(dir.path());
  auto reader = (*reader_store)->collection("c");
  ASSERT_NO_FATAL_FAILURE(expect_holds(**reader, expected));  // maps the 41 segments
  auto writer_store = Store::open(dir.path());
  auto writer = (*writer_store)->collection("c");
  auto report = (*writer)->compact({.target_rows = 1000});
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->segments_after, 1u);
  ASSERT_NO_FATAL_FAILURE(expect_holds(**reader, expected));
  EXPECT_EQ((*reader)->stats().segments.size(), 1u);
}

constexpr std::size_t kLists = 8;

QueryOptions ivf_options(std::size_t nprobe) {
  QueryOptions options;
  options.k = 5;
  options.index = IndexKind::kIvf;
  options.nprobe = nprobe;
  options.ivf.nlist = kLists;
  options.ivf.engine = QueryEngine::kCpu;
  return options;
}

std::size_t ivf_files(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir / "segments")) {
    n += entry.path().extension() == ".ivf";
  }
  return n;
}

// IVF answers to one query per live row, with 2 of the 8 lists probed.
SearchResults ivf_answers(Collection& c, const std::map<std::uint64_t, std::vector<float>>& rows,
                          QueryReport* report = nullptr) {
  std::vector<float> queries;
  for (const auto& [id, vector] : rows) queries.insert(queries.end(), vector.begin(), vector.end());
  auto hits = c.query(queries.data(), rows.size(), ivf_options(2), report);
  EXPECT_TRUE(hits.ok()) << hits.status().to_string();
  return hits.ok() ? *hits : SearchResults{};
}

void expect_same_answers(const SearchResults& before, const SearchResults& after) {
  ASSERT_EQ(before.size(), after.size());
  for (std::size_t q = 0; q < before.size(); ++q) {
    ASSERT_EQ(before[q].size(), after[q].size()) << "query " << q;
    for (std::size_t i = 0; i < before[q].size(); ++i) {
      EXPECT_EQ(before[q][i].id, after[q][i].id) << "query " << q << " hit " << i;
      EXPECT_NEAR(before[q][i].distance, after[q][i].distance, 1e-5) << "query " << q;
    }
  }
}

// Probing every list, IVF answers exactly: the same ids as the exact engine (brute force).
void expect_ivf_matches_exact(Collection& c,
                              const std::map<std::uint64_t, std::vector<float>>& rows) {
  for (const auto& [id, vector] : rows) {
    QueryOptions exact;
    exact.k = 5;
    auto want = c.query(vector.data(), 1, exact);
    auto got = c.query(vector.data(), 1, ivf_options(kLists));
    ASSERT_TRUE(want.ok() && got.ok());
    ASSERT_EQ((*got)[0].size(), (*want)[0].size()) << id;
    for (std::size_t i = 0; i < (*want)[0].size(); ++i) {
      EXPECT_EQ((*got)[0][i].id, (*want)[0][i].id) << id;
    }
    EXPECT_EQ((*got)[0][0].id, id);
  }
}

// A compaction renumbers the positions the saved IVF index names: it rebuilds the lists by id and
// saves them, so a reopened store loads them as they are (no rebuild, no retraining) and answers
// as before the compaction.
TEST(VectorCompact, CompactionSavesTheIvfIndexForTheNewLayout) {
  TempDir dir("gpuopt-compact");
  std::map<std::uint64_t, std::vector<float>> expected;
  SearchResults before;
  IvfIndexStats trained;
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    expected = fill(**c);
    ASSERT_TRUE((*c)->build_ivf(ivf_options(2).ivf).ok());
    before = ivf_answers(**c, expected);
    trained = (*c)->ivf_stats().value_or(IvfIndexStats{});
    ASSERT_TRUE(trained.present);
    auto report = (*c)->compact({.target_rows = 1000});
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_EQ(report->segments_after, 1u);
    EXPECT_TRUE(report->ivf_resaved) << report->ivf_error;
    EXPECT_EQ(report->ivf_error, "");
    auto saved = (*c)->ivf_stats();
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    EXPECT_GT(saved->generation, trained.generation) << "the compaction did not save the index";
    EXPECT_NE(saved->file, trained.file);
    EXPECT_EQ(saved->trainings, 1u) << "the compaction retrained";
    // Nothing moved: nothing to save.
    auto again = (*c)->compact({.target_rows = 1000});
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->ivf_resaved);
    EXPECT_EQ(again->ivf_error, "");
  }
  EXPECT_EQ(ivf_files(dir.path()), 1u) << "the replaced index file was left behind";

  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  QueryReport report;
  const SearchResults after = ivf_answers(**c, expected, &report);
  EXPECT_FALSE(report.ivf_built);
  EXPECT_EQ(report.ivf_rows_assigned, 0u);
  auto loaded = (*c)->ivf_stats();
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->rebuilds_by_id, 0u) << "the reopened store rebuilt the lists by id";
  EXPECT_EQ(loaded->trainings, 0u);
  // k-means saw 210 rows, 20 of them deleted and dropped since: the 190 left count as trained.
  EXPECT_EQ(trained.trained_rows, 210u);
  EXPECT_EQ(loaded->trained_rows, expected.size());
  EXPECT_EQ(loaded->rows_since_training, 0u);
  ASSERT_NO_FATAL_FAILURE(expect_same_answers(before, after));
  ASSERT_NO_FATAL_FAILURE(expect_ivf_matches_exact(**c, expected));
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The compaction writes the moved lists straight from the file's ids, without loading the index:
// the file must be the one that the rebuild by id in memory (load, then the catch-up's save, the
// path a compaction without resave_ivf leaves to the next query) writes, byte for byte. The file
// names ids twice (upserts caught up and saved) and misses rows written after its save (assigned
// to their nearest centroid), and deleted rows are dropped.
TEST(VectorCompact, ResavedIvfFileMatchesTheRebuildInMemory) {
  TempDir dir("gpuopt-compact");
  TempDir reference_dir("gpuopt-compact");
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    for (int b = 0; b < 40; ++b) {
      auto v = random_vectors(5, kDim, 100 + b);
      ASSERT_TRUE((*c)->add(id_range(b * 5, 5), v.data()).ok());
    }
    ASSERT_TRUE((*c)->build_ivf(ivf_options(2).ivf, 1).ok());
    // Upserts and enough new rows for the catch-up to save: the file then names ids 10..19 twice.
    auto moved = random_vectors(10, kDim, 7);
    ASSERT_TRUE((*c)->upsert(id_range(10, 10), moved.data()).ok());
    auto grown = random_vectors(60, kDim, 8);
    ASSERT_TRUE((*c)->add(id_range(200, 60), grown.data()).ok());
    auto saved = (*c)->ivf_stats();
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    ASSERT_EQ(saved->generation, 2u) << "the catch-up did not save the grown lists";
    // Written after that save: rows the file does not know.
    auto later = random_vectors(5, kDim, 9);
    ASSERT_TRUE((*c)->upsert(id_range(20, 5), later.data()).ok());
    auto added = random_vectors(10, kDim, 10);
    ASSERT_TRUE((*c)->add(id_range(300, 10), added.data()).ok());
    std::vector<std::uint64_t> removed = id_range(50, 10);
    removed.push_back(205);
    ASSERT_EQ((*c)->remove(removed).value_or(0), 11u);
  }
  fs::copy(dir.path(), reference_dir.path(), fs::copy_options::recursive);

  auto store = Store::open(dir.path());
  auto c = (*store)->collection("c");
  auto report = (*c)->compact({.target_rows = 1000});
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->ivf_resaved) << report->ivf_error;
  EXPECT_GT(report->ivf_resave_seconds, 0);

  auto reference_store = Store::open(reference_dir.path());
  auto reference = (*reference_store)->collection("c");
  auto reference_report = (*reference)->compact({.target_rows = 1000, .resave_ivf = false});
  ASSERT_TRUE(reference_report.ok()) << reference_report.status().to_string();
  EXPECT_FALSE(reference_report->ivf_resaved);
  EXPECT_EQ(reference_report->ivf_resave_seconds, 0);
  auto rebuilt = (*reference)->ivf_stats();  // loads, rebuilds by id and saves
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().to_string();
  EXPECT_EQ(rebuilt->rebuilds_by_id, 1u);
  EXPECT_EQ(rebuilt->save_error, "");

  auto resaved = (*c)->ivf_stats();
  ASSERT_TRUE(resaved.ok()) << resaved.status().to_string();
  EXPECT_EQ(resaved->rebuilds_by_id, 0u) << "the resaved positions did not hold";
  EXPECT_EQ(resaved->generation, 3u);
  EXPECT_EQ(resaved->generation, rebuilt->generation);
  EXPECT_EQ(resaved->rows_since_training, rebuilt->rows_since_training);
  ASSERT_EQ(resaved->file, rebuilt->file);
  const std::string bytes = file_bytes(dir.path() / "segments" / resaved->file);
  ASSERT_FALSE(bytes.empty());
  EXPECT_TRUE(bytes == file_bytes(reference_dir.path() / "segments" / rebuilt->file))
      << "the resaved file differs from the rebuild in memory";
}

// A compaction that did not save the index (another process's, here without resave_ivf) leaves
// positions that no longer hold: a read-only store rebuilds the lists in memory once per load
// and writes nothing; the next query of a writable store rebuilds and saves them, and every later
// open loads them as they are.
TEST(VectorCompact, IvfListsMovedElsewhereAreSavedByTheNextQuery) {
  TempDir dir("gpuopt-compact");
  std::map<std::uint64_t, std::vector<float>> expected;
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    expected = fill(**c);
    ASSERT_TRUE((*c)->build_ivf(ivf_options(2).ivf).ok());
  }
  // A store that only reads (so it leaves the writer lock to the compaction) with the lists loaded.
  auto first_store = Store::open(dir.path());
  auto first = (*first_store)->collection("c");
  const SearchResults before = ivf_answers(**first, expected);
  const IvfIndexStats trained = (*first)->ivf_stats().value_or(IvfIndexStats{});

  {
    auto other_store = Store::open(dir.path());
    auto other = (*other_store)->collection("c");
    auto report = (*other)->compact({.target_rows = 1000, .resave_ivf = false});
    ASSERT_TRUE(report.ok()) << report.status().to_string();
    EXPECT_FALSE(report->ivf_resaved);
    EXPECT_EQ(report->ivf_error, "");
  }
  {
    auto reader_store = Store::open(dir.path(), {.read_only = true});
    ASSERT_TRUE(reader_store.ok()) << reader_store.status().to_string();
    auto reader = (*reader_store)->collection("c");
    ASSERT_NO_FATAL_FAILURE(expect_same_answers(before, ivf_answers(**reader, expected)));
    ASSERT_NO_FATAL_FAILURE(expect_same_answers(before, ivf_answers(**reader, expected)));
    auto stats = (*reader)->ivf_stats();
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    EXPECT_EQ(stats->rebuilds_by_id, 1u) << "rebuilt more than once per load";
    EXPECT_EQ(stats->generation, trained.generation) << "a read-only store saved the index";
    EXPECT_EQ(stats->save_error, "") << "a read-only store tried to save";
  }
  EXPECT_EQ(ivf_files(dir.path()), 1u);

  // The first store follows the compaction at its next query and saves the rebuilt lists.
  QueryReport report;
  ASSERT_NO_FATAL_FAILURE(expect_same_answers(before, ivf_answers(**first, expected, &report)));
  EXPECT_FALSE(report.ivf_built);
  auto resaved = (*first)->ivf_stats();
  ASSERT_TRUE(resaved.ok()) << resaved.status().to_string();
  EXPECT_EQ(resaved->rebuilds_by_id, 1u);
  EXPECT_EQ(resaved->save_error, "");
  EXPECT_GT(resaved->generation, trained.generation) << "the rebuilt lists were not saved";
  EXPECT_EQ(ivf_files(dir.path()), 1u);

  auto store = Store::open(dir.path());
  auto c = (*store)->collection("c");
  ASSERT_NO_FATAL_FAILURE(expect_same_answers(before, ivf_answers(**c, expected)));
  auto loaded = (*c)->ivf_stats();
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->rebuilds_by_id, 0u) << "the saved lists were rebuilt again";
  EXPECT_EQ(loaded->generation, resaved->generation);
  ASSERT_NO_FATAL_FAILURE(expect_ivf_matches_exact(**c, expected));
}

// SIGKILL a process that compacts (and keeps writing) at random points: every reopen verifies
// and holds every row written before the child started.
TEST(VectorCompact, KilledCompactionLosesNothing) {
  TempDir dir("gpuopt-compact");
  std::map<std::uint64_t, std::vector<float>> expected;
  {
    auto store = Store::open(dir.path(), {.create = true, .compact_above_segments = 0});
    auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
    expected = fill(**c);
  }
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 25; ++trial) {
    std::fflush(nullptr);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto store = Store::open(dir.path(), {.writer_wait_ms = 5000, .compact_above_segments = 0});
      if (!store.ok()) _exit(1);
      auto c = (*store)->collection("c");
      if (!c.ok()) _exit(1);
      // Targets that change from round to round keep regrouping the segments.
      for (int round = 0;; ++round) {
        auto compacted = (*c)->compact({.target_rows = 16 + static_cast<std::size_t>(round % 50)});
        if (!compacted.ok()) _exit(2);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300000));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the compacting child exited with " << status;
    auto store = Store::open(dir.path(), {.compact_above_segments = 0});
    ASSERT_TRUE(store.ok()) << "trial " << trial << ": " << store.status().to_string();
    auto c = (*store)->collection("c");
    ASSERT_NO_FATAL_FAILURE(expect_holds(**c, expected)) << "trial " << trial;
    // Fresh small segments for the next trial's compaction to merge.
    auto moved = random_vectors(3, kDim, 500 + trial);
    auto ids = id_range(100 + (trial % 10) * 3, 3);
    ASSERT_TRUE((*c)->upsert(ids, moved.data()).ok());
    for (int i = 0; i < 3; ++i) {
      expected[ids[i]].assign(moved.begin() + i * kDim, moved.begin() + (i + 1) * kDim);
    }
  }
}

}  // namespace
}  // namespace gpuopt::vector
