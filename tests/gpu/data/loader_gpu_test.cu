// Loader in GPU mode: every device batch holds exactly the samples its indices name (checked
// against the synthetic pattern, the CPU twin), also when a slow consumer kernel keeps device
// buffers busy while the loader reuses them; memory stays inside the budgets.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/data/loader.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::data {
namespace {

// Holds the stream for `ns` and then copies the batch to `out`: a consumer slow enough that the
// loader has to reuse device buffers while earlier kernels still read them.
__global__ void k_slow_copy(const unsigned long long* batch, std::size_t words,
                            unsigned long long ns, unsigned long long* out) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += gridDim.x * blockDim.x) {
    out[i] = batch[i];
  }
}

struct Fixture {
  std::size_t mismatched_words = 0;
  std::size_t samples = 0;
};

void run_and_check(std::uint64_t seed, unsigned long long consumer_ns, bool adaptive,
                   ErrorPolicy policy, std::set<std::size_t> corrupt, Fixture* result) {
  SyntheticOptions source;
  source.samples = 600;
  source.sample_bytes = 4096 + 64;  // not a power of two: offsets must be exact
  source.median_us = 20;
  source.corrupt_indices = corrupt;
  LoaderOptions options;
  options.mode = LoaderMode::kGpu;
  options.batch_size = 24;
  options.workers = 4;
  options.epochs = 2;
  options.sampler = {SamplerKind::kShuffled, seed, false};
  options.depth.adaptive = adaptive;
  options.depth.initial_depth = adaptive ? 2 : 3;
  options.depth.window_batches = 4;
  options.on_error = policy;
  options.pinned_budget_bytes = 16 * options.batch_size * source.sample_bytes;
  options.device_budget_bytes = 12 * options.batch_size * source.sample_bytes;
  auto loader = Loader::create(std::shared_ptr<Dataset>(make_synthetic(source)), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  auto device = runtime::Device::open(0);
  ASSERT_TRUE(device.ok());
  auto stream = runtime::Stream::create(*device);
  ASSERT_TRUE(stream.ok());
  auto cuda_stream = static_cast<cudaStream_t>(stream->handle());
  std::size_t batch_bytes = options.batch_size * source.sample_bytes;
  // Several output buffers so the checks of batch i overlap the consumption of batch i+1.
  constexpr int kRing = 3;
  runtime::DeviceBuffer out_memory[kRing];
  unsigned long long* out[kRing];
  std::vector<std::vector<unsigned long long>> host(
      kRing, std::vector<unsigned long long>(batch_bytes / 8));
  for (int r = 0; r < kRing; ++r) {
    auto buffer = runtime::DeviceBuffer::allocate(batch_bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
    out_memory[r] = std::move(buffer).value();
    out[r] = out_memory[r].data_as<unsigned long long>();
  }
  struct Pending {
    std::vector<std::size_t> indices;
    int ring = 0;
  };
  std::vector<Pending> pending;
  auto check = [&](const Pending& p) {
    for (std::size_t position = 0; position < p.indices.size(); ++position) {
      for (std::size_t w = 0; w < source.sample_bytes / 8; ++w) {
        if (host[p.ring][position * source.sample_bytes / 8 + w] !=
            synthetic_word(p.indices[position], w)) {
          ++result->mismatched_words;
        }
      }
    }
    result->samples += p.indices.size();
  };
  std::size_t count = 0;
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    Batch& b = **batch;
    ASSERT_NE(b.device(), nullptr);
    ASSERT_NE(b.ready_event(), nullptr);
    int ring = static_cast<int>(count % kRing);
    // Poison the output so a skipped copy shows.
    ASSERT_EQ(cudaMemsetAsync(out[ring], 0xA5, batch_bytes, cuda_stream), cudaSuccess);
    ASSERT_TRUE(b.wait_on(stream->handle()).ok());
    k_slow_copy<<<8, 256, 0, cuda_stream>>>(static_cast<const unsigned long long*>(b.device()),
                                            b.bytes() / 8, consumer_ns, out[ring]);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_TRUE((*loader)->release(b, stream->handle()).ok());
    ASSERT_EQ(cudaMemcpyAsync(host[ring].data(), out[ring], batch_bytes, cudaMemcpyDeviceToHost,
                              cuda_stream),
              cudaSuccess);
    // Check the batch from kRing - 1 iterations ago once its copy-back is done.
    pending.push_back({b.indices(), ring});
    if (pending.size() == kRing) {
      ASSERT_EQ(cudaStreamSynchronize(cuda_stream), cudaSuccess);
      for (const auto& p : pending) check(p);
      pending.clear();
    }
    ++count;
  }
  ASSERT_EQ(cudaStreamSynchronize(cuda_stream), cudaSuccess);
  for (const auto& p : pending) check(p);
  LoaderStats stats = (*loader)->stats();
  EXPECT_LE(stats.pinned_bytes_peak, options.pinned_budget_bytes);
  EXPECT_LE(stats.device_bytes_peak, options.device_budget_bytes);
  EXPECT_GT(stats.h2d_bytes, 0u);
  EXPECT_TRUE(stats.h2d_gbps.has_value());
  EXPECT_EQ(stats.skipped_samples, corrupt.size() * 2);  // two epochs
}

TEST(LoaderGpu, DeviceBatchesHoldExactlyTheirSamples) {
  GPUOPT_REQUIRE_GPU();
  Fixture result;
  run_and_check(::testing::UnitTest::GetInstance()->random_seed(), 0, true,
                ErrorPolicy::kSkipAndCount, {}, &result);
  EXPECT_EQ(result.samples, 1200u);
  EXPECT_EQ(result.mismatched_words, 0u);
}

TEST(LoaderGpu, BufferReuseUnderASlowConsumerHasNoRaces) {
  GPUOPT_REQUIRE_GPU();
  Fixture result;
  // 300 us per batch: the loader runs ahead and must wait on the consumer's events for reuse.
  run_and_check(::testing::UnitTest::GetInstance()->random_seed() + 1, 300000, false,
                ErrorPolicy::kSkipAndCount, {}, &result);
  EXPECT_EQ(result.samples, 1200u);
  EXPECT_EQ(result.mismatched_words, 0u);
}

TEST(LoaderGpu, SkippedSamplesAreCompactedOnTheDevice) {
  GPUOPT_REQUIRE_GPU();
  Fixture result;
  run_and_check(7, 0, true, ErrorPolicy::kSkipAndCount, {3, 100, 101, 599}, &result);
  EXPECT_EQ(result.samples, 1200u - 8u);
  EXPECT_EQ(result.mismatched_words, 0u);
}

TEST(LoaderGpu, DestroyedMidEpochWithCopiesInFlight) {
  GPUOPT_REQUIRE_GPU();
  SyntheticOptions source;
  source.samples = 100000;
  source.sample_bytes = 1 << 16;
  source.median_us = 5;
  LoaderOptions options;
  options.mode = LoaderMode::kGpu;
  options.batch_size = 16;
  options.depth.initial_depth = 8;
  for (int round = 0; round < 3; ++round) {
    auto loader = Loader::create(std::shared_ptr<Dataset>(make_synthetic(source)), options);
    ASSERT_TRUE(loader.ok()) << loader.status().to_string();
    for (int i = 0; i < 5; ++i) {
      auto batch = (*loader)->next();
      ASSERT_TRUE(batch.ok());
      ASSERT_TRUE((*loader)->release(**batch, nullptr).ok());
    }
  }
}

}  // namespace
}  // namespace gpuopt::data
