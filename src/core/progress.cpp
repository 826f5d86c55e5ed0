// The terminal progress line (progress.hpp).
#include "gpuopt/core/progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace gpuopt {

namespace {

std::string plural(std::string_view unit) { return unit.empty() ? "" : std::string(unit) + "s"; }

// Three significant figures with a k/M/G suffix: 3.05, 41.2k, 1.23M.
std::string short_number(double value) {
  static constexpr std::array<const char*, 4> kSuffixes = {"", "k", "M", "G"};
  std::size_t suffix = 0;
  while (value >= 999.5 && suffix + 1 < kSuffixes.size()) {
    value /= 1000;
    ++suffix;
  }
  return fmt::format("{:.3g}{}", value, kSuffixes[suffix]);
}

std::size_t terminal_width(std::FILE* sink) {
  winsize size{};
  if (sink != nullptr && ioctl(fileno(sink), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  return 80;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  if (seconds < 9.95) return fmt::format("{:.1f} s", seconds);
  const long long rounded = std::llround(seconds);
  if (rounded < 60) return fmt::format("{} s", rounded);
  if (rounded < 3600) return fmt::format("{} min {:02} s", rounded / 60, rounded % 60);
  const long long minutes = std::llround(seconds / 60);
  return fmt::format("{} h {:02} min", minutes / 60, minutes % 60);
}

std::string format_rate(double done, double elapsed_s, std::string_view unit) {
  if (!(done > 0) || !(elapsed_s > 0)) return {};
  const double per_second = done / elapsed_s;
  if (per_second >= 1) return fmt::format("{} {}/s", short_number(per_second), plural(unit));
  return fmt::format("{}/{}", format_duration(elapsed_s / done), unit.empty() ? "unit" : unit);
}

std::optional<double> eta_seconds(double done, std::optional<double> total, double elapsed_s) {
  if (!total || !(done > 0) || !(elapsed_s > 0) || done >= *total) return std::nullopt;
  return (*total - done) * elapsed_s / done;
}

std::string format_progress(const ProgressSnapshot& s, std::size_t width) {
  std::string count;
  const auto whole = static_cast<long long>(std::floor(std::max(s.done, 0.0)));
  if (s.total) {
    const double fraction = *s.total > 0 ? std::clamp(s.done / *s.total, 0.0, 1.0) : 0.0;
    count = fmt::format("{}/{}", whole, static_cast<long long>(std::llround(*s.total)));
    if (!s.unit.empty()) count += " " + plural(s.unit);
    count += fmt::format(" {}%", static_cast<int>(std::floor(fraction * 100)));
  } else {
    count = s.unit.empty() ? fmt::format("{}", whole) : fmt::format("{} {}", whole, plural(s.unit));
  }
  std::string item = s.item;
  std::string rate = format_rate(s.done, s.elapsed_s, s.unit);
  std::string elapsed = format_duration(s.elapsed_s) + " elapsed";
  const auto eta = eta_seconds(s.done, s.total, s.elapsed_s);
  std::string eta_text = eta ? "ETA " + format_duration(*eta) : std::string();
  auto compose = [&] {
    std::string line = s.label.empty() ? std::string() : s.label + ": ";
    line += count;
    for (const std::string* field : {&item, &rate, &elapsed, &eta_text}) {
      if (!field->empty()) line += " | " + *field;
    }
    return line;
  };
  // One column stays free: a line that fills the last one wraps on many terminals. On a narrow
  // terminal the rate goes first, then the elapsed time, then the item is shortened; the count
  // and the ETA stay to the last.
  const std::size_t limit = width > 1 ? width - 1 : 0;
  std::string line = compose();
  if (limit == 0 || line.size() <= limit) return line;
  rate.clear();
  if ((line = compose()).size() <= limit) return line;
  elapsed.clear();
  if ((line = compose()).size() <= limit) return line;
  const std::size_t excess = line.size() - limit;
  item = item.size() > excess + 3 ? item.substr(0, item.size() - excess - 3) + "..." : "";
  line = compose();
  if (line.size() > limit) line.resize(limit);
  return line;
}

ProgressLine::ProgressLine(ProgressOptions options) : options_(std::move(options)) {
  if (options_.enabled && options_.width == 0) options_.width = terminal_width(options_.sink);
  start_ = now();
}

ProgressLine::~ProgressLine() {
  stop_ticker();
  clear();
}

std::chrono::steady_clock::time_point ProgressLine::now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

void ProgressLine::set_total(std::optional<double> total) {
  std::lock_guard lock(mutex_);
  options_.total = total;
}

void ProgressLine::update(double done, std::string_view item) {
  std::lock_guard lock(mutex_);
  done_ = done;
  const bool changed = item != item_;
  item_ = std::string(item);
  draw_locked(changed);
}

void ProgressLine::update(double done) {
  std::lock_guard lock(mutex_);
  done_ = done;
  draw_locked(false);
}

void ProgressLine::clear() {
  std::lock_guard lock(mutex_);
  if (!options_.enabled || !drawn_) return;
  std::fputs("\r\033[K", options_.sink);
  std::fflush(options_.sink);
  drawn_ = false;
  last_draw_.reset();
}

ProgressSnapshot ProgressLine::snapshot() const {
  std::lock_guard lock(mutex_);
  return {options_.label, item_,         done_,
          options_.total, options_.unit, std::chrono::duration<double>(now() - start_).count()};
}

void ProgressLine::draw_locked(bool force) {
  if (!options_.enabled) return;
  const auto time = now();
  if (!force && last_draw_ && time - *last_draw_ < options_.min_interval) return;
  const ProgressSnapshot current{
      options_.label, item_,         done_,
      options_.total, options_.unit, std::chrono::duration<double>(time - start_).count()};
  std::fprintf(options_.sink, "\r%s\033[K", format_progress(current, options_.width).c_str());
  std::fflush(options_.sink);
  drawn_ = true;
  last_draw_ = time;
}

void ProgressLine::start_ticker(std::chrono::milliseconds period) {
  if (!options_.enabled || ticker_.joinable()) return;
  ticker_stop_ = false;
  ticker_ = std::thread([this, period] {
    std::unique_lock lock(mutex_);
    while (!ticker_wake_.wait_for(lock, period, [this] { return ticker_stop_; })) {
      draw_locked(true);
    }
  });
}

void ProgressLine::stop_ticker() {
  if (!ticker_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    ticker_stop_ = true;
  }
  ticker_wake_.notify_all();
  ticker_.join();
}

}  // namespace gpuopt
