// Reading checkpoints: safetensors files (8-byte header length, JSON header, raw data) and small
// 2-D .npy arrays (fp16/bf16/fp32) for `gpuopt gemm`. Every offset and size is bounds-checked and
// a malformed file gives an error naming the file and what is wrong, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/regular_file.hpp"
#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/quant_formats.hpp"

namespace gpuopt::kernels {

enum class TensorDtype {
  kF16,
  kBF16,
  kF32,
  kF64,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool
};
std::string_view tensor_dtype_name(TensorDtype dtype);  // safetensors spelling: "F16", "I32", ...
std::size_t tensor_dtype_bytes(TensorDtype dtype);
StatusOr<TensorDtype> parse_tensor_dtype(std::string_view name);

struct TensorView {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
  // What `data` points into: the tensor's own bytes, read when it was asked for, or the whole
  // buffer of a parsed file. Copies of the view share it.
  std::shared_ptr<const std::vector<std::byte>> storage;
  std::int64_t elements() const;
};

class SafetensorsFile {
 public:
  // Reads and checks the header only (every tensor must lie inside the file); tensor() then reads
  // that tensor's bytes with pread. Memory follows the tensors asked for, never the file's size.
  static StatusOr<SafetensorsFile> open(const std::string& path);
  // `origin` names the bytes in error messages.
  static StatusOr<SafetensorsFile> parse(std::vector<std::byte> bytes, std::string origin);

  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  StatusOr<TensorView> tensor(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& origin() const { return origin_; }

 private:
  struct Entry {
    TensorDtype dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin, end;  // within the data section
  };
  Status parse_header(std::string_view header_text, std::uint64_t file_bytes);
  std::shared_ptr<const std::vector<std::byte>> bytes_;  // parse(): the whole file
  std::shared_ptr<FileDescriptor> fd_;                   // open(): read on demand
  std::size_t data_start_ = 0;
  std::string origin_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> metadata_;
};

// Copies a tensor's elements out, checking the dtype (I32 for packed words, F16 for scales).
StatusOr<std::vector<std::int32_t>> tensor_as_int32(const TensorView& tensor);
StatusOr<std::vector<std::uint16_t>> tensor_as_float16(const TensorView& tensor);

struct TensorToWrite {
  std::string name;
  TensorDtype dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};
// Serialises tensors (for fixtures and tests).
std::vector<std::byte> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata);
Status write_file(const std::string& path, std::span<const std::byte> bytes);
StatusOr<std::vector<std::byte>> read_file(const std::string& path);

// A 2-D .npy array, C order. bf16 is written with descr '<V2' (numpy has no bf16 type; read it
// with ml_dtypes or view it as uint16) and '<V2', '|V2' or 'bfloat16' are read as bf16.
struct NpyArray {
  TensorDtype dtype = TensorDtype::kF32;  // kF16, kBF16 or kF32
  std::int64_t rows = 0, cols = 0;
  std::vector<std::byte> data;
};
StatusOr<NpyArray> parse_npy(std::span<const std::byte> bytes, const std::string& origin);
std::vector<std::byte> serialize_npy(const NpyArray& array);

// quantize_config.json (AutoGPTQ / GPTQModel), quant_config.json (AutoAWQ), or a config.json
// holding "quantization_config". Only 4-bit is accepted.
struct QuantizeConfig {
  QuantFormat format = QuantFormat::kGptq;
  GptqZeros gptq_zeros = GptqZeros::kV1MinusOne;
  int group_size = 128;  // -1 = per-channel, 0 = take it from the tensor shapes
  bool desc_act = false;
};
StatusOr<QuantizeConfig> parse_quantize_config(std::string_view json_text,
                                               const std::string& origin);

// Reads LAYER.qweight, LAYER.scales, LAYER.qzeros (optional) and LAYER.g_idx (optional, GPTQ) and
// checks their shapes against each other and the config.
StatusOr<CheckpointLayer> load_checkpoint_layer(const SafetensorsFile& file, std::string_view layer,
                                                const QuantizeConfig& config);

}  // namespace gpuopt::kernels
