// safetensors and .npy parsing/writing with every offset checked (see safetensors.hpp).
#include "gpuopt/kernels/safetensors.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "gpuopt/core/regular_file.hpp"

namespace gpuopt::kernels {

namespace {

struct DtypeInfo {
  TensorDtype dtype;
  const char* name;
  std::size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {TensorDtype::kF16, "F16", 2},   {TensorDtype::kBF16, "BF16", 2}, {TensorDtype::kF32, "F32", 4},
    {TensorDtype::kF64, "F64", 8},   {TensorDtype::kI8, "I8", 1},     {TensorDtype::kU8, "U8", 1},
    {TensorDtype::kI16, "I16", 2},   {TensorDtype::kU16, "U16", 2},   {TensorDtype::kI32, "I32", 4},
    {TensorDtype::kU32, "U32", 4},   {TensorDtype::kI64, "I64", 8},   {TensorDtype::kU64, "U64", 8},
    {TensorDtype::kBool, "BOOL", 1},
};

// The spec caps the header at 100 MB; anything larger is a corrupt length.
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

// pread of exactly `size` bytes at `offset`; a file that ends first (it shrank after the header
// was checked) is DATA_LOSS naming it.
Status read_exactly(int fd, void* out, std::size_t size, std::uint64_t offset,
                    const std::string& path) {
  auto* p = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (n == 0) {
      return data_loss(fmt::format("{} ends at byte {}, before the {} bytes at offset {}", path,
                                   offset + done, size, offset));
    }
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

}  // namespace

std::string_view tensor_dtype_name(TensorDtype dtype) {
  for (const auto& info : kDtypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

std::size_t tensor_dtype_bytes(TensorDtype dtype) {
  for (const auto& info : kDtypes) {
    if (info.dtype == dtype) return info.bytes;
  }
  return 0;
}

StatusOr<TensorDtype> parse_tensor_dtype(std::string_view name) {
  for (const auto& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return invalid_argument(fmt::format("unknown tensor dtype '{}'", std::string(name)));
}

std::int64_t TensorView::elements() const {
  std::int64_t count = 1;
  for (std::int64_t d : shape) count *= d;
  return count;
}

StatusOr<std::vector<std::byte>> read_file(const std::string& path) {
  // Checkpoints, inputs and configs are regular files: a FIFO or device named here is refused
  // instead of blocking the read.
  GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return data_loss(fmt::format("cannot read the size of {}: {}", path, std::strerror(errno)));
  }
  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (n == 0) return data_loss(fmt::format("short read of {}", path));
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

Status write_file(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return permission_denied(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) return data_loss(fmt::format("short write to {}", path));
  return ok_status();
}

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // Only the header is read now; each tensor is read (pread) when it is asked for, so a
  // checkpoint far larger than memory costs what its used tensors do.
  GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return data_loss(fmt::format("cannot read the size of {}: {}", path, std::strerror(errno)));
  }
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: not a valid safetensors file: {}", path, what));
  };
  if (file_bytes < 8)
    return bad(fmt::format("{} bytes, too short for the header length", file_bytes));
  std::byte length[8];
  GPUOPT_RETURN_IF_ERROR(read_exactly(fd.get(), length, 8, 0, path));
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | static_cast<std::uint8_t>(length[i]);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return bad(
        fmt::format("header length {} exceeds the file ({} bytes)", header_bytes, file_bytes));
  }
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  GPUOPT_RETURN_IF_ERROR(read_exactly(fd.get(), header.data(), header.size(), 8, path));
  SafetensorsFile file;
  file.origin_ = path;
  GPUOPT_RETURN_IF_ERROR(file.parse_header(header, file_bytes));
  file.fd_ = std::make_shared<FileDescriptor>(std::move(fd));
  return file;
}

StatusOr<SafetensorsFile> SafetensorsFile::parse(std::vector<std::byte> bytes, std::string origin) {
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: not a valid safetensors file: {}", origin, what));
  };
  if (bytes.size() < 8)
    return bad(fmt::format("{} bytes, too short for the header length", bytes.size()));
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | static_cast<std::uint8_t>(bytes[i]);
  if (header_bytes > kMaxHeaderBytes || header_bytes > bytes.size() - 8) {
    return bad(
        fmt::format("header length {} exceeds the file ({} bytes)", header_bytes, bytes.size()));
  }
  SafetensorsFile file;
  file.origin_ = std::move(origin);
  GPUOPT_RETURN_IF_ERROR(file.parse_header(
      std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, header_bytes),
      bytes.size()));
  file.bytes_ = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  return file;
}

Status SafetensorsFile::parse_header(std::string_view header_text, std::uint64_t file_bytes) {
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: not a valid safetensors file: {}", origin_, what));
  };
  nlohmann::json header = nlohmann::json::parse(header_text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  data_start_ = 8 + header_text.size();
  const std::uint64_t data_bytes = file_bytes - data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string())
          return bad(fmt::format("__metadata__.{} is not a string", m.key()));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      return bad(fmt::format("tensor '{}' lacks dtype, shape or data_offsets", name));
    }
    if (!value["dtype"].is_string())
      return bad(fmt::format("tensor '{}': dtype is not a string", name));
    auto dtype = parse_tensor_dtype(value["dtype"].get<std::string>());
    if (!dtype.ok()) return bad(fmt::format("tensor '{}': {}", name, dtype.status().message()));
    Entry entry;
    entry.dtype = *dtype;
    if (!value["shape"].is_array())
      return bad(fmt::format("tensor '{}': shape is not a list", name));
    std::uint64_t elements = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        return bad(fmt::format("tensor '{}': shape holds a non-integer or negative size", name));
      }
      const auto size = d.get<std::uint64_t>();
      if (size != 0 && elements > std::numeric_limits<std::uint64_t>::max() / 16 / size) {
        return bad(fmt::format("tensor '{}': shape overflows", name));
      }
      elements *= size;
      entry.shape.push_back(static_cast<std::int64_t>(size));
    }
    const nlohmann::json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return bad(fmt::format("tensor '{}': data_offsets is not [begin, end]", name));
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_bytes) {
      return bad(fmt::format("tensor '{}': data_offsets [{}, {}] outside the {} data bytes", name,
                             begin, end, data_bytes));
    }
    const std::uint64_t expected = elements * tensor_dtype_bytes(entry.dtype);
    if (end - begin != expected) {
      return bad(fmt::format("tensor '{}': {} data bytes, but shape and dtype {} need {}", name,
                             end - begin, tensor_dtype_name(entry.dtype), expected));
    }
    entry.begin = static_cast<std::size_t>(begin);
    entry.end = static_cast<std::size_t>(end);
    entries_.emplace(name, std::move(entry));
  }
  return ok_status();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

StatusOr<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return not_found(fmt::format("{}: no tensor named '{}'", origin_, std::string(name)));
  }
  TensorView view;
  view.name = it->first;
  view.dtype = it->second.dtype;
  view.shape = it->second.shape;
  const std::size_t size = it->second.end - it->second.begin;
  if (bytes_ != nullptr) {
    view.storage = bytes_;
    view.data = std::span<const std::byte>(bytes_->data() + data_start_ + it->second.begin, size);
    return view;
  }
  auto storage = std::make_shared<std::vector<std::byte>>(size);
  GPUOPT_RETURN_IF_ERROR(
      read_exactly(fd_->get(), storage->data(), size, data_start_ + it->second.begin, origin_)
          .with_context(fmt::format("tensor '{}'", view.name)));
  view.data = std::span<const std::byte>(storage->data(), size);
  view.storage = std::move(storage);
  return view;
}

StatusOr<std::vector<std::int32_t>> tensor_as_int32(const TensorView& tensor) {
  if (tensor.dtype != TensorDtype::kI32 && tensor.dtype != TensorDtype::kU32) {
    return invalid_argument(fmt::format("tensor '{}' is {}, expected I32", tensor.name,
                                        tensor_dtype_name(tensor.dtype)));
  }
  std::vector<std::int32_t> out(tensor.data.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), tensor.data.data(), out.size() * 4);
  return out;
}

StatusOr<std::vector<std::uint16_t>> tensor_as_float16(const TensorView& tensor) {
  if (tensor.dtype != TensorDtype::kF16) {
    return invalid_argument(fmt::format("tensor '{}' is {}, expected F16", tensor.name,
                                        tensor_dtype_name(tensor.dtype)));
  }
  std::vector<std::uint16_t> out(tensor.data.size() / 2);
  if (!out.empty()) std::memcpy(out.data(), tensor.data.data(), out.size() * 2);
  return out;
}

std::vector<std::byte> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const auto& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor_dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((length >> (8 * i)) & 0xffu);
  std::memcpy(out.data() + 8, text.data(), text.size());
  for (const auto& tensor : tensors) out.insert(out.end(), tensor.data.begin(), tensor.data.end());
  return out;
}

// ---- .npy ----

namespace {

// Finds `'key': ` in a numpy header dict and returns the text after it.
std::string_view after_key(std::string_view header, std::string_view key) {
  const std::string quoted = fmt::format("'{}'", std::string(key));
  const std::size_t at = header.find(quoted);
  if (at == std::string_view::npos) return {};
  std::size_t pos = header.find(':', at + quoted.size());
  if (pos == std::string_view::npos) return {};
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  return header.substr(pos);
}

}  // namespace

StatusOr<NpyArray> parse_npy(std::span<const std::byte> bytes, const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: not a usable .npy file: {}", origin, what));
  };
  static constexpr char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) return bad("no NUMPY magic");
  const auto major = static_cast<std::uint8_t>(bytes[6]);
  std::size_t header_bytes = 0;
  std::size_t header_start = 0;
  if (major == 1) {
    header_bytes = static_cast<std::uint8_t>(bytes[8]) | (static_cast<std::uint8_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header length");
    for (int i = 11; i >= 8; --i)
      header_bytes = (header_bytes << 8) | static_cast<std::uint8_t>(bytes[i]);
    header_start = 12;
  } else {
    return bad(fmt::format("format version {} is not supported", major));
  }
  if (header_bytes > bytes.size() - header_start)
    return bad("header runs past the end of the file");
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + header_start,
                                header_bytes);
  NpyArray array;
  std::string_view descr = after_key(header, "descr");
  if (descr.size() < 2 || descr[0] != '\'') return bad("no 'descr'");
  descr =
      descr.substr(1, descr.find('\'', 1) == std::string_view::npos ? 0 : descr.find('\'', 1) - 1);
  if (descr == "<f2") {
    array.dtype = TensorDtype::kF16;
  } else if (descr == "<f4") {
    array.dtype = TensorDtype::kF32;
  } else if (descr == "<V2" || descr == "|V2" || descr == "bfloat16") {
    array.dtype = TensorDtype::kBF16;
  } else {
    return bad(fmt::format("dtype '{}' is not float16, bfloat16 or float32 (little-endian)",
                           std::string(descr)));
  }
  if (after_key(header, "fortran_order").substr(0, 4) != "Fals") {
    return bad("fortran_order arrays are not supported; save with C order");
  }
  std::string_view shape = after_key(header, "shape");
  if (shape.empty() || shape[0] != '(' || shape.find(')') == std::string_view::npos) {
    return bad("no 'shape'");
  }
  shape = shape.substr(1, shape.find(')') - 1);
  std::vector<std::int64_t> dims;
  std::size_t pos = 0;
  while (pos < shape.size()) {
    while (pos < shape.size() && (shape[pos] == ' ' || shape[pos] == ',')) ++pos;
    if (pos >= shape.size()) break;
    std::int64_t value = 0;
    bool digits = false;
    while (pos < shape.size() && shape[pos] >= '0' && shape[pos] <= '9') {
      value = value * 10 + (shape[pos] - '0');
      if (value > (std::int64_t{1} << 40)) return bad("shape too large");
      digits = true;
      ++pos;
    }
    if (!digits) return bad(fmt::format("cannot read shape '({})'", std::string(shape)));
    dims.push_back(value);
  }
  if (dims.size() == 1) dims.insert(dims.begin(), 1);
  if (dims.size() != 2) return bad(fmt::format("{}-D array; expected 2-D [M, K]", dims.size()));
  array.rows = dims[0];
  array.cols = dims[1];
  const std::size_t need =
      static_cast<std::size_t>(array.rows * array.cols) * tensor_dtype_bytes(array.dtype);
  const std::size_t have = bytes.size() - header_start - header_bytes;
  if (have != need) {
    return bad(fmt::format("{} data bytes, but shape ({}, {}) needs {}", have, array.rows,
                           array.cols, need));
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header_start + header_bytes),
                    bytes.end());
  return array;
}

std::vector<std::byte> serialize_npy(const NpyArray& array) {
  const char* descr = array.dtype == TensorDtype::kF16    ? "<f2"
                      : array.dtype == TensorDtype::kBF16 ? "<V2"
                                                          : "<f4";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}, {}), }}",
                                   descr, array.rows, array.cols);
  // Version 1.0: magic(6) + version(2) + length(2) + header, padded with spaces to 64 and '\n'.
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::vector<std::byte> out(10 + header.size());
  std::memcpy(out.data(), "\x93NUMPY\x01\x00", 8);
  out[8] = static_cast<std::byte>(header.size() & 0xffu);
  out[9] = static_cast<std::byte>(header.size() >> 8);
  std::memcpy(out.data() + 10, header.data(), header.size());
  out.insert(out.end(), array.data.begin(), array.data.end());
  return out;
}

// ---- checkpoints ----

StatusOr<QuantizeConfig> parse_quantize_config(std::string_view json_text,
                                               const std::string& origin) {
  nlohmann::json json = nlohmann::json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return invalid_argument(fmt::format("{}: not a JSON object", origin));
  }
  if (json.contains("quantization_config") && json["quantization_config"].is_object()) {
    json = json["quantization_config"];
  }
  auto integer = [&](std::initializer_list<const char*> keys, int fallback) {
    for (const char* key : keys) {
      if (json.contains(key) && json[key].is_number_integer()) return json[key].get<int>();
    }
    return fallback;
  };
  auto text = [&](const char* key) {
    return json.contains(key) && json[key].is_string() ? json[key].get<std::string>()
                                                       : std::string();
  };
  QuantizeConfig config;
  const int bits = integer({"bits", "w_bit"}, 4);
  if (bits != 4) {
    return invalid_argument(
        fmt::format("{}: {}-bit weights; only 4-bit is supported", origin, bits));
  }
  config.group_size = integer({"group_size", "q_group_size"}, 128);
  const std::string method = text("quant_method");
  const std::string checkpoint_format = text("checkpoint_format");
  if (method == "awq" || checkpoint_format == "awq") {
    config.format = QuantFormat::kAwq;
    if (json.contains("version") && json["version"].is_string()) {
      std::string version = json["version"].get<std::string>();
      for (char& c : version) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (version != "gemm") {
        return invalid_argument(fmt::format(
            "{}: AWQ version '{}' is not supported (only the GEMM packing)", origin, version));
      }
    }
  } else if (method.empty() || method == "gptq") {
    config.format = QuantFormat::kGptq;
    config.gptq_zeros = checkpoint_format == "gptq_v2" ? GptqZeros::kV2 : GptqZeros::kV1MinusOne;
    config.desc_act =
        json.contains("desc_act") && json["desc_act"].is_boolean() && json["desc_act"].get<bool>();
  } else {
    return invalid_argument(
        fmt::format("{}: quant_method '{}' is not gptq or awq", origin, method));
  }
  return config;
}

StatusOr<CheckpointLayer> load_checkpoint_layer(const SafetensorsFile& file, std::string_view layer,
                                                const QuantizeConfig& config) {
  const std::string prefix(layer);
  auto context = [&](const Status& status) {
    return status.with_context(fmt::format("{}: layer '{}'", file.origin(), prefix));
  };
  auto qweight_view = file.tensor(prefix + ".qweight");
  if (!qweight_view.ok()) {
    return not_found(fmt::format("{}: no tensor '{}.qweight' (is '{}' a quantized linear layer?)",
                                 file.origin(), prefix, prefix));
  }
  GPUOPT_ASSIGN_OR_RETURN(TensorView scales_view, file.tensor(prefix + ".scales"));
  if (qweight_view->shape.size() != 2 || scales_view.shape.size() != 2) {
    return context(invalid_argument("qweight and scales must be 2-D"));
  }
  CheckpointLayer out;
  out.format = config.format;
  out.gptq_zeros = config.gptq_zeros;
  const std::int64_t rows = qweight_view->shape[0];
  const std::int64_t cols = qweight_view->shape[1];
  const std::int64_t k = config.format == QuantFormat::kGptq ? rows * 8 : rows;
  const std::int64_t n = config.format == QuantFormat::kGptq ? cols : cols * 8;
  if (k <= 0 || n <= 0 || k > (1 << 24) || n > (1 << 24)) {
    return context(
        invalid_argument(fmt::format("qweight shape [{}, {}] is not usable", rows, cols)));
  }
  out.k = static_cast<int>(k);
  out.n = static_cast<int>(n);
  const std::int64_t groups = scales_view.shape[0];
  if (scales_view.shape[1] != n || groups <= 0 || k % groups != 0) {
    return context(invalid_argument(
        fmt::format("scales shape [{}, {}] does not fit K={} N={} (expected [K/group_size, N])",
                    scales_view.shape[0], scales_view.shape[1], k, n)));
  }
  out.group_size = static_cast<int>(k / groups);
  // group_size 0 = not configured: take it from the shapes.
  const int config_group = config.group_size < 0 ? out.k : config.group_size;
  if (config.group_size != 0 && config_group != out.group_size) {
    return context(invalid_argument(
        fmt::format("the config says group_size={} but scales have {} groups over K={}",
                    config.group_size, groups, k)));
  }
  GPUOPT_ASSIGN_OR_RETURN(out.qweight, tensor_as_int32(*qweight_view));
  GPUOPT_ASSIGN_OR_RETURN(out.scales, tensor_as_float16(scales_view));
  if (file.contains(prefix + ".qzeros")) {
    GPUOPT_ASSIGN_OR_RETURN(TensorView zeros_view, file.tensor(prefix + ".qzeros"));
    GPUOPT_ASSIGN_OR_RETURN(out.qzeros, tensor_as_int32(zeros_view));
  }
  if (config.format == QuantFormat::kGptq && file.contains(prefix + ".g_idx")) {
    GPUOPT_ASSIGN_OR_RETURN(TensorView g_idx_view, file.tensor(prefix + ".g_idx"));
    if (g_idx_view.dtype == TensorDtype::kI64) {
      out.g_idx.resize(g_idx_view.data.size() / 8);
      for (std::size_t i = 0; i < out.g_idx.size(); ++i) {
        std::int64_t value;
        std::memcpy(&value, g_idx_view.data.data() + 8 * i, 8);
        out.g_idx[i] = static_cast<std::int32_t>(value);
      }
    } else {
      GPUOPT_ASSIGN_OR_RETURN(out.g_idx, tensor_as_int32(g_idx_view));
    }
  }
  return out;
}

}  // namespace gpuopt::kernels
