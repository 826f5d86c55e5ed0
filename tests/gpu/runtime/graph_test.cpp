// On the GPU: a captured two-stage sequence replays to the same results as eager launches and the
// CPU twin, on fresh data, after its kernel parameters change between replays.
#include "gpuopt/runtime/graph.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {
namespace {

struct Params {
  float a1, b1, a2, b2;
};

class GraphTest : public ::testing::Test {
 protected:
  static constexpr int kN = (1 << 16) + 37;  // not a multiple of the block size

  void SetUp() override {
    GPUOPT_REQUIRE_GPU();
    auto device = Device::open(0);
    ASSERT_TRUE(device.ok());
    auto stream = Stream::create(*device);
    ASSERT_TRUE(stream.ok());
    stream_ = std::move(*stream);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      auto buffer = DeviceBuffer::allocate(kN * sizeof(float));
      ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
      buffers_[i] = std::move(buffer).value();
    }
    x_ = buffers_[0].data_as<float>();
    y_ = buffers_[1].data_as<float>();
    z_ = buffers_[2].data_as<float>();
  }

  // Fresh random input on the device; returns it.
  std::vector<float> fresh_input() {
    std::vector<float> x(kN);
    std::uniform_real_distribution<float> dist(-4.f, 4.f);
    for (float& v : x) v = dist(rng_);
    EXPECT_EQ(cudaMemcpy(x_, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    // stream_ does not wait for the legacy default stream, where this copy (and the memsets
    // below) ran: without this a launch could read x, or write beside the poison, mid-copy (one
    // replay-vs-eager mismatch on the H200, 2026-11-30).
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return x;
  }
  void poison_output() {
    ASSERT_EQ(cudaMemset(z_, 0xff, kN * sizeof(float)), cudaSuccess);  // NaNs
    ASSERT_EQ(cudaMemset(y_, 0xff, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // memsets are asynchronous to the host
  }
  std::vector<float> read_output() {
    EXPECT_TRUE(stream_.synchronize().ok());
    std::vector<float> z(kN);
    EXPECT_EQ(cudaMemcpy(z.data(), z_, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return z;
  }
  static std::vector<float> reference(const std::vector<float>& x, const Params& p) {
    std::vector<float> y(kN), z(kN);
    affine_reference(x.data(), y.data(), kN, p.a1, p.b1);
    affine_reference(y.data(), z.data(), kN, p.a2, p.b2);
    return z;
  }
  StageSequence stages(const Params& p) {
    return [this, p](StreamHandle stream) -> Status {
      GPUOPT_RETURN_IF_ERROR(launch_affine(stream, x_, y_, kN, p.a1, p.b1));
      return launch_affine(stream, y_, z_, kN, p.a2, p.b2);
    };
  }

  std::mt19937 rng_{std::random_device{}()};
  Stream stream_;
  std::array<DeviceBuffer, 3> buffers_;  // x_, y_, z_
  float* x_ = nullptr;
  float* y_ = nullptr;
  float* z_ = nullptr;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 5; ++i) {
    // Two fused-or-not multiply-adds: a few ulps of the magnitude.
    float tolerance = 1e-5f * (1.f + std::abs(want[i]));
    if (!(std::abs(got[i] - want[i]) <= tolerance)) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

TEST_F(GraphTest, ReplayMatchesEagerAndCpuAfterParameterUpdate) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  Params first{dist(rng_), dist(rng_), dist(rng_), dist(rng_)};
  auto x = fresh_input();
  auto graph = StageGraph::capture(stream_.handle(), stages(first));
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  EXPECT_EQ(graph->kernel_node_count(), 2u);
  poison_output();
  ASSERT_TRUE(graph->replay(stream_.handle()).ok());
  expect_close(read_output(), reference(x, first));

  for (int round = 0; round < 3; ++round) {
    Params next{dist(rng_), dist(rng_), dist(rng_), dist(rng_)};
    ASSERT_TRUE(graph->update(stream_.handle(), stages(next)).ok());
    x = fresh_input();
    // Eager launches of the same stages on the same data are the ground truth for the replay.
    poison_output();
    ASSERT_TRUE(stages(next)(stream_.handle()).ok());
    auto eager = read_output();
    poison_output();
    ASSERT_TRUE(graph->replay(stream_.handle()).ok());
    auto replayed = read_output();
    expect_close(replayed, reference(x, next));
    EXPECT_EQ(0, std::memcmp(replayed.data(), eager.data(), kN * sizeof(float)))
        << "round " << round << ": replay differs from eager";
  }
}

TEST_F(GraphTest, SetKernelArgsChangesOneNode) {
  auto x = fresh_input();
  auto graph = StageGraph::capture(stream_.handle(), [this](StreamHandle stream) {
    return launch_affine(stream, x_, z_, kN, 1.f, 0.f);
  });
  ASSERT_TRUE(graph.ok());
  const float* in = x_;
  float* out = z_;
  int n = kN;
  float a = 3.5f, b = -1.25f;
  void* args[] = {&in, &out, &n, &a, &b};
  ASSERT_TRUE(graph->set_kernel_args(affine_kernel_function(), args).ok());
  poison_output();
  ASSERT_TRUE(graph->replay(stream_.handle()).ok());
  std::vector<float> want(kN);
  affine_reference(x.data(), want.data(), kN, a, b);
  expect_close(read_output(), want);
}

TEST_F(GraphTest, AmbiguousNodeAndBadUseAreErrors) {
  auto graph = StageGraph::capture(stream_.handle(), stages({1, 0, 1, 0}));
  ASSERT_TRUE(graph.ok());
  void* args[5] = {};
  EXPECT_EQ(graph->set_kernel_args(affine_kernel_function(), args).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(StageGraph::capture(nullptr, stages({1, 0, 1, 0})).status().code(),
            StatusCode::kInvalidArgument);
  // A failing stage ends the capture cleanly and the stream stays usable.
  auto failed = StageGraph::capture(
      stream_.handle(), [](StreamHandle) -> Status { return invalid_argument("stage refused"); });
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  poison_output();
  auto x = fresh_input();
  ASSERT_TRUE(stages({2, 1, 1, 0})(stream_.handle()).ok());
  expect_close(read_output(), reference(x, {2, 1, 1, 0}));
}

}  // namespace
}  // namespace gpuopt::runtime
