// TensorListScaler on the GPU against its CPU twin: bit-exact unscale and clip multiply on
// misaligned tensors of every dtype (guards poisoned), found_inf, the norm and clip factor, the
// table reused while the list stays and uploaded again when it changes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime.h>

#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::kernels {
namespace {

constexpr std::uint8_t kGuard = 0x5A;

// Tensors in one buffer at misaligned starts with guard bytes between them.
struct ListArena {
  std::vector<std::uint8_t> host;
  runtime::DeviceBuffer device;
  std::vector<std::size_t> offsets;
  std::vector<GradientTensor> layout;

  std::vector<GradientTensor> at(void* base) const {
    auto tensors = layout;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      tensors[t].data = static_cast<std::uint8_t*>(base) + offsets[t];
    }
    return tensors;
  }
  std::vector<std::uint8_t> download() const {
    std::vector<std::uint8_t> bytes(host.size());
    EXPECT_EQ(cudaMemcpy(bytes.data(), device.data(), bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return bytes;
  }
};

void store(std::uint8_t* p, GradientDtype dtype, float value) {
  if (dtype == GradientDtype::kFloat32) {
    std::memcpy(p, &value, 4);
  } else {
    const std::uint16_t bits =
        dtype == GradientDtype::kFloat16 ? float_to_half_rn(value) : float_to_bfloat16_rn(value);
    std::memcpy(p, &bits, 2);
  }
}

ListArena make_list_arena(const std::vector<std::size_t>& counts,
                          const std::vector<GradientDtype>& dtypes, std::mt19937_64& random) {
  ListArena arena;
  std::size_t cursor = 0;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::size_t element = dtype_size(dtypes[t]);
    cursor = (cursor + 32 + 15) / 16 * 16 + element * (random() % (16 / element));
    arena.offsets.push_back(cursor);
    arena.layout.push_back({nullptr, counts[t], dtypes[t]});
    cursor += counts[t] * element;
  }
  arena.host.assign(cursor + 32, kGuard);
  std::normal_distribution<float> normal(0.0f, 3000.0f);
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::size_t element = dtype_size(dtypes[t]);
    for (std::size_t i = 0; i < counts[t]; ++i) {
      store(&arena.host[arena.offsets[t] + i * element], dtypes[t], normal(random));
    }
  }
  auto device = runtime::DeviceBuffer::allocate(arena.host.size());
  EXPECT_TRUE(device.ok());
  arena.device = std::move(device).value();
  EXPECT_EQ(
      cudaMemcpy(arena.device.data(), arena.host.data(), arena.host.size(), cudaMemcpyHostToDevice),
      cudaSuccess);
  return arena;
}

// Device floats: [0] scale, [1] found_inf, [2] norm, [3] clip, [4] combined, [5] second factor.
struct Scalars {
  runtime::DeviceBuffer buffer;
  float* at(int i) const { return buffer.data_as<float>() + i; }
  void set(int i, float value) const {
    EXPECT_EQ(cudaMemcpy(at(i), &value, 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  float get(int i) const {
    float value = -1;
    EXPECT_EQ(cudaMemcpy(&value, at(i), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return value;
  }
};

Scalars make_scalars() {
  Scalars scalars;
  auto buffer = runtime::DeviceBuffer::allocate(8 * sizeof(float));
  EXPECT_TRUE(buffer.ok());
  scalars.buffer = std::move(buffer).value();
  return scalars;
}

const std::vector<std::size_t> kCounts = {1,     3,     8,     17,     1000,   4097,
                                          16411, 65539, 16384, 300001, 131072, (1 << 20) + 5};

std::vector<GradientDtype> dtypes_for(GradientDtype dtype) {
  return std::vector<GradientDtype>(kCounts.size(), dtype);
}

class TensorListGpu : public ::testing::TestWithParam<GradientDtype> {};

TEST_P(TensorListGpu, UnscaleMatchesTwinBitForBit) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  ListArena arena = make_list_arena(kCounts, dtypes_for(GetParam()), random);
  TensorListOptions options;
  options.chunk_bytes = 4096;  // many chunks per tensor: exercises the table search
  auto scaler = TensorListScaler::create(0, options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  Scalars scalars = make_scalars();
  scalars.set(0, 3000.0f);
  scalars.set(1, 0.0f);
  const auto device_tensors = arena.at(arena.device.data());
  ASSERT_TRUE((*scaler)->unscale(device_tensors, scalars.at(0), scalars.at(1), nullptr).ok());
  const auto host_tensors = arena.at(arena.host.data());
  EXPECT_FALSE(unscale_reference(host_tensors, inverse_scale(3000.0f)));
  EXPECT_EQ(scalars.get(1), 0.0f);
  EXPECT_EQ(arena.download(), arena.host);  // gradients bit-exact, guards untouched
}

TEST_P(TensorListGpu, NormAndClipMatchTwin) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  ListArena arena = make_list_arena(kCounts, dtypes_for(GetParam()), random);
  auto scaler = TensorListScaler::create(0);
  ASSERT_TRUE(scaler.ok());
  Scalars scalars = make_scalars();
  scalars.set(0, 1024.0f);
  scalars.set(1, 0.0f);
  const float max_norm = 1.5f;
  NormOutputs outputs{scalars.at(2), scalars.at(3), scalars.at(4)};
  const auto device_tensors = arena.at(arena.device.data());
  ASSERT_TRUE(
      (*scaler)
          ->unscale_norm(device_tensors, scalars.at(0), scalars.at(1), max_norm, outputs, nullptr)
          .ok());
  const auto host_tensors = arena.at(arena.host.data());
  const float inv = inverse_scale(1024.0f);
  const UnscaleNormResult expected = unscale_norm_reference(host_tensors, inv);
  const float norm = scalars.get(2);
  EXPECT_NEAR(norm, std::sqrt(expected.sum_squares), 2e-6 * std::sqrt(expected.sum_squares));
  EXPECT_EQ(scalars.get(1), 0.0f);
  const float clip = scalars.get(3);
  EXPECT_EQ(clip, clip_coefficient_reference(norm, max_norm));
  EXPECT_LT(clip, 1.0f);
  EXPECT_EQ(scalars.get(4), 1024.0f / clip);
  EXPECT_EQ(arena.download(), arena.host);  // the norm pass writes nothing

  ASSERT_TRUE((*scaler)->scale_twice(device_tensors, scalars.at(0), scalars.at(3), nullptr).ok());
  scale_twice_reference(host_tensors, inv, clip);
  EXPECT_EQ(arena.download(), arena.host);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TensorListGpu,
                         ::testing::Values(GradientDtype::kFloat16, GradientDtype::kBFloat16,
                                           GradientDtype::kFloat32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// More tensors than the kernels copy to shared memory: the table is searched in global memory.
TEST(TensorListScalerGpu, ListLongerThanTheSharedTableMatchesTwin) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  std::vector<std::size_t> counts;
  for (std::size_t i = 0; i < 300; ++i) counts.push_back((i * 37) % 2000 + 1);
  ListArena arena = make_list_arena(
      counts, std::vector<GradientDtype>(counts.size(), GradientDtype::kFloat32), random);
  TensorListOptions options;
  options.chunk_bytes = 1024;
  auto scaler = TensorListScaler::create(0, options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  Scalars scalars = make_scalars();
  scalars.set(0, 1024.0f);
  scalars.set(1, 0.0f);
  ASSERT_TRUE((*scaler)
                  ->unscale(arena.at(arena.device.data()), scalars.at(0), scalars.at(1), nullptr)
                  .ok());
  EXPECT_FALSE(unscale_reference(arena.at(arena.host.data()), inverse_scale(1024.0f)));
  EXPECT_EQ(arena.download(), arena.host);
}

TEST(TensorListScalerGpu, FoundInfAndNaNNormInEveryTensor) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(11);
  auto scaler = TensorListScaler::create(0);
  ASSERT_TRUE(scaler.ok());
  for (std::size_t bad = 0; bad < kCounts.size(); ++bad) {
    ListArena arena = make_list_arena(kCounts, dtypes_for(GradientDtype::kFloat32), random);
    const float nan = std::nanf("");
    const std::size_t at = arena.offsets[bad] + (kCounts[bad] - 1) * 4;
    ASSERT_EQ(cudaMemcpy(static_cast<std::uint8_t*>(arena.device.data()) + at, &nan, 4,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    Scalars scalars = make_scalars();
    scalars.set(0, 2.0f);
    scalars.set(1, 0.0f);
    const auto tensors = arena.at(arena.device.data());
    NormOutputs outputs{scalars.at(2), scalars.at(3), nullptr};
    ASSERT_TRUE((*scaler)
                    ->unscale_norm(tensors, scalars.at(0), scalars.at(1), 1.0f, outputs, nullptr)
                    .ok());
    EXPECT_EQ(scalars.get(1), 1.0f) << "tensor " << bad;
    EXPECT_TRUE(std::isnan(scalars.get(2)));
    scalars.set(1, 0.0f);
    ASSERT_TRUE((*scaler)->unscale(tensors, scalars.at(0), scalars.at(1), nullptr).ok());
    EXPECT_EQ(scalars.get(1), 1.0f) << "tensor " << bad;
  }
}

TEST(TensorListScalerGpu, TableIsReusedWhileTheListStays) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(12);
  ListArena arena = make_list_arena(kCounts, dtypes_for(GradientDtype::kFloat32), random);
  auto scaler = TensorListScaler::create(0);
  ASSERT_TRUE(scaler.ok());
  Scalars scalars = make_scalars();
  scalars.set(0, 1.0f);
  scalars.set(1, 0.0f);
  auto tensors = arena.at(arena.device.data());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*scaler)->unscale(tensors, scalars.at(0), scalars.at(1), nullptr).ok());
  }
  EXPECT_EQ((*scaler)->table_uploads(), 1u);
  tensors.pop_back();  // another list: a new upload
  ASSERT_TRUE((*scaler)->unscale(tensors, scalars.at(0), scalars.at(1), nullptr).ok());
  EXPECT_EQ((*scaler)->table_uploads(), 2u);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE((*scaler)->table_slots(), 2u);
}

TEST(TensorListScalerGpu, EmptyListGivesNormZero) {
  GPUOPT_REQUIRE_GPU();
  auto scaler = TensorListScaler::create(0);
  ASSERT_TRUE(scaler.ok());
  Scalars scalars = make_scalars();
  scalars.set(0, 8.0f);
  scalars.set(1, 0.0f);
  NormOutputs outputs{scalars.at(2), scalars.at(3), nullptr};
  ASSERT_TRUE(
      (*scaler)->unscale_norm({}, scalars.at(0), scalars.at(1), 1.0f, outputs, nullptr).ok());
  EXPECT_EQ(scalars.get(2), 0.0f);
  EXPECT_EQ(scalars.get(3), 1.0f);
  EXPECT_EQ(scalars.get(1), 0.0f);
}

TEST(TensorListScalerGpu, BadDeviceAndBadTensorsAreInvalidArgument) {
  GPUOPT_REQUIRE_GPU();
  EXPECT_EQ(TensorListScaler::create(1000).status().code(), StatusCode::kInvalidArgument);
  auto scaler = TensorListScaler::create(0);
  ASSERT_TRUE(scaler.ok());
  Scalars scalars = make_scalars();
  const std::vector<GradientTensor> null_data = {{nullptr, 4, GradientDtype::kFloat32}};
  const Status status = (*scaler)->unscale(null_data, scalars.at(0), scalars.at(1), nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("gradient tensor 0"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::kernels
#endif  // GPUOPT_CUDA
