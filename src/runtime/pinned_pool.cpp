// PinnedPool: slab growth under a budget, best-fit reuse of released blocks whose GPU work is done,
// coalescing of neighbours; CUDA events (pooled) tell when a released block's work has completed.
#include "gpuopt/runtime/pinned_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/cuda_check.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::runtime {

namespace {

constexpr std::size_t kPageBytes = 4096;

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Host-only use, or no GPU: nothing is ever pending.
class ImmediateTracker final : public CompletionTracker {
 public:
  StatusOr<Token> record(StreamHandle) override { return Token{0}; }
  StatusOr<bool> is_complete(Token) override { return true; }
  Status wait(Token) override { return ok_status(); }
  void forget(Token) override {}
};

#if GPUOPT_CUDA
// One event per outstanding release, recycled so steady state creates no events.
class CudaCompletionTracker final : public CompletionTracker {
 public:
  ~CudaCompletionTracker() override {
    for (auto& [token, event] : live_) GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(event));
    for (cudaEvent_t event : spare_) GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(event));
  }

  StatusOr<Token> record(StreamHandle stream) override {
    if (stream == nullptr) return Token{0};
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t event = nullptr;
    if (!spare_.empty()) {
      event = spare_.back();
      spare_.pop_back();
    } else {
      GPUOPT_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    Status recorded = GPUOPT_CUDA_STATUS(cudaEventRecord(event, static_cast<cudaStream_t>(stream)));
    if (!recorded.ok()) {
      spare_.push_back(event);
      return recorded;
    }
    Token token = next_token_++;
    live_.emplace(token, event);
    return token;
  }

  StatusOr<bool> is_complete(Token token) override {
    cudaEvent_t event = find(token);
    if (event == nullptr) return true;
    cudaError_t error = cudaEventQuery(event);
    if (error == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GPUOPT_CUDA_TRY(error);
    return true;
  }

  Status wait(Token token) override {
    cudaEvent_t event = find(token);
    if (event == nullptr) return ok_status();
    return GPUOPT_CUDA_STATUS(cudaEventSynchronize(event));
  }

  void forget(Token token) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(token);
    if (it == live_.end()) return;
    spare_.push_back(it->second);
    live_.erase(it);
  }

 private:
  cudaEvent_t find(Token token) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(token);
    return it == live_.end() ? nullptr : it->second;
  }

  std::mutex mutex_;
  Token next_token_ = 1;
  std::unordered_map<Token, cudaEvent_t> live_;
  std::vector<cudaEvent_t> spare_;
};
#endif  // GPUOPT_CUDA

bool cuda_usable() {
#if GPUOPT_CUDA
  return cuda_device_count().ok();
#else
  return false;
#endif
}

}  // namespace

StatusOr<std::unique_ptr<PinnedPool>> PinnedPool::create(PinnedPoolOptions options) {
  if (options.max_bytes == 0) return invalid_argument("PinnedPool: max_bytes must be > 0");
  if (options.slab_bytes == 0) return invalid_argument("PinnedPool: slab_bytes must be > 0");
  options.slab_bytes = round_up(options.slab_bytes, kAlignment);
  bool pinned = false;
  switch (options.memory) {
    case HostMemory::kAuto:
      pinned = cuda_usable();
      break;
    case HostMemory::kPageable:
      pinned = false;
      break;
    case HostMemory::kPinned:
#if GPUOPT_CUDA
      GPUOPT_RETURN_IF_ERROR(cuda_device_count().status().with_context(
          "PinnedPool: pinned memory asked for but no CUDA device is usable"));
      pinned = true;
      break;
#else
      return unimplemented("PinnedPool: pinned memory asked for but gpuopt was built without CUDA");
#endif
  }
  if (options.tracker == nullptr) {
#if GPUOPT_CUDA
    if (cuda_usable()) options.tracker = std::make_shared<CudaCompletionTracker>();
#endif
    if (options.tracker == nullptr) options.tracker = std::make_shared<ImmediateTracker>();
  }
  return std::unique_ptr<PinnedPool>(new PinnedPool(std::move(options), pinned));
}

PinnedPool::PinnedPool(PinnedPoolOptions options, bool pinned)
    : options_(std::move(options)), pinned_(pinned) {}

PinnedPool::~PinnedPool() {
  for (auto& [address, region] : regions_) {
    for (auto token : region.pending) {
      // The GPU may still read these bytes: wait before the memory goes back.
      report_unreturnable(options_.tracker->wait(token));
      options_.tracker->forget(token);
    }
  }
  for (const Slab& slab : slabs_) free_slab(slab);
}

void PinnedPool::free_slab(const Slab& slab) const {
#if GPUOPT_CUDA
  if (pinned_) {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(slab.base));
    return;
  }
#endif
  std::free(slab.base);
}

Status PinnedPool::grow_locked(std::size_t rounded) {
  std::size_t room = options_.max_bytes - bytes_reserved_;
  std::size_t size = std::min(std::max(options_.slab_bytes, rounded), room);
  GPUOPT_CHECK(size >= rounded);
  void* base = nullptr;
#if GPUOPT_CUDA
  if (pinned_) {
    GPUOPT_CUDA_TRY(cudaHostAlloc(&base, size, cudaHostAllocPortable));
  }
#endif
  if (!pinned_) {
    base = std::aligned_alloc(kPageBytes, round_up(size, kPageBytes));
    if (base == nullptr) {
      return resource_exhausted(
          fmt::format("PinnedPool: host allocation of {} bytes failed", size));
    }
  }
  slabs_.push_back({base, size});
  bytes_reserved_ += size;
  ++stats_.slabs;
  Region region;
  region.slab = slabs_.size() - 1;
  region.size = size;
  regions_.emplace(reinterpret_cast<std::uintptr_t>(base), std::move(region));
  return ok_status();
}

StatusOr<bool> PinnedPool::ready_locked(Region& region) {
  auto& pending = region.pending;
  for (std::size_t i = 0; i < pending.size();) {
    GPUOPT_ASSIGN_OR_RETURN(bool done, options_.tracker->is_complete(pending[i]));
    if (!done) {
      ++i;
      continue;
    }
    options_.tracker->forget(pending[i]);
    pending[i] = pending.back();
    pending.pop_back();
  }
  return pending.empty();
}

PinnedBlock PinnedPool::take_locked(std::map<std::uintptr_t, Region>::iterator it,
                                    std::size_t rounded, std::size_t bytes) {
  Region& region = it->second;
  GPUOPT_CHECK(region.free && region.pending.empty() && region.size >= rounded);
  if (region.size > rounded) {
    Region rest;
    rest.slab = region.slab;
    rest.size = region.size - rounded;
    regions_.emplace(it->first + rounded, std::move(rest));
    region.size = rounded;
  }
  region.free = false;
  region.claimed = false;
  region.id = next_id_++;
  bytes_in_use_ += rounded;
  ++stats_.acquires;
  return PinnedBlock{reinterpret_cast<void*>(it->first), bytes, region.id};
}

StatusOr<PinnedBlock> PinnedPool::acquire(std::size_t bytes, StreamHandle /*stream*/) {
  if (bytes == 0) return invalid_argument("PinnedPool::acquire: 0 bytes asked for");
  if (bytes > options_.max_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.budget_refusals;
    return resource_exhausted(
        fmt::format("PinnedPool: a block of {} bytes exceeds the whole budget max_bytes={}", bytes,
                    options_.max_bytes));
  }
  const std::size_t rounded = round_up(bytes, kAlignment);
  std::unique_lock<std::mutex> lock(mutex_);

  // 1. Best fit among idle blocks whose GPU work has completed.
  auto best = regions_.end();
  auto waitable = regions_.end();
  std::size_t free_bytes = 0;
  std::size_t largest_free = 0;
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    Region& region = it->second;
    if (!region.free || region.claimed) continue;
    free_bytes += region.size;
    largest_free = std::max(largest_free, region.size);
    if (region.size < rounded) continue;
    GPUOPT_ASSIGN_OR_RETURN(bool ready, ready_locked(region));
    if (ready) {
      if (best == regions_.end() || region.size < best->second.size) best = it;
    } else if (waitable == regions_.end()) {
      waitable = it;
    }
  }
  if (best != regions_.end()) {
    if (best->second.id != 0) ++stats_.reuses;
    return take_locked(best, rounded, bytes);
  }

  // 2. Grow while the budget allows: cheaper than making the host wait for the GPU.
  if (options_.max_bytes - bytes_reserved_ >= rounded) {
    GPUOPT_RETURN_IF_ERROR(grow_locked(rounded));
    auto fresh = regions_.find(reinterpret_cast<std::uintptr_t>(slabs_.back().base));
    GPUOPT_CHECK(fresh != regions_.end());
    return take_locked(fresh, rounded, bytes);
  }

  // 3. Budget spent: wait for the GPU to finish with a released block that fits.
  if (waitable != regions_.end()) {
    Region& region = waitable->second;
    region.claimed = true;
    std::vector<CompletionTracker::Token> tokens = std::move(region.pending);
    region.pending.clear();
    ++stats_.host_waits;
    lock.unlock();
    Status waited;
    for (auto token : tokens) {
      if (waited.ok()) waited = options_.tracker->wait(token);
    }
    lock.lock();
    if (!waited.ok()) {
      region.pending = std::move(tokens);
      region.claimed = false;
      return waited.with_context("PinnedPool: waiting for a released block's GPU work");
    }
    for (auto token : tokens) options_.tracker->forget(token);
    if (region.id != 0) ++stats_.reuses;
    return take_locked(waitable, rounded, bytes);
  }

  ++stats_.budget_refusals;
  return resource_exhausted(fmt::format(
      "PinnedPool budget max_bytes={} exhausted: {} bytes asked for, {} reserved, {} in use, {} "
      "free in pieces of at most {} bytes (raise max_bytes or release blocks sooner)",
      options_.max_bytes, bytes, bytes_reserved_, bytes_in_use_, free_bytes, largest_free));
}

void PinnedPool::coalesce_locked(std::map<std::uintptr_t, Region>::iterator it) {
  auto mergeable = [](const auto& left, const auto& right) {
    return left->second.slab == right->second.slab && left->second.free && right->second.free &&
           !left->second.claimed && !right->second.claimed &&
           left->first + left->second.size == right->first;
  };
  auto absorb = [this](auto left, auto right) {
    left->second.size += right->second.size;
    auto& into = left->second.pending;
    into.insert(into.end(), right->second.pending.begin(), right->second.pending.end());
    if (right->second.id != 0 && left->second.id == 0) left->second.id = right->second.id;
    regions_.erase(right);
  };
  auto next = std::next(it);
  if (next != regions_.end() && mergeable(it, next)) absorb(it, next);
  if (it != regions_.begin()) {
    auto prev = std::prev(it);
    if (mergeable(prev, it)) absorb(prev, it);
  }
}

void PinnedPool::release(PinnedBlock&& block, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(reinterpret_cast<std::uintptr_t>(block.data));
  if (it == regions_.end() || it->second.free || it->second.id != block.id) {
    report_unreturnable(invalid_argument(fmt::format(
        "PinnedPool::release: block {} (id {}) is not in use in this pool (double release?)",
        block.data, block.id)));
    return;
  }
  auto token = options_.tracker->record(stream);
  if (!token.ok()) {
    // Without a completion marker the block can never be known idle: keep it out of circulation.
    report_unreturnable(token.status().with_context("PinnedPool::release: block quarantined"));
    block = PinnedBlock{};
    return;
  }
  Region& region = it->second;
  bytes_in_use_ -= region.size;
  region.free = true;
  if (*token != 0) region.pending.push_back(*token);
  block = PinnedBlock{};
  coalesce_locked(it);
}

std::size_t PinnedPool::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_reserved_;
}

std::size_t PinnedPool::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_in_use_;
}

PinnedPoolStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace gpuopt::runtime
