// W4A16 GEMM on the GPU against its CPU twin: every format, group size, odd M, many shapes, both
// activation types, stream-K grids that split tiles, and the dequantise + cuBLAS path.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_check.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

namespace gpuopt::kernels {
namespace {

using namespace w4a16_test;  // NOLINT: Format, Case, check_case

// The int4 kernels chosen by M, with the cuBLAS takeover (W4A16Options::kAutoFallback) off so
// that every M here tests them; the takeover has its own test below.
W4A16Options kernel_options() {
  W4A16Options options;
  options.fallback_min_m = 0;
  return options;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const int ms[] = {1, 3, 16, 17, 31, 33, 64, 77, 130};
  const int shapes[][2] = {{256, 256}, {512, 192}, {1024, 512}, {768, 320}, {2048, 1024}};
  int i = 0;
  for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
    for (const Format& format : kFormats) {
      for (int group : {32, 64, 128, -1}) {
        const auto& shape = shapes[i % 5];
        cases.push_back({type, format, group, ms[i % 9], shape[0], shape[1], kernel_options()});
        ++i;
      }
    }
  }
  return cases;
}

class W4A16GemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(W4A16GemmGpu, MatchesCpuTwin) {
  GPUOPT_REQUIRE_GPU();
  check_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Formats, W4A16GemmGpu, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(W4A16GemmGpuStreamK, SplitTilesAcrossBlocksAndRunsTwice) {
  GPUOPT_REQUIRE_GPU();
  const Format& format = kFormats[1];
  // Grids that cut tiles at odd places: every segment/fix-up combination, run twice each.
  for (int blocks : {1, 3, 7, 29, 200}) {
    for (int m : {1, 20, 64}) {
      W4A16Options options = kernel_options();
      options.force_blocks = blocks;
      check_case({ActivationType::kFloat16, format, 128, m, 1024, 768, options}, 2);
    }
  }
  check_case({ActivationType::kBFloat16, kFormats[3], 64, 5, 4096, 1024, kernel_options()}, 3);
}

// Each tensor-core kernel outside the M range it is chosen for: the swapped (weights-as-A)
// kernel with 32-row blocks and several m-blocks, the x-rows kernel at small M.
TEST(W4A16GemmGpuKernels, BothKernelFamiliesAtAnyM) {
  GPUOPT_REQUIRE_GPU();
  for (W4A16ForcePath path : {W4A16ForcePath::kXRows, W4A16ForcePath::kSwapped}) {
    for (int m : {1, 9, 29, 70}) {
      W4A16Options options;
      options.force_path = path;
      check_case({ActivationType::kFloat16, kFormats[1], 32, m, 1024, 512, options}, 2);
      check_case({ActivationType::kBFloat16, kFormats[2], 64, m, 512, 320, options});
    }
  }
}

// The direct kernel (weights streamed into registers, M <= 16): every format and group size, 8-
// and 16-row variants, odd M, N not a multiple of 256 (idle warps in the last strip group), K not a
// multiple of 128, one k-split and many; each run twice (the split workspace must be left clean).
TEST(W4A16GemmGpuKernels, DirectKernelMatchesTwin) {
  GPUOPT_REQUIRE_GPU();
  W4A16Options options;
  options.force_path = W4A16ForcePath::kDirect;
  const int shapes[][2] = {{1024, 512}, {512, 320}, {4096, 256}, {192, 64}, {2048, 1344}};
  int i = 0;
  for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
    for (const Format& format : kFormats) {
      for (int group : {32, 64, 128, -1}) {
        for (int m : {1, 5, 8, 9, 16}) {
          const auto& shape = shapes[i++ % 5];
          if (group > 0 && shape[0] % group != 0) continue;
          check_case({type, format, group, m, shape[0], shape[1], options}, 2);
        }
      }
    }
  }
}

// The direct kernel with x resident in shared memory (the default for M <= 16), whole and cut into
// k-slices: the planner's choice; 3 slices of 5, 5 and 6 units on K = 1024, whose boundaries cut
// 128-groups and leave most warps without units; 2 slices with 1 block each, so warps take many
// units and cross strips (K = 4096, N = 2048); one block of one slice, whose warps store whole
// strips directly (K = 1024, N = 2048); the first two again with the 16-row form's stages of 8
// k16 tiles forced (W4A16Tuning::direct_tiles8; by default only on layers of K * N >= 2^27,
// where K and the groups allow); and resident x off at M <= 2 (direct_resident_x). Group sizes that
// are and are not whole stages, per-channel, zero-points, 8- and 16-row forms, each run twice (the
// workspace must be left clean).
TEST(W4A16GemmGpuKernels, DirectKernelResidentXMatchesTwin) {
  GPUOPT_REQUIRE_GPU();
  W4A16Options options;
  options.force_path = W4A16ForcePath::kDirect;
  struct Setting {
    bool resident;
    int slices;        // 0: the planner's choice
    int slice_blocks;  // 0: the planner's choice
    int k, n;          // 0: the shapes below
    bool tiles8;       // forced on (else the default)
  };
  const Setting settings[] = {{true, 0, 0, 0, 0, false},       {true, 3, 0, 1024, 512, false},
                              {true, 2, 1, 4096, 2048, false}, {true, 1, 1, 1024, 2048, false},
                              {true, 0, 0, 0, 0, true},        {true, 3, 0, 1024, 512, true},
                              {false, 0, 0, 0, 0, false}};
  const int shapes[][2] = {{1024, 512}, {192, 64}, {4096, 256}, {2048, 1344}};
  for (const Setting& setting : settings) {
    options.tuning.direct_resident_x = setting.resident;
    options.tuning.direct_slices = setting.slices;
    options.tuning.direct_slice_blocks = setting.slice_blocks;
    options.tuning.direct_tiles8 = setting.tiles8 ? std::optional<bool>(true) : std::nullopt;
    SCOPED_TRACE("resident " + std::to_string(setting.resident) + " slices " +
                 std::to_string(setting.slices) + " slice blocks " +
                 std::to_string(setting.slice_blocks) + " tiles8 " +
                 std::to_string(setting.tiles8));
    const bool resident = setting.resident;
    const std::string slices = setting.slices > 0 ? std::to_string(setting.slices) + "-slice" : "";
    int i = 0;
    for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
      for (const Format& format : {kFormats[1], kFormats[2], kFormats[3]}) {
        for (int group : {32, 128, -1}) {
          for (int m : {1, 2, 5, 9, 16}) {
            if (!resident && m > 2) continue;
            const int k = setting.k > 0 ? setting.k : shapes[i % 4][0];
            const int n = setting.n > 0 ? setting.n : shapes[i % 4][1];
            ++i;
            if (group > 0 && k % group != 0) continue;
            // Forced 8-tile stages apply at 16 rows, K a multiple of 128 and groups of 8 tiles
            // (128 or per-channel): the plan must name them ("<slices>-slice 3x8tiles").
            const bool tiles8 = setting.tiles8 && m > 8 && k % (8 * 16) == 0 && group != 32;
            const std::string expect =
                tiles8 ? (slices.empty() ? std::string("-slice") : slices) + " 3x8tiles"
                       : (resident ? "resident-x " + slices : "");
            check_case({type, format, group, m, k, n, options}, 2,
                       resident ? expect.c_str() : nullptr);
          }
        }
      }
    }
  }
}

// A few cases of the direct kernel small enough for compute-sanitizer's racecheck (the tests above
// take minutes under it): resident x cut into 3 slices with zero-points and ring scales (8 rows),
// 2 slices of one block each whose warps cross strips (16 rows), one block storing whole strips,
// and the x ring with per-tile groups (resident x off), each run twice; 16-row stages of 8 k16
// tiles forced where they apply (the 2-slice case).
TEST(W4A16GemmGpuSanitize, DirectKernelSmoke) {
  GPUOPT_REQUIRE_GPU();
  W4A16Options options;
  options.force_path = W4A16ForcePath::kDirect;
  struct Smoke {
    bool resident;
    int slices;
    int slice_blocks;
    const Format& format;
    int group, m, k, n;
    const char* describe;
  };
  const Smoke cases[] = {
      {true, 3, 0, kFormats[1], 128, 5, 1024, 512, "resident-x 3-slice"},
      {true, 2, 1, kFormats[0], 128, 16, 2048, 1024, "resident-x 2-slice"},
      {true, 1, 1, kFormats[0], 64, 3, 1024, 2048, "resident-x 1-slice"},
      {false, 0, 0, kFormats[2], 32, 12, 1024, 512, "rows16 4x4tiles"},
  };
  options.tuning.direct_tiles8 = true;
  for (const Smoke& c : cases) {
    options.tuning.direct_resident_x = c.resident;
    options.tuning.direct_slices = c.slices;
    options.tuning.direct_slice_blocks = c.slice_blocks;
    check_case({ActivationType::kFloat16, c.format, c.group, c.m, c.k, c.n, options}, 2,
               c.describe);
  }
}

TEST(W4A16GemmGpuFallback, DequantiseAndCublasMatchesTwin) {
  GPUOPT_REQUIRE_GPU();
  W4A16Options options;
  options.force_path = W4A16ForcePath::kDequantCublas;
  for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
    check_case({type, kFormats[2], 128, 70, 1024, 512, options});
    check_case({type, kFormats[3], 32, 3, 512, 256, options});
  }
}

// Random symmetric group-128 fp16 weights of K x N, uploaded on `stream`.
StatusOr<W4A16DeviceWeights> random_device_weights(int k, int n, std::uint64_t seed,
                                                   cudaStream_t stream) {
  const UnpackedLayer layer = random_unpacked_layer(k, n, 128, false, false, seed);
  GPUOPT_ASSIGN_OR_RETURN(const W4A16Weights host,
                          repack_for_kernel(layer, ActivationType::kFloat16));
  return W4A16DeviceWeights::upload(host, stream);
}

// On a partition (W4A16Options::sm_count) the opt-in takeover comes earlier, by the partition's
// share of the SMs (the table in auto_fallback_min_m), and the plan follows it: below the M the
// int4 kernel, from it the cuBLAS path.
TEST(W4A16GemmGpuFallback, PartitionsTakeOverEarlier) {
  GPUOPT_REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int k = 1024, n = 512;
  Device device;
  ASSERT_EQ(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), cudaSuccess);
  auto weights = random_device_weights(k, n, 7, device.stream);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  const StatusOr<int> whole = W4A16Gemm::auto_fallback_min_m(*weights, 0);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  const auto share = [&](double f) { return static_cast<int>(std::ceil(f * sms)); };
  const std::pair<int, int> expected[] = {{0, *whole},
                                          {sms, *whole},
                                          {share(0.95), *whole},
                                          {share(0.8), std::min(*whole, 65)},
                                          {share(0.6), std::min(*whole, 65)},
                                          {share(0.3), std::min(*whole, 17)},
                                          {std::max(1, sms / 10), std::min(*whole, 9)}};
  for (const auto& [count, from] : expected) {
    const StatusOr<int> got = W4A16Gemm::auto_fallback_min_m(*weights, 0, count);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, from) << count << " of " << sms << " SMs";
  }
  const int count = std::max(1, sms / 10);
  const int from = std::min(*whole, 9);
  void* dx = device.allocate(static_cast<std::size_t>(from) * k * 2);
  void* dy = device.allocate(static_cast<std::size_t>(from) * n * 2);
  for (const int m : {from - 1, from}) {
    W4A16Options options;
    options.sm_count = count;
    options.fallback_min_m = W4A16Options::kAutoFallback;
    W4A16Gemm gemm(options);
    W4A16Gemm::Arguments arguments{m, dx, dy, &*weights};
    auto bytes = gemm.workspace_size(arguments);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    ASSERT_TRUE(gemm.initialize(arguments, device.allocate(*bytes), device.stream).ok());
    EXPECT_EQ(gemm.config().path, m >= from ? W4A16Path::kDequantCublas : W4A16Path::kTensorCore)
        << "M=" << m << " " << gemm.config().describe();
  }
}

// The opt-in takeover (kAutoFallback): the int4 kernels below auto_fallback_min_m(), cuBLAS on the
// dense copy from it on (workspace_size() counts the N x K x 2 bytes), both against the twin;
// deterministic mode never takes it; the default options (0) never do: no dense copy at any M.
TEST(W4A16GemmGpuFallback, AutoTakeoverFromTheMeasuredM) {
  GPUOPT_REQUIRE_GPU();
  for (const auto& shape : {std::pair{1024, 512}, std::pair{4096, 8192}, std::pair{8192, 4096},
                            std::pair{8192, 16384}}) {
    const int k = shape.first, n = shape.second;
    Device device;
    ASSERT_EQ(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), cudaSuccess);
    auto weights = random_device_weights(k, n, 42, device.stream);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    const StatusOr<int> from = W4A16Gemm::auto_fallback_min_m(*weights, 0);
    ASSERT_TRUE(from.ok()) << from.status().to_string();
    // 1024 x 512 hands over at 65, 2^25 <= K x N < 2^27 at 65 (K < N) or 129 (K >= N), K x N >=
    // 2^27 at 129; 17 where the wgmma kernel cannot run (told apart by forcing it: a forced wgmma
    // path fails to plan there).
    W4A16Options wgmma_only;
    wgmma_only.force_path = W4A16ForcePath::kWgmma;
    W4A16Gemm probe(wgmma_only);
    void* probe_io = device.allocate(static_cast<std::size_t>(32) * (k + n) * 2);
    const bool has_wgmma = probe.workspace_size({32, probe_io, probe_io, &*weights}).ok();
    EXPECT_EQ(*from, !has_wgmma                                             ? 17
                     : k * n >= (1 << 27) || (k * n >= (1 << 25) && k >= n) ? 129
                                                                            : 65)
        << k << "x" << n;
    void* dx = device.allocate(static_cast<std::size_t>(*from) * k * 2);
    void* dy = device.allocate(static_cast<std::size_t>(*from) * n * 2);
    const std::size_t dense = static_cast<std::size_t>(n) * k * 2;
    for (const int m : {*from - 1, *from}) {
      // kAutoFallback, 0, and the defaults left untouched (nullopt).
      for (const std::optional<int> setting : {std::optional<int>(W4A16Options::kAutoFallback),
                                               std::optional<int>(0), std::optional<int>()}) {
        W4A16Options options;
        if (setting) options.fallback_min_m = *setting;
        W4A16Gemm gemm(options);
        W4A16Gemm::Arguments arguments{m, dx, dy, &*weights};
        auto bytes = gemm.workspace_size(arguments);
        ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
        const bool takeover = setting == W4A16Options::kAutoFallback && m >= *from;
        EXPECT_EQ(*bytes >= dense, takeover) << "M=" << m << " workspace " << *bytes;
        ASSERT_TRUE(gemm.initialize(arguments, device.allocate(*bytes), device.stream).ok());
        EXPECT_EQ(gemm.config().path, takeover ? W4A16Path::kDequantCublas : W4A16Path::kTensorCore)
            << "M=" << m << " " << gemm.config().describe();
      }
    }
    W4A16Options deterministic;
    deterministic.deterministic = true;
    W4A16Gemm gemm(deterministic);
    W4A16Gemm::Arguments arguments{*from, dx, dy, &*weights};
    auto bytes = gemm.workspace_size(arguments);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(gemm.initialize(arguments, device.allocate(*bytes), device.stream).ok());
    EXPECT_EQ(gemm.config().path, W4A16Path::kTensorCore);
  }
  // Numerics of the default options on both sides of the takeover.
  for (const int m : {16, 17, 32, 33, 64, 65, 100}) {
    check_case({ActivationType::kFloat16, kFormats[1], 128, m, 1024, 512, {}});
    check_case({ActivationType::kBFloat16, kFormats[2], 64, m, 512, 320, {}});
  }
}

// deterministic: two runs bitwise equal, and row r of an M=64 product equals row r of the M=1 and
// M=16 products of its first rows (same k-split and reduction order whatever M), and the twin.
TEST(W4A16GemmGpuDeterministic, BitwiseRepeatableAndIndependentOfM) {
  GPUOPT_REQUIRE_GPU();
  for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
    for (const auto& shape : {std::pair{4096, 512}, std::pair{1024, 4096}, std::pair{512, 192}}) {
      const int k = shape.first, n = shape.second;
      std::random_device seed_source;
      const std::uint64_t seed = (static_cast<std::uint64_t>(seed_source()) << 32) | seed_source();
      SCOPED_TRACE(std::string(activation_type_name(type)) + " k" + std::to_string(k) + " n" +
                   std::to_string(n) + " seed " + std::to_string(seed));
      const UnpackedLayer layer = random_unpacked_layer(k, n, 128, true, false, seed);
      auto weights = repack_for_kernel(layer, type);
      ASSERT_TRUE(weights.ok()) << weights.status().to_string();
      constexpr int kMaxM = 64;
      std::mt19937 random(static_cast<unsigned>(seed));
      std::vector<std::uint16_t> x(static_cast<std::size_t>(kMaxM) * k);
      for (auto& v : x) {
        const float value = std::uniform_real_distribution<float>(-1, 1)(random);
        v = type == ActivationType::kFloat16 ? float_to_fp16_bits(value)
                                             : float_to_bf16_bits(value);
      }
      const std::vector<float> expected = w4a16_reference(*weights, x.data(), kMaxM);
      Device device;
      ASSERT_EQ(cudaStreamCreateWithFlags(&device.stream, cudaStreamNonBlocking), cudaSuccess);
      auto device_weights = W4A16DeviceWeights::upload(*weights, device.stream);
      ASSERT_TRUE(device_weights.ok()) << device_weights.status().to_string();
      void* dx = device.allocate(x.size() * 2);
      ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<std::uint16_t> reference_rows;  // from M = kMaxM, first run
      for (int m : {kMaxM, 1, 16, 33}) {
        W4A16Options options;
        options.deterministic = true;
        options.fallback_min_m = 1;  // must be ignored
        W4A16Gemm gemm(options);
        const std::size_t y_bytes = static_cast<std::size_t>(m) * n * 2;
        void* dy = device.allocate(y_bytes);
        W4A16Gemm::Arguments arguments{m, dx, dy, &*device_weights};
        auto workspace_bytes = gemm.workspace_size(arguments);
        ASSERT_TRUE(workspace_bytes.ok()) << workspace_bytes.status().to_string();
        void* workspace = device.allocate(*workspace_bytes);
        ASSERT_TRUE(gemm.initialize(arguments, workspace, device.stream).ok());
        EXPECT_EQ(gemm.config().path, W4A16Path::kTensorCore);
        EXPECT_GT(gemm.config().splits, 0) << gemm.config().describe();
        std::vector<std::uint16_t> first;
        for (int run = 0; run < 2; ++run) {
          ASSERT_EQ(cudaMemsetAsync(dy, 0xff, y_bytes, device.stream), cudaSuccess);
          ASSERT_TRUE(gemm.run(device.stream).ok());
          std::vector<std::uint16_t> y(static_cast<std::size_t>(m) * n);
          ASSERT_EQ(cudaMemcpyAsync(y.data(), dy, y_bytes, cudaMemcpyDeviceToHost, device.stream),
                    cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(device.stream), cudaSuccess);
          if (run == 0) {
            first = y;
          } else {
            EXPECT_TRUE(y == first)
                << "M=" << m << ": two runs differ, " << gemm.config().describe();
          }
        }
        if (m == kMaxM) {
          reference_rows = first;
          double diff = 0, norm = 0;
          for (std::size_t i = 0; i < first.size(); ++i) {
            const float actual = type == ActivationType::kFloat16 ? fp16_bits_to_float(first[i])
                                                                  : bf16_bits_to_float(first[i]);
            diff += (actual - expected[i]) * static_cast<double>(actual - expected[i]);
            norm += static_cast<double>(expected[i]) * expected[i];
          }
          EXPECT_LT(std::sqrt(diff / norm), type == ActivationType::kFloat16 ? 1e-3 : 5e-3);
        } else {
          std::size_t differing = 0;
          for (std::size_t i = 0; i < first.size(); ++i) differing += first[i] != reference_rows[i];
          EXPECT_EQ(differing, 0u)
              << "rows of M=" << m << " differ from the same rows at M=" << kMaxM << ", "
              << gemm.config().describe();
        }
      }
    }
  }
}

TEST(W4A16GemmGpuRefusal, NamesTheReason) {
  W4A16DeviceWeights fake;
  fake.k = 4096;
  fake.n = 1000;
  fake.group_size = 128;
  fake.tiles = fake.scales = reinterpret_cast<const void*>(256);
  W4A16Gemm::Arguments arguments{4, reinterpret_cast<const void*>(256),
                                 reinterpret_cast<void*>(512), &fake};
  const Status status = W4A16Gemm::can_implement(arguments);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("N=1000 is not a multiple of 64"));
  arguments.m = 0;
  EXPECT_THAT(W4A16Gemm::can_implement(arguments).message(), ::testing::HasSubstr("M=0"));
  fake.tiles = fake.scales = nullptr;  // do not free the fake pointers
}

}  // namespace
}  // namespace gpuopt::kernels
#endif  // GPUOPT_CUDA
