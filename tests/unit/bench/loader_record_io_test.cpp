// The record-file read suite of `gpuopt bench loader`: the --io names it accepts, the random file
// it writes, and its testcases (waived with a reason on a machine without a GPU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpuopt/bench/loader.hpp"
#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::bench::loader {
namespace {

namespace fs = std::filesystem;

TEST(LoaderRecordIo, PathNames) {
  auto compare = record_io_paths("compare");
  ASSERT_TRUE(compare.ok());
  EXPECT_EQ(*compare,
            (std::vector<data::RecordIo>{data::RecordIo::kPread, data::RecordIo::kCufile}));
  auto empty = record_io_paths("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, std::vector<data::RecordIo>{data::RecordIo::kAuto});
  auto pread = record_io_paths("pread");
  ASSERT_TRUE(pread.ok());
  EXPECT_EQ(*pread, std::vector<data::RecordIo>{data::RecordIo::kPread});
  auto bad = record_io_paths("floppy");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("floppy"), std::string::npos);
}

TEST(LoaderRecordIo, CreatesARandomFileOfTheAskedSize) {
  const fs::path path =
      fs::temp_directory_path() / ("gpuopt-record-io-" + std::to_string(::getpid()) + ".bin");
  ASSERT_TRUE(create_record_file(path.string(), 2).ok());
  EXPECT_EQ(fs::file_size(path), std::uintmax_t{2} << 20);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Random, not a constant fill: the two MiB halves differ.
  EXPECT_NE(std::vector<char>(bytes.begin(), bytes.begin() + (1 << 20)),
            std::vector<char>(bytes.begin() + (1 << 20), bytes.end()));
  fs::remove(path);
  EXPECT_FALSE(create_record_file("/nonexistent-dir/records.bin", 1).ok());
}

TEST(LoaderRecordIo, SuiteHasOneTestcasePerPath) {
  RecordIoBenchOptions options;
  options.path = "/nonexistent/records.bin";
  Suite suite = make_record_io_suite(options, {data::RecordIo::kPread, data::RecordIo::kCufile});
  EXPECT_EQ(suite.name(), "loader-record-io");
  ASSERT_EQ(suite.testcases().size(), 2u);
  EXPECT_EQ(suite.testcases()[0]->key(), "pread");
  EXPECT_EQ(suite.testcases()[1]->key(), "cufile");
  if (cuda_device_count().ok()) GTEST_SKIP() << "a GPU is present: the testcases would run";
  BenchContext context{BenchOptions{}};
  auto results = suite.run(context);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& result : results) {
    EXPECT_EQ(result.outcome, Outcome::kWaived) << result.key;
    EXPECT_FALSE(result.reason.empty());
  }
  EXPECT_EQ(record_io_exit_code_for(results), 0);
}

}  // namespace
}  // namespace gpuopt::bench::loader
