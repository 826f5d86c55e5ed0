// Streaming readers for fvecs / bvecs / ivecs / npy / IDX (bounds-checked, fuzz-friendly), the
// JSON Lines metadata reader used by imports, and fvecs / npy writers.
#include "gpuopt/vector/vector_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "gpuopt/core/regular_file.hpp"
#include "gpuopt/vector/filter.hpp"

namespace gpuopt::vector {

namespace {

constexpr std::size_t kMaxDim = 65536;
// 2^36 elements (256 GiB of fp32): a declared shape beyond this is surely a bad header.
constexpr std::size_t kMaxElements = std::size_t{1} << 36;
// numpy writes headers of a few hundred bytes; a longer one is refused before it is allocated.
constexpr std::size_t kMaxNpyHeader = std::size_t{1} << 20;
// Pages dropped from the page cache this many bytes at a time (drop_cache_behind).
constexpr std::uint64_t kDropChunk = std::uint64_t{64} << 20;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}

// IEEE 754 binary16 to binary32, exactly (every half value is a float value).
float half_to_float(std::uint16_t half) {
  const float sign = (half & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (half >> 10) & 0x1f;
  const int mantissa = half & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity()
                         : std::numeric_limits<float>::quiet_NaN();
  }
  std::uint32_t bits = (std::uint32_t(half & 0x8000) << 16) |
                       (std::uint32_t(exponent - 15 + 127) << 23) | (std::uint32_t(mantissa) << 13);
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// A sequential byte source: bytes in memory, a plain file read with pread, or a gzip stream.
// The first bytes can be looked at before they are consumed (format detection).
class ByteStream {
 public:
  static ByteStream memory(std::span<const std::uint8_t> bytes) {
    ByteStream stream;
    stream.memory_ = bytes;
    stream.size_ = bytes.size();
    return stream;
  }

  static StatusOr<ByteStream> file(const std::filesystem::path& path, bool drop_cache_behind) {
    ByteStream stream;
    stream.name_ = path.string();
    GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      return unavailable(fmt::format("{}: stat: {}", stream.name_, std::strerror(errno)));
    }
    stream.file_bytes_ = static_cast<std::uint64_t>(st.st_size);
    std::uint8_t magic[2] = {0, 0};
    ssize_t n = ::pread(fd.get(), magic, 2, 0);
    if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      stream.gzip_ = gzdopen(fd.get(), "rb");  // closes the descriptor when closed
      if (stream.gzip_ == nullptr) {
        return resource_exhausted(fmt::format("{}: cannot start reading", stream.name_));
      }
      fd.release();
      gzbuffer(stream.gzip_, 1 << 20);
      return stream;
    }
    stream.size_ = stream.file_bytes_;
    stream.drop_cache_behind_ = drop_cache_behind;
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    stream.fd_ = std::move(fd);
    return stream;
  }

  ByteStream() = default;
  ByteStream(ByteStream&& other) noexcept { *this = std::move(other); }
  ByteStream& operator=(ByteStream&& other) noexcept {
    if (this != &other) {
      close();
      name_ = std::move(other.name_);
      memory_ = other.memory_;
      fd_ = std::move(other.fd_);
      gzip_ = std::exchange(other.gzip_, nullptr);
      size_ = other.size_;
      file_bytes_ = other.file_bytes_;
      position_ = other.position_;
      dropped_ = other.dropped_;
      drop_cache_behind_ = other.drop_cache_behind_;
      pending_ = std::move(other.pending_);
    }
    return *this;
  }
  ~ByteStream() { close(); }

  // The total size in bytes when known (memory and plain files; not gzip'd ones).
  std::optional<std::uint64_t> size() const { return size_; }
  std::uint64_t position() const { return position_; }
  bool compressed() const { return gzip_ != nullptr; }
  // Input bytes consumed (compressed bytes for gzip) and the input's size, for progress.
  std::uint64_t raw_position() const {
    if (gzip_ != nullptr) {
      z_off_t offset = gzoffset(gzip_);
      return offset < 0 ? 0 : static_cast<std::uint64_t>(offset);
    }
    return position_;
  }
  std::uint64_t raw_size() const { return gzip_ != nullptr ? file_bytes_ : size_.value_or(0); }

  // Reads up to `bytes` into `out`; fewer only at the end of the input.
  StatusOr<std::size_t> read(void* out, std::size_t bytes) {
    auto* p = static_cast<std::uint8_t*>(out);
    std::size_t got = 0;
    if (!pending_.empty()) {
      std::size_t n = std::min(bytes, pending_.size());
      std::memcpy(p, pending_.data(), n);
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(n));
      got = n;
    }
    while (got < bytes) {
      std::size_t n = 0;
      if (fd_.valid()) {
        ssize_t r = ::pread(fd_.get(), p + got, std::min<std::size_t>(bytes - got, 1 << 30),
                            static_cast<off_t>(position_));
        if (r < 0) {
          if (errno == EINTR) continue;
          return data_loss(fmt::format("{}: read failed: {}", name_, std::strerror(errno)));
        }
        n = static_cast<std::size_t>(r);
      } else if (gzip_ != nullptr) {
        int r = gzread(gzip_, p + got,
                       static_cast<unsigned>(std::min<std::size_t>(bytes - got, 1 << 30)));
        if (r < 0) {
          int code = 0;
          return data_loss(fmt::format("{}: read failed: {}", name_, gzerror(gzip_, &code)));
        }
        n = static_cast<std::size_t>(r);
      } else {
        std::size_t offset = static_cast<std::size_t>(position_);
        n = std::min(bytes - got, memory_.size() - std::min(offset, memory_.size()));
        if (n > 0) std::memcpy(p + got, memory_.data() + offset, n);
      }
      if (n == 0) break;
      got += n;
      position_ += n;
    }
    if (drop_cache_behind_ && position_ - dropped_ >= kDropChunk) {
      ::posix_fadvise(fd_.get(), static_cast<off_t>(dropped_),
                      static_cast<off_t>(position_ - dropped_), POSIX_FADV_DONTNEED);
      dropped_ = position_;
    }
    return got;
  }

  // The next `bytes` bytes without consuming them (fewer at the end of the input).
  StatusOr<std::vector<std::uint8_t>> peek(std::size_t bytes) {
    std::vector<std::uint8_t> head(bytes);
    GPUOPT_ASSIGN_OR_RETURN(std::size_t got, read(head.data(), bytes));
    head.resize(got);
    pending_.insert(pending_.begin(), head.begin(), head.end());
    return head;
  }

 private:
  void close() {
    if (gzip_ != nullptr) gzclose(gzip_);
    gzip_ = nullptr;
    fd_.reset();
  }

  std::string name_;
  std::span<const std::uint8_t> memory_;
  FileDescriptor fd_;
  gzFile gzip_ = nullptr;
  std::optional<std::uint64_t> size_;
  std::uint64_t file_bytes_ = 0;
  // Bytes handed out plus those in pending_ (the stream offset pending_ ends at).
  std::uint64_t position_ = 0;
  std::uint64_t dropped_ = 0;
  bool drop_cache_behind_ = false;
  std::vector<std::uint8_t> pending_;
};

enum class Element { kF32, kF16, kF64, kU8, kI8, kI32, kBeI16, kBeI32, kBeF32, kBeF64 };

std::size_t element_bytes(Element element) {
  switch (element) {
    case Element::kF16:
    case Element::kBeI16:
      return 2;
    case Element::kF64:
    case Element::kBeF64:
      return 8;
    case Element::kU8:
    case Element::kI8:
      return 1;
    default:
      return 4;
  }
}

const char* element_name(Element element) {
  switch (element) {
    case Element::kF32:
    case Element::kBeF32:
      return "float32";
    case Element::kF16:
      return "float16";
    case Element::kF64:
    case Element::kBeF64:
      return "float64";
    case Element::kU8:
      return "uint8";
    case Element::kI8:
      return "int8";
    case Element::kBeI16:
      return "int16";
    case Element::kI32:
    case Element::kBeI32:
      return "int32";
  }
  return "unknown";
}

void convert(Element element, const std::uint8_t* in, std::size_t count, float* out) {
  switch (element) {
    case Element::kF32:
      std::memcpy(out, in, count * 4);
      break;
    case Element::kF16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t half;
        std::memcpy(&half, in + 2 * i, 2);
        out[i] = half_to_float(half);
      }
      break;
    case Element::kF64:
      for (std::size_t i = 0; i < count; ++i) {
        double value;
        std::memcpy(&value, in + 8 * i, 8);
        out[i] = static_cast<float>(value);
      }
      break;
    case Element::kU8:
      for (std::size_t i = 0; i < count; ++i) out[i] = in[i];
      break;
    case Element::kI8:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::int8_t>(in[i]);
      break;
    case Element::kI32:
      for (std::size_t i = 0; i < count; ++i) {
        std::int32_t value;
        std::memcpy(&value, in + 4 * i, 4);
        out[i] = static_cast<float>(value);
      }
      break;
    case Element::kBeI16:
      for (std::size_t i = 0; i < count; ++i) {
        out[i] = static_cast<std::int16_t>((in[2 * i] << 8) | in[2 * i + 1]);
      }
      break;
    case Element::kBeI32:
      for (std::size_t i = 0; i < count; ++i) {
        out[i] = static_cast<float>(static_cast<std::int32_t>(big_endian32(in + 4 * i)));
      }
      break;
    case Element::kBeF32:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t bits = big_endian32(in + 4 * i);
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    case Element::kBeF64:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint64_t bits =
            (std::uint64_t(big_endian32(in + 8 * i)) << 32) | big_endian32(in + 8 * i + 4);
        double value;
        std::memcpy(&value, &bits, 8);
        out[i] = static_cast<float>(value);
      }
      break;
  }
}

const char* format_name(VectorFormat format) {
  switch (format) {
    case VectorFormat::kFvecs:
      return "fvecs";
    case VectorFormat::kBvecs:
      return "bvecs";
    case VectorFormat::kIvecs:
      return "ivecs";
    case VectorFormat::kNpy:
      return "npy";
    case VectorFormat::kIdx:
      return "idx";
    case VectorFormat::kDetect:
      break;
  }
  return "unknown";
}

VectorFormat format_from_name(const std::string& name) {
  std::string lower = std::filesystem::path(name).filename().string();
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ends_with(lower, ".gz")) lower.resize(lower.size() - 3);
  if (ends_with(lower, ".fvecs")) return VectorFormat::kFvecs;
  if (ends_with(lower, ".bvecs")) return VectorFormat::kBvecs;
  if (ends_with(lower, ".ivecs")) return VectorFormat::kIvecs;
  if (ends_with(lower, ".npy")) return VectorFormat::kNpy;
  if (ends_with(lower, ".idx") || ends_with(lower, "-ubyte") ||
      lower.find(".idx") != std::string::npos) {
    return VectorFormat::kIdx;
  }
  return VectorFormat::kDetect;
}

VectorFormat format_from_bytes(std::span<const std::uint8_t> head) {
  if (head.size() >= 6 && head[0] == 0x93 && std::memcmp(head.data() + 1, "NUMPY", 5) == 0) {
    return VectorFormat::kNpy;
  }
  if (head.size() >= 4 && head[0] == 0 && head[1] == 0 && head[2] >= 0x08)
    return VectorFormat::kIdx;
  return VectorFormat::kDetect;
}

// The value text of `key` in a numpy header dict ("'<f4'", "False", "(3, 4)"), or empty.
std::string npy_field(const std::string& header, const std::string& key) {
  auto at = header.find("'" + key + "'");
  if (at == std::string::npos) return {};
  auto colon = header.find(':', at);
  if (colon == std::string::npos) return {};
  auto start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) return {};
  char open = header[start];
  char close = open == '(' ? ')' : open == '\'' ? '\'' : ',';
  auto end = header.find(close, start + 1);
  if (end == std::string::npos) {
    if (close != ',') return {};
    end = header.find('}', start);
    if (end == std::string::npos) return {};
  }
  std::string value = header.substr(start, end - start + (close == ',' ? 0 : 1));
  while (!value.empty() && (value.back() == ' ' || value.back() == '}')) value.pop_back();
  return value;
}

}  // namespace

struct VectorReader::State {
  std::string name;
  ByteStream stream;
  VectorReaderOptions options;
  VectorFormat format = VectorFormat::kDetect;
  Element element = Element::kF32;
  std::size_t dim = 0;
  std::optional<std::size_t> declared_rows;  // from the header (npy, IDX)
  std::optional<std::size_t> rows;           // checked against the input's size
  std::size_t prefix_bytes = 0;              // the fvecs family's per-record dimension
  std::size_t record_bytes = 0;
  std::size_t rows_read = 0;
  std::vector<std::uint8_t> staging;
  Status failed;

  Status fail(Status status) {
    failed = status;
    return status;
  }

  Status parse_vecs_header() {
    element = format == VectorFormat::kFvecs   ? Element::kF32
              : format == VectorFormat::kBvecs ? Element::kU8
                                               : Element::kI32;
    const char* kind = format_name(format);
    GPUOPT_ASSIGN_OR_RETURN(auto head, stream.peek(4));
    if (head.size() < 4) return invalid_argument(fmt::format("{}: {} file is empty", name, kind));
    std::int32_t first_dim;
    std::memcpy(&first_dim, head.data(), 4);
    if (first_dim <= 0 || std::size_t(first_dim) > kMaxDim) {
      return invalid_argument(
          fmt::format("{}: {} dimension {} in the first record (expected 1..{})", name, kind,
                      first_dim, kMaxDim));
    }
    dim = static_cast<std::size_t>(first_dim);
    prefix_bytes = 4;
    record_bytes = 4 + dim * element_bytes(element);
    if (auto size = stream.size()) {
      if (*size % record_bytes != 0) {
        return invalid_argument(fmt::format(
            "{}: {} bytes is not a whole number of {}-byte {} records (dimension {}): truncated?",
            name, *size, record_bytes, kind, dim));
      }
      rows = static_cast<std::size_t>(*size / record_bytes);
    }
    return ok_status();
  }

  Status parse_npy_header() {
    static const std::uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    std::uint8_t start[12];
    GPUOPT_ASSIGN_OR_RETURN(std::size_t got, stream.read(start, 10));
    if (got < 10 || std::memcmp(start, kMagic, 6) != 0) {
      return invalid_argument(fmt::format("{}: not a .npy file (bad magic)", name));
    }
    const std::uint8_t major = start[6];
    std::size_t header_length;
    std::size_t header_start;
    if (major == 1) {
      header_length = start[8] | (std::size_t(start[9]) << 8);
      header_start = 10;
    } else if (major == 2 || major == 3) {
      GPUOPT_ASSIGN_OR_RETURN(got, stream.read(start + 10, 2));
      if (got < 2) return invalid_argument(fmt::format("{}: .npy header truncated", name));
      header_length = start[8] | (std::size_t(start[9]) << 8) | (std::size_t(start[10]) << 16) |
                      (std::size_t(start[11]) << 24);
      header_start = 12;
    } else {
      return invalid_argument(
          fmt::format("{}: .npy format version {} is not supported", name, int(major)));
    }
    auto size = stream.size();
    if ((size && header_length > *size - header_start) || header_length > kMaxNpyHeader) {
      return invalid_argument(fmt::format(
          "{}: .npy header ({} bytes) runs past the end of the file", name, header_length));
    }
    std::string header(header_length, '\0');
    GPUOPT_ASSIGN_OR_RETURN(got, stream.read(header.data(), header_length));
    if (got < header_length) {
      return invalid_argument(fmt::format(
          "{}: .npy header ({} bytes) runs past the end of the file", name, header_length));
    }
    std::replace(header.begin(), header.end(), '"', '\'');
    const std::string descr = npy_field(header, "descr");
    const std::string fortran = npy_field(header, "fortran_order");
    const std::string shape = npy_field(header, "shape");
    if (descr == "'<f4'") {
      element = Element::kF32;
    } else if (descr == "'<f2'") {
      element = Element::kF16;
    } else if (descr == "'<f8'") {
      element = Element::kF64;
    } else if (descr == "'|u1'" || descr == "'<u1'") {
      element = Element::kU8;
    } else if (descr == "'|i1'" || descr == "'<i1'") {
      element = Element::kI8;
    } else {
      return invalid_argument(fmt::format(
          "{}: .npy dtype {} is not supported (use float32, float16, float64, uint8 or int8, "
          "little-endian)",
          name, descr.empty() ? "(missing)" : descr));
    }
    if (fortran != "False") {
      return invalid_argument(
          fmt::format("{}: .npy array has fortran_order {}: only C order is read (save it with "
                      "np.ascontiguousarray)",
                      name, fortran.empty() ? "(missing)" : fortran));
    }
    // shape "(rows, dim)"
    std::size_t dims[2] = {0, 0};
    int count = 0;
    if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
      return invalid_argument(fmt::format("{}: .npy shape {} is not understood", name,
                                          shape.empty() ? "(missing)" : shape));
    }
    for (std::size_t i = 1; i + 1 < shape.size();) {
      while (i + 1 < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
      if (i + 1 >= shape.size()) break;
      std::size_t value = 0;
      bool digits = false;
      while (i + 1 < shape.size() && shape[i] >= '0' && shape[i] <= '9') {
        if (value > kMaxElements) {
          return invalid_argument(fmt::format("{}: .npy shape {} is out of range", name, shape));
        }
        value = value * 10 + std::size_t(shape[i] - '0');
        ++i;
        digits = true;
      }
      if (i + 1 < shape.size() && shape[i] == 'L') ++i;  // Python 2 long
      if (!digits || (i + 1 < shape.size() && shape[i] != ',' && shape[i] != ' ')) {
        return invalid_argument(fmt::format("{}: .npy shape {} is not understood", name, shape));
      }
      if (count < 2) dims[count] = value;
      ++count;
    }
    if (count != 2) {
      return invalid_argument(
          fmt::format("{}: .npy shape {} must be 2-D (rows, dimension)", name, shape));
    }
    if (dims[1] == 0 || dims[1] > kMaxDim || dims[0] > kMaxElements / dims[1]) {
      return invalid_argument(
          fmt::format("{}: .npy shape ({}, {}) is out of range", name, dims[0], dims[1]));
    }
    dim = dims[1];
    record_bytes = dim * element_bytes(element);
    declared_rows = dims[0];
    if (size) {
      const std::uint64_t data_bytes = *size - (header_start + header_length);
      const std::uint64_t need = std::uint64_t(dims[0]) * record_bytes;
      if (data_bytes < need) {
        return invalid_argument(
            fmt::format("{}: .npy data is {} bytes, shape ({}, {}) of {} needs {}: truncated", name,
                        data_bytes, dims[0], dims[1], element_name(element), need));
      }
      rows = dims[0];
    }
    return ok_status();
  }

  Status parse_idx_header() {
    std::uint8_t head[4 + 4 * 4];
    GPUOPT_ASSIGN_OR_RETURN(std::size_t got, stream.read(head, 4));
    if (got < 4 || head[0] != 0 || head[1] != 0) {
      return invalid_argument(fmt::format("{}: not an IDX file (bad magic)", name));
    }
    const std::uint8_t type = head[2];
    const std::size_t rank = head[3];
    switch (type) {
      case 0x08:
        element = Element::kU8;
        break;
      case 0x09:
        element = Element::kI8;
        break;
      case 0x0B:
        element = Element::kBeI16;
        break;
      case 0x0C:
        element = Element::kBeI32;
        break;
      case 0x0D:
        element = Element::kBeF32;
        break;
      case 0x0E:
        element = Element::kBeF64;
        break;
      default:
        return invalid_argument(
            fmt::format("{}: IDX element type 0x{:02x} is unknown", name, type));
    }
    if (rank >= 1 && rank <= 4) {
      GPUOPT_ASSIGN_OR_RETURN(got, stream.read(head + 4, 4 * rank));
    }
    if (rank < 1 || rank > 4 || got < 4 * rank) {
      return invalid_argument(
          fmt::format("{}: IDX rank {} is unsupported or its header is truncated", name, rank));
    }
    const std::size_t declared = big_endian32(head + 4);
    dim = 1;
    for (std::size_t d = 1; d < rank; ++d) {
      std::size_t extent = big_endian32(head + 4 + 4 * d);
      if (extent == 0 || dim > kMaxDim / extent) {
        return invalid_argument(
            fmt::format("{}: IDX item of {} values is out of range (dimension must be 1..{})", name,
                        dim * std::max<std::size_t>(extent, 1), kMaxDim));
      }
      dim *= extent;
    }
    record_bytes = dim * element_bytes(element);
    declared_rows = declared;
    if (auto size = stream.size()) {
      const std::uint64_t data_bytes = *size - (4 + 4 * rank);
      const std::uint64_t need = std::uint64_t(declared) * record_bytes;
      if (data_bytes != need) {
        return invalid_argument(fmt::format(
            "{}: IDX data is {} bytes, header says {} items of {} values ({} bytes): {}", name,
            data_bytes, declared, dim, need, data_bytes < need ? "truncated" : "extra bytes"));
      }
      rows = declared;
    }
    return ok_status();
  }

  Status parse_header() {
    if (format == VectorFormat::kDetect) format = format_from_name(name);
    if (format == VectorFormat::kDetect) {
      GPUOPT_ASSIGN_OR_RETURN(auto head, stream.peek(8));
      format = format_from_bytes(head);
    }
    switch (format) {
      case VectorFormat::kFvecs:
      case VectorFormat::kBvecs:
      case VectorFormat::kIvecs:
        return parse_vecs_header();
      case VectorFormat::kNpy:
        return parse_npy_header();
      case VectorFormat::kIdx:
        return parse_idx_header();
      case VectorFormat::kDetect:
        break;
    }
    return invalid_argument(fmt::format(
        "{}: unknown vector file format (expected .fvecs, .bvecs, .ivecs, .npy or IDX, optionally "
        ".gz)",
        name));
  }

  // Converts `count` whole records from `raw` into `out`, checking each record.
  Status convert_records(const std::uint8_t* raw, std::size_t count, float* out) {
    for (std::size_t r = 0; r < count; ++r) {
      const std::uint8_t* record = raw + r * record_bytes;
      if (prefix_bytes != 0) {
        std::int32_t row_dim;
        std::memcpy(&row_dim, record, 4);
        if (row_dim < 0 || std::size_t(row_dim) != dim) {
          return invalid_argument(fmt::format("{}: record {} has dimension {}, the first has {}",
                                              name, rows_read + r, row_dim, dim));
        }
      }
      convert(element, record + prefix_bytes, dim, out + r * dim);
    }
    return ok_status();
  }

  Status check_finite(const float* values, std::size_t count) const {
    for (std::size_t i = 0; i < count * dim; ++i) {
      if (!std::isfinite(values[i])) {
        return invalid_argument(fmt::format("{}: vector {} has a non-finite value at index {}",
                                            name, rows_read + i / dim, i % dim));
      }
    }
    return ok_status();
  }

  Status truncated(std::size_t whole_rows, std::size_t extra_bytes) const {
    const std::size_t at = rows_read + whole_rows;
    if (declared_rows) {
      return invalid_argument(
          fmt::format("{}: truncated: the header declares {} rows, the data ends {} row {}", name,
                      *declared_rows, extra_bytes != 0 ? "inside" : "before", at));
    }
    return invalid_argument(fmt::format("{}: truncated: the data ends inside record {}", name, at));
  }

  StatusOr<std::size_t> read(float* out, std::size_t max_rows) {
    if (!failed.ok()) return failed;
    std::size_t want = max_rows;
    const std::optional<std::size_t> limit = rows ? rows : declared_rows;
    if (limit) want = std::min(want, *limit - std::min(*limit, rows_read));
    const bool direct = element == Element::kF32 && prefix_bytes == 0;
    const std::size_t step = std::max<std::size_t>(1, options.staging_bytes / record_bytes);
    std::size_t done = 0;
    while (done < want) {
      const std::size_t n = std::min(step, want - done);
      std::uint8_t* raw;
      if (direct) {
        raw = reinterpret_cast<std::uint8_t*>(out + done * dim);
      } else {
        if (staging.size() < n * record_bytes) staging.resize(n * record_bytes);
        raw = staging.data();
      }
      auto got = stream.read(raw, n * record_bytes);
      if (!got.ok()) return fail(got.status());
      const std::size_t whole = *got / record_bytes;
      const std::size_t extra = *got % record_bytes;
      if (extra != 0 || (limit && whole < n)) return fail(truncated(whole, extra));
      if (!direct) {
        if (Status status = convert_records(raw, whole, out + done * dim); !status.ok()) {
          return fail(status);
        }
      }
      if (Status status = check_finite(out + done * dim, whole); !status.ok()) return fail(status);
      rows_read += whole;
      done += whole;
      if (whole < n) break;  // the end of a file whose length was not known
    }
    return done;
  }
};

VectorReader::VectorReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
VectorReader::~VectorReader() = default;

StatusOr<std::unique_ptr<VectorReader>> VectorReader::open(const std::filesystem::path& path,
                                                           const VectorReaderOptions& options) {
  auto state = std::make_unique<State>();
  state->name = path.string();
  state->options = options;
  state->format = options.format;
  GPUOPT_ASSIGN_OR_RETURN(state->stream, ByteStream::file(path, options.drop_cache_behind));
  GPUOPT_RETURN_IF_ERROR(state->parse_header());
  return std::unique_ptr<VectorReader>(new VectorReader(std::move(state)));
}

StatusOr<std::unique_ptr<VectorReader>> VectorReader::open_bytes(
    std::span<const std::uint8_t> bytes, const std::string& name,
    const VectorReaderOptions& options) {
  auto state = std::make_unique<State>();
  state->name = name;
  state->options = options;
  state->format = options.format;
  state->stream = ByteStream::memory(bytes);
  GPUOPT_RETURN_IF_ERROR(state->parse_header());
  return std::unique_ptr<VectorReader>(new VectorReader(std::move(state)));
}

const std::string& VectorReader::name() const { return state_->name; }
std::size_t VectorReader::dim() const { return state_->dim; }
std::optional<std::size_t> VectorReader::rows() const { return state_->rows; }
std::string_view VectorReader::format() const { return format_name(state_->format); }
std::string_view VectorReader::element_type() const { return element_name(state_->element); }
std::size_t VectorReader::rows_read() const { return state_->rows_read; }
std::uint64_t VectorReader::bytes_read() const { return state_->stream.raw_position(); }
std::uint64_t VectorReader::bytes_total() const { return state_->stream.raw_size(); }

StatusOr<std::size_t> VectorReader::read(float* out, std::size_t max_rows) {
  return state_->read(out, max_rows);
}

namespace {

StatusOr<VectorFile> read_all(VectorReader& reader, std::size_t max_rows) {
  VectorFile file;
  file.format = std::string(reader.format());
  file.dim = reader.dim();
  const std::size_t limit = max_rows == 0 ? std::numeric_limits<std::size_t>::max() : max_rows;
  if (auto rows = reader.rows()) {
    // The row count was checked against the input's size: allocating it is safe.
    const std::size_t count = std::min(*rows, limit);
    file.values.resize(count * file.dim);
    GPUOPT_ASSIGN_OR_RETURN(file.rows, reader.read(file.values.data(), count));
    return file;
  }
  // Unknown length (gzip): grow as rows arrive, never from a declared size.
  const std::size_t chunk = std::max<std::size_t>(1, (std::size_t{16} << 20) / (4 * file.dim));
  while (file.rows < limit) {
    const std::size_t want = std::min(chunk, limit - file.rows);
    file.values.resize((file.rows + want) * file.dim);
    GPUOPT_ASSIGN_OR_RETURN(std::size_t got,
                            reader.read(file.values.data() + file.rows * file.dim, want));
    file.rows += got;
    if (got < want) break;
  }
  file.values.resize(file.rows * file.dim);
  file.values.shrink_to_fit();
  return file;
}

StatusOr<VectorFile> parse_bytes(std::span<const std::uint8_t> bytes, const std::string& name,
                                 VectorFormat format, std::size_t max_rows) {
  GPUOPT_ASSIGN_OR_RETURN(auto reader, VectorReader::open_bytes(bytes, name, {.format = format}));
  return read_all(*reader, max_rows);
}

}  // namespace

StatusOr<VectorFile> read_vector_file(const std::filesystem::path& path, std::size_t max_rows) {
  GPUOPT_ASSIGN_OR_RETURN(auto reader, VectorReader::open(path));
  return read_all(*reader, max_rows);
}

StatusOr<VectorFile> parse_fvecs(std::span<const std::uint8_t> bytes, const std::string& name,
                                 std::size_t max_rows) {
  return parse_bytes(bytes, name, VectorFormat::kFvecs, max_rows);
}

StatusOr<VectorFile> parse_npy(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows) {
  return parse_bytes(bytes, name, VectorFormat::kNpy, max_rows);
}

StatusOr<VectorFile> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows) {
  return parse_bytes(bytes, name, VectorFormat::kIdx, max_rows);
}

struct MetadataLineReader::State {
  std::string name;
  FileDescriptor fd;
  std::size_t max_line_bytes = 0;
  std::vector<char> buffer;
  std::size_t begin = 0;  // unread bytes are buffer[begin, end)
  std::size_t end = 0;
  bool at_eof = false;
  std::size_t lines = 0;
  Status failed;

  // The next line without its terminator, or nullopt at the end of the file.
  StatusOr<std::optional<std::string_view>> next_line() {
    std::size_t scanned = begin;
    while (true) {
      const void* newline =
          end > scanned ? std::memchr(buffer.data() + scanned, '\n', end - scanned) : nullptr;
      if (newline != nullptr) {
        const std::size_t at = static_cast<const char*>(newline) - buffer.data();
        if (at - begin > max_line_bytes) {
          return invalid_argument(
              fmt::format("{}: line {} is longer than {} bytes", name, lines + 1, max_line_bytes));
        }
        std::string_view line(buffer.data() + begin, at - begin);
        begin = at + 1;
        return std::optional<std::string_view>(line);
      }
      if (end - begin > max_line_bytes) {
        return invalid_argument(
            fmt::format("{}: line {} is longer than {} bytes", name, lines + 1, max_line_bytes));
      }
      if (at_eof) {
        if (begin == end) return std::optional<std::string_view>();
        std::string_view line(buffer.data() + begin, end - begin);  // no final newline
        begin = end;
        return std::optional<std::string_view>(line);
      }
      // Move the partial line to the front and read more after it.
      if (end > begin) std::memmove(buffer.data(), buffer.data() + begin, end - begin);
      end -= begin;
      begin = 0;
      scanned = end;
      if (buffer.size() - end < (1 << 16)) buffer.resize(end + (1 << 20));
      ssize_t n = ::read(fd.get(), buffer.data() + end, buffer.size() - end);
      if (n < 0) {
        if (errno == EINTR) continue;
        return data_loss(fmt::format("{}: read failed: {}", name, std::strerror(errno)));
      }
      if (n == 0) at_eof = true;
      end += static_cast<std::size_t>(n);
    }
  }

  StatusOr<std::size_t> read(std::size_t count, std::vector<Metadata>* out) {
    if (!failed.ok()) return failed;
    std::size_t done = 0;
    while (done < count) {
      auto line = next_line();
      if (!line.ok()) return failed = line.status();
      if (!line->has_value()) break;
      ++lines;
      std::string_view text = **line;
      if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
      if (text.find_first_not_of(" \t") == std::string_view::npos) {
        return failed = invalid_argument(fmt::format(
                   "{}: line {} is empty (write {{}} for a row without metadata)", name, lines));
      }
      auto metadata = parse_metadata(text);
      if (!metadata.ok()) {
        return failed = invalid_argument(
                   fmt::format("{}: line {}: {}", name, lines, metadata.status().message()));
      }
      if (out != nullptr) out->push_back(std::move(*metadata));
      ++done;
    }
    return done;
  }
};

MetadataLineReader::MetadataLineReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
MetadataLineReader::~MetadataLineReader() = default;

StatusOr<std::unique_ptr<MetadataLineReader>> MetadataLineReader::open(
    const std::filesystem::path& path, std::size_t max_line_bytes) {
  auto state = std::make_unique<State>();
  state->name = path.string();
  state->max_line_bytes = std::max<std::size_t>(1, max_line_bytes);
  GPUOPT_ASSIGN_OR_RETURN(state->fd, open_regular_file(path));
  ::posix_fadvise(state->fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<MetadataLineReader>(new MetadataLineReader(std::move(state)));
}

StatusOr<std::size_t> MetadataLineReader::read(std::size_t count, std::vector<Metadata>* out) {
  return state_->read(count, out);
}

std::size_t MetadataLineReader::lines_read() const { return state_->lines; }

StatusOr<std::size_t> count_metadata_lines(const std::filesystem::path& path,
                                           std::size_t max_line_bytes) {
  GPUOPT_ASSIGN_OR_RETURN(auto reader, MetadataLineReader::open(path, max_line_bytes));
  std::size_t total = 0;
  while (true) {
    GPUOPT_ASSIGN_OR_RETURN(std::size_t n, reader->read(65536, nullptr));
    total += n;
    if (n < 65536) return total;
  }
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
