// Interval arithmetic against hand-computed fixtures and a brute-force per-nanosecond count.
#include "gpuopt/trace/intervals.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace gpuopt::trace {
namespace {

// Reference: counts, for every ns in [0, horizon), how many intervals cover it.
std::vector<int> coverage(const std::vector<Interval>& intervals, std::uint64_t horizon) {
  std::vector<int> count(horizon, 0);
  for (const Interval& interval : intervals) {
    for (std::uint64_t t = interval.start_ns; t < interval.end_ns && t < horizon; ++t) ++count[t];
  }
  return count;
}

TEST(Intervals, EmptyInputGivesNothing) {
  EXPECT_TRUE(union_of({}).empty());
  EXPECT_EQ(union_length({}), 0u);
  EXPECT_EQ(covered_at_least({}, 2), 0u);
  EXPECT_EQ(weighted_coverage_ns({}), 0.0);
  const std::vector<Interval> zero_length = {{5, 5}, {9, 3}};
  EXPECT_TRUE(union_of(zero_length).empty());
}

TEST(Intervals, OverlappingNestedAndAdjacentMerge) {
  // [0,10) and [5,15) overlap; [20,30) nests [22,25); [30,35) touches [20,30); [40,41) stands
  // alone.
  const std::vector<Interval> input = {{30, 35}, {22, 25}, {0, 10}, {40, 41}, {5, 15}, {20, 30}};
  const std::vector<Interval> expected = {{0, 15}, {20, 35}, {40, 41}};
  EXPECT_EQ(union_of(input), expected);
  EXPECT_EQ(union_length(input), 15u + 15u + 1u);
}

TEST(Intervals, UnsortedDuplicatesCountOnce) {
  const std::vector<Interval> input = {{100, 200}, {100, 200}, {50, 60}, {100, 200}};
  EXPECT_EQ(union_length(input), 110u);
}

TEST(Intervals, IntersectionOfTwoUnions) {
  const std::vector<Interval> a = {{0, 10}, {20, 30}};
  const std::vector<Interval> b = {{5, 25}, {29, 40}};
  const std::vector<Interval> expected = {{5, 10}, {20, 25}, {29, 30}};
  EXPECT_EQ(intersection_of(a, b), expected);
  EXPECT_EQ(intersection_length(a, b), 11u);
  EXPECT_EQ(intersection_length(a, {}), 0u);
}

TEST(Intervals, CoveredAtLeastK) {
  // Three intervals: [0,10), [5,15), [8,9). Covered by >=2: [5,10) = 5; by 3: [8,9) = 1.
  const std::vector<Interval> input = {{0, 10}, {5, 15}, {8, 9}};
  EXPECT_EQ(covered_at_least(input, 1), 15u);
  EXPECT_EQ(covered_at_least(input, 2), 5u);
  EXPECT_EQ(covered_at_least(input, 3), 1u);
  EXPECT_EQ(covered_at_least(input, 4), 0u);
  // Adjacent intervals do not overlap.
  const std::vector<Interval> adjacent = {{0, 5}, {5, 10}};
  EXPECT_EQ(covered_at_least(adjacent, 2), 0u);
}

TEST(Intervals, ClipToWindow) {
  const std::vector<Interval> input = {{0, 10}, {15, 25}, {30, 40}};
  const std::vector<Interval> expected = {{5, 10}, {15, 20}};
  EXPECT_EQ(clip_to(input, {5, 20}), expected);
  EXPECT_TRUE(clip_to(input, {26, 29}).empty());
}

TEST(Intervals, WeightedCoverage) {
  // 0.25 on [0,100), 0.5 on [50,150), 1.0 on [120,130): [0,50) 0.25, [50,100) 0.75, [100,120)
  // 0.5, [120,130) min(1, 1.5), [130,150) 0.5 -> 12.5 + 37.5 + 10 + 10 + 10 = 80.
  const std::vector<WeightedInterval> input = {
      {{0, 100}, 0.25}, {{50, 150}, 0.5}, {{120, 130}, 1.0}};
  EXPECT_DOUBLE_EQ(weighted_coverage_ns(input), 80.0);
  // Weight 1 everywhere equals the union length.
  const std::vector<WeightedInterval> ones = {{{0, 10}, 1}, {{5, 15}, 1}, {{20, 21}, 1}};
  EXPECT_DOUBLE_EQ(weighted_coverage_ns(ones), 16.0);
}

TEST(Intervals, RandomAgainstBruteForce) {
  std::mt19937_64 random(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const std::uint64_t horizon = 300;
    std::uniform_int_distribution<std::uint64_t> point(0, horizon);
    std::vector<Interval> a, b;
    const int count = static_cast<int>(random() % 12);
    for (int i = 0; i < count; ++i) a.push_back({point(random), point(random)});
    for (int i = 0; i < 5; ++i) b.push_back({point(random), point(random)});
    const std::vector<int> ca = coverage(a, horizon);
    const std::vector<int> cb = coverage(b, horizon);
    std::uint64_t covered = 0, at_least_two = 0, both = 0;
    for (std::uint64_t t = 0; t < horizon; ++t) {
      covered += ca[t] >= 1;
      at_least_two += ca[t] >= 2;
      both += ca[t] >= 1 && cb[t] >= 1;
    }
    ASSERT_EQ(union_length(a), covered) << "trial " << trial;
    ASSERT_EQ(covered_at_least(a, 2), at_least_two) << "trial " << trial;
    ASSERT_EQ(intersection_length(a, b), both) << "trial " << trial;
    const std::vector<Interval> merged = union_of(a);
    for (std::size_t i = 1; i < merged.size(); ++i) {
      ASSERT_LT(merged[i - 1].end_ns, merged[i].start_ns) << "not disjoint and non-adjacent";
    }
  }
}

}  // namespace
}  // namespace gpuopt::trace
