// Sampler: sequential order, seeded shuffles (a permutation, reproducible, new per epoch), counts.
#include "gpuopt/data/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace gpuopt::data {
namespace {

TEST(Sampler, SequentialVisitsEveryIndexInOrder) {
  Sampler sampler(10, {});
  auto order = sampler.epoch_order(3);
  std::vector<std::size_t> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(Sampler, ShuffledIsAReproduciblePermutationThatChangesPerEpoch) {
  SamplerOptions options{SamplerKind::kShuffled, 42, false};
  Sampler sampler(1000, options);
  auto first = sampler.epoch_order(0);
  auto again = Sampler(1000, options).epoch_order(0);
  auto second = sampler.epoch_order(1);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, second);
  auto sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  std::vector<std::size_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(first, identity);
  options.seed = 43;
  EXPECT_NE(Sampler(1000, options).epoch_order(0), first);
}

TEST(Sampler, BatchesPerEpochHonoursDropLast) {
  EXPECT_EQ(Sampler(10, {}).batches_per_epoch(4), 3u);
  EXPECT_EQ(Sampler(10, {SamplerKind::kSequential, 0, true}).batches_per_epoch(4), 2u);
  EXPECT_EQ(Sampler(8, {}).batches_per_epoch(4), 2u);
  EXPECT_EQ(Sampler(3, {SamplerKind::kSequential, 0, true}).batches_per_epoch(4), 0u);
}

}  // namespace
}  // namespace gpuopt::data
