// `gpuopt doctor --fit`: will a checkpoint run on this GPU at this batch and context? Estimates
// weights (from safetensors tensor headers, or from config.json shapes and a dtype), the KV cache
// and activations against free device memory, and says what to change when it does not fit.
// Pure host code: no GPU, no NVML (the caller passes free memory in).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {

inline constexpr int kFitSchemaVersion = 1;

// A decoder-only transformer's shape, as Hugging Face config.json spells it (Llama, Mistral,
// Qwen2, ...). Missing optional keys take the Llama defaults (head_dim = hidden / heads,
// num_key_value_heads = num_attention_heads).
struct ModelShape {
  std::string model_type;  // "llama", "qwen2", ... (informational)
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 0;  // 0 when absent
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v carry biases (Qwen2 does)
  std::string torch_dtype;      // "bfloat16", "float16", "float32" or empty
  // From "quantization_config", when the checkpoint is already quantised.
  std::optional<int> quantized_bits;
  std::optional<int> quantized_group_size;
};

// Parses config.json text; INVALID_ARGUMENT naming `origin` and the key that is missing or wrong.
StatusOr<ModelShape> parse_model_config(std::string_view json_text, const std::string& origin);

// Parameters split the way quantisers treat them: the linear layers of the decoder blocks
// (q, k, v, o, gate, up, down) are quantised; embeddings, lm_head, norms and biases are not.
struct ParameterCount {
  std::int64_t linear = 0;       // quantisable weight matrices of the decoder blocks
  std::int64_t embedding = 0;    // embed_tokens + lm_head (once when tied)
  std::int64_t other = 0;        // norms, biases
  std::int64_t linear_rows = 0;  // output rows of all linear layers (per-channel scales)
  std::int64_t total() const { return linear + embedding + other; }
};
ParameterCount count_parameters(const ModelShape& shape);

// How the weights are stored when estimating from a config alone.
enum class WeightFormat { kFloat32, kFloat16, kBFloat16, kInt8, kInt4 };
std::string_view weight_format_name(WeightFormat format);  // "fp32", "fp16", "bf16", "int8", "int4"
// Accepts fp32/float32, fp16/float16, bf16/bfloat16, int8, int4.
StatusOr<WeightFormat> parse_weight_format(std::string_view name);

// Weight bytes for `format`. Quantised formats apply to the linear layers only (embeddings,
// lm_head, norms and biases stay in `unquantized_bytes` each, 2 for bf16):
//   int8: 1 byte per weight + one fp16 scale per output row (per-channel);
//   int4: 0.5 byte per weight + per group of `group_size` weights an fp16 scale and a 4-bit zero,
//         i.e. 0.5 + 2.5 / group_size bytes per weight (GPTQ/AWQ layout).
std::uint64_t weight_bytes(const ParameterCount& parameters, WeightFormat format,
                           int unquantized_bytes = 2, int group_size = 128);

// One tensor of a safetensors header (the data itself is never read).
struct TensorHeader {
  std::string name;
  std::string dtype;  // safetensors spelling: "BF16", "I32", "F8_E4M3", ...
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;  // data_offsets end - begin, checked against shape x dtype size
};

// Reads only the 8-byte length and the JSON header of `path`, never the tensor data, and checks
// that the file is long enough to hold what the header describes (a truncated download is
// DATA_LOSS naming the file and the missing bytes).
StatusOr<std::vector<TensorHeader>> read_safetensors_header(const std::string& path);
// The same on bytes already in memory; `file_bytes` is the file's size for the length check.
StatusOr<std::vector<TensorHeader>> parse_safetensors_header(std::string_view header_json,
                                                             std::uint64_t file_bytes,
                                                             const std::string& origin);

// Memory a process holds that ending it would free: one doctor judged idle or leaked.
struct ReclaimableMemory {
  std::string holder;   // "python3 (pid 5100)"
  std::string finding;  // the doctor finding that names it: "gpu.idle_memory_holder"
  std::uint64_t bytes = 0;
};

struct FitOptions {
  std::int64_t batch = 1;
  std::int64_t context = 4096;  // tokens per sequence (prompt + generated)
  // Config-only estimates: how the weights are stored (default: config's torch_dtype, or bf16).
  std::optional<WeightFormat> weight_format;
  int kv_cache_bytes = 2;  // per element: 2 for fp16/bf16, 1 for an fp8 cache
  int activation_bytes = 2;
  // CUDA context, cuBLAS/cuDNN workspaces and allocator slack: a fixed reserve, not measured.
  std::uint64_t reserve_bytes = std::uint64_t{1} << 30;
  // Free device memory; absent: the estimate is given without a verdict.
  std::optional<std::uint64_t> free_bytes;
  std::optional<std::uint64_t> total_bytes;
  std::string device;  // for the report: "0 (NVIDIA H200)" or "--free-bytes"
  std::vector<ReclaimableMemory> reclaimable;  // on that device
};

enum class FitVerdict { kFits, kTight, kDoesNotFit, kUnknown };
std::string_view fit_verdict_name(FitVerdict verdict);  // "fits", "tight", "does_not_fit", ...

struct FitAlternative {
  std::string format;  // "int8", "int4", "fp8 KV cache"
  std::uint64_t weight_bytes = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t saved_bytes = 0;
  bool fits = false;  // against free memory (false when free is unknown)
};

struct FitEstimate {
  std::string checkpoint;
  std::string weights_source;  // "safetensors headers (N files)" or "config.json x fp16"
  ModelShape shape;
  ParameterCount parameters;
  std::int64_t checkpoint_parameters = 0;  // elements in the headers (0 for config-only)
  std::map<std::string, std::uint64_t> weight_bytes_by_dtype;
  std::int64_t batch = 0, context = 0;
  std::uint64_t weight_bytes = 0;
  std::uint64_t kv_cache_bytes = 0;
  std::uint64_t kv_bytes_per_token = 0;  // one sequence, all layers
  std::uint64_t activation_bytes = 0;
  std::uint64_t reserve_bytes = 0;
  std::uint64_t total_bytes = 0;
  std::optional<std::uint64_t> free_bytes, total_device_bytes;
  std::string device;
  FitVerdict verdict = FitVerdict::kUnknown;
  // At this context, the largest batch that fits; at this batch, the longest context (capped at
  // max_position_embeddings when the config gives it). Absent when free memory is unknown; 0 when
  // not even one sequence of one token fits.
  std::optional<std::int64_t> max_batch, max_context;
  std::vector<FitAlternative> alternatives;
  std::vector<ReclaimableMemory> reclaimable;
  std::vector<std::string> advice;  // what to change, most effective first
  std::vector<std::string> notes;   // assumptions and caveats
};

// Activation bytes of one prefill pass, per token: the largest live set of one decoder block with
// a fused (flash) attention kernel, so no context x context term:
//   (4 x hidden + (heads + 2 x kv_heads) x head_dim + 2 x intermediate) x activation_bytes
// (residual, normed input, attention output and MLP output; q/k/v; gate and up). estimate_fit adds
// fp32 logits of the last token per sequence (vocab x 4 bytes): activations =
// batch x context x this + batch x vocab x 4.
std::uint64_t activation_bytes_per_token(const ModelShape& shape, int activation_bytes);
// layers x 2 (K and V) x kv_heads x head_dim x bytes.
std::uint64_t kv_cache_bytes_per_token(const ModelShape& shape, int kv_cache_bytes);

// `checkpoint` is a directory holding config.json and *.safetensors (shards), or a config.json
// file (then the weights come from the shapes and options.weight_format).
StatusOr<FitEstimate> estimate_fit(const std::string& checkpoint, const FitOptions& options);
// The same from a parsed config and, optionally, tensor headers (empty: config-only).
StatusOr<FitEstimate> estimate_fit(const ModelShape& shape,
                                   const std::vector<TensorHeader>& tensors,
                                   const FitOptions& options);

// Free and total memory of NVML GPU `index` in a collected and judged doctor report (live or
// recorded), and the memory of the processes its findings name as idle holders or leaked contexts
// there. NOT_FOUND when the report has no such GPU or NVML gave no memory for it.
StatusOr<FitOptions> fit_memory_from_report(const Report& report, unsigned index,
                                            FitOptions options);

// 0 fits (or free memory unknown), 1 tight (over 90 % of free memory), 2 does not fit.
int fit_exit_code(const FitEstimate& estimate);
nlohmann::json fit_to_json(const FitEstimate& estimate);  // docs/schemas/fit.schema.json
std::string render_fit_text(const FitEstimate& estimate);

}  // namespace gpuopt::doctor
