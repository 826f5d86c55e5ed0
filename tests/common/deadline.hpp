// Runs a call that must not block (a read of a path that may be a FIFO) under a deadline, so that a
// regression fails the test instead of hanging it.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

namespace gpuopt::testing {

// fn() on a detached thread; nullopt when it has not returned within `limit` (the thread is then
// left blocked, which ends with the test process).
template <typename Fn>
auto call_with_deadline(Fn fn, std::chrono::milliseconds limit = std::chrono::seconds(10))
    -> std::optional<std::invoke_result_t<Fn>> {
  using Result = std::invoke_result_t<Fn>;
  auto promise = std::make_shared<std::promise<Result>>();
  std::future<Result> future = promise->get_future();
  std::thread([promise, fn = std::move(fn)]() mutable { promise->set_value(fn()); }).detach();
  if (future.wait_for(limit) != std::future_status::ready) return std::nullopt;
  return future.get();
}

// Replaces whatever is at `path` with a FIFO that nobody writes to.
inline bool make_fifo(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::remove_all(path, error);
  return ::mkfifo(path.c_str(), 0600) == 0;
}

}  // namespace gpuopt::testing
