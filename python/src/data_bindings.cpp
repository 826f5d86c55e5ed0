// gpuopt.data's native half: the depth controller, the staging engine behind prefetch() (pinned
// pool chunks filled by parallel host copies without the GIL, host-to-device copies on a dedicated
// stream, one event per batch) and the C++ Loader over record files and JPEG folders, whose GPU
// batches reach Python as zero-copy torch tensors (DLPack) that give their slot back when freed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpuopt/data/dataset.hpp"
#include "gpuopt/data/depth_controller.hpp"
#include "gpuopt/data/loader.hpp"
#include "gpuopt/data/sampler.hpp"
#include "gpuopt/runtime/pinned_pool.hpp"
#include "gpuopt/runtime/stream.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

#include "gpuopt/core/cuda_check.hpp"
#endif

namespace nb = nanobind;

namespace gpuopt::python {
namespace {

// ---- depth controller ---------------------------------------------------------------------------
class PyDepthController {
 public:
  PyDepthController(bool adaptive, std::size_t initial_depth, std::size_t min_depth,
                    std::size_t max_depth, std::size_t window_batches, std::size_t upper_bound)
      : controller_(make_options(adaptive, initial_depth, min_depth, max_depth, window_batches),
                    upper_bound) {}

  // Feeds one window; (depth, reason) when the controller decided something worth showing.
  std::optional<std::tuple<std::size_t, std::string>> observe(double wall_s, double wait_s,
                                                              std::size_t batches,
                                                              std::optional<double> capacity,
                                                              bool memory_pressure, double now_s,
                                                              std::uint64_t batch) {
    data::WindowObservation window;
    window.wall_s = wall_s;
    window.consumer_wait_s = wait_s;
    window.batches = batches;
    window.producer_capacity_batches_per_s = capacity;
    window.memory_pressure = memory_pressure;
    auto decision = controller_.observe(window, now_s, batch);
    if (!decision) return std::nullopt;
    return std::make_tuple(decision->depth, decision->reason);
  }
  std::size_t depth() const { return controller_.depth(); }
  std::size_t upper_bound() const { return controller_.upper_bound(); }

 private:
  static data::ControllerOptions make_options(bool adaptive, std::size_t initial_depth,
                                              std::size_t min_depth, std::size_t max_depth,
                                              std::size_t window_batches) {
    if (initial_depth == 0 || max_depth == 0 || window_batches == 0) {
      throw StatusError(invalid_argument(
          "depth controller: initial_depth, max_depth and window_batches must be > 0"));
    }
    data::ControllerOptions options;
    options.adaptive = adaptive;
    options.initial_depth = initial_depth;
    options.min_depth = min_depth;
    options.max_depth = max_depth;
    options.window_batches = window_batches;
    return options;
  }
  data::DepthController controller_;
};

// ---- parallel host copies -----------------------------------------------------------------------
// Persistent threads that split one memcpy: a single thread copying pageable memory into pinned
// memory runs well below PCIe rates, several together approach them.
class ParallelCopier {
 public:
  explicit ParallelCopier(int threads) {
    for (int i = 1; i < threads; ++i) copy_workers_.emplace_back([this, i] { run(i); });
    parts_ = std::max(1, threads);
  }
  ~ParallelCopier() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stopping_ = true;
    }
    start_cv_.notify_all();
    for (auto& thread : copy_workers_) thread.join();
  }
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // Copies n bytes; the caller's thread does part 0. One copy at a time (callers serialise).
  void copy(void* dst, const void* src, std::size_t n) {
    constexpr std::size_t kMinPart = std::size_t{1} << 20;
    if (copy_workers_.empty() || n < 2 * kMinPart) {
      std::memcpy(dst, src, n);
      return;
    }
    {
      std::lock_guard<std::mutex> guard(mutex_);
      dst_ = static_cast<std::byte*>(dst);
      src_ = static_cast<const std::byte*>(src);
      bytes_ = n;
      active_ = static_cast<int>(std::min<std::size_t>(parts_, n / kMinPart));
      pending_ = active_ - 1;
      ++generation_;
    }
    start_cv_.notify_all();
    copy_part(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void copy_part(int part) {
    std::size_t per = (bytes_ / static_cast<std::size_t>(active_) + 63) / 64 * 64;
    std::size_t begin = std::min(bytes_, per * static_cast<std::size_t>(part));
    std::size_t end = part == active_ - 1 ? bytes_ : std::min(bytes_, begin + per);
    if (end > begin) std::memcpy(dst_ + begin, src_ + begin, end - begin);
  }
  void run(int part) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (part >= active_) continue;
      lock.unlock();
      copy_part(part);
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> copy_workers_;
  int parts_ = 1;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  bool stopping_ = false;
  std::uint64_t generation_ = 0;
  std::byte* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  std::size_t bytes_ = 0;
  int active_ = 0;
  int pending_ = 0;
};

// ---- the staging engine of prefetch() -----------------------------------------------------------
// stage() copies a batch's leaves (host pointers) into device memory the caller allocated: a
// pageable leaf goes through pinned pool chunks (host copy, then cudaMemcpyAsync on the copy
// stream; the chunk returns to the pool on that stream, so it is refilled only after its copy
// completed), a pinned leaf is copied directly. Returns a token; wait(token, stream) makes the
// consumer's stream wait on the batch's event.
class PyStager {
 public:
  PyStager(int device, std::size_t pinned_budget_bytes, std::size_t chunk_bytes, int copy_threads) {
#if GPUOPT_CUDA
    if (chunk_bytes == 0 || pinned_budget_bytes < chunk_bytes) {
      throw StatusError(invalid_argument(
          "stager: chunk_bytes must be > 0 and at most pinned_budget_bytes (" +
          std::to_string(chunk_bytes) + " > " + std::to_string(pinned_budget_bytes) + ")"));
    }
    if (copy_threads < 1 || copy_threads > 64) {
      throw StatusError(invalid_argument("stager: copy_threads must be in 1..64, got " +
                                         std::to_string(copy_threads)));
    }
    nb::gil_scoped_release release;
    int caller_device = 0;
    throw_if_error(GPUOPT_CUDA_STATUS(cudaGetDevice(&caller_device)));
    device_.emplace(value_or_throw(runtime::Device::open(device)));
    stream_ = value_or_throw(runtime::Stream::create(*device_));
    // Stream::create made `device` current: give the caller's thread its own device back.
    throw_if_error(GPUOPT_CUDA_STATUS(cudaSetDevice(caller_device)));
    runtime::PinnedPoolOptions options;
    options.max_bytes = pinned_budget_bytes;
    chunk_bytes_ = (chunk_bytes + runtime::PinnedPool::kAlignment - 1) /
                   runtime::PinnedPool::kAlignment * runtime::PinnedPool::kAlignment;
    options.slab_bytes = chunk_bytes_;
    options.memory = runtime::HostMemory::kPinned;
    pool_ = value_or_throw(runtime::PinnedPool::create(options));
    copier_ = std::make_unique<ParallelCopier>(copy_threads);
#else
    (void)device;
    (void)pinned_budget_bytes;
    (void)chunk_bytes;
    (void)copy_threads;
    throw StatusError(unimplemented("gpuopt.data staging needs a build with CUDA"));
#endif
  }
  PyStager(const PyStager&) = delete;
  PyStager& operator=(const PyStager&) = delete;
  ~PyStager() { close(); }

  std::uintptr_t stream() const { return reinterpret_cast<std::uintptr_t>(stream_.handle()); }

  // copies: (source host pointer, destination device pointer, bytes, source is pinned).
  std::uint64_t stage(
      const std::vector<std::tuple<std::uintptr_t, std::uintptr_t, std::size_t, bool>>& copies) {
#if GPUOPT_CUDA
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> staging(stage_mutex_);  // one batch at a time on the stream
    require_open();
    throw_if_error(device_->make_current());
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    Pending pending;
    pending.start = value_or_throw(runtime::Event::create(true));
    pending.ready = value_or_throw(runtime::Event::create(true));
    throw_if_error(pending.start.record(stream_));
    for (const auto& [source, destination, bytes, pinned] : copies) {
      if (bytes == 0) continue;
      auto* src = reinterpret_cast<const std::byte*>(source);
      auto* dst = reinterpret_cast<std::byte*>(destination);
      if (pinned) {
        throw_if_error(
            GPUOPT_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream)));
      } else {
        for (std::size_t offset = 0; offset < bytes; offset += chunk_bytes_) {
          std::size_t n = std::min(chunk_bytes_, bytes - offset);
          runtime::PinnedBlock block = value_or_throw(pool_->acquire(n, stream_.handle()));
          copier_->copy(block.data, src + offset, n);
          cudaError_t copied =
              cudaMemcpyAsync(dst + offset, block.data, n, cudaMemcpyHostToDevice, stream);
          pool_->release(std::move(block), stream_.handle());
          throw_if_error(GPUOPT_CUDA_STATUS(copied));
        }
      }
      pending.bytes += bytes;
    }
    throw_if_error(pending.ready.record(stream_));
    std::lock_guard<std::mutex> guard(mutex_);
    std::uint64_t token = ++next_token_;
    pending_.emplace(token, std::move(pending));
    sweep_locked();
    return token;
#else
    (void)copies;
    return 0;
#endif
  }

  // Makes `consumer_stream` wait for the batch (no host sync); the token is then done with.
  void wait(std::uint64_t token, std::uintptr_t consumer_stream, bool synchronize) {
#if GPUOPT_CUDA
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = pending_.find(token);
    if (it == pending_.end()) return;  // complete and swept: nothing to wait for
    if (synchronize) {
      throw_if_error(it->second.ready.synchronize());
    } else {
      throw_if_error(GPUOPT_CUDA_STATUS(
          cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(consumer_stream),
                              static_cast<cudaEvent_t>(it->second.ready.handle()), 0)));
    }
    it->second.handed_out = true;
    sweep_locked();
#else
    (void)token;
    (void)consumer_stream;
    (void)synchronize;
#endif
  }

  // A batch that will never be handed out (the pass stopped): forget it once its copy completes.
  void discard(std::uint64_t token) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = pending_.find(token);
    if (it != pending_.end()) it->second.handed_out = true;
    sweep_locked();
  }

  // True when the batch's copies completed (its pinned sources may be freed).
  bool done(std::uint64_t token) {
#if GPUOPT_CUDA
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = pending_.find(token);
    if (it == pending_.end()) return true;
    return value_or_throw(it->second.ready.query());
#else
    (void)token;
    return true;
#endif
  }

  void synchronize() {
#if GPUOPT_CUDA
    nb::gil_scoped_release release;
    if (!pool_) return;
    throw_if_error(stream_.synchronize());
    std::lock_guard<std::mutex> guard(mutex_);
    sweep_locked();
#endif
  }

  nb::dict stats() {
    std::lock_guard<std::mutex> guard(mutex_);
    sweep_locked();
    nb::dict result;
    result["batches"] = batches_;
    result["h2d_bytes"] = h2d_bytes_;
    result["h2d_s"] = h2d_s_;
    result["h2d_gbps"] =
        h2d_s_ > 0 ? nb::cast(static_cast<double>(h2d_bytes_) / h2d_s_ / 1e9) : nb::none();
    result["pending"] = pending_.size();
    result["chunk_bytes"] = chunk_bytes_;
    if (pool_) {
      auto pool = pool_->stats();
      result["pinned_bytes_reserved"] = pool_->bytes_reserved();
      result["pinned_budget_bytes"] = pool_->options().max_bytes;
      result["pinned_host_waits"] = pool.host_waits;
    }
    return result;
  }

  // Waits for every copy and frees the pool and the stream (idempotent).
  void close() {
#if GPUOPT_CUDA
    std::lock_guard<std::mutex> staging(stage_mutex_);
    if (!pool_) return;
    (void)stream_.synchronize();
    {
      std::lock_guard<std::mutex> guard(mutex_);
      pending_.clear();
    }
    copier_.reset();
    pool_.reset();  // the stream stays: torch's allocator may still name it for staged tensors
#endif
  }

 private:
  struct Pending {
    runtime::Event start, ready;  // timing events around the batch's copies
    std::size_t bytes = 0;
    bool handed_out = false;
  };

  void require_open() const {
    if (!pool_) throw StatusError(failed_precondition("the stager is closed"));
  }

  // Drops handed-out batches whose copies completed, adding their copy time to the stats.
  void sweep_locked() {
#if GPUOPT_CUDA
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      auto complete = p.ready.query();
      if (!p.handed_out || !complete.ok() || !*complete) {
        ++it;
        continue;
      }
      auto ms = runtime::Event::elapsed_ms(p.start, p.ready);
      if (ms.ok()) {
        h2d_s_ += *ms / 1000.0;
        h2d_bytes_ += p.bytes;
      }
      ++batches_;
      it = pending_.erase(it);
    }
#endif
  }

#if GPUOPT_CUDA
  std::optional<runtime::Device> device_;
#endif
  runtime::Stream stream_;
  std::unique_ptr<runtime::PinnedPool> pool_;
  std::unique_ptr<ParallelCopier> copier_;
  std::size_t chunk_bytes_ = 0;
  std::mutex stage_mutex_;
  std::mutex mutex_;
  std::map<std::uint64_t, Pending> pending_;
  std::uint64_t next_token_ = 0;
  std::uint64_t batches_ = 0;
  std::uint64_t h2d_bytes_ = 0;
  double h2d_s_ = 0;
};

// ---- native sources -----------------------------------------------------------------------------
// The Loader lives as long as the Python source object or any batch tensor it handed out: each
// GPU batch's DLPack owner holds a reference and gives the slot back (recording an event on the
// stream the batch was handed out on) when torch frees the tensor.
struct LoaderHolder {
  std::unique_ptr<data::Loader> loader;
  ~LoaderHolder() {
    if (loader) loader->stop();
  }
};

struct HeldBatch {
  std::shared_ptr<LoaderHolder> holder;
  data::Batch batch;
  runtime::StreamHandle stream = nullptr;
};

nb::dlpack::dtype parse_dtype(const std::string& name) {
  using nb::dlpack::dtype_code;
  struct Entry {
    const char* name;
    dtype_code code;
    std::uint8_t bits;
  };
  static const Entry kTypes[] = {
      {"uint8", dtype_code::UInt, 8},       {"int8", dtype_code::Int, 8},
      {"int16", dtype_code::Int, 16},       {"int32", dtype_code::Int, 32},
      {"int64", dtype_code::Int, 64},       {"float16", dtype_code::Float, 16},
      {"bfloat16", dtype_code::Bfloat, 16}, {"float32", dtype_code::Float, 32},
      {"float64", dtype_code::Float, 64},
  };
  for (const Entry& entry : kTypes) {
    if (name == entry.name) {
      return nb::dlpack::dtype{static_cast<std::uint8_t>(entry.code), entry.bits, 1};
    }
  }
  throw StatusError(invalid_argument("dtype '" + name +
                                     "' is not one of uint8, int8, int16, int32, int64, float16, "
                                     "bfloat16, float32, float64"));
}

class PyNativeLoader {
 public:
  // kind: "record" (path, record_bytes, io) or "jpeg" (path = folder, height, width).
  PyNativeLoader(const std::string& kind, const std::string& path, std::size_t record_bytes,
                 const std::string& io, int height, int width,
                 const std::vector<std::size_t>& sample_shape, const std::string& dtype,
                 std::size_t batch_size, int workers, bool shuffle, std::uint64_t seed,
                 bool drop_last, bool gpu, int device, std::size_t initial_depth, bool adaptive,
                 std::size_t max_depth, std::size_t pinned_budget_bytes,
                 std::size_t device_budget_bytes, bool stop_on_error)
      : sample_shape_(sample_shape), dtype_(parse_dtype(dtype)), gpu_(gpu), device_(device) {
    std::shared_ptr<data::Dataset> dataset;
    {
      nb::gil_scoped_release release;
      if (kind == "record") {
        data::RecordFileOptions options;
        options.path = path;
        options.record_bytes = record_bytes;
        options.io = value_or_throw(data::parse_record_io(io));
        dataset = value_or_throw(data::open_record_file(options));
      } else if (kind == "jpeg") {
        data::JpegFolderOptions options;
        options.folder = path;
        options.height = height;
        options.width = width;
        dataset = value_or_throw(data::open_jpeg_folder(options));
      } else {
        throw StatusError(invalid_argument("native source: unknown kind '" + kind + "'"));
      }
    }
    std::size_t elements = 1;
    for (std::size_t extent : sample_shape_) elements *= extent;
    std::size_t itemsize = dtype_.bits / 8;
    if (elements * itemsize != dataset->sample_bytes()) {
      throw StatusError(invalid_argument("sample shape and dtype make " +
                                         std::to_string(elements * itemsize) +
                                         " bytes per sample, but the source's samples are " +
                                         std::to_string(dataset->sample_bytes()) + " bytes"));
    }
    describe_ = dataset->describe();
    options_.batch_size = batch_size;
    options_.workers = workers;
    options_.epochs = 1;
    options_.sampler.kind = shuffle ? data::SamplerKind::kShuffled : data::SamplerKind::kSequential;
    options_.sampler.seed = seed;
    options_.sampler.drop_last = drop_last;
    options_.depth.adaptive = adaptive;
    options_.depth.initial_depth = initial_depth;
    options_.depth.max_depth = max_depth;
    options_.on_error = stop_on_error ? data::ErrorPolicy::kStop : data::ErrorPolicy::kSkipAndCount;
    options_.mode = gpu ? data::LoaderMode::kGpu : data::LoaderMode::kCpu;
    options_.device = device;
    options_.pinned_budget_bytes = pinned_budget_bytes;
    options_.device_budget_bytes = device_budget_bytes;
    dataset_ = std::move(dataset);
    data::Sampler sampler(dataset_->size(), options_.sampler);
    batches_per_epoch_ = sampler.batches_per_epoch(batch_size);
  }

  std::size_t batches_per_epoch() const { return batches_per_epoch_; }
  std::size_t dataset_size() const { return dataset_->size(); }
  const std::string& describe() const { return describe_; }

  // Starts a pass (one epoch) with `seed`: a new Loader; the previous pass is stopped.
  void start(std::uint64_t seed) {
    stop();
    data::LoaderOptions options = options_;
    options.sampler.seed = seed;
    nb::gil_scoped_release release;
    auto holder = std::make_shared<LoaderHolder>();
    holder->loader = value_or_throw(data::Loader::create(dataset_, options));
    std::lock_guard<std::mutex> guard(mutex_);
    holder_ = std::move(holder);
  }

  // The next batch as (tensor or ndarray, indices), or None at the end of the pass. Waits without
  // the GIL, in slices, so that Ctrl-C raises KeyboardInterrupt here.
  nb::object next(std::uintptr_t stream) {
    std::shared_ptr<LoaderHolder> holder = current();
    if (!holder) throw StatusError(failed_precondition("no pass is running (call start first)"));
    std::optional<data::Batch> batch;
    while (true) {
      StatusOr<std::optional<data::Batch>> result = Status();
      {
        nb::gil_scoped_release release;
        result = holder->loader->next_for(0.05);
      }
      if (!result.ok() && result.status().code() == StatusCode::kDeadlineExceeded) {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        continue;
      }
      batch = value_or_throw(std::move(result));
      break;
    }
    if (!batch) return nb::none();
    std::size_t count = batch->size();
    auto* index_values =
        new std::vector<std::int64_t>(batch->indices().begin(), batch->indices().end());
    nb::capsule index_owner(
        index_values, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
    nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>> indices(index_values->data(), {count},
                                                              index_owner);
    std::vector<std::size_t> shape{count};
    shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    if (!gpu_) {
      // CPU mode: the staging block goes back at release, so the caller gets its own copy.
      std::size_t bytes = batch->bytes();
      auto* copy = new std::vector<std::byte>(batch->host(), batch->host() + bytes);
      nb::capsule owner(copy,
                        [](void* p) noexcept { delete static_cast<std::vector<std::byte>*>(p); });
      throw_if_error(holder->loader->release(*batch));
      nb::ndarray<nb::numpy> array(copy->data(), shape.size(), shape.data(), owner, nullptr, dtype_,
                                   nb::device::cpu::value, 0);
      return nb::make_tuple(nb::cast(array), nb::cast(indices));
    }
    // torch's default stream is the legacy stream, handle 0; the loader takes null as "no
    // stream", so name it by cudaStreamLegacy.
    auto handle = reinterpret_cast<runtime::StreamHandle>(stream);
#if GPUOPT_CUDA
    if (handle == nullptr) handle = static_cast<runtime::StreamHandle>(cudaStreamLegacy);
    Status waited = GPUOPT_CUDA_STATUS(cudaStreamWaitEvent(
        static_cast<cudaStream_t>(handle), static_cast<cudaEvent_t>(batch->ready_event()), 0));
    if (!waited.ok()) {
      (void)holder->loader->release(*batch, nullptr);
      throw StatusError(waited);
    }
#endif
    void* device_data = batch->device();
    auto* held = new HeldBatch{holder, std::move(*batch), handle};
    nb::capsule owner(held, [](void* p) noexcept {
      auto* held = static_cast<HeldBatch*>(p);
      // The consumer's work on `stream` queued so far is its last use: the slot's device buffer
      // is rewritten only after the stream passes this point.
      (void)held->holder->loader->release(held->batch, held->stream);
      delete held;
    });
    nb::ndarray<nb::pytorch> tensor(device_data, shape.size(), shape.data(), owner, nullptr, dtype_,
                                    nb::device::cuda::value, device_);
    return nb::make_tuple(nb::cast(tensor), nb::cast(indices));
  }

  // Stops the running pass; batches already handed out stay valid until freed.
  void stop() {
    std::shared_ptr<LoaderHolder> holder;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      holder = std::move(holder_);
      holder_.reset();
    }
    if (!holder) return;
    holder->loader->stop();
    nb::gil_scoped_release release;
    holder.reset();  // joins the workers unless a handed-out batch still holds the loader
  }

  std::string stats_json() {
    std::shared_ptr<LoaderHolder> holder = current();
    if (!holder) return "{}";
    return data::to_json(holder->loader->stats()).dump();
  }

 private:
  std::shared_ptr<LoaderHolder> current() {
    std::lock_guard<std::mutex> guard(mutex_);
    return holder_;
  }

  std::vector<std::size_t> sample_shape_;
  nb::dlpack::dtype dtype_;
  bool gpu_ = false;
  int device_ = 0;
  std::shared_ptr<data::Dataset> dataset_;
  data::LoaderOptions options_;
  std::size_t batches_per_epoch_ = 0;
  std::string describe_;
  std::mutex mutex_;
  std::shared_ptr<LoaderHolder> holder_;
};

}  // namespace

void bind_data(nb::module_& module) {
  module.def(
      "depth_upper_bound",
      [](std::size_t batch_bytes, std::size_t pinned_budget_bytes,
         std::optional<std::size_t> device_budget_bytes, double headroom, std::size_t held,
         std::size_t max_depth) {
        data::DepthBudget budget;
        budget.batch_bytes = batch_bytes;
        budget.pinned_budget_bytes = pinned_budget_bytes;
        budget.device_budget_bytes = device_budget_bytes;
        budget.headroom = headroom;
        budget.held_by_consumer = held;
        return data::depth_upper_bound(budget, max_depth);
      },
      nb::arg("batch_bytes"), nb::arg("pinned_budget_bytes"), nb::arg("device_budget_bytes"),
      nb::arg("headroom"), nb::arg("held"), nb::arg("max_depth"),
      "Largest prefetch depth whose batches (plus those held) fit every budget; 0 if none.");

  nb::class_<PyDepthController>(module, "DepthController",
                                "The loader's wait-driven depth controller (gpuopt::data).")
      .def(nb::init<bool, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>(),
           nb::arg("adaptive"), nb::arg("initial_depth"), nb::arg("min_depth"),
           nb::arg("max_depth"), nb::arg("window_batches"), nb::arg("upper_bound"))
      .def("observe", &PyDepthController::observe, nb::arg("wall_s"), nb::arg("wait_s"),
           nb::arg("batches"), nb::arg("capacity").none(), nb::arg("memory_pressure"),
           nb::arg("now_s"), nb::arg("batch"),
           "Feeds one window of consumed batches; (depth, reason) when it decided something.")
      .def_prop_ro("depth", &PyDepthController::depth)
      .def_prop_ro("upper_bound", &PyDepthController::upper_bound);

  nb::class_<PyStager>(module, "Stager",
                       "Pinned-pool staging and host-to-device copies on a dedicated stream.")
      .def(nb::init<int, std::size_t, std::size_t, int>(), nb::arg("device"),
           nb::arg("pinned_budget_bytes"), nb::arg("chunk_bytes"), nb::arg("copy_threads"))
      .def_prop_ro("stream", &PyStager::stream, "The copy stream (cudaStream_t as an integer).")
      .def("stage", &PyStager::stage, nb::arg("copies"),
           "Queues (src, dst, bytes, src_pinned) copies; returns the batch's token.")
      .def("wait", &PyStager::wait, nb::arg("token"), nb::arg("stream"),
           nb::arg("synchronize") = false,
           "Makes `stream` wait for the batch (or blocks the host when synchronize=True).")
      .def("discard", &PyStager::discard, nb::arg("token"))
      .def("done", &PyStager::done, nb::arg("token"))
      .def("synchronize", &PyStager::synchronize)
      .def("stats", &PyStager::stats)
      .def("close", &PyStager::close);

  nb::class_<PyNativeLoader>(module, "NativeLoader",
                             "The C++ prefetch loader over a record file or a JPEG folder.")
      .def(nb::init<const std::string&, const std::string&, std::size_t, const std::string&, int,
                    int, const std::vector<std::size_t>&, const std::string&, std::size_t, int,
                    bool, std::uint64_t, bool, bool, int, std::size_t, bool, std::size_t,
                    std::size_t, std::size_t, bool>(),
           nb::arg("kind"), nb::arg("path"), nb::arg("record_bytes"), nb::arg("io"),
           nb::arg("height"), nb::arg("width"), nb::arg("sample_shape"), nb::arg("dtype"),
           nb::arg("batch_size"), nb::arg("workers"), nb::arg("shuffle"), nb::arg("seed"),
           nb::arg("drop_last"), nb::arg("gpu"), nb::arg("device"), nb::arg("initial_depth"),
           nb::arg("adaptive"), nb::arg("max_depth"), nb::arg("pinned_budget_bytes"),
           nb::arg("device_budget_bytes"), nb::arg("stop_on_error"))
      .def_prop_ro("batches_per_epoch", &PyNativeLoader::batches_per_epoch)
      .def_prop_ro("dataset_size", &PyNativeLoader::dataset_size)
      .def("describe", &PyNativeLoader::describe)
      .def("start", &PyNativeLoader::start, nb::arg("seed"))
      .def("next", &PyNativeLoader::next, nb::arg("stream"))
      .def("stop", &PyNativeLoader::stop)
      .def("stats_json", &PyNativeLoader::stats_json);
}

}  // namespace gpuopt::python
