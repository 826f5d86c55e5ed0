// One writer and four reader processes on one store, the writer (which also compacts the
// segments now and then) killed with SIGKILL at random points and started again: nothing
// acknowledged is lost, readers never fail, never see the row count go down and never read a vector
// other than the one written for its id, and the store verifies afterwards. Each vector is derived
// from its id, so any process can check any row.
//
// The run lasts GPUOPT_TEST_MULTIPROCESS_SECONDS (default 10); CTest also runs a 30 s variant
// labelled `long`.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kDim = 8;

// The vector written for `id`: a hash of the id in [0, 1)^8 (24-bit coordinates, so a collision
// between two ids is vanishingly unlikely, and the small norms keep L2 distances accurate).
std::vector<float> vector_of(std::uint64_t id) {
  std::vector<float> v(kDim);
  std::uint64_t h = id * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t j = 0; j < kDim; ++j) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    v[j] = static_cast<float>(h >> 40) / float(1 << 24);
  }
  return v;
}

int run_seconds() {
  const char* text = std::getenv("GPUOPT_TEST_MULTIPROCESS_SECONDS");
  int seconds = text != nullptr ? std::atoi(text) : 10;
  return seconds > 0 ? seconds : 10;
}

// Runs in a forked child; never returns.
[[noreturn]] void child_exit(int code) {
  std::fflush(stderr);
  _exit(code);
}

// The writer: batches of consecutive ids from one past the largest present, and now and then an
// upsert of ids already acknowledged (same vectors: the count stays, tombstones grow). Each batch
// is logged to `acknowledged` only after add() returned OK.
[[noreturn]] void writer(const fs::path& store_dir, const fs::path& acknowledged,
                         std::uint64_t seed) {
  OpenOptions options;
  options.writer_wait_ms = 10000;  // the killed writer's lock goes with it
  auto store = Store::open(store_dir, options);
  if (!store.ok()) {
    std::fprintf(stderr, "writer: open: %s\n", store.status().to_string().c_str());
    child_exit(1);
  }
  auto collection = (*store)->collection(kDefaultCollection);
  if (!collection.ok()) child_exit(1);
  int log = ::open(acknowledged.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log < 0) child_exit(1);
  std::mt19937_64 rng(seed);
  for (int batch = 0;; ++batch) {
    if (batch % 6 == 5) {
      // Merges segments under the readers' feet (and may be killed half-way).
      auto compacted = (*collection)->compact({.target_rows = 64 + rng() % 256});
      if (!compacted.ok()) {
        std::fprintf(stderr, "writer: compact: %s\n", compacted.status().to_string().c_str());
        child_exit(1);
      }
      continue;
    }
    auto next = (*collection)->next_free_id();
    if (!next.ok()) {
      std::fprintf(stderr, "writer: %s\n", next.status().to_string().c_str());
      child_exit(1);
    }
    const bool upsert = batch % 5 == 4 && *next > 0;
    const std::size_t rows = 1 + rng() % 40;
    std::vector<std::uint64_t> ids(rows);
    for (std::size_t i = 0; i < rows; ++i) ids[i] = upsert ? rng() % *next : *next + i;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> vectors;
    for (auto id : ids) {
      auto v = vector_of(id);
      vectors.insert(vectors.end(), v.begin(), v.end());
    }
    Status written = upsert ? (*collection)->upsert(ids, vectors.data())
                            : (*collection)->add(ids, vectors.data());
    if (!written.ok()) {
      std::fprintf(stderr, "writer: %s\n", written.to_string().c_str());
      child_exit(1);
    }
    if (!upsert) {
      std::string line = fmt::format("{} {}\n", ids.front(), ids.size());
      if (::write(log, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        child_exit(1);
      }
    }
  }
}

// A reader: until the deadline, checks that the count never drops, that get() of ids below the
// count returns their vectors, and that each id's own vector finds that id at distance 0.
[[noreturn]] void reader(const fs::path& store_dir, Clock::time_point deadline,
                         std::uint64_t seed) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "reader %d: %s\n", ::getpid(), what.c_str());
    child_exit(1);
  };
  auto store = Store::open(store_dir);
  if (!store.ok()) fail("open: " + store.status().to_string());
  auto collection = (*store)->collection(kDefaultCollection);
  if (!collection.ok()) fail(collection.status().to_string());
  std::mt19937_64 rng(seed);
  std::size_t last = 0, reads = 0;
  QueryOptions options;
  options.k = 2;  // two hits: an upserted id must not come back twice (old row and new)
  options.threads = 1;
  while (Clock::now() < deadline) {
    const std::size_t count = (*collection)->size();
    if (count < last) fail(fmt::format("count went from {} to {}", last, count));
    last = count;
    if (count > 0) {
      const std::uint64_t id = rng() % count;  // ids are 0..count-1: the writer never skips one
      auto record = (*collection)->get(id);
      if (!record.ok())
        fail(fmt::format("get({}) with count {}: {}", id, count, record.status().to_string()));
      if (record->vector != vector_of(id)) fail(fmt::format("get({}): wrong vector", id));
      auto v = vector_of(id);
      auto hits = (*collection)->query(v.data(), 1, options);
      if (!hits.ok()) fail("query: " + hits.status().to_string());
      if (count > 1 && ((*hits)[0].size() != 2 || (*hits)[0][0].id == (*hits)[0][1].id)) {
        fail(fmt::format("query for id {}'s vector: {} hits, an id returned twice?", id,
                         (*hits)[0].size()));
      }
      if ((*hits)[0].empty() || vector_of((*hits)[0][0].id) != v ||
          (*hits)[0][0].distance > 1e-5f) {
        fail(fmt::format("query for id {}'s vector found id {} at {}", id,
                         (*hits)[0].empty() ? 0 : (*hits)[0][0].id,
                         (*hits)[0].empty() ? -1.0f : (*hits)[0][0].distance));
      }
      ++reads;
    }
    if ((*collection)->stats().live < last) fail("stats() count below size()");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::fprintf(stderr, "reader %d: %zu reads, last count %zu\n", ::getpid(), reads, last);
  child_exit(reads > 0 ? 0 : 2);
}

TEST(VectorMultiProcess, WriterKilledAtRandomReadersNeverFailNothingAcknowledgedIsLost) {
  gpuopt::testing::TempDir dir("gpuopt-multiprocess");
  const fs::path store_dir = dir.path() / "store";
  const fs::path acknowledged = dir.path() / "acknowledged.txt";
  {
    auto store = Store::open(store_dir, {.create = true});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->create_collection(kDefaultCollection, {kDim, Metric::kL2}).ok());
  }
  const int seconds = run_seconds();
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  std::fflush(nullptr);
  std::vector<pid_t> readers;
  for (int r = 0; r < 4; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) reader(store_dir, deadline + std::chrono::milliseconds(200), 1000 + r);
    readers.push_back(pid);
  }
  std::mt19937_64 rng(42);
  int kills = 0, writer_failures = 0;
  while (Clock::now() < deadline) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) writer(store_dir, acknowledged, rng());
    // Anywhere from before the open to many batches in.
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++kills;
    } else {
      ++writer_failures;
      ADD_FAILURE() << "the writer exited by itself with status " << status;
    }
  }
  for (pid_t pid : readers) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "reader " << pid << " ended with status " << status << " (its message is above)";
  }
  EXPECT_GT(kills, 3);
  EXPECT_EQ(writer_failures, 0);

  // Every acknowledged id is there with its vector, and the store verifies.
  auto store = Store::open(store_dir);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto collection = (*store)->collection(kDefaultCollection);
  ASSERT_TRUE(collection.ok());
  ASSERT_TRUE((*collection)->verify().ok()) << (*collection)->verify().to_string();
  std::ifstream log(acknowledged);
  std::uint64_t first = 0, count = 0, acknowledged_rows = 0, batches = 0;
  while (log >> first >> count) {
    ++batches;
    for (std::uint64_t id = first; id < first + count; ++id) {
      auto record = (*collection)->get(id);
      ASSERT_TRUE(record.ok()) << "acknowledged id " << id << ": " << record.status().to_string();
      ASSERT_EQ(record->vector, vector_of(id)) << "id " << id;
      ++acknowledged_rows;
    }
  }
  EXPECT_GT(batches, 0u);
  EXPECT_GE((*collection)->size(), acknowledged_rows);
  std::printf("%d s: %d writer kills, %llu batches (%llu rows) acknowledged, %zu rows stored\n",
              seconds, kills, static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(acknowledged_rows), (*collection)->size());
}

}  // namespace
}  // namespace gpuopt::vector
