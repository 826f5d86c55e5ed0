// Segment compaction: merged segments keep every live id with its vector and metadata and drop
// deleted rows; compaction past a segment count happens by itself; a reader in another Store
// follows it; and a compaction killed with SIGKILL at random points leaves a store that opens,
// verifies and holds every row.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
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
