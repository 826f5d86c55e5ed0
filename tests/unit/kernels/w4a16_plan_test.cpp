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
  config.pipeline = 2;
  store_plan(KernelPlan{}, config);
  EXPECT_EQ(config.m_tiles, 4);
  EXPECT_TRUE(config.swapped);
  EXPECT_EQ(config.pipeline, 2);
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

}  // namespace
}  // namespace gpuopt::kernels::w4a16_detail
