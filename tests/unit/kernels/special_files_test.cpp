// gemm's inputs (checkpoint, .npy input, quantize config) all come through read_file: a FIFO or
// directory named there is refused by name at once, not read until a writer appears.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/deadline.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/kernels/safetensors.hpp"

namespace gpuopt::kernels {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::call_with_deadline;
using gpuopt::testing::make_fifo;
using gpuopt::testing::TempDir;

TEST(KernelsSpecialFiles, FifoCheckpointAndInputAreRefusedPromptly) {
  TempDir dir("gpuopt-fifo-gemm");
  const fs::path fifo = dir.path() / "model.safetensors";
  ASSERT_TRUE(make_fifo(fifo));
  auto opened = call_with_deadline([&] { return SafetensorsFile::open(fifo.string()); });
  ASSERT_TRUE(opened.has_value()) << "opening a FIFO checkpoint blocked";
  ASSERT_FALSE(opened->ok());
  EXPECT_EQ(opened->status().message(), fifo.string() + " is a FIFO, not a regular file");

  auto read = call_with_deadline([&] { return read_file(fifo.string()); });
  ASSERT_TRUE(read.has_value()) << "read_file on a FIFO blocked";
  EXPECT_EQ(read->status().code(), StatusCode::kInvalidArgument);

  auto directory = read_file(dir.path().string());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory"), std::string::npos);
}

TEST(KernelsSpecialFiles, RegularFileStillRoundTrips) {
  TempDir dir("gpuopt-read-file");
  const std::string path = (dir.path() / "bytes.bin").string();
  std::vector<std::byte> bytes(70000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 % 251);
  ASSERT_TRUE(write_file(path, bytes).ok());
  auto read = read_file(path);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(*read, bytes);
  auto missing = read_file((dir.path() / "absent").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace gpuopt::kernels
