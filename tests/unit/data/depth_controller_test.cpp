// Depth controller: the memory-derived upper bound (hand-computed), growth on consumer wait (by the
// wait's deficit in batches, at least x1.5), holds when producer-bound or at the bound, shrink
// under memory pressure, fixed mode never moves.
#include "gpuopt/data/depth_controller.hpp"

#include <gtest/gtest.h>

namespace gpuopt::data {
namespace {

TEST(DepthUpperBound, TakesTheTightestBudgetAfterHeadroomAndHeldBatches) {
  DepthBudget budget;
  budget.batch_bytes = 100;
  budget.pinned_budget_bytes = 1000;  // 900 usable → 9 batches, 1 held → 8
  budget.headroom = 0.1;
  EXPECT_EQ(depth_upper_bound(budget, 64), 8u);
  EXPECT_EQ(depth_upper_bound(budget, 5), 5u);
  budget.device_budget_bytes = 500;  // 450 → 4 batches, 1 held → 3
  EXPECT_EQ(depth_upper_bound(budget, 64), 3u);
  budget.device_budget_bytes = 150;  // 135 → 1 batch, held by the consumer → 0
  EXPECT_EQ(depth_upper_bound(budget, 64), 0u);
}

WindowObservation waiting_window(double wait_fraction, std::optional<double> capacity = 1000.0) {
  WindowObservation window;
  window.wall_s = 1.0;
  window.consumer_wait_s = wait_fraction;
  window.batches = 8;
  window.producer_capacity_batches_per_s = capacity;
  return window;
}

TEST(DepthController, GrowsWhileTheConsumerWaitsUpToTheBound) {
  ControllerOptions options;
  options.initial_depth = 2;
  DepthController controller(options, 10);
  // 0.05 s of wait, 0.95 s busy over 8 batches (0.119 s each): a deficit of 1 batch, so the
  // factor decides.
  auto decision = controller.observe(waiting_window(0.05), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 3u);  // max(ceil(2 * 1.5), 2 + 1)
  EXPECT_NE(decision->reason.find("grow"), std::string::npos);
  for (int i = 0; i < 10; ++i) (void)controller.observe(waiting_window(0.05), 2.0 + i, 16);
  EXPECT_EQ(controller.depth(), 10u);
  auto at_bound = controller.observe(waiting_window(0.2), 20.0, 100);
  EXPECT_FALSE(at_bound.has_value());  // the "hold at bound" note was given once already
}

// 8 batches of 15 ms consumer work and 0.27 s of wait: 18 batches of work would have covered it.
WindowObservation stalled_window(double capacity = 1000.0) {
  WindowObservation window;
  window.batches = 8;
  window.consumer_wait_s = 0.27;
  window.wall_s = 8 * 0.015 + 0.27;
  window.producer_capacity_batches_per_s = capacity;  // demand: 8 / 0.12 s = 66.7 batches/s
  return window;
}

TEST(DepthController, GrowsByTheWaitsDeficitInBatchesNotByAFixedFactor) {
  DepthController controller({}, 64);
  auto decision = controller.observe(stalled_window(), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 20u);  // 2 + ceil(0.27 / 0.015); x1.5 would give 3
  EXPECT_EQ(controller.depth(), 20u);
  EXPECT_NE(decision->reason.find("grow"), std::string::npos);
  EXPECT_NE(decision->reason.find("18 batches of consumer work"), std::string::npos)
      << decision->reason;
  // The same stall again: the deficit is added to the present depth.
  decision = controller.observe(stalled_window(), 2.0, 16);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 38u);
}

TEST(DepthController, KeepsTheFactorAsTheLeastGrowth) {
  ControllerOptions options;
  options.initial_depth = 20;
  DepthController controller(options, 64);
  // 2 ms of wait at 15 ms a batch: a deficit of 1 batch, but x1.5 gives 30.
  WindowObservation window = stalled_window();
  window.consumer_wait_s = 0.002;
  window.wall_s = 8 * 0.015 + 0.002;
  auto decision = controller.observe(window, 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 30u);
}

TEST(DepthController, DeficitGrowthIsCappedByTheUpperBoundAndMaxDepth) {
  DepthController by_bound({}, 12);
  auto decision = by_bound.observe(stalled_window(), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 12u);
  // At the bound: one note, then silence.
  decision = by_bound.observe(stalled_window(), 2.0, 16);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 12u);
  EXPECT_NE(decision->reason.find("memory bound 12"), std::string::npos) << decision->reason;
  EXPECT_FALSE(by_bound.observe(stalled_window(), 3.0, 24).has_value());

  ControllerOptions options;
  options.max_depth = 9;
  DepthController by_max(options, 64);
  decision = by_max.observe(stalled_window(), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 9u);
}

TEST(DepthController, ALargeStallStillHoldsWhenProducersCannotKeepUp) {
  DepthController controller({}, 64);
  // Demand 66.7 batches/s; producers manage 50: a deeper queue would not help.
  auto decision = controller.observe(stalled_window(50.0), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 2u);
  EXPECT_NE(decision->reason.find("producer-bound"), std::string::npos);
  EXPECT_FALSE(controller.observe(stalled_window(50.0), 2.0, 16).has_value());
  EXPECT_EQ(controller.depth(), 2u);
}

TEST(DepthController, AConsumerThatOnlyWaitedGrowsByTheFactor) {
  // No busy time to measure a batch by: the deficit is unknown, x1.5 applies.
  WindowObservation window;
  window.batches = 8;
  window.wall_s = 0.5;
  window.consumer_wait_s = 0.5;
  DepthController controller({}, 64);
  auto decision = controller.observe(window, 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 3u);
}

TEST(DepthController, NoWaitNoChange) {
  DepthController controller({}, 10);
  EXPECT_FALSE(controller.observe(waiting_window(0.0), 1.0, 8).has_value());
  EXPECT_EQ(controller.depth(), 2u);
}

TEST(DepthController, HoldsWhenProducersCannotKeepUp) {
  DepthController controller({}, 10);
  // Consumer busy 0.5 s for 8 batches → demand 16 batches/s; producers manage 10.
  auto decision = controller.observe(waiting_window(0.5, 10.0), 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 2u);
  EXPECT_NE(decision->reason.find("producer-bound"), std::string::npos);
  EXPECT_EQ(controller.depth(), 2u);
}

TEST(DepthController, FixedDepthNeverMoves) {
  ControllerOptions options;
  options.adaptive = false;
  options.initial_depth = 8;
  DepthController controller(options, 64);
  for (int i = 0; i < 5; ++i)
    EXPECT_FALSE(controller.observe(waiting_window(0.9), i, i).has_value());
  EXPECT_EQ(controller.depth(), 8u);
}

TEST(DepthController, ShrinksAndLowersTheBoundUnderMemoryPressure) {
  ControllerOptions options;
  options.initial_depth = 8;
  DepthController controller(options, 16);
  WindowObservation window = waiting_window(0.5);
  window.memory_pressure = true;
  auto decision = controller.observe(window, 1.0, 8);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->depth, 6u);  // floor(8 * 0.75)
  EXPECT_EQ(controller.upper_bound(), 8u);
  EXPECT_NE(decision->reason.find("shrink"), std::string::npos);
  for (int i = 0; i < 20; ++i) (void)controller.observe(window, 2.0 + i, 16);
  EXPECT_EQ(controller.depth(), options.min_depth);
}

TEST(DepthController, InitialDepthIsClampedToTheBound) {
  ControllerOptions options;
  options.initial_depth = 32;
  EXPECT_EQ(DepthController(options, 4).depth(), 4u);
}

}  // namespace
}  // namespace gpuopt::data
