// How many batches the loader prepares ahead of the consumer: an upper bound from the pinned and
// device memory budgets (with headroom), and a feedback loop that grows the depth while the
// consumer waits (and the producers could keep up), and shrinks it under memory pressure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace gpuopt::data {

struct DepthBudget {
  std::size_t batch_bytes = 0;
  std::size_t pinned_budget_bytes = 0;             // staging buffers, one per batch in flight
  std::optional<std::size_t> device_budget_bytes;  // GPU mode: one device buffer per batch
  double headroom = 0.1;                           // fraction of each budget left unused
  std::size_t held_by_consumer = 1;                // batches the consumer holds besides the depth
};

// Largest depth d with (d + held) * batch_bytes <= budget * (1 - headroom) for every budget, capped
// at `max_depth`; 0 when not even one batch fits.
std::size_t depth_upper_bound(const DepthBudget& budget, std::size_t max_depth);

struct ControllerOptions {
  bool adaptive = true;  // false: the depth stays at initial_depth
  std::size_t initial_depth = 2;
  std::size_t min_depth = 1;
  std::size_t max_depth = 64;
  std::size_t window_batches = 8;     // consumed batches per observation
  double grow_wait_fraction = 0.005;  // grow when the consumer waited more than this in a window
  // Growth: depth + the window's wait in batches of consumer work (wait / (busy time / batches)),
  // at least depth x growth_factor and at least +1.
  double growth_factor = 1.5;
  double shrink_factor = 0.75;  // under memory pressure (at least -1)
};

// What the loader measured over one window of consumed batches.
struct WindowObservation {
  double wall_s = 0;           // consumer-side wall time of the window
  double consumer_wait_s = 0;  // time the consumer spent blocked waiting for a batch
  std::size_t batches = 0;     // batches consumed in the window
  // Batches per second the workers could produce if never throttled (from their busy time);
  // nullopt when not yet known.
  std::optional<double> producer_capacity_batches_per_s;
  bool memory_pressure = false;  // an allocation hit the budget or free device memory is low
};

struct DepthDecision {
  double time_s = 0;        // since the loader's first next()
  std::uint64_t batch = 0;  // batches consumed when decided
  std::size_t depth = 0;    // the new depth
  std::string reason;
};

class DepthController {
 public:
  DepthController(ControllerOptions options, std::size_t upper_bound);

  std::size_t depth() const { return depth_; }
  std::size_t upper_bound() const { return upper_bound_; }
  const ControllerOptions& options() const { return options_; }

  // Feeds one window; returns the decision when the depth changed (or growth was refused for a
  // reason worth showing, with the depth unchanged).
  std::optional<DepthDecision> observe(const WindowObservation& window, double now_s,
                                       std::uint64_t batch);
  // An allocation failed or memory is short right now: shrink and lower the upper bound to what
  // is already allocated, so the loader stops asking for more.
  std::optional<DepthDecision> memory_pressure(std::size_t allocated_batches, double now_s,
                                               std::uint64_t batch, const std::string& why);

 private:
  ControllerOptions options_;
  std::size_t upper_bound_;
  std::size_t depth_;
  bool reported_producer_bound_ = false;
  bool reported_at_bound_ = false;
};

}  // namespace gpuopt::data
