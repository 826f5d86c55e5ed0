// The Chrome trace of the fixture: parses with nlohmann, has a track per stream and per copy
// direction, µs timestamps relative to the window, and the args the viewer shows; flow arrows from
// each launch to its device work, the NVML counter track, clean API names; the streamed output is
// the old in-memory writer's document plus those.
#include "gpuopt/trace/chrome_trace.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "trace_fixture.hpp"

namespace gpuopt::trace {
namespace {

// The in-memory writer the streamed one replaced, kept verbatim as the oracle: the streamed trace
// must hold exactly its events (plus the flow and counter events, and API names cleaned).
namespace reference {

using nlohmann::json;

std::int64_t direction_index(CopyDirection direction) {
  return static_cast<std::int64_t>(direction);
}

json reference_metadata(const char* name, std::int64_t pid, std::optional<std::int64_t> tid,
                        json args) {
  json event = {{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", std::move(args)}};
  if (tid) event["tid"] = *tid;
  return event;
}

json in_memory_reference(const TraceData& data) {
  // Timestamps relative to the earliest point keep µs doubles exact to the ns.
  std::uint64_t origin = UINT64_MAX;
  if (data.window_end_ns > data.window_start_ns) origin = data.window_start_ns;
  for (const ActivityRecord& record : data.records) origin = std::min(origin, record.start_ns);
  if (origin == UINT64_MAX) origin = 0;
  auto micros = [origin](std::uint64_t ns) {
    return static_cast<double>(static_cast<std::int64_t>(ns - origin)) / 1000.0;
  };

  json events = json::array();
  std::set<std::uint32_t> devices;
  std::set<std::tuple<std::uint32_t, std::uint32_t>> streams;      // device, stream
  std::set<std::tuple<std::uint32_t, CopyDirection>> copy_tracks;  // device, direction
  std::set<std::uint32_t> host_processes;
  std::set<std::tuple<std::uint32_t, std::uint32_t>> host_threads;  // pid, tid

  for (const ActivityRecord& record : data.records) {
    json event = {
        {"ph", "X"},
        {"name", record.name.empty() ? std::string(activity_kind_name(record.kind)) : record.name},
        {"cat", activity_kind_name(record.kind)},
        {"ts", micros(record.start_ns)},
        {"dur", static_cast<double>(record.duration_ns()) / 1000.0}};
    json args = {{"correlation_id", record.correlation_id}};
    if (record.on_device()) {
      const std::int64_t pid = kDevicePidBase + record.device_id;
      devices.insert(record.device_id);
      args["device"] = record.device_id;
      args["stream"] = record.stream_id;
      if (record.kind == ActivityKind::kMemcpy) {
        event["pid"] = pid;
        event["tid"] = kCopyTidBase + direction_index(record.direction);
        copy_tracks.insert({record.device_id, record.direction});
        args["bytes"] = record.bytes;
        args["direction"] = copy_direction_name(record.direction);
        if (record.duration_ns() > 0) {
          args["bandwidth_gbps"] =
              static_cast<double>(record.bytes) / static_cast<double>(record.duration_ns());
        }
      } else {
        event["pid"] = pid;
        event["tid"] = record.stream_id;
        streams.insert({record.device_id, record.stream_id});
        if (record.kind == ActivityKind::kKernel) {
          args["grid"] = record.grid;
          args["block"] = record.block;
          args["shared_memory_bytes"] = record.shared_memory_bytes;
          args["registers_per_thread"] = record.registers_per_thread;
        } else {
          args["bytes"] = record.bytes;
        }
      }
    } else {
      event["pid"] = record.process_id;
      event["tid"] = record.thread_id;
      host_processes.insert(record.process_id);
      host_threads.insert({record.process_id, record.thread_id});
      if (record.kind == ActivityKind::kNvtxRange && !record.domain.empty()) {
        args["domain"] = record.domain;
      }
      if (record.kind == ActivityKind::kSynchronization) args["stream"] = record.stream_id;
    }
    event["args"] = std::move(args);
    events.push_back(std::move(event));
  }

  std::map<std::uint32_t, std::string> device_names;
  for (const DeviceInfo& device : data.devices) device_names[device.id] = device.name;
  for (std::uint32_t device : devices) {
    const std::int64_t pid = kDevicePidBase + device;
    const std::string name = device_names.count(device) != 0 && !device_names[device].empty()
                                 ? fmt::format("GPU {} ({})", device, device_names[device])
                                 : fmt::format("GPU {}", device);
    events.push_back(reference_metadata("process_name", pid, std::nullopt, {{"name", name}}));
    // Devices first, host processes after them.
    events.push_back(reference_metadata("process_sort_index", pid, std::nullopt,
                                        {{"sort_index", -1000 + device}}));
  }
  for (const auto& [device, stream] : streams) {
    const std::int64_t pid = kDevicePidBase + device;
    events.push_back(reference_metadata("thread_name", pid, stream,
                                        {{"name", fmt::format("stream {}", stream)}}));
    events.push_back(
        reference_metadata("thread_sort_index", pid, stream, {{"sort_index", stream}}));
  }
  for (const auto& [device, direction] : copy_tracks) {
    const std::int64_t pid = kDevicePidBase + device;
    const std::int64_t tid = kCopyTidBase + direction_index(direction);
    events.push_back(
        reference_metadata("thread_name", pid, tid,
                           {{"name", fmt::format("copies {}", copy_direction_name(direction))}}));
    // Copy tracks under the streams.
    events.push_back(reference_metadata("thread_sort_index", pid, tid,
                                        {{"sort_index", 1'000'000 + direction_index(direction)}}));
  }
  for (std::uint32_t process : host_processes) {
    events.push_back(reference_metadata("process_name", process, std::nullopt,
                                        {{"name", fmt::format("host process {}", process)}}));
  }
  for (const auto& [process, thread] : host_threads) {
    events.push_back(reference_metadata("thread_name", process, thread,
                                        {{"name", fmt::format("thread {}", thread)}}));
  }

  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ns"},
          {"otherData",
           {{"generator", "gpuopt trace"},
            {"window_start_ns", data.window_start_ns},
            {"window_end_ns", data.window_end_ns},
            {"origin_ns", origin},
            {"dropped_records", data.dropped_records}}}};
}

}  // namespace reference

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
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);  // its directory does not exist
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.json"), std::string::npos);
}

// The fixture with launches: each kernel and the memset carry the correlation id of a
// cudaLaunchKernel / cudaMemsetAsync call on host thread 17; the copies keep theirs (42, 43) from
// the cudaMemcpy calls; the two H2D copies have none. NVML samples on device 0 (realtime = CUPTI
// time + 1 ms, the fixture's offset).
TraceData launch_fixture() {
  TraceData data = fixture_trace();
  std::uint32_t next = 100;
  for (ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kKernel || record.kind == ActivityKind::kMemset) {
      record.correlation_id = next;
      ActivityRecord call = testing::api(
          record.kind == ActivityKind::kKernel ? "cudaLaunchKernel_v7000" : "cudaMemsetAsync_v3020",
          record.start_ns >= 10 ? record.start_ns - 10 : 0, next);
      data.records.push_back(call);
      ++next;
    }
  }
  return data;
}

std::vector<UtilizationSample> samples_for(const TraceData& data) {
  std::vector<UtilizationSample> samples;
  for (std::uint64_t t : {0, 250, 500, 900}) {
    samples.push_back(
        {static_cast<std::uint64_t>(static_cast<std::int64_t>(t) + data.realtime_offset_ns), 0,
         static_cast<unsigned>(t / 10)});
  }
  return samples;
}

std::string streamed(const TraceData& data, const ChromeTraceOptions& options = {}) {
  std::ostringstream out;
  EXPECT_TRUE(write_chrome_trace(data, out, options).ok());
  return out.str();
}

TEST(ChromeTraceStream, EqualsTheInMemoryWriterApartFromTheNewEvents) {
  const TraceData data = launch_fixture();
  ChromeTraceOptions options;
  options.nvml_samples = samples_for(data);
  const json parsed = json::parse(streamed(data, options));  // throws on invalid JSON
  const json expected = reference::in_memory_reference(data);
  // Undo the intended differences: the flow and counter events go, API names get their raw form.
  json events = json::array();
  int flows = 0, counters = 0, cleaned = 0;
  for (json event : parsed["traceEvents"]) {
    const std::string phase = event["ph"];
    if (phase == "s" || phase == "f") {
      ++flows;
      continue;
    }
    if (phase == "C") {
      ++counters;
      continue;
    }
    if (event.contains("args") && event["args"].contains("raw_name")) {
      if (event["name"] != event["args"]["raw_name"]) ++cleaned;
      event["name"] = event["args"]["raw_name"];
      event["args"].erase("raw_name");
    }
    events.push_back(std::move(event));
  }
  json normalised = parsed;
  normalised["traceEvents"] = std::move(events);
  EXPECT_EQ(normalised, expected);
  EXPECT_GT(flows, 0);
  EXPECT_EQ(counters, 4);
  EXPECT_GT(cleaned, 0);
}

TEST(ChromeTraceStream, EmptyTraceAndFailingStream) {
  EXPECT_EQ(json::parse(streamed(TraceData{})), reference::in_memory_reference(TraceData{}));
  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_FALSE(write_chrome_trace(fixture_trace(), broken).ok());
}

TEST(ChromeTraceFlows, EveryLaunchIsJoinedToItsDeviceWork) {
  const TraceData data = launch_fixture();
  const json trace = json::parse(streamed(data));
  // Brute force: device records whose correlation id some API record on the host carries.
  std::multiset<std::tuple<std::uint32_t, double, std::int64_t, double>>
      want;  // corr, api ts, tid, ts
  for (const ActivityRecord& device : data.records) {
    if (!device.on_device() || device.correlation_id == 0) continue;
    for (const ActivityRecord& call : data.records) {
      if (call.kind == ActivityKind::kRuntimeApi && call.correlation_id == device.correlation_id) {
        const std::int64_t tid = device.kind == ActivityKind::kMemcpy
                                     ? kCopyTidBase + static_cast<std::int64_t>(device.direction)
                                     : static_cast<std::int64_t>(device.stream_id);
        want.insert({device.correlation_id, call.start_ns / 1000.0, tid, device.start_ns / 1000.0});
      }
    }
  }
  ASSERT_EQ(want.size(), 6u);  // 3 kernels, the memset, the two copies a cudaMemcpy issued
  std::map<std::uint64_t, json> starts, finishes;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "s") {
      EXPECT_TRUE(starts.emplace(event["id"].get<std::uint64_t>(), event).second) << "duplicate id";
    } else if (event["ph"] == "f") {
      EXPECT_TRUE(finishes.emplace(event["id"].get<std::uint64_t>(), event).second)
          << "duplicate id";
    }
  }
  ASSERT_EQ(starts.size(), want.size());
  ASSERT_EQ(finishes.size(), want.size());
  std::multiset<std::tuple<std::uint32_t, double, std::int64_t, double>> got;
  for (const auto& [id, start] : starts) {
    ASSERT_EQ(finishes.count(id), 1u) << "flow " << id << " has no finish";
    const json& finish = finishes.at(id);
    EXPECT_EQ(start["pid"], 4242);
    EXPECT_EQ(start["tid"], 17);
    EXPECT_EQ(start["cat"], finish["cat"]);
    EXPECT_EQ(start["name"], finish["name"]);
    EXPECT_EQ(finish["bp"], "e");
    EXPECT_EQ(finish["pid"], kDevicePidBase);
    got.insert({finish["args"]["correlation_id"].get<std::uint32_t>(), start["ts"].get<double>(),
                finish["tid"].get<std::int64_t>(), finish["ts"].get<double>()});
  }
  EXPECT_EQ(got, want);
}

TEST(ChromeTraceFlows, CorrelationIdsArePerProcess) {
  // Two processes reuse correlation id 5; each kernel names its process, so each joins its own
  // launch. A kernel that names no process (an older record file) is ambiguous: no arrow.
  TraceData data;
  data.window_end_ns = 1000;
  ActivityRecord first = testing::api("cudaLaunchKernel_v7000", 10, 5);
  ActivityRecord second = testing::api("cudaLaunchKernel_v7000", 20, 5);
  second.process_id = 5151;
  second.thread_id = 5152;
  ActivityRecord kernel_a = testing::kernel("a", 100, 200, 7, 1);
  kernel_a.correlation_id = 5;
  kernel_a.process_id = 5151;
  ActivityRecord kernel_b = testing::kernel("b", 300, 400, 7, 1);
  kernel_b.correlation_id = 5;
  kernel_b.process_id = 4242;
  ActivityRecord unknown = testing::kernel("c", 500, 600, 7, 1);
  unknown.correlation_id = 5;
  // With --driver-api the runtime call is preferred over a driver call of the same id.
  ActivityRecord driver = testing::api("cuLaunchKernel", 12, 5);
  driver.kind = ActivityKind::kDriverApi;
  data.records = {first, second, driver, kernel_a, kernel_b, unknown};
  const json trace = json::parse(streamed(data));
  std::map<std::uint64_t, std::pair<std::int64_t, double>> starts;  // id -> tid, ts
  std::map<double, std::uint64_t> finish_by_ts;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "s") {
      starts[event["id"]] = {event["tid"].get<std::int64_t>(), event["ts"].get<double>()};
    }
    if (event["ph"] == "f") finish_by_ts[event["ts"].get<double>()] = event["id"];
  }
  ASSERT_EQ(finish_by_ts.size(), 2u);
  EXPECT_EQ(starts.at(finish_by_ts.at(0.1)), std::make_pair(std::int64_t{5152}, 0.02));
  EXPECT_EQ(starts.at(finish_by_ts.at(0.3)), std::make_pair(std::int64_t{17}, 0.01));
}

TEST(ChromeTraceCounters, NvmlSamplesBecomeACounterTrackOfTheirDevice) {
  TraceData data = fixture_trace();
  // Move the window so the first sample falls before the trace: it is left out.
  data.window_start_ns = 100;
  for (ActivityRecord& record : data.records) {
    record.start_ns = std::max<std::uint64_t>(record.start_ns, 100);
    record.end_ns = std::max(record.end_ns, record.start_ns);
  }
  ChromeTraceOptions options;
  options.nvml_samples = samples_for(data);  // at 0, 250, 500, 900 ns: 0, 25, 50, 90 %
  options.nvml_samples.push_back(
      {static_cast<std::uint64_t>(700 + data.realtime_offset_ns), 3, 66});
  const json trace = json::parse(streamed(data, options));
  std::vector<std::tuple<std::int64_t, double, unsigned>> got;
  std::set<std::string> process_names;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "C") {
      EXPECT_EQ(event["name"], kUtilizationCounterName);
      got.emplace_back(event["pid"].get<std::int64_t>(), event["ts"].get<double>(),
                       event["args"]["gpu_percent"].get<unsigned>());
    }
    if (event["ph"] == "M" && event["name"] == "process_name") {
      process_names.insert(event["args"]["name"].get<std::string>());
    }
  }
  // ts in µs after the origin (100 ns).
  const std::vector<std::tuple<std::int64_t, double, unsigned>> want = {
      {kDevicePidBase, 0.15, 25},
      {kDevicePidBase, 0.4, 50},
      {kDevicePidBase, 0.8, 90},
      {kDevicePidBase + 3, 0.6, 66}};
  EXPECT_EQ(got, want);
  // A device with samples but no activity still gets its process.
  EXPECT_TRUE(process_names.count("GPU 3")) << "no process for device 3";
}

TEST(ChromeTraceNames, ApiNamesAreCleanedAndTheRawNameKept) {
  EXPECT_EQ(clean_api_name("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
  EXPECT_EQ(clean_api_name("cudaStreamSynchronize_ptsz_v7000"), "cudaStreamSynchronize");
  EXPECT_EQ(clean_api_name("cudaMemcpyAsync_ptsz"), "cudaMemcpyAsync");
  EXPECT_EQ(clean_api_name("cuMemcpyHtoD_v2"), "cuMemcpyHtoD");
  EXPECT_EQ(clean_api_name("cuMemcpyDtoH_v2_ptds"), "cuMemcpyDtoH");
  EXPECT_EQ(clean_api_name("cudaMalloc"), "cudaMalloc");
  EXPECT_EQ(clean_api_name("cuDeviceGet"), "cuDeviceGet");
  EXPECT_EQ(clean_api_name("cudaGetDeviceCount_v3020"), "cudaGetDeviceCount");
  // Not a suffix: no digits after "_v", or nothing left before it.
  EXPECT_EQ(clean_api_name("do_v"), "do_v");
  EXPECT_EQ(clean_api_name("_v2"), "_v2");
  EXPECT_EQ(clean_api_name("runtime#42"), "runtime#42");

  const json trace = json::parse(streamed(fixture_trace()));
  std::multiset<std::string> names;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] != "X" || event["cat"] != "runtime_api") continue;
    names.insert(event["name"].get<std::string>());
    EXPECT_EQ(event["name"], clean_api_name(event["args"]["raw_name"].get<std::string>()));
    EXPECT_NE(event["args"]["raw_name"], event["name"]);  // every fixture name has a suffix
  }
  EXPECT_EQ(names,
            (std::multiset<std::string>{"cudaLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernel",
                                        "cudaStreamSynchronize", "cudaStreamSynchronize",
                                        "cudaMemcpy", "cudaMemcpy"}));
  // NVTX ranges keep their names as given.
  bool saw_range = false;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "X" && event["cat"] == "nvtx_range") {
      saw_range = true;
      EXPECT_EQ(event["name"], "step");
      EXPECT_FALSE(event["args"].contains("raw_name"));
    }
  }
  EXPECT_TRUE(saw_range);
}

TEST(ChromeTrace, AFileIsReplacedWholeAndNoTemporaryIsLeft) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / "gpuopt_chrome_trace_replace";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  const std::string path = (directory / "trace.json").string();
  { std::ofstream(path) << "old contents"; }
  ASSERT_TRUE(write_chrome_trace(launch_fixture(), path).ok());
  std::ifstream in(path);
  EXPECT_EQ(json::parse(in), json::parse(streamed(launch_fixture())));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace gpuopt::trace
