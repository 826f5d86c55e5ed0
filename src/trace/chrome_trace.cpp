// Chrome trace JSON writer: the layout (process per device, track per stream and per copy
// direction, host process with a track per thread) is what makes idle gaps visible in Perfetto.
#include "gpuopt/trace/chrome_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

namespace gpuopt::trace {
namespace {

using nlohmann::json;

std::int64_t direction_index(CopyDirection direction) {
  return static_cast<std::int64_t>(direction);
}

json metadata(const char* name, std::int64_t pid, std::optional<std::int64_t> tid, json args) {
  json event = {{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", std::move(args)}};
  if (tid) event["tid"] = *tid;
  return event;
}

}  // namespace

json chrome_trace_json(const TraceData& data) {
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
    events.push_back(metadata("process_name", pid, std::nullopt, {{"name", name}}));
    // Devices first, host processes after them.
    events.push_back(
        metadata("process_sort_index", pid, std::nullopt, {{"sort_index", -1000 + device}}));
  }
  for (const auto& [device, stream] : streams) {
    const std::int64_t pid = kDevicePidBase + device;
    events.push_back(
        metadata("thread_name", pid, stream, {{"name", fmt::format("stream {}", stream)}}));
    events.push_back(metadata("thread_sort_index", pid, stream, {{"sort_index", stream}}));
  }
  for (const auto& [device, direction] : copy_tracks) {
    const std::int64_t pid = kDevicePidBase + device;
    const std::int64_t tid = kCopyTidBase + direction_index(direction);
    events.push_back(
        metadata("thread_name", pid, tid,
                 {{"name", fmt::format("copies {}", copy_direction_name(direction))}}));
    // Copy tracks under the streams.
    events.push_back(metadata("thread_sort_index", pid, tid,
                              {{"sort_index", 1'000'000 + direction_index(direction)}}));
  }
  for (std::uint32_t process : host_processes) {
    events.push_back(metadata("process_name", process, std::nullopt,
                              {{"name", fmt::format("host process {}", process)}}));
  }
  for (const auto& [process, thread] : host_threads) {
    events.push_back(
        metadata("thread_name", process, thread, {{"name", fmt::format("thread {}", thread)}}));
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

Status write_chrome_trace(const TraceData& data, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return unavailable(fmt::format("cannot write the Chrome trace to {}", path));
  out << chrome_trace_json(data).dump();
  out.close();
  if (!out) return unavailable(fmt::format("writing the Chrome trace to {} failed", path));
  return ok_status();
}

}  // namespace gpuopt::trace
