// The adaptive prefetch loader: persistent worker threads read samples from a Dataset in sampler
// order, collate them in place into pinned staging buffers, and (GPU mode) copy each batch to the
// device on a dedicated copy stream; the consumer gets the device batch and the event to wait on.
// The depth (batches prepared ahead) is set by a DepthController. CPU mode skips the device copy,
// so every piece of logic runs and is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/data/dataset.hpp"
#include "gpuopt/data/depth_controller.hpp"
#include "gpuopt/data/sampler.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::data {

enum class ErrorPolicy {
  kSkipAndCount,  // drop the bad sample from its batch, count it, record index and message
  kStop,          // the first bad sample ends the run: next() returns its DATA_LOSS status
};

enum class LoaderMode { kCpu, kGpu };

struct LoaderOptions {
  std::size_t batch_size = 32;
  int workers = 4;
  std::size_t epochs = 1;
  SamplerOptions sampler;
  ControllerOptions depth;  // depth.adaptive = false gives a fixed depth of depth.initial_depth
  ErrorPolicy on_error = ErrorPolicy::kSkipAndCount;
  LoaderMode mode = LoaderMode::kCpu;
  int device = 0;
  std::size_t pinned_budget_bytes = std::size_t{256} << 20;
  std::size_t device_budget_bytes = 0;  // GPU mode; 0 = the device's free memory at create()
  double headroom = 0.1;
  // Polled once per controller window; true = memory is short (tests simulate pressure with it).
  // GPU mode also treats free device memory below `headroom` of the total as pressure.
  std::function<bool()> memory_pressure_probe;
  std::size_t max_recorded_failures = 64;
  // GPU mode: read samples straight into the device batch when the dataset offers a DeviceReader
  // (a record file opened with cuFile); false forces pread + pinned staging + host-to-device copy.
  bool device_reads = true;
};

struct SampleFailure {
  std::size_t index = 0;
  std::size_t epoch = 0;
  std::string message;  // names the index and the file
};

struct LoaderStats {
  double wall_s = 0;           // first next() to the end of the last batch (or now)
  double consumer_wait_s = 0;  // time next() blocked
  double wait_fraction = 0;    // consumer_wait_s / wall_s
  std::uint64_t batches = 0;
  std::uint64_t samples = 0;
  std::uint64_t skipped_samples = 0;
  std::vector<SampleFailure> failures;        // the first max_recorded_failures
  std::vector<DepthDecision> depth_timeline;  // starts with the initial depth
  std::size_t depth = 0;
  std::size_t max_depth_reached = 0;
  std::size_t depth_upper_bound = 0;
  std::size_t batch_bytes = 0;
  std::size_t pinned_budget_bytes = 0;
  std::size_t pinned_bytes_peak = 0;  // staging memory reserved, at its highest
  std::size_t device_bytes_peak = 0;  // GPU mode
  std::uint64_t h2d_bytes = 0;
  std::optional<double> h2d_gbps;  // bytes / summed copy time (events on the copy stream)
  double worker_utilization = 0;   // busy time / (workers * wall)
  std::optional<double> producer_capacity_batches_per_s;
  double consumer_rate_batches_per_s = 0;
  std::string staging;    // which pinned allocator was used ("none (cuFile)" for direct reads)
  std::string io;         // "pread" or "cufile": how samples reach the batch
  std::string io_detail;  // e.g. "cuFile via libcufile.so.0, compat mode: ..."
};

nlohmann::json to_json(const LoaderStats& stats);

class Loader;

// One collated batch. Valid until Loader::release(); movable, not copyable.
class Batch {
 public:
  Batch() = default;
  Batch(Batch&&) noexcept = default;
  Batch& operator=(Batch&&) noexcept = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  std::uint64_t sequence() const { return sequence_; }
  std::size_t epoch() const { return epoch_; }
  // Dataset indices of the samples present, in order (skipped samples are removed).
  const std::vector<std::size_t>& indices() const { return indices_; }
  std::size_t size() const { return indices_.size(); }
  std::size_t bytes() const { return bytes_; }
  // CPU mode: the collated samples in host staging memory, [size(), sample_bytes]. GPU mode:
  // nullptr, because the pinned staging block goes back to the pool as soon as its copy is queued.
  const std::byte* host() const { return host_; }
  // GPU mode: the device copy and the event that completes it on the copy stream; nullptr in CPU
  // mode. Make the consumer's stream wait on it (wait_on) before reading device().
  void* device() const { return device_; }
  runtime::EventHandle ready_event() const { return ready_event_; }
  // cudaStreamWaitEvent(stream, ready_event()); OK in CPU mode.
  Status wait_on(runtime::StreamHandle stream) const;
  bool valid() const { return slot_ >= 0; }

 private:
  friend class Loader;
  std::uint64_t sequence_ = 0;
  std::size_t epoch_ = 0;
  std::vector<std::size_t> indices_;
  std::size_t bytes_ = 0;
  const std::byte* host_ = nullptr;
  void* device_ = nullptr;
  runtime::EventHandle ready_event_ = nullptr;
  int slot_ = -1;
};

class Loader {
 public:
  // Starts the workers. INVALID_ARGUMENT for a bad option, RESOURCE_EXHAUSTED when not even one
  // batch fits the budgets, UNIMPLEMENTED for GPU mode in a build without CUDA, UNAVAILABLE when
  // GPU mode finds no device.
  static StatusOr<std::unique_ptr<Loader>> create(std::shared_ptr<Dataset> dataset,
                                                  LoaderOptions options);
  // Stops the workers (also in the middle of an epoch) and frees every buffer.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch in sampler order; nullopt after the last epoch. Under ErrorPolicy::kStop the
  // first bad sample's DATA_LOSS; an exception in a worker is INTERNAL (never a hang).
  StatusOr<std::optional<Batch>> next();
  // As next(), but waits at most `timeout_s` for the next batch: DEADLINE_EXCEEDED when none came
  // in time (the loader is unchanged; call again). Lets a caller poll for interrupts (Ctrl-C in
  // Python) while it waits; the time waited counts as consumer wait like next()'s.
  StatusOr<std::optional<Batch>> next_for(double timeout_s);
  // Gives the batch's buffers back. GPU mode: pass the stream that used the batch; its device
  // buffer is rewritten only after that stream passes this point.
  Status release(Batch& batch, runtime::StreamHandle consumer_stream = nullptr);
  // Stops the workers early; next() then returns CANCELLED.
  void stop();

  LoaderStats stats() const;
  std::size_t depth() const;
  const LoaderOptions& options() const;
  const std::string& notes() const;  // e.g. which staging allocator, GDS fallback

  struct State;

 private:
  explicit Loader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gpuopt::data
