// The direct and wgmma kernels' plans travel through the public W4A16Config between initialize()
// and run() (w4a16_paths.hpp): every field run_direct()/run_wgmma() reads comes back as planned.
// A field dropped on the way (the partial-sum layout flag once was) runs another configuration
// than the one described, with correct results, so no numeric test notices it.
#include <gtest/gtest.h>

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
