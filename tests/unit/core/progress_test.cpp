// The progress line: its text (rate, ETA, durations) worked out by hand, and its redraws under a
// fake clock.
#include "gpuopt/core/progress.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace gpuopt {
namespace {

using namespace std::chrono_literals;

TEST(FormatDuration, Ranges) {
  EXPECT_EQ(format_duration(0), "0.0 s");
  EXPECT_EQ(format_duration(-3), "0.0 s");
  EXPECT_EQ(format_duration(0.44), "0.4 s");
  EXPECT_EQ(format_duration(9.9), "9.9 s");
  EXPECT_EQ(format_duration(12.4), "12 s");
  EXPECT_EQ(format_duration(59.4), "59 s");
  EXPECT_EQ(format_duration(245), "4 min 05 s");   // 4 * 60 + 5
  EXPECT_EQ(format_duration(3780), "1 h 03 min");  // 63 minutes
}

TEST(FormatRate, UnitsPerSecondAndSecondsPerUnit) {
  EXPECT_EQ(format_rate(0, 5, "vector"), "");
  EXPECT_EQ(format_rate(10, 0, "vector"), "");
  EXPECT_EQ(format_rate(41234, 1, "vector"), "41.2k vectors/s");
  EXPECT_EQ(format_rate(3, 1, "stage"), "3 stages/s");
  EXPECT_EQ(format_rate(2.5e6, 2, "row"), "1.25M rows/s");
  EXPECT_EQ(format_rate(999.7, 1, "vector"), "1k vectors/s");  // rounds up into the next suffix
  EXPECT_EQ(format_rate(1, 3.1, "testcase"), "3.1 s/testcase");
  EXPECT_EQ(format_rate(2, 300, "stage"), "2 min 30 s/stage");
}

TEST(EtaSeconds, OnlyWithATotalAndProgress) {
  ASSERT_TRUE(eta_seconds(2, 12, 6).has_value());
  EXPECT_DOUBLE_EQ(*eta_seconds(2, 12, 6), 30);  // 3 s per unit, 10 units left
  EXPECT_FALSE(eta_seconds(2, std::nullopt, 6).has_value());
  EXPECT_FALSE(eta_seconds(0, 12, 6).has_value());
  EXPECT_FALSE(eta_seconds(12, 12, 6).has_value());
  EXPECT_FALSE(eta_seconds(2, 12, 0).has_value());
}

TEST(FormatProgress, KnownTotal) {
  const ProgressSnapshot snapshot{"bench pcie", "pinned_h2d", 2.25, 12, "testcase", 6};
  // 2.25 / 12 = 18.75% (shown floored); 6 / 2.25 = 2.67 s per testcase; 9.75 * 2.67 = 26 s left.
  EXPECT_EQ(format_progress(snapshot),
            "bench pcie: 2/12 testcases 18% | pinned_h2d | 2.7 s/testcase | 6.0 s elapsed | "
            "ETA 26 s");
}

TEST(FormatProgress, UnknownTotal) {
  const ProgressSnapshot snapshot{"vector import", "", 120000, std::nullopt, "vector", 3};
  EXPECT_EQ(format_progress(snapshot),
            "vector import: 120000 vectors | 40k vectors/s | 3.0 s elapsed");
}

TEST(FormatProgress, NothingDoneYet) {
  const ProgressSnapshot snapshot{"audit", "doctor", 0, 8, "stage", 0.2};
  EXPECT_EQ(format_progress(snapshot), "audit: 0/8 stages 0% | doctor | 0.2 s elapsed");
}

TEST(FormatProgress, NarrowTerminalsKeepTheCountAndTheEta) {
  const ProgressSnapshot snapshot{"bench pcie", "pinned_h2d", 2.25, 12, "testcase", 6};
  // The whole line is 87 characters; each width leaves its last column free.
  EXPECT_EQ(format_progress(snapshot, 88).size(), 87u);
  EXPECT_EQ(format_progress(snapshot, 80),  // the rate goes first
            "bench pcie: 2/12 testcases 18% | pinned_h2d | 6.0 s elapsed | ETA 26 s");
  EXPECT_EQ(format_progress(snapshot, 60),  // then the elapsed time
            "bench pcie: 2/12 testcases 18% | pinned_h2d | ETA 26 s");
  EXPECT_EQ(format_progress(snapshot, 52),  // then the item is shortened
            "bench pcie: 2/12 testcases 18% | pinn... | ETA 26 s");
  EXPECT_EQ(format_progress(snapshot, 20), "bench pcie: 2/12 te");  // at last, a plain cut
}

// A FILE* that collects what is written, and a clock the test moves.
struct Capture {
  char* buffer = nullptr;
  std::size_t size = 0;
  std::FILE* file = open_memstream(&buffer, &size);
  ~Capture() {
    if (file != nullptr) std::fclose(file);
    std::free(buffer);
  }
  std::string text() {
    std::fflush(file);
    return std::string(buffer, size);
  }
};

ProgressOptions test_options(std::FILE* sink, std::chrono::steady_clock::time_point& now) {
  ProgressOptions options;
  options.enabled = true;
  options.sink = sink;
  options.label = "bench x";
  options.unit = "testcase";
  options.total = 4;
  options.width = 200;
  options.min_interval = 1s;
  options.clock = [&now] { return now; };
  return options;
}

TEST(ProgressLine, RedrawsAtMostOncePerIntervalUnlessTheItemChanges) {
  Capture capture;
  ASSERT_NE(capture.file, nullptr);
  std::chrono::steady_clock::time_point now{};
  {
    ProgressLine line(test_options(capture.file, now));
    line.update(0, "a");  // the first draw
    now += 500ms;
    line.update(0.5);  // within the interval: skipped
    now += 500ms;
    line.update(1, "b");  // a new item: drawn at once
    now += 500ms;
    line.update(1.5);  // within the interval: skipped
    now += 1500ms;
    line.update(2);  // past it: drawn
  }                  // destroyed: the line is erased
  EXPECT_EQ(capture.text(),
            "\rbench x: 0/4 testcases 0% | a | 0.0 s elapsed\033[K"
            "\rbench x: 1/4 testcases 25% | b | 1 testcases/s | 1.0 s elapsed | ETA 3.0 s\033[K"
            "\rbench x: 2/4 testcases 50% | b | 1.5 s/testcase | 3.0 s elapsed | ETA 3.0 s\033[K"
            "\r\033[K");
}

TEST(ProgressLine, ClearErasesAndTheNextUpdateDrawsAgain) {
  Capture capture;
  ASSERT_NE(capture.file, nullptr);
  std::chrono::steady_clock::time_point now{};
  ProgressLine line(test_options(capture.file, now));
  line.update(1, "a");
  line.clear();
  line.clear();    // nothing drawn: nothing to erase
  line.update(1);  // within the interval, but the line was erased: drawn
  EXPECT_EQ(capture.text(),
            "\rbench x: 1/4 testcases 25% | a | 0.0 s elapsed\033[K\r\033[K"
            "\rbench x: 1/4 testcases 25% | a | 0.0 s elapsed\033[K");
}

TEST(ProgressLine, DisabledWritesNothing) {
  Capture capture;
  ASSERT_NE(capture.file, nullptr);
  std::chrono::steady_clock::time_point now{};
  {
    ProgressOptions options = test_options(capture.file, now);
    options.enabled = false;
    ProgressLine line(std::move(options));
    line.start_ticker(10ms);
    line.update(1, "a");
    now += 5s;
    line.update(2, "b");
    line.clear();
    EXPECT_EQ(line.snapshot().done, 2);
  }
  EXPECT_EQ(capture.text(), "");
}

TEST(ProgressLine, TickerRedrawsWhileOneStepRuns) {
  Capture capture;
  ASSERT_NE(capture.file, nullptr);
  std::chrono::steady_clock::time_point now{};
  ProgressOptions options = test_options(capture.file, now);
  options.clock = nullptr;  // the ticker runs on real time
  ProgressLine line(std::move(options));
  line.update(1, "slow");
  line.start_ticker(5ms);
  std::this_thread::sleep_for(100ms);
  line.stop_ticker();
  std::string text = capture.text();
  std::size_t draws = 0;
  for (std::size_t at = text.find("| slow |"); at != std::string::npos;
       at = text.find("| slow |", at + 1)) {
    ++draws;
  }
  EXPECT_GE(draws, 3u);  // the first update and at least two ticks in 100 ms of 5 ms periods
}

}  // namespace
}  // namespace gpuopt
