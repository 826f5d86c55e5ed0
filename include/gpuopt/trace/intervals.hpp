// Interval arithmetic behind busy time: unions, intersections and coverage of half-open [start,
// end) nanosecond intervals. Inputs may be unsorted, overlapping, nested or empty.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gpuopt::trace {

struct Interval {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;  // exclusive; end <= start is an empty interval
  std::uint64_t length() const { return end_ns > start_ns ? end_ns - start_ns : 0; }
  friend bool operator==(const Interval&, const Interval&) = default;
};

// Sorted, disjoint, non-adjacent intervals covering exactly what the inputs cover (adjacent ones
// such as [0,5) and [5,9) merge; empty ones vanish).
std::vector<Interval> union_of(std::span<const Interval> intervals);
// Total length of the union.
std::uint64_t union_length(std::span<const Interval> intervals);
// Time covered by both unions.
std::vector<Interval> intersection_of(std::span<const Interval> a, std::span<const Interval> b);
std::uint64_t intersection_length(std::span<const Interval> a, std::span<const Interval> b);
// Time covered by at least `k` intervals at once (k = 2: overlap between any two of them).
std::uint64_t covered_at_least(std::span<const Interval> intervals, int k);
// The intervals cut to `window` (those outside it vanish).
std::vector<Interval> clip_to(std::span<const Interval> intervals, Interval window);

struct WeightedInterval {
  Interval interval;
  double weight = 1.0;  // e.g. the fraction of SMs a kernel's grid can occupy
};
// Integral over time of min(cap, sum of weights of the intervals active then), in ns. With all
// weights 1 and cap 1 this equals union_length.
double weighted_coverage_ns(std::span<const WeightedInterval> intervals, double cap = 1.0);

}  // namespace gpuopt::trace
