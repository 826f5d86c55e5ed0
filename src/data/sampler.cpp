// Sequential and seeded shuffled sample order for the loader.
#include "gpuopt/data/sampler.hpp"

#include <numeric>
#include <random>

namespace gpuopt::data {

Sampler::Sampler(std::size_t dataset_size, SamplerOptions options)
    : size_(dataset_size), options_(options) {}

std::vector<std::size_t> Sampler::epoch_order(std::size_t epoch) const {
  std::vector<std::size_t> order(size_);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (options_.kind == SamplerKind::kShuffled) {
    // A fresh permutation per epoch that depends only on (seed, epoch). Fisher-Yates with our own
    // bounded draw, because std::shuffle's use of the engine is implementation-defined.
    std::seed_seq seq{static_cast<std::uint32_t>(options_.seed),
                      static_cast<std::uint32_t>(options_.seed >> 32),
                      static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)};
    std::mt19937_64 engine(seq);
    for (std::size_t i = size_; i > 1; --i) {
      std::size_t j = static_cast<std::size_t>(engine() % i);
      std::swap(order[i - 1], order[j]);
    }
  }
  return order;
}

std::size_t Sampler::batches_per_epoch(std::size_t batch_size) const {
  if (batch_size == 0) return 0;
  return options_.drop_last ? size_ / batch_size : (size_ + batch_size - 1) / batch_size;
}

}  // namespace gpuopt::data
