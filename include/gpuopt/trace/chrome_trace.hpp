// Chrome trace JSON (the "traceEvents" format Perfetto and chrome://tracing open): one process per
// device with a track per stream and per copy direction, and one process per traced host process
// with a track per thread for API calls and NVTX ranges.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gpuopt/core/status.hpp"
#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

// Process ids in the trace: devices get kDevicePidBase + ordinal so they never clash with OS pids.
inline constexpr std::int64_t kDevicePidBase = 1'000'000'000;
// Copy tracks inside a device process: kCopyTidBase + direction index (streams use their own id).
inline constexpr std::int64_t kCopyTidBase = 1'000'000'000;

// "X" events with ts/dur in µs relative to the window start, "M" metadata naming processes and
// threads, args carrying grid/block/bytes/stream/correlation id.
nlohmann::json chrome_trace_json(const TraceData& data);

Status write_chrome_trace(const TraceData& data, const std::string& path);

}  // namespace gpuopt::trace
