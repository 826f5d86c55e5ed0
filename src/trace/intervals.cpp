// Interval arithmetic for busy time: sort-and-sweep, O(n log n) in the number of intervals.
#include "gpuopt/trace/intervals.hpp"

#include <algorithm>
#include <utility>

namespace gpuopt::trace {

std::vector<Interval> union_of(std::span<const Interval> intervals) {
  std::vector<Interval> sorted;
  sorted.reserve(intervals.size());
  for (const Interval& interval : intervals) {
    if (interval.length() > 0) sorted.push_back(interval);
  }
  std::sort(sorted.begin(), sorted.end(), [](const Interval& a, const Interval& b) {
    return a.start_ns < b.start_ns || (a.start_ns == b.start_ns && a.end_ns < b.end_ns);
  });
  std::vector<Interval> merged;
  for (const Interval& interval : sorted) {
    // `<=` merges adjacent intervals: back-to-back kernels leave no idle gap between them.
    if (!merged.empty() && interval.start_ns <= merged.back().end_ns) {
      merged.back().end_ns = std::max(merged.back().end_ns, interval.end_ns);
    } else {
      merged.push_back(interval);
    }
  }
  return merged;
}

std::uint64_t union_length(std::span<const Interval> intervals) {
  std::uint64_t total = 0;
  for (const Interval& interval : union_of(intervals)) total += interval.length();
  return total;
}

std::vector<Interval> intersection_of(std::span<const Interval> a, std::span<const Interval> b) {
  const std::vector<Interval> ua = union_of(a);
  const std::vector<Interval> ub = union_of(b);
  std::vector<Interval> result;
  std::size_t i = 0, j = 0;
  while (i < ua.size() && j < ub.size()) {
    const std::uint64_t start = std::max(ua[i].start_ns, ub[j].start_ns);
    const std::uint64_t end = std::min(ua[i].end_ns, ub[j].end_ns);
    if (start < end) result.push_back({start, end});
    // Advance whichever ends first; it cannot meet anything later in the other list.
    if (ua[i].end_ns < ub[j].end_ns) {
      ++i;
    } else {
      ++j;
    }
  }
  return result;
}

std::uint64_t intersection_length(std::span<const Interval> a, std::span<const Interval> b) {
  std::uint64_t total = 0;
  for (const Interval& interval : intersection_of(a, b)) total += interval.length();
  return total;
}

namespace {

// Start/end events sorted by time, ends before starts at equal times so that adjacent intervals do
// not count as overlapping.
template <typename Weight>
std::vector<std::pair<std::uint64_t, Weight>> sweep_events(std::span<const Interval> intervals,
                                                           auto weight_of) {
  std::vector<std::pair<std::uint64_t, Weight>> events;
  events.reserve(intervals.size() * 2);
  for (std::size_t i = 0; i < intervals.size(); ++i) {
    if (intervals[i].length() == 0) continue;
    events.emplace_back(intervals[i].start_ns, weight_of(i));
    events.emplace_back(intervals[i].end_ns, -weight_of(i));
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  return events;
}

}  // namespace

std::uint64_t covered_at_least(std::span<const Interval> intervals, int k) {
  if (k <= 1) return union_length(intervals);
  const auto events = sweep_events<int>(intervals, [](std::size_t) { return 1; });
  std::uint64_t total = 0;
  int active = 0;
  std::uint64_t previous = 0;
  for (const auto& [time, delta] : events) {
    if (active >= k) total += time - previous;
    active += delta;
    previous = time;
  }
  return total;
}

std::vector<Interval> clip_to(std::span<const Interval> intervals, Interval window) {
  std::vector<Interval> clipped;
  for (const Interval& interval : intervals) {
    const Interval cut{std::max(interval.start_ns, window.start_ns),
                       std::min(interval.end_ns, window.end_ns)};
    if (cut.length() > 0) clipped.push_back(cut);
  }
  return clipped;
}

double weighted_coverage_ns(std::span<const WeightedInterval> intervals, double cap) {
  // Ends sort before starts at the same instant, so adjacent intervals never add up.
  struct Event {
    std::uint64_t time;
    bool is_start;
    double weight;
  };
  std::vector<Event> events;
  events.reserve(intervals.size() * 2);
  for (const WeightedInterval& weighted : intervals) {
    if (weighted.interval.length() == 0 || weighted.weight <= 0) continue;
    events.push_back({weighted.interval.start_ns, true, weighted.weight});
    events.push_back({weighted.interval.end_ns, false, weighted.weight});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time < b.time || (a.time == b.time && !a.is_start && b.is_start);
  });
  double total = 0;
  double active = 0;
  int open = 0;
  std::uint64_t previous = 0;
  for (const Event& event : events) {
    if (open > 0) total += static_cast<double>(event.time - previous) * std::min(cap, active);
    active += event.is_start ? event.weight : -event.weight;
    open += event.is_start ? 1 : -1;
    if (open == 0) active = 0;  // resets rounding residue between busy periods
    previous = event.time;
  }
  return total;
}

}  // namespace gpuopt::trace
