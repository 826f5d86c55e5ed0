// Cooperative cancellation: a flag that one thread sets and a long operation on another thread
// polls between chunks of its work; the operation then stops and returns a CANCELLED status (errors
// are values: nothing throws). Polling is one relaxed atomic load, cheap enough for inner loops.
//
// The owner of the token keeps it alive until the operation returns; operations take it as a
// `const CancelToken*` (null = not cancellable). A token stays set once cancelled until reset().
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Asks every operation polling this token to stop. Safe from any thread (not from a signal
  // handler only because std::atomic<bool> is lock-free on every target gpuopt builds for).
  void cancel() { flag_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return flag_.load(std::memory_order_relaxed); }
  void reset() { flag_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> flag_{false};
};

// True when `token` is non-null and set.
inline bool is_cancelled(const CancelToken* token) {
  return token != nullptr && token->cancelled();
}

// A CANCELLED status: "<what> was cancelled".
inline Status cancelled(const std::string& what) {
  return Status(StatusCode::kCancelled, what + " was cancelled");
}

}  // namespace gpuopt
