// Pipeline CPU twins against hand-computed fixtures: resize/normalise and convolution layers.
#include <gtest/gtest.h>

#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/preprocess.hpp"

namespace gpuopt::pipeline {
namespace {

TEST(Preprocess, TwoByTwoToOneAveragesAllFourPixels) {
  // 2×2 RGB: the single output sample sits at source (0.5, 0.5), the mean of the four pixels.
  const std::uint8_t rgb[] = {0, 10, 255, 100, 20, 255, 50, 30, 0, 150, 40, 0};
  PreprocessParams params;
  params.source_width = 2;
  params.source_height = 2;
  params.output_size = 1;
  params.mean[0] = params.mean[1] = params.mean[2] = 0;
  params.std[0] = params.std[1] = params.std[2] = 1;
  auto out = preprocess_reference(rgb, params);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FLOAT_EQ(out[0], (0 + 100 + 50 + 150) / 4.0f / 255.0f);
  EXPECT_FLOAT_EQ(out[1], (10 + 20 + 30 + 40) / 4.0f / 255.0f);
  EXPECT_FLOAT_EQ(out[2], (255 + 255 + 0 + 0) / 4.0f / 255.0f);
}

TEST(Preprocess, NormalisesPerChannelAndIsInterleaved) {
  std::vector<std::uint8_t> rgb(4 * 4 * 3);
  for (std::size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = 255;
    rgb[i + 1] = 0;
    rgb[i + 2] = 51;
  }
  PreprocessParams params;
  params.source_width = 4;
  params.source_height = 4;
  params.output_size = 2;
  auto out = preprocess_reference(rgb.data(), params);
  ASSERT_EQ(out.size(), 12u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[i * 3 + 0], (1.0f - 0.485f) / 0.229f, 1e-6);
    EXPECT_NEAR(out[i * 3 + 1], (0.0f - 0.456f) / 0.224f, 1e-6);
    EXPECT_NEAR(out[i * 3 + 2], (0.2f - 0.406f) / 0.225f, 1e-6);
  }
}

TEST(Preprocess, RejectsBadParameters) {
  PreprocessParams params;
  params.output_size = 0;
  EXPECT_NE(check_preprocess_params(params).message().find("output_size"), std::string::npos);
  params = PreprocessParams{};
  params.std[1] = 0;
  EXPECT_NE(check_preprocess_params(params).message().find("channel 1"), std::string::npos);
  EXPECT_TRUE(check_preprocess_params(PreprocessParams{}).ok());
}

TEST(ConvReference, ThreeByThreeOnesSumsTheNeighbourhood) {
  TensorShape shape{1, 3, 3, 1};
  std::vector<float> input = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ConvLayerSpec layer{LayerKind::kConv, 1, 3, 1, false};
  std::vector<float> weights(9, 1.0f), bias = {0.5f};
  auto out = conv_layer_reference(input, shape, layer, weights, bias);
  // Zero padding: corner (0,0) sees 1+2+4+5, centre sees all nine.
  ASSERT_EQ(out.size(), 9u);
  EXPECT_FLOAT_EQ(out[0], 12.5f);
  EXPECT_FLOAT_EQ(out[4], 45.5f);
  EXPECT_FLOAT_EQ(out[8], 5 + 6 + 8 + 9 + 0.5f);
}

TEST(ConvReference, StrideTwoAndReluAndChannels) {
  TensorShape shape{1, 4, 4, 2};
  std::vector<float> input(32);
  for (int i = 0; i < 32; ++i) input[i] = (i % 2 == 0) ? 1.0f : -1.0f;  // channel 0 = 1, 1 = -1
  // One 1×1 output channel weighting channel 0 by 2 and channel 1 by 3: 2 - 3 = -1 → ReLU 0.
  ConvLayerSpec layer{LayerKind::kConv, 1, 1, 2, true};
  std::vector<float> weights = {2.0f, 3.0f}, bias = {0.0f};
  auto out = conv_layer_reference(input, shape, layer, weights, bias);
  ASSERT_EQ(out.size(), 4u);  // 4×4 at stride 2 → 2×2
  for (float v : out) EXPECT_FLOAT_EQ(v, 0.0f);
  layer.relu = false;
  out = conv_layer_reference(input, shape, layer, weights, bias);
  for (float v : out) EXPECT_FLOAT_EQ(v, -1.0f);
}

TEST(ConvReference, TransposedConvScattersEachInputOverItsKernel) {
  // 1×1 input of value 1, 3×3 transposed conv at stride 2 → 2×2 output. Output (oy, ox) takes
  // weight (r, s) with oy = 0*2 + r - 1, i.e. r = oy + 1.
  TensorShape shape{1, 1, 1, 1};
  ConvLayerSpec layer{LayerKind::kTransposedConv, 1, 3, 2, false};
  std::vector<float> weights = {1, 2, 3, 4, 5, 6, 7, 8, 9}, bias = {0.0f};
  auto out = conv_layer_reference({1.0f}, shape, layer, weights, bias);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_FLOAT_EQ(out[0], 5);  // (r, s) = (1, 1)
  EXPECT_FLOAT_EQ(out[1], 6);  // (1, 2)
  EXPECT_FLOAT_EQ(out[2], 8);  // (2, 1)
  EXPECT_FLOAT_EQ(out[3], 9);  // (2, 2)
}

TEST(ConvNetShapes, DetectorAndSegmenterShapesAndFlops) {
  TensorShape input{1, 640, 640, 3};
  TensorShape shape = input;
  for (const auto& layer : detector_layers()) shape = *layer_output_shape(shape, layer);
  EXPECT_EQ(shape.h, 20);
  EXPECT_EQ(shape.w, 20);
  EXPECT_EQ(shape.c, 255);
  shape = input;
  for (const auto& layer : segmenter_layers()) shape = *layer_output_shape(shape, layer);
  EXPECT_EQ(shape.h, 640);
  EXPECT_EQ(shape.c, 8);
  // One hand-computed layer: 3×3 conv 3→16 at stride 2 on 640² gives 320²×16 outputs × 27 MACs.
  std::vector<ConvLayerSpec> first = {detector_layers()[0]};
  EXPECT_DOUBLE_EQ(network_flops(input, first), 2.0 * 320 * 320 * 16 * 27);
  EXPECT_FALSE(layer_output_shape(input, {LayerKind::kConv, 8, 2, 1}).ok());  // even kernel
}

}  // namespace
}  // namespace gpuopt::pipeline
