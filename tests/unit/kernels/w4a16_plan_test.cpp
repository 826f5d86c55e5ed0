// The direct and wgmma kernels' plans travel through the public W4A16Config between initialize()
// and run() (w4a16_paths.hpp): every field run_direct()/run_wgmma() reads comes back as planned.
// A field dropped on the way (the partial-sum layout flag once was) runs another configuration
// than the one described, with correct results, so no numeric test notices it.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/w4a16_paths.hpp"

namespace gpuopt::kernels::w4a16_detail {
namespace {

TEST(W4A16PlanTest, StoredPlanComesBackFieldByField) {
  KernelPlan plan;
  plan.variant = 13;
  plan.blocks = 264;
  plan.threads = 512;
  plan.blocks_per_sm = 2;
  plan.splits = 3;
  plan.tiles = 448;
  plan.flags = 5;
  plan.shared_bytes = 215040;
  plan.workspace_bytes = 123;  // initialize() only: it sizes the workspace, run() does not read it
  plan.describe = "direct w.x rows16 resident-x 3-slice";

  W4A16Config config;
  store_plan(plan, config);
  const KernelPlan back = stored_plan(config);
  EXPECT_EQ(back.variant, 13);
  EXPECT_EQ(back.blocks, 264);
  EXPECT_EQ(back.threads, 512);
  EXPECT_EQ(back.blocks_per_sm, 2);
  EXPECT_EQ(back.splits, 3);
  EXPECT_EQ(back.tiles, 448);
  EXPECT_EQ(back.flags, 5);
  EXPECT_EQ(back.shared_bytes, 215040u);
  EXPECT_EQ(back.describe, "direct w.x rows16 resident-x 3-slice");
  EXPECT_EQ(config.note, plan.describe);  // describe() prints it
}

TEST(W4A16PlanTest, StoringAPlanLeavesTheOtherKernelsFieldsAlone) {
  W4A16Config config;
  config.m_tiles = 4;
  config.swapped = true;
  config.pipeline = W4A16Pipeline::kBulkK128;
  store_plan(KernelPlan{}, config);
  EXPECT_EQ(config.m_tiles, 4);
  EXPECT_TRUE(config.swapped);
  EXPECT_EQ(config.pipeline, W4A16Pipeline::kBulkK128);
  EXPECT_EQ(config.kernel_flags, 0);
}

// The takeover on a partition (W4A16Options::sm_count), at the edges of each share of the H200's
// 132 SMs: the whole GPU's M from 90 %, then at most 65 from half, 17 from a fifth, 9 below; never
// later than the whole GPU's.
TEST(W4A16PlanTest, PartitionTakeoverFallsWithTheShareOfSms) {
  EXPECT_EQ(partition_takeover_m(129, 0, 132), 129);
  EXPECT_EQ(partition_takeover_m(129, -4, 132), 129);
  EXPECT_EQ(partition_takeover_m(129, 132, 132), 129);
  EXPECT_EQ(partition_takeover_m(129, 119, 132), 129);  // 0.902
  EXPECT_EQ(partition_takeover_m(129, 118, 132), 65);   // 0.894
  EXPECT_EQ(partition_takeover_m(129, 66, 132), 65);    // 0.5
  EXPECT_EQ(partition_takeover_m(129, 65, 132), 17);    // 0.492
  EXPECT_EQ(partition_takeover_m(129, 27, 132), 17);    // 0.205
  EXPECT_EQ(partition_takeover_m(129, 26, 132), 9);     // 0.197
  EXPECT_EQ(partition_takeover_m(129, 8, 132), 9);
  EXPECT_EQ(partition_takeover_m(40, 104, 132), 40);  // the whole GPU's is already earlier
  EXPECT_EQ(partition_takeover_m(33, 72, 132), 33);
  EXPECT_EQ(partition_takeover_m(17, 40, 132), 17);  // no wgmma kernel
  EXPECT_EQ(partition_takeover_m(17, 16, 132), 9);
  EXPECT_EQ(partition_takeover_m(33, 20, 24), 33);  // another GPU: the share decides, 0.83
}

// The kernels tried at the M edges: the direct kernel up to 16 rows, wgmma above; on layers of
// K x N <= 2^24 wgmma first from 8 rows; nothing extra in deterministic mode or with a forced path.
TEST(W4A16PlanTest, KernelCandidatesAtTheMEdges) {
  using P = W4A16ForcePath;
  const W4A16Options defaults;
  using List = std::vector<P>;
  EXPECT_EQ(kernel_candidates(8192, 28672, 1, defaults), List{P::kDirect});
  EXPECT_EQ(kernel_candidates(8192, 28672, 16, defaults), List{P::kDirect});
  EXPECT_EQ(kernel_candidates(8192, 28672, 17, defaults), List{P::kWgmma});
  EXPECT_EQ(kernel_candidates(8192, 28672, 256, defaults), List{P::kWgmma});
  EXPECT_EQ(kernel_candidates(4096, 4096, 7, defaults), List{P::kDirect});  // 2^24: small
  EXPECT_EQ(kernel_candidates(4096, 4096, 8, defaults), (List{P::kWgmma, P::kDirect}));
  EXPECT_EQ(kernel_candidates(4096, 4096, 16, defaults), (List{P::kWgmma, P::kDirect}));
  EXPECT_EQ(kernel_candidates(4096, 4096, 17, defaults), List{P::kWgmma});
  EXPECT_EQ(kernel_candidates(4096, 4160, 8, defaults), List{P::kDirect});  // just over 2^24
  W4A16Options deterministic;
  deterministic.deterministic = true;
  EXPECT_TRUE(kernel_candidates(8192, 28672, 1, deterministic).empty());
  W4A16Options forced;
  forced.force_path = P::kXRows;
  EXPECT_TRUE(kernel_candidates(8192, 28672, 64, forced).empty());
}

// The whole GPU's takeover by layer size at the 2^25 and 2^27 edges, and without the wgmma kernel.
TEST(W4A16PlanTest, WholeGpuTakeoverBySize) {
  EXPECT_EQ(whole_gpu_takeover_m(8192, 28672, true), 129);
  EXPECT_EQ(whole_gpu_takeover_m(28672, 8192, true), 129);
  EXPECT_EQ(whole_gpu_takeover_m(8192, 16384, true), 129);  // 2^27
  EXPECT_EQ(whole_gpu_takeover_m(8192, 16320, true), 65);   // just under, K < N
  EXPECT_EQ(whole_gpu_takeover_m(4096, 14336, true), 65);
  EXPECT_EQ(whole_gpu_takeover_m(14336, 4096, true), 129);  // K >= N
  EXPECT_EQ(whole_gpu_takeover_m(8192, 8192, true), 129);
  EXPECT_EQ(whole_gpu_takeover_m(4096, 8192, true), 65);   // 2^25, K < N
  EXPECT_EQ(whole_gpu_takeover_m(8192, 4096, true), 129);  // 2^25, K >= N
  EXPECT_EQ(whole_gpu_takeover_m(8192, 4032, true), 65);   // just under, K >= N
  EXPECT_EQ(whole_gpu_takeover_m(4096, 4096, true), 65);
  EXPECT_EQ(whole_gpu_takeover_m(8192, 28672, false), 17);
  EXPECT_EQ(whole_gpu_takeover_m(4096, 4096, false), 17);
}

// The fallback decision at the takeover M; a forced path wins over everything, deterministic mode
// over the takeover.
TEST(W4A16PlanTest, FallbackAtTheTakeoverM) {
  const W4A16Options defaults;
  EXPECT_FALSE(takes_fallback(128, 129, defaults));
  EXPECT_TRUE(takes_fallback(129, 129, defaults));
  EXPECT_FALSE(takes_fallback(4096, 0, defaults));  // 0 = never
  W4A16Options deterministic;
  deterministic.deterministic = true;
  EXPECT_FALSE(takes_fallback(256, 17, deterministic));
  W4A16Options cublas;
  cublas.force_path = W4A16ForcePath::kDequantCublas;
  EXPECT_TRUE(takes_fallback(1, 129, cublas));
  cublas.deterministic = true;
  EXPECT_TRUE(takes_fallback(1, 0, cublas));
  W4A16Options direct;
  direct.force_path = W4A16ForcePath::kDirect;
  EXPECT_FALSE(takes_fallback(256, 17, direct));
}

// The original kernels: swapped up to 16 rows (8 rows a tile), x rows above (16 rows a tile).
TEST(W4A16PlanTest, OriginalKernelShapeByM) {
  const W4A16Options defaults;
  EXPECT_TRUE(swapped_for(16, defaults));
  EXPECT_FALSE(swapped_for(17, defaults));
  W4A16Options options;
  options.force_path = W4A16ForcePath::kSwapped;
  EXPECT_TRUE(swapped_for(100, options));
  options.force_path = W4A16ForcePath::kXRows;
  EXPECT_FALSE(swapped_for(1, options));
  options.force_path = W4A16ForcePath::kSwapped;
  options.deterministic = true;  // deterministic always runs the x-rows kernel
  EXPECT_FALSE(swapped_for(1, options));
  EXPECT_EQ(initial_m_tiles(8, true), 1);
  EXPECT_EQ(initial_m_tiles(9, true), 2);
  EXPECT_EQ(initial_m_tiles(16, true), 2);
  EXPECT_EQ(initial_m_tiles(17, true), 4);
  EXPECT_EQ(initial_m_tiles(16, false), 1);
  EXPECT_EQ(initial_m_tiles(17, false), 2);
  EXPECT_EQ(initial_m_tiles(32, false), 2);
  EXPECT_EQ(initial_m_tiles(33, false), 4);
}

// Stream-K: one wave, at least 4 stages a block; a forced grid at most one block per stage.
// Deterministic: about two blocks per SM per m-block, splits of at least 4 stages.
TEST(W4A16PlanTest, StreamKGridAndDeterministicSplits) {
  EXPECT_EQ(stream_k_blocks(2, 132, 10000, 0), 264);
  EXPECT_EQ(stream_k_blocks(2, 132, 100, 0), 25);
  EXPECT_EQ(stream_k_blocks(2, 132, 3, 0), 1);
  EXPECT_EQ(stream_k_blocks(2, 132, 10000, 7), 7);
  EXPECT_EQ(stream_k_blocks(2, 132, 100, 1000), 100);
  // 28672 / 256 = 112 column tiles, 128 stages of 64: (264 + 56) / 112 = 2.
  EXPECT_EQ(deterministic_splits(132, 112, 128), 2);
  // 4096 / 256 = 16 tiles: (264 + 8) / 16 = 17, at most 64 / 4 = 16 splits.
  EXPECT_EQ(deterministic_splits(132, 16, 64), 16);
  EXPECT_EQ(deterministic_splits(132, 16, 4), 1);
  EXPECT_EQ(deterministic_splits(8, 112, 128), 1);  // a small partition
}

// The wgmma k-splits, worked by hand for the H200 (132 SMs) on the Llama-3-70B shapes.
TEST(W4A16PlanTest, WgmmaSplitsByWaveFill) {
  // 8192 x 28672, M = 64 (64 tokens, 2 blocks per SM): 112 tiles, 128 stages, at most 128 / 32 = 4
  // splits; 1: 42 % of the wave, 2: 85 %, 3: 64 % over two waves, 4: 85 % (a tie goes to more).
  WgmmaSplits chosen = choose_wgmma_splits(112, 128, 264, 132, 64, 64);
  EXPECT_EQ(chosen.splits, 4);
  EXPECT_NEAR(chosen.fill, 448.0 / 528.0, 1e-12);
  EXPECT_TRUE(wgmma_stream_k_fits(64, chosen, 112, 128, 264, 64));  // 85 % < 90 %
  // M = 128 (128 tokens, 1 block per SM): every split count fills 85 %; none raises it by 20 %.
  chosen = choose_wgmma_splits(112, 128, 132, 132, 128, 128);
  EXPECT_EQ(chosen.splits, 1);
  EXPECT_FALSE(wgmma_stream_k_fits(128, chosen, 112, 128, 132, 128));  // 128-token tiles, one split
  // 3584 x 18944, M = 128 (1 block per SM): 74 tiles, 56 stages; 3 splits fill 84 % of two waves,
  // so their partial sums would be atomics: stream-K instead (74 x 56 / 132 = 31 stages a block).
  chosen = choose_wgmma_splits(74, 56, 132, 132, 128, 128);
  EXPECT_EQ(chosen.splits, 3);
  EXPECT_TRUE(wgmma_stream_k_fits(128, chosen, 74, 56, 132, 128));
  // ... but not where those splits fit one wave (4096 x 14336: 56 tiles, 2 splits = 112 blocks).
  chosen = choose_wgmma_splits(56, 64, 132, 132, 128, 128);
  EXPECT_EQ(chosen.splits, 2);
  EXPECT_FALSE(wgmma_stream_k_fits(128, chosen, 56, 64, 132, 128));
  // 3584 x 18944 at M = 256: 148 tiles, 1 split over two waves (56 %): stream-K; above M = 256
  // (not measured) the k-splits stay.
  chosen = choose_wgmma_splits(148, 56, 132, 132, 128, 256);
  EXPECT_EQ(chosen.splits, 1);
  EXPECT_TRUE(wgmma_stream_k_fits(128, chosen, 148, 56, 132, 256));
  chosen = choose_wgmma_splits(222, 56, 132, 132, 128, 257);
  EXPECT_FALSE(wgmma_stream_k_fits(128, chosen, 222, 56, 132, 257));
  // One wave (8192 x 8192 at M = 256: 64 tiles, 2 splits fill 97 % of it) keeps its splits.
  chosen = choose_wgmma_splits(64, 128, 132, 132, 128, 256);
  EXPECT_EQ(chosen.splits, 2);
  EXPECT_FALSE(wgmma_stream_k_fits(128, chosen, 64, 128, 132, 256));
  // 28672 x 8192, M = 32: 32 tiles, 448 stages, up to 8 splits; 8 fill 97 % of the wave.
  chosen = choose_wgmma_splits(32, 448, 264, 132, 32, 32);
  EXPECT_EQ(chosen.splits, 8);
  EXPECT_NEAR(chosen.fill, 256.0 / 264.0, 1e-12);
  EXPECT_FALSE(wgmma_stream_k_fits(32, chosen, 32, 448, 264, 32));  // the wave is full
  // A short layer: 4 stages allow one split; stream-K needs 12 stages a block.
  chosen = choose_wgmma_splits(16, 4, 264, 132, 32, 32);
  EXPECT_EQ(chosen.splits, 1);
  EXPECT_FALSE(wgmma_stream_k_fits(32, chosen, 16, 4, 264, 32));
}

// The one-wave k-splits, worked by hand for the H200 (132 SMs, 2 blocks per SM = 264 slots) on the
// shapes where they were measured against stream-K and two-wave k-splits.
TEST(W4A16PlanTest, WgmmaOneWaveSplits) {
  // 3584 x 18944, M = 64: 74 tiles, 56 stages: 264 / 74 = 3 splits fill 84 %; stream-K would give
  // a block 74 x 56 / 264 = 15.7 stages. (The wave fill alone took 7 splits over two waves.)
  WgmmaSplits chosen = choose_wgmma_splits(74, 56, 264, 132, 64, 64);
  EXPECT_EQ(chosen.splits, 3);
  EXPECT_TRUE(chosen.one_wave);
  EXPECT_NEAR(chosen.fill, 222.0 / 264.0, 1e-12);
  EXPECT_FALSE(wgmma_stream_k_fits(64, chosen, 74, 56, 264, 64));
  // 4096 x 14336, M = 32: 56 tiles, 64 stages: 4 splits (85 %), not stream-K.
  chosen = choose_wgmma_splits(56, 64, 264, 132, 32, 32);
  EXPECT_EQ(chosen.splits, 4);
  EXPECT_TRUE(chosen.one_wave);
  EXPECT_FALSE(wgmma_stream_k_fits(32, chosen, 56, 64, 264, 32));
  // 14336 x 4096: 16 tiles, 224 stages: 16 splits (97 %), the most the shared fix-up takes.
  chosen = choose_wgmma_splits(16, 224, 264, 132, 64, 64);
  EXPECT_EQ(chosen.splits, 16);
  EXPECT_TRUE(chosen.one_wave);
  // 4096 x 4096: 16 tiles, 64 stages: at least 8 stages a split allows 8 (48 %), under 80 %, so
  // the wave-fill choice (also 8) and no one-wave flag.
  chosen = choose_wgmma_splits(16, 64, 264, 132, 64, 64);
  EXPECT_EQ(chosen.splits, 8);
  EXPECT_FALSE(chosen.one_wave);
  // 8192 x 28672: stream-K would give each block 112 x 128 / 264 = 54 stages, so not one wave.
  EXPECT_FALSE(choose_wgmma_splits(112, 128, 264, 132, 64, 64).one_wave);
  // 128-token tiles never take it (their partial tiles cost 128 KB each).
  EXPECT_FALSE(choose_wgmma_splits(56, 64, 132, 132, 128, 128).one_wave);
  // A partition of 16 SMs (32 slots): 74 tiles do not fit one wave at all.
  EXPECT_FALSE(choose_wgmma_splits(74, 56, 32, 16, 64, 64).one_wave);
  // Up to 24 rows, where the one wave would leave over a tenth idle, stream-K keeps its full wave:
  // 4096 x 14336 at M = 17 (4 splits fill 85 %; the wave fill's 8 splits over two waves, 85 %,
  // leave stream-K fitting) and 18944 x 3584 (14 tiles, 296 stages; 16 splits fill 85 %).
  chosen = choose_wgmma_splits(56, 64, 264, 132, 32, 17);
  EXPECT_FALSE(chosen.one_wave);
  EXPECT_TRUE(wgmma_stream_k_fits(32, chosen, 56, 64, 264, 17));
  chosen = choose_wgmma_splits(14, 296, 264, 132, 32, 24);
  EXPECT_FALSE(chosen.one_wave);
  EXPECT_TRUE(wgmma_stream_k_fits(32, chosen, 14, 296, 264, 24));
  EXPECT_EQ(choose_wgmma_splits(14, 296, 264, 132, 32, 25).splits, 16);
  // ... but not where the one wave is nearly full (14336 x 4096, 97 %) or where stream-K would not
  // run (3584 x 18944: the wave fill's 7 splits over two waves fill 98 %).
  EXPECT_TRUE(choose_wgmma_splits(16, 224, 264, 132, 32, 17).one_wave);
  chosen = choose_wgmma_splits(74, 56, 264, 132, 32, 17);
  EXPECT_TRUE(chosen.one_wave);
  EXPECT_EQ(chosen.splits, 3);
}

// Every path and pipeline name parses back to its value; a bad name is refused with the valid ones.
TEST(W4A16OptionsTest, NamesRoundTrip) {
  for (const W4A16ForcePath path :
       {W4A16ForcePath::kAuto, W4A16ForcePath::kTensorCore, W4A16ForcePath::kDequantCublas,
        W4A16ForcePath::kXRows, W4A16ForcePath::kSwapped, W4A16ForcePath::kDirect,
        W4A16ForcePath::kWgmma}) {
    const StatusOr<W4A16ForcePath> back = parse_w4a16_force_path(w4a16_force_path_name(path));
    ASSERT_TRUE(back.ok()) << w4a16_force_path_name(path);
    EXPECT_EQ(*back, path);
  }
  EXPECT_EQ(w4a16_force_path_name(W4A16ForcePath::kDequantCublas), "dequant-cublas");
  const StatusOr<W4A16ForcePath> bad = parse_w4a16_force_path("5");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'5'"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("wgmma"), std::string::npos) << bad.status().message();

  for (const W4A16Pipeline pipeline : {W4A16Pipeline::kCpAsync, W4A16Pipeline::kBulkK128}) {
    const StatusOr<W4A16Pipeline> back = parse_w4a16_pipeline(w4a16_pipeline_name(pipeline));
    ASSERT_TRUE(back.ok()) << w4a16_pipeline_name(pipeline);
    EXPECT_EQ(*back, pipeline);
  }
  EXPECT_FALSE(parse_w4a16_pipeline("").ok());
  EXPECT_FALSE(parse_w4a16_pipeline("bulk").ok());  // the 64-k bulk form is gone
}

// The options' own range checks: the defaults pass, and each field out of range is named.
TEST(W4A16OptionsTest, OutOfRangeFieldsAreNamed) {
  EXPECT_TRUE(check_w4a16_options(W4A16Options{}).ok());
  const auto refused = [](const W4A16Options& options, const std::string& field) {
    const Status status = check_w4a16_options(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status.message();
  };
  W4A16Options options;
  options.fallback_min_m = -2;
  refused(options, "fallback_min_m=-2");
  options = {};
  options.force_path = static_cast<W4A16ForcePath>(17);
  refused(options, "force_path=17");
  options = {};
  options.force_blocks = -1;
  refused(options, "force_blocks=-1");
  options = {};
  options.sm_count = -4;
  refused(options, "sm_count=-4");
  options = {};
  options.tuning.pipeline = static_cast<W4A16Pipeline>(9);
  refused(options, "pipeline=9");
  options = {};
  options.tuning.direct_slices = -1;
  refused(options, "direct_slices=-1");
  options = {};
  options.tuning.direct_slice_blocks = -3;
  refused(options, "direct_slice_blocks=-3");
  options = {};
  options.tuning.direct_blocks_per_sm = -1;
  refused(options, "direct_blocks_per_sm=-1");
  options = {};
  options.tuning.wgmma_variant = 10;
  refused(options, "wgmma_variant=10");
  options.tuning.wgmma_variant = 4;  // a removed variant
  refused(options, "wgmma_variant=4");
  options = {};
  options.tuning.wgmma_splits = -2;
  refused(options, "wgmma_splits=-2");
  options = {};
  options.tuning.wgmma_stream_k_blocks = -5;
  refused(options, "wgmma_stream_k_blocks=-5");
  // In range: 0 means "the planner's choice" everywhere, and positive values are overrides.
  options = {};
  options.fallback_min_m = 0;
  options.force_path = W4A16ForcePath::kWgmma;
  options.tuning.direct_slices = 3;
  options.tuning.wgmma_variant = 9;
  options.tuning.wgmma_splits = 64;
  EXPECT_TRUE(check_w4a16_options(options).ok());
}

}  // namespace
}  // namespace gpuopt::kernels::w4a16_detail
