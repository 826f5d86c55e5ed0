// Loader in CPU mode: every sample once per epoch in sampler order with the right bytes, skip/stop
// policies, worker exceptions, shutdown mid-epoch, memory budget, depth decisions in stats.
#include "gpuopt/data/loader.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace gpuopt::data {
namespace {

std::shared_ptr<Dataset> synthetic(SyntheticOptions options) {
  return std::shared_ptr<Dataset>(make_synthetic(options));
}

SyntheticOptions quick_source(std::size_t samples, std::size_t sample_bytes = 64) {
  SyntheticOptions options;
  options.samples = samples;
  options.sample_bytes = sample_bytes;
  options.median_us = 0;
  return options;
}

void expect_sample(const Batch& batch, std::size_t position, std::size_t sample_bytes) {
  std::size_t index = batch.indices()[position];
  for (std::size_t w = 0; w < sample_bytes / 8; ++w) {
    std::uint64_t word;
    std::memcpy(&word, batch.host() + position * sample_bytes + w * 8, 8);
    ASSERT_EQ(word, synthetic_word(index, w)) << "sample " << index << " word " << w;
  }
}

TEST(Loader, DeliversEverySampleOncePerEpochInSamplerOrder) {
  LoaderOptions options;
  options.batch_size = 7;
  options.workers = 3;
  options.epochs = 2;
  options.sampler = {SamplerKind::kShuffled, 9, false};
  auto loader = Loader::create(synthetic(quick_source(50)), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  Sampler sampler(50, options.sampler);
  std::vector<std::size_t> seen[2];
  std::uint64_t expected_sequence = 0;
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    Batch& b = **batch;
    EXPECT_EQ(b.sequence(), expected_sequence++);
    ASSERT_LT(b.epoch(), 2u);
    EXPECT_EQ(b.device(), nullptr);
    for (std::size_t p = 0; p < b.size(); ++p) expect_sample(b, p, 64);
    seen[b.epoch()].insert(seen[b.epoch()].end(), b.indices().begin(), b.indices().end());
    ASSERT_TRUE((*loader)->release(b).ok());
  }
  EXPECT_EQ(seen[0], sampler.epoch_order(0));
  EXPECT_EQ(seen[1], sampler.epoch_order(1));
  auto again = (*loader)->next();  // stays at the end
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  LoaderStats stats = (*loader)->stats();
  EXPECT_EQ(stats.batches, 16u);  // ceil(50 / 7) = 8 per epoch
  EXPECT_EQ(stats.samples, 100u);
  EXPECT_EQ(stats.skipped_samples, 0u);
  ASSERT_FALSE(stats.depth_timeline.empty());
  EXPECT_NE(stats.depth_timeline.front().reason.find("initial"), std::string::npos);
  EXPECT_EQ(to_json(stats)["batches"], 16);
}

TEST(Loader, SkipAndCountDropsBadSamplesAndNamesThem) {
  SyntheticOptions source = quick_source(40);
  source.corrupt_indices = {5, 17, 18};
  LoaderOptions options;
  options.batch_size = 8;
  options.workers = 2;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  std::vector<std::size_t> delivered;
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    for (std::size_t p = 0; p < (*batch)->size(); ++p) expect_sample(**batch, p, 64);
    delivered.insert(delivered.end(), (*batch)->indices().begin(), (*batch)->indices().end());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  std::vector<std::size_t> expected;
  for (std::size_t i = 0; i < 40; ++i) {
    if (!source.corrupt_indices.count(i)) expected.push_back(i);
  }
  EXPECT_EQ(delivered, expected);
  LoaderStats stats = (*loader)->stats();
  EXPECT_EQ(stats.skipped_samples, 3u);
  ASSERT_EQ(stats.failures.size(), 3u);
  std::set<std::size_t> failed;
  for (const auto& f : stats.failures) {
    failed.insert(f.index);
    EXPECT_NE(f.message.find("sample " + std::to_string(f.index)), std::string::npos);
  }
  EXPECT_EQ(failed, source.corrupt_indices);
}

TEST(Loader, AFullyBadBatchIsSkipped) {
  SyntheticOptions source = quick_source(12);
  source.corrupt_indices = {4, 5, 6, 7};
  LoaderOptions options;
  options.batch_size = 4;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  std::vector<std::uint64_t> sequences;
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok());
    if (!batch->has_value()) break;
    sequences.push_back((*batch)->sequence());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  EXPECT_EQ(sequences, (std::vector<std::uint64_t>{0, 2}));
}

TEST(Loader, StopPolicyReturnsTheFirstBadSample) {
  SyntheticOptions source = quick_source(64);
  source.corrupt_indices = {20};
  LoaderOptions options;
  options.batch_size = 8;
  options.on_error = ErrorPolicy::kStop;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  Status final_status;
  for (int i = 0; i < 100; ++i) {
    auto batch = (*loader)->next();
    if (!batch.ok()) {
      final_status = batch.status();
      break;
    }
    ASSERT_TRUE(batch->has_value()) << "ended without reporting the bad sample";
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  EXPECT_EQ(final_status.code(), StatusCode::kDataLoss);
  EXPECT_NE(final_status.message().find("sample 20"), std::string::npos);
  // The error is sticky.
  EXPECT_EQ((*loader)->next().status().code(), StatusCode::kDataLoss);
}

TEST(Loader, AWorkerExceptionEndsTheRunWithoutDeadlock) {
  SyntheticOptions source = quick_source(256);
  source.throwing_indices = {33};
  LoaderOptions options;
  options.batch_size = 8;
  options.workers = 4;
  options.on_error = ErrorPolicy::kSkipAndCount;  // exceptions are bugs: never skipped
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  Status final_status;
  for (int i = 0; i < 100; ++i) {
    auto batch = (*loader)->next();
    if (!batch.ok()) {
      final_status = batch.status();
      break;
    }
    ASSERT_TRUE(batch->has_value());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  EXPECT_EQ(final_status.code(), StatusCode::kInternal);
  EXPECT_NE(final_status.message().find("sample 33"), std::string::npos);
}

TEST(Loader, ShutdownInTheMiddleOfAnEpochIsClean) {
  SyntheticOptions source = quick_source(100000);
  source.median_us = 200;  // workers are mid-sample when the loader goes away
  LoaderOptions options;
  options.batch_size = 16;
  options.workers = 4;
  options.depth.initial_depth = 6;
  for (int round = 0; round < 3; ++round) {
    auto loader = Loader::create(synthetic(source), options);
    ASSERT_TRUE(loader.ok());
    auto held = (*loader)->next();  // the consumer still holds a batch at destruction
    ASSERT_TRUE(held.ok());
    ASSERT_TRUE(held->has_value());
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
}

TEST(Loader, StopWakesAWaitingConsumer) {
  SyntheticOptions source = quick_source(1000);
  source.median_us = 200000;  // nothing is ready for a long time
  source.mode = CostMode::kSleep;
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 1;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (*loader)->stop();
  });
  auto batch = (*loader)->next();
  stopper.join();
  EXPECT_EQ(batch.status().code(), StatusCode::kCancelled);
}

TEST(Loader, NextForTimesOutThenDeliversTheSameBatch) {
  SyntheticOptions source = quick_source(8);
  source.median_us = 150000;  // the first batch takes 150 ms
  source.mode = CostMode::kSleep;
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 4;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok());
  auto early = (*loader)->next_for(0.01);
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  std::vector<std::size_t> seen;
  while (true) {
    auto batch = (*loader)->next_for(0.05);
    if (!batch.ok()) {
      ASSERT_EQ(batch.status().code(), StatusCode::kDeadlineExceeded) << batch.status().message();
      continue;
    }
    if (!batch->has_value()) break;
    for (std::size_t i = 0; i < (*batch)->size(); ++i) expect_sample(**batch, i, 64);
    seen.insert(seen.end(), (*batch)->indices().begin(), (*batch)->indices().end());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  EXPECT_EQ(seen, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_GT((*loader)->stats().consumer_wait_s, 0.1);  // timed-out waits count as waiting
}

TEST(Loader, MemoryNeverExceedsThePinnedBudget) {
  // A bursty producer and a slow consumer push the controller to grow; the budget holds 6
  // batches (5.4 after 10% headroom, minus 1 held → depth bound 4).
  SyntheticOptions source = quick_source(4000, 256);
  source.distribution = CostDistribution::kPeriodicStall;
  source.mode = CostMode::kSleep;
  source.median_us = 20;
  source.stall_every = 64;
  source.stall_us = 5000;
  LoaderOptions options;
  options.batch_size = 8;  // 2 KiB batches
  options.workers = 4;
  options.pinned_budget_bytes = 6 * 2048;
  options.depth.initial_depth = 1;
  options.depth.window_batches = 4;
  auto loader = Loader::create(synthetic(source), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  std::size_t batches = 0;
  while (batches < 150) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    while (std::chrono::steady_clock::now() < deadline) {
    }
    LoaderStats stats = (*loader)->stats();
    ASSERT_LE(stats.pinned_bytes_peak, options.pinned_budget_bytes);
    ASSERT_LE(stats.depth, stats.depth_upper_bound);
    ASSERT_TRUE((*loader)->release(**batch).ok());
    ++batches;
  }
  LoaderStats stats = (*loader)->stats();
  EXPECT_EQ(stats.depth_upper_bound, 4u);
  EXPECT_LE(stats.max_depth_reached, 4u);
  EXPECT_LE(stats.pinned_bytes_peak, options.pinned_budget_bytes);
  EXPECT_GT(stats.pinned_bytes_peak, 0u);
}

// Samples that cost nothing, but the first read waits `startup`: workers that take a while to
// start (opening files, forking) before a steady, fast stream.
class SlowStart final : public Dataset {
 public:
  SlowStart(std::size_t samples, std::chrono::milliseconds startup)
      : samples_(samples), startup_(startup) {}
  std::size_t size() const override { return samples_; }
  std::size_t sample_bytes() const override { return 64; }
  Status read(std::size_t index, std::span<std::byte> out) override {
    if (!started_.exchange(true)) std::this_thread::sleep_for(startup_);
    std::memset(out.data(), static_cast<int>(index & 0xff), out.size());
    return ok_status();
  }
  std::string describe() const override { return "slow start"; }

 private:
  std::size_t samples_;
  std::chrono::milliseconds startup_;
  std::atomic<bool> started_{false};
};

TEST(Loader, StartUpIsNotAStallTheDepthGrowsFor) {
  // The consumer waits 150 ms for the first batch, then never (8 workers, 10 ms of consumer work
  // per batch: the producers are far ahead, so no producer-bound hold): a window that counted the
  // start-up would read a deficit of about 15 batches and grow the depth for nothing.
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 8;
  options.depth.window_batches = 4;
  auto loader =
      Loader::create(std::make_shared<SlowStart>(400, std::chrono::milliseconds(150)), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  for (int i = 0; i < 30; ++i) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    ASSERT_TRUE(batch->has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  LoaderStats stats = (*loader)->stats();
  EXPECT_GT(stats.consumer_wait_s, 0.1);  // the start-up wait still counts in the stats
  for (const auto& d : stats.depth_timeline) {
    EXPECT_EQ(d.reason.find("grow"), std::string::npos) << d.reason;
  }
  EXPECT_EQ(stats.max_depth_reached, 2u);
}

TEST(Loader, ShrinksUnderReportedMemoryPressureAndShowsWhy) {
  std::atomic<int> polls{0};
  LoaderOptions options;
  options.batch_size = 4;
  options.depth.initial_depth = 8;
  options.depth.window_batches = 2;
  options.memory_pressure_probe = [&polls] { return ++polls >= 3; };
  auto loader = Loader::create(synthetic(quick_source(400)), options);
  ASSERT_TRUE(loader.ok());
  for (int i = 0; i < 40; ++i) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok());
    ASSERT_TRUE(batch->has_value());
    ASSERT_TRUE((*loader)->release(**batch).ok());
  }
  LoaderStats stats = (*loader)->stats();
  EXPECT_LT(stats.depth, 8u);
  bool shrink_seen = false;
  for (const auto& d : stats.depth_timeline) {
    shrink_seen |= d.reason.find("shrink") != std::string::npos;
  }
  EXPECT_TRUE(shrink_seen);
}

TEST(Loader, AConsumerHoldingEveryBufferGetsAnErrorNotAHang) {
  LoaderOptions options;
  options.batch_size = 4;
  options.pinned_budget_bytes = 3 * 4 * 64;  // three batches' worth
  options.headroom = 0;
  options.depth.initial_depth = 8;
  auto loader = Loader::create(synthetic(quick_source(400)), options);
  ASSERT_TRUE(loader.ok());
  std::vector<Batch> held;
  Status final_status;
  for (int i = 0; i < 10; ++i) {
    auto batch = (*loader)->next();
    if (!batch.ok()) {
      final_status = batch.status();
      break;
    }
    held.push_back(std::move(**batch));
  }
  EXPECT_EQ(final_status.code(), StatusCode::kResourceExhausted) << final_status.to_string();
  EXPECT_LE(held.size(), 3u);
  for (auto& batch : held) EXPECT_TRUE((*loader)->release(batch).ok());
  auto after = (*loader)->next();  // released: the loader continues
  EXPECT_TRUE(after.ok()) << after.status().to_string();
}

// A record file whose cuFile library is missing: the loader reads with pread, says so in its stats
// and JSON, and every batch holds the file's bytes for its indices.
TEST(Loader, RecordFileWithoutCufileReadsWithPreadAndReportsIt) {
  auto path = std::filesystem::temp_directory_path() /
              ("gpuopt_loader_records_" + std::to_string(::getpid()) + ".bin");
  constexpr std::size_t kRecord = 96, kRecords = 41;
  std::mt19937 engine(::testing::UnitTest::GetInstance()->random_seed());
  std::vector<unsigned char> bytes(kRecord * kRecords);
  for (auto& b : bytes) b = static_cast<unsigned char>(engine());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  RecordFileOptions record{path.string(), kRecord, RecordIo::kAuto};
  record.cufile_libraries = {"libgpuopt-test-missing-cufile.so.0"};
  GdsProbe probe;
  auto dataset = open_record_file(record, &probe);
  std::filesystem::remove(path);  // the open descriptors keep the data readable
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  EXPECT_EQ(probe.io, "pread");
  LoaderOptions options;
  options.batch_size = 5;
  options.workers = 3;
  options.sampler = {SamplerKind::kShuffled, 3, false};
  auto loader = Loader::create(std::shared_ptr<Dataset>(std::move(dataset).value()), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  std::size_t samples = 0;
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    Batch& b = **batch;
    for (std::size_t p = 0; p < b.size(); ++p) {
      ASSERT_EQ(
          std::memcmp(b.host() + p * kRecord, bytes.data() + b.indices()[p] * kRecord, kRecord), 0)
          << "record " << b.indices()[p];
    }
    samples += b.size();
    ASSERT_TRUE((*loader)->release(b).ok());
  }
  EXPECT_EQ(samples, kRecords);
  LoaderStats stats = (*loader)->stats();
  EXPECT_EQ(stats.io, "pread");
  EXPECT_FALSE(stats.io_detail.empty());
  EXPECT_EQ(to_json(stats)["io"], "pread");
  EXPECT_NE((*loader)->notes().find("pread"), std::string::npos) << (*loader)->notes();
}

TEST(Loader, RejectsBadOptions) {
  auto source = synthetic(quick_source(10));
  LoaderOptions options;
  options.batch_size = 0;
  EXPECT_EQ(Loader::create(source, options).status().code(), StatusCode::kInvalidArgument);
  options.batch_size = 4;
  options.workers = 0;
  EXPECT_EQ(Loader::create(source, options).status().code(), StatusCode::kInvalidArgument);
  options.workers = 1;
  options.pinned_budget_bytes = 100;  // less than one batch of 256 B
  EXPECT_EQ(Loader::create(source, options).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Loader::create(nullptr, LoaderOptions{}).status().code(), StatusCode::kInvalidArgument);
#if !GPUOPT_CUDA
  options = LoaderOptions{};
  options.mode = LoaderMode::kGpu;
  EXPECT_EQ(Loader::create(source, options).status().code(), StatusCode::kUnimplemented);
#endif
}

}  // namespace
}  // namespace gpuopt::data
