// Order in which the loader visits a dataset: sequential, or shuffled with a seed (a new
// permutation every epoch, reproducible from the seed and the epoch number).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuopt::data {

enum class SamplerKind { kSequential, kShuffled };

struct SamplerOptions {
  SamplerKind kind = SamplerKind::kSequential;
  std::uint64_t seed = 0;
  bool drop_last = false;  // drop a final partial batch
};

class Sampler {
 public:
  Sampler(std::size_t dataset_size, SamplerOptions options);
  // The indices of one epoch, in visiting order.
  std::vector<std::size_t> epoch_order(std::size_t epoch) const;
  // Batches per epoch for `batch_size` (a final partial batch counts unless drop_last).
  std::size_t batches_per_epoch(std::size_t batch_size) const;
  std::size_t dataset_size() const { return size_; }
  const SamplerOptions& options() const { return options_; }

 private:
  std::size_t size_;
  SamplerOptions options_;
};

}  // namespace gpuopt::data
