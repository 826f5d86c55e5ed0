// FIFOs where the store, the vector file readers and the ingest server expect regular files: each
// is refused promptly with an error naming the path, and nothing blocks waiting for a writer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "common/deadline.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::call_with_deadline;
using gpuopt::testing::id_range;
using gpuopt::testing::make_fifo;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 8;

bool mentions(const Status& status, const std::string& words) {
  return status.message().find(words) != std::string::npos;
}

// A store at `directory` with one collection holding one segment; returns the segment's path.
fs::path make_store(const fs::path& directory) {
  auto store = Store::open(directory, {.create = true});
  EXPECT_TRUE(store.ok()) << store.status().to_string();
  auto collection = (*store)->create_collection("default", {kDim, Metric::kL2});
  EXPECT_TRUE(collection.ok());
  auto vectors = random_vectors(16, kDim, 7);
  EXPECT_TRUE((*collection)->add(id_range(0, 16), vectors.data()).ok());
  for (const auto& entry : fs::recursive_directory_iterator(directory / "segments")) {
    if (entry.is_regular_file()) return entry.path();
  }
  ADD_FAILURE() << "no segment file written";
  return {};
}

TEST(VectorSpecialFiles, FifoSegmentIsRefusedByName) {
  TempDir dir("gpuopt-fifo-segment");
  const fs::path segment = make_store(dir.path() / "store");
  ASSERT_FALSE(segment.empty());
  ASSERT_TRUE(make_fifo(segment));
  auto opened = call_with_deadline([&] { return Store::open(dir.path() / "store"); });
  ASSERT_TRUE(opened.has_value()) << "opening a store with a FIFO segment blocked";
  ASSERT_FALSE(opened->ok());
  EXPECT_TRUE(mentions(opened->status(), segment.string() + " is a FIFO"))
      << opened->status().to_string();
}

TEST(VectorSpecialFiles, FifoWhereTheNextSegmentGoesFailsTheBatchPromptly) {
  TempDir dir("gpuopt-fifo-next-segment");
  const fs::path segment = make_store(dir.path() / "store");
  ASSERT_FALSE(segment.empty());
  // The next segment's name: the sequence after the one written (default-00000000.seg style).
  std::string name = segment.filename().string();
  const auto dash = name.rfind('-');
  ASSERT_NE(dash, std::string::npos);
  const int sequence = std::stoi(name.substr(dash + 1));
  char next[16];
  std::snprintf(next, sizeof(next), "%08d", sequence + 1);
  const fs::path next_segment = segment.parent_path() / (name.substr(0, dash + 1) + next + ".seg");
  ASSERT_TRUE(make_fifo(next_segment));
  auto added = call_with_deadline([&]() -> Status {
    auto store = Store::open(dir.path() / "store");
    if (!store.ok()) return store.status();
    auto collection = (*store)->collection("default");
    if (!collection.ok()) return collection.status();
    auto vectors = random_vectors(4, kDim, 8);
    Status status = (*collection)->add(id_range(100, 4), vectors.data());
    if (status.ok()) return internal_error("the batch was committed into a FIFO");
    // Nothing was committed: the store still holds the first 16 rows.
    if ((*collection)->size() != 16) return internal_error("the failed batch changed the count");
    return status;
  });
  ASSERT_TRUE(added.has_value()) << "writing a segment onto a FIFO blocked";
  EXPECT_TRUE(mentions(*added, next_segment.string())) << added->to_string();
  EXPECT_TRUE(mentions(*added, "not a regular file")) << added->to_string();
}

TEST(VectorSpecialFiles, FifoCatalogueOrJournalIsRefusedByName) {
  for (const char* suffix : {"", "-wal"}) {
    TempDir dir("gpuopt-fifo-catalogue");
    const fs::path store_dir = dir.path() / "store";
    make_store(store_dir);
    fs::path catalogue;
    for (const auto& entry : fs::directory_iterator(store_dir)) {
      if (entry.path().extension() == ".sqlite" || entry.path().extension() == ".db") {
        catalogue = entry.path();
      }
    }
    ASSERT_FALSE(catalogue.empty()) << "catalogue file not found";
    const fs::path target = catalogue.string() + suffix;
    ASSERT_TRUE(make_fifo(target));
    auto opened = call_with_deadline([&] { return Store::open(store_dir); });
    ASSERT_TRUE(opened.has_value()) << "opening a store with a FIFO " << target << " blocked";
    ASSERT_FALSE(opened->ok());
    EXPECT_TRUE(mentions(opened->status(), target.string() + " is a FIFO"))
        << opened->status().to_string();
  }
}

TEST(VectorSpecialFiles, VectorFileReadersRefuseFifosAndDirectories) {
  TempDir dir("gpuopt-fifo-input");
  for (const char* name : {"x.fvecs", "x.npy", "x.fvecs.gz", "x-idx3-ubyte"}) {
    const fs::path input = dir.path() / name;
    ASSERT_TRUE(make_fifo(input));
    auto read = call_with_deadline([&] { return read_vector_file(input, 0); });
    ASSERT_TRUE(read.has_value()) << "reading FIFO " << name << " blocked";
    ASSERT_FALSE(read->ok());
    EXPECT_EQ(read->status().message(), input.string() + " is a FIFO, not a regular file");
  }
  fs::create_directory(dir.path() / "d.npy");
  auto directory = read_vector_file(dir.path() / "d.npy", 0);
  ASSERT_FALSE(directory.ok());
  EXPECT_TRUE(mentions(directory.status(), "is a directory"));
}

TEST(VectorSpecialFiles, IngestServerRefusesAFifoNamedAsSharedMemory) {
  TempDir dir("gpuopt-fifo-ingest");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->create_collection("default", {kDim, Metric::kL2}).ok());
  const fs::path socket = dir.path() / "ingest.sock";
  IngestServerOptions options;
  options.receive_timeout_s = 5;
  auto server = IngestServer::start(store->get(), socket, options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Status served;
  std::thread serving([&] { served = (*server)->serve(); });

  const std::string name = std::string(kIngestShmPrefix) + std::string(32, 'f');
  const fs::path fifo = fs::path("/dev/shm") / name.substr(1);
  ASSERT_TRUE(make_fifo(fifo));
  IngestRequest request;
  request.op = IngestOp::kAdd;
  request.payload = IngestPayload::kShm;
  request.collection = "default";
  request.dim = kDim;
  request.rows = 2;
  request.request_id = 9;
  request.shm_name = name;
  request.ids = {1, 2};
  auto client = IngestClient::connect(socket, 10);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  auto reply = call_with_deadline(
      [&] { return (*client)->send_raw(encode_request(request), true); }, std::chrono::seconds(5));
  if (!reply.has_value()) {
    // Unwedge the server (its open is waiting for a writer) so the test can end.
    int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
    ADD_FAILURE() << "the server blocked on a FIFO named as shared memory";
  } else {
    ASSERT_TRUE(reply->ok()) << reply->status().to_string();
    EXPECT_EQ((*reply)->code, StatusCode::kInvalidArgument) << (*reply)->message;
    EXPECT_NE((*reply)->message.find("not a regular"), std::string::npos) << (*reply)->message;
    // The write lock was released: the same connection still gets answers.
    auto counted = (*client)->count("default");
    ASSERT_TRUE(counted.ok()) << counted.status().to_string();
    EXPECT_EQ(*counted, 0u);
  }
  fs::remove(fifo);
  (*server)->request_stop();
  serving.join();
  EXPECT_TRUE(served.ok()) << served.to_string();
}

}  // namespace
}  // namespace gpuopt::vector
