// Shapes, FLOP counts, seeded weights and the CPU twin of one convolution layer.
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "gpuopt/pipeline/convnet.hpp"

namespace gpuopt::pipeline {

StatusOr<TensorShape> layer_output_shape(const TensorShape& in, const ConvLayerSpec& layer) {
  if (layer.out_channels <= 0 || layer.kernel <= 0 || layer.kernel % 2 == 0 || layer.stride <= 0) {
    return invalid_argument(
        fmt::format("layer: out_channels {} kernel {} stride {} (kernel must be "
                    "odd, all positive)",
                    layer.out_channels, layer.kernel, layer.stride));
  }
  TensorShape out = in;
  out.c = layer.out_channels;
  if (layer.kind == LayerKind::kConv) {
    // "same" padding: out = ceil(in / stride).
    out.h = (in.h + layer.stride - 1) / layer.stride;
    out.w = (in.w + layer.stride - 1) / layer.stride;
  } else {
    out.h = in.h * layer.stride;
    out.w = in.w * layer.stride;
  }
  if (out.h <= 0 || out.w <= 0) return invalid_argument("layer: empty output");
  return out;
}

double network_flops(const TensorShape& input, const std::vector<ConvLayerSpec>& layers) {
  double flops = 0;
  TensorShape shape = input;
  for (const auto& layer : layers) {
    auto out = layer_output_shape(shape, layer);
    if (!out.ok()) return 0;
    // Each output element: kernel² × in_channels multiply-adds. For a transposed conv the same
    // count holds per input element, expressed on the smaller side.
    const TensorShape& small = layer.kind == LayerKind::kConv ? *out : shape;
    const int other_channels = layer.kind == LayerKind::kConv ? shape.c : out->c;
    flops +=
        2.0 * static_cast<double>(small.elements()) * layer.kernel * layer.kernel * other_channels;
    shape = *out;
  }
  return flops;
}

std::vector<ConvLayerSpec> detector_layers() {
  using K = LayerKind;
  // A YOLOv8n-like backbone: stride-2 stages with a 3×3 conv each, then a 1×1 head of
  // 3 anchors × (4 box + 1 objectness + 80 classes) = 255 channels at /32.
  return {{K::kConv, 16, 3, 2},        {K::kConv, 32, 3, 2},  {K::kConv, 32, 3, 1},
          {K::kConv, 64, 3, 2},        {K::kConv, 64, 3, 1},  {K::kConv, 128, 3, 2},
          {K::kConv, 128, 3, 1},       {K::kConv, 256, 3, 2}, {K::kConv, 256, 3, 1},
          {K::kConv, 255, 1, 1, false}};
}

std::vector<ConvLayerSpec> segmenter_layers() {
  using K = LayerKind;
  // Encoder /16 then a decoder of transposed convolutions back to full size, 8 classes.
  return {{K::kConv, 32, 3, 2},           {K::kConv, 64, 3, 2},
          {K::kConv, 128, 3, 2},          {K::kConv, 256, 3, 2},
          {K::kConv, 256, 3, 1},          {K::kTransposedConv, 128, 3, 2},
          {K::kTransposedConv, 64, 3, 2}, {K::kTransposedConv, 32, 3, 2},
          {K::kTransposedConv, 16, 3, 2}, {K::kConv, 8, 1, 1, false}};
}

void make_layer_weights(std::uint64_t seed, int index, int in_channels, const ConvLayerSpec& layer,
                        std::vector<float>& weights, std::vector<float>& bias) {
  std::mt19937_64 generator(seed * 1000003ull + static_cast<std::uint64_t>(index));
  const int fan_in = layer.kernel * layer.kernel * in_channels;
  const float limit = std::sqrt(6.0f / static_cast<float>(fan_in));
  std::uniform_real_distribution<float> weight(-limit, limit);
  std::uniform_real_distribution<float> small(-0.1f, 0.1f);
  weights.resize(static_cast<std::size_t>(layer.out_channels) * layer.kernel * layer.kernel *
                 in_channels);
  for (auto& w : weights) w = weight(generator);
  bias.resize(layer.out_channels);
  for (auto& b : bias) b = small(generator);
}

std::vector<float> conv_layer_reference(const std::vector<float>& input, const TensorShape& in,
                                        const ConvLayerSpec& layer,
                                        const std::vector<float>& weights,
                                        const std::vector<float>& bias) {
  auto out_shape = layer_output_shape(in, layer);
  GPUOPT_CHECK(out_shape.ok());
  const TensorShape out = *out_shape;
  const int r_half = layer.kernel / 2;
  std::vector<float> output(out.elements(), 0.0f);
  auto in_at = [&](int n, int y, int x, int c) {
    return input[((static_cast<std::size_t>(n) * in.h + y) * in.w + x) * in.c + c];
  };
  // Forward conv: weights [out K][R][S][in C]. Transposed conv (cuDNN backward-data of a forward
  // conv from the large to the small tensor): weights [in C][R][S][out K].
  auto w_at = [&](int k, int r, int s, int c) {
    if (layer.kind == LayerKind::kConv) {
      return weights[((static_cast<std::size_t>(k) * layer.kernel + r) * layer.kernel + s) * in.c +
                     c];
    }
    return weights[((static_cast<std::size_t>(c) * layer.kernel + r) * layer.kernel + s) * out.c +
                   k];
  };
  for (int n = 0; n < out.n; ++n) {
    for (int oy = 0; oy < out.h; ++oy) {
      for (int ox = 0; ox < out.w; ++ox) {
        for (int k = 0; k < out.c; ++k) {
          double sum = bias[k];
          for (int r = 0; r < layer.kernel; ++r) {
            for (int s = 0; s < layer.kernel; ++s) {
              int iy, ix;
              if (layer.kind == LayerKind::kConv) {
                iy = oy * layer.stride + r - r_half;
                ix = ox * layer.stride + s - r_half;
              } else {
                // Transposed conv: output (oy, ox) gathers input (iy, ix) wherever
                // oy = iy * stride + r - r_half, the forward conv's index map read backwards.
                int ty = oy + r_half - r, tx = ox + r_half - s;
                if (ty < 0 || tx < 0 || ty % layer.stride != 0 || tx % layer.stride != 0) continue;
                iy = ty / layer.stride;
                ix = tx / layer.stride;
              }
              if (iy < 0 || iy >= in.h || ix < 0 || ix >= in.w) continue;
              for (int c = 0; c < in.c; ++c)
                sum += static_cast<double>(in_at(n, iy, ix, c)) * w_at(k, r, s, c);
            }
          }
          float value = static_cast<float>(sum);
          if (layer.relu) value = std::max(value, 0.0f);
          output[((static_cast<std::size_t>(n) * out.h + oy) * out.w + ox) * out.c + k] = value;
        }
      }
    }
  }
  return output;
}

}  // namespace gpuopt::pipeline
