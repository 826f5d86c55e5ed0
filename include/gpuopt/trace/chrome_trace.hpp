// Chrome trace JSON (the "traceEvents" format Perfetto and chrome://tracing open): one process per
// device with a track per stream and per copy direction and an NVML GPU-Util counter track, one
// process per traced host process with a track per OS thread for API calls and NVTX ranges, and a
// flow arrow from each API call to the device work it issued (joined by correlation id).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

// Process ids in the trace: devices get kDevicePidBase + ordinal so they never clash with OS pids.
inline constexpr std::int64_t kDevicePidBase = 1'000'000'000;
// Copy tracks inside a device process: kCopyTidBase + direction index (streams use their own id).
inline constexpr std::int64_t kCopyTidBase = 1'000'000'000;
// Name of the counter track ("ph": "C") that carries the NVML samples in each device process.
inline constexpr const char* kUtilizationCounterName = "GPU-Util (NVML)";

struct ChromeTraceOptions {
  // NVML GPU-Util readings (CLOCK_REALTIME, mapped into CUPTI's clock with the trace's
  // realtime_offset_ns); each becomes a counter event on its device. Samples before the trace's
  // first point are left out.
  std::vector<UtilizationSample> nvml_samples;
};

// Writes the trace to `out` one event at a time: memory stays proportional to the number of tracks
// and of launching API calls (for the correlation join), not to the size of the JSON.
//   "X" events, ts/dur in µs relative to the window start, args with grid/block/bytes/stream/
//       correlation id; API calls are shown under clean_api_name() with CUPTI's name in
//       args.raw_name;
//   "s"/"f" flow pairs from an API call (start bound to the call's slice) to the kernel, copy or
//       memset with the same correlation id (finish bound to the enclosing slice, "bp": "e"), each
//       pair with its own id;
//   "C" counter events of kUtilizationCounterName with args.gpu_percent;
//   "M" metadata naming processes and threads.
// INTERNAL when the stream fails.
Status write_chrome_trace(const TraceData& data, std::ostream& out,
                          const ChromeTraceOptions& options = {});

// The same, into `path`: written to a temporary file beside it, flushed to disk and renamed over it
// (a reader never sees half a trace). UNAVAILABLE naming the path when it cannot be written.
Status write_chrome_trace(const TraceData& data, const std::string& path,
                          const ChromeTraceOptions& options = {});

// The streamed trace parsed back into a document: for small traces and tests.
nlohmann::json chrome_trace_json(const TraceData& data, const ChromeTraceOptions& options = {});

}  // namespace gpuopt::trace
