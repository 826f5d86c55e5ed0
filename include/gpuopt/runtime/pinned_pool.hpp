// A stream-ordered pinned host memory pool: grows in slabs (cudaHostAlloc), never frees on the hot
// path, and hands a released block out again only once the GPU work that used it has completed.
// Works without CUDA (plain aligned host memory) so CPU-only data loading uses the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {

enum class HostMemory {
  kAuto,      // pinned when a CUDA device is usable, else pageable
  kPinned,    // cudaHostAlloc; UNAVAILABLE/UNIMPLEMENTED when it cannot be had
  kPageable,  // aligned host memory (CPU-only builds, tests)
};

// Tells the pool when the GPU work queued on a stream before release() has completed.
// The default (CudaCompletionTracker in pinned_pool.cpp) records pooled CUDA events; tests inject
// a fake to drive the reuse logic without a GPU.
class CompletionTracker {
 public:
  using Token = std::uint64_t;  // 0 = nothing pending
  virtual ~CompletionTracker() = default;
  // Marks the current end of `stream`. A null stream means "host use only": returns 0.
  virtual StatusOr<Token> record(StreamHandle stream) = 0;
  virtual StatusOr<bool> is_complete(Token token) = 0;
  // Blocks the host until `token` completes.
  virtual Status wait(Token token) = 0;
  // The pool no longer needs `token` (lets the tracker recycle its event).
  virtual void forget(Token token) = 0;
};

struct PinnedPoolOptions {
  std::size_t max_bytes = std::size_t{1} << 30;  // budget over all slabs
  std::size_t slab_bytes = std::size_t{64}
                           << 20;  // growth step (a bigger request gets its own size)
  HostMemory memory = HostMemory::kAuto;
  // Null = CUDA events when the memory is pinned, "always complete" otherwise.
  std::shared_ptr<CompletionTracker> tracker;
};

struct PinnedBlock {
  void* data = nullptr;
  std::size_t size = 0;  // bytes asked for (the pool may hold a few more for alignment)
  std::uint64_t id = 0;  // unique per acquire; guards against double release
};

struct PinnedPoolStats {
  std::size_t slabs = 0;
  std::size_t acquires = 0;
  std::size_t reuses = 0;      // served from a released block
  std::size_t host_waits = 0;  // acquire had to wait for GPU work to finish
  std::size_t budget_refusals = 0;
};

// Thread-safe. acquire() never returns memory the GPU may still read or write: a block released
// on stream S is reused only after the work queued on S before release() has completed (checked
// with an event; waited on only when nothing else fits and the budget is spent).
class PinnedPool {
 public:
  static constexpr std::size_t kAlignment = 256;

  static StatusOr<std::unique_ptr<PinnedPool>> create(PinnedPoolOptions options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // `stream` is where the caller will use the block (kept for symmetry with cudaMallocAsync;
  // host writes need the block idle whatever the stream). RESOURCE_EXHAUSTED naming the budget
  // when growing would pass max_bytes; INVALID_ARGUMENT for 0 bytes.
  StatusOr<PinnedBlock> acquire(std::size_t bytes, StreamHandle stream = nullptr);
  // `stream`: the stream whose queued work (copies) last used the block, or null when only the
  // host touched it. An unknown or already released block is reported on stderr and ignored.
  void release(PinnedBlock&& block, StreamHandle stream = nullptr);

  std::size_t bytes_reserved() const;
  std::size_t bytes_in_use() const;
  bool pinned() const { return pinned_; }
  PinnedPoolStats stats() const;
  const PinnedPoolOptions& options() const { return options_; }

 private:
  struct Slab {
    void* base = nullptr;
    std::size_t size = 0;
  };
  struct Region {
    std::size_t slab = 0;
    std::size_t size = 0;
    bool free = true;
    bool claimed = false;  // taken by an acquire that is waiting for its events outside the lock
    std::uint64_t id = 0;
    std::vector<CompletionTracker::Token> pending;  // GPU work that must finish before reuse
  };

  explicit PinnedPool(PinnedPoolOptions options, bool pinned);
  StatusOr<bool> ready_locked(Region& region);
  void coalesce_locked(std::map<std::uintptr_t, Region>::iterator it);
  PinnedBlock take_locked(std::map<std::uintptr_t, Region>::iterator it, std::size_t rounded,
                          std::size_t bytes);
  Status grow_locked(std::size_t rounded);
  void free_slab(const Slab& slab) const;

  PinnedPoolOptions options_;
  bool pinned_ = false;
  mutable std::mutex mutex_;
  std::vector<Slab> slabs_;
  std::map<std::uintptr_t, Region> regions_;  // by address; adjacent in one slab coalesce
  std::size_t bytes_reserved_ = 0;
  std::size_t bytes_in_use_ = 0;
  std::uint64_t next_id_ = 1;
  PinnedPoolStats stats_;
};

}  // namespace gpuopt::runtime
