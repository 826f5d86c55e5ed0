// `gpuopt gemm`: runs one quantized linear layer of a user's GPTQ/AWQ checkpoint on an input .npy,
// so its numerics can be checked against the user's framework.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/output_file.hpp"
#include "gpuopt/kernels/safetensors.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "output_options.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::cli {
namespace {

using namespace gpuopt::kernels;

struct GemmArgs {
  std::string weights, layer, input, format, config;
  OutputOptions output;  // --output: the y .npy (required); --json: the summary as JSON
  bool cpu = false;
};

StatusOr<QuantizeConfig> find_config(const GemmArgs& args) {
  QuantizeConfig config;
  config.group_size = 0;  // from the shapes unless a config says otherwise
  std::string path = args.config;
  if (path.empty()) {
    const auto folder = std::filesystem::path(args.weights).parent_path();
    for (const char* name : {"quantize_config.json", "quant_config.json", "config.json"}) {
      std::error_code error;
      if (std::filesystem::exists(folder / name, error)) {
        path = (folder / name).string();
        break;
      }
    }
  }
  if (!path.empty()) {
    GPUOPT_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, read_file(path));
    const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    auto parsed = parse_quantize_config(text, path);
    // config.json without a quantization section is not a quantization config: keep defaults.
    if (parsed.ok() || std::filesystem::path(path).filename() != "config.json" ||
        text.find("quantization_config") != std::string::npos) {
      GPUOPT_ASSIGN_OR_RETURN(config, std::move(parsed));
    }
  }
  if (!args.format.empty()) {
    GPUOPT_ASSIGN_OR_RETURN(config.format, parse_quant_format(args.format));
    if (args.format == "gptq_v2") config.gptq_zeros = GptqZeros::kV2;
  }
  return config;
}

// [M][K] of the activation type; fp32 input is rounded to fp16.
std::vector<std::uint16_t> to_activation(const NpyArray& x, ActivationType type) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(x.rows * x.cols));
  if (x.dtype == TensorDtype::kF32) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      float value;
      std::memcpy(&value, x.data.data() + 4 * i, 4);
      out[i] =
          type == ActivationType::kFloat16 ? float_to_fp16_bits(value) : float_to_bf16_bits(value);
    }
  } else {
    std::memcpy(out.data(), x.data.data(), out.size() * 2);
  }
  return out;
}

StatusOr<std::vector<std::uint16_t>> run_on_gpu(const W4A16Weights& weights,
                                                const std::vector<std::uint16_t>& x, int m) {
#if GPUOPT_CUDA
  GPUOPT_RETURN_IF_ERROR(cuda_device_count().status());
  cudaStream_t stream = nullptr;
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct Cleanup {
    cudaStream_t stream;
    ~Cleanup() { GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream)); }
  } cleanup{stream};
  GPUOPT_ASSIGN_OR_RETURN(W4A16DeviceWeights device, W4A16DeviceWeights::upload(weights, stream));
  const std::size_t x_bytes = x.size() * 2;
  const std::size_t y_bytes = static_cast<std::size_t>(m) * weights.n * 2;
  GPUOPT_ASSIGN_OR_RETURN(const runtime::DeviceBuffer dx, runtime::DeviceBuffer::allocate(x_bytes));
  GPUOPT_ASSIGN_OR_RETURN(const runtime::DeviceBuffer dy, runtime::DeviceBuffer::allocate(y_bytes));
  GPUOPT_RETURN_IF_ERROR(dx.copy_from_host(x.data(), x_bytes, stream));
  W4A16Gemm gemm;
  W4A16Gemm::Arguments arguments{m, dx.data(), dy.data(), &device};
  GPUOPT_ASSIGN_OR_RETURN(std::size_t workspace_bytes, gemm.workspace_size(arguments));
  GPUOPT_ASSIGN_OR_RETURN(
      const runtime::DeviceBuffer workspace,
      runtime::DeviceBuffer::allocate(std::max<std::size_t>(workspace_bytes, 256)));
  GPUOPT_RETURN_IF_ERROR(gemm.initialize(arguments, workspace.data(), stream));
  GPUOPT_RETURN_IF_ERROR(gemm.run(stream));
  std::vector<std::uint16_t> y(static_cast<std::size_t>(m) * weights.n);
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(y.data(), dy.data(), y_bytes, cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  std::fprintf(stderr, "gpuopt gemm: GPU path %s\n", gemm.config().describe().c_str());
  return y;
#else
  return unimplemented("gpuopt was built without CUDA; use --cpu");
#endif
}

Status run_gemm(const GemmArgs& args) {
  // The output path is checked before the checkpoint is read: a typo should not cost the run.
  GPUOPT_RETURN_IF_ERROR(check_output_path(args.output.output).with_context("--output"));
  GPUOPT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(args.weights));
  GPUOPT_ASSIGN_OR_RETURN(QuantizeConfig config, find_config(args));
  GPUOPT_ASSIGN_OR_RETURN(CheckpointLayer layer, load_checkpoint_layer(file, args.layer, config));
  GPUOPT_ASSIGN_OR_RETURN(UnpackedLayer unpacked, unpack_checkpoint_layer(layer));
  GPUOPT_ASSIGN_OR_RETURN(std::vector<std::byte> input_bytes, read_file(args.input));
  GPUOPT_ASSIGN_OR_RETURN(NpyArray x, parse_npy(input_bytes, args.input));
  if (x.cols != unpacked.k) {
    return invalid_argument(fmt::format("{}: input has {} columns but layer '{}' has K={}",
                                        args.input, x.cols, args.layer, unpacked.k));
  }
  if (x.rows <= 0 || x.rows > (1 << 20)) {
    return invalid_argument(fmt::format("{}: M={} rows is not usable", args.input, x.rows));
  }
  const ActivationType type =
      x.dtype == TensorDtype::kBF16 ? ActivationType::kBFloat16 : ActivationType::kFloat16;
  GPUOPT_ASSIGN_OR_RETURN(W4A16Weights weights, repack_for_kernel(unpacked, type));
  const int m = static_cast<int>(x.rows);
  const std::vector<std::uint16_t> activations = to_activation(x, type);
  std::vector<float> y(static_cast<std::size_t>(m) * weights.n);
  if (args.cpu) {
    y = w4a16_reference(weights, activations.data(), m);
  } else {
    GPUOPT_ASSIGN_OR_RETURN(std::vector<std::uint16_t> bits, run_on_gpu(weights, activations, m));
    for (std::size_t i = 0; i < y.size(); ++i) {
      y[i] = type == ActivationType::kFloat16 ? fp16_bits_to_float(bits[i])
                                              : bf16_bits_to_float(bits[i]);
    }
  }
  NpyArray out;
  out.dtype = x.dtype;
  out.rows = m;
  out.cols = weights.n;
  out.data.resize(y.size() * tensor_dtype_bytes(out.dtype));
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (out.dtype == TensorDtype::kF32) {
      std::memcpy(out.data.data() + 4 * i, &y[i], 4);
    } else {
      const std::uint16_t bits =
          type == ActivationType::kFloat16 ? float_to_fp16_bits(y[i]) : float_to_bf16_bits(y[i]);
      std::memcpy(out.data.data() + 2 * i, &bits, 2);
    }
  }
  const std::vector<std::byte> bytes = serialize_npy(out);
  GPUOPT_RETURN_IF_ERROR(write_file_atomically(
      args.output.output,
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  if (args.output.json) {
    const nlohmann::json summary = {{"schema_version", 1},
                                    {"input", args.input},
                                    {"layer", args.layer},
                                    {"format", std::string(quant_format_name(config.format))},
                                    {"m", m},
                                    {"k", unpacked.k},
                                    {"n", unpacked.n},
                                    {"group_size", unpacked.group_size},
                                    {"zero_points", unpacked.has_zeros},
                                    {"act_order", !unpacked.perm.empty()},
                                    {"dtype", std::string(activation_type_name(type))},
                                    {"output", args.output.output},
                                    {"engine", args.cpu ? "cpu" : "gpu"}};
    std::printf("%s\n", summary.dump(2).c_str());
    return ok_status();
  }
  std::printf("%s: [%d, %d] @ %s '%s' (K=%d N=%d group %d%s%s) -> [%d, %d] %s in %s (%s)\n",
              args.input.c_str(), m, unpacked.k,
              std::string(quant_format_name(config.format)).c_str(), args.layer.c_str(), unpacked.k,
              unpacked.n, unpacked.group_size, unpacked.has_zeros ? ", zero-points" : ", symmetric",
              unpacked.perm.empty() ? "" : ", act-order", m, unpacked.n,
              std::string(activation_type_name(type)).c_str(), args.output.output.c_str(),
              args.cpu ? "CPU twin" : "GPU");
  return ok_status();
}

GPUOPT_REGISTER_COMMAND("", 75, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<GemmArgs>();
  CLI::App* command = parent.add_subcommand(
      "gemm", "Run one GPTQ/AWQ int4 layer of a safetensors checkpoint on an input .npy");
  command->add_option("--weights", args->weights, "checkpoint .safetensors file")->required();
  command->add_option("--layer", args->layer, "layer prefix, e.g. model.layers.0.mlp.down_proj")
      ->required();
  command->add_option("--input", args->input, "x: [M, K] .npy (float16, bfloat16 or float32)")
      ->required();
  command
      ->add_option("-o,--output", args->output.output,
                   "y: [M, N] .npy, same dtype as the input (checked before the work starts, "
                   "replaced atomically)")
      ->required();
  command->add_flag("--json", args->output.json, "Print the summary as JSON instead of text");
  command->add_option("--format", args->format, "gptq, gptq_v2 or awq (default: from the config)");
  command->add_option("--config", args->config,
                      "quantize_config.json (default: looked for beside the weights)");
  command->add_flag("--cpu", args->cpu, "use the CPU twin instead of the GPU");
  command->callback([args, &exit_code] {
    const Status status = run_gemm(*args);
    if (!status.ok()) {
      print_error("gemm", status);
      exit_code = status.code() == StatusCode::kPermissionDenied ? kExitErrors
                                                                 : exit_code_for_error(status);
      return;
    }
    exit_code = kExitOk;
  });
});

}  // namespace
}  // namespace gpuopt::cli
