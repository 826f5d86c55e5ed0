// The file the injected library writes at process exit and `gpuopt trace` reads back: TraceData as
// JSON with a schema version. Reading validates every field and names what is wrong and where.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

inline constexpr int kRecordFileSchemaVersion = 1;

nlohmann::json to_json(const TraceData& data);
StatusOr<TraceData> trace_data_from_json(const nlohmann::json& json);

// Writes to `path` + ".tmp" then renames, so a reader never sees half a file.
Status write_record_file(const TraceData& data, const std::string& path);
StatusOr<TraceData> read_record_file(const std::string& path);

// One trace from several processes' files (DataLoader workers, launchers): records concatenated,
// window the hull of theirs, device lists merged by id, dropped counts added.
TraceData merge_traces(std::vector<TraceData> parts);

}  // namespace gpuopt::trace
