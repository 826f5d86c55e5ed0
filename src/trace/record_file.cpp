// The record file between the injected library and `gpuopt trace`: compact JSON, validated on read.
#include "gpuopt/trace/record_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace gpuopt::trace {
namespace {

using nlohmann::json;

// Records are arrays, not objects: PyTorch runs write hundreds of thousands of them.
// [kind, name, start, end, device, context, stream, correlation, pid, tid, direction, bytes,
//  [grid], [block], shared_memory, registers, domain]
constexpr std::size_t kRecordFields = 17;

json record_to_json(const ActivityRecord& r) {
  return json::array({activity_kind_name(r.kind), r.name, r.start_ns, r.end_ns, r.device_id,
                      r.context_id, r.stream_id, r.correlation_id, r.process_id, r.thread_id,
                      copy_direction_name(r.direction), r.bytes, r.grid, r.block,
                      r.shared_memory_bytes, r.registers_per_thread, r.domain});
}

template <typename T>
Status read_number(const json& value, T& out, std::string_view what) {
  if (!value.is_number_integer()) {
    return invalid_argument(fmt::format("{} is not an integer", what));
  }
  if constexpr (std::is_unsigned_v<T>) {
    if (value.is_number_unsigned()) {
      out = static_cast<T>(value.get<std::uint64_t>());
      return ok_status();
    }
    if (value.get<std::int64_t>() < 0) return invalid_argument(fmt::format("{} is negative", what));
  }
  out = static_cast<T>(value.get<std::int64_t>());
  return ok_status();
}

Status read_string(const json& value, std::string& out, std::string_view what) {
  if (!value.is_string()) return invalid_argument(fmt::format("{} is not a string", what));
  out = value.get<std::string>();
  return ok_status();
}

Status read_triple(const json& value, std::array<std::int32_t, 3>& out, std::string_view what) {
  if (!value.is_array() || value.size() != 3) {
    return invalid_argument(fmt::format("{} is not an array of 3 integers", what));
  }
  for (std::size_t i = 0; i < 3; ++i) GPUOPT_RETURN_IF_ERROR(read_number(value[i], out[i], what));
  return ok_status();
}

StatusOr<ActivityRecord> record_from_json(const json& value, std::size_t index) {
  const std::string where = fmt::format("records[{}]", index);
  if (!value.is_array() || value.size() != kRecordFields) {
    return invalid_argument(fmt::format("{} is not an array of {} fields", where, kRecordFields));
  }
  ActivityRecord r;
  std::string kind_name, direction_name;
  GPUOPT_RETURN_IF_ERROR(read_string(value[0], kind_name, where + " kind"));
  auto kind = parse_activity_kind(kind_name);
  if (!kind) return invalid_argument(fmt::format("{} has unknown kind '{}'", where, kind_name));
  r.kind = *kind;
  GPUOPT_RETURN_IF_ERROR(read_string(value[1], r.name, where + " name"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[2], r.start_ns, where + " start"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[3], r.end_ns, where + " end"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[4], r.device_id, where + " device"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[5], r.context_id, where + " context"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[6], r.stream_id, where + " stream"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[7], r.correlation_id, where + " correlation"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[8], r.process_id, where + " process"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[9], r.thread_id, where + " thread"));
  GPUOPT_RETURN_IF_ERROR(read_string(value[10], direction_name, where + " direction"));
  auto direction = parse_copy_direction(direction_name);
  if (!direction) {
    return invalid_argument(fmt::format("{} has unknown direction '{}'", where, direction_name));
  }
  r.direction = *direction;
  GPUOPT_RETURN_IF_ERROR(read_number(value[11], r.bytes, where + " bytes"));
  GPUOPT_RETURN_IF_ERROR(read_triple(value[12], r.grid, where + " grid"));
  GPUOPT_RETURN_IF_ERROR(read_triple(value[13], r.block, where + " block"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[14], r.shared_memory_bytes, where + " shared memory"));
  GPUOPT_RETURN_IF_ERROR(read_number(value[15], r.registers_per_thread, where + " registers"));
  GPUOPT_RETURN_IF_ERROR(read_string(value[16], r.domain, where + " domain"));
  if (r.end_ns < r.start_ns) {
    return invalid_argument(
        fmt::format("{} ends ({}) before it starts ({})", where, r.end_ns, r.start_ns));
  }
  return r;
}

const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

}  // namespace

json to_json(const TraceData& data) {
  json records = json::array();
  for (const ActivityRecord& record : data.records) records.push_back(record_to_json(record));
  json devices = json::array();
  for (const DeviceInfo& device : data.devices) {
    devices.push_back({{"id", device.id},
                       {"name", device.name},
                       {"sm_count", device.sm_count ? json(*device.sm_count) : json(nullptr)}});
  }
  return {{"schema_version", kRecordFileSchemaVersion},
          {"window_start_ns", data.window_start_ns},
          {"window_end_ns", data.window_end_ns},
          {"realtime_offset_ns", data.realtime_offset_ns},
          {"dropped_records", data.dropped_records},
          {"process_ids", data.process_ids},
          {"devices", devices},
          {"records", records}};
}

StatusOr<TraceData> trace_data_from_json(const json& value) {
  if (!value.is_object()) return invalid_argument("trace record file is not a JSON object");
  const json* version = member(value, "schema_version");
  if (version == nullptr || !version->is_number_integer() ||
      version->get<int>() != kRecordFileSchemaVersion) {
    return invalid_argument(
        fmt::format("trace record file: schema_version must be {}", kRecordFileSchemaVersion));
  }
  TraceData data;
  for (const char* key : {"window_start_ns", "window_end_ns", "realtime_offset_ns",
                          "dropped_records", "process_ids", "devices", "records"}) {
    if (member(value, key) == nullptr) {
      return invalid_argument(fmt::format("trace record file: '{}' is missing", key));
    }
  }
  GPUOPT_RETURN_IF_ERROR(
      read_number(value["window_start_ns"], data.window_start_ns, "window_start_ns"));
  GPUOPT_RETURN_IF_ERROR(read_number(value["window_end_ns"], data.window_end_ns, "window_end_ns"));
  GPUOPT_RETURN_IF_ERROR(
      read_number(value["realtime_offset_ns"], data.realtime_offset_ns, "realtime_offset_ns"));
  GPUOPT_RETURN_IF_ERROR(
      read_number(value["dropped_records"], data.dropped_records, "dropped_records"));
  if (!value["process_ids"].is_array()) return invalid_argument("process_ids is not an array");
  for (const json& pid : value["process_ids"]) {
    std::uint32_t id = 0;
    GPUOPT_RETURN_IF_ERROR(read_number(pid, id, "process_ids[]"));
    data.process_ids.push_back(id);
  }
  if (!value["devices"].is_array()) return invalid_argument("devices is not an array");
  for (std::size_t i = 0; i < value["devices"].size(); ++i) {
    const json& device = value["devices"][i];
    const std::string where = fmt::format("devices[{}]", i);
    if (!device.is_object() || !device.contains("id") || !device.contains("name") ||
        !device.contains("sm_count")) {
      return invalid_argument(where + " needs id, name and sm_count");
    }
    DeviceInfo info;
    GPUOPT_RETURN_IF_ERROR(read_number(device["id"], info.id, where + " id"));
    GPUOPT_RETURN_IF_ERROR(read_string(device["name"], info.name, where + " name"));
    if (!device["sm_count"].is_null()) {
      int sm_count = 0;
      GPUOPT_RETURN_IF_ERROR(read_number(device["sm_count"], sm_count, where + " sm_count"));
      info.sm_count = sm_count;
    }
    data.devices.push_back(std::move(info));
  }
  const json& records = value["records"];
  if (!records.is_array()) return invalid_argument("records is not an array");
  data.records.reserve(records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    GPUOPT_ASSIGN_OR_RETURN(ActivityRecord record, record_from_json(records[i], i));
    data.records.push_back(std::move(record));
  }
  return data;
}

Status write_record_file(const TraceData& data, const std::string& path) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return unavailable(fmt::format("cannot write trace records to {}", temporary));
    out << to_json(data).dump();
    out.close();
    if (!out) return unavailable(fmt::format("writing trace records to {} failed", temporary));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return unavailable(fmt::format("cannot rename {} to {}", temporary, path));
  }
  return ok_status();
}

StatusOr<TraceData> read_record_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(fmt::format("cannot open trace records {}", path));
  json value = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return invalid_argument(fmt::format("{} is not valid JSON (truncated?)", path));
  }
  auto data = trace_data_from_json(value);
  if (!data.ok()) return data.status().with_context(path);
  return data;
}

TraceData merge_traces(std::vector<TraceData> parts) {
  TraceData merged;
  bool first = true;
  std::map<std::uint32_t, DeviceInfo> devices;
  for (TraceData& part : parts) {
    if (first) {
      merged.window_start_ns = part.window_start_ns;
      merged.window_end_ns = part.window_end_ns;
      merged.realtime_offset_ns = part.realtime_offset_ns;
      first = false;
    } else {
      merged.window_start_ns = std::min(merged.window_start_ns, part.window_start_ns);
      merged.window_end_ns = std::max(merged.window_end_ns, part.window_end_ns);
    }
    merged.dropped_records += part.dropped_records;
    merged.process_ids.insert(merged.process_ids.end(), part.process_ids.begin(),
                              part.process_ids.end());
    for (DeviceInfo& device : part.devices) {
      auto [it, inserted] = devices.try_emplace(device.id, device);
      if (!inserted && !it->second.sm_count) it->second.sm_count = device.sm_count;
    }
    merged.records.insert(merged.records.end(), std::make_move_iterator(part.records.begin()),
                          std::make_move_iterator(part.records.end()));
  }
  for (auto& [id, device] : devices) merged.devices.push_back(std::move(device));
  return merged;
}

}  // namespace gpuopt::trace
