// The adaptive prefetch loader: worker threads, in-place collation into pooled staging memory,
// stream-ordered host→device copies, the depth controller, error policy and clean shutdown.
#include "gpuopt/data/loader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/pinned_pool.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One batch's buffers. A slot is owned by the issuing worker while its staging block is fetched,
// shared by the workers collating into it (each writes only its own sample), owned by the worker
// that completes it while the copy is queued, then by the consumer until release().
struct Slot {
  runtime::PinnedBlock staging;
  bool has_staging = false;
  runtime::DeviceBuffer device;  // GPU mode
  bool registered = false;       // device is registered with the dataset's DeviceReader (cuFile)
  bool ready_recorded = false;   // direct reads: `ready` marks the last use of device by the loader
#if GPUOPT_CUDA
  runtime::Event copy_start;     // timing: the copy's start and end on the copy stream
  runtime::Event ready;          // the batch's device copy is complete
  runtime::Event consumer_done;  // the consumer's stream finished with device
#endif
  bool copy_recorded = false;  // copy_start/ready hold an untimed copy
  std::size_t copy_bytes = 0;
  bool consumer_recorded = false;  // copy stream must wait on consumer_done before reuse

  std::uint64_t sequence = 0;
  std::size_t epoch = 0;
  std::vector<std::size_t> indices;
  std::vector<char> failed;
  std::size_t remaining = 0;
  bool collated = false;  // all samples read (and the copy queued in GPU mode)
};

struct Task {
  int slot;
  std::size_t position;
};

}  // namespace

struct Loader::State {
  std::shared_ptr<Dataset> dataset;
  LoaderOptions options;
  Sampler sampler{0, SamplerOptions{}};
  std::size_t sample_bytes = 0;
  std::size_t batch_bytes = 0;
  std::size_t batches_per_epoch = 0;
  std::uint64_t total_batches = 0;
  std::unique_ptr<runtime::PinnedPool> pool;
  std::string notes;
  bool gpu = false;
  // GPU mode with a dataset that reads straight into device memory (cuFile): no staging, no H2D.
  DeviceReader* direct = nullptr;
  std::string io = "pread";
  std::string io_detail;
  std::string register_failure;  // the first failed buffer registration, for the notes
#if GPUOPT_CUDA
  std::optional<runtime::Device> device;
  runtime::Stream copy_stream;
#endif
  std::size_t device_slot_limit = std::numeric_limits<std::size_t>::max();

  mutable std::mutex mutex;
  std::condition_variable work_cv;   // workers: a task, room to issue, or stop
  std::condition_variable ready_cv;  // consumer: the next batch is collated, or stop/failure
  std::vector<std::unique_ptr<Slot>> slots;  // by id; nullptr once freed
  std::vector<int> free_slots;
  std::size_t live_slots = 0;
  std::size_t held = 0;                    // batches handed to the consumer, not yet released
  std::map<std::uint64_t, int> in_flight;  // issued, not yet handed out: sequence → slot
  std::deque<Task> tasks;
  std::uint64_t next_issue = 0;
  std::uint64_t next_consume = 0;
  std::size_t order_epoch = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> order;
  DepthController controller{ControllerOptions{}, 1};
  bool issuing = false;        // one worker fetches memory for the next batch at a time
  bool alloc_blocked = false;  // the budget refused; retry after a release
  bool stopping = false;
  Status failure;
  std::vector<std::thread> workers;

  // Statistics (under mutex).
  bool started = false;
  bool ended = false;
  Clock::time_point start, end, window_start;
  double wait_s = 0, window_wait_s = 0;
  std::size_t window_batches = 0;
  std::uint64_t batches = 0, samples = 0, skipped = 0;
  std::vector<SampleFailure> failures;
  std::vector<DepthDecision> timeline;
  std::size_t max_depth_reached = 0;
  std::size_t pinned_peak = 0, device_bytes = 0, device_peak = 0;
  std::uint64_t h2d_bytes = 0;
  double h2d_s = 0;
  double busy_s = 0;
  std::uint64_t samples_read = 0;

  double now_s() const { return started ? seconds_between(start, Clock::now()) : 0.0; }

  void record_decision(const std::optional<DepthDecision>& decision) {
    if (!decision) return;
    timeline.push_back(*decision);
    max_depth_reached = std::max(max_depth_reached, decision->depth);
  }

  void fail_locked(Status status) {
    if (failure.ok()) failure = std::move(status);
    work_cv.notify_all();
    ready_cv.notify_all();
  }

  std::size_t slot_limit() const {
    return std::min(device_slot_limit, controller.depth() + std::max<std::size_t>(held, 1));
  }

  bool can_issue() const {
    if (issuing || alloc_blocked || next_issue >= total_batches) return false;
    if (next_issue - next_consume >= controller.depth()) return false;
    return !free_slots.empty() || live_slots < slot_limit();
  }

  void note_pinned_peak() { pinned_peak = std::max(pinned_peak, pool->bytes_reserved()); }

  // The copy that last used `slot` is complete (blocking only if it is not): add its time.
  Status account_copy(Slot& slot, std::unique_lock<std::mutex>* lock) {
#if GPUOPT_CUDA
    if (!slot.copy_recorded) return ok_status();
    GPUOPT_RETURN_IF_ERROR(slot.ready.synchronize());
    GPUOPT_ASSIGN_OR_RETURN(float ms, runtime::Event::elapsed_ms(slot.copy_start, slot.ready));
    slot.copy_recorded = false;
    if (lock != nullptr) lock->lock();
    h2d_s += ms / 1000.0;
    h2d_bytes += slot.copy_bytes;
    if (lock != nullptr) lock->unlock();
#endif
    return ok_status();
  }

  StatusOr<std::unique_ptr<Slot>> make_slot() {
    auto slot = std::make_unique<Slot>();
#if GPUOPT_CUDA
    if (gpu) {
      GPUOPT_ASSIGN_OR_RETURN(slot->copy_start, runtime::Event::create(true));
      GPUOPT_ASSIGN_OR_RETURN(slot->ready, runtime::Event::create(true));
      GPUOPT_ASSIGN_OR_RETURN(slot->consumer_done, runtime::Event::create(false));
      GPUOPT_ASSIGN_OR_RETURN(slot->device, runtime::DeviceBuffer::allocate(batch_bytes));
      if (direct != nullptr) {
        Status registered = direct->register_buffer(slot->device.data(), batch_bytes);
        slot->registered = registered.ok();
        if (!registered.ok()) {
          std::lock_guard<std::mutex> guard(mutex);
          if (register_failure.empty()) register_failure = registered.message();
        }
      }
    }
#endif
    return slot;
  }

  void destroy_slot(std::unique_ptr<Slot>& slot) {
    if (!slot) return;
    if (slot->has_staging) {
      pool->release(std::move(slot->staging), nullptr);
      slot->has_staging = false;
    }
#if GPUOPT_CUDA
    if (!slot->device.empty()) {
      if (slot->consumer_recorded)
        GPUOPT_CUDA_TRY_NO_THROW(
            cudaEventSynchronize(static_cast<cudaEvent_t>(slot->consumer_done.handle())));
      (void)account_copy(*slot, nullptr);
      if (slot->ready_recorded)
        GPUOPT_CUDA_TRY_NO_THROW(
            cudaEventSynchronize(static_cast<cudaEvent_t>(slot->ready.handle())));
      if (slot->registered) direct->deregister_buffer(slot->device.data());
      slot->device.reset();
      device_bytes -= batch_bytes;
    }
#endif
    slot.reset();
  }

  // With the lock held and can_issue() true: fetch memory without the lock, then publish the
  // batch's tasks. Only one worker is here at a time (`issuing`).
  void issue_batch(std::unique_lock<std::mutex>& lock) {
    issuing = true;
    int id = -1;
    bool fresh = false;
    if (!free_slots.empty()) {
      id = free_slots.back();
      free_slots.pop_back();
    } else {
      fresh = true;
      ++live_slots;  // reserved; undone below if the allocation fails
    }
    std::unique_ptr<Slot> created;
    Slot* reused = fresh ? nullptr : slots[id].get();
    lock.unlock();
    Status status;
    if (fresh) {
      auto made = make_slot();
      if (made.ok()) {
        created = std::move(made).value();
      } else {
        status = made.status();
      }
    }
    runtime::PinnedBlock block;
    if (status.ok() && direct != nullptr && reused != nullptr) {
      // Direct reads write the device buffer from this thread, outside any stream: wait here
      // until the consumer's stream (and our own compaction copies) are done with it.
      status = wait_for_device_reuse(*reused);
    }
    if (status.ok() && direct == nullptr) {
      auto acquired = pool->acquire(batch_bytes, nullptr);
      if (acquired.ok()) {
        block = std::move(acquired).value();
      } else {
        status = acquired.status();
      }
    }
    if (status.ok() && reused != nullptr) {
      // The slot's previous copy is long done in steady state; this only collects its timing.
      status = account_copy(*reused, &lock);
    }
    lock.lock();
    issuing = false;
    if (fresh && created) {
      device_bytes += gpu ? batch_bytes : 0;
      device_peak = std::max(device_peak, device_bytes);
      slots.push_back(std::move(created));
      id = static_cast<int>(slots.size()) - 1;
    }
    note_pinned_peak();
    if (!status.ok()) {
      if (fresh && id < 0) --live_slots;
      if (block.data != nullptr) pool->release(std::move(block), nullptr);
      if (id >= 0) free_slots.push_back(id);
      if (status.code() != StatusCode::kResourceExhausted) {
        fail_locked(status);
        return;
      }
      if (in_flight.empty() && held == 0) {
        fail_locked(resource_exhausted(
            fmt::format("not even one batch fits: {} (batch {} B, pinned budget {} B)",
                        status.message(), batch_bytes, options.pinned_budget_bytes)));
        return;
      }
      // Memory is short: shrink to what is in use and wait for a release before trying again.
      std::size_t in_use = in_flight.size();
      record_decision(controller.memory_pressure(in_use, now_s(), batches, status.message()));
      alloc_blocked = true;
      work_cv.notify_all();
      ready_cv.notify_all();  // a consumer waiting with nothing in flight must see starved()
      return;
    }
    if (stopping || !failure.ok()) {
      if (block.data != nullptr) pool->release(std::move(block), nullptr);
      free_slots.push_back(id);
      return;
    }
    Slot& slot = *slots[id];
    if (block.data != nullptr) {
      slot.staging = std::move(block);
      slot.has_staging = true;
    }
    slot.sequence = next_issue++;
    slot.epoch = static_cast<std::size_t>(slot.sequence / batches_per_epoch);
    if (slot.epoch != order_epoch) {
      order = sampler.epoch_order(slot.epoch);
      order_epoch = slot.epoch;
    }
    std::size_t first =
        static_cast<std::size_t>(slot.sequence % batches_per_epoch) * options.batch_size;
    std::size_t count = std::min(options.batch_size, order.size() - first);
    slot.indices.assign(order.begin() + static_cast<std::ptrdiff_t>(first),
                        order.begin() + static_cast<std::ptrdiff_t>(first + count));
    slot.failed.assign(count, 0);
    slot.remaining = count;
    slot.collated = false;
    in_flight.emplace(slot.sequence, id);
    for (std::size_t position = 0; position < count; ++position) tasks.push_back({id, position});
    work_cv.notify_all();
  }

  Status wait_for_device_reuse(Slot& slot) {
#if GPUOPT_CUDA
    if (slot.consumer_recorded) GPUOPT_RETURN_IF_ERROR(slot.consumer_done.synchronize());
    slot.consumer_recorded = false;
    if (slot.ready_recorded) GPUOPT_RETURN_IF_ERROR(slot.ready.synchronize());
    slot.ready_recorded = false;
#endif
    (void)slot;
    return ok_status();
  }

  // Direct reads: the samples are already in device memory. Skipped samples are squeezed out with
  // device-to-device copies (disjoint ranges, in order, on the copy stream); `ready` follows them.
  Status complete_direct_batch(Slot& slot) {
#if GPUOPT_CUDA
    auto stream = static_cast<cudaStream_t>(copy_stream.handle());
    auto* base = slot.device.data_as<std::byte>();
    std::size_t kept = 0;
    std::vector<std::size_t> indices;
    indices.reserve(slot.indices.size());
    for (std::size_t position = 0; position < slot.indices.size(); ++position) {
      if (slot.failed[position]) continue;
      if (kept != position) {
        GPUOPT_CUDA_TRY(cudaMemcpyAsync(base + kept * sample_bytes, base + position * sample_bytes,
                                        sample_bytes, cudaMemcpyDeviceToDevice, stream));
      }
      indices.push_back(slot.indices[position]);
      ++kept;
    }
    slot.indices = std::move(indices);
    GPUOPT_RETURN_IF_ERROR(slot.ready.record(copy_stream));
    slot.ready_recorded = true;
#endif
    (void)slot;
    return ok_status();
  }

  // Without the lock: the completing worker owns `slot`. Drops skipped samples, queues the copy.
  Status complete_batch(Slot& slot) {
    if (direct != nullptr) return complete_direct_batch(slot);
    std::size_t kept = 0;
    std::vector<std::size_t> indices;
    indices.reserve(slot.indices.size());
    auto* base = static_cast<std::byte*>(slot.staging.data);
    for (std::size_t position = 0; position < slot.indices.size(); ++position) {
      if (slot.failed[position]) continue;
      if (kept != position) {
        std::memmove(base + kept * sample_bytes, base + position * sample_bytes, sample_bytes);
      }
      indices.push_back(slot.indices[position]);
      ++kept;
    }
    slot.indices = std::move(indices);
#if GPUOPT_CUDA
    if (gpu && kept > 0) {
      auto stream = static_cast<cudaStream_t>(copy_stream.handle());
      // Device-buffer reuse is ordered on the GPU: the copy waits for the consumer's last use.
      if (slot.consumer_recorded) GPUOPT_RETURN_IF_ERROR(copy_stream.wait(slot.consumer_done));
      slot.consumer_recorded = false;
      GPUOPT_RETURN_IF_ERROR(slot.copy_start.record(copy_stream));
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(slot.device.data(), base, kept * sample_bytes,
                                      cudaMemcpyHostToDevice, stream));
      GPUOPT_RETURN_IF_ERROR(slot.ready.record(copy_stream));
      slot.copy_recorded = true;
      slot.copy_bytes = kept * sample_bytes;
      // Stream-ordered: the pool hands this block out again only after the copy completes.
      pool->release(std::move(slot.staging), copy_stream.handle());
      slot.has_staging = false;
    }
#endif
    return ok_status();
  }

  void worker_main() {
#if GPUOPT_CUDA
    if (device) {
      Status current = device->make_current();
      if (!current.ok()) {
        std::lock_guard<std::mutex> guard(mutex);
        fail_locked(current);
        return;
      }
    }
#endif
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      work_cv.wait(lock,
                   [&] { return stopping || !failure.ok() || !tasks.empty() || can_issue(); });
      if (stopping || !failure.ok()) return;
      if (tasks.empty()) {
        issue_batch(lock);
        continue;
      }
      Task task = tasks.front();
      tasks.pop_front();
      Slot& slot = *slots[task.slot];
      std::size_t index = slot.indices[task.position];
      std::size_t epoch = slot.epoch;
      std::span<std::byte> destination;
      if (slot.has_staging) {
        destination = std::span<std::byte>(
            static_cast<std::byte*>(slot.staging.data) + task.position * sample_bytes,
            sample_bytes);
      }
      void* device_base = slot.device.data();
      lock.unlock();

      auto began = Clock::now();
      Status status;
      bool threw = false;
      try {
        status = direct != nullptr ? direct->read(index, device_base, task.position * sample_bytes)
                                   : dataset->read(index, destination);
      } catch (const std::exception& error) {
        threw = true;
        status = internal_error(
            fmt::format("worker exception while reading sample {}: {}", index, error.what()));
      } catch (...) {
        threw = true;
        status = internal_error(
            fmt::format("worker exception while reading sample {}: unknown exception", index));
      }
      double busy = seconds_between(began, Clock::now());

      lock.lock();
      busy_s += busy;
      ++samples_read;
      if (!status.ok()) {
        if (threw || options.on_error == ErrorPolicy::kStop) {
          fail_locked(status.with_context(fmt::format("epoch {}", epoch)));
          return;
        }
        ++skipped;
        if (failures.size() < options.max_recorded_failures) {
          failures.push_back({index, epoch, status.message()});
        }
        slot.failed[task.position] = 1;
      }
      if (--slot.remaining != 0) continue;
      lock.unlock();
      Status completed = complete_batch(slot);
      lock.lock();
      if (!completed.ok()) {
        fail_locked(completed);
        return;
      }
      slot.collated = true;
      note_pinned_peak();
      ready_cv.notify_all();
      work_cv.notify_all();  // a staging block went back to the pool
      alloc_blocked = false;
    }
  }

  // A slot the consumer no longer needs (or an empty batch): free it or keep it for reuse.
  void recycle_locked(int id) {
    Slot& slot = *slots[id];
    if (slot.has_staging) {
      pool->release(std::move(slot.staging), nullptr);
      slot.has_staging = false;
    }
    if (live_slots > slot_limit()) {
      destroy_slot(slots[id]);
      --live_slots;
    } else {
      free_slots.push_back(id);
    }
    alloc_blocked = false;
    work_cv.notify_all();
  }

  // Nothing is in flight and nothing can be issued: only the consumer's releases could free
  // memory, and it is waiting in next(). Reported instead of hanging.
  bool starved() const {
    return in_flight.empty() && !issuing && next_issue < total_batches && !can_issue() &&
           (alloc_blocked || (free_slots.empty() && live_slots >= slot_limit()));
  }

  bool memory_short() const {
    if (options.memory_pressure_probe && options.memory_pressure_probe()) return true;
#if GPUOPT_CUDA
    if (gpu) {
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        return static_cast<double>(free_bytes) < options.headroom * total_bytes;
      }
      (void)cudaGetLastError();
    }
#endif
    return false;
  }

  std::optional<double> producer_capacity() const {
    if (samples_read == 0 || busy_s <= 0) return std::nullopt;
    double per_sample_s = busy_s / static_cast<double>(samples_read);
    return options.workers / (per_sample_s * static_cast<double>(options.batch_size));
  }

  void observe_window_locked(Clock::time_point now) {
    WindowObservation window;
    window.wall_s = seconds_between(window_start, now);
    window.consumer_wait_s = window_wait_s;
    window.batches = window_batches;
    window.producer_capacity_batches_per_s = producer_capacity();
    window.memory_pressure = memory_short();
    std::size_t before = controller.depth();
    record_decision(controller.observe(window, seconds_between(start, now), batches));
    if (controller.depth() != before) work_cv.notify_all();
    window_start = now;
    window_wait_s = 0;
    window_batches = 0;
  }
};

Status Batch::wait_on(runtime::StreamHandle stream) const {
#if GPUOPT_CUDA
  if (ready_event_ == nullptr) return ok_status();
  if (stream == nullptr) return invalid_argument("Batch::wait_on: null stream");
  GPUOPT_CUDA_TRY(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                      static_cast<cudaEvent_t>(ready_event_), 0));
#endif
  return ok_status();
}

Loader::Loader(std::unique_ptr<State> state) : state_(std::move(state)) {}

StatusOr<std::unique_ptr<Loader>> Loader::create(std::shared_ptr<Dataset> dataset,
                                                 LoaderOptions options) {
  if (!dataset) return invalid_argument("loader: no dataset");
  if (options.batch_size == 0) return invalid_argument("loader: batch size must be > 0");
  if (options.workers <= 0 || options.workers > 1024) {
    return invalid_argument(fmt::format("loader: {} workers (want 1..1024)", options.workers));
  }
  if (dataset->sample_bytes() == 0) return invalid_argument("loader: dataset has 0-byte samples");
  if (options.headroom < 0 || options.headroom >= 1) {
    return invalid_argument(fmt::format("loader: headroom {} must be in [0, 1)", options.headroom));
  }
  auto state = std::make_unique<State>();
  state->dataset = dataset;
  state->options = options;
  state->sampler = Sampler(dataset->size(), options.sampler);
  state->sample_bytes = dataset->sample_bytes();
  state->batch_bytes = state->sample_bytes * options.batch_size;
  state->batches_per_epoch = state->sampler.batches_per_epoch(options.batch_size);
  if (state->batches_per_epoch == 0) {
    return invalid_argument(
        fmt::format("loader: {} samples make no batch of {}", dataset->size(), options.batch_size));
  }
  state->total_batches = static_cast<std::uint64_t>(state->batches_per_epoch) * options.epochs;
  state->gpu = options.mode == LoaderMode::kGpu;

  DepthBudget budget;
  budget.batch_bytes = state->batch_bytes;
  budget.pinned_budget_bytes = options.pinned_budget_bytes;
  budget.headroom = options.headroom;
  runtime::HostMemory memory = runtime::HostMemory::kPageable;
  if (state->gpu) {
#if GPUOPT_CUDA
    GPUOPT_ASSIGN_OR_RETURN(auto device, runtime::Device::open(options.device));
    state->device = std::move(device);
    GPUOPT_ASSIGN_OR_RETURN(state->copy_stream, runtime::Stream::create(*state->device));
    std::size_t device_budget = options.device_budget_bytes;
    if (device_budget == 0) {
      std::size_t free_bytes = 0, total_bytes = 0;
      GPUOPT_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
      device_budget = free_bytes;
    }
    budget.device_budget_bytes = device_budget;
    state->device_slot_limit = static_cast<std::size_t>(
        static_cast<double>(device_budget) * (1 - options.headroom) / state->batch_bytes);
    memory = runtime::HostMemory::kPinned;
    if (options.device_reads) state->direct = dataset->device_reader();
#else
    return unimplemented("loader: GPU mode needs a build with CUDA (use CPU mode)");
#endif
  }
  std::size_t bound = depth_upper_bound(budget, options.depth.max_depth);
  if (bound == 0) {
    return resource_exhausted(fmt::format(
        "loader: a batch of {} B plus headroom {:.0f}% does not fit the budgets (pinned {} B{})",
        state->batch_bytes, 100 * options.headroom, options.pinned_budget_bytes,
        budget.device_budget_bytes ? fmt::format(", device {} B", *budget.device_budget_bytes)
                                   : std::string()));
  }
  state->controller = DepthController(options.depth, bound);
  state->max_depth_reached = state->controller.depth();
  state->timeline.push_back({0, 0, state->controller.depth(),
                             fmt::format("initial ({}; upper bound {} from the memory budgets)",
                                         options.depth.adaptive ? "adaptive" : "fixed", bound)});

  runtime::PinnedPoolOptions pool_options;
  pool_options.max_bytes = options.pinned_budget_bytes;
  // One slab per batch: no fragmentation, so the budget holds exactly floor(budget / batch).
  pool_options.slab_bytes = (state->batch_bytes + runtime::PinnedPool::kAlignment - 1) /
                            runtime::PinnedPool::kAlignment * runtime::PinnedPool::kAlignment;
  pool_options.memory = memory;
  GPUOPT_ASSIGN_OR_RETURN(state->pool, runtime::PinnedPool::create(pool_options));
  if (state->direct != nullptr) {
    state->io = "cufile";
    state->io_detail = state->direct->describe();
    state->notes =
        fmt::format("{}; batches read by cuFile straight into device buffers", dataset->describe());
  } else {
    state->io_detail = state->gpu ? "pread into pinned staging, then a host-to-device copy"
                                  : "Dataset::read into host staging (CPU mode)";
    state->notes =
        fmt::format("{}; staging: {} pool, budget {} B", dataset->describe(),
                    state->pool->pinned() ? "pinned" : "pageable", options.pinned_budget_bytes);
  }

  State* raw = state.get();
  for (int i = 0; i < options.workers; ++i) {
    raw->workers.emplace_back([raw] { raw->worker_main(); });
  }
  return std::unique_ptr<Loader>(new Loader(std::move(state)));
}

Loader::~Loader() {
  stop();
  for (auto& worker : state_->workers) worker.join();
  std::lock_guard<std::mutex> guard(state_->mutex);
#if GPUOPT_CUDA
  if (state_->gpu)
    GPUOPT_CUDA_TRY_NO_THROW(
        cudaStreamSynchronize(static_cast<cudaStream_t>(state_->copy_stream.handle())));
#endif
  for (auto& slot : state_->slots) state_->destroy_slot(slot);
}

void Loader::stop() {
  std::lock_guard<std::mutex> guard(state_->mutex);
  state_->stopping = true;
  state_->work_cv.notify_all();
  state_->ready_cv.notify_all();
}

StatusOr<std::optional<Batch>> Loader::next() { return next_for(-1); }

StatusOr<std::optional<Batch>> Loader::next_for(double timeout_s) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.started) {
    s.started = true;
    s.start = Clock::now();
    s.window_start = s.start;
  }
  while (true) {
    auto began = Clock::now();
    auto ready = [&] {
      if (s.stopping || !s.failure.ok() || s.next_consume >= s.total_batches) return true;
      if (s.starved()) return true;
      auto it = s.in_flight.find(s.next_consume);
      return it != s.in_flight.end() && s.slots[it->second]->collated;
    };
    bool arrived = true;
    if (timeout_s < 0) {
      s.ready_cv.wait(lock, ready);
    } else {
      arrived = s.ready_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
    }
    auto now = Clock::now();
    double waited = seconds_between(began, now);
    s.wait_s += waited;
    s.window_wait_s += waited;
    if (!arrived) {
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("loader: no batch within {} s", timeout_s));
    }
    if (!s.failure.ok()) return s.failure;
    if (s.stopping) return Status(StatusCode::kCancelled, "loader stopped");
    if (s.next_consume < s.total_batches && s.starved()) {
      return resource_exhausted(fmt::format(
          "loader: the memory budgets hold no batch beyond the {} the consumer holds (batch {} "
          "B, pinned budget {} B): release batches before asking for more",
          s.held, s.batch_bytes, s.options.pinned_budget_bytes));
    }
    if (s.next_consume >= s.total_batches) {
      if (!s.ended) {
        s.ended = true;
        s.end = now;
      }
      return std::optional<Batch>();
    }
    int id = s.in_flight.at(s.next_consume);
    s.in_flight.erase(s.next_consume);
    ++s.next_consume;
    Slot& slot = *s.slots[id];
    if (slot.indices.empty()) {  // every sample was skipped
      s.recycle_locked(id);
      continue;
    }
    Batch batch;
    batch.sequence_ = slot.sequence;
    batch.epoch_ = slot.epoch;
    batch.indices_ = slot.indices;
    batch.bytes_ = slot.indices.size() * s.sample_bytes;
    batch.host_ = slot.has_staging ? static_cast<const std::byte*>(slot.staging.data) : nullptr;
    batch.device_ = slot.device.data();
#if GPUOPT_CUDA
    if (s.gpu) batch.ready_event_ = slot.ready.handle();
#endif
    batch.slot_ = id;
    ++s.held;
    ++s.batches;
    s.samples += batch.size();
    if (s.batches == 1) {
      // Start-up (the workers starting, the first batch made) is not a stall a deeper queue could
      // have covered: the first window opens when the first batch is handed out.
      s.window_start = now;
      s.window_wait_s = 0;
    } else if (++s.window_batches >= std::max<std::size_t>(1, s.options.depth.window_batches)) {
      s.observe_window_locked(now);
    }
    s.work_cv.notify_all();
    return std::optional<Batch>(std::move(batch));
  }
}

Status Loader::release(Batch& batch, runtime::StreamHandle consumer_stream) {
  State& s = *state_;
  if (batch.slot_ < 0) return invalid_argument("loader: release of an empty or released batch");
  std::lock_guard<std::mutex> guard(s.mutex);
  if (static_cast<std::size_t>(batch.slot_) >= s.slots.size() || !s.slots[batch.slot_]) {
    return invalid_argument("loader: release of a batch this loader does not hold");
  }
  Slot& slot = *s.slots[batch.slot_];
#if GPUOPT_CUDA
  if (s.gpu && consumer_stream != nullptr) {
    GPUOPT_RETURN_IF_ERROR(slot.consumer_done.record(consumer_stream));
    slot.consumer_recorded = true;
  }
#endif
  (void)slot;
  --s.held;
  s.recycle_locked(batch.slot_);
  batch.slot_ = -1;
  batch.host_ = nullptr;
  batch.device_ = nullptr;
  batch.ready_event_ = nullptr;
  return ok_status();
}

std::size_t Loader::depth() const {
  std::lock_guard<std::mutex> guard(state_->mutex);
  return state_->controller.depth();
}

const LoaderOptions& Loader::options() const { return state_->options; }
const std::string& Loader::notes() const { return state_->notes; }

LoaderStats Loader::stats() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> guard(s.mutex);
  LoaderStats stats;
  auto end = s.ended ? s.end : Clock::now();
  stats.wall_s = s.started ? seconds_between(s.start, end) : 0;
  stats.consumer_wait_s = s.wait_s;
  stats.wait_fraction = stats.wall_s > 0 ? s.wait_s / stats.wall_s : 0;
  stats.batches = s.batches;
  stats.samples = s.samples;
  stats.skipped_samples = s.skipped;
  stats.failures = s.failures;
  stats.depth_timeline = s.timeline;
  stats.depth = s.controller.depth();
  stats.max_depth_reached = s.max_depth_reached;
  stats.depth_upper_bound = s.controller.upper_bound();
  stats.batch_bytes = s.batch_bytes;
  stats.pinned_budget_bytes = s.options.pinned_budget_bytes;
  stats.pinned_bytes_peak = std::max(s.pinned_peak, s.pool->bytes_reserved());
  stats.device_bytes_peak = s.device_peak;
  stats.h2d_bytes = s.h2d_bytes;
  if (s.h2d_s > 0) stats.h2d_gbps = static_cast<double>(s.h2d_bytes) / s.h2d_s / 1e9;
  stats.worker_utilization = stats.wall_s > 0 ? s.busy_s / (s.options.workers * stats.wall_s) : 0;
  stats.producer_capacity_batches_per_s = s.producer_capacity();
  stats.consumer_rate_batches_per_s = stats.wall_s > 0 ? s.batches / stats.wall_s : 0;
  stats.staging = s.direct != nullptr ? "none (cuFile)" : s.pool->pinned() ? "pinned" : "pageable";
  stats.io = s.io;
  stats.io_detail = s.io_detail;
  if (!s.register_failure.empty()) {
    stats.io_detail +=
        fmt::format("; {} (reads bounce through cuFile's buffers)", s.register_failure);
  }
  return stats;
}

nlohmann::json to_json(const LoaderStats& stats) {
  nlohmann::json timeline = nlohmann::json::array();
  for (const auto& d : stats.depth_timeline) {
    timeline.push_back(
        {{"time_s", d.time_s}, {"batch", d.batch}, {"depth", d.depth}, {"reason", d.reason}});
  }
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : stats.failures) {
    failures.push_back({{"index", f.index}, {"epoch", f.epoch}, {"message", f.message}});
  }
  auto optional = [](const std::optional<double>& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  return {{"wall_s", stats.wall_s},
          {"consumer_wait_s", stats.consumer_wait_s},
          {"wait_fraction", stats.wait_fraction},
          {"batches", stats.batches},
          {"samples", stats.samples},
          {"skipped_samples", stats.skipped_samples},
          {"failures", failures},
          {"depth", stats.depth},
          {"max_depth_reached", stats.max_depth_reached},
          {"depth_upper_bound", stats.depth_upper_bound},
          {"depth_timeline", timeline},
          {"batch_bytes", stats.batch_bytes},
          {"pinned_budget_bytes", stats.pinned_budget_bytes},
          {"pinned_bytes_peak", stats.pinned_bytes_peak},
          {"device_bytes_peak", stats.device_bytes_peak},
          {"h2d_bytes", stats.h2d_bytes},
          {"h2d_gbps", optional(stats.h2d_gbps)},
          {"worker_utilization", stats.worker_utilization},
          {"producer_capacity_batches_per_s", optional(stats.producer_capacity_batches_per_s)},
          {"consumer_rate_batches_per_s", stats.consumer_rate_batches_per_s},
          {"staging", stats.staging},
          {"io", stats.io},
          {"io_detail", stats.io_detail}};
}

}  // namespace gpuopt::data
