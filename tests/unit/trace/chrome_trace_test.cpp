// The Chrome trace of the fixture: parses with nlohmann, has a track per stream and per copy
// direction, µs timestamps relative to the window, and the args the viewer shows.
#include "gpuopt/trace/chrome_trace.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "trace_fixture.hpp"

namespace gpuopt::trace {
namespace {

using nlohmann::json;
using testing::fixture_trace;

// (pid, tid) -> thread name from the "M" events.
std::map<std::pair<std::int64_t, std::int64_t>, std::string> thread_names(const json& trace) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> names;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      names[{event["pid"].get<std::int64_t>(), event["tid"].get<std::int64_t>()}] =
          event["args"]["name"].get<std::string>();
    }
  }
  return names;
}

TEST(ChromeTrace, RoundTripsThroughTheParser) {
  const std::string text = chrome_trace_json(fixture_trace()).dump();
  const json parsed = json::parse(text);  // throws on invalid JSON
  ASSERT_TRUE(parsed.contains("traceEvents"));
  ASSERT_TRUE(parsed["traceEvents"].is_array());
  int complete = 0;
  for (const json& event : parsed["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph"));
    ASSERT_TRUE(event.contains("pid"));
    if (event["ph"] == "X") {
      ++complete;
      ASSERT_TRUE(event["ts"].is_number());
      ASSERT_TRUE(event["dur"].is_number());
      ASSERT_TRUE(event.contains("tid"));
    }
  }
  EXPECT_EQ(complete, static_cast<int>(fixture_trace().records.size()));
}

TEST(ChromeTrace, TrackPerStreamAndPerCopyDirection) {
  const json trace = chrome_trace_json(fixture_trace());
  const auto names = thread_names(trace);
  const std::int64_t gpu = kDevicePidBase + 0;
  EXPECT_EQ(names.at({gpu, 7}), "stream 7");
  EXPECT_EQ(names.at({gpu, 9}), "stream 9");
  EXPECT_EQ(names.at({gpu, kCopyTidBase + static_cast<int>(CopyDirection::kHostToDevice)}),
            "copies H2D");
  EXPECT_EQ(names.at({gpu, kCopyTidBase + static_cast<int>(CopyDirection::kDeviceToHost)}),
            "copies D2H");
  EXPECT_EQ(names.at({gpu, kCopyTidBase + static_cast<int>(CopyDirection::kDeviceToDevice)}),
            "copies D2D");
  EXPECT_EQ(names.at({4242, 17}), "thread 17");
  // Exactly those tracks: two streams, three copy directions, one host thread.
  EXPECT_EQ(names.size(), 6u);

  std::set<std::string> process_names;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "process_name") {
      process_names.insert(event["args"]["name"].get<std::string>());
    }
  }
  EXPECT_EQ(process_names, (std::set<std::string>{"GPU 0 (Test GPU)", "host process 4242"}));
}

TEST(ChromeTrace, EventsCarryTimesInMicrosecondsAndArgs) {
  TraceData data = fixture_trace();
  // Shift everything by 5 s: timestamps stay relative to the window start.
  for (ActivityRecord& record : data.records) {
    record.start_ns += 5'000'000'000;
    record.end_ns += 5'000'000'000;
  }
  data.window_start_ns += 5'000'000'000;
  data.window_end_ns += 5'000'000'000;
  const json trace = chrome_trace_json(data);
  bool saw_kernel = false, saw_copy = false, saw_memset = false;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] != "X") continue;
    if (event["cat"] == "kernel" && event["name"] == "k_a" && event["tid"] == 7) {
      saw_kernel = true;
      EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 0.1);   // 100 ns
      EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 0.2);  // 200 ns
      EXPECT_EQ(event["args"]["grid"], json::array({2, 1, 1}));
      EXPECT_EQ(event["args"]["block"], json::array({128, 1, 1}));
      EXPECT_EQ(event["pid"], kDevicePidBase);
    }
    if (event["cat"] == "memcpy" && event["args"]["direction"] == "D2H") {
      saw_copy = true;
      EXPECT_EQ(event["args"]["bytes"], 2000);
      EXPECT_EQ(event["args"]["stream"], 9);
      EXPECT_EQ(event["tid"], kCopyTidBase + static_cast<int>(CopyDirection::kDeviceToHost));
      EXPECT_DOUBLE_EQ(event["args"]["bandwidth_gbps"].get<double>(), 20.0);  // 2000 B / 100 ns
    }
    if (event["cat"] == "memset") {
      saw_memset = true;
      EXPECT_EQ(event["tid"], 7);
    }
  }
  EXPECT_TRUE(saw_kernel);
  EXPECT_TRUE(saw_copy);
  EXPECT_TRUE(saw_memset);
}

TEST(ChromeTrace, EmptyTraceIsStillValid) {
  const json trace = json::parse(chrome_trace_json(TraceData{}).dump());
  EXPECT_TRUE(trace["traceEvents"].empty());
}

TEST(ChromeTrace, WritesAFileAndReportsAnUnwritablePath) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "gpuopt_chrome_trace_test.json").string();
  ASSERT_TRUE(write_chrome_trace(fixture_trace(), path).ok());
  std::ifstream in(path);
  const json parsed = json::parse(in);
  EXPECT_FALSE(parsed["traceEvents"].empty());
  std::remove(path.c_str());
  const Status bad = write_chrome_trace(fixture_trace(), "/nonexistent-dir/trace.json");
  EXPECT_EQ(bad.code(), StatusCode::kUnavailable);
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.json"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::trace
