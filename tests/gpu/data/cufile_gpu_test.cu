// cuFile read path on a GPU: records read by cuFileRead straight into device memory equal the
// file's bytes and pread's; loader batches through cuFile equal the pread + pinned + H2D path bit
// for bit (also with a truncated record skipped and a slow consumer forcing buffer reuse). Skips,
// with cuFile's reason, where the library or its driver cannot be opened.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/data/dataset.hpp"
#include "gpuopt/data/loader.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::data {
namespace {

// Holds the consumer stream for `ns`: the loader runs ahead and has to wait before it rewrites a
// device buffer that cuFile fills from the host side, outside any stream.
__global__ void k_spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// A scratch folder on a real disk when the GPU machine provides one (/tmp may be tmpfs, where
// O_DIRECT is refused and cuFile has to use its compatibility path).
std::filesystem::path scratch_dir() {
  const char* chosen = std::getenv("GPUOPT_CUFILE_TEST_DIR");
  std::filesystem::path base =
      chosen != nullptr ? std::filesystem::path(chosen) : std::filesystem::temp_directory_path();
  auto dir = base / ("gpuopt_cufile_test_" + std::to_string(::getpid()) + "_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<unsigned char> write_random(const std::string& path, std::size_t bytes,
                                        std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<unsigned char> data(bytes);
  for (std::size_t i = 0; i + 8 <= bytes; i += 8) {
    std::uint64_t word = engine();
    std::memcpy(data.data() + i, &word, 8);
  }
  for (std::size_t i = bytes / 8 * 8; i < bytes; ++i)
    data[i] = static_cast<unsigned char>(engine());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(bytes));
  return data;
}

class CufileRecordFile : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CufileRecordFile, DeviceReadsEqualTheFileAndPread) {
  GPUOPT_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::size_t record = GetParam();
  constexpr std::size_t kRecords = 64;
  auto dir = scratch_dir();
  std::string path = (dir / "records.bin").string();
  auto seed = ::testing::UnitTest::GetInstance()->random_seed();
  auto bytes = write_random(path, kRecords * record + 100, seed);  // + a truncated record

  RecordFileOptions options{path, record, RecordIo::kCufile};
  GdsProbe probe;
  auto opened = open_record_file(options, &probe);
  if (!opened.ok() && opened.status().code() == StatusCode::kUnavailable) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cuFile cannot be used here: " << opened.status().message();
  }
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto& dataset = *opened;
  DeviceReader* reader = dataset->device_reader();
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(probe.io, "cufile");
  EXPECT_FALSE(probe.cufile_mode.empty());
  std::printf("cuFile: %s\n", probe.message.c_str());

  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kRecords * record), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0xA5, kRecords * record), cudaSuccess);  // poison
  Status registered = reader->register_buffer(device, kRecords * record);
  if (!registered.ok()) std::printf("unregistered buffer: %s\n", registered.message().c_str());
  // Shuffled placement: record order[i] goes to slot i, so an offset mix-up shows.
  std::vector<std::size_t> order(kRecords);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (std::size_t slot = 0; slot < kRecords; ++slot) {
    Status read = reader->read(order[slot], device, slot * record);
    ASSERT_TRUE(read.ok()) << read.to_string();
  }
  std::vector<unsigned char> host(kRecords * record, 0x5A);
  ASSERT_EQ(cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<std::byte> preads(record, std::byte{0xEE});
  std::size_t mismatched = 0;
  for (std::size_t slot = 0; slot < kRecords; ++slot) {
    ASSERT_TRUE(dataset->read(order[slot], preads).ok());
    mismatched +=
        std::memcmp(host.data() + slot * record, bytes.data() + order[slot] * record, record) != 0;
    mismatched += std::memcmp(host.data() + slot * record, preads.data(), record) != 0;
  }
  EXPECT_EQ(mismatched, 0u);

  Status truncated = reader->read(kRecords, device, 0);
  EXPECT_EQ(truncated.code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.message().find("record " + std::to_string(kRecords)), std::string::npos);
  EXPECT_NE(truncated.message().find(path), std::string::npos) << truncated.message();
  EXPECT_EQ(reader->read(kRecords + 1, device, 0).code(), StatusCode::kOutOfRange);

  if (registered.ok()) reader->deregister_buffer(device);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
  std::filesystem::remove_all(dir);
}

// 16 KiB records qualify for O_DIRECT; 4096 + 64 B records cannot and use the page cache.
INSTANTIATE_TEST_SUITE_P(RecordSizes, CufileRecordFile, ::testing::Values(16384, 4096 + 64));

struct Delivered {
  std::vector<std::vector<std::size_t>> indices;
  std::vector<std::vector<unsigned char>> bytes;
  LoaderStats stats;
  std::string notes;
};

void run_loader(std::shared_ptr<Dataset> dataset, std::uint64_t seed,
                unsigned long long consumer_ns, Delivered* out) {
  LoaderOptions options;
  options.mode = LoaderMode::kGpu;
  options.batch_size = 12;
  options.workers = 4;
  options.epochs = 2;
  options.sampler = {SamplerKind::kShuffled, seed, false};
  options.depth.adaptive = false;
  options.depth.initial_depth = 3;
  options.on_error = ErrorPolicy::kSkipAndCount;
  std::size_t batch_bytes = options.batch_size * dataset->sample_bytes();
  options.device_budget_bytes = 6 * batch_bytes;  // few buffers: reuse is frequent
  auto loader = Loader::create(dataset, options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  auto device = runtime::Device::open(0);
  ASSERT_TRUE(device.ok());
  auto stream = runtime::Stream::create(*device);
  ASSERT_TRUE(stream.ok());
  auto cuda_stream = static_cast<cudaStream_t>(stream->handle());
  unsigned char* staging = nullptr;
  ASSERT_EQ(cudaMallocHost(&staging, batch_bytes), cudaSuccess);
  while (true) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    if (!batch->has_value()) break;
    Batch& b = **batch;
    ASSERT_NE(b.device(), nullptr);
    std::memset(staging, 0xA5, batch_bytes);  // poison
    ASSERT_TRUE(b.wait_on(stream->handle()).ok());
    if (consumer_ns > 0) k_spin<<<1, 1, 0, cuda_stream>>>(consumer_ns);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(staging, b.device(), b.bytes(), cudaMemcpyDeviceToHost, cuda_stream),
              cudaSuccess);
    ASSERT_TRUE((*loader)->release(b, stream->handle()).ok());
    ASSERT_EQ(cudaStreamSynchronize(cuda_stream), cudaSuccess);
    out->indices.push_back(b.indices());
    out->bytes.emplace_back(staging, staging + b.bytes());
  }
  out->stats = (*loader)->stats();
  out->notes = (*loader)->notes();
  cudaFreeHost(staging);
}

class LoaderCufile : public ::testing::TestWithParam<unsigned long long> {};

TEST_P(LoaderCufile, BatchesMatchThePreadPathBitForBit) {
  GPUOPT_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  constexpr std::size_t kRecord = 8192, kRecords = 150;
  auto dir = scratch_dir();
  std::string path = (dir / "records.bin").string();
  auto seed = ::testing::UnitTest::GetInstance()->random_seed();
  // The last record is truncated: both paths skip it and squeeze its batch together.
  auto bytes = write_random(path, (kRecords - 1) * kRecord + 1000, seed + 1);

  auto cufile = open_record_file({path, kRecord, RecordIo::kCufile});
  if (!cufile.ok() && cufile.status().code() == StatusCode::kUnavailable) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cuFile cannot be used here: " << cufile.status().message();
  }
  ASSERT_TRUE(cufile.ok()) << cufile.status().to_string();
  auto pread = open_record_file({path, kRecord, RecordIo::kPread});
  ASSERT_TRUE(pread.ok()) << pread.status().to_string();

  Delivered through_cufile, through_pread;
  run_loader(std::shared_ptr<Dataset>(std::move(cufile).value()), seed, GetParam(),
             &through_cufile);
  run_loader(std::shared_ptr<Dataset>(std::move(pread).value()), seed, 0, &through_pread);
  EXPECT_EQ(through_cufile.stats.io, "cufile") << through_cufile.notes;
  EXPECT_EQ(through_pread.stats.io, "pread");
  EXPECT_EQ(through_cufile.stats.h2d_bytes, 0u);        // no staging copies on the cuFile path
  EXPECT_EQ(through_cufile.stats.skipped_samples, 2u);  // the truncated record, twice
  EXPECT_EQ(through_pread.stats.skipped_samples, 2u);
  ASSERT_EQ(through_cufile.indices, through_pread.indices);
  ASSERT_EQ(through_cufile.bytes.size(), through_pread.bytes.size());
  std::size_t mismatched_batches = 0, mismatched_samples = 0, samples = 0;
  for (std::size_t b = 0; b < through_cufile.bytes.size(); ++b) {
    mismatched_batches += through_cufile.bytes[b] != through_pread.bytes[b];
    for (std::size_t p = 0; p < through_cufile.indices[b].size(); ++p) {
      ++samples;
      mismatched_samples +=
          std::memcmp(through_cufile.bytes[b].data() + p * kRecord,
                      bytes.data() + through_cufile.indices[b][p] * kRecord, kRecord) != 0;
    }
  }
  EXPECT_EQ(mismatched_batches, 0u);
  EXPECT_EQ(mismatched_samples, 0u);
  EXPECT_EQ(samples, 2 * (kRecords - 1));
  std::printf("cuFile loader: %s | %s\n", through_cufile.stats.io_detail.c_str(),
              through_cufile.notes.c_str());
  std::filesystem::remove_all(dir);
}

// 0: a fast consumer; 300 us per batch: buffers are rewritten only after the consumer is done.
INSTANTIATE_TEST_SUITE_P(Consumers, LoaderCufile, ::testing::Values(0ull, 300000ull));

TEST(LoaderCufile, DeviceReadsOffFallsBackToStaging) {
  GPUOPT_REQUIRE_GPU();
  auto dir = scratch_dir();
  std::string path = (dir / "records.bin").string();
  write_random(path, 40 * 4096, 5);
  auto cufile = open_record_file({path, 4096, RecordIo::kCufile});
  if (!cufile.ok() && cufile.status().code() == StatusCode::kUnavailable) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cuFile cannot be used here: " << cufile.status().message();
  }
  ASSERT_TRUE(cufile.ok());
  LoaderOptions options;
  options.mode = LoaderMode::kGpu;
  options.batch_size = 8;
  options.device_reads = false;
  auto loader = Loader::create(std::shared_ptr<Dataset>(std::move(cufile).value()), options);
  ASSERT_TRUE(loader.ok()) << loader.status().to_string();
  EXPECT_EQ((*loader)->stats().io, "pread");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpuopt::data
