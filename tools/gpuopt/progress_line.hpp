// A one-line progress display for long CLI commands: count, rate and ETA on stderr, rewritten in
// place with '\r'. It stays silent unless stderr is a terminal, so logs and pipes never see it.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace gpuopt::cli {

class ProgressLine {
 public:
  // "<label>: 1,200 / 5,000 <unit> (24.0%), 3,100 <unit>/s, ETA 0:02". Shown only when `wanted`
  // and stderr is a terminal.
  ProgressLine(bool wanted, std::string label, std::string unit)
      : active_(wanted && ::isatty(STDERR_FILENO) == 1),
        label_(std::move(label)),
        unit_(std::move(unit)) {}
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool active() const { return active_; }

  // `done` of `total` units (total absent when unknown); `fraction` in [0, 1] estimates the part
  // done when the total is unknown (e.g. bytes read of the file). Redrawn at most 4 times a second.
  void update(std::size_t done, std::optional<std::size_t> total, double fraction) {
    if (!active_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(250)) return;
    last_draw_ = now;
    drawn_ = true;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? double(done) / elapsed : 0;
    if (total && *total > 0) fraction = double(done) / double(*total);
    std::string line =
        total ? fmt::format("{}: {} / {} {}", label_, grouped(done), grouped(*total), unit_)
              : fmt::format("{}: {} {}", label_, grouped(done), unit_);
    if (fraction > 0) line += fmt::format(" ({:.1f}%)", 100 * std::min(fraction, 1.0));
    line += fmt::format(", {} {}/s", grouped(static_cast<std::size_t>(rate)), unit_);
    if (fraction > 0 && fraction < 1 && elapsed > 0.5) {
      line += ", ETA " + clock(elapsed * (1 - fraction) / fraction);
    }
    // Pad over the previous text so a shorter line leaves nothing behind.
    const std::size_t width = line.size();
    if (line.size() < width_) line.append(width_ - line.size(), ' ');
    width_ = width;
    std::fprintf(stderr, "\r%s", line.c_str());
    std::fflush(stderr);
  }

  // Clears the line (the final summary goes to stdout).
  void finish() {
    if (!active_ || !drawn_) return;
    std::fprintf(stderr, "\r%s\r", std::string(width_, ' ').c_str());
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  static std::string grouped(std::size_t value) {
    std::string digits = std::to_string(value);
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  }
  static std::string clock(double seconds) {
    const long total = static_cast<long>(seconds + 0.5);
    if (total >= 3600)
      return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
    return fmt::format("{}:{:02}", total / 60, total % 60);
  }

  bool active_;
  std::string label_;
  std::string unit_;
  bool drawn_ = false;
  std::size_t width_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace gpuopt::cli
