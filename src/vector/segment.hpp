// Segment files: one immutable, page-aligned file per committed batch, holding vectors, ids and
// squared norms, with a CRC32C over the data and one over the header. Opened with mmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "gpuopt/core/status.hpp"

namespace gpuopt::vector::detail {

// CRC32C (Castagnoli, reflected) of `bytes` bytes, continuing from `crc` (0 to start):
// crc32c(crc32c(0, a), b) is the CRC of a followed by b. Uses the SSE4.2 instruction where the CPU
// has it and GPUOPT_X86_SIMD is on, else crc32c_portable; both give the same value.
std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t bytes);
std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t bytes);
// The implementation crc32c runs: "sse4.2" or "portable".
const char* crc32c_isa();

inline constexpr std::size_t kSegmentPage = 4096;
inline constexpr char kSegmentMagic[8] = {'G', 'P', 'U', 'O', 'V', 'S', 'E', 'G'};
inline constexpr std::uint32_t kSegmentVersion = 1;

// What the catalogue records about a segment; open() checks the file against it.
struct SegmentInfo {
  std::uint64_t sequence = 0;
  std::string file;  // name inside the store's segments/ directory
  std::size_t rows = 0;
  std::size_t dim = 0;
  std::uint64_t bytes = 0;
  std::uint32_t data_crc = 0;
};

// Bytes a segment of rows x dim takes on disk.
std::uint64_t segment_file_bytes(std::size_t rows, std::size_t dim);

// Writes and fsyncs the file (and its directory). vectors [rows, dim]; norms computed here.
StatusOr<SegmentInfo> write_segment(const std::filesystem::path& path, std::uint64_t sequence,
                                    std::size_t dim, const float* vectors, const std::uint64_t* ids,
                                    std::size_t rows);

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Maps the file and checks size, magic, version, header CRC and agreement with the catalogue.
  // Does not read the vectors.
  static StatusOr<std::unique_ptr<Segment>> open(const std::filesystem::path& path,
                                                 const SegmentInfo& expected);
  // Checks the data CRC (reads every byte); DATA_LOSS naming the file on mismatch.
  Status verify();
  bool verified() const { return verified_; }

  const float* vectors() const { return vectors_; }
  const std::uint64_t* ids() const { return ids_; }
  const float* norms() const { return norms_; }
  const SegmentInfo& info() const { return info_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  Segment() = default;
  std::filesystem::path path_;
  SegmentInfo info_;
  void* mapping_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  const float* vectors_ = nullptr;
  const std::uint64_t* ids_ = nullptr;
  const float* norms_ = nullptr;
  bool verified_ = false;
};

}  // namespace gpuopt::vector::detail
