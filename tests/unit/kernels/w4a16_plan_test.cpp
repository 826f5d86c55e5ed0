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

}  // namespace
}  // namespace gpuopt::kernels::w4a16_detail
