// ConvNet on cuDNN (legacy convolution API, fp16 NHWC, fp32 accumulation, tensor-op math) with a
// fused bias + ReLU kernel after each layer.
// (No fmt here: fmt 9's constexpr paths do not compile under nvcc in C++20 mode.)
#include <cuda_fp16.h>
#include <cudnn.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::pipeline {
namespace {

Status cudnn_status(cudnnStatus_t status, const char* expression, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return ok_status();
  StatusCode code = StatusCode::kInternal;
  if (status == CUDNN_STATUS_ALLOC_FAILED) code = StatusCode::kResourceExhausted;
  if (status == CUDNN_STATUS_NOT_SUPPORTED) code = StatusCode::kUnimplemented;
  if (status == CUDNN_STATUS_BAD_PARAM) code = StatusCode::kInvalidArgument;
  if (status == CUDNN_STATUS_NOT_INITIALIZED) code = StatusCode::kUnavailable;
  return gpu_api_error(GpuApi::kCudnn, code, static_cast<long>(status), cudnnGetErrorString(status),
                       "see cuDNN documentation", expression, file, line);
}
#define GPUOPT_CUDNN_TRY(expr) \
  GPUOPT_RETURN_IF_ERROR(cudnn_status((expr), #expr, __FILE__, __LINE__))

__global__ void k_bias_relu_f16(__half* __restrict__ data, const __half* __restrict__ bias,
                                std::size_t elements, int channels, bool relu) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
       i < elements; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float value = __half2float(data[i]) + __half2float(bias[i % channels]);
    data[i] = __float2half_rn(relu ? fmaxf(value, 0.0f) : value);
  }
}

std::vector<std::uint16_t> to_half_bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    __half h = __float2half_rn(values[i]);
    std::memcpy(&bits[i], &h, sizeof(h));
  }
  return bits;
}

struct Layer {
  ConvLayerSpec spec;
  TensorShape in, out;
  cudnnTensorDescriptor_t in_desc = nullptr, out_desc = nullptr;
  cudnnFilterDescriptor_t filter_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t backward_algo{};
  runtime::DeviceBuffer weights;  // __half[K*R*S*C]
  runtime::DeviceBuffer bias;     // __half[K]
  runtime::DeviceBuffer output;   // __half[out.elements()]
};

class CudnnConvNet final : public ConvNet {
 public:
  CudnnConvNet(std::string name, TensorShape input, TensorShape output,
               std::vector<ConvLayerSpec> layers)
      : ConvNet(std::move(name), input, output, std::move(layers)) {}

  ~CudnnConvNet() override {
    for (auto& layer : layers_) {
      if (layer.in_desc) cudnnDestroyTensorDescriptor(layer.in_desc);
      if (layer.out_desc) cudnnDestroyTensorDescriptor(layer.out_desc);
      if (layer.filter_desc) cudnnDestroyFilterDescriptor(layer.filter_desc);
      if (layer.conv_desc) cudnnDestroyConvolutionDescriptor(layer.conv_desc);
    }
    if (handle_) cudnnDestroy(handle_);
  }

  Status initialize(std::uint64_t seed, const std::vector<ConvLayerSpec>& specs) {
    GPUOPT_CUDNN_TRY(cudnnCreate(&handle_));
    TensorShape shape = input_shape();
    std::size_t workspace_bytes = 0;
    for (std::size_t index = 0; index < specs.size(); ++index) {
      Layer layer;
      layer.spec = specs[index];
      layer.in = shape;
      GPUOPT_ASSIGN_OR_RETURN(layer.out, layer_output_shape(shape, layer.spec));
      const bool forward = layer.spec.kind == LayerKind::kConv;
      // For a transposed conv, cuDNN sees the forward conv from the large (output) tensor to the
      // small (input) one and runs its backward-data pass.
      const TensorShape& x = forward ? layer.in : layer.out;
      const TensorShape& y = forward ? layer.out : layer.in;
      GPUOPT_CUDNN_TRY(cudnnCreateTensorDescriptor(&layer.in_desc));
      GPUOPT_CUDNN_TRY(cudnnCreateTensorDescriptor(&layer.out_desc));
      GPUOPT_CUDNN_TRY(cudnnCreateFilterDescriptor(&layer.filter_desc));
      GPUOPT_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&layer.conv_desc));
      GPUOPT_CUDNN_TRY(cudnnSetTensor4dDescriptor(layer.in_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF,
                                                  x.n, x.c, x.h, x.w));
      GPUOPT_CUDNN_TRY(cudnnSetTensor4dDescriptor(layer.out_desc, CUDNN_TENSOR_NHWC,
                                                  CUDNN_DATA_HALF, y.n, y.c, y.h, y.w));
      GPUOPT_CUDNN_TRY(cudnnSetFilter4dDescriptor(layer.filter_desc, CUDNN_DATA_HALF,
                                                  CUDNN_TENSOR_NHWC, y.c, x.c, layer.spec.kernel,
                                                  layer.spec.kernel));
      const int pad = layer.spec.kernel / 2;
      GPUOPT_CUDNN_TRY(cudnnSetConvolution2dDescriptor(layer.conv_desc, pad, pad, layer.spec.stride,
                                                       layer.spec.stride, 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      GPUOPT_CUDNN_TRY(cudnnSetConvolutionMathType(layer.conv_desc, CUDNN_TENSOR_OP_MATH));
      std::size_t bytes = 0;
      int returned = 0;
      if (forward) {
        cudnnConvolutionFwdAlgoPerf_t perf[8];
        GPUOPT_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(
            handle_, layer.in_desc, layer.filter_desc, layer.conv_desc, layer.out_desc, 8,
            &returned, perf));
        if (returned == 0) return unimplemented(name() + ": no cuDNN forward algorithm");
        layer.forward_algo = perf[0].algo;
        GPUOPT_CUDNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(
            handle_, layer.in_desc, layer.filter_desc, layer.conv_desc, layer.out_desc,
            layer.forward_algo, &bytes));
      } else {
        cudnnConvolutionBwdDataAlgoPerf_t perf[8];
        GPUOPT_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            handle_, layer.filter_desc, layer.out_desc, layer.conv_desc, layer.in_desc, 8,
            &returned, perf));
        if (returned == 0) return unimplemented(name() + ": no cuDNN backward-data algorithm");
        layer.backward_algo = perf[0].algo;
        GPUOPT_CUDNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(
            handle_, layer.filter_desc, layer.out_desc, layer.conv_desc, layer.in_desc,
            layer.backward_algo, &bytes));
      }
      workspace_bytes = std::max(workspace_bytes, bytes);

      std::vector<float> weights, bias;
      make_layer_weights(seed, static_cast<int>(index), layer.in.c, layer.spec, weights, bias);
      std::vector<std::uint16_t> weights_half = to_half_bits(weights),
                                 bias_half = to_half_bits(bias);
      GPUOPT_ASSIGN_OR_RETURN(layer.weights,
                              runtime::DeviceBuffer::allocate(weights_half.size() * 2));
      GPUOPT_ASSIGN_OR_RETURN(layer.bias, runtime::DeviceBuffer::allocate(bias_half.size() * 2));
      GPUOPT_ASSIGN_OR_RETURN(
          layer.output, runtime::DeviceBuffer::allocate(layer.out.elements() * sizeof(__half)));
      // Set-up copies, once, before any stream work: synchronous copies are fine here.
      GPUOPT_CUDA_TRY(cudaMemcpy(layer.weights.data(), weights_half.data(), weights_half.size() * 2,
                                 cudaMemcpyHostToDevice));
      GPUOPT_CUDA_TRY(cudaMemcpy(layer.bias.data(), bias_half.data(), bias_half.size() * 2,
                                 cudaMemcpyHostToDevice));
      layers_.push_back(std::move(layer));
      shape = layer.out;
    }
    GPUOPT_ASSIGN_OR_RETURN(workspace_, runtime::DeviceBuffer::allocate(workspace_bytes));
    workspace_bytes_ = workspace_bytes;
    return ok_status();
  }

  StatusOr<const std::uint16_t*> run(const std::uint16_t* input,
                                     runtime::StreamHandle stream) override {
    if (input == nullptr) return invalid_argument(name() + ": null input");
    if (stream == nullptr) return invalid_argument(name() + ": needs an explicit stream");
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    GPUOPT_CUDNN_TRY(cudnnSetStream(handle_, cuda_stream));
    const float alpha = 1.0f, beta = 0.0f;
    const __half* x = reinterpret_cast<const __half*>(input);
    for (auto& layer : layers_) {
      if (layer.spec.kind == LayerKind::kConv) {
        GPUOPT_CUDNN_TRY(cudnnConvolutionForward(
            handle_, &alpha, layer.in_desc, x, layer.filter_desc, layer.weights.data(),
            layer.conv_desc, layer.forward_algo, workspace_.data(), workspace_bytes_, &beta,
            layer.out_desc, layer.output.data()));
      } else {
        GPUOPT_CUDNN_TRY(cudnnConvolutionBackwardData(
            handle_, &alpha, layer.filter_desc, layer.weights.data(), layer.out_desc, x,
            layer.conv_desc, layer.backward_algo, workspace_.data(), workspace_bytes_, &beta,
            layer.in_desc, layer.output.data()));
      }
      const std::size_t elements = layer.out.elements();
      const int blocks = static_cast<int>(std::min<std::size_t>((elements + 255) / 256, 4096));
      k_bias_relu_f16<<<blocks, 256, 0, cuda_stream>>>(layer.output.data_as<__half>(),
                                                       layer.bias.data_as<const __half>(), elements,
                                                       layer.out.c, layer.spec.relu);
      GPUOPT_CUDA_TRY_LAUNCH();
      x = layer.output.data_as<const __half>();
    }
    return reinterpret_cast<const std::uint16_t*>(x);
  }

 private:
  cudnnHandle_t handle_ = nullptr;
  std::vector<Layer> layers_;
  runtime::DeviceBuffer workspace_;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<ConvNet>> ConvNet::create(std::string name, TensorShape input,
                                                   std::vector<ConvLayerSpec> layers,
                                                   std::uint64_t seed) {
  if (input.n <= 0 || input.h <= 0 || input.w <= 0 || input.c <= 0) {
    return invalid_argument(name + ": input shape must be positive");
  }
  if (layers.empty()) return invalid_argument(name + ": no layers");
  TensorShape shape = input;
  for (const auto& layer : layers) {
    GPUOPT_ASSIGN_OR_RETURN(shape, layer_output_shape(shape, layer));
  }
  auto net = std::make_unique<CudnnConvNet>(name, input, shape, layers);
  GPUOPT_RETURN_IF_ERROR(net->initialize(seed, layers).with_context(name));
  return std::unique_ptr<ConvNet>(std::move(net));
}

}  // namespace gpuopt::pipeline
