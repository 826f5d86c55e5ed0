// Datasets: synthetic pattern and costs, record file (incl. a truncated last record), JPEG folder
// (decode checked against the fixture's gradient formula; bad files reported with index and path).
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/core/dynamic_library.hpp"
#include "gpuopt/data/dataset.hpp"

namespace gpuopt::data {
namespace {

std::string loader_data(const std::string& name) {
  return gpuopt::testing::test_data_dir() + "/loader/" + name;
}

TEST(SyntheticDataset, FillsTheIndexPatternAndReportsInjectedFaults) {
  SyntheticOptions options;
  options.samples = 16;
  options.sample_bytes = 40;  // 5 words
  options.median_us = 0;
  options.corrupt_indices = {3};
  options.throwing_indices = {4};
  auto dataset = make_synthetic(options);
  std::vector<std::byte> out(40, std::byte{0xAB});
  ASSERT_TRUE(dataset->read(7, out).ok());
  for (std::size_t w = 0; w < 5; ++w) {
    std::uint64_t word;
    std::memcpy(&word, out.data() + w * 8, 8);
    EXPECT_EQ(word, synthetic_word(7, w));
  }
  Status corrupt = dataset->read(3, out);
  EXPECT_EQ(corrupt.code(), StatusCode::kDataLoss);
  EXPECT_NE(corrupt.message().find("sample 3"), std::string::npos);
  EXPECT_THROW((void)dataset->read(4, out), std::runtime_error);
  EXPECT_EQ(dataset->read(16, out).code(), StatusCode::kOutOfRange);
}

TEST(SyntheticDataset, CostDistributions) {
  SyntheticOptions options;
  options.median_us = 100;
  options.distribution = CostDistribution::kConstant;
  EXPECT_DOUBLE_EQ(synthetic_cost_us(options, 5), 100);
  options.distribution = CostDistribution::kPeriodicStall;
  options.stall_every = 10;
  options.stall_us = 5000;
  EXPECT_DOUBLE_EQ(synthetic_cost_us(options, 9), 5000);
  EXPECT_DOUBLE_EQ(synthetic_cost_us(options, 19), 5000);
  EXPECT_DOUBLE_EQ(synthetic_cost_us(options, 10), 100);
  options.distribution = CostDistribution::kLognormal;
  options.sigma = 1.0;
  std::vector<double> costs;
  for (std::size_t i = 0; i < 20001; ++i) costs.push_back(synthetic_cost_us(options, i));
  EXPECT_DOUBLE_EQ(costs[123], synthetic_cost_us(options, 123));  // pure function of the index
  std::nth_element(costs.begin(), costs.begin() + 10000, costs.end());
  EXPECT_NEAR(costs[10000], 100, 5);  // the median of a lognormal is exp(mu)
  double max_cost = *std::max_element(costs.begin(), costs.end());
  EXPECT_GT(max_cost, 1000);  // exp(3.5 sigma) tail is present in 20k draws
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gpuopt_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

using RecordFileDataset = TempDir;

TEST_F(RecordFileDataset, ReadsRecordsAndReportsATruncatedLastRecord) {
  std::mt19937 engine(::testing::UnitTest::GetInstance()->random_seed());
  std::vector<unsigned char> bytes(4 * 64 + 20);
  for (auto& b : bytes) b = static_cast<unsigned char>(engine());
  std::string path = (dir_ / "records.bin").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  GdsProbe probe;
  auto dataset = open_record_file({path, 64, RecordIo::kAuto}, &probe);
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  EXPECT_FALSE(probe.message.empty());
  EXPECT_EQ((*dataset)->size(), 5u);
  std::vector<std::byte> out(64, std::byte{0xEE});
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE((*dataset)->read(i, out).ok());
    EXPECT_EQ(std::memcmp(out.data(), bytes.data() + i * 64, 64), 0) << "record " << i;
  }
  Status truncated = (*dataset)->read(4, out);
  EXPECT_EQ(truncated.code(), StatusCode::kDataLoss);
  EXPECT_NE(truncated.message().find("record 4"), std::string::npos);
  EXPECT_NE(truncated.message().find(path), std::string::npos);
  EXPECT_NE(truncated.message().find("20 of 64"), std::string::npos);
}

TEST_F(RecordFileDataset, BadArguments) {
  EXPECT_EQ(open_record_file({(dir_ / "missing").string(), 64}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(open_record_file({dir_.string(), 64}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(open_record_file({"x", 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST(GdsProbe, DisabledCufileFallsBackWithAMessage) {
  DynamicLibrary::set_disabled("CUFILE", true);
  GdsProbe probe = probe_gds();
  DynamicLibrary::set_disabled("CUFILE", false);
  EXPECT_FALSE(probe.usable);
  EXPECT_NE(probe.message.find("pread"), std::string::npos);
}

// A library name no machine has: the cuFile path must fall back (auto) or fail clearly (cufile).
const std::vector<std::string> kMissingCufile = {"libgpuopt-test-missing-cufile.so.0"};

std::vector<unsigned char> write_random_records(const std::string& path, std::size_t bytes) {
  std::mt19937 engine(::testing::UnitTest::GetInstance()->random_seed());
  std::vector<unsigned char> data(bytes);
  for (auto& b : data) b = static_cast<unsigned char>(engine());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(bytes));
  return data;
}

TEST_F(RecordFileDataset, AutoWithoutCufileFallsBackToPreadAndSaysWhy) {
  std::string path = (dir_ / "records.bin").string();
  auto bytes = write_random_records(path, 8 * 128);
  RecordFileOptions options{path, 128, RecordIo::kAuto};
  options.cufile_libraries = kMissingCufile;
  GdsProbe probe;
  probe.usable = true;  // poisoned: open must overwrite it
  auto dataset = open_record_file(options, &probe);
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.io, "pread");
  EXPECT_TRUE(probe.cufile_mode.empty());
  EXPECT_NE(probe.message.find("cuFile: libgpuopt-test-missing-cufile.so.0 not found"),
            std::string::npos)
      << probe.message;
  EXPECT_NE(probe.message.find("pread"), std::string::npos) << probe.message;
  EXPECT_EQ((*dataset)->device_reader(), nullptr);
  std::vector<std::byte> out(128, std::byte{0xEE});
  ASSERT_TRUE((*dataset)->read(5, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), bytes.data() + 5 * 128, 128), 0);
}

TEST_F(RecordFileDataset, CufileRequestedWithoutCufileIsAClearError) {
  std::string path = (dir_ / "records.bin").string();
  write_random_records(path, 4 * 128);
  RecordFileOptions options{path, 128, RecordIo::kCufile};
  options.cufile_libraries = kMissingCufile;
  auto dataset = open_record_file(options);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(dataset.status().message().find(path), std::string::npos);
  EXPECT_NE(dataset.status().message().find("not found"), std::string::npos)
      << dataset.status().message();
}

TEST_F(RecordFileDataset, DisabledCufileIsNamedInTheFallbackReason) {
  std::string path = (dir_ / "records.bin").string();
  write_random_records(path, 4 * 128);
  DynamicLibrary::set_disabled("CUFILE", true);
  GdsProbe probe;
  auto dataset = open_record_file({path, 128, RecordIo::kAuto}, &probe);
  auto insisted = open_record_file({path, 128, RecordIo::kCufile});
  DynamicLibrary::set_disabled("CUFILE", false);
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  EXPECT_EQ(probe.io, "pread");
  EXPECT_NE(probe.message.find("GPUOPT_DISABLE_CUFILE"), std::string::npos) << probe.message;
  EXPECT_EQ(insisted.status().code(), StatusCode::kUnavailable);
}

TEST_F(RecordFileDataset, PreadChosenExplicitlyNeverTouchesCufile) {
  std::string path = (dir_ / "records.bin").string();
  write_random_records(path, 4 * 128);
  GdsProbe probe;
  auto dataset = open_record_file({path, 128, RecordIo::kPread}, &probe);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(probe.io, "pread");
  EXPECT_NE(probe.message.find("pread chosen"), std::string::npos);
  EXPECT_NE(probe.message.find("not a multiple of 4096"), std::string::npos) << probe.message;
  EXPECT_EQ((*dataset)->device_reader(), nullptr);
}

// 4096-byte records may use O_DIRECT (when the file system allows it); reads into aligned and
// unaligned buffers, and the truncated last record, must give the file's bytes either way.
TEST_F(RecordFileDataset, AlignedRecordsReadTheSameWithAndWithoutODirect) {
  std::string path = (dir_ / "records.bin").string();
  constexpr std::size_t kRecord = 4096;
  auto bytes = write_random_records(path, 6 * kRecord + 100);
  for (bool direct_io : {true, false}) {
    RecordFileOptions options{path, kRecord, RecordIo::kPread};
    options.direct_io = direct_io;
    GdsProbe probe;
    auto dataset = open_record_file(options, &probe);
    ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
    if (!direct_io) EXPECT_FALSE(probe.direct_io);
    auto* aligned = static_cast<std::byte*>(std::aligned_alloc(kRecord, 2 * kRecord));
    ASSERT_NE(aligned, nullptr);
    for (std::size_t shift : {std::size_t{0}, std::size_t{8}}) {
      for (std::size_t i = 0; i < 6; ++i) {
        std::memset(aligned, 0xEE, 2 * kRecord);
        std::span<std::byte> out(aligned + shift, kRecord);
        ASSERT_TRUE((*dataset)->read(i, out).ok()) << "record " << i;
        EXPECT_EQ(std::memcmp(out.data(), bytes.data() + i * kRecord, kRecord), 0)
            << "record " << i << " shift " << shift << " O_DIRECT " << probe.direct_io;
      }
    }
    Status truncated = (*dataset)->read(6, std::span<std::byte>(aligned, kRecord));
    EXPECT_EQ(truncated.code(), StatusCode::kDataLoss);
    EXPECT_NE(truncated.message().find("100 of 4096"), std::string::npos) << truncated.message();
    std::free(aligned);
  }
}

TEST(RecordIo, ParsesItsNames) {
  for (RecordIo io : {RecordIo::kAuto, RecordIo::kPread, RecordIo::kCufile}) {
    auto parsed = parse_record_io(record_io_name(io));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, io);
  }
  auto bad = parse_record_io("gds-please");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gds-please"), std::string::npos);
}

TEST(GdsProbe, MissingLibraryIsNamed) {
  GdsProbe probe = probe_gds(kMissingCufile);
  EXPECT_FALSE(probe.usable);
  EXPECT_EQ(probe.io, "pread");
  EXPECT_NE(probe.message.find("libgpuopt-test-missing-cufile.so.0 not found"), std::string::npos)
      << probe.message;
}

TEST(JpegFolderDataset, DecodesAtNativeSizeExactlyAsLibjpegTurbo) {
  auto dataset = open_jpeg_folder({loader_data("jpeg"), 48, 64});
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  ASSERT_EQ((*dataset)->size(), 3u);  // a.jpg, b.jpg, c.JPEG
  std::vector<std::byte> out((*dataset)->sample_bytes(), std::byte{0x5A});
  ASSERT_TRUE((*dataset)->read(0, out).ok());

  std::ifstream file(loader_data("jpeg/a.jpg"), std::ios::binary);
  std::vector<unsigned char> jpeg((std::istreambuf_iterator<char>(file)), {});
  std::vector<unsigned char> expected(64 * 48 * 3);
  tjhandle handle = tjInitDecompress();
  ASSERT_EQ(
      tjDecompress2(handle, jpeg.data(), jpeg.size(), expected.data(), 64, 0, 48, TJPF_RGB, 0), 0);
  tjDestroy(handle);
  EXPECT_EQ(std::memcmp(out.data(), expected.data(), expected.size()), 0);
}

TEST(JpegFolderDataset, ResizesEveryImageToTheFixedShape) {
  const int h = 24, w = 20;
  auto dataset = open_jpeg_folder({loader_data("jpeg"), h, w});
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  EXPECT_EQ((*dataset)->sample_bytes(), static_cast<std::size_t>(h * w * 3));
  const int source_heights[] = {48, 32, 60};
  for (std::size_t i = 0; i < 3; ++i) {
    std::vector<std::byte> out((*dataset)->sample_bytes(), std::byte{0});
    ASSERT_TRUE((*dataset)->read(i, out).ok()) << i;
    int in_h = source_heights[i];
    // G = y*255/(in_h-1) is linear in y, so bilinear sampling at sy gives sy*255/(in_h-1).
    for (int y = 0; y < h; ++y) {
      double sy = std::clamp((y + 0.5) * in_h / h - 0.5, 0.0, in_h - 1.0);
      double expected = sy * 255 / (in_h - 1);
      for (int x = 0; x < w; x += 7) {
        int g = static_cast<int>(out[(y * w + x) * 3 + 1]);
        ASSERT_NEAR(g, expected, 12) << "image " << i << " y " << y << " x " << x;
      }
    }
  }
}

TEST(JpegFolderDataset, BadFilesAreDataLossNamingIndexAndFile) {
  auto dataset = open_jpeg_folder({loader_data("jpeg_bad"), 16, 16});
  ASSERT_TRUE(dataset.ok()) << dataset.status().to_string();
  ASSERT_EQ((*dataset)->size(), 4u);
  std::vector<std::byte> out((*dataset)->sample_bytes());
  EXPECT_TRUE((*dataset)->read(0, out).ok());
  EXPECT_TRUE((*dataset)->read(2, out).ok());
  for (std::size_t index : {1u, 3u}) {
    Status status = (*dataset)->read(index, out);
    EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status.to_string();
    EXPECT_NE(status.message().find("image " + std::to_string(index)), std::string::npos);
    EXPECT_NE(status.message().find(index == 1 ? "b_truncated.jpg" : "d_not_a_jpeg.jpg"),
              std::string::npos)
        << status.message();
  }
}

TEST(JpegFolderDataset, BadFolders) {
  EXPECT_EQ(open_jpeg_folder({"/nonexistent/folder"}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(open_jpeg_folder({loader_data(""), 16, 16}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(open_jpeg_folder({loader_data("jpeg"), 0, 16}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::data
