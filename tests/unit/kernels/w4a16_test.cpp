// W4A16 on the CPU: number conversions, GPTQ/AWQ packing, the kernel tile layout, and the CPU twin
// against a float64 naive reference on fresh random layers.
#include "gpuopt/kernels/w4a16.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpuopt/kernels/quant_formats.hpp"

namespace gpuopt::kernels {
namespace {

using ::testing::HasSubstr;

std::uint64_t fresh_seed() { return std::random_device{}(); }

TEST(HalfConversion, ExactValuesAndRounding) {
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16_bits(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(float_to_fp16_bits(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(1.0f + 3 * 0.00048828125f), 0x3c02);
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);  // tie, to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f / 256), 0x3f82);
}

TEST(HalfConversion, EveryHalfRoundTrips) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = fp16_bits_to_float(static_cast<std::uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(float_to_fp16_bits(value), bits) << "bits " << bits;
  }
}

TEST(CheckpointPacking, GptqWordHoldsEightRowsLowNibbleFirst) {
  UnpackedLayer layer = random_unpacked_layer(8, 8, 8, false, false, 1);
  for (int row = 0; row < 8; ++row) {
    for (int col = 0; col < 8; ++col) layer.q[row * 8 + col] = static_cast<std::uint8_t>(row + 1);
  }
  auto packed = pack_checkpoint_layer(layer, QuantFormat::kGptq, GptqZeros::kV2);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  EXPECT_EQ(static_cast<std::uint32_t>(packed->qweight[0]), 0x87654321u);
}

TEST(CheckpointPacking, AwqWordUsesInterleavedColumnOrder) {
  UnpackedLayer layer = random_unpacked_layer(8, 8, 8, true, false, 2);
  for (int col = 0; col < 8; ++col) layer.q[col] = static_cast<std::uint8_t>(col);
  for (int col = 0; col < 8; ++col) layer.zeros[col] = static_cast<std::uint8_t>(col + 1);
  auto packed = pack_checkpoint_layer(layer, QuantFormat::kAwq, GptqZeros::kV2);
  ASSERT_TRUE(packed.ok());
  // Nibble p holds column 0,2,4,6,1,3,5,7.
  EXPECT_EQ(static_cast<std::uint32_t>(packed->qweight[0]), 0x75316420u);
  EXPECT_EQ(static_cast<std::uint32_t>(packed->qzeros[0]), 0x86427531u);
}

TEST(CheckpointPacking, GptqV1StoresZeroMinusOne) {
  CheckpointLayer layer;
  layer.format = QuantFormat::kGptq;
  layer.gptq_zeros = GptqZeros::kV1MinusOne;
  layer.k = 8;
  layer.n = 8;
  layer.group_size = 8;
  layer.qweight.assign(8, 0);
  layer.scales.assign(8, float_to_fp16_bits(1.0f));
  layer.qzeros = {0x76543210};
  auto unpacked = unpack_checkpoint_layer(layer);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().to_string();
  for (int col = 0; col < 8; ++col) EXPECT_EQ(unpacked->zeros[col], col + 1);
  layer.gptq_zeros = GptqZeros::kV2;
  unpacked = unpack_checkpoint_layer(layer);
  ASSERT_TRUE(unpacked.ok());
  for (int col = 0; col < 8; ++col) EXPECT_EQ(unpacked->zeros[col], col);
  // Symmetric v1 checkpoints store 7 everywhere: zero 8, so the zeros are dropped.
  layer.gptq_zeros = GptqZeros::kV1MinusOne;
  layer.qzeros = {0x77777777};
  unpacked = unpack_checkpoint_layer(layer);
  ASSERT_TRUE(unpacked.ok());
  EXPECT_FALSE(unpacked->has_zeros);
  layer.qzeros = {static_cast<std::int32_t>(0xf7777777u)};
  EXPECT_THAT(unpack_checkpoint_layer(layer).status().message(), HasSubstr("v2 checkpoint"));
}

struct FormatCase {
  QuantFormat format;
  GptqZeros zeros;
  int group_size;
  bool has_zeros;
  bool act_order;
};

class CheckpointRoundTrip : public ::testing::TestWithParam<FormatCase> {};

TEST_P(CheckpointRoundTrip, PackThenUnpackGivesTheLayerBack) {
  const FormatCase c = GetParam();
  const UnpackedLayer layer =
      random_unpacked_layer(256, 128, c.group_size, c.has_zeros, c.act_order, fresh_seed());
  auto packed = pack_checkpoint_layer(layer, c.format, c.zeros);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  EXPECT_EQ(packed->g_idx.empty(), !c.act_order);
  auto unpacked = unpack_checkpoint_layer(*packed);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().to_string();
  EXPECT_EQ(unpacked->group_size, c.group_size <= 0 ? 256 : c.group_size);
  EXPECT_EQ(unpacked->q, layer.q);
  EXPECT_EQ(unpacked->has_zeros, layer.has_zeros);
  if (layer.has_zeros) EXPECT_EQ(unpacked->zeros, layer.zeros);
  EXPECT_EQ(unpacked->scales, layer.scales);
  // The permutation may come back in another order within a group; the product must not change.
  std::mt19937 random(7);
  std::vector<float> x(3 * 256);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(random);
  const auto expected = naive_reference(layer, x, 3);
  const auto actual = naive_reference(*unpacked, x, 3);
  for (std::size_t i = 0; i < expected.size(); ++i) ASSERT_NEAR(actual[i], expected[i], 1e-9);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CheckpointRoundTrip,
    ::testing::Values(FormatCase{QuantFormat::kGptq, GptqZeros::kV1MinusOne, 128, true, false},
                      FormatCase{QuantFormat::kGptq, GptqZeros::kV2, 64, true, false},
                      FormatCase{QuantFormat::kGptq, GptqZeros::kV1MinusOne, 32, false, false},
                      FormatCase{QuantFormat::kGptq, GptqZeros::kV1MinusOne, 128, true, true},
                      FormatCase{QuantFormat::kGptq, GptqZeros::kV2, -1, true, false},
                      FormatCase{QuantFormat::kAwq, GptqZeros::kV2, 128, true, false},
                      FormatCase{QuantFormat::kAwq, GptqZeros::kV2, 32, true, false},
                      FormatCase{QuantFormat::kAwq, GptqZeros::kV2, 64, false, false}));

TEST(CheckpointErrors, NameTheTensorAndTheMismatch) {
  UnpackedLayer layer = random_unpacked_layer(64, 64, 32, true, false, 3);
  auto packed = pack_checkpoint_layer(layer, QuantFormat::kGptq, GptqZeros::kV2);
  ASSERT_TRUE(packed.ok());
  CheckpointLayer broken = *packed;
  broken.qweight.pop_back();
  EXPECT_THAT(unpack_checkpoint_layer(broken).status().message(), HasSubstr("qweight has 511"));
  broken = *packed;
  broken.scales.resize(10);
  EXPECT_THAT(unpack_checkpoint_layer(broken).status().message(), HasSubstr("scales"));
  broken = *packed;
  broken.g_idx.assign(64, 0);
  broken.g_idx[5] = 9;
  EXPECT_THAT(unpack_checkpoint_layer(broken).status().message(), HasSubstr("g_idx[5] = 9"));
  broken.g_idx.assign(64, 0);  // every row in group 0: groups of uneven size
  EXPECT_THAT(unpack_checkpoint_layer(broken).status().message(), HasSubstr("exactly group_size"));
  broken = *packed;
  broken.group_size = 48;
  EXPECT_THAT(unpack_checkpoint_layer(broken).status().message(),
              HasSubstr("not a multiple of group_size=48"));
}

TEST(KernelLayout, RefusesShapesWithTheReason) {
  EXPECT_THAT(check_w4a16_shape(4096, 1000, 128).message(),
              HasSubstr("N=1000 is not a multiple of 64"));
  EXPECT_THAT(check_w4a16_shape(4000, 1024, 32).message(),
              HasSubstr("K=4000 is not a multiple of 64"));
  EXPECT_THAT(check_w4a16_shape(4096, 1024, 40).message(), HasSubstr("group_size=40"));
  EXPECT_THAT(check_w4a16_shape(4032, 1024, 128).message(), HasSubstr("group_size=128"));
  EXPECT_TRUE(check_w4a16_shape(4096, 1024, 128).ok());
  UnpackedLayer layer = random_unpacked_layer(128, 1000 / 8 * 8, 64, true, false, 4);
  EXPECT_EQ(repack_for_kernel(layer, ActivationType::kFloat16).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(KernelLayout, FirstTileMatchesTheDocumentedFragmentMapping) {
  UnpackedLayer layer = random_unpacked_layer(64, 64, 64, false, false, 5);
  for (int k = 0; k < 64; ++k) {
    for (int n = 0; n < 64; ++n) layer.q[k * 64 + n] = static_cast<std::uint8_t>((k * 7 + n) & 15);
  }
  auto packed = repack_for_kernel(layer, ActivationType::kFloat16);
  ASSERT_TRUE(packed.ok());
  // Lane 5 (g=1, c=1), word 1, nibble 6: j = 2 + (6%4)/2 = 3, k = 2 + 0 + 1 = 3, n = 25.
  const std::uint32_t word = packed->tiles[4 * 5 + 1];
  EXPECT_EQ((word >> 24) & 15u, static_cast<std::uint32_t>(layer.q[3 * 64 + 25]));
  // Nibble 1 of the same word: pair 1 is the upper k half: k = 2 + 8 = 10, j = 2, n = 17.
  EXPECT_EQ((word >> 4) & 15u, static_cast<std::uint32_t>(layer.q[10 * 64 + 17]));
}

class KernelLayoutRoundTrip
    : public ::testing::TestWithParam<std::tuple<ActivationType, int, bool, bool>> {};

TEST_P(KernelLayoutRoundTrip, RepackThenUnpackGivesTheLayerBack) {
  const auto [type, group_size, has_zeros, act_order] = GetParam();
  const UnpackedLayer layer =
      random_unpacked_layer(192, 320, group_size, has_zeros, act_order, fresh_seed());
  auto packed = repack_for_kernel(layer, type);
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  const UnpackedLayer back = unpack_kernel_layout(*packed);
  EXPECT_EQ(back.q, layer.q);
  EXPECT_EQ(back.zeros, layer.zeros);
  EXPECT_EQ(back.perm, layer.perm);
  for (std::size_t i = 0; i < layer.scales.size(); ++i) {
    // fp16 scales are exact; bf16 keeps 8 significant bits.
    ASSERT_NEAR(back.scales[i], layer.scales[i],
                type == ActivationType::kFloat16 ? 0.0 : layer.scales[i] / 256.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KernelLayoutRoundTrip,
    ::testing::Combine(::testing::Values(ActivationType::kFloat16, ActivationType::kBFloat16),
                       ::testing::Values(32, 64, 192), ::testing::Bool(), ::testing::Bool()));

double relative_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff / norm);
}

class CpuTwin : public ::testing::TestWithParam<std::tuple<ActivationType, int, int, bool>> {};

TEST_P(CpuTwin, MatchesFloat64NaiveReference) {
  const auto [type, m, group_size, act_order] = GetParam();
  const std::uint64_t seed = fresh_seed();
  UnpackedLayer layer = random_unpacked_layer(256, 192, group_size, true, act_order, seed);
  auto packed = repack_for_kernel(layer, type);
  ASSERT_TRUE(packed.ok());
  // The oracle uses the scales the kernel sees (bf16 rounds them).
  layer.scales = unpack_kernel_layout(*packed).scales;
  std::mt19937 random(static_cast<unsigned>(seed));
  std::vector<std::uint16_t> x_bits(static_cast<std::size_t>(m) * layer.k);
  std::vector<float> x(x_bits.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = std::uniform_real_distribution<float>(-1, 1)(random);
    x_bits[i] = type == ActivationType::kFloat16 ? float_to_fp16_bits(v) : float_to_bf16_bits(v);
    x[i] = type == ActivationType::kFloat16 ? fp16_bits_to_float(x_bits[i])
                                            : bf16_bits_to_float(x_bits[i]);
  }
  const std::vector<float> twin = w4a16_reference(*packed, x_bits.data(), m);
  const std::vector<double> naive = naive_reference(layer, x, m);
  EXPECT_LT(relative_error(twin, naive), 1e-6) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuTwin,
                         ::testing::Combine(::testing::Values(ActivationType::kFloat16,
                                                              ActivationType::kBFloat16),
                                            ::testing::Values(1, 7, 16),
                                            ::testing::Values(32, 128, 256), ::testing::Bool()));

}  // namespace
}  // namespace gpuopt::kernels
