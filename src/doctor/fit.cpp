// `gpuopt doctor --fit`: weights + KV cache + activations of a checkpoint against free device
// memory (see fit.hpp for every formula).
#include "gpuopt/doctor/fit.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "gpuopt/core/regular_file.hpp"

namespace gpuopt::doctor {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Dimensions beyond these are not a model but a corrupt or hostile config; the bounds also keep
// every product below in 64 bits.
constexpr std::int64_t kMaxDimension = 1 << 22;  // hidden, intermediate, vocab (4 Mi)
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxHeads = 16384;
constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the safetensors spec's cap
constexpr double kTightFraction = 0.9;
constexpr double kMaxParameters = 1e15;
constexpr double kMaxEstimateBytes = 1e18;  // an exabyte: far beyond any device, far inside 2^64

struct SafetensorsDtype {
  const char* name;
  unsigned bits;
};
constexpr SafetensorsDtype kDtypes[] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32},    {"F64", 64},    {"I64", 64},
    {"U64", 64},    {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"C64", 64},
};

std::optional<unsigned> dtype_bits(std::string_view name) {
  for (const auto& dtype : kDtypes) {
    if (name == dtype.name) return dtype.bits;
  }
  return std::nullopt;
}

std::string gib(std::uint64_t bytes) {
  return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
}

// A positive integer key within [1, limit]; `required` false gives 0 when the key is absent.
StatusOr<std::int64_t> dimension(const json& config, const char* key, std::int64_t limit,
                                 bool required, const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    if (!required) return std::int64_t{0};
    return invalid_argument(fmt::format("{}: \"{}\" is missing", origin, key));
  }
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return invalid_argument(fmt::format("{}: \"{}\" is not an integer", origin, key));
  }
  const auto value = it->get<std::int64_t>();
  if (value < 1 || value > limit) {
    return invalid_argument(
        fmt::format("{}: \"{}\" = {} is outside 1..{}", origin, key, value, limit));
  }
  return value;
}

std::uint64_t unquantized_element_bytes(const ModelShape& shape) {
  return shape.torch_dtype == "float32" ? 4 : 2;
}

}  // namespace

StatusOr<ModelShape> parse_model_config(std::string_view json_text, const std::string& origin) {
  json config = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return invalid_argument(fmt::format("{}: not a JSON object", origin));
  }
  // Multimodal wrappers keep the language model's shape in text_config.
  if (!config.contains("hidden_size") && config.contains("text_config") &&
      config["text_config"].is_object()) {
    json text = config["text_config"];
    for (const char* key : {"torch_dtype", "quantization_config", "model_type"}) {
      if (!text.contains(key) && config.contains(key)) text[key] = config[key];
    }
    config = std::move(text);
  }
  ModelShape shape;
  if (auto it = config.find("model_type"); it != config.end() && it->is_string()) {
    shape.model_type = it->get<std::string>();
  }
  GPUOPT_ASSIGN_OR_RETURN(shape.hidden_size,
                          dimension(config, "hidden_size", kMaxDimension, true, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.intermediate_size,
                          dimension(config, "intermediate_size", kMaxDimension, true, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.num_layers,
                          dimension(config, "num_hidden_layers", kMaxLayers, true, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.num_attention_heads,
                          dimension(config, "num_attention_heads", kMaxHeads, true, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.num_kv_heads,
                          dimension(config, "num_key_value_heads", kMaxHeads, false, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.head_dim, dimension(config, "head_dim", 65536, false, origin));
  GPUOPT_ASSIGN_OR_RETURN(shape.vocab_size,
                          dimension(config, "vocab_size", kMaxDimension, true, origin));
  GPUOPT_ASSIGN_OR_RETURN(
      shape.max_position_embeddings,
      dimension(config, "max_position_embeddings", std::int64_t{1} << 30, false, origin));
  if (shape.num_kv_heads == 0) shape.num_kv_heads = shape.num_attention_heads;
  if (shape.num_attention_heads % shape.num_kv_heads != 0) {
    return invalid_argument(
        fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    origin, shape.num_attention_heads, shape.num_kv_heads));
  }
  if (shape.head_dim == 0) {
    if (shape.hidden_size % shape.num_attention_heads != 0) {
      return invalid_argument(fmt::format(
          "{}: no head_dim, and hidden_size {} is not a multiple of num_attention_heads {}", origin,
          shape.hidden_size, shape.num_attention_heads));
    }
    shape.head_dim = shape.hidden_size / shape.num_attention_heads;
  }
  // Each dimension may be plausible while their product is not; keep every later product (bytes
  // of weights, KV cache, activations) far inside 64 bits.
  const double parameters_estimate =
      double(shape.num_layers) *
          (double(shape.hidden_size) * double(shape.num_attention_heads + shape.num_kv_heads) *
               double(shape.head_dim) * 2 +
           3 * double(shape.hidden_size) * double(shape.intermediate_size)) +
      2 * double(shape.vocab_size) * double(shape.hidden_size);
  if (parameters_estimate > kMaxParameters) {
    return invalid_argument(fmt::format(
        "{}: the shapes describe about {:.3g} parameters, beyond any model (limit {:.0e})", origin,
        parameters_estimate, kMaxParameters));
  }
  if (auto it = config.find("tie_word_embeddings"); it != config.end() && it->is_boolean()) {
    shape.tie_word_embeddings = it->get<bool>();
  }
  // Qwen2 always has q/k/v biases; Llama-style configs say so with attention_bias.
  shape.attention_bias = shape.model_type == "qwen2";
  if (auto it = config.find("attention_bias"); it != config.end() && it->is_boolean()) {
    shape.attention_bias = it->get<bool>();
  }
  if (auto it = config.find("torch_dtype"); it != config.end() && it->is_string()) {
    shape.torch_dtype = it->get<std::string>();
  } else if (auto dtype = config.find("dtype"); dtype != config.end() && dtype->is_string()) {
    shape.torch_dtype = dtype->get<std::string>();
  }
  if (auto it = config.find("quantization_config"); it != config.end() && it->is_object()) {
    for (const char* key : {"bits", "w_bit"}) {
      if (auto bits = it->find(key); bits != it->end() && bits->is_number_integer()) {
        shape.quantized_bits = bits->get<int>();
      }
    }
    for (const char* key : {"group_size", "q_group_size"}) {
      if (auto group = it->find(key); group != it->end() && group->is_number_integer()) {
        shape.quantized_group_size = group->get<int>();
      }
    }
  }
  return shape;
}

ParameterCount count_parameters(const ModelShape& shape) {
  ParameterCount count;
  const std::int64_t hidden = shape.hidden_size;
  const std::int64_t q_width = shape.num_attention_heads * shape.head_dim;
  const std::int64_t kv_width = shape.num_kv_heads * shape.head_dim;
  // Per block: q [q_width, hidden], k and v [kv_width, hidden], o [hidden, q_width],
  // gate and up [intermediate, hidden], down [hidden, intermediate].
  const std::int64_t linear_per_layer = hidden * q_width + 2 * hidden * kv_width +
                                        q_width * hidden + 3 * hidden * shape.intermediate_size;
  const std::int64_t rows_per_layer =
      q_width + 2 * kv_width + hidden + 2 * shape.intermediate_size + hidden;
  std::int64_t other_per_layer = 2 * hidden;  // input and post-attention RMSNorm
  if (shape.attention_bias) {
    other_per_layer += q_width + 2 * kv_width;
    if (shape.model_type != "qwen2") other_per_layer += hidden;  // Llama's o_proj bias
  }
  count.linear = shape.num_layers * linear_per_layer;
  count.linear_rows = shape.num_layers * rows_per_layer;
  count.other = shape.num_layers * other_per_layer + hidden;  // + the final norm
  count.embedding = shape.vocab_size * hidden * (shape.tie_word_embeddings ? 1 : 2);
  return count;
}

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFloat32:
      return "fp32";
    case WeightFormat::kFloat16:
      return "fp16";
    case WeightFormat::kBFloat16:
      return "bf16";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

StatusOr<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "fp32" || name == "float32") return WeightFormat::kFloat32;
  if (name == "fp16" || name == "float16") return WeightFormat::kFloat16;
  if (name == "bf16" || name == "bfloat16") return WeightFormat::kBFloat16;
  if (name == "int8") return WeightFormat::kInt8;
  if (name == "int4") return WeightFormat::kInt4;
  return invalid_argument(fmt::format(
      "unknown weight format '{}' (expected fp32, fp16, bf16, int8 or int4)", std::string(name)));
}

std::uint64_t weight_bytes(const ParameterCount& parameters, WeightFormat format,
                           int unquantized_bytes, int group_size) {
  const auto linear = static_cast<std::uint64_t>(parameters.linear);
  const auto rest = static_cast<std::uint64_t>(parameters.embedding + parameters.other);
  const auto unquantized = static_cast<std::uint64_t>(unquantized_bytes);
  switch (format) {
    case WeightFormat::kFloat32:
      return 4 * (linear + rest);
    case WeightFormat::kFloat16:
    case WeightFormat::kBFloat16:
      return 2 * (linear + rest);
    case WeightFormat::kInt8:
      return linear + 2 * static_cast<std::uint64_t>(parameters.linear_rows) + unquantized * rest;
    case WeightFormat::kInt4: {
      const std::uint64_t groups = (linear + static_cast<std::uint64_t>(group_size) - 1) /
                                   static_cast<std::uint64_t>(group_size);
      // 4 bits per weight; per group an fp16 scale (16 bits) and a 4-bit zero point.
      return (linear * 4 + groups * 20 + 7) / 8 + unquantized * rest;
    }
  }
  return 0;
}

StatusOr<std::vector<TensorHeader>> parse_safetensors_header(std::string_view header_json,
                                                             std::uint64_t file_bytes,
                                                             const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: not a valid safetensors header: {}", origin, what));
  };
  json header = json::parse(header_json.begin(), header_json.end(), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  std::vector<TensorHeader> tensors;
  std::uint64_t data_end = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& value = it.value();
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      return bad(fmt::format("tensor '{}' lacks dtype, shape or data_offsets", it.key()));
    }
    TensorHeader tensor;
    tensor.name = it.key();
    if (!value["dtype"].is_string()) return bad(fmt::format("tensor '{}': dtype", it.key()));
    tensor.dtype = value["dtype"].get<std::string>();
    auto bits = dtype_bits(tensor.dtype);
    if (!bits) return bad(fmt::format("tensor '{}': unknown dtype '{}'", it.key(), tensor.dtype));
    const json& shape = value["shape"];
    if (!shape.is_array()) return bad(fmt::format("tensor '{}': shape is not a list", it.key()));
    // Elements, checked against overflow: a shape may be hostile.
    unsigned __int128 elements = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned()) {
        return bad(fmt::format("tensor '{}': a dimension is not a non-negative integer", it.key()));
      }
      tensor.shape.push_back(dim.get<std::int64_t>());
      elements *= dim.get<std::uint64_t>();
      if (elements > (unsigned __int128)(std::numeric_limits<std::uint64_t>::max() / 64)) {
        return bad(fmt::format("tensor '{}': shape too large", it.key()));
      }
    }
    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return bad(fmt::format("tensor '{}': data_offsets is not [begin, end]", it.key()));
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    if (end < begin) return bad(fmt::format("tensor '{}': data_offsets end < begin", it.key()));
    const auto expected = static_cast<std::uint64_t>((elements * *bits + 7) / 8);
    if (end - begin != expected) {
      return bad(fmt::format("tensor '{}': {} bytes by data_offsets, {} by shape and dtype {}",
                             it.key(), end - begin, expected, tensor.dtype));
    }
    tensor.bytes = end - begin;
    data_end = std::max(data_end, end);
    tensors.push_back(std::move(tensor));
  }
  const std::uint64_t needed = 8 + header_json.size() + data_end;
  if (file_bytes < needed) {
    return data_loss(fmt::format(
        "{}: truncated: the header describes {} bytes of tensors but the file holds {} of the {} "
        "bytes it needs (an interrupted download?)",
        origin, data_end, file_bytes, needed));
  }
  return tensors;
}

StatusOr<std::vector<TensorHeader>> read_safetensors_header(const std::string& path) {
  GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return data_loss(fmt::format("cannot read the size of {}: {}", path, std::strerror(errno)));
  }
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  auto read_exactly = [&](char* out, std::size_t count) -> Status {
    std::size_t done = 0;
    while (done < count) {
      ssize_t n = ::read(fd.get(), out + done, count - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return data_loss(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
      if (n == 0) return data_loss(fmt::format("{}: short read", path));
      done += static_cast<std::size_t>(n);
    }
    return ok_status();
  };
  if (file_bytes < 8) {
    return invalid_argument(
        fmt::format("{}: {} bytes, too short for a safetensors header", path, file_bytes));
  }
  unsigned char length_bytes[8];
  GPUOPT_RETURN_IF_ERROR(read_exactly(reinterpret_cast<char*>(length_bytes), 8));
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return invalid_argument(fmt::format(
        "{}: not a safetensors file: header length {} exceeds the file ({} bytes) or 100 MB", path,
        header_bytes, file_bytes));
  }
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  GPUOPT_RETURN_IF_ERROR(read_exactly(header.data(), header.size()));
  return parse_safetensors_header(header, file_bytes, path);
}

std::uint64_t kv_cache_bytes_per_token(const ModelShape& shape, int kv_cache_bytes) {
  return static_cast<std::uint64_t>(shape.num_layers) * 2 *
         static_cast<std::uint64_t>(shape.num_kv_heads * shape.head_dim) *
         static_cast<std::uint64_t>(kv_cache_bytes);
}

std::uint64_t activation_bytes_per_token(const ModelShape& shape, int activation_bytes) {
  const std::int64_t elements =
      4 * shape.hidden_size +
      (shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim +
      2 * shape.intermediate_size;
  return static_cast<std::uint64_t>(elements) * static_cast<std::uint64_t>(activation_bytes);
}

std::string_view fit_verdict_name(FitVerdict verdict) {
  switch (verdict) {
    case FitVerdict::kFits:
      return "fits";
    case FitVerdict::kTight:
      return "tight";
    case FitVerdict::kDoesNotFit:
      return "does_not_fit";
    case FitVerdict::kUnknown:
      return "unknown";
  }
  return "unknown";
}

StatusOr<FitEstimate> estimate_fit(const ModelShape& shape,
                                   const std::vector<TensorHeader>& tensors,
                                   const FitOptions& options) {
  if (options.batch < 1 || options.batch > (1 << 20)) {
    return invalid_argument(fmt::format("batch {} is outside 1..1048576", options.batch));
  }
  if (options.context < 1 || options.context > (std::int64_t{1} << 30)) {
    return invalid_argument(fmt::format("context {} is outside 1..2^30 tokens", options.context));
  }
  if (options.kv_cache_bytes != 1 && options.kv_cache_bytes != 2 && options.kv_cache_bytes != 4) {
    return invalid_argument(
        fmt::format("KV cache element size {} bytes: expected 1, 2 or 4", options.kv_cache_bytes));
  }
  if (options.activation_bytes != 2 && options.activation_bytes != 4) {
    return invalid_argument(
        fmt::format("activation element size {} bytes: expected 2 or 4", options.activation_bytes));
  }
  FitEstimate estimate;
  estimate.shape = shape;
  estimate.parameters = count_parameters(shape);
  estimate.batch = options.batch;
  estimate.context = options.context;
  estimate.device = options.device;
  estimate.free_bytes = options.free_bytes;
  estimate.total_device_bytes = options.total_bytes;
  estimate.reserve_bytes = options.reserve_bytes;

  const int unquantized = static_cast<int>(unquantized_element_bytes(shape));
  const int group =
      shape.quantized_group_size.value_or(128) > 0 ? shape.quantized_group_size.value_or(128) : 128;
  if (!tensors.empty()) {
    if (options.weight_format) {
      estimate.notes.push_back(
          "--dtype/--quant ignored: the safetensors headers give the stored size of every tensor");
    }
    unsigned __int128 elements = 0;
    for (const auto& tensor : tensors) {
      estimate.weight_bytes += tensor.bytes;
      estimate.weight_bytes_by_dtype[tensor.dtype] += tensor.bytes;
      unsigned __int128 count = 1;
      for (auto dim : tensor.shape) count *= static_cast<std::uint64_t>(dim);
      elements += count;
    }
    estimate.checkpoint_parameters = static_cast<std::int64_t>(elements);
    estimate.weights_source = fmt::format("safetensors headers ({} tensors)", tensors.size());
  } else {
    WeightFormat format = WeightFormat::kBFloat16;
    if (options.weight_format) {
      format = *options.weight_format;
    } else if (shape.quantized_bits == 4) {
      format = WeightFormat::kInt4;
    } else if (shape.quantized_bits == 8) {
      format = WeightFormat::kInt8;
    } else if (shape.torch_dtype == "float32") {
      format = WeightFormat::kFloat32;
    } else if (shape.torch_dtype == "float16") {
      format = WeightFormat::kFloat16;
    }
    estimate.weight_bytes = weight_bytes(estimate.parameters, format, unquantized, group);
    estimate.weight_bytes_by_dtype[std::string(weight_format_name(format))] = estimate.weight_bytes;
    estimate.weights_source = fmt::format("config.json shapes x {}", weight_format_name(format));
  }

  const auto batch = static_cast<std::uint64_t>(options.batch);
  const auto context = static_cast<std::uint64_t>(options.context);
  {
    const double tokens = double(batch) * double(context);
    const double kv = tokens * double(kv_cache_bytes_per_token(shape, options.kv_cache_bytes));
    const double activations =
        tokens * double(activation_bytes_per_token(shape, options.activation_bytes));
    if (kv > kMaxEstimateBytes || activations > kMaxEstimateBytes ||
        double(options.reserve_bytes) > kMaxEstimateBytes) {
      return invalid_argument(fmt::format(
          "batch {} x context {} needs about {:.3g} bytes of KV cache and activations: beyond any "
          "device (limit {:.0e})",
          options.batch, options.context, kv + activations, kMaxEstimateBytes));
    }
  }
  estimate.kv_bytes_per_token = kv_cache_bytes_per_token(shape, options.kv_cache_bytes);
  const std::uint64_t activation_per_token =
      activation_bytes_per_token(shape, options.activation_bytes);
  const std::uint64_t logits_per_sequence = static_cast<std::uint64_t>(shape.vocab_size) * 4;
  estimate.kv_cache_bytes = estimate.kv_bytes_per_token * context * batch;
  estimate.activation_bytes = activation_per_token * context * batch + logits_per_sequence * batch;
  const std::uint64_t fixed = estimate.weight_bytes + estimate.reserve_bytes;
  estimate.total_bytes = fixed + estimate.kv_cache_bytes + estimate.activation_bytes;

  if (shape.max_position_embeddings > 0 && options.context > shape.max_position_embeddings) {
    estimate.notes.push_back(
        fmt::format("context {} exceeds the model's max_position_embeddings {}", options.context,
                    shape.max_position_embeddings));
  }
  estimate.notes.push_back(fmt::format(
      "reserve {} for the CUDA context, library workspaces and allocator slack (an assumption; "
      "--reserve-gib)",
      gib(estimate.reserve_bytes)));
  // Attention that materialises scores (eager, not flash/SDPA) holds batch x heads x context^2.
  const double eager_scores = double(batch) * double(shape.num_attention_heads) * double(context) *
                              double(context) * options.activation_bytes;
  estimate.notes.push_back(fmt::format(
      "activations assume a fused (flash) attention kernel; eager attention would add {} for the "
      "score matrix of one layer",
      gib(static_cast<std::uint64_t>(std::min(eager_scores, 1.8e19)))));

  // What the other weight formats would need, from the shapes (linear layers quantised).
  std::vector<std::pair<std::string, std::uint64_t>> candidates;
  for (auto [format, bits] :
       {std::pair{WeightFormat::kInt8, 8}, std::pair{WeightFormat::kInt4, 4}}) {
    if (shape.quantized_bits && bits >= *shape.quantized_bits) continue;  // no worse re-quantising
    candidates.emplace_back(std::string(weight_format_name(format)),
                            weight_bytes(estimate.parameters, format, unquantized, 128));
  }
  for (const auto& [name, bytes] : candidates) {
    if (bytes >= estimate.weight_bytes) continue;
    FitAlternative alternative;
    alternative.format = name + " weights";
    alternative.weight_bytes = bytes;
    alternative.total_bytes = estimate.total_bytes - estimate.weight_bytes + bytes;
    alternative.saved_bytes = estimate.weight_bytes - bytes;
    alternative.fits = options.free_bytes && alternative.total_bytes <= *options.free_bytes;
    estimate.alternatives.push_back(alternative);
  }
  if (options.kv_cache_bytes > 1) {
    FitAlternative alternative;
    alternative.format = "fp8 KV cache";
    alternative.weight_bytes = estimate.weight_bytes;
    alternative.saved_bytes =
        estimate.kv_cache_bytes - estimate.kv_cache_bytes / options.kv_cache_bytes;
    alternative.total_bytes = estimate.total_bytes - alternative.saved_bytes;
    alternative.fits = options.free_bytes && alternative.total_bytes <= *options.free_bytes;
    estimate.alternatives.push_back(alternative);
  }

  if (!options.free_bytes) {
    estimate.verdict = FitVerdict::kUnknown;
    estimate.notes.push_back("free memory unknown (no NVML and no --free-bytes): no verdict");
    return estimate;
  }
  const std::uint64_t free = *options.free_bytes;
  if (estimate.total_bytes > free) {
    estimate.verdict = FitVerdict::kDoesNotFit;
  } else if (double(estimate.total_bytes) > kTightFraction * double(free)) {
    estimate.verdict = FitVerdict::kTight;
  } else {
    estimate.verdict = FitVerdict::kFits;
  }
  // Everything but the weights and the reserve grows linearly in batch, and (bar the logits) in
  // context, so the limits are one division each.
  const std::uint64_t per_sequence =
      (estimate.kv_bytes_per_token + activation_per_token) * context + logits_per_sequence;
  const std::uint64_t per_token = (estimate.kv_bytes_per_token + activation_per_token) * batch;
  if (fixed >= free) {
    estimate.max_batch = 0;
    estimate.max_context = 0;
  } else {
    const std::uint64_t room = free - fixed;
    estimate.max_batch = static_cast<std::int64_t>(room / per_sequence);
    const std::uint64_t logits = logits_per_sequence * batch;
    std::int64_t max_context =
        room > logits ? static_cast<std::int64_t>((room - logits) / per_token) : 0;
    if (shape.max_position_embeddings > 0) {
      max_context = std::min(max_context, shape.max_position_embeddings);
    }
    estimate.max_context = max_context;
  }

  if (estimate.verdict == FitVerdict::kFits) {
    if (*estimate.max_batch > options.batch) {
      estimate.advice.push_back(fmt::format("headroom: up to batch {} fits at context {}",
                                            *estimate.max_batch, options.context));
    }
    return estimate;
  }
  estimate.reclaimable = options.reclaimable;
  std::uint64_t reclaimable = 0;
  std::string holders;
  for (const auto& held : options.reclaimable) {
    reclaimable += held.bytes;
    holders += fmt::format("{}{} ({}, {})", holders.empty() ? "" : ", ", held.holder,
                           gib(held.bytes), held.finding);
  }
  if (reclaimable > 0) {
    const bool then_fits = estimate.total_bytes <= free + reclaimable;
    estimate.advice.push_back(
        then_fits ? fmt::format("end {}: that frees {} and then it fits", holders, gib(reclaimable))
                  : fmt::format("end {}: that frees {}, still {} short", holders, gib(reclaimable),
                                gib(estimate.total_bytes - free - reclaimable)));
  }
  if (fixed >= free) {
    estimate.advice.push_back(fmt::format(
        "the weights alone ({}) and the reserve do not fit in {} free: quantise the weights or "
        "split the model across GPUs (tensor parallelism)",
        gib(estimate.weight_bytes), gib(free)));
  } else {
    if (*estimate.max_batch >= 1 && *estimate.max_batch < options.batch) {
      estimate.advice.push_back(fmt::format("lower the batch to {} (at context {})",
                                            *estimate.max_batch, options.context));
    }
    if (*estimate.max_context >= 1 && *estimate.max_context < options.context) {
      estimate.advice.push_back(fmt::format("shorten the context to {} tokens (at batch {})",
                                            *estimate.max_context, options.batch));
    }
  }
  for (const auto& alternative : estimate.alternatives) {
    estimate.advice.push_back(fmt::format(
        "{}: saves {}, total {} ({})", alternative.format, gib(alternative.saved_bytes),
        gib(alternative.total_bytes), alternative.fits ? "fits" : "still does not fit"));
  }
  if (estimate.verdict == FitVerdict::kTight) {
    estimate.advice.insert(
        estimate.advice.begin(),
        fmt::format("fits with under {:.0f} % headroom: fragmentation or a longer prompt can still "
                    "run out of memory",
                    (1 - kTightFraction) * 100));
  }
  return estimate;
}

StatusOr<FitEstimate> estimate_fit(const std::string& checkpoint, const FitOptions& options) {
  std::error_code error;
  fs::path config_path = checkpoint;
  const bool directory = fs::is_directory(checkpoint, error);
  if (directory) config_path /= "config.json";
  if (!directory && !fs::exists(checkpoint, error)) {
    return not_found(fmt::format("--fit {}: no such file or directory", checkpoint));
  }
  auto text = read_regular_file(config_path, 4u << 20);
  if (!text.ok()) {
    return text.status().with_context(fmt::format(
        "--fit {}: needs a config.json (a checkpoint directory or the file)", checkpoint));
  }
  GPUOPT_ASSIGN_OR_RETURN(ModelShape shape, parse_model_config(*text, config_path.string()));
  std::vector<TensorHeader> tensors;
  std::vector<std::string> files;
  if (directory) {
    for (const auto& entry : fs::directory_iterator(checkpoint, error)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      GPUOPT_ASSIGN_OR_RETURN(auto headers, read_safetensors_header(file));
      for (auto& header : headers) tensors.push_back(std::move(header));
    }
  }
  GPUOPT_ASSIGN_OR_RETURN(FitEstimate estimate, estimate_fit(shape, tensors, options));
  estimate.checkpoint = checkpoint;
  if (!files.empty()) {
    estimate.weights_source =
        fmt::format("safetensors headers ({} tensors in {} file{})", tensors.size(), files.size(),
                    files.size() == 1 ? "" : "s");
  } else if (directory) {
    estimate.notes.push_back("no *.safetensors in the directory: weights estimated from shapes");
  }
  return estimate;
}

StatusOr<FitOptions> fit_memory_from_report(const Report& report, unsigned index,
                                            FitOptions options) {
  const NvidiaGpu* gpu = nullptr;
  for (const auto& candidate : report.nvml.gpus) {
    if (candidate.index == index) gpu = &candidate;
  }
  if (gpu == nullptr) {
    return not_found(fmt::format("no NVIDIA GPU {} ({})", index,
                                 report.nvml.available
                                     ? fmt::format("NVML lists {}", report.nvml.gpus.size())
                                     : report.nvml.status));
  }
  if (!gpu->memory) return not_found(fmt::format("NVML gave no memory for GPU {}", index));
  options.free_bytes = gpu->memory->free_bytes;
  options.total_bytes = gpu->memory->total_bytes;
  options.device = fmt::format("GPU {} ({})", index, gpu->name);
  for (const auto& held : gpu->processes) {
    if (!held.used_memory_bytes) continue;
    const std::string pid = fmt::format("pid {}", held.pid);
    for (const auto& finding : report.findings) {
      if (finding.device != pid ||
          (finding.id != "gpu.idle_memory_holder" && finding.id != "gpu.context_leak")) {
        continue;
      }
      std::string name = "?";
      for (const auto& process : report.processes.processes) {
        if (process.pid == static_cast<int>(held.pid)) name = process.comm;
      }
      options.reclaimable.push_back(
          {fmt::format("{} ({})", name, pid), finding.id, *held.used_memory_bytes});
      break;
    }
  }
  return options;
}

int fit_exit_code(const FitEstimate& estimate) {
  switch (estimate.verdict) {
    case FitVerdict::kDoesNotFit:
      return 2;
    case FitVerdict::kTight:
      return 1;
    default:
      return 0;
  }
}

json fit_to_json(const FitEstimate& estimate) {
  auto opt = [](const auto& value) { return value ? json(*value) : json(nullptr); };
  json by_dtype = json::object();
  for (const auto& [dtype, bytes] : estimate.weight_bytes_by_dtype) by_dtype[dtype] = bytes;
  json reclaimable = json::array();
  for (const auto& held : estimate.reclaimable) {
    reclaimable.push_back(
        {{"holder", held.holder}, {"finding", held.finding}, {"bytes", held.bytes}});
  }
  json alternatives = json::array();
  for (const auto& alternative : estimate.alternatives) {
    alternatives.push_back({{"change", alternative.format},
                            {"weight_bytes", alternative.weight_bytes},
                            {"total_bytes", alternative.total_bytes},
                            {"saved_bytes", alternative.saved_bytes},
                            {"fits", alternative.fits}});
  }
  const auto& shape = estimate.shape;
  return {{"schema_version", kFitSchemaVersion},
          {"tool", "gpuopt doctor --fit"},
          {"checkpoint", estimate.checkpoint},
          {"model",
           {{"model_type", shape.model_type},
            {"hidden_size", shape.hidden_size},
            {"intermediate_size", shape.intermediate_size},
            {"num_layers", shape.num_layers},
            {"num_attention_heads", shape.num_attention_heads},
            {"num_kv_heads", shape.num_kv_heads},
            {"head_dim", shape.head_dim},
            {"vocab_size", shape.vocab_size},
            {"max_position_embeddings",
             shape.max_position_embeddings > 0 ? json(shape.max_position_embeddings) : json()},
            {"tie_word_embeddings", shape.tie_word_embeddings},
            {"parameters", estimate.parameters.total()},
            {"quantized_bits", opt(shape.quantized_bits)}}},
          {"batch", estimate.batch},
          {"context", estimate.context},
          {"weights_source", estimate.weights_source},
          {"weight_bytes_by_dtype", by_dtype},
          {"bytes",
           {{"weights", estimate.weight_bytes},
            {"kv_cache", estimate.kv_cache_bytes},
            {"activations", estimate.activation_bytes},
            {"reserve", estimate.reserve_bytes},
            {"total", estimate.total_bytes}}},
          {"kv_bytes_per_token", estimate.kv_bytes_per_token},
          {"device", estimate.device.empty() ? json() : json(estimate.device)},
          {"free_bytes", opt(estimate.free_bytes)},
          {"device_total_bytes", opt(estimate.total_device_bytes)},
          {"verdict", std::string(fit_verdict_name(estimate.verdict))},
          {"max_batch", opt(estimate.max_batch)},
          {"max_context", opt(estimate.max_context)},
          {"alternatives", alternatives},
          {"reclaimable", reclaimable},
          {"advice", estimate.advice},
          {"notes", estimate.notes},
          {"exit_code", fit_exit_code(estimate)}};
}

std::string render_fit_text(const FitEstimate& estimate) {
  const auto& shape = estimate.shape;
  std::string out = fmt::format("gpuopt doctor --fit {}\n", estimate.checkpoint);
  out += fmt::format(
      "Model: {} layers, hidden {}, {} heads ({} KV) x {}, vocab {}: {:.2f} B parameters{}\n",
      shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.num_kv_heads,
      shape.head_dim, shape.vocab_size, estimate.parameters.total() / 1e9,
      shape.quantized_bits ? fmt::format(", {}-bit quantised", *shape.quantized_bits) : "");
  out += fmt::format("At batch {} x context {}:\n", estimate.batch, estimate.context);
  out += fmt::format("  weights      {:>12}  ({})\n", gib(estimate.weight_bytes),
                     estimate.weights_source);
  out += fmt::format("  KV cache     {:>12}  ({} KiB per token)\n", gib(estimate.kv_cache_bytes),
                     estimate.kv_bytes_per_token / 1024);
  out += fmt::format("  activations  {:>12}\n", gib(estimate.activation_bytes));
  out += fmt::format("  reserve      {:>12}\n", gib(estimate.reserve_bytes));
  out += fmt::format("  total        {:>12}\n", gib(estimate.total_bytes));
  if (estimate.free_bytes) {
    out += fmt::format("Free on {}: {}{}\n", estimate.device.empty() ? "the GPU" : estimate.device,
                       gib(*estimate.free_bytes),
                       estimate.total_device_bytes
                           ? fmt::format(" of {}", gib(*estimate.total_device_bytes))
                           : "");
  }
  const char* verdict = estimate.verdict == FitVerdict::kFits         ? "FITS"
                        : estimate.verdict == FitVerdict::kTight      ? "FITS, TIGHT"
                        : estimate.verdict == FitVerdict::kDoesNotFit ? "DOES NOT FIT"
                                                                      : "UNKNOWN (free memory?)";
  out += fmt::format("Verdict: {}", verdict);
  if (estimate.max_batch && estimate.max_context) {
    out +=
        fmt::format(" (max batch {} at context {}; max context {} at batch {})",
                    *estimate.max_batch, estimate.context, *estimate.max_context, estimate.batch);
  }
  out += "\n";
  for (const auto& advice : estimate.advice) out += "  - " + advice + "\n";
  for (const auto& note : estimate.notes) out += "note: " + note + "\n";
  return out;
}

}  // namespace gpuopt::doctor
