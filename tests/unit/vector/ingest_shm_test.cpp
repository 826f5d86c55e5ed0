// Cross-process ingest over shared memory: a server thread (or a forked server process) and a
// client in this binary. Checks the committed vectors byte for byte, every rejection's message,
// that the server survives malformed input, and that a server killed with SIGKILL mid-ingest
// keeps at least every acknowledged batch.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 24;

// A store with one collection and a server thread serving it.
class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::open(dir_.path() / "store", {.create = true});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->create_collection("default", {kDim, Metric::kL2}).ok());
    socket_ = dir_.path() / "ingest.sock";
    IngestServerOptions options;
    options.receive_timeout_s = 5;
    options.on_error = [this](const IngestReply& reply) {
      std::lock_guard lock(errors_mutex_);  // called on the server's connection threads
      errors_.push_back(reply.message);
    };
    auto server = IngestServer::start(store_.get(), socket_, options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    thread_ = std::thread([this] { served_ = server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->request_stop();
    if (thread_.joinable()) thread_.join();
    EXPECT_TRUE(served_.ok()) << served_.to_string();
    server_.reset();
  }
  std::unique_ptr<IngestClient> connect() {
    auto client = IngestClient::connect(socket_, 10);
    EXPECT_TRUE(client.ok()) << client.status().to_string();
    return client.ok() ? std::move(*client) : nullptr;
  }

  TempDir dir_{"gpuopt-ingest-test"};
  std::unique_ptr<Store> store_;
  fs::path socket_;
  std::unique_ptr<IngestServer> server_;
  std::thread thread_;
  Status served_;
  std::mutex errors_mutex_;
  std::vector<std::string> errors_;
};

TEST_F(ServerFixture, ShmIngestCommitsTheExactVectors) {
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the socket must not be reachable by other users";
  auto client = connect();
  ASSERT_NE(client, nullptr);
  auto first = random_vectors(100, kDim, 1);
  auto total = client->add("default", id_range(0, 100), first.data(), kDim);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(*total, 100u);
  // A caller-filled buffer, sent without another copy; then an upsert over part of it.
  auto buffer = ShmBuffer::create(50, kDim);
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  auto second = random_vectors(50, kDim, 2);
  std::memcpy((*buffer)->vectors(), second.data(), second.size() * sizeof(float));
  total = client->add("default", id_range(100, 50), **buffer);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(*total, 150u);
  auto third = random_vectors(10, kDim, 3);
  total = client->add("default", id_range(95, 10), third.data(), kDim, /*upsert=*/true);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(*total, 150u);
  auto counted = client->count("default");
  ASSERT_TRUE(counted.ok());
  EXPECT_EQ(*counted, 150u);
  // The client's buffer is an anonymous memfd (no name in /dev/shm) that cannot change size.
  const int fd = (*buffer)->fd();
  char target[256] = {};
  ASSERT_GT(readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof(target) - 1),
            0);
  EXPECT_EQ(std::string(target).rfind("/memfd:gpuopt-ingest", 0), 0u) << target;
  EXPECT_EQ(fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_NE(ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);

  // Reopen from disk and compare every row with what was sent.
  TearDown();
  store_.reset();
  auto reopened = Store::open(dir_.path() / "store");
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  auto collection = (*reopened)->collection("default");
  ASSERT_TRUE(collection.ok());
  EXPECT_EQ((*collection)->size(), 150u);
  ASSERT_TRUE((*collection)->verify().ok());
  for (std::uint64_t id = 0; id < 150; ++id) {
    auto record = (*collection)->get(id);
    ASSERT_TRUE(record.ok()) << id;
    const float* expected = id >= 95 && id < 105 ? &third[(id - 95) * kDim]
                            : id < 100           ? &first[id * kDim]
                                                 : &second[(id - 100) * kDim];
    ASSERT_EQ(std::memcmp(record->vector.data(), expected, kDim * sizeof(float)), 0) << id;
  }
}

// Creates an shm object by hand with the given mode and size (what a careless client might do).
std::string make_shm(mode_t mode, std::size_t bytes) {
  std::mt19937_64 rng(std::random_device{}());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", (unsigned long long)rng(),
                (unsigned long long)rng());
  std::string name = std::string(kIngestShmPrefix) + hex;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(fchmod(fd, mode), 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  close(fd);
  return name;
}

IngestRequest shm_add(const std::string& name, std::uint32_t dim, std::vector<std::uint64_t> ids) {
  IngestRequest request;
  request.op = IngestOp::kAdd;
  request.payload = IngestPayload::kShm;
  request.collection = "default";
  request.dim = dim;
  request.rows = ids.size();
  request.request_id = 5;
  request.shm_name = name;
  request.ids = std::move(ids);
  return request;
}

TEST_F(ServerFixture, RejectsBadShmAndBadBatchesWithClearErrors) {
  auto client = connect();
  ASSERT_NE(client, nullptr);
  auto expect_reply = [&](const IngestRequest& request, StatusCode code, const std::string& words) {
    auto reply = client->send_raw(encode_request(request), true);
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    EXPECT_EQ(reply->code, code) << reply->message;
    EXPECT_NE(reply->message.find(words), std::string::npos) << reply->message;
    EXPECT_EQ(reply->request_id, request.request_id);
  };
  const std::size_t bytes = 4 * kDim * sizeof(float);
  std::string world_readable = make_shm(0644, bytes);
  expect_reply(shm_add(world_readable, kDim, {1, 2, 3, 4}), StatusCode::kPermissionDenied,
               "mode 0644");
  std::string small = make_shm(0600, bytes - 1);
  expect_reply(shm_add(small, kDim, {1, 2, 3, 4}), StatusCode::kInvalidArgument, "shm too small");
  std::string good = make_shm(0600, bytes);
  expect_reply(shm_add(good, kDim + 1, {1, 2, 3, 4}), StatusCode::kInvalidArgument, "dim mismatch");
  expect_reply(shm_add(good, kDim, {1, 2, 2, 4}), StatusCode::kInvalidArgument, "appears twice");
  expect_reply(shm_add(std::string(kIngestShmPrefix) + std::string(32, 'a'), kDim, {1}),
               StatusCode::kNotFound, "No such file");
  // Refused by the parser (not a gpuopt shm name): the reply still carries the request id.
  expect_reply(shm_add("/gpuopt-ingest-" + std::string(31, 'a') + "/", kDim, {1}),
               StatusCode::kInvalidArgument, "shm name must be");
  IngestRequest other = shm_add(good, kDim, {1});
  other.collection = "nope";
  expect_reply(other, StatusCode::kNotFound, "no collection \"nope\"");
  // Zero-filled shm holds finite vectors: this one commits, then the same ids are duplicates.
  expect_reply(shm_add(good, kDim, {1, 2, 3, 4}), StatusCode::kOk, "");
  expect_reply(shm_add(good, kDim, {4, 5, 6, 7}), StatusCode::kAlreadyExists, "already exists");
  for (const auto& name : {world_readable, small, good}) shm_unlink(name.c_str());

  // Raw garbage in a well-formed frame: an error reply, and the connection keeps working.
  std::vector<std::uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8};
  auto reply = client->send_raw(garbage, true);
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_NE(reply->message.find("bad magic"), std::string::npos) << reply->message;
  auto counted = client->count("default");
  ASSERT_TRUE(counted.ok()) << counted.status().to_string();
  EXPECT_EQ(*counted, 4u);
  std::lock_guard lock(errors_mutex_);
  EXPECT_GE(errors_.size(), 9u);
}

TEST_F(ServerFixture, SurvivesOversizedAndTruncatedFrames) {
  {
    // A length prefix past the limit: refused without reading (or allocating) the body.
    auto client = connect();
    ASSERT_NE(client, nullptr);
    std::uint32_t huge = 0xFFFFFFF0u;
    std::vector<std::uint8_t> prefix(4);
    std::memcpy(prefix.data(), &huge, 4);
    auto reply = client->send_raw(prefix, false);
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    EXPECT_NE(reply->message.find("exceeds the limit"), std::string::npos) << reply->message;
  }
  {
    // Half a frame, then the client stops writing: the server says it was truncated.
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, socket_.c_str());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    std::uint32_t length = 100;
    std::uint8_t partial[4 + 10] = {};
    std::memcpy(partial, &length, 4);
    ASSERT_EQ(write(fd, partial, sizeof(partial)), static_cast<ssize_t>(sizeof(partial)));
    shutdown(fd, SHUT_WR);
    std::vector<std::uint8_t> reply(512);
    ssize_t n = read(fd, reply.data(), reply.size());
    ASSERT_GT(n, 4);
    auto parsed = parse_reply(std::span(reply.data() + 4, static_cast<std::size_t>(n) - 4));
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_NE(parsed->message.find("truncated"), std::string::npos) << parsed->message;
    close(fd);
  }
  {
    // A peer that connects and vanishes mid-frame does not take the server with it.
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, socket_.c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    std::uint8_t two[2] = {9, 9};
    ASSERT_EQ(write(fd, two, 2), 2);
    close(fd);
  }
  auto client = connect();
  ASSERT_NE(client, nullptr);
  auto vectors = random_vectors(3, kDim, 9);
  auto total = client->add("default", id_range(0, 3), vectors.data(), kDim);
  ASSERT_TRUE(total.ok()) << total.status().to_string();
  EXPECT_EQ(*total, 3u);
}

TEST(IngestServer, RefusesToReplaceAFileThatIsNotASocket) {
  TempDir dir("gpuopt-ingest-test");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok());
  fs::path file = dir.path() / "not-a-socket";
  { std::ofstream(file) << "keep me"; }
  auto server = IngestServer::start(store->get(), file);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("not a socket"), std::string::npos);
  EXPECT_TRUE(fs::exists(file));
}

// The server runs in a forked child that is SIGKILLed at a random moment while the client streams
// batches; every reopen must hold at least the acknowledged total, with acknowledged rows intact.
TEST(IngestServer, KilledServerKeepsEveryAcknowledgedBatch) {
  TempDir dir("gpuopt-ingest-test");
  const fs::path store_dir = dir.path() / "store";
  {
    auto store = Store::open(store_dir, {.create = true});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->create_collection("default", {kDim, Metric::kL2}).ok());
  }
  const fs::path socket = dir.path() / "ingest.sock";
  std::mt19937_64 rng(7);
  std::uint64_t acknowledged = 0;
  std::uint64_t next_id = 0;
  constexpr std::size_t kBatch = 40;
  int killed_mid_batch = 0;
  for (int round = 0; round < 12; ++round) {
    std::error_code ignored;
    fs::remove(socket, ignored);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto store = Store::open(store_dir);
      if (!store.ok()) _exit(3);
      auto server = IngestServer::start(store->get(), socket);
      if (!server.ok()) _exit(4);
      Status served = (*server)->serve();
      _exit(served.ok() ? 0 : 5);
    }
    std::unique_ptr<IngestClient> client;
    for (int attempt = 0; attempt < 500 && client == nullptr; ++attempt) {
      auto connected = IngestClient::connect(socket, 10);
      if (connected.ok()) {
        client = std::move(*connected);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    ASSERT_NE(client, nullptr) << "the forked server never listened";
    auto counted = client->count("default");
    ASSERT_TRUE(counted.ok()) << counted.status().to_string();
    ASSERT_GE(*counted, acknowledged);
    next_id = std::max<std::uint64_t>(next_id, *counted);
    // The killer fires after a random delay while batches stream in.
    // (A commit fsyncs the segment, its directory and the WAL: tens of ms on a busy disk.)
    auto delay = std::chrono::microseconds(10000 + rng() % 300000);
    std::thread killer([child, delay] {
      std::this_thread::sleep_for(delay);
      kill(child, SIGKILL);
    });
    for (int batch = 0; batch < 1000; ++batch) {
      auto vectors = random_vectors(kBatch, kDim, next_id);
      auto total = client->add("default", id_range(next_id, kBatch), vectors.data(), kDim);
      if (!total.ok()) {
        ++killed_mid_batch;
        break;
      }
      acknowledged = *total;
      next_id += kBatch;
    }
    killer.join();
    int wait_status = 0;
    ASSERT_EQ(waitpid(child, &wait_status, 0), child);
    client.reset();

    auto store = Store::open(store_dir);
    ASSERT_TRUE(store.ok()) << "round " << round << ": " << store.status().to_string();
    auto collection = (*store)->collection("default");
    ASSERT_TRUE(collection.ok());
    ASSERT_TRUE((*collection)->verify().ok()) << "round " << round;
    ASSERT_GE((*collection)->size(), acknowledged) << "round " << round;
    // Every acknowledged row holds what was sent (ids are dense from 0, batch by batch).
    for (std::uint64_t first = 0; first + kBatch <= acknowledged; first += kBatch * 7) {
      auto expected = random_vectors(kBatch, kDim, first);
      auto record = (*collection)->get(first + kBatch - 1);
      ASSERT_TRUE(record.ok()) << first;
      ASSERT_EQ(
          std::memcmp(record->vector.data(), &expected[(kBatch - 1) * kDim], kDim * sizeof(float)),
          0);
    }
    acknowledged = (*collection)->size();  // a batch committed but not acknowledged counts too
    next_id = acknowledged;
  }
  EXPECT_GT(acknowledged, 0u);
  EXPECT_GT(killed_mid_batch, 0) << "no kill landed while a batch was in flight";
  RecordProperty("killed_mid_batch", killed_mid_batch);
}

// DLPack from host memory commits straight from the tensor's pointer; device tensors need CUDA.
TEST(IngestDlpack, CpuTensorCommitsAndBadTensorsAreRefused) {
  TempDir dir("gpuopt-ingest-test");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok());
  auto collection = (*store)->create_collection("default", {kDim, Metric::kL2});
  ASSERT_TRUE(collection.ok());
  auto vectors = random_vectors(8, kDim, 11);
  std::int64_t shape[2] = {8, static_cast<std::int64_t>(kDim)};
  std::int64_t strides[2] = {static_cast<std::int64_t>(kDim), 1};
  DLTensor tensor{vectors.data(), {1, 0}, 2, {2, 32, 1}, shape, strides, 0};
  auto ids = id_range(1000, 8);
  Status added = (*collection)->add_dlpack(ids, tensor, nullptr);
  ASSERT_TRUE(added.ok()) << added.to_string();
  EXPECT_EQ((*collection)->size(), 8u);
  auto record = (*collection)->get(1003);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(std::memcmp(record->vector.data(), &vectors[3 * kDim], kDim * sizeof(float)), 0);

  // byte_offset selects rows 2.. of the same buffer; upsert replaces ids 1000..1005.
  std::int64_t shape6[2] = {6, static_cast<std::int64_t>(kDim)};
  DLTensor offset{vectors.data(), {1, 0}, 2, {2, 32, 1}, shape6, nullptr, 2 * kDim * sizeof(float)};
  ASSERT_TRUE((*collection)->add_dlpack(id_range(1000, 6), offset, nullptr, {}, true).ok());
  record = (*collection)->get(1000);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(std::memcmp(record->vector.data(), &vectors[2 * kDim], kDim * sizeof(float)), 0);
  EXPECT_EQ((*collection)->size(), 8u);

  auto refused = [&](DLTensor t, std::span<const std::uint64_t> i, const std::string& words) {
    Status status = (*collection)->add_dlpack(i, t, nullptr);
    EXPECT_FALSE(status.ok()) << words;
    EXPECT_NE(status.message().find(words), std::string::npos) << status.message();
  };
  auto more = id_range(2000, 8);
  std::int64_t transposed[2] = {1, 8};
  refused({vectors.data(), {1, 0}, 2, {2, 32, 1}, shape, transposed, 0}, more, "row-major");
  refused({vectors.data(), {1, 0}, 2, {2, 16, 1}, shape, nullptr, 0}, more, "float32");
  refused({vectors.data(), {1, 0}, 1, {2, 32, 1}, shape, nullptr, 0}, more, "2-D");
  refused({vectors.data(), {1, 0}, 2, {2, 32, 1}, shape, nullptr, 0}, id_range(0, 7), "8 rows");
  refused({vectors.data(), {7, 0}, 2, {2, 32, 1}, shape, nullptr, 0}, more, "device type 7");
  std::int64_t wrong_dim[2] = {8, static_cast<std::int64_t>(kDim) - 1};
  refused({vectors.data(), {1, 0}, 2, {2, 32, 1}, wrong_dim, nullptr, 0}, more, "dimension");
  Status device =
      (*collection)
          ->add_dlpack(more, {vectors.data(), {2, 0}, 2, {2, 32, 1}, shape, nullptr, 0}, nullptr);
  EXPECT_FALSE(device.ok()) << "a host pointer labelled as CUDA memory must not be accepted";
#if !GPUOPT_CUDA
  EXPECT_EQ(device.code(), StatusCode::kUnimplemented) << device.to_string();
  EXPECT_EQ((*collection)->add_device(more, vectors.data(), nullptr).code(),
            StatusCode::kUnimplemented);
#endif
  EXPECT_EQ((*collection)->size(), 8u);
}

}  // namespace
}  // namespace gpuopt::vector
