// fvecs / npy / IDX readers (bounds-checked, fuzz-friendly) and fvecs / npy writers.
#include "gpuopt/vector/vector_file.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "gpuopt/core/regular_file.hpp"

namespace gpuopt::vector {

namespace {

constexpr std::size_t kMaxElements = std::size_t{1}
                                     << 36;  // 256 GiB of floats: surely a bad header

StatusOr<std::vector<std::uint8_t>> read_bytes(const std::filesystem::path& path) {
  std::vector<std::uint8_t> bytes;
  // Only a regular file: a FIFO or device named as input must not block the read.
  GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path));
  gzFile file = gzdopen(fd.get(), "rb");  // reads plain files unchanged; closes fd when closed
  if (file == nullptr) {
    return resource_exhausted(fmt::format("{}: cannot start reading", path.string()));
  }
  fd.release();
  gzbuffer(file, 1 << 20);
  std::uint8_t buffer[1 << 16];
  while (true) {
    int n = gzread(file, buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      return data_loss(fmt::format("{}: read failed: {}", path.string(), message));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  gzclose(file);
  return bytes;
}

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StatusOr<VectorFile> parse_fvecs(std::span<const std::uint8_t> bytes, const std::string& name,
                                 std::size_t max_rows) {
  if (bytes.size() < 4) return invalid_argument(fmt::format("{}: fvecs file is empty", name));
  std::int32_t dim;
  std::memcpy(&dim, bytes.data(), 4);
  if (dim <= 0 || dim > 65536) {
    return invalid_argument(
        fmt::format("{}: fvecs dimension {} in the first record (expected 1..65536)", name, dim));
  }
  std::size_t record = 4 + std::size_t(dim) * 4;
  if (bytes.size() % record != 0) {
    return invalid_argument(fmt::format(
        "{}: {} bytes is not a whole number of {}-byte fvecs records (dimension {}): truncated?",
        name, bytes.size(), record, dim));
  }
  VectorFile file;
  file.format = "fvecs";
  file.dim = static_cast<std::size_t>(dim);
  file.rows = bytes.size() / record;
  if (max_rows != 0) file.rows = std::min(file.rows, max_rows);
  file.values.resize(file.rows * file.dim);
  for (std::size_t r = 0; r < file.rows; ++r) {
    std::int32_t row_dim;
    std::memcpy(&row_dim, bytes.data() + r * record, 4);
    if (row_dim != dim) {
      return invalid_argument(
          fmt::format("{}: record {} has dimension {}, the first has {}", name, r, row_dim, dim));
    }
    std::memcpy(&file.values[r * file.dim], bytes.data() + r * record + 4, file.dim * 4);
  }
  return file;
}

StatusOr<VectorFile> parse_npy(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows) {
  static const std::uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    return invalid_argument(fmt::format("{}: not a .npy file (bad magic)", name));
  }
  std::uint8_t major = bytes[6];
  std::size_t header_length, header_start;
  if (major == 1) {
    header_length = bytes[8] | (std::size_t(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return invalid_argument(fmt::format("{}: .npy header truncated", name));
    header_length = bytes[8] | (std::size_t(bytes[9]) << 8) | (std::size_t(bytes[10]) << 16) |
                    (std::size_t(bytes[11]) << 24);
    header_start = 12;
  } else {
    return invalid_argument(
        fmt::format("{}: .npy format version {} is not supported", name, int(major)));
  }
  if (header_length > bytes.size() - header_start) {
    return invalid_argument(fmt::format("{}: .npy header ({} bytes) runs past the end of the file",
                                        name, header_length));
  }
  std::string header(reinterpret_cast<const char*>(bytes.data() + header_start), header_length);
  auto field = [&](const std::string& key) -> std::string {
    auto at = header.find("'" + key + "'");
    if (at == std::string::npos) return {};
    auto colon = header.find(':', at);
    if (colon == std::string::npos) return {};
    auto start = header.find_first_not_of(' ', colon + 1);
    if (start == std::string::npos) return {};
    char open = header[start];
    char close = open == '(' ? ')' : open == '\'' ? '\'' : ',';
    auto end = header.find(close, start + 1);
    if (end == std::string::npos) return {};
    return header.substr(start, end - start + (close == ',' ? 0 : 1));
  };
  std::string descr = field("descr");
  std::string fortran = field("fortran_order");
  std::string shape = field("shape");
  std::size_t element;
  if (descr == "'<f4'") {
    element = 4;
  } else if (descr == "'<f8'") {
    element = 8;
  } else if (descr == "'|u1'" || descr == "'<u1'") {
    element = 1;
  } else {
    return invalid_argument(fmt::format(
        "{}: .npy dtype {} is not supported (use float32, float64 or uint8, little-endian)", name,
        descr.empty() ? "(missing)" : descr));
  }
  if (fortran.find("False") != 0) {
    return invalid_argument(
        fmt::format("{}: .npy array is Fortran-ordered or has no "
                    "fortran_order (save it C-contiguous)",
                    name));
  }
  // shape "(rows, dim)"
  std::size_t dims[2] = {0, 0};
  int count = 0;
  {
    std::size_t i = 1;
    while (i < shape.size() && count < 3) {
      while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
      if (i >= shape.size() || shape[i] == ')') break;
      std::size_t value = 0;
      bool digits = false;
      while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
        if (value > kMaxElements) break;
        value = value * 10 + std::size_t(shape[i] - '0');
        ++i;
        digits = true;
      }
      if (!digits) {
        return invalid_argument(fmt::format("{}: .npy shape {} is not understood", name, shape));
      }
      if (count < 2) dims[count] = value;
      ++count;
    }
  }
  if (count != 2) {
    return invalid_argument(fmt::format("{}: .npy shape {} must be 2-D (rows, dimension)", name,
                                        shape.empty() ? "(missing)" : shape));
  }
  if (dims[1] == 0 || dims[1] > 65536 || dims[0] > kMaxElements / dims[1]) {
    return invalid_argument(
        fmt::format("{}: .npy shape ({}, {}) is out of range", name, dims[0], dims[1]));
  }
  std::size_t data_start = header_start + header_length;
  std::size_t need = dims[0] * dims[1] * element;
  if (bytes.size() - data_start < need) {
    return invalid_argument(
        fmt::format("{}: .npy data is {} bytes, shape ({}, {}) needs {}: "
                    "truncated",
                    name, bytes.size() - data_start, dims[0], dims[1], need));
  }
  VectorFile file;
  file.format = "npy";
  file.rows = max_rows != 0 ? std::min(dims[0], max_rows) : dims[0];
  file.dim = dims[1];
  file.values.resize(file.rows * file.dim);
  const std::uint8_t* data = bytes.data() + data_start;
  for (std::size_t i = 0; i < file.values.size(); ++i) {
    if (element == 4) {
      std::memcpy(&file.values[i], data + i * 4, 4);
    } else if (element == 8) {
      double value;
      std::memcpy(&value, data + i * 8, 8);
      file.values[i] = static_cast<float>(value);
    } else {
      file.values[i] = data[i];
    }
  }
  return file;
}

StatusOr<VectorFile> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows) {
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    return invalid_argument(fmt::format("{}: not an IDX file (bad magic)", name));
  }
  std::uint8_t type = bytes[2];
  std::size_t rank = bytes[3];
  std::size_t element;
  switch (type) {
    case 0x08:
      element = 1;
      break;  // unsigned byte
    case 0x09:
      element = 1;
      break;  // signed byte
    case 0x0B:
      element = 2;
      break;  // short
    case 0x0C:
      element = 4;
      break;  // int
    case 0x0D:
      element = 4;
      break;  // float
    case 0x0E:
      element = 8;
      break;  // double
    default:
      return invalid_argument(fmt::format("{}: IDX element type 0x{:02x} is unknown", name, type));
  }
  if (rank < 1 || rank > 4 || bytes.size() < 4 + 4 * rank) {
    return invalid_argument(
        fmt::format("{}: IDX rank {} is unsupported or its header is "
                    "truncated",
                    name, rank));
  }
  std::size_t rows = big_endian32(bytes.data() + 4);
  std::size_t dim = 1;
  for (std::size_t d = 1; d < rank; ++d) {
    std::size_t extent = big_endian32(bytes.data() + 4 + 4 * d);
    if (extent == 0 || dim > 65536 / extent) {
      return invalid_argument(
          fmt::format("{}: IDX item of {} values is out of range (dimension must be 1..65536)",
                      name, dim * std::max<std::size_t>(extent, 1)));
    }
    dim *= extent;
  }
  std::size_t data_start = 4 + 4 * rank;
  std::size_t need = rows * dim * element;
  if (bytes.size() - data_start != need) {
    return invalid_argument(
        fmt::format("{}: IDX data is {} bytes, header says {} items of {} values ({} bytes): {}",
                    name, bytes.size() - data_start, rows, dim, need,
                    bytes.size() - data_start < need ? "truncated" : "extra bytes"));
  }
  VectorFile file;
  file.format = "idx";
  file.rows = max_rows != 0 ? std::min(rows, max_rows) : rows;
  file.dim = dim;
  file.values.resize(file.rows * file.dim);
  const std::uint8_t* data = bytes.data() + data_start;
  for (std::size_t i = 0; i < file.values.size(); ++i) {
    const std::uint8_t* p = data + i * element;
    switch (type) {
      case 0x08:
        file.values[i] = p[0];
        break;
      case 0x09:
        file.values[i] = static_cast<std::int8_t>(p[0]);
        break;
      case 0x0B:
        file.values[i] = static_cast<std::int16_t>((p[0] << 8) | p[1]);
        break;
      case 0x0C:
        file.values[i] = static_cast<float>(static_cast<std::int32_t>(big_endian32(p)));
        break;
      case 0x0D: {
        std::uint32_t bits = big_endian32(p);
        std::memcpy(&file.values[i], &bits, 4);
        break;
      }
      case 0x0E: {
        std::uint64_t bits = (std::uint64_t(big_endian32(p)) << 32) | big_endian32(p + 4);
        double value;
        std::memcpy(&value, &bits, 8);
        file.values[i] = static_cast<float>(value);
        break;
      }
    }
  }
  return file;
}

StatusOr<VectorFile> read_vector_file(const std::filesystem::path& path, std::size_t max_rows) {
  GPUOPT_ASSIGN_OR_RETURN(auto bytes, read_bytes(path));
  std::string name = path.string();
  std::string lower = path.filename().string();
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ends_with(lower, ".gz")) lower.resize(lower.size() - 3);
  StatusOr<VectorFile> result = invalid_argument("unreachable");
  if (ends_with(lower, ".fvecs")) {
    result = parse_fvecs(bytes, name, max_rows);
  } else if (ends_with(lower, ".npy")) {
    result = parse_npy(bytes, name, max_rows);
  } else if (ends_with(lower, ".idx") || ends_with(lower, "-ubyte") ||
             lower.find(".idx") != std::string::npos) {
    result = parse_idx(bytes, name, max_rows);
  } else if (bytes.size() >= 6 && bytes[0] == 0x93 && bytes[1] == 'N') {
    result = parse_npy(bytes, name, max_rows);
  } else if (bytes.size() >= 4 && bytes[0] == 0 && bytes[1] == 0 && bytes[2] >= 0x08) {
    result = parse_idx(bytes, name, max_rows);
  } else {
    return invalid_argument(fmt::format(
        "{}: unknown vector file format (expected .fvecs, .npy or IDX, optionally .gz)", name));
  }
  if (!result.ok()) return result.status();
  for (std::size_t i = 0; i < result->values.size(); ++i) {
    if (!std::isfinite(result->values[i])) {
      return invalid_argument(fmt::format("{}: vector {} has a non-finite value at index {}", name,
                                          i / result->dim, i % result->dim));
    }
  }
  return result;
}

Status write_fvecs(const std::filesystem::path& path, const float* values, std::size_t rows,
                   std::size_t dim) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return unavailable(fmt::format("{}: cannot open for writing", path.string()));
  std::int32_t d = static_cast<std::int32_t>(dim);
  for (std::size_t r = 0; r < rows; ++r) {
    out.write(reinterpret_cast<const char*>(&d), 4);
    out.write(reinterpret_cast<const char*>(values + r * dim), static_cast<long>(dim * 4));
  }
  if (!out) return unavailable(fmt::format("{}: write failed", path.string()));
  return ok_status();
}

Status write_npy(const std::filesystem::path& path, const float* values, std::size_t rows,
                 std::size_t dim) {
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, dim);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return unavailable(fmt::format("{}: cannot open for writing", path.string()));
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  std::uint16_t length = static_cast<std::uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out.write(header.data(), static_cast<long>(header.size()));
  out.write(reinterpret_cast<const char*>(values), static_cast<long>(rows * dim * 4));
  if (!out) return unavailable(fmt::format("{}: write failed", path.string()));
  return ok_status();
}

}  // namespace gpuopt::vector
