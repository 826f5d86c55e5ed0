// Convolutional networks for the pipeline's detector and segmenter, run through cuDNN in fp16
// NHWC with fp32 accumulation. Weights are seeded random values with the real layer shapes: no
// weights can be downloaded here, and the pipeline measures scheduling, not accuracy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::pipeline {

enum class LayerKind { kConv, kTransposedConv };

struct ConvLayerSpec {
  LayerKind kind = LayerKind::kConv;
  int out_channels = 0;
  int kernel = 3;
  int stride = 1;
  bool relu = true;
};

struct TensorShape {  // NHWC
  int n = 1, h = 0, w = 0, c = 0;
  std::size_t elements() const { return static_cast<std::size_t>(n) * h * w * c; }
};

// Output shape of one layer ("same" padding kernel/2; transposed conv doubles H and W at stride 2).
StatusOr<TensorShape> layer_output_shape(const TensorShape& input, const ConvLayerSpec& layer);

// Multiply-accumulates ×2 of the whole network for an input shape (documented FLOPs).
double network_flops(const TensorShape& input, const std::vector<ConvLayerSpec>& layers);

// The two networks of the scenario (docs/pipeline.md gives their FLOPs and bytes).
std::vector<ConvLayerSpec> detector_layers();   // YOLO-shaped backbone + 1×1 head, /32
std::vector<ConvLayerSpec> segmenter_layers();  // encoder /16, decoder ×16, 8 classes

// CPU twin of one layer, float32: input [N,H,W,C], weights [K, R, S, C] (KRSC), bias [K].
std::vector<float> conv_layer_reference(const std::vector<float>& input, const TensorShape& shape,
                                        const ConvLayerSpec& layer,
                                        const std::vector<float>& weights,
                                        const std::vector<float>& bias);

// Seeded weights for layer `index` of a network, in the layout conv_layer_reference takes
// (values in ±sqrt(6 / fan_in) so activations stay O(1) through depth).
void make_layer_weights(std::uint64_t seed, int index, int in_channels, const ConvLayerSpec& layer,
                        std::vector<float>& weights, std::vector<float>& bias);

// A network bound to one input shape, with device weights and activation buffers. Not
// thread-safe: one instance per stream that runs it.
class ConvNet {
 public:
  // UNIMPLEMENTED without CUDA; UNAVAILABLE when cuDNN cannot be loaded or initialised.
  static StatusOr<std::unique_ptr<ConvNet>> create(std::string name, TensorShape input,
                                                   std::vector<ConvLayerSpec> layers,
                                                   std::uint64_t seed);
  virtual ~ConvNet() = default;

  const std::string& name() const { return name_; }
  const TensorShape& input_shape() const { return input_; }
  const TensorShape& output_shape() const { return output_; }
  double flops() const { return network_flops(input_, layers_); }

  // input: device [N,H,W,C] fp16 bits; output: the network's own device buffer (valid until the
  // next run on this instance). Enqueued on `stream`.
  virtual StatusOr<const std::uint16_t*> run(const std::uint16_t* input,
                                             runtime::StreamHandle stream) = 0;

 protected:
  ConvNet(std::string name, TensorShape input, TensorShape output,
          std::vector<ConvLayerSpec> layers)
      : name_(std::move(name)), input_(input), output_(output), layers_(std::move(layers)) {}

 private:
  std::string name_;
  TensorShape input_, output_;
  std::vector<ConvLayerSpec> layers_;
};

}  // namespace gpuopt::pipeline
