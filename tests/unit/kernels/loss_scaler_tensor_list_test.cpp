// TensorListScaler's host planning (the per-call tensor table) and the CPU twin of its three
// passes, against hand-computed values and brute force.
#include "kernels/loss_scaler_tensor_list.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpuopt/kernels/loss_scaler.hpp"

namespace gpuopt::kernels {
namespace {

// Keeps the compiler from folding or contracting a product: each one is a rounded fp32 multiply.
float multiply(float a, float b) {
  volatile float product = a * b;
  return product;
}

TEST(TensorListTable, SkipsEmptyTensorsAndNumbersChunks) {
  alignas(16) static float a[100];
  alignas(16) static std::uint16_t b[1000];
  alignas(16) static float c[256];
  const std::vector<GradientTensor> tensors = {
      {a, 100, GradientDtype::kFloat32},
      {nullptr, 0, GradientDtype::kFloat32},  // empty: left out, even with null data
      {b, 1000, GradientDtype::kBFloat16},
      {c, 256, GradientDtype::kFloat32},
  };
  // 1024-byte chunks: 256 fp32 or 512 bf16 elements.
  auto table = detail::build_tensor_table(tensors, 1024);
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  ASSERT_EQ(table->entries.size(), 3u);
  EXPECT_EQ(table->entries[0].first_chunk, 0u);
  EXPECT_EQ(table->entries[0].chunk_elements, 256u);
  EXPECT_EQ(table->entries[1].first_chunk, 1u);  // 100 fp32 = one chunk
  EXPECT_EQ(table->entries[1].chunk_elements, 512u);
  EXPECT_EQ(table->entries[2].first_chunk, 3u);  // 1000 bf16 = two chunks
  EXPECT_EQ(table->chunk_count, 4u);             // 256 fp32 = one chunk
  EXPECT_EQ(table->entries[1].data, reinterpret_cast<char*>(b));
}

TEST(TensorListTable, EntryOfChunkMatchesLinearScan) {
  std::mt19937 random(7);
  std::vector<std::vector<float>> storage;
  std::vector<GradientTensor> tensors;
  for (int t = 0; t < 57; ++t) {
    const std::size_t count = random() % 3 == 0 ? 0 : 1 + random() % 5000;
    storage.emplace_back(count + 1);
    tensors.push_back({storage.back().data(), count, GradientDtype::kFloat32});
  }
  auto table = detail::build_tensor_table(tensors, 1024);
  ASSERT_TRUE(table.ok());
  std::uint64_t chunk = 0;
  for (std::size_t e = 0; e < table->entries.size(); ++e) {
    const auto& entry = table->entries[e];
    const std::uint64_t chunks = (entry.count + entry.chunk_elements - 1) / entry.chunk_elements;
    for (std::uint64_t k = 0; k < chunks; ++k, ++chunk) {
      ASSERT_EQ(detail::entry_of_chunk(table->entries.data(), table->entries.size(), chunk), e)
          << "chunk " << chunk;
    }
  }
  EXPECT_EQ(chunk, table->chunk_count);
}

TEST(TensorListTable, NamesTheBadTensor) {
  alignas(16) static std::uint16_t half[8];
  const std::vector<GradientTensor> null_data = {{half, 4, GradientDtype::kFloat16},
                                                 {nullptr, 3, GradientDtype::kFloat32}};
  auto result = detail::build_tensor_table(null_data, 1024);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("gradient tensor 1"), std::string::npos);
  EXPECT_NE(result.status().message().find("null data"), std::string::npos);

  const std::vector<GradientTensor> misaligned = {
      {reinterpret_cast<char*>(half) + 1, 2, GradientDtype::kFloat16}};
  result = detail::build_tensor_table(misaligned, 1024);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("not aligned"), std::string::npos);

  const std::vector<GradientTensor> bad_dtype = {{half, 2, static_cast<GradientDtype>(9)}};
  result = detail::build_tensor_table(bad_dtype, 1024);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("unknown dtype 9"), std::string::npos);
}

TEST(TensorListReference, ClipCoefficientFollowsTorchsFp32Operations) {
  // Hand-derived: reciprocal of (norm + 1e-6f), rounded, times max_norm, rounded, clamped at 1.
  const float denominator = 3.0f + 1e-6f;
  EXPECT_EQ(clip_coefficient_reference(3.0f, 1.0f), multiply(1.0f / denominator, 1.0f));
  EXPECT_EQ(clip_coefficient_reference(3.0f, 0.7f), multiply(1.0f / denominator, 0.7f));
  EXPECT_EQ(clip_coefficient_reference(0.5f, 1.0f), 1.0f);  // no clipping below max_norm
  EXPECT_EQ(clip_coefficient_reference(0.0f, 1.0f), 1.0f);
  EXPECT_EQ(clip_coefficient_reference(std::numeric_limits<float>::infinity(), 1.0f), 0.0f);
  EXPECT_TRUE(std::isnan(clip_coefficient_reference(std::nanf(""), 1.0f)));
}

TEST(TensorListReference, UnscaleNormReadsWithoutWriting) {
  std::vector<float> a = {3.0f, -4.0f};
  std::vector<float> b = {12.0f};
  const std::vector<GradientTensor> tensors = {{a.data(), a.size(), GradientDtype::kFloat32},
                                               {b.data(), b.size(), GradientDtype::kFloat32}};
  const UnscaleNormResult result = unscale_norm_reference(tensors, 0.5f);
  EXPECT_FALSE(result.found_inf);
  EXPECT_EQ(result.sum_squares, 1.5 * 1.5 + 2.0 * 2.0 + 6.0 * 6.0);  // 42.25
  EXPECT_EQ(a[0], 3.0f);                                             // untouched
  EXPECT_EQ(b[0], 12.0f);

  b[0] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(unscale_norm_reference(tensors, 0.5f).found_inf);
  b[0] = std::nanf("");
  const UnscaleNormResult with_nan = unscale_norm_reference(tensors, 0.5f);
  EXPECT_TRUE(with_nan.found_inf);
  EXPECT_TRUE(std::isnan(with_nan.sum_squares));
}

TEST(TensorListReference, UnscaleNormSquaresTheValueRoundedToTheGradientDtype) {
  // bf16 1.0234375 (0x3f83) times 1/3 is not a bf16 value: the square is of the rounded product.
  std::uint16_t value = 0x3f83;
  const std::vector<GradientTensor> tensors = {{&value, 1, GradientDtype::kBFloat16}};
  const float inv = inverse_scale(3.0f);
  const float rounded = bfloat16_to_float(float_to_bfloat16_rn(multiply(1.0234375f, inv)));
  ASSERT_NE(rounded, multiply(1.0234375f, inv));
  EXPECT_EQ(unscale_norm_reference(tensors, inv).sum_squares,
            static_cast<double>(rounded) * rounded);
}

TEST(TensorListReference, ScaleTwiceRoundsAfterEachMultiply) {
  std::mt19937 random(3);
  std::uniform_real_distribution<float> uniform(-1e4f, 1e4f);
  std::vector<float> values(1000);
  for (float& v : values) v = uniform(random);
  std::vector<float> scaled = values;
  const float first = inverse_scale(1024.0f * 3.0f);
  const float second = 0.2718f;
  const std::vector<GradientTensor> tensors = {
      {scaled.data(), scaled.size(), GradientDtype::kFloat32}};
  scale_twice_reference(tensors, first, second);
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(scaled[i], multiply(multiply(values[i], first), second)) << i;
  }

  // bf16: rounded to bf16 after the unscale and again after the clip multiply, as the pair of
  // torch operations stores twice.
  std::uint16_t bf = 0x3f83;  // 1.0234375
  const std::vector<GradientTensor> bf_tensors = {{&bf, 1, GradientDtype::kBFloat16}};
  scale_twice_reference(bf_tensors, 1.0f / 3.0f, 0.51f);
  const float once = bfloat16_to_float(float_to_bfloat16_rn(multiply(1.0234375f, 1.0f / 3.0f)));
  EXPECT_EQ(bf, float_to_bfloat16_rn(multiply(once, 0.51f)));
}

TEST(TensorListReference, ScaleTwiceByOnesLeavesEveryBitAlone) {
  std::uint32_t payload_nan = 0x7fc01234u;
  float value;
  std::memcpy(&value, &payload_nan, 4);
  std::vector<float> values = {value, -0.0f, 1.5f};
  const std::vector<GradientTensor> tensors = {
      {values.data(), values.size(), GradientDtype::kFloat32}};
  scale_twice_reference(tensors, 1.0f, 1.0f);
  std::uint32_t bits;
  std::memcpy(&bits, &values[0], 4);
  EXPECT_EQ(bits, payload_nan);
  EXPECT_TRUE(std::signbit(values[1]));
}

TEST(TensorListOptionsTest, ValidateNamesTheBadField) {
  TensorListOptions options;
  EXPECT_TRUE(validate(options).ok());
  options.chunk_bytes = 1000;
  EXPECT_NE(validate(options).message().find("chunk_bytes"), std::string::npos);
  options = {};
  options.max_blocks = -1;
  EXPECT_NE(validate(options).message().find("max_blocks"), std::string::npos);
  options = {};
  options.max_table_slots = 0;
  EXPECT_NE(validate(options).message().find("max_table_slots"), std::string::npos);
}

#if !GPUOPT_CUDA
TEST(TensorListScalerTest, CreateAnswersUnimplementedWithoutCuda) {
  auto scaler = TensorListScaler::create(0);
  ASSERT_FALSE(scaler.ok());
  EXPECT_EQ(scaler.status().code(), StatusCode::kUnimplemented);
}
#endif

}  // namespace
}  // namespace gpuopt::kernels
