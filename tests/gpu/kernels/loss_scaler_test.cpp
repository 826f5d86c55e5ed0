// GPU loss scaler against its CPU twin: bit-exact unscale, found_inf, the scale/tracker sequence,
// the skip-on-overflow step, and zero host synchronisations in 100 steps (CUPTI callbacks).
#include "gpuopt/kernels/loss_scaler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_support.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime.h>
#include <cupti.h>

#include "gpuopt/core/dynamic_library.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::kernels {
namespace {

constexpr std::uint8_t kPoison = 0xA5;
constexpr std::size_t kGuardBytes = 48;

// Many tensors in one arena, each at a random element misalignment with poisoned guard bytes
// between them, so a write outside a tensor shows in the byte comparison.
struct Arena {
  std::vector<std::uint8_t> host;  // the CPU twin works on this copy
  runtime::DeviceBuffer device_memory;
  void* device = nullptr;              // device_memory.data()
  std::vector<std::size_t> offsets;    // bytes from the arena start
  std::vector<GradientTensor> layout;  // counts and dtypes; data unset

  std::vector<GradientTensor> tensors_at(void* base) const {
    std::vector<GradientTensor> result = layout;
    for (std::size_t t = 0; t < result.size(); ++t) {
      result[t].data = static_cast<std::uint8_t*>(base) + offsets[t];
    }
    return result;
  }
  std::vector<GradientTensor> device_tensors() const { return tensors_at(device); }
  std::vector<GradientTensor> host_tensors() { return tensors_at(host.data()); }
};

// Random finite values over a wide exponent range, so products hit subnormals, ties and overflow.
void fill_random_finite(std::uint8_t* data, const GradientTensor& tensor, std::mt19937_64& random) {
  for (std::size_t i = 0; i < tensor.count; ++i) {
    const std::uint64_t bits = random();
    switch (tensor.dtype) {
      case GradientDtype::kFloat16: {
        std::uint16_t h = static_cast<std::uint16_t>(bits);
        if ((h & 0x7c00u) == 0x7c00u) h &= 0xbfffu;  // inf/NaN exponent → finite
        std::memcpy(data + 2 * i, &h, 2);
        break;
      }
      case GradientDtype::kBFloat16: {
        std::uint16_t b = static_cast<std::uint16_t>(bits);
        if ((b & 0x7f80u) == 0x7f80u) b &= 0xbfffu;
        std::memcpy(data + 2 * i, &b, 2);
        break;
      }
      case GradientDtype::kFloat32: {
        std::uint32_t f = static_cast<std::uint32_t>(bits);
        if ((f & 0x7f800000u) == 0x7f800000u) f &= 0xbfffffffu;
        std::memcpy(data + 4 * i, &f, 4);
        break;
      }
    }
  }
}

Arena make_arena(const std::vector<std::size_t>& counts, const std::vector<GradientDtype>& dtypes,
                 std::mt19937_64& random) {
  Arena arena;
  std::size_t cursor = 0;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::size_t element = dtype_size(dtypes[t]);
    cursor += kGuardBytes;
    cursor = (cursor + 15) / 16 * 16 + element * (random() % (16 / element));  // misaligned start
    arena.offsets.push_back(cursor);
    arena.layout.push_back({nullptr, counts[t], dtypes[t]});
    cursor += counts[t] * element;
  }
  cursor += kGuardBytes;
  arena.host.assign(cursor, kPoison);
  auto tensors = arena.host_tensors();
  for (const GradientTensor& tensor : tensors) {
    fill_random_finite(static_cast<std::uint8_t*>(tensor.data), tensor, random);
  }
  auto device = runtime::DeviceBuffer::allocate(cursor);
  EXPECT_TRUE(device.ok()) << device.status().to_string();
  if (device.ok()) arena.device_memory = std::move(device).value();
  arena.device = arena.device_memory.data();
  EXPECT_EQ(cudaMemcpy(arena.device, arena.host.data(), cursor, cudaMemcpyHostToDevice),
            cudaSuccess);
  return arena;
}

bool is_nan_element(const std::uint8_t* p, GradientDtype dtype) {
  if (dtype == GradientDtype::kFloat32) {
    std::uint32_t f;
    std::memcpy(&f, p, 4);
    return (f & 0x7fffffffu) > 0x7f800000u;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == GradientDtype::kFloat16 ? (h & 0x7fffu) > 0x7c00u : (h & 0x7fffu) > 0x7f80u;
}

// Byte-exact outside tensors (guards) and bit-exact inside, except that NaN equals any NaN.
void expect_arena_equal(const Arena& arena, const std::vector<std::uint8_t>& gpu) {
  ASSERT_EQ(gpu.size(), arena.host.size());
  std::vector<bool> inside(gpu.size(), false);
  std::size_t mismatches = 0;
  for (std::size_t t = 0; t < arena.layout.size(); ++t) {
    const std::size_t element = dtype_size(arena.layout[t].dtype);
    for (std::size_t i = 0; i < arena.layout[t].count; ++i) {
      const std::size_t at = arena.offsets[t] + i * element;
      std::fill(inside.begin() + at, inside.begin() + at + element, true);
      const bool both_nan = is_nan_element(&gpu[at], arena.layout[t].dtype) &&
                            is_nan_element(&arena.host[at], arena.layout[t].dtype);
      if (!both_nan && std::memcmp(&gpu[at], &arena.host[at], element) != 0 && ++mismatches < 5) {
        ADD_FAILURE() << "tensor " << t << " (" << dtype_name(arena.layout[t].dtype) << ", "
                      << arena.layout[t].count << " elements) differs at element " << i;
      }
    }
  }
  for (std::size_t at = 0; at < gpu.size(); ++at) {
    if (!inside[at] && gpu[at] != kPoison && ++mismatches < 5) {
      ADD_FAILURE() << "guard byte at arena offset " << at << " was written";
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

std::vector<std::uint8_t> download(const Arena& arena) {
  std::vector<std::uint8_t> gpu(arena.host.size());
  EXPECT_EQ(cudaMemcpy(gpu.data(), arena.device, gpu.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return gpu;
}

float read_found_inf(const LossScaler& scaler) {
  float found = -1;
  EXPECT_EQ(cudaMemcpy(&found, scaler.device_found_inf(), sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return found;
}

const std::vector<std::size_t> kOddCounts = {
    1,    2,    3,     7,     8,    9,     15,     17,     31,      127,
    1000, 4097, 16411, 65539, 8191, 16384, 300001, 131072, 1 << 20, (1 << 20) + 5};

class UnscaleBitExact : public ::testing::TestWithParam<GradientDtype> {};

TEST_P(UnscaleBitExact, MatchesCpuTwinOnFreshRandomData) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  for (float scale : {65536.0f, 3.0f, 1000.5f, 1.0f, 0x1p-10f, 0.7f, 0x1p24f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::vector<GradientDtype> dtypes(kOddCounts.size(), GetParam());
    Arena arena = make_arena(kOddCounts, dtypes, random);
    LossScalerOptions options;
    options.init_scale = scale;
    auto device_tensors = arena.device_tensors();
    auto scaler = LossScaler::create(device_tensors, options);
    ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE((*scaler)->unscale(stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);

    auto host_tensors = arena.host_tensors();
    const bool cpu_found = unscale_reference(host_tensors, inverse_scale(scale));
    EXPECT_FALSE(cpu_found);
    EXPECT_EQ(read_found_inf(**scaler), 0.0f);
    expect_arena_equal(arena, download(arena));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnscaleBitExact,
                         ::testing::Values(GradientDtype::kFloat16, GradientDtype::kBFloat16,
                                           GradientDtype::kFloat32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LossScalerGpu, MixedDtypesInOneLaunch) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  std::vector<GradientDtype> dtypes;
  for (std::size_t t = 0; t < kOddCounts.size(); ++t) {
    dtypes.push_back(static_cast<GradientDtype>(random() % 3));
  }
  Arena arena = make_arena(kOddCounts, dtypes, random);
  LossScalerOptions options;
  options.init_scale = 12345.0f;
  auto scaler = LossScaler::create(arena.device_tensors(), options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  ASSERT_TRUE((*scaler)->unscale(cudaStreamPerThread).ok());
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  auto host_tensors = arena.host_tensors();
  EXPECT_FALSE(unscale_reference(host_tensors, inverse_scale(12345.0f)));
  expect_arena_equal(arena, download(arena));
}

void poke(Arena& arena, std::size_t t, std::size_t i, std::uint32_t bits) {
  const GradientDtype dtype = arena.layout[t].dtype;
  const std::size_t element = dtype_size(dtype);
  const std::size_t at = arena.offsets[t] + i * element;
  if (element == 4) {
    std::memcpy(&arena.host[at], &bits, 4);
  } else {
    const auto h = static_cast<std::uint16_t>(bits);
    std::memcpy(&arena.host[at], &h, 2);
  }
  ASSERT_EQ(cudaMemcpy(static_cast<std::uint8_t*>(arena.device) + at, &arena.host[at], element,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
}

TEST(LossScalerGpu, FoundInfForInfAndNanAtRandomPositions) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  for (int trial = 0; trial < 24; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const auto dtype = static_cast<GradientDtype>(trial % 3);
    std::vector<GradientDtype> dtypes(kOddCounts.size(), dtype);
    Arena arena = make_arena(kOddCounts, dtypes, random);
    const int kind = trial / 3 % 4;  // +inf, -inf, quiet NaN, NaN with a payload
    const std::size_t t = random() % kOddCounts.size();
    // First, last, or anywhere: heads and tails are separate code paths.
    const std::size_t choice = random() % 3;
    const std::size_t i = choice == 0   ? 0
                          : choice == 1 ? kOddCounts[t] - 1
                                        : random() % kOddCounts[t];
    const auto payload = static_cast<std::uint32_t>(random());
    std::uint32_t bits = 0;
    switch (dtype) {
      case GradientDtype::kFloat16:
        bits = std::array<std::uint32_t, 4>{0x7c00, 0xfc00, 0x7e00, 0x7c01 + payload % 0x1fe}[kind];
        break;
      case GradientDtype::kBFloat16:
        bits = std::array<std::uint32_t, 4>{0x7f80, 0xff80, 0x7fc0, 0xff81 + payload % 0x3e}[kind];
        break;
      case GradientDtype::kFloat32:
        bits = std::array<std::uint32_t, 4>{0x7f800000u, 0xff800000u, 0x7fc00000u,
                                            0x7f800001u + payload % 0x3fffff}[kind];
        break;
    }
    poke(arena, t, i, bits);
    LossScalerOptions options;
    options.init_scale = 256.0f;
    auto scaler = LossScaler::create(arena.device_tensors(), options);
    ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
    ASSERT_TRUE((*scaler)->unscale(cudaStreamPerThread).ok());
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    EXPECT_EQ(read_found_inf(**scaler), 1.0f) << "bad value in tensor " << t << " element " << i;
    auto host_tensors = arena.host_tensors();
    EXPECT_TRUE(unscale_reference(host_tensors, inverse_scale(256.0f)));
    expect_arena_equal(arena, download(arena));

    // The next unscale of the (now finite-again) data clears found_inf.
    poke(arena, t, i, 0);
    ASSERT_TRUE((*scaler)->unscale(cudaStreamPerThread).ok());
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    EXPECT_EQ(read_found_inf(**scaler), 0.0f);
  }
}

struct SequenceCase {
  int hysteresis;
  int growth_interval;
  int history_capacity;
};

class ScaleSequence : public ::testing::TestWithParam<SequenceCase> {};

TEST_P(ScaleSequence, MatchesCpuTwinStepByStep) {
  GPUOPT_REQUIRE_GPU();
  const SequenceCase c = GetParam();
  std::mt19937_64 random(std::random_device{}());
  const std::vector<std::size_t> counts = {5, 1000, 33};
  const std::vector<GradientDtype> dtypes = {GradientDtype::kFloat16, GradientDtype::kBFloat16,
                                             GradientDtype::kFloat32};
  Arena arena = make_arena(counts, dtypes, random);
  LossScalerOptions options;
  options.hysteresis = c.hysteresis;
  options.growth_interval = c.growth_interval;
  options.history_capacity = c.history_capacity;
  auto scaler = LossScaler::create(arena.device_tensors(), options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  ScalerState cpu = initial_state(options);
  std::vector<StepRecord> expected;
  constexpr int kSteps = 300;
  for (int step = 0; step < kSteps; ++step) {
    // Fresh finite gradients, then an inf or NaN in about one step in four, in runs.
    auto host_tensors = arena.host_tensors();
    for (const auto& tensor : host_tensors) {
      fill_random_finite(static_cast<std::uint8_t*>(tensor.data), tensor, random);
    }
    const std::uint64_t roll = random() % 8;
    if (roll < 2) {
      const std::size_t t = random() % counts.size();
      const std::size_t at = arena.offsets[t] + (random() % counts[t]) * dtype_size(dtypes[t]);
      const std::uint32_t bad32 = roll == 0 ? 0x7f800000u : 0x7fc00000u;
      const std::uint16_t bad16 = dtypes[t] == GradientDtype::kFloat16
                                      ? (roll == 0 ? 0x7c00 : 0x7e00)
                                      : (roll == 0 ? 0x7f80 : 0x7fc0);
      if (dtypes[t] == GradientDtype::kFloat32) {
        std::memcpy(&arena.host[at], &bad32, 4);
      } else {
        std::memcpy(&arena.host[at], &bad16, 2);
      }
    }
    ASSERT_EQ(
        cudaMemcpy(arena.device, arena.host.data(), arena.host.size(), cudaMemcpyHostToDevice),
        cudaSuccess);
    const bool found = unscale_reference(host_tensors, inverse_scale(cpu.scale));
    expected.push_back(update_reference(cpu, found, options));
    ASSERT_TRUE((*scaler)->unscale(stream).ok());
    ASSERT_TRUE((*scaler)->update(stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_arena_equal(arena, download(arena));
  }
  auto statistics = (*scaler)->fetch_statistics(stream);
  ASSERT_TRUE(statistics.ok()) << statistics.status().to_string();
  cudaStreamDestroy(stream);
  EXPECT_EQ(statistics->steps, static_cast<std::uint64_t>(kSteps));
  EXPECT_EQ(statistics->overflows, static_cast<std::uint64_t>(std::count_if(
                                       expected.begin(), expected.end(),
                                       [](const StepRecord& r) { return r.found_inf != 0; })));
  EXPECT_EQ(statistics->state.scale, cpu.scale);
  EXPECT_EQ(statistics->state.growth_tracker, cpu.growth_tracker);
  EXPECT_EQ(statistics->state.hysteresis_tracker, cpu.hysteresis_tracker);
  const std::size_t kept = std::min<std::size_t>(kSteps, c.history_capacity);
  ASSERT_EQ(statistics->history.size(), kept);
  for (std::size_t k = 0; k < kept; ++k) {
    const StepRecord& want = expected[kSteps - kept + k];
    const StepRecord& got = statistics->history[k];
    EXPECT_EQ(got, want) << "step " << kSteps - kept + k + 1 << ": gpu scale " << got.scale
                         << " tracker " << got.growth_tracker << " found " << got.found_inf
                         << ", cpu scale " << want.scale << " tracker " << want.growth_tracker
                         << " found " << want.found_inf;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ScaleSequence,
                         ::testing::Values(SequenceCase{1, 3, 1024}, SequenceCase{2, 4, 1024},
                                           SequenceCase{3, 2, 64}, SequenceCase{1, 2000, 1024}));

TEST(LossScalerGpu, SgdStepSkipsOnOverflowAndMatchesTwinOtherwise) {
  GPUOPT_REQUIRE_GPU();
  std::mt19937_64 random(std::random_device{}());
  const std::vector<std::size_t> counts = {3, 4097, 100003};
  const std::vector<GradientDtype> dtypes = {GradientDtype::kFloat32, GradientDtype::kFloat16,
                                             GradientDtype::kBFloat16};
  Arena arena = make_arena(counts, dtypes, random);
  // Keep the gradients modest so the step is a real update, not inf.
  for (std::size_t t = 0; t < counts.size(); ++t) {
    for (std::size_t i = 0; i < counts[t]; ++i) {
      const float value = std::ldexp(static_cast<float>(random() % 2001) - 1000.0f, 4);
      const std::size_t at = arena.offsets[t] + i * dtype_size(dtypes[t]);
      if (dtypes[t] == GradientDtype::kFloat32) {
        std::memcpy(&arena.host[at], &value, 4);
      } else {
        const std::uint16_t bits = dtypes[t] == GradientDtype::kFloat16
                                       ? float_to_half_rn(value)
                                       : float_to_bfloat16_rn(value);
        std::memcpy(&arena.host[at], &bits, 2);
      }
    }
  }
  std::vector<std::vector<float>> params(counts.size());
  std::vector<float*> device_params(counts.size());
  std::vector<runtime::DeviceBuffer> owned_params(counts.size());
  for (std::size_t t = 0; t < counts.size(); ++t) {
    params[t].resize(counts[t]);
    for (float& p : params[t]) p = static_cast<float>(random() % 100000) / 977.0f - 50.0f;
    auto buffer = runtime::DeviceBuffer::allocate(counts[t] * sizeof(float));
    ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
    owned_params[t] = std::move(buffer).value();
    device_params[t] = owned_params[t].data_as<float>();
  }
  LossScalerOptions options;
  options.init_scale = 1024.0f;
  auto scaler = LossScaler::create(arena.device_tensors(), options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  EXPECT_EQ((*scaler)->sgd_step_if_finite(0.1f, cudaStreamPerThread).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*scaler)->bind_parameters(device_params).ok());

  for (bool overflow : {false, true}) {
    SCOPED_TRACE(overflow ? "overflow" : "finite");
    if (overflow) poke(arena, 1, 17, 0x7c00);
    ASSERT_EQ(
        cudaMemcpy(arena.device, arena.host.data(), arena.host.size(), cudaMemcpyHostToDevice),
        cudaSuccess);
    for (std::size_t t = 0; t < counts.size(); ++t) {
      ASSERT_EQ(cudaMemcpy(device_params[t], params[t].data(), counts[t] * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_TRUE((*scaler)->unscale(cudaStreamPerThread).ok());
    ASSERT_TRUE((*scaler)->sgd_step_if_finite(0.1f, cudaStreamPerThread).ok());
    ASSERT_TRUE((*scaler)->update(cudaStreamPerThread).ok());
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);

    auto host_tensors = arena.host_tensors();
    const bool found = unscale_reference(host_tensors, inverse_scale(1024.0f));
    EXPECT_EQ(found, overflow);
    std::vector<float*> host_params;
    auto expected = params;
    for (auto& p : expected) host_params.push_back(p.data());
    sgd_step_if_finite_reference(host_params, host_tensors, 0.1f, found);
    for (std::size_t t = 0; t < counts.size(); ++t) {
      std::vector<float> got(counts[t]);
      ASSERT_EQ(cudaMemcpy(got.data(), device_params[t], counts[t] * sizeof(float),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(std::memcmp(got.data(), expected[t].data(), counts[t] * sizeof(float)), 0)
          << "parameter tensor " << t;
      if (overflow) {
        EXPECT_EQ(std::memcmp(got.data(), params[t].data(), counts[t] * sizeof(float)), 0);
      } else {
        EXPECT_NE(std::memcmp(got.data(), params[t].data(), counts[t] * sizeof(float)), 0);
      }
    }
  }
}

TEST(LossScalerGpu, RejectsHostAndMisalignedBuffers) {
  GPUOPT_REQUIRE_GPU();
  std::vector<std::uint16_t> host(16);
  GradientTensor on_host{host.data(), host.size(), GradientDtype::kFloat16};
  auto a = LossScaler::create({&on_host, 1});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("gradient tensor 0"), std::string::npos);
  auto device = runtime::DeviceBuffer::allocate(64);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  GradientTensor misaligned{device->data_as<char>() + 2, 4, GradientDtype::kFloat32};
  auto b = LossScaler::create({&misaligned, 1});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

// ---- host synchronisations, counted with CUPTI's callback API ----

const float kInfinityBits = std::numeric_limits<float>::infinity();

struct CuptiApi {
  DynamicLibrary library;
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiEnableDomain) enable_domain = nullptr;
  decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
};

struct SyncCounter {
  std::int64_t synchronizing = 0;
  std::map<std::string, int> calls;  // every API entered, for the failure message
  std::map<std::string, int> synchronizing_calls;
};

// Runtime/driver calls that make the host wait for the device (CUDA's API synchronisation rules):
// explicit syncs, queries, the blocking memcpy/memset family, and frees.
bool is_synchronizing(const std::string& name) {
  static const char* const kPrefixes[] = {"cudaDeviceSynchronize",
                                          "cudaThreadSynchronize",
                                          "cudaStreamSynchronize",
                                          "cudaEventSynchronize",
                                          "cudaStreamQuery",
                                          "cudaEventQuery",
                                          "cudaFree",
                                          "cudaMallocHost",
                                          "cudaHostAlloc",
                                          "cuCtxSynchronize",
                                          "cuStreamSynchronize",
                                          "cuEventSynchronize",
                                          "cuStreamQuery",
                                          "cuEventQuery",
                                          "cuMemFree"};
  for (const char* prefix : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  const bool copy_or_set = name.rfind("cudaMemcpy", 0) == 0 || name.rfind("cudaMemset", 0) == 0 ||
                           name.rfind("cuMemcpy", 0) == 0 || name.rfind("cuMemsetD", 0) == 0;
  return copy_or_set && name.find("Async") == std::string::npos;
}

void CUPTIAPI on_api_call(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId,
                          const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || info->functionName == nullptr) return;
  auto* counter = static_cast<SyncCounter*>(userdata);
  const std::string name = info->functionName;
  ++counter->calls[name];
  if (is_synchronizing(name)) {
    ++counter->synchronizing;
    ++counter->synchronizing_calls[name];
  }
}

TEST(LossScalerGpu, HundredStepsMakeNoHostSynchronisation) {
  GPUOPT_REQUIRE_GPU();
  auto library = DynamicLibrary::open({"libcupti.so.13", "libcupti.so.12", "libcupti.so",
                                       "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                                       "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                                       "/usr/local/cuda/lib64/libcupti.so.13",
                                       "/usr/local/cuda/lib/libcupti.so.13",
                                       "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so"});
  ASSERT_TRUE(library.ok()) << "CUPTI is needed to count synchronisations: "
                            << library.status().to_string();
  CuptiApi cupti{std::move(*library)};
  cupti.subscribe = cupti.library.function<decltype(&cuptiSubscribe)>({"cuptiSubscribe"});
  cupti.enable_domain = cupti.library.function<decltype(&cuptiEnableDomain)>({"cuptiEnableDomain"});
  cupti.unsubscribe = cupti.library.function<decltype(&cuptiUnsubscribe)>({"cuptiUnsubscribe"});
  ASSERT_TRUE(cupti.subscribe && cupti.enable_domain && cupti.unsubscribe);
  {
    // CUPTI allows one subscriber: under compute-sanitizer (or another profiler) there is no
    // second one to count with.
    CUpti_SubscriberHandle probe = nullptr;
    CUptiResult probed = cupti.subscribe(&probe, on_api_call, nullptr);
    if (probed == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      GTEST_SKIP() << "another CUPTI subscriber is attached (a profiler or compute-sanitizer)";
    }
    ASSERT_EQ(probed, CUPTI_SUCCESS);
    ASSERT_EQ(cupti.unsubscribe(probe), CUPTI_SUCCESS);
  }

  std::mt19937_64 random(std::random_device{}());
  std::vector<std::size_t> counts = {1 << 20, 12345, 777, (1 << 18) + 3};
  std::vector<GradientDtype> dtypes = {GradientDtype::kFloat16, GradientDtype::kBFloat16,
                                       GradientDtype::kFloat32, GradientDtype::kFloat16};
  Arena arena = make_arena(counts, dtypes, random);
  std::vector<float*> params(counts.size());
  std::vector<runtime::DeviceBuffer> owned_params(counts.size());
  for (std::size_t t = 0; t < counts.size(); ++t) {
    auto buffer = runtime::DeviceBuffer::allocate(counts[t] * sizeof(float));
    ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
    owned_params[t] = std::move(buffer).value();
    params[t] = owned_params[t].data_as<float>();
  }
  LossScalerOptions options;
  options.hysteresis = 3;
  auto scaler = LossScaler::create(arena.device_tensors(), options);
  ASSERT_TRUE(scaler.ok()) << scaler.status().to_string();
  ASSERT_TRUE((*scaler)->bind_parameters(params).ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  SyncCounter counter;
  CUpti_SubscriberHandle subscriber = nullptr;
  ASSERT_EQ(cupti.subscribe(&subscriber, on_api_call, &counter), CUPTI_SUCCESS);
  ASSERT_EQ(cupti.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
  ASSERT_EQ(cupti.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
  bool all_ok = true;
  auto run_steps = [&](int steps) {
    for (int step = 0; step < steps; ++step) {
      all_ok &= (*scaler)->unscale(stream).ok();
      all_ok &= (*scaler)->sgd_step_if_finite(0.01f, stream).ok();
      all_ok &= (*scaler)->update(stream).ok();
    }
  };
  // 50 finite steps (the optimizer step runs), then 50 with an inf (it is skipped); the inf is
  // written between the two windows and its copy is not counted.
  run_steps(50);
  const SyncCounter first = counter;
  const cudaError_t poked = cudaMemcpyAsync(
      static_cast<std::uint8_t*>(arena.device) + arena.offsets[2] + 5 * sizeof(float),
      &kInfinityBits, sizeof(float), cudaMemcpyHostToDevice, stream);
  const cudaError_t synced_between = cudaStreamSynchronize(stream);
  const SyncCounter second_start = counter;
  run_steps(50);
  const SyncCounter second = counter;
  // Positive control: the counter must see a synchronisation when there is one.
  const cudaError_t synced = cudaStreamSynchronize(stream);
  const std::int64_t control = counter.synchronizing - second.synchronizing;
  ASSERT_EQ(cupti.unsubscribe(subscriber), CUPTI_SUCCESS);
  ASSERT_TRUE(all_ok);
  ASSERT_EQ(poked, cudaSuccess);
  ASSERT_EQ(synced_between, cudaSuccess);
  ASSERT_EQ(synced, cudaSuccess);

  std::map<std::string, int> calls = first.calls;
  std::map<std::string, int> bad_calls = first.synchronizing_calls;
  for (const auto& [name, n] : second.calls) {
    const int before = second_start.calls.count(name) > 0 ? second_start.calls.at(name) : 0;
    if (n > before) calls[name] += n - before;
  }
  for (const auto& [name, n] : second.synchronizing_calls) {
    const int before = second_start.synchronizing_calls.count(name) > 0
                           ? second_start.synchronizing_calls.at(name)
                           : 0;
    if (n > before) bad_calls[name] += n - before;
  }
  const std::int64_t synchronizing =
      first.synchronizing + (second.synchronizing - second_start.synchronizing);
  std::string seen;
  for (const auto& [name, n] : calls) seen += name + " x" + std::to_string(n) + "; ";
  std::string bad;
  for (const auto& [name, n] : bad_calls) bad += name + " x" + std::to_string(n) + "; ";
  EXPECT_GE(control, 1) << "the CUPTI counter missed cudaStreamSynchronize";
  EXPECT_GT(first.calls.size(), 0u) << "CUPTI reported no API call at all";
  EXPECT_EQ(synchronizing, 0) << "synchronising calls: " << bad << " all calls: " << seen;
  std::printf("100 scaler steps made these API calls: %s\n", seen.c_str());

  auto statistics = (*scaler)->fetch_statistics(stream);
  ASSERT_TRUE(statistics.ok()) << statistics.status().to_string();
  EXPECT_EQ(statistics->steps, 100u);
  EXPECT_EQ(statistics->overflows, 50u);
  // 50 finite steps leave 2^16 with the tracker at 50; then hysteresis 3 tolerates two overflows
  // and backs off on the other 48: 2^16 * 2^-48 = 2^-32.
  EXPECT_EQ(statistics->state.scale, 0x1p-32f);
  EXPECT_EQ(statistics->state.growth_tracker, 0);
  ASSERT_EQ(statistics->history.size(), 100u);
  EXPECT_EQ(statistics->history[49].growth_tracker, 50);
  EXPECT_EQ(statistics->history[49].found_inf, 0);
  EXPECT_EQ(statistics->history[50].found_inf, 1);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace gpuopt::kernels

#else
TEST(LossScalerGpu, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif  // GPUOPT_CUDA
