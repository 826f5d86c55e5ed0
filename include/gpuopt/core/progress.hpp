// A progress line for people at a terminal: one line on stderr, rewritten in place with '\r',
// naming what runs, how far it is, the rate and (where the total is known) the time left, as
//   bench pcie: 2/12 testcases 19% | pinned_h2d | 3.1 s/testcase | 6 s elapsed | ETA 31 s
//   vector import: 120000 vectors | 41.2k vectors/s | 3 s elapsed
// Any long task can use it (bench testcases, audit stages, an import): the caller decides whether
// it is drawn (stderr is a terminal, no --json, no --quiet); when it is not, every call is a no-op.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace gpuopt {

// What one progress line shows at one instant.
struct ProgressSnapshot {
  std::string label;            // what runs: "bench pcie", "audit"
  std::string item;             // the part running now: a testcase key, a stage; empty = none
  double done = 0;              // units finished (fractions allowed: 2.5 testcases)
  std::optional<double> total;  // units in all, when known
  std::string unit;             // singular: "testcase", "stage", "vector"
  double elapsed_s = 0;         // since the task started
};

// "0.4 s", "12 s", "4 min 05 s", "2 h 03 min".
std::string format_duration(double seconds);
// Units per second with three significant figures and k/M/G ("41.2k vectors/s"), or seconds per
// unit below one a second ("3.1 s/testcase"); empty when nothing is done or no time has passed.
std::string format_rate(double done, double elapsed_s, std::string_view unit);
// Seconds left at the rate so far; nullopt without a total, before the first unit's progress, or
// once done.
std::optional<double> eta_seconds(double done, std::optional<double> total, double elapsed_s);
// The whole line (no '\r', no newline); cut to `width` characters when width > 0.
std::string format_progress(const ProgressSnapshot& snapshot, std::size_t width = 0);

struct ProgressOptions {
  bool enabled = false;  // false: nothing is ever written
  std::FILE* sink = stderr;
  std::string label;
  std::string unit;
  std::optional<double> total;
  // Redraws closer together than this are skipped, except when the item changes.
  std::chrono::milliseconds min_interval{100};
  // Columns to fit the line in; 0 = the terminal's width (80 when it cannot be read).
  std::size_t width = 0;
  // The clock, for tests; empty = std::chrono::steady_clock.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

// Thread-safe; the line is cleared when the object is destroyed.
class ProgressLine {
 public:
  explicit ProgressLine(ProgressOptions options);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool enabled() const { return options_.enabled; }
  void set_total(std::optional<double> total);
  // Records progress and redraws (at most once per min_interval unless `item` changed).
  void update(double done, std::string_view item);
  void update(double done);
  // Erases the line, e.g. before printing a log line; the next update draws it again.
  void clear();
  // Redraws every `period` from a thread of its own (elapsed time and ETA keep moving while one
  // long step runs); stopped by stop_ticker() or the destructor.
  void start_ticker(std::chrono::milliseconds period);
  void stop_ticker();
  // The line as it would be drawn now.
  ProgressSnapshot snapshot() const;

 private:
  std::chrono::steady_clock::time_point now() const;
  void draw_locked(bool force);

  ProgressOptions options_;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> last_draw_;
  double done_ = 0;
  std::string item_;
  bool drawn_ = false;
  mutable std::mutex mutex_;
  std::thread ticker_;
  std::condition_variable ticker_wake_;
  bool ticker_stop_ = false;
};

}  // namespace gpuopt
