// Cancellation of the store's long operations through a CancelToken: a token set before the call,
// or set by another thread while it runs, stops add, query (exact and IVF), IVF training and
// compaction with CANCELLED, and the store then reopens, verifies and holds exactly the rows
// committed before (and the IVF index saved before).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "common/vector_fixtures.hpp"
#include "gpuopt/core/cancel.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;
using Clock = std::chrono::steady_clock;

std::set<std::string> segment_files(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir / "segments")) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Reopens the store and checks that collection "c" verifies and holds exactly ids [0, rows) with
// the vectors random_vectors(rows, dim, seed) gave them.
void expect_exactly(const fs::path& dir, std::size_t rows, std::size_t dim, std::uint64_t seed) {
  auto store = Store::open(dir);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->verify().ok());
  EXPECT_EQ((*c)->size(), rows);
  const auto want = random_vectors(rows, dim, seed);
  for (std::uint64_t id : {std::uint64_t{0}, std::uint64_t{rows / 2}, std::uint64_t{rows - 1}}) {
    auto record = (*c)->get(id);
    ASSERT_TRUE(record.ok()) << id;
    EXPECT_TRUE(std::equal(record->vector.begin(), record->vector.end(), want.begin() + id * dim));
  }
  EXPECT_EQ((*c)->get(rows).status().code(), StatusCode::kNotFound);
}

// A store with collection "c" holding ids [0, rows) in batches of `batch`.
Collection* make(const fs::path& dir, std::unique_ptr<Store>& store, std::size_t rows,
                 std::size_t dim, std::uint64_t seed, std::size_t batch) {
  OpenOptions options;
  options.create = true;
  options.compact_above_segments = 0;
  store = std::move(Store::open(dir, options)).value();
  Collection* c = store->create_collection("c", {dim, Metric::kL2}).value();
  const auto vectors = random_vectors(rows, dim, seed);
  for (std::size_t at = 0; at < rows; at += batch) {
    const std::size_t n = std::min(batch, rows - at);
    EXPECT_TRUE(c->add(id_range(at, n), vectors.data() + at * dim).ok());
  }
  return c;
}

// Sets `token` once `ready()` holds (polled every millisecond, for at most 60 s).
template <typename Ready>
std::thread cancel_when(CancelToken& token, Ready ready) {
  return std::thread([&token, ready] {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!ready() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    token.cancel();
  });
}

TEST(VectorCancel, TokenBasics) {
  CancelToken token;
  EXPECT_FALSE(is_cancelled(&token));
  EXPECT_FALSE(is_cancelled(nullptr));
  token.cancel();
  EXPECT_TRUE(is_cancelled(&token));
  token.reset();
  EXPECT_FALSE(token.cancelled());
  EXPECT_EQ(cancelled("add").code(), StatusCode::kCancelled);
}

TEST(VectorCancel, PresetTokenStopsAddAndCommitsNothing) {
  TempDir dir;
  std::unique_ptr<Store> store;
  Collection* c = make(dir.path(), store, 300, 8, 1, 100);
  const auto files = segment_files(dir.path());
  CancelToken token;
  token.cancel();
  const auto more = random_vectors(5000, 8, 2);
  Status added = c->add(id_range(300, 5000), more.data(), {}, &token);
  EXPECT_EQ(added.code(), StatusCode::kCancelled) << added.to_string();
  EXPECT_EQ(c->upsert(id_range(0, 10), more.data(), {}, &token).code(), StatusCode::kCancelled);
  EXPECT_EQ(c->size(), 300u);
  EXPECT_EQ(segment_files(dir.path()), files);
  // The same collection object writes normally afterwards.
  token.reset();
  EXPECT_TRUE(c->add(id_range(300, 1), more.data(), {}, &token).ok());
  store.reset();
  // 301 rows now, but the last one came from `more`: check the first 300 only.
  auto reopened = Store::open(dir.path()).value();
  Collection* again = reopened->collection("c").value();
  EXPECT_TRUE(again->verify().ok());
  EXPECT_EQ(again->size(), 301u);
}

TEST(VectorCancel, PresetTokenStopsDeleteAndVerify) {
  TempDir dir;
  std::unique_ptr<Store> store;
  Collection* c = make(dir.path(), store, 10000, 4, 11, 1000);
  CancelToken token;
  token.cancel();
  EXPECT_EQ(c->remove(id_range(0, 9000), &token).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(c->verify(&token).code(), StatusCode::kCancelled);
  EXPECT_EQ(c->size(), 10000u);
  store.reset();
  expect_exactly(dir.path(), 10000, 4, 11);  // nothing was deleted
}

TEST(VectorCancel, ConcurrentCancelStopsAddBeforeCommit) {
  TempDir dir;
  std::unique_ptr<Store> store;
  Collection* c = make(dir.path(), store, 200, 4, 3, 200);
  const auto before = segment_files(dir.path());
  // Big enough that inserting its ids into the catalogue takes far longer than the watcher needs
  // to see its segment file appear (the file is written before the catalogue rows).
  constexpr std::size_t kRows = 400000;
  const auto more = random_vectors(kRows, 4, 4);
  CancelToken token;
  std::thread watcher =
      cancel_when(token, [&] { return segment_files(dir.path()).size() > before.size(); });
  Status added = c->add(id_range(200, kRows), more.data(), {}, &token);
  watcher.join();
  EXPECT_EQ(added.code(), StatusCode::kCancelled) << added.to_string();
  EXPECT_EQ(c->size(), 200u);
  EXPECT_EQ(segment_files(dir.path()), before);  // the half-written batch's file is removed
  store.reset();
  expect_exactly(dir.path(), 200, 4, 3);
}

TEST(VectorCancel, QueryStopsExactAndIvf) {
  TempDir dir;
  std::unique_ptr<Store> store;
  constexpr std::size_t kDim = 64;
  Collection* c = make(dir.path(), store, 40000, kDim, 5, 10000);
  CancelToken token;
  QueryOptions options;
  options.k = 10;
  options.threads = 2;
  options.cancel = &token;
  const auto one = random_vectors(1, kDim, 6);
  // Not cancelled: answers as without a token.
  QueryOptions plain = options;
  plain.cancel = nullptr;
  auto with_token = c->query(one.data(), 1, options);
  auto without = c->query(one.data(), 1, plain);
  ASSERT_TRUE(with_token.ok() && without.ok());
  ASSERT_EQ((*with_token)[0].size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ((*with_token)[0][i].id, (*without)[0][i].id);

  token.cancel();
  EXPECT_EQ(c->query(one.data(), 1, options).status().code(), StatusCode::kCancelled);
  // An IVF query that would train the index first: cancelled, and no index is saved.
  QueryOptions ivf = options;
  ivf.index = IndexKind::kIvf;
  EXPECT_EQ(c->query(one.data(), 1, ivf).status().code(), StatusCode::kCancelled);
  EXPECT_FALSE(c->ivf_stats().value().present);

  // Cancelled while it runs: 20000 queries x 40000 rows x 64 on one thread take seconds.
  token.reset();
  options.threads = 1;
  const auto many = random_vectors(20000, kDim, 7);
  Clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cancelled_at = Clock::now();
    token.cancel();
  });
  auto found = c->query(many.data(), 20000, options);
  const auto returned = Clock::now();
  canceller.join();
  EXPECT_EQ(found.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::duration<double>(returned - cancelled_at).count(), 2.0);
  store.reset();
  expect_exactly(dir.path(), 40000, kDim, 5);
}

TEST(VectorCancel, CancelledReindexKeepsTheOldIndex) {
  TempDir dir;
  std::unique_ptr<Store> store;
  constexpr std::size_t kDim = 32;
  Collection* c = make(dir.path(), store, 20000, kDim, 8, 5000);
  IvfParams params;
  params.engine = QueryEngine::kCpu;
  params.nlist = 16;
  params.iterations = 2;
  ASSERT_TRUE(c->build_ivf(params, 2).ok());
  const IvfIndexStats old_index = c->ivf_stats().value();
  ASSERT_TRUE(old_index.present);
  QueryOptions query;
  query.index = IndexKind::kIvf;
  query.nprobe = 4;
  query.k = 5;
  const auto probe = random_vectors(3, kDim, 9);
  const SearchResults old_hits = c->query(probe.data(), 3, query).value();

  CancelToken token;
  token.cancel();
  IvfParams retrain = params;
  retrain.nlist = 128;
  retrain.cancel = &token;
  EXPECT_EQ(c->build_ivf(retrain, 2).status().code(), StatusCode::kCancelled);

  // Cancelled mid-training: thousands of k-means iterations would run for minutes.
  token.reset();
  retrain.iterations = 5000;
  Clock::time_point cancelled_at;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancelled_at = Clock::now();
    token.cancel();
  });
  auto built = c->build_ivf(retrain, 2);
  const auto returned = Clock::now();
  canceller.join();
  EXPECT_EQ(built.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::duration<double>(returned - cancelled_at).count(), 2.0);

  auto check = [&](Collection& collection) {
    const IvfIndexStats now = collection.ivf_stats().value();
    EXPECT_EQ(now.nlist, old_index.nlist);
    EXPECT_EQ(now.generation, old_index.generation);
    EXPECT_EQ(now.file, old_index.file);
    const SearchResults hits = collection.query(probe.data(), 3, query).value();
    ASSERT_EQ(hits.size(), old_hits.size());
    for (std::size_t q = 0; q < hits.size(); ++q) {
      ASSERT_EQ(hits[q].size(), old_hits[q].size());
      for (std::size_t i = 0; i < hits[q].size(); ++i) EXPECT_EQ(hits[q][i].id, old_hits[q][i].id);
    }
  };
  check(*c);
  store.reset();
  expect_exactly(dir.path(), 20000, kDim, 8);
  auto reopened = Store::open(dir.path()).value();
  check(*reopened->collection("c").value());
}

TEST(VectorCancel, CancelledCompactKeepsTheOldLayout) {
  TempDir dir;
  std::unique_ptr<Store> store;
  Collection* c = make(dir.path(), store, 6000, 8, 10, 50);  // 120 segments
  const auto before = segment_files(dir.path());
  const std::size_t segments = c->stats().segments.size();
  ASSERT_EQ(segments, 120u);
  CancelToken token;
  token.cancel();
  CompactOptions options;
  options.target_rows = 100;  // 60 runs of two segments, each written and fsync'd
  options.cancel = &token;
  EXPECT_EQ(c->compact(options).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(segment_files(dir.path()), before);

  // Cancelled once its first new segment file is there.
  token.reset();
  std::thread watcher =
      cancel_when(token, [&] { return segment_files(dir.path()).size() > before.size(); });
  auto compacted = c->compact(options);
  watcher.join();
  EXPECT_EQ(compacted.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(segment_files(dir.path()), before);
  EXPECT_EQ(c->stats().segments.size(), segments);
  EXPECT_EQ(c->size(), 6000u);
  store.reset();
  expect_exactly(dir.path(), 6000, 8, 10);

  // And a compaction without a cancel still works on the same store.
  auto reopened = Store::open(dir.path()).value();
  Collection* again = reopened->collection("c").value();
  options.cancel = nullptr;
  auto report = again->compact(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->segments_after, 60u);
  reopened.reset();
  expect_exactly(dir.path(), 6000, 8, 10);
}

}  // namespace
}  // namespace gpuopt::vector
