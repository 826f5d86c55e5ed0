// The IVF index file: layout, write (temp file + fsync + rename + directory fsync) and checked
// read.
#include "ivf_index.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

#include "file_header.hpp"
#include "gpuopt/core/regular_file.hpp"
#include "segment.hpp"

namespace gpuopt::vector::detail {

namespace {

// Fixed-size header at offset 0; the sections follow it back to back: centroids (fp32),
// list_offsets, positions, ids (uint64).
struct IvfHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t generation;
  std::uint32_t dim;
  std::uint32_t metric;  // Metric's value
  std::uint64_t nlist;
  std::uint64_t trained_rows;
  std::uint64_t covered_rows;
  std::uint32_t engine;
  std::uint32_t iterations;
  double train_seconds;
  double trained_mean_distance;
  double added_distance_sum;
  std::uint64_t file_bytes;
  std::uint32_t data_crc;    // over the sections, in file order
  std::uint32_t header_crc;  // over every byte above
};

struct Layout {
  std::uint64_t centroid_bytes, offset_bytes, position_bytes, file_bytes;
};

Layout layout(std::uint64_t nlist, std::uint64_t dim, std::uint64_t rows) {
  Layout l;
  l.centroid_bytes = nlist * dim * sizeof(float);
  l.offset_bytes = (nlist + 1) * sizeof(std::uint64_t);
  l.position_bytes = rows * sizeof(std::uint64_t);
  l.file_bytes = sizeof(IvfHeader) + l.centroid_bytes + l.offset_bytes + 2 * l.position_bytes;
  return l;
}

Status errno_status(const std::string& what, const std::filesystem::path& path) {
  int error = errno;
  std::string message = fmt::format("{}: {} failed: {}", path.string(), what, std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return resource_exhausted(message);
  if (error == EACCES || error == EPERM) return permission_denied(message);
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

Status fsync_directory(const std::filesystem::path& directory) {
  int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return errno_status("open directory", directory);
  int rc = ::fsync(dir_fd);
  ::close(dir_fd);
  if (rc != 0) return errno_status("fsync directory", directory);
  return ok_status();
}

}  // namespace

StatusOr<IvfFileInfo> write_ivf_file(const std::filesystem::path& path,
                                     const IvfFileContents& contents) {
  const std::uint64_t rows = contents.covered_rows;
  if (contents.centroids.size() != contents.nlist * contents.dim ||
      contents.list_offsets.size() != contents.nlist + 1 || contents.positions.size() != rows ||
      contents.ids.size() != rows) {
    return internal_error(
        fmt::format("{}: IVF index contents have inconsistent sizes", path.string()));
  }
  Layout l = layout(contents.nlist, contents.dim, rows);
  IvfHeader header{};
  std::memcpy(header.magic, kIvfMagic, sizeof(header.magic));
  header.version = kIvfVersion;
  header.header_bytes = sizeof(IvfHeader);
  header.generation = contents.generation;
  header.dim = static_cast<std::uint32_t>(contents.dim);
  header.metric = static_cast<std::uint32_t>(contents.metric);
  header.nlist = contents.nlist;
  header.trained_rows = contents.trained_rows;
  header.covered_rows = rows;
  header.engine = static_cast<std::uint32_t>(contents.engine);
  header.iterations = contents.iterations;
  header.train_seconds = contents.train_seconds;
  header.trained_mean_distance = contents.trained_mean_distance;
  header.added_distance_sum = contents.added_distance_sum;
  header.file_bytes = l.file_bytes;
  std::uint32_t crc = crc32c(0, contents.centroids.data(), l.centroid_bytes);
  crc = crc32c(crc, contents.list_offsets.data(), l.offset_bytes);
  crc = crc32c(crc, contents.positions.data(), l.position_bytes);
  crc = crc32c(crc, contents.ids.data(), l.position_bytes);
  header.data_crc = crc;
  header.header_crc = crc32c(0, &header, offsetof(IvfHeader, header_crc));

  std::filesystem::path temporary = path;
  temporary += ".tmp";
  int fd = ::open(temporary.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd < 0) {
    if (errno == ENXIO) {
      return data_loss(fmt::format("IVF index {} is not a regular file", temporary.string()));
    }
    return errno_status("open for writing", temporary);
  }
  if (Status regular = require_regular_descriptor(fd, temporary); !regular.ok()) {
    ::close(fd);
    return data_loss(fmt::format("IVF index {}", regular.message()));
  }
  Status status = write_all(fd, &header, sizeof(header), temporary);
  if (status.ok()) status = write_all(fd, contents.centroids.data(), l.centroid_bytes, temporary);
  if (status.ok()) status = write_all(fd, contents.list_offsets.data(), l.offset_bytes, temporary);
  if (status.ok()) status = write_all(fd, contents.positions.data(), l.position_bytes, temporary);
  if (status.ok()) status = write_all(fd, contents.ids.data(), l.position_bytes, temporary);
  if (status.ok() && ::fsync(fd) != 0) status = errno_status("fsync", temporary);
  ::close(fd);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = errno_status("rename to " + path.filename().string(), temporary);
  }
  if (!status.ok()) {
    ::unlink(temporary.c_str());
    return status;
  }
  // The new name must be durable before the catalogue points at it.
  GPUOPT_RETURN_IF_ERROR(fsync_directory(path.parent_path()));
  IvfFileInfo info;
  info.file = path.filename().string();
  info.generation = contents.generation;
  info.bytes = l.file_bytes;
  info.data_crc = crc;
  return info;
}

StatusOr<IvfFileContents> read_ivf_file(const std::filesystem::path& path,
                                        const IvfFileInfo& expected, std::size_t dim,
                                        Metric metric) {
  const std::string name = path.string();
  auto loss = [&](const std::string& what) {
    return data_loss(fmt::format(
        "IVF index {}: {} (`gpuopt vector reindex` rebuilds it; exact queries are unaffected)",
        name, what));
  };
  // Reads at most the catalogue's size plus one byte, so extra bytes show.
  auto read = read_regular_file(path, expected.bytes + 1);
  if (!read.ok()) {
    if (read.status().code() == StatusCode::kNotFound) {
      return loss("the file is missing (the catalogue lists it)");
    }
    return loss(std::string(read.status().message()));
  }
  const std::string& bytes = *read;
  if (bytes.size() != expected.bytes) {
    if (bytes.size() > expected.bytes) {
      return loss(
          fmt::format("the file has extra bytes (the catalogue says {} bytes)", expected.bytes));
    }
    return loss(fmt::format("the file is truncated: {} bytes, the catalogue says {}", bytes.size(),
                            expected.bytes));
  }
  if (bytes.size() < sizeof(IvfHeader)) return loss("truncated before the end of its header");
  IvfHeader header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  if (std::string problem = header_problem(header, kIvfMagic, kIvfVersion, "IVF index");
      !problem.empty()) {
    return loss(problem);
  }
  if (header.header_bytes != sizeof(IvfHeader)) {
    return loss(fmt::format("header of {} bytes (this build reads {})", header.header_bytes,
                            sizeof(IvfHeader)));
  }
  if (header.dim != dim || header.metric != static_cast<std::uint32_t>(metric)) {
    return loss(fmt::format("built for dimension {} metric {}, the collection has {} and {}",
                            header.dim, header.metric, dim, metric_name(metric)));
  }
  if (header.nlist == 0 || header.nlist > (std::uint64_t{1} << 32) ||
      header.covered_rows > (std::uint64_t{1} << 48)) {
    return loss(
        fmt::format("implausible header ({} lists, {} rows)", header.nlist, header.covered_rows));
  }
  Layout l = layout(header.nlist, dim, header.covered_rows);
  if (header.file_bytes != l.file_bytes || l.file_bytes != bytes.size() ||
      header.generation != expected.generation) {
    return loss(fmt::format(
        "header (generation {}, {} lists, {} rows, {} bytes) disagrees with the file size {} or "
        "the catalogue (generation {})",
        header.generation, header.nlist, header.covered_rows, header.file_bytes, bytes.size(),
        expected.generation));
  }
  const char* data = bytes.data() + sizeof(IvfHeader);
  const std::size_t data_bytes = bytes.size() - sizeof(IvfHeader);
  std::uint32_t crc = crc32c(0, data, data_bytes);
  if (crc != header.data_crc || crc != expected.data_crc) {
    return loss(fmt::format("data checksum mismatch (CRC32C {:08x}, expected {:08x})", crc,
                            expected.data_crc));
  }
  IvfFileContents contents;
  contents.dim = dim;
  contents.metric = metric;
  contents.nlist = header.nlist;
  contents.generation = header.generation;
  contents.trained_rows = header.trained_rows;
  contents.covered_rows = header.covered_rows;
  contents.engine = header.engine == 1 ? IvfTrainEngine::kGpu : IvfTrainEngine::kCpu;
  contents.iterations = header.iterations;
  contents.train_seconds = header.train_seconds;
  contents.trained_mean_distance = header.trained_mean_distance;
  contents.added_distance_sum = header.added_distance_sum;
  contents.centroids.resize(header.nlist * dim);
  contents.list_offsets.resize(header.nlist + 1);
  contents.positions.resize(header.covered_rows);
  contents.ids.resize(header.covered_rows);
  std::memcpy(contents.centroids.data(), data, l.centroid_bytes);
  data += l.centroid_bytes;
  std::memcpy(contents.list_offsets.data(), data, l.offset_bytes);
  data += l.offset_bytes;
  std::memcpy(contents.positions.data(), data, l.position_bytes);
  data += l.position_bytes;
  std::memcpy(contents.ids.data(), data, l.position_bytes);
  // A checksum matches what was written; these catch a file written wrong.
  if (contents.list_offsets.front() != 0 || contents.list_offsets.back() != header.covered_rows) {
    return loss("list offsets do not span the rows");
  }
  for (std::size_t i = 0; i < header.nlist; ++i) {
    if (contents.list_offsets[i] > contents.list_offsets[i + 1]) {
      return loss(fmt::format("list {} has a negative length", i));
    }
  }
  std::vector<bool> seen(header.covered_rows, false);
  for (std::uint64_t position : contents.positions) {
    if (position >= header.covered_rows || seen[position]) {
      return loss(fmt::format("row position {} is out of range or listed twice", position));
    }
    seen[position] = true;
  }
  for (float value : contents.centroids) {
    if (!std::isfinite(value)) return loss("a centroid holds a non-finite value");
  }
  return contents;
}

}  // namespace gpuopt::vector::detail
