// The loader's depth controller: memory-derived upper bound plus a wait-driven feedback loop.
#include "gpuopt/data/depth_controller.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace gpuopt::data {

std::size_t depth_upper_bound(const DepthBudget& budget, std::size_t max_depth) {
  if (budget.batch_bytes == 0) return max_depth;
  auto batches_in = [&](std::size_t bytes) -> std::size_t {
    double usable = static_cast<double>(bytes) * (1.0 - std::clamp(budget.headroom, 0.0, 1.0));
    std::size_t total = static_cast<std::size_t>(std::floor(usable / budget.batch_bytes));
    return total > budget.held_by_consumer ? total - budget.held_by_consumer : 0;
  };
  std::size_t bound = std::min(max_depth, batches_in(budget.pinned_budget_bytes));
  if (budget.device_budget_bytes) bound = std::min(bound, batches_in(*budget.device_budget_bytes));
  return bound;
}

DepthController::DepthController(ControllerOptions options, std::size_t upper_bound)
    : options_(options), upper_bound_(upper_bound) {
  options_.min_depth = std::max<std::size_t>(1, options_.min_depth);
  depth_ =
      std::clamp(options_.initial_depth, std::min(options_.min_depth, upper_bound_), upper_bound_);
}

std::optional<DepthDecision> DepthController::observe(const WindowObservation& window, double now_s,
                                                      std::uint64_t batch) {
  if (window.memory_pressure) return memory_pressure(depth_, now_s, batch, "memory pressure");
  if (!options_.adaptive || window.wall_s <= 0 || window.batches == 0) return std::nullopt;
  double wait_fraction = window.consumer_wait_s / window.wall_s;
  if (wait_fraction <= options_.grow_wait_fraction) return std::nullopt;

  // A deeper queue absorbs bursts; it cannot raise throughput. When the workers' capacity is
  // below what the consumer asks for, growing only spends memory, so hold and say why once.
  double busy_s = window.wall_s - window.consumer_wait_s;
  if (window.producer_capacity_batches_per_s && busy_s > 0) {
    double demand = static_cast<double>(window.batches) / busy_s;
    if (*window.producer_capacity_batches_per_s < demand) {
      if (reported_producer_bound_) return std::nullopt;
      reported_producer_bound_ = true;
      return DepthDecision{now_s, batch, depth_,
                           fmt::format("hold: producer-bound (capacity {:.1f} < demand {:.1f} "
                                       "batches/s), depth would not help",
                                       *window.producer_capacity_batches_per_s, demand)};
    }
  }
  reported_producer_bound_ = false;
  if (depth_ >= upper_bound_) {
    if (reported_at_bound_) return std::nullopt;
    reported_at_bound_ = true;
    return DepthDecision{now_s, batch, depth_,
                         fmt::format("hold: consumer waited {:.1f}% but depth is at the memory "
                                     "bound {}",
                                     100 * wait_fraction, upper_bound_)};
  }
  // Grow by the measured deficit: the consumer waited `wait` while each batch took `busy / batches`
  // of its own time, so about wait / (busy / batches) more batches queued ahead would have covered
  // the stall. A fixed factor needs several windows (each with its stall) to get there; the factor
  // stays as the least growth, for waits shorter than one batch of consumer work.
  std::size_t ceiling = std::min(upper_bound_, std::max(options_.max_depth, options_.min_depth));
  double by_factor = std::ceil(static_cast<double>(depth_) * options_.growth_factor);
  double grown = std::max(static_cast<double>(depth_ + 1), by_factor);
  double deficit = 0;  // batches of consumer work the wait amounted to
  if (busy_s > 0) {
    double per_batch_s = busy_s / static_cast<double>(window.batches);
    // The epsilon keeps an exact multiple (0.27 s of wait at 15 ms a batch) from rounding up.
    deficit = std::max(0.0, std::ceil(window.consumer_wait_s / per_batch_s - 1e-9));
    grown = std::max(grown, static_cast<double>(depth_) + deficit);
  }
  depth_ =
      std::max(depth_, static_cast<std::size_t>(std::min(grown, static_cast<double>(ceiling))));
  return DepthDecision{
      now_s, batch, depth_,
      fmt::format("grow: consumer waited {:.1f}% of the last {} batches ({:.0f} ms, "
                  "{:.0f} batches of consumer work)",
                  100 * wait_fraction, window.batches, 1000 * window.consumer_wait_s, deficit)};
}

std::optional<DepthDecision> DepthController::memory_pressure(std::size_t allocated_batches,
                                                              double now_s, std::uint64_t batch,
                                                              const std::string& why) {
  std::size_t shrunk = std::min(
      depth_ > 0 ? depth_ - 1 : 0,
      static_cast<std::size_t>(std::floor(static_cast<double>(depth_) * options_.shrink_factor)));
  shrunk = std::max(shrunk, options_.min_depth);
  std::size_t new_bound = std::max(options_.min_depth, std::min(upper_bound_, allocated_batches));
  bool changed = shrunk != depth_ || new_bound != upper_bound_;
  upper_bound_ = new_bound;
  depth_ = std::min(shrunk, upper_bound_);
  reported_at_bound_ = false;
  if (!changed) return std::nullopt;
  return DepthDecision{now_s, batch, depth_,
                       fmt::format("shrink: {} (upper bound now {})", why, upper_bound_)};
}

}  // namespace gpuopt::data
