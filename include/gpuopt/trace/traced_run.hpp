// `gpuopt trace -- CMD`: runs a command with the CUPTI injection library loaded into it
// (CUDA_INJECTION64_PATH), samples NVML GPU-Util meanwhile, and gathers the records its processes
// wrote at exit.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

// The injection library runs inside the traced process, so run_traced passes it its settings in
// that process's environment: these variables are its interface.
inline constexpr const char* kRecordDirEnv =
    "GPUOPT_TRACE_RECORD_DIR";  // where records-<pid>.json go
inline constexpr const char* kDriverApiEnv = "GPUOPT_TRACE_DRIVER_API";  // "1": trace driver calls

struct TracedRunOptions {
  std::vector<std::string> command;  // argv; command[0] is looked up in PATH
  std::string injection_library;     // absolute path of libgpuopt_trace_inject.so
  double nvml_period_s = 0.1;
  bool driver_api = false;
};

struct TracedRun {
  int exit_status = 0;                // the command's, or 128 + signal
  std::optional<TraceData> trace;     // nullopt when no process wrote records
  std::vector<std::string> warnings;  // unreadable record files, NVML trouble
  std::vector<UtilizationSample> nvml_samples;
  std::optional<std::string> nvml_unavailable_reason;
  // SIGTERM or SIGHUP that gpuopt received while the command ran and passed on to it; 0 if none.
  // The caller should end with 128 + this signal once it has written what was traced.
  int forwarded_signal = 0;
};

// Checks, before anything runs, that an output file can be written: its directory exists and is
// writable, and the path is absent or a writable regular file (not a directory, FIFO, socket or
// device). INVALID_ARGUMENT or PERMISSION_DENIED naming the path.
Status check_output_path(const std::string& path);

// Finds libgpuopt_trace_inject.so: `override_path` when not empty (NOT_FOUND when it is not a
// readable file), else next to `executable_path`, else in ../bin, ../lib and ../../bin (the build
// tree) relative to it. NOT_FOUND naming every place tried.
StatusOr<std::string> find_injection_library(const std::string& executable_path,
                                             const std::string& override_path = {});

// Runs the command to completion; SIGTERM and SIGHUP received meanwhile are forwarded to it (see
// TracedRun::forwarded_signal), and it gets SIGTERM if gpuopt dies first. An error only when the
// tool itself fails (cannot create the record directory, fork, or the command cannot be executed:
// NOT_FOUND).
StatusOr<TracedRun> run_traced(const TracedRunOptions& options);

}  // namespace gpuopt::trace
