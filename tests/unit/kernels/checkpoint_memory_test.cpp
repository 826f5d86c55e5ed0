// SafetensorsFile::open reads the header and then only the tensors asked for: a sparse 40 GB
// checkpoint whose header is valid costs the tensor that is read, not the file's size; a tensor
// the header places past the end of the file, or a file that shrinks after open, is a clean error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/vector_fixtures.hpp"
#include "gpuopt/kernels/safetensors.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUOPT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GPUOPT_TEST_SANITIZED 1
#endif
#endif

namespace gpuopt::kernels {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::TempDir;

constexpr std::uint64_t kFileBytes = std::uint64_t{40} << 30;

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// Writes the header and the small tensor's 16 bytes at the very end, then extends the file to
// `file_bytes` with a hole (truncate -s): a "padding" tensor covers the hole.
std::string write_sparse_checkpoint(const fs::path& path, std::uint64_t file_bytes,
                                    std::uint64_t claimed_end_past_eof = 0) {
  // The header's length depends on the numbers in it; pad it with spaces to a fixed 256 bytes.
  constexpr std::uint64_t kHeader = 256;
  const std::uint64_t data_bytes = file_bytes - 8 - kHeader;
  const std::uint64_t padding = data_bytes - 16;
  std::string header = "{\"padding\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(padding) +
                       "],\"data_offsets\":[0," + std::to_string(padding) +
                       "]},\"w\":{\"dtype\":\"F32\",\"shape\":[" +
                       std::to_string(4 + claimed_end_past_eof / 4) + "],\"data_offsets\":[" +
                       std::to_string(padding) + "," +
                       std::to_string(data_bytes + claimed_end_past_eof) + "]}}";
  EXPECT_LE(header.size(), kHeader);
  header.resize(kHeader, ' ');
  std::ofstream out(path, std::ios::binary);
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(kHeader >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.close();
  fs::resize_file(path, file_bytes);  // a hole, no blocks
  const float values[4] = {1.5f, -2.0f, 3.25f, 1e-3f};
  std::fstream tail(path, std::ios::binary | std::ios::in | std::ios::out);
  tail.seekp(static_cast<std::streamoff>(file_bytes - 16));
  tail.write(reinterpret_cast<const char*>(values), sizeof(values));
  return path.string();
}

TEST(CheckpointMemory, SparseFortyGigabyteCheckpointReadsOnlyTheTensorAskedFor) {
#ifdef GPUOPT_TEST_SANITIZED
  GTEST_SKIP() << "a sanitizer build's resident set says nothing about the reader's";
#endif
  TempDir dir("gpuopt-sparse-checkpoint");
  const std::string path = write_sparse_checkpoint(dir.path() / "model.safetensors", kFileBytes);
  ASSERT_EQ(fs::file_size(path), kFileBytes);
  const std::size_t before = resident_bytes();
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto w = file->tensor("w");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->data.size(), 16u);
  float values[4];
  std::memcpy(values, w->data.data(), sizeof(values));
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], 3.25f);
  EXPECT_EQ(values[3], 1e-3f);
  const std::size_t after = resident_bytes();
  EXPECT_LT(after > before ? after - before : 0, std::size_t{32} << 20)
      << "opening a sparse 40 GB checkpoint and reading a 16-byte tensor grew the resident set "
      << "from " << (before >> 20) << " to " << (after >> 20) << " MiB";
  EXPECT_EQ(file->names().size(), 2u);
}

TEST(CheckpointMemory, TensorPastTheEndOfTheFileIsACleanError) {
  TempDir dir("gpuopt-sparse-checkpoint");
  const std::string path =
      write_sparse_checkpoint(dir.path() / "model.safetensors", std::uint64_t{1} << 20, 4096);
  auto file = SafetensorsFile::open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("tensor 'w': data_offsets"), std::string::npos)
      << file.status().message();
  EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status().message();
}

TEST(CheckpointMemory, FileThatShrinksAfterOpenIsDataLossNotACrash) {
  TempDir dir("gpuopt-sparse-checkpoint");
  const fs::path path = dir.path() / "model.safetensors";
  write_sparse_checkpoint(path, std::uint64_t{1} << 20);
  auto file = SafetensorsFile::open(path.string());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  fs::resize_file(path, (std::uint64_t{1} << 20) - 8);
  auto w = file->tensor("w");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find("tensor 'w'"), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find(path.string()), std::string::npos) << w.status().message();
}

}  // namespace
}  // namespace gpuopt::kernels
