// Zero-copy ingest from GPU memory: Collection::add_device / add_dlpack on a stream, and CUDA IPC
// from another process (this binary re-executed as the sender) into a server in this process.
// Every committed row is compared byte for byte with the host values it was generated from.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "common/test_support.hpp"
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

constexpr std::size_t kDim = 96;
constexpr const char* kChildSocket = "GPUOPT_INGEST_IPC_SOCKET";
constexpr const char* kChildMode = "GPUOPT_INGEST_IPC_MODE";

void expect_rows(Collection& collection, std::uint64_t first_id, const std::vector<float>& expected,
                 std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r) {
    auto record = collection.get(first_id + r);
    ASSERT_TRUE(record.ok()) << "id " << first_id + r << ": " << record.status().to_string();
    ASSERT_EQ(std::memcmp(record->vector.data(), &expected[r * kDim], kDim * sizeof(float)), 0)
        << "id " << first_id + r;
  }
}

TEST(IngestDevice, AddDeviceAndDlpackCommitTheDeviceRows) {
  GPUOPT_REQUIRE_GPU();
  TempDir dir("gpuopt-ingest-gpu");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto collection = (*store)->create_collection("default", {kDim, Metric::kL2});
  ASSERT_TRUE(collection.ok());
  constexpr std::size_t kRows = 3000;
  auto host = random_vectors(kRows, kDim, 21);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size() * sizeof(float)), cudaSuccess);
  // Poisoned first, then the upload queued on the same stream as the ingest: stream order alone
  // must make the ingest see the uploaded values.
  ASSERT_EQ(cudaMemsetAsync(device, 0xFF, host.size() * sizeof(float), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float),
                            cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  Status added = (*collection)->add_device(id_range(0, 2000), device, stream);
  ASSERT_TRUE(added.ok()) << added.to_string();
  // The rest through DLPack: a CUDA tensor view of rows 2000.. via byte_offset.
  std::int64_t shape[2] = {static_cast<std::int64_t>(kRows - 2000),
                           static_cast<std::int64_t>(kDim)};
  int current = 0;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  DLTensor tensor{device, {2, current}, 2, {2, 32, 1}, shape, nullptr, 2000 * kDim * sizeof(float)};
  added = (*collection)->add_dlpack(id_range(2000, kRows - 2000), tensor, stream);
  ASSERT_TRUE(added.ok()) << added.to_string();
  EXPECT_EQ((*collection)->size(), kRows);
  expect_rows(**collection, 0, host, kRows);
  // A host pointer passed as device memory is refused, not read.
  Status refused = (*collection)->add_device(id_range(9000, 1), host.data(), stream);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ((*collection)->size(), kRows);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  // Durable: the rows are there after a reopen.
  collection = nullptr;
  store->reset();
  auto reopened = Store::open(dir.path() / "store");
  ASSERT_TRUE(reopened.ok());
  auto again = (*reopened)->collection("default");
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->verify().ok());
  expect_rows(**again, 0, host, kRows);
}

// The sender half of the CUDA IPC test; a no-op unless the parent test runs it.
TEST(IngestIpcChild, SendsDeviceRows) {
  const char* socket = std::getenv(kChildSocket);
  const char* mode = std::getenv(kChildMode);
  if (socket == nullptr || mode == nullptr) {
    GTEST_SKIP() << "helper process for IngestIpc.DeviceRowsFromAnotherProcess";
  }
  constexpr std::size_t kRows = 1500, kPad = 5;
  auto host = random_vectors(kRows, kDim, 33);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, (kRows + kPad) * kDim * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device + kPad * kDim, host.data(), host.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  auto client = IngestClient::connect(socket, 30);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  if (std::string(mode) == "ok") {
    // Sent from an offset inside the allocation, so the handle's offset is exercised.
    auto total = (*client)->add_device("default", id_range(0, kRows), device + kPad * kDim, kDim);
    ASSERT_TRUE(total.ok()) << total.status().to_string();
    EXPECT_EQ(*total, kRows);
  } else {
    // More rows than the allocation holds: the server must refuse, not overread.
    auto total =
        (*client)->add_device("default", id_range(50000, kRows + 10), device + kPad * kDim, kDim);
    ASSERT_FALSE(total.ok());
    EXPECT_NE(total.status().message().find("too small"), std::string::npos)
        << total.status().to_string();
  }
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

// Runs this binary again as the sender (a fresh process: CUDA does not survive fork()).
int run_child(const fs::path& socket, const std::string& mode) {
  pid_t child = fork();
  if (child == 0) {
    setenv(kChildSocket, socket.c_str(), 1);
    setenv(kChildMode, mode.c_str(), 1);
    execl("/proc/self/exe", "ingest-ipc-child", "--gtest_filter=IngestIpcChild.SendsDeviceRows",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(IngestIpc, DeviceRowsFromAnotherProcess) {
  GPUOPT_REQUIRE_GPU();
  TempDir dir("gpuopt-ingest-gpu");
  auto store = Store::open(dir.path() / "store", {.create = true});
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->create_collection("default", {kDim, Metric::kL2}).ok());
  fs::path socket = dir.path() / "ingest.sock";
  std::vector<std::string> errors;
  IngestServerOptions options;
  options.on_error = [&](const IngestReply& reply) { errors.push_back(reply.message); };
  auto server = IngestServer::start(store->get(), socket, options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Status served;
  std::thread thread([&] { served = (*server)->serve(); });
  int ok_rc = run_child(socket, "ok");
  int small_rc = run_child(socket, "too-small");
  (*server)->request_stop();
  thread.join();
  ASSERT_TRUE(served.ok()) << served.to_string();
  EXPECT_EQ(ok_rc, 0) << "the sender process failed (its output is above)";
  EXPECT_EQ(small_rc, 0) << "the oversized request was not refused as expected";
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("CUDA IPC buffer too small"), std::string::npos) << errors[0];
  auto collection = (*store)->collection("default");
  ASSERT_TRUE(collection.ok());
  EXPECT_EQ((*collection)->size(), 1500u);
  expect_rows(**collection, 0, random_vectors(1500, kDim, 33), 1500);
}

}  // namespace
}  // namespace gpuopt::vector
