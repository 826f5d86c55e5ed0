// Segment files: layout, CRC32C (SSE4.2 instruction when present, else a table), write with fsync,
// mmap open.
#include "segment.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "file_header.hpp"
#include "gpuopt/core/regular_file.hpp"
#include "search_kernels.hpp"

// GPUOPT_X86_SIMD (a CMake option, on by default on x86-64) compiles the SSE4.2 CRC32C and its
// run-time check; without it, or on another architecture, the table below computes the same CRC.
#if GPUOPT_X86_SIMD && defined(__x86_64__)
#define GPUOPT_CRC32C_X86 1
#else
#define GPUOPT_CRC32C_X86 0
#endif

namespace gpuopt::vector::detail {

namespace {

// Header at offset 0, padded to one page; sections follow, each starting on a page boundary.
struct SegmentHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t sequence;
  std::uint64_t rows;
  std::uint32_t dim;
  std::uint32_t dtype;  // 0 = fp32
  std::uint64_t vectors_offset;
  std::uint64_t ids_offset;
  std::uint64_t norms_offset;
  std::uint64_t file_bytes;
  std::uint32_t data_crc;    // over vectors, ids, norms (unpadded), in that order
  std::uint32_t header_crc;  // over every byte above
};

std::uint64_t round_up(std::uint64_t value) {
  return (value + kSegmentPage - 1) / kSegmentPage * kSegmentPage;
}

struct Layout {
  std::uint64_t vectors_offset, ids_offset, norms_offset, file_bytes;
  std::uint64_t vector_bytes, id_bytes, norm_bytes;
};

Layout layout(std::size_t rows, std::size_t dim) {
  Layout l;
  l.vector_bytes = std::uint64_t(rows) * dim * sizeof(float);
  l.id_bytes = std::uint64_t(rows) * sizeof(std::uint64_t);
  l.norm_bytes = std::uint64_t(rows) * sizeof(float);
  l.vectors_offset = kSegmentPage;
  l.ids_offset = l.vectors_offset + round_up(l.vector_bytes);
  l.norms_offset = l.ids_offset + round_up(l.id_bytes);
  l.file_bytes = l.norms_offset + round_up(l.norm_bytes);
  return l;
}

// The byte-at-a-time table of the reflected Castagnoli polynomial, built at compile time.
constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

std::uint32_t crc32c_software(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if GPUOPT_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hardware(std::uint32_t crc,
                                                                const unsigned char* p,
                                                                std::size_t n) {
  std::uint64_t c = crc;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, p + i, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  std::uint32_t c32 = static_cast<std::uint32_t>(c);
  for (; i < n; ++i) c32 = __builtin_ia32_crc32qi(c32, p[i]);
  return c32;
}

const bool kHardwareCrc = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") != 0;
}();
#endif

Status errno_status(const std::string& what, const std::filesystem::path& path) {
  int error = errno;
  std::string message = fmt::format("{}: {} failed: {}", path.string(), what, std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return resource_exhausted(message);
  if (error == EACCES || error == EPERM) return permission_denied(message);
  if (error == ENOENT) return not_found(message);
  return unavailable(message);
}

Status write_all(int fd, const void* data, std::size_t bytes, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = ::write(fd, p, bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno_status("write", path);
    }
    p += written;
    bytes -= static_cast<std::size_t>(written);
  }
  return ok_status();
}

}  // namespace

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t bytes) {
#if GPUOPT_CRC32C_X86
  if (kHardwareCrc) return ~crc32c_hardware(~crc, static_cast<const unsigned char*>(data), bytes);
#endif
  return crc32c_portable(crc, data, bytes);
}

std::uint32_t crc32c_portable(std::uint32_t crc, const void* data, std::size_t bytes) {
  return ~crc32c_software(~crc, static_cast<const unsigned char*>(data), bytes);
}

const char* crc32c_isa() {
#if GPUOPT_CRC32C_X86
  if (kHardwareCrc) return "sse4.2";
#endif
  return "portable";
}

std::uint64_t segment_file_bytes(std::size_t rows, std::size_t dim) {
  return layout(rows, dim).file_bytes;
}

StatusOr<SegmentInfo> write_segment(const std::filesystem::path& path, std::uint64_t sequence,
                                    std::size_t dim, const float* vectors, const std::uint64_t* ids,
                                    std::size_t rows) {
  Layout l = layout(rows, dim);
  std::vector<float> norms(rows);
  squared_norms(vectors, rows, dim, norms.data());

  SegmentHeader header{};
  std::memcpy(header.magic, kSegmentMagic, sizeof(header.magic));
  header.version = kSegmentVersion;
  header.header_bytes = static_cast<std::uint32_t>(kSegmentPage);
  header.sequence = sequence;
  header.rows = rows;
  header.dim = static_cast<std::uint32_t>(dim);
  header.dtype = 0;
  header.vectors_offset = l.vectors_offset;
  header.ids_offset = l.ids_offset;
  header.norms_offset = l.norms_offset;
  header.file_bytes = l.file_bytes;
  std::uint32_t crc = crc32c(0, vectors, l.vector_bytes);
  crc = crc32c(crc, ids, l.id_bytes);
  crc = crc32c(crc, norms.data(), l.norm_bytes);
  header.data_crc = crc;
  header.header_crc = crc32c(0, &header, offsetof(SegmentHeader, header_crc));

  // O_NONBLOCK: a FIFO left where the new segment goes fails the open (no reader) or is refused
  // below, instead of blocking the import.
  int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd < 0) {
    if (errno == ENXIO)
      return data_loss(fmt::format("segment {} is not a regular file", path.string()));
    return errno_status("open for writing", path);
  }
  if (Status regular = require_regular_descriptor(fd, path); !regular.ok()) {
    ::close(fd);
    return data_loss(fmt::format("segment {}", regular.message()));
  }
  std::vector<char> page(kSegmentPage, 0);
  std::memcpy(page.data(), &header, sizeof(header));
  auto write_section = [&](std::uint64_t offset, const void* data, std::uint64_t bytes) -> Status {
    if (::lseek(fd, static_cast<off_t>(offset), SEEK_SET) < 0) return errno_status("seek", path);
    return write_all(fd, data, bytes, path);
  };
  Status status = write_all(fd, page.data(), page.size(), path);
  if (status.ok()) status = write_section(l.vectors_offset, vectors, l.vector_bytes);
  if (status.ok()) status = write_section(l.ids_offset, ids, l.id_bytes);
  if (status.ok()) status = write_section(l.norms_offset, norms.data(), l.norm_bytes);
  if (status.ok() && ::ftruncate(fd, static_cast<off_t>(l.file_bytes)) != 0) {
    status = errno_status("truncate", path);
  }
  if (status.ok() && ::fsync(fd) != 0) status = errno_status("fsync", path);
  ::close(fd);
  if (!status.ok()) return status;
  // The directory entry must be durable too, before the catalogue names the file.
  int dir_fd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return errno_status("open directory", path.parent_path());
  int rc = ::fsync(dir_fd);
  ::close(dir_fd);
  if (rc != 0) return errno_status("fsync directory", path.parent_path());

  SegmentInfo info;
  info.sequence = sequence;
  info.file = path.filename().string();
  info.rows = rows;
  info.dim = dim;
  info.bytes = l.file_bytes;
  info.data_crc = crc;
  return info;
}

Segment::~Segment() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

StatusOr<std::unique_ptr<Segment>> Segment::open(const std::filesystem::path& path,
                                                 const SegmentInfo& expected) {
  std::unique_ptr<Segment> segment(new Segment());
  segment->path_ = path;
  segment->info_ = expected;
  // A FIFO or device in place of a segment is refused before anything can block on it.
  auto opened = open_regular_file(path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return data_loss(
          fmt::format("{}: segment file is missing (the catalogue lists it)", path.string()));
    }
    return data_loss(fmt::format("segment {}", opened.status().message()));
  }
  const int fd = opened->get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status("stat", path);
  Layout l = layout(expected.rows, expected.dim);
  std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size != l.file_bytes || size != expected.bytes) {
    return data_loss(
        fmt::format("{}: segment is {} bytes, expected {} for {} rows of dimension {} ({})",
                    path.string(), size, l.file_bytes, expected.rows, expected.dim,
                    size < l.file_bytes ? "truncated" : "has extra bytes"));
  }
  // The header is read with pread, not through the mapping: a fault on a freshly written file can
  // map its whole page-cache folio (megabytes on kernels with large folios), and opening a store
  // should not make every segment resident before anything reads it.
  SegmentHeader header;
  for (std::size_t got = 0; got < sizeof(header);) {
    ssize_t n = ::pread(fd, reinterpret_cast<char*>(&header) + got, sizeof(header) - got,
                        static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("read header", path);
    if (n == 0) return data_loss(fmt::format("{}: segment header is truncated", path.string()));
    got += static_cast<std::size_t>(n);
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  opened->reset();
  if (mapping == MAP_FAILED) return errno_status("mmap", path);
  segment->mapping_ = mapping;
  segment->mapped_bytes_ = size;
  if (std::string problem = header_problem(header, kSegmentMagic, kSegmentVersion, "segment");
      !problem.empty()) {
    return data_loss(fmt::format("{}: {}", path.string(), problem));
  }
  if (header.rows != expected.rows || header.dim != expected.dim ||
      header.sequence != expected.sequence || header.data_crc != expected.data_crc ||
      header.vectors_offset != l.vectors_offset || header.ids_offset != l.ids_offset ||
      header.norms_offset != l.norms_offset || header.file_bytes != l.file_bytes ||
      header.dtype != 0) {
    return data_loss(fmt::format(
        "{}: segment header (sequence {}, {} rows, dimension {}) disagrees with the catalogue "
        "(sequence {}, {} rows, dimension {})",
        path.string(), header.sequence, header.rows, header.dim, expected.sequence, expected.rows,
        expected.dim));
  }
  const char* base = static_cast<const char*>(mapping);
  segment->vectors_ = reinterpret_cast<const float*>(base + l.vectors_offset);
  segment->ids_ = reinterpret_cast<const std::uint64_t*>(base + l.ids_offset);
  segment->norms_ = reinterpret_cast<const float*>(base + l.norms_offset);
  return segment;
}

Status Segment::verify() {
  if (verified_) return ok_status();
  Layout l = layout(info_.rows, info_.dim);
  std::uint32_t crc = crc32c(0, vectors_, l.vector_bytes);
  crc = crc32c(crc, ids_, l.id_bytes);
  crc = crc32c(crc, norms_, l.norm_bytes);
  if (crc != info_.data_crc) {
    return data_loss(
        fmt::format("{}: segment data checksum mismatch (CRC32C {:08x}, expected {:08x})",
                    path_.string(), crc, info_.data_crc));
  }
  verified_ = true;
  return ok_status();
}

}  // namespace gpuopt::vector::detail
