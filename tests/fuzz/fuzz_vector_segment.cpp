// libFuzzer target: Segment::open and Segment::verify on arbitrary segment files, with the
// catalogue's record of the segment as untrusted as the file. The first byte picks the record:
//   bit 0: the record repeats the file's own header (rows, dim, sequence, data CRC), else a small
//          fixed one (rows from bits 4-7, dimension 4);
//   bit 1: the header CRC is recomputed before the file is written, so the checks after it run.
// The rest is the file. An open that succeeds must describe sections that lie inside the file,
// and verify must read them without leaving the mapping (ASan reports any stray read).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "vector/segment.hpp"

namespace {

// Header fields (little endian) as src/vector/segment.cpp lays them out.
constexpr std::size_t kSequenceAt = 16, kRowsAt = 24, kDimAt = 32, kDataCrcAt = 72;
constexpr std::size_t kHeaderCrcAt = 76, kHeaderBytes = 80;

template <typename T>
T field(const std::vector<std::uint8_t>& bytes, std::size_t at) {
  T value{};
  if (bytes.size() >= at + sizeof(T)) std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

const std::filesystem::path& segment_path() {
  static const std::filesystem::path path = [] {
    auto dir = std::filesystem::temp_directory_path() /
               ("gpuopt-fuzz-segment-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir / "default-00000000.seg";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuopt::vector::detail;
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  std::vector<std::uint8_t> file(data + 1, data + size);
  if ((mode & 2) && file.size() >= kHeaderBytes) {
    const std::uint32_t crc = crc32c(0, file.data(), kHeaderCrcAt);
    std::memcpy(file.data() + kHeaderCrcAt, &crc, sizeof(crc));
  }
  SegmentInfo expected;
  expected.file = segment_path().filename().string();
  expected.bytes = file.size();
  if (mode & 1) {
    expected.sequence = field<std::uint64_t>(file, kSequenceAt);
    expected.rows = field<std::uint64_t>(file, kRowsAt);
    expected.dim = field<std::uint32_t>(file, kDimAt);
    expected.data_crc = field<std::uint32_t>(file, kDataCrcAt);
  } else {
    expected.rows = mode >> 4;
    expected.dim = 4;
  }
  {
    std::FILE* out = std::fopen(segment_path().c_str(), "wb");
    if (out == nullptr) std::abort();
    if (!file.empty() && std::fwrite(file.data(), 1, file.size(), out) != file.size()) std::abort();
    if (std::fclose(out) != 0) std::abort();
  }
  auto segment = Segment::open(segment_path(), expected);
  if (!segment.ok()) return 0;
  // An open segment's sections end inside the file it mapped.
  const std::uint64_t rows = (*segment)->info().rows, dim = (*segment)->info().dim;
  if (segment_file_bytes(rows, dim) != file.size()) std::abort();
  if (!(*segment)->verify().ok()) return 0;
  // Verified: the data is what the file holds; touch the last row of every section.
  if (rows > 0) {
    volatile float v = (*segment)->vectors()[rows * dim - (dim > 0 ? 1 : 0)];
    volatile std::uint64_t id = (*segment)->ids()[rows - 1];
    volatile float n = (*segment)->norms()[rows - 1];
    (void)v;
    (void)id;
    (void)n;
  }
  return 0;
}
