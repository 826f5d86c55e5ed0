// The Hopper wgmma W4A16 kernel (W4A16ForcePath::kWgmma) on the GPU against the CPU twin: fp16 and
// bf16, every checkpoint format, group sizes 32/64/128/per-channel, M from 1 to 300, N not a
// multiple of 256, K not a multiple of 128, every variant (7, 8, 9) and forced
// k-splits, each run twice or more (the split-K workspace must be left zero). Skips on GPUs other
// than compute capability 9.0.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
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

#define GPUOPT_REQUIRE_SM90()                                                              \
  do {                                                                                     \
    GPUOPT_REQUIRE_GPU();                                                                  \
    int device_ = 0, major_ = 0, minor_ = 0;                                               \
    ASSERT_EQ(cudaGetDevice(&device_), cudaSuccess);                                       \
    ASSERT_EQ(cudaDeviceGetAttribute(&major_, cudaDevAttrComputeCapabilityMajor, device_), \
              cudaSuccess);                                                                \
    ASSERT_EQ(cudaDeviceGetAttribute(&minor_, cudaDevAttrComputeCapabilityMinor, device_), \
              cudaSuccess);                                                                \
    if (major_ != 9 || minor_ != 0)                                                        \
      GTEST_SKIP() << "wgmma kernel needs sm_90, not sm_" << major_ << minor_;             \
  } while (0)

// The wgmma path forced, with `tuning`.
W4A16Options wgmma_options(const W4A16Tuning& tuning = {}) {
  W4A16Options options;
  options.force_path = W4A16ForcePath::kWgmma;
  options.tuning = tuning;
  return options;
}

// The split-K cases: N % 256 != 0 (a partial column tile), M % tokens != 0 (a partial token
// tile), groups of 32 / 128 / per-channel, fp16 and bf16; describe_has as in check_case.
void check_split_cases(const W4A16Tuning& tuning, const char* describe_has = nullptr) {
  const W4A16Options options = wgmma_options(tuning);
  check_case({ActivationType::kFloat16, kFormats[2], 32, 100, 2112, 704, options}, 3, describe_has);
  check_case({ActivationType::kBFloat16, kFormats[1], 128, 64, 3072, 448, options}, 2,
             describe_has);
  check_case({ActivationType::kFloat16, kFormats[3], 64, 33, 1344, 320, options}, 2, describe_has);
}

std::vector<Case> format_cases() {
  std::vector<Case> cases;
  const int ms[] = {32, 33, 64, 100, 128, 256, 300};
  // (K, N): 576 and 832 are not multiples of 128; 320, 704 and 448 not multiples of 256.
  const int shapes[][2] = {{512, 256}, {576, 320}, {1024, 704}, {832, 448}, {2048, 512}};
  int i = 0;
  for (ActivationType type : {ActivationType::kFloat16, ActivationType::kBFloat16}) {
    for (const Format& format : kFormats) {
      for (int group : {32, 64, 128, -1}) {
        // The next shape whose K the group divides (576 and 832 are not multiples of 128).
        int s = i % 5;
        while (group > 0 && shapes[s][0] % group != 0) s = (s + 1) % 5;
        const auto& shape = shapes[s];
        cases.push_back({type, format, group, ms[i % 7], shape[0], shape[1], wgmma_options()});
        ++i;
      }
    }
  }
  return cases;
}

class W4A16WgmmaGpu : public ::testing::TestWithParam<Case> {};

TEST_P(W4A16WgmmaGpu, MatchesCpuTwin) {
  GPUOPT_REQUIRE_SM90();
  check_case(GetParam(), 2);
}

INSTANTIATE_TEST_SUITE_P(Formats, W4A16WgmmaGpu, ::testing::ValuesIn(format_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(W4A16WgmmaGpuVariants, EveryVariantAtEveryM) {
  GPUOPT_REQUIRE_SM90();
  for (int variant : {7, 8, 9}) {
    W4A16Tuning tuning;
    tuning.wgmma_variant = variant;
    for (int m : {1, 17, 33, 64, 100, 256}) {
      SCOPED_TRACE("variant " + std::to_string(variant));
      check_case({ActivationType::kFloat16, kFormats[1], 64, m, 1088, 448, wgmma_options(tuning)},
                 2);
      check_case({ActivationType::kBFloat16, kFormats[3], 128, m, 640, 320, wgmma_options(tuning)},
                 2);
    }
  }
}

TEST(W4A16WgmmaGpuSplits, ForcedSplitsLeaveTheWorkspaceClean) {
  GPUOPT_REQUIRE_SM90();
  for (int splits : {1, 3, 8, 32}) {
    W4A16Tuning tuning;
    tuning.wgmma_splits = splits;
    SCOPED_TRACE("splits " + std::to_string(splits));
    check_case({ActivationType::kFloat16, kFormats[2], 128, 64, 2048, 512, wgmma_options(tuning)},
               3);
    check_case({ActivationType::kBFloat16, kFormats[0], 32, 130, 2048, 320, wgmma_options(tuning)},
               3);
  }
}

// The fast-copy variants (7-9) with forced k-splits: their split-K partials go through shared
// memory and 16-byte atomics (N % 256 != 0 leaves a partial column tile, M % tokens != 0 a partial
// token tile), and their scale/zero copies skip the k16 tiles inside a group (group 32 = 2 tiles,
// so a stage holds two groups; splits that start mid-group). The atomic partial sums are forced
// (W4A16Tuning::wgmma_shared_fixup = false): k-splits in one wave take the shared fix-up by
// default.
TEST(W4A16WgmmaGpuSplits, FastCopyForcedSplits) {
  GPUOPT_REQUIRE_SM90();
  W4A16Tuning tuning;
  tuning.wgmma_shared_fixup = false;
  for (int variant : {7, 8, 9}) {
    tuning.wgmma_variant = variant;
    for (int splits : {1, 2, 3, 7}) {
      tuning.wgmma_splits = splits;
      SCOPED_TRACE("variant " + std::to_string(variant) + " splits " + std::to_string(splits));
      check_split_cases(tuning);
    }
  }
}

// Stream-K (one wave, each block a run of (tile, k-stage) units): a tile's k-range is cut at
// arbitrary stages, blocks cross tile and token-tile boundaries, and the last of a tile's segments
// (by the stage count) fixes it up; short layers give one-stage segments. A block's last segment
// that finds every other piece of its tile already counted adds its own partial during the fix-up
// instead; timing decides whether that happens, and this test cannot tell which path ran. The
// 4096 x 3584 layer at M=64 (14 tiles of 64 stages, ~3.4 stages a block, ~19 blocks a tile) is
// there to make it likely: every tile's last-counted piece can take it.
TEST(W4A16WgmmaGpuSplits, StreamKMatchesTwin) {
  GPUOPT_REQUIRE_SM90();
  W4A16Tuning tuning;
  tuning.wgmma_stream_k = true;
  for (int variant : {7, 8, 9}) {
    tuning.wgmma_variant = variant;
    SCOPED_TRACE("variant " + std::to_string(variant));
    const W4A16Options options = wgmma_options(tuning);
    check_case({ActivationType::kFloat16, kFormats[2], 32, 100, 2112, 704, options}, 3);
    check_case({ActivationType::kBFloat16, kFormats[1], 128, 64, 3072, 448, options}, 2);
    check_case({ActivationType::kFloat16, kFormats[0], 128, 300, 1024, 4096, options}, 2);
    check_case({ActivationType::kFloat16, kFormats[3], 64, 33, 1344, 320, options}, 2);
  }
  tuning.wgmma_variant.reset();
  check_case({ActivationType::kFloat16, kFormats[0], 128, 64, 4096, 3584, wgmma_options(tuning)},
             4);
}

// Stream-K on forced grids: 3 blocks (each runs several whole tiles between its partial ones) and
// grids of several waves, where a later block's first piece is often the last of its tile to be
// counted and converts it (timing decides which piece does; every result is checked).
TEST(W4A16WgmmaGpuSplits, StreamKForcedGridsMatchTwin) {
  GPUOPT_REQUIRE_SM90();
  W4A16Tuning tuning;
  tuning.wgmma_stream_k = true;
  for (int variant : {7, 8}) {
    tuning.wgmma_variant = variant;
    for (int blocks : {3, 700, 2000}) {
      tuning.wgmma_stream_k_blocks = blocks;
      SCOPED_TRACE("variant " + std::to_string(variant) + " blocks " + std::to_string(blocks));
      check_split_cases(tuning, "stream-K");
    }
  }
}

// The shared fix-up of k-splits (each split stores its partial into its own workspace slice, waits
// for the tile's other splits and converts a share), the default where the splits fit one wave;
// describe() names it, so these cases know it ran. Each case runs several times (the counters must
// be left zero), with partial column and token tiles and splits that do not divide the stages.
TEST(W4A16WgmmaGpuSplits, SharedFixUpMatchesTwin) {
  GPUOPT_REQUIRE_SM90();
  W4A16Tuning tuning;
  for (int variant : {7, 8, 9}) {
    tuning.wgmma_variant = variant;
    for (int splits : {2, 3, 8, 16}) {
      tuning.wgmma_splits = splits;
      SCOPED_TRACE("variant " + std::to_string(variant) + " splits " + std::to_string(splits));
      check_split_cases(tuning, "shared-fixup");
    }
  }
}

// The default plan's one-wave k-splits (choose_wgmma_splits): planned for 8 SMs (16 slots), a
// 2048 x 1024 layer has 4 column tiles of 32 stages, so 4 splits of 8 stages fill the wave and run
// with the shared fix-up instead of stream-K; 32- and 64-token tiles, a partial column tile.
TEST(W4A16WgmmaGpuSplits, OneWaveSplitsByDefault) {
  GPUOPT_REQUIRE_SM90();
  W4A16Options options;
  options.sm_count = 8;
  for (int m : {20, 40, 64}) {
    SCOPED_TRACE("M " + std::to_string(m));
    check_case({ActivationType::kFloat16, kFormats[1], 128, m, 2048, 1024, options}, 3,
               "4 k-splits shared-fixup4");
    check_case({ActivationType::kBFloat16, kFormats[2], 64, m, 2048, 960, options}, 2,
               "4 k-splits shared-fixup4");
  }
}

// 128-token tiles whose k-splits would spill over one wave and leave over a tenth of it idle take
// stream-K up to M = 256: planned for 8 SMs (8 slots at one block per SM), 9 column tiles of 12
// stages choose 2 splits (18 blocks over three waves, 75 %), so the default plan runs stream-K; M =
// 100 leaves a partial token tile, N = 2240 a partial column tile.
TEST(W4A16WgmmaGpuSplits, StreamKWhere128TokenSplitsSpill) {
  GPUOPT_REQUIRE_SM90();
  W4A16Options options;
  options.sm_count = 8;
  check_case({ActivationType::kFloat16, kFormats[1], 128, 100, 768, 2304, options}, 3,
             "(1/SM) stream-K");
  check_case({ActivationType::kBFloat16, kFormats[0], 64, 128, 768, 2240, options}, 2,
             "(1/SM) stream-K");
}

TEST(W4A16WgmmaGpuLarge, LargerLayer) {
  GPUOPT_REQUIRE_SM90();
  check_case({ActivationType::kFloat16, kFormats[1], 128, 256, 4096, 1280, wgmma_options()}, 2);
  check_case({ActivationType::kBFloat16, kFormats[3], 128, 64, 4096, 2048, wgmma_options()}, 2);
}

}  // namespace
}  // namespace gpuopt::kernels
#endif  // GPUOPT_CUDA
