// The vector server against careless and hostile clients: idle connections that declare large
// frames, a sender killed mid-stream, a client of another uid, a client that shrinks its shared
// memory while the server reads it, and memfd payloads that are not what they claim.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "gpuopt/vector/store.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUOPT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GPUOPT_TEST_SANITIZED 1
#endif
#endif

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 16;

class HostileClients : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::open(dir_.path() / "store", {.create = true});
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->create_collection("default", {kDim, Metric::kL2}).ok());
    socket_ = dir_.path() / "ingest.sock";
    IngestServerOptions options;
    options.receive_timeout_s = 10;
    options.on_error = [this](const IngestReply& reply) {
      std::lock_guard lock(errors_mutex_);
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
    auto client = IngestClient::connect(socket_, 20);
    EXPECT_TRUE(client.ok()) << client.status().to_string();
    return client.ok() ? std::move(*client) : nullptr;
  }
  // A bare connection, for clients that do not speak the protocol properly.
  int raw_connect() {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, socket_.c_str());
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  }

  TempDir dir_{"gpuopt-ingest-hostile"};
  std::unique_ptr<Store> store_;
  fs::path socket_;
  std::unique_ptr<IngestServer> server_;
  std::thread thread_;
  Status served_;
  std::mutex errors_mutex_;
  std::vector<std::string> errors_;
};

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// What this process's descriptors point at ("memfd:..." for the memfds a client sent).
std::multiset<std::string> open_descriptors() {
  std::multiset<std::string> targets;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    targets.insert(fs::read_symlink(entry.path(), error).string());
  }
  return targets;
}

IngestRequest add_request(IngestPayload payload, std::vector<std::uint64_t> ids) {
  IngestRequest request;
  request.op = IngestOp::kAdd;
  request.payload = payload;
  request.collection = "default";
  request.dim = kDim;
  request.rows = ids.size();
  request.request_id = 77;
  request.ids = std::move(ids);
  return request;
}

// A named shm object with a random gpuopt name, mode 0600, `bytes` long; returns its descriptor.
int make_named_shm(std::size_t bytes, std::string* name) {
  std::mt19937_64 rng(std::random_device{}());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  *name = std::string(kIngestShmPrefix) + hex;
  int fd = shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(fchmod(fd, 0600), 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

// Twelve connections that each declare the largest frame and then stall: the server must not set
// aside the declared 64 MiB for each of them.
TEST_F(HostileClients, IdleConnectionsThatDeclareLargeFramesCostLittle) {
#ifdef GPUOPT_TEST_SANITIZED
  GTEST_SKIP() << "a sanitizer build's resident set says nothing about the server's allocations";
#endif
  auto client = connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->count("default").ok());
  const std::size_t before = resident_bytes();
  std::vector<int> idle;
  for (int i = 0; i < 12; ++i) {
    int fd = raw_connect();
    std::uint8_t header[4 + 16] = {};
    const std::uint32_t length = static_cast<std::uint32_t>(kIngestMaxBody);
    std::memcpy(header, &length, sizeof(length));
    ASSERT_EQ(write(fd, header, sizeof(header)), static_cast<ssize_t>(sizeof(header)));
    idle.push_back(fd);
  }
  // Each connection's thread reads its header and first bytes at once; give them the time.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const std::size_t after = resident_bytes();
  const std::size_t grown = after > before ? after - before : 0;
  EXPECT_LT(grown, std::size_t{48} << 20)
      << "12 connections that sent 20 bytes each grew the resident set by " << (grown >> 20)
      << " MiB";
  RecordProperty("resident_growth_kib", static_cast<int>(grown >> 10));
  // The server still answers while they stall.
  auto counted = client->count("default");
  ASSERT_TRUE(counted.ok()) << counted.status().to_string();
  for (int fd : idle) close(fd);
}

// A sender SIGKILLed while it streams batches must leave nothing in /dev/shm: its buffer has no
// name there to leave.
TEST_F(HostileClients, ASenderKilledMidStreamLeavesNoSharedMemory) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    auto client = IngestClient::connect(socket_, 20);
    if (!client.ok()) _exit(2);
    auto vectors = random_vectors(256, kDim, 5);
    bool told = false;
    for (std::uint64_t next = 0;; next += 256) {
      auto total = (*client)->add("default", id_range(next, 256), vectors.data(), kDim);
      if (!total.ok()) _exit(3);
      if (!told) {
        char byte = 1;
        if (write(ready[1], &byte, 1) != 1) _exit(4);
        told = true;
      }
    }
  }
  close(ready[1]);
  char byte = 0;
  const bool acknowledged = read(ready[0], &byte, 1) == 1;
  close(ready[0]);
  // What the sender holds while it streams: named shm objects, or a memfd.
  std::set<std::string> named;
  bool memfd = false;
  {
    std::ifstream maps("/proc/" + std::to_string(child) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      auto at = line.find("/dev/shm/gpuopt-ingest-");
      if (at != std::string::npos) named.insert(line.substr(at, line.find(' ', at) - at));
      if (line.find("/memfd:gpuopt-ingest") != std::string::npos) memfd = true;
    }
  }
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(acknowledged) << "the sender never got an acknowledgement";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the sender stopped by itself before it was killed";
  for (const auto& path : named) EXPECT_FALSE(fs::exists(path)) << path << " outlived its sender";
  EXPECT_TRUE(memfd) << "the sender's buffer was not an anonymous memfd";
  // The server carries on, and every acknowledged batch is there.
  auto client = connect();
  ASSERT_NE(client, nullptr);
  auto counted = client->count("default");
  ASSERT_TRUE(counted.ok()) << counted.status().to_string();
  EXPECT_GE(*counted, 256u);
  EXPECT_EQ(*counted % 256, 0u);
}

// The socket is 0600, so only a careless chmod lets another user reach it; the uid check behind
// it must then say why it refused, not leave the client with "Broken pipe".
TEST_F(HostileClients, AClientOfAnotherUidIsToldWhyItWasRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (nobody)";
  constexpr uid_t kNobody = 65534;
  ASSERT_EQ(chmod(dir_.path().c_str(), 0711), 0);
  ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);
  int result[2];
  ASSERT_EQ(pipe(result), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(result[0]);
    std::string answer;
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) {
      answer = "setuid failed";
    } else {
      auto client = IngestClient::connect(socket_, 10);
      if (!client.ok()) {
        answer = "connect: " + client.status().to_string();
      } else {
        // The server refuses and closes at once; the request then meets a closed peer.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        auto counted = (*client)->count("default");
        answer = counted.ok() ? "served" : counted.status().to_string();
      }
    }
    ssize_t ignored = write(result[1], answer.data(), answer.size());
    (void)ignored;
    _exit(0);
  }
  close(result[1]);
  std::string answer;
  char buffer[512];
  for (ssize_t n; (n = read(result[0], buffer, sizeof(buffer))) > 0;) answer.append(buffer, n);
  close(result[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_NE(answer.find("PERMISSION_DENIED"), std::string::npos) << answer;
  EXPECT_NE(answer.find("uid 65534 may not use this server"), std::string::npos) << answer;
  EXPECT_NE(answer.find("SO_PEERCRED"), std::string::npos) << answer;
}

// Past max_connections the next client is told why it is refused; the connections already open
// keep working, and a place freed by a closed one is given to the next client.
TEST(HostileClientCount, ConnectionsPastTheLimitAreToldSoAndTheRestKeepWorking) {
  TempDir dir("gpuopt-ingest-limit");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->create_collection("default", {kDim, Metric::kL2}).ok());
  IngestServerOptions options;
  options.receive_timeout_s = 10;
  options.max_connections = 2;
  const fs::path socket = dir.path() / "ingest.sock";
  auto server = IngestServer::start(store->get(), socket, options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Status served;
  std::thread thread([&] { served = (*server)->serve(); });
  auto connect = [&] {
    auto client = IngestClient::connect(socket, 20);
    EXPECT_TRUE(client.ok()) << client.status().to_string();
    return client.ok() ? std::move(*client) : nullptr;
  };
  // Each of the first two is served, so the server holds both before the third connects.
  auto first = connect();
  auto second = connect();
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(first->count("default").ok());
  ASSERT_TRUE(second->count("default").ok());
  auto third = connect();
  ASSERT_TRUE(third);
  auto refused = third->count("default");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted)
      << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("max_connections"), std::string::npos)
      << refused.status().to_string();
  EXPECT_TRUE(first->count("default").ok());
  // Closing one frees its place once the server has seen the close (it reaps at least once a
  // second).
  second.reset();
  bool served_again = false;
  for (int attempt = 0; attempt < 50 && !served_again; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto next = connect();
    served_again = next && next->count("default").ok();
  }
  EXPECT_TRUE(served_again);
  (*server)->request_stop();
  thread.join();
  EXPECT_TRUE(served.ok()) << served.to_string();
}

// A client that shrinks its named shm object while the server reads it: the server answers that
// request with an error (or commits what was there) and keeps serving; a SIGBUS would kill it.
TEST_F(HostileClients, ShrinkingSharedMemoryMidReadDoesNotStopTheServer) {
  constexpr std::size_t kRows = 8192;
  const std::size_t bytes = kRows * kDim * sizeof(float);
  std::string name;
  int fd = make_named_shm(bytes, &name);
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::thread shrinker([&] {
    while (!stop.load()) {
      (void)!ftruncate(fd, 0);
      (void)!ftruncate(fd, static_cast<off_t>(bytes));
    }
  });
  auto client = connect();
  ASSERT_NE(client, nullptr);
  int committed = 0, refused = 0;
  std::uint64_t next = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < deadline) {
    IngestRequest request = add_request(IngestPayload::kShm, id_range(next, kRows));
    request.shm_name = name;
    auto reply = client->send_raw(encode_request(request), true);
    if (!reply.ok()) {
      ADD_FAILURE() << "the server stopped answering: " << reply.status().to_string();
      break;
    }
    if (reply->code == StatusCode::kOk) {
      ++committed;
      next += kRows;
    } else {
      ++refused;
      EXPECT_TRUE(reply->message.find("shrank") != std::string::npos ||
                  reply->message.find("too small") != std::string::npos)
          << reply->message;
    }
  }
  stop = true;
  shrinker.join();
  close(fd);
  shm_unlink(name.c_str());
  EXPECT_GT(committed + refused, 0);
  RecordProperty("committed", committed);
  RecordProperty("refused", refused);
  // Another client is served, and the collection holds exactly the committed batches.
  auto other = connect();
  ASSERT_NE(other, nullptr);
  auto counted = other->count("default");
  ASSERT_TRUE(counted.ok()) << counted.status().to_string();
  EXPECT_EQ(*counted, static_cast<std::uint64_t>(committed) * kRows);
}

// memfd payloads: only a sealed memfd of the right size is mapped; everything else is refused by
// name, and no descriptor a client sent stays open in the server.
TEST_F(HostileClients, MemfdPayloadsMustBeSealedMemfdsOfTheRightSize) {
  auto client = connect();
  ASSERT_NE(client, nullptr);
  constexpr std::size_t kRows = 4;
  const std::size_t bytes = kRows * kDim * sizeof(float);
  const auto descriptors = open_descriptors();
  auto expect_reply = [&](const IngestRequest& request, int fd, StatusCode code,
                          const std::string& words) {
    auto reply = client->send_raw(encode_request(request), true, fd);
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    EXPECT_EQ(reply->code, code) << reply->message;
    EXPECT_NE(reply->message.find(words), std::string::npos) << reply->message;
    EXPECT_EQ(reply->request_id, request.request_id);
  };
  auto vectors = random_vectors(kRows, kDim, 3);
  auto memfd = [&](std::size_t size, unsigned seals) {
    int fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    EXPECT_EQ(pwrite(fd, vectors.data(), std::min(size, bytes), 0),
              static_cast<ssize_t>(std::min(size, bytes)));
    if (seals != 0) EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
  };
  const auto ids = id_range(10, kRows);
  const IngestRequest add = add_request(IngestPayload::kMemfd, ids);
  int unsealed = memfd(bytes, 0);
  expect_reply(add, unsealed, StatusCode::kInvalidArgument, "lack F_SEAL_SHRINK");
  int grow_only = memfd(bytes, F_SEAL_GROW);
  expect_reply(add, grow_only, StatusCode::kInvalidArgument, "lack F_SEAL_SHRINK");
  int small = memfd(bytes - 4, F_SEAL_SHRINK | F_SEAL_GROW);
  expect_reply(add, small, StatusCode::kInvalidArgument, "memfd payload too small");
  expect_reply(add, -1, StatusCode::kInvalidArgument, "carried 0 file descriptors");
  fs::path plain = dir_.path() / "plain";
  { std::ofstream(plain) << std::string(bytes, '\0'); }
  int file = open(plain.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  expect_reply(add, file, StatusCode::kInvalidArgument, "not a sealable memfd");
  IngestRequest count;
  count.op = IngestOp::kCount;
  count.collection = "default";
  count.request_id = 78;
  expect_reply(count, file, StatusCode::kInvalidArgument, "its payload takes none");
  // A sealed memfd of the right size commits exactly its bytes.
  int good = memfd(bytes, F_SEAL_SHRINK | F_SEAL_GROW);
  expect_reply(add, good, StatusCode::kOk, "");
  for (int fd : {unsealed, grow_only, small, file, good}) close(fd);
  auto record = store_->collection("default");
  ASSERT_TRUE(record.ok());
  for (std::size_t row = 0; row < kRows; ++row) {
    auto got = (*record)->get(ids[row]);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->vector.data(), &vectors[row * kDim], kDim * sizeof(float)), 0);
  }
  // Every descriptor the server received was closed again (the client's own are closed above);
  // the store may have opened its files for the commit, and the server's end of the connection
  // may have been accepted after the first look.
  for (const auto& target : open_descriptors()) {
    EXPECT_TRUE(descriptors.count(target) > 0 || target.find(dir_.path().string()) == 0 ||
                target.rfind("socket:", 0) == 0)
        << "a descriptor to " << target << " stayed open";
  }
}

}  // namespace
}  // namespace gpuopt::vector
