// Chrome trace JSON writer: the layout (process per device, track per stream and per copy
// direction, host process with a track per OS thread) is what makes idle gaps visible in Perfetto;
// the flow arrows say which call issued which kernel. Events are written one at a time, so a long
// trace never exists as one JSON document in memory.
#include "gpuopt/trace/chrome_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "gpuopt/core/output_file.hpp"

namespace gpuopt::trace {
namespace {

using nlohmann::json;

std::int64_t direction_index(CopyDirection direction) {
  return static_cast<std::int64_t>(direction);
}

bool is_api(const ActivityRecord& record) {
  return record.kind == ActivityKind::kRuntimeApi || record.kind == ActivityKind::kDriverApi;
}

json metadata(const char* name, std::int64_t pid, std::optional<std::int64_t> tid, json args) {
  json event = {{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", std::move(args)}};
  if (tid) event["tid"] = *tid;
  return event;
}

// The track of a device activity: its stream, or the copy track of its direction.
std::int64_t device_tid(const ActivityRecord& record) {
  return record.kind == ActivityKind::kMemcpy ? kCopyTidBase + direction_index(record.direction)
                                              : static_cast<std::int64_t>(record.stream_id);
}

// The API call that issued a device activity: same correlation id, same process when the device
// record names one (correlation ids are per process, and a merged trace holds several), the
// runtime call rather than the driver call beneath it. Null when none, or when the choice is not
// unique (an old record file without the device record's process, from several processes).
class LaunchIndex {
 public:
  explicit LaunchIndex(const std::vector<ActivityRecord>& records) : records_(records) {
    for (std::size_t i = 0; i < records.size(); ++i) {
      if (is_api(records[i]) && records[i].correlation_id != 0) {
        by_correlation_[records[i].correlation_id].push_back(i);
      }
    }
  }

  const ActivityRecord* issuer_of(const ActivityRecord& device) const {
    if (device.correlation_id == 0) return nullptr;
    auto it = by_correlation_.find(device.correlation_id);
    if (it == by_correlation_.end()) return nullptr;
    for (ActivityKind kind : {ActivityKind::kRuntimeApi, ActivityKind::kDriverApi}) {
      const ActivityRecord* found = nullptr;
      int matches = 0;
      for (std::size_t index : it->second) {
        const ActivityRecord& api = records_[index];
        if (api.kind != kind) continue;
        if (device.process_id != 0 && api.process_id != device.process_id) continue;
        found = &api;
        ++matches;
      }
      if (matches == 1) return found;
      if (matches > 1) return nullptr;
    }
    return nullptr;
  }

 private:
  const std::vector<ActivityRecord>& records_;
  std::unordered_map<std::uint32_t, std::vector<std::size_t>> by_correlation_;
};

// Writes "[e1,e2,...": a comma before each event but the first.
class EventWriter {
 public:
  explicit EventWriter(std::ostream& out) : out_(out) {}
  void write(const json& event) {
    if (count_++ > 0) out_ << ',';
    out_ << '\n' << event.dump();
  }

 private:
  std::ostream& out_;
  std::size_t count_ = 0;
};

}  // namespace

Status write_chrome_trace(const TraceData& data, std::ostream& out,
                          const ChromeTraceOptions& options) {
  // Timestamps relative to the earliest point keep µs doubles exact to the ns.
  std::uint64_t origin = UINT64_MAX;
  if (data.window_end_ns > data.window_start_ns) origin = data.window_start_ns;
  for (const ActivityRecord& record : data.records) origin = std::min(origin, record.start_ns);
  if (origin == UINT64_MAX) origin = 0;
  auto micros = [origin](std::uint64_t ns) {
    return static_cast<double>(static_cast<std::int64_t>(ns - origin)) / 1000.0;
  };

  std::set<std::uint32_t> devices;
  std::set<std::tuple<std::uint32_t, std::uint32_t>> streams;      // device, stream
  std::set<std::tuple<std::uint32_t, CopyDirection>> copy_tracks;  // device, direction
  std::set<std::uint32_t> host_processes;
  std::set<std::tuple<std::uint32_t, std::uint32_t>> host_threads;  // pid, tid
  const LaunchIndex launches(data.records);
  std::uint64_t next_flow_id = 1;

  out << "{\"traceEvents\":[";
  EventWriter events(out);
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
      event["pid"] = pid;
      event["tid"] = device_tid(record);
      if (record.kind == ActivityKind::kMemcpy) {
        copy_tracks.insert({record.device_id, record.direction});
        args["bytes"] = record.bytes;
        args["direction"] = copy_direction_name(record.direction);
        if (record.duration_ns() > 0) {
          args["bandwidth_gbps"] =
              static_cast<double>(record.bytes) / static_cast<double>(record.duration_ns());
        }
      } else {
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
      if (is_api(record)) {
        // The viewer shows the name people know; CUPTI's own name stays searchable in args.
        event["name"] = clean_api_name(record.name);
        args["raw_name"] = record.name;
      }
      if (record.kind == ActivityKind::kNvtxRange && !record.domain.empty()) {
        args["domain"] = record.domain;
      }
      if (record.kind == ActivityKind::kSynchronization) args["stream"] = record.stream_id;
    }
    event["args"] = std::move(args);
    events.write(event);

    if (!record.on_device()) continue;
    const ActivityRecord* issuer = launches.issuer_of(record);
    if (issuer == nullptr) continue;
    // One arrow per launch: from the call on its host thread to the work on its device track.
    const std::uint64_t id = next_flow_id++;
    events.write({{"ph", "s"},
                  {"name", "launch"},
                  {"cat", "launch"},
                  {"id", id},
                  {"pid", issuer->process_id},
                  {"tid", issuer->thread_id},
                  {"ts", micros(issuer->start_ns)}});
    events.write({{"ph", "f"},
                  {"bp", "e"},
                  {"name", "launch"},
                  {"cat", "launch"},
                  {"id", id},
                  {"pid", kDevicePidBase + record.device_id},
                  {"tid", device_tid(record)},
                  {"ts", micros(record.start_ns)},
                  {"args", {{"correlation_id", record.correlation_id}}}});
  }

  // NVML samples as a counter track of their device, in CUPTI's clock.
  for (const UtilizationSample& sample : options.nvml_samples) {
    const std::int64_t cupti_ns =
        static_cast<std::int64_t>(sample.realtime_ns) - data.realtime_offset_ns;
    if (cupti_ns < static_cast<std::int64_t>(origin)) continue;
    devices.insert(sample.device_id);
    events.write({{"ph", "C"},
                  {"name", kUtilizationCounterName},
                  {"pid", kDevicePidBase + sample.device_id},
                  {"ts", micros(static_cast<std::uint64_t>(cupti_ns))},
                  {"args", {{"gpu_percent", sample.gpu_percent}}}});
  }

  std::map<std::uint32_t, std::string> device_names;
  for (const DeviceInfo& device : data.devices) device_names[device.id] = device.name;
  for (std::uint32_t device : devices) {
    const std::int64_t pid = kDevicePidBase + device;
    const std::string name = device_names.count(device) != 0 && !device_names[device].empty()
                                 ? fmt::format("GPU {} ({})", device, device_names[device])
                                 : fmt::format("GPU {}", device);
    events.write(metadata("process_name", pid, std::nullopt, {{"name", name}}));
    // Devices first, host processes after them.
    events.write(
        metadata("process_sort_index", pid, std::nullopt, {{"sort_index", -1000 + device}}));
  }
  for (const auto& [device, stream] : streams) {
    const std::int64_t pid = kDevicePidBase + device;
    events.write(
        metadata("thread_name", pid, stream, {{"name", fmt::format("stream {}", stream)}}));
    events.write(metadata("thread_sort_index", pid, stream, {{"sort_index", stream}}));
  }
  for (const auto& [device, direction] : copy_tracks) {
    const std::int64_t pid = kDevicePidBase + device;
    const std::int64_t tid = kCopyTidBase + direction_index(direction);
    events.write(metadata("thread_name", pid, tid,
                          {{"name", fmt::format("copies {}", copy_direction_name(direction))}}));
    // Copy tracks under the streams.
    events.write(metadata("thread_sort_index", pid, tid,
                          {{"sort_index", 1'000'000 + direction_index(direction)}}));
  }
  for (std::uint32_t process : host_processes) {
    events.write(metadata("process_name", process, std::nullopt,
                          {{"name", fmt::format("host process {}", process)}}));
  }
  for (const auto& [process, thread] : host_threads) {
    events.write(
        metadata("thread_name", process, thread, {{"name", fmt::format("thread {}", thread)}}));
  }

  const json other = {{"generator", "gpuopt trace"},
                      {"window_start_ns", data.window_start_ns},
                      {"window_end_ns", data.window_end_ns},
                      {"origin_ns", origin},
                      {"dropped_records", data.dropped_records}};
  out << "\n],\"displayTimeUnit\":\"ns\",\"otherData\":" << other.dump() << "}\n";
  out.flush();
  if (!out) return internal_error("writing the Chrome trace failed");
  return ok_status();
}

Status write_chrome_trace(const TraceData& data, const std::string& path,
                          const ChromeTraceOptions& options) {
  // Streamed into a file beside `path`, flushed to disk and renamed over it: a crash leaves the
  // old file or the whole new one.
  return write_file_atomically(
      path, [&](std::ostream& out) { return write_chrome_trace(data, out, options); });
}

json chrome_trace_json(const TraceData& data, const ChromeTraceOptions& options) {
  std::stringstream text;
  Status written = write_chrome_trace(data, text, options);
  if (!written.ok()) return json();
  return json::parse(text);
}

}  // namespace gpuopt::trace
