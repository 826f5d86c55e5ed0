// Sharing a store: readers follow another writer's commits, one writer at a time (the lock names
// its holder), read-only opens (by option, and for a user who may not write), and a catalogue
// edited by hand is refused by name instead of trusted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 4;

// A store with collection "c" holding ids 0..rows-1 (random vectors, seed 1) in one segment.
void make_store(const fs::path& dir, std::size_t rows) {
  auto store = Store::open(dir, {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->create_collection("c", {kDim, Metric::kL2});
  ASSERT_TRUE(c.ok());
  auto vectors = random_vectors(rows, kDim, 1);
  ASSERT_TRUE((*c)->add(id_range(0, rows), vectors.data()).ok());
}

void run_sql(const fs::path& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "store.sqlite").c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << sql << ": " << message;
}

// The store's files and their sizes, less SQLite's WAL and WAL-index files (a reader may make
// those where it can, as SQLite's readers do).
std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    if (name.ends_with("-wal") || name.ends_with("-shm")) continue;
    names.insert(name + (entry.is_regular_file() ? ":" + std::to_string(entry.file_size()) : ""));
  }
  return names;
}

TEST(VectorStoreSharing, ReaderSeesAnotherWritersAddsUpsertsAndDeletes) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 10);
  auto reader_store = Store::open(dir.path());
  ASSERT_TRUE(reader_store.ok());
  auto reader = (*reader_store)->collection("c");
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ((*reader)->size(), 10u);

  auto writer_store = Store::open(dir.path());
  ASSERT_TRUE(writer_store.ok());
  auto writer = (*writer_store)->collection("c");
  auto more = random_vectors(5, kDim, 2);
  ASSERT_TRUE((*writer)->add(id_range(10, 5), more.data()).ok());
  // The reader sees the new rows without reopening.
  EXPECT_EQ((*reader)->size(), 15u);
  auto record = (*reader)->get(12);
  ASSERT_TRUE(record.ok()) << record.status().to_string();
  EXPECT_EQ(record->vector, std::vector<float>(more.begin() + 2 * kDim, more.begin() + 3 * kDim));

  // An upsert moves id 3 to new vector; a delete removes id 4. The reader's search finds id 3 once,
  // at its new vector, and never id 4.
  std::vector<float> moved = {100, 100, 100, 100};
  std::vector<std::uint64_t> three = {3}, four = {4};
  ASSERT_TRUE((*writer)->upsert(three, moved.data()).ok());
  ASSERT_EQ((*writer)->remove(four).value_or(0), 1u);
  EXPECT_EQ((*reader)->size(), 14u);
  QueryOptions options;
  options.k = 14;
  auto hits = (*reader)->query(moved.data(), 1, options);
  ASSERT_TRUE(hits.ok()) << hits.status().to_string();
  ASSERT_EQ((*hits)[0].size(), 14u);
  EXPECT_EQ((*hits)[0][0].id, 3u);
  EXPECT_EQ((*hits)[0][0].distance, 0.0f);
  std::multiset<std::uint64_t> ids;
  for (const auto& hit : (*hits)[0]) ids.insert(hit.id);
  EXPECT_EQ(ids.count(3), 1u);
  EXPECT_EQ(ids.count(4), 0u);
  EXPECT_EQ((*reader)->get(4).status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*reader)->stats().deleted, 2u);

  // A collection made by the writer appears in the reader's store.
  ASSERT_TRUE((*writer_store)->create_collection("d", {2, Metric::kCosine}).ok());
  EXPECT_TRUE((*reader_store)->collection("d").ok());
  EXPECT_TRUE((*reader)->verify().ok());

  // Once the writer is gone, the reader's store can write, after everything the writer did (it
  // used to fail every batch with "reopen the store").
  writer_store->reset();
  auto last = random_vectors(1, kDim, 4);
  std::vector<std::uint64_t> twenty = {20};
  ASSERT_TRUE((*reader)->add(twenty, last.data()).ok());
  std::vector<std::uint64_t> twelve = {12};
  EXPECT_EQ((*reader)->add(twelve, last.data()).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ((*reader)->size(), 15u);
  EXPECT_TRUE((*reader)->verify().ok());
}

TEST(VectorStoreSharing, SecondWriterIsRefusedNamingTheHolder) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 4);
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  std::fflush(nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = Store::open(dir.path());
    char byte = store.ok() && (*store)->lock_for_writing().ok() ? 1 : 0;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    if (read(release[0], &byte, 1) != 1) _exit(1);  // holds the lock until told
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1) << "the child could not take the writer lock";

  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok());
  auto c = (*store)->collection("c");
  ASSERT_TRUE(c.ok());
  // Reading is not blocked by the writer.
  EXPECT_EQ((*c)->size(), 4u);
  auto v = random_vectors(1, kDim, 3);
  std::vector<std::uint64_t> id = {100};
  Status refused = (*c)->add(id, v.data());
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("pid " + std::to_string(child)), std::string::npos)
      << refused.message();
  EXPECT_EQ((*c)->size(), 4u);

  // With a wait, the write goes through once the holder lets go.
  auto waiting = Store::open(dir.path(), {.writer_wait_ms = 10000});
  ASSERT_TRUE(waiting.ok());
  ASSERT_EQ(write(release[1], &byte, 1), 1);
  auto waiting_c = (*waiting)->collection("c");
  EXPECT_TRUE((*waiting_c)->add(id, v.data()).ok());
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ((*c)->size(), 5u);
  for (int fd : {ready[0], ready[1], release[0], release[1]}) close(fd);
}

TEST(VectorStoreSharing, ReadOnlyOpenAnswersAndRefusesWritesChangingNothing) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 20);
  const auto before = listing(dir.path());
  {
    auto store = Store::open(dir.path(), {.read_only = true});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    EXPECT_TRUE((*store)->read_only());
    auto c = (*store)->collection("c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)->size(), 20u);
    auto vectors = random_vectors(20, kDim, 1);
    QueryOptions options;
    options.k = 1;
    auto hits = (*c)->query(vectors.data() + 7 * kDim, 1, options);
    ASSERT_TRUE(hits.ok()) << hits.status().to_string();
    EXPECT_EQ((*hits)[0][0].id, 7u);
    EXPECT_TRUE((*c)->verify().ok());
    std::vector<std::uint64_t> id = {99};
    Status add = (*c)->add(id, vectors.data());
    EXPECT_EQ(add.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(add.message().find("read-only"), std::string::npos) << add.message();
    EXPECT_EQ((*c)->remove(id).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ((*store)->create_collection("x", {2, Metric::kL2}).status().code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ((*store)->lock_for_writing().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(listing(dir.path()), before) << "a read-only open created or removed files";
  EXPECT_EQ(Store::open(dir.path() / "none", {.create = true, .read_only = true}).status().code(),
            StatusCode::kInvalidArgument);
}

// Another user with read permission only (or, for a non-root run, a directory without write
// permission): the store opens read-only by itself, answers, and says why it refuses writes.
TEST(VectorStoreSharing, StoreThisUserCannotWriteOpensReadOnly) {
  TempDir dir("gpuopt-sharing");
  const fs::path store_dir = dir.path() / "store";
  make_store(store_dir, 20);
  {
    // A reader had the store open: -wal and -shm exist, as they would beside a live writer.
    auto store = Store::open(store_dir);
    ASSERT_TRUE(store.ok());
  }
  fs::permissions(dir.path(),
                  fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  for (const auto& entry : fs::recursive_directory_iterator(store_dir)) {
    fs::permissions(entry.path(), entry.is_directory()
                                      ? fs::perms::owner_all | fs::perms::group_read |
                                            fs::perms::group_exec | fs::perms::others_read |
                                            fs::perms::others_exec
                                      : fs::perms::owner_read | fs::perms::owner_write |
                                            fs::perms::group_read | fs::perms::others_read);
  }
  fs::permissions(store_dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                 fs::perms::others_read | fs::perms::others_exec);
  const bool as_root = geteuid() == 0;
  if (!as_root) {
    fs::permissions(store_dir, fs::perms::owner_write | fs::perms::group_write,
                    fs::perm_options::remove);
  }
  const auto before = listing(store_dir);
  std::fflush(nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (as_root && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(10);
    auto store = Store::open(store_dir);
    if (!store.ok()) {
      std::fprintf(stderr, "open: %s\n", store.status().to_string().c_str());
      _exit(11);
    }
    if (!(*store)->read_only()) _exit(12);
    auto c = (*store)->collection("c");
    if (!c.ok() || (*c)->size() != 20) _exit(13);
    auto vectors = random_vectors(20, kDim, 1);
    QueryOptions options;
    options.k = 1;
    auto hits = (*c)->query(vectors.data() + 5 * kDim, 1, options);
    if (!hits.ok()) {
      std::fprintf(stderr, "query: %s\n", hits.status().to_string().c_str());
      _exit(14);
    }
    if ((*hits)[0][0].id != 5) _exit(15);
    std::vector<std::uint64_t> id = {99};
    Status add = (*c)->add(id, vectors.data());
    if (add.code() != StatusCode::kFailedPrecondition ||
        add.message().find("not writable") == std::string::npos) {
      std::fprintf(stderr, "add: %s\n", add.to_string().c_str());
      _exit(16);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the read-only child failed (its message is above)";
  EXPECT_EQ(listing(store_dir), before);
  fs::permissions(store_dir, fs::perms::owner_all, fs::perm_options::add);
}

// Each edit of the catalogue stops the open with DATA_LOSS naming what is wrong.
struct CatalogueEdit {
  const char* name;
  const char* sql;
  const char* expected;  // in the message
};

class CatalogueValidationTest : public ::testing::TestWithParam<CatalogueEdit> {};

TEST_P(CatalogueValidationTest, EditedCatalogueIsRefusedByName) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 10);
  run_sql(dir.path(), GetParam().sql);
  auto store = Store::open(dir.path());
  ASSERT_FALSE(store.ok()) << "opened a store whose catalogue says: " << GetParam().sql;
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss) << store.status().to_string();
  EXPECT_NE(store.status().message().find(GetParam().expected), std::string::npos)
      << store.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Edits, CatalogueValidationTest,
    ::testing::Values(
        CatalogueEdit{"PathInName",
                      "UPDATE collections SET name = '../../x'; UPDATE segments SET collection = "
                      "'../../x'",
                      "../../x"},
        CatalogueEdit{"SegmentOutsideDirectory", "UPDATE segments SET file = '../store.sqlite'",
                      "../store.sqlite"},
        CatalogueEdit{"MissingSegment",
                      "UPDATE segments SET file = 'c-00000007.seg', sequence = 7; "
                      "UPDATE collections SET next_segment = 8",
                      "c-00000007.seg"},
        CatalogueEdit{"OversizedRows", "UPDATE segments SET rows = 4611686018427387904",
                      "4611686018427387904 rows"},
        CatalogueEdit{"RowsDisagreeWithBytes", "UPDATE segments SET rows = 11", "11 rows"},
        CatalogueEdit{"WrongDimension", "UPDATE collections SET dim = 8", "dimension"},
        CatalogueEdit{"HugeDimension", "UPDATE collections SET dim = 1099511627776",
                      "dimension 1099511627776"},
        CatalogueEdit{"SequencePastCounter", "UPDATE collections SET next_segment = 0",
                      "next segment"},
        CatalogueEdit{"TombstoneForMissingRow", "INSERT INTO dead VALUES('c', 0, 10)",
                      "tombstone names row 10 of segment 0"},
        CatalogueEdit{"TombstoneForMissingSegment", "INSERT INTO dead VALUES('c', 5, 0)",
                      "segment 5"},
        CatalogueEdit{"NegativeSequence", "INSERT INTO dead VALUES('c', -1, 0)", "segment -1"},
        CatalogueEdit{"UnknownMetric", "UPDATE collections SET metric = 'manhattan'", "manhattan"},
        CatalogueEdit{"DroppedTables", "DROP TABLE items; DROP TABLE dead", "2 of the store's 4"}),
    [](const auto& info) { return std::string(info.param.name); });

// A forged tombstone that names a real, live row opens (it is well-formed) but verify() finds
// that the ids and the tombstones disagree.
TEST(VectorStoreSharing, ForgedTombstoneFailsVerify) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 10);
  run_sql(dir.path(), "INSERT INTO dead VALUES('c', 0, 3)");
  auto store = Store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto c = (*store)->collection("c");
  Status verified = (*c)->verify();
  EXPECT_EQ(verified.code(), StatusCode::kDataLoss);
  EXPECT_NE(verified.message().find("id 3"), std::string::npos) << verified.message();
}

// An emptied (0-byte) catalogue beside segment files is not an empty store.
TEST(VectorStoreSharing, EmptyCatalogueBesideSegmentsIsDataLoss) {
  TempDir dir("gpuopt-sharing");
  make_store(dir.path(), 10);
  for (const char* suffix : {"-wal", "-shm"})
    fs::remove(dir.path() / (std::string("store.sqlite") + suffix));
  { std::ofstream truncate(dir.path() / "store.sqlite", std::ios::trunc); }
  for (bool create : {false, true}) {
    auto store = Store::open(dir.path(), {.create = create});
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(store.status().message().find("segments/ holds 1 files"), std::string::npos)
        << store.status().message();
  }
}

}  // namespace
}  // namespace gpuopt::vector
