// Synthetic dataset: a known byte pattern per sample and a reproducible cost per sample (busy-wait
// to model CPU work, sleep to model storage), with fault injection for the loader's tests.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "gpuopt/data/dataset.hpp"

namespace gpuopt::data {
namespace {

// splitmix64: a well-mixed hash so each index's cost is independent of every other's.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double unit_uniform(std::uint64_t bits) {  // (0, 1)
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void spend(double microseconds, CostMode mode) {
  if (microseconds <= 0) return;
  auto duration = std::chrono::duration<double, std::micro>(microseconds);
  if (mode == CostMode::kSleep) {
    std::this_thread::sleep_for(duration);
    return;
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(duration);
  while (std::chrono::steady_clock::now() < deadline) {
  }
}

class SyntheticDataset final : public Dataset {
 public:
  explicit SyntheticDataset(SyntheticOptions options) : options_(std::move(options)) {}
  std::size_t size() const override { return options_.samples; }
  std::size_t sample_bytes() const override { return options_.sample_bytes; }

  Status read(std::size_t index, std::span<std::byte> out) override {
    if (index >= options_.samples) {
      return out_of_range(fmt::format("synthetic sample {} of {}", index, options_.samples));
    }
    spend(synthetic_cost_us(options_, index), options_.mode);
    if (options_.throwing_indices.count(index) != 0) {
      throw std::runtime_error(fmt::format("synthetic sample {} throws (fault injection)", index));
    }
    if (options_.corrupt_indices.count(index) != 0) {
      return data_loss(
          fmt::format("sample {} of synthetic source is corrupt (fault injection)", index));
    }
    std::size_t words = out.size() / sizeof(std::uint64_t);
    for (std::size_t w = 0; w < words; ++w) {
      std::uint64_t value = synthetic_word(index, w);
      std::memcpy(out.data() + w * sizeof(value), &value, sizeof(value));
    }
    std::size_t tail = out.size() - words * sizeof(std::uint64_t);
    if (tail != 0) std::memset(out.data() + words * sizeof(std::uint64_t), 0, tail);
    return ok_status();
  }

  std::string describe() const override {
    const char* kind = options_.distribution == CostDistribution::kConstant    ? "constant"
                       : options_.distribution == CostDistribution::kLognormal ? "lognormal"
                                                                               : "periodic-stall";
    return fmt::format("synthetic: {} samples x {} B, {} cost, median {} us ({})", options_.samples,
                       options_.sample_bytes, kind, options_.median_us,
                       options_.mode == CostMode::kSleep ? "sleep" : "busy-wait");
  }

 private:
  SyntheticOptions options_;
};

}  // namespace

double synthetic_cost_us(const SyntheticOptions& options, std::size_t index) {
  switch (options.distribution) {
    case CostDistribution::kConstant:
      return options.median_us;
    case CostDistribution::kLognormal: {
      // Box-Muller from two hashed uniforms: N(0,1) for this index.
      std::uint64_t a = mix(options.seed ^ mix(index * 2 + 1));
      std::uint64_t b = mix(a);
      double normal = std::sqrt(-2.0 * std::log(unit_uniform(a))) *
                      std::cos(6.283185307179586 * unit_uniform(b));
      return options.median_us * std::exp(options.sigma * normal);
    }
    case CostDistribution::kPeriodicStall:
      if (options.stall_every != 0 && index % options.stall_every == options.stall_every - 1) {
        return options.stall_us;
      }
      return options.median_us;
  }
  return options.median_us;
}

std::unique_ptr<Dataset> make_synthetic(const SyntheticOptions& options) {
  return std::make_unique<SyntheticDataset>(options);
}

}  // namespace gpuopt::data
