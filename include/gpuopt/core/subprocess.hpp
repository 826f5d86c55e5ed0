// Runs a child process with its output captured to files and a wall-clock limit, so one stage of
// a multi-stage job (audit) can fail or hang without taking the others down.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

struct SubprocessResult {
  int exit_code = -1;      // the child's exit status; -1 when killed by a signal
  int signal = 0;          // the signal that ended it, 0 otherwise
  bool timed_out = false;  // killed because it ran past the limit
  double seconds = 0;      // wall time
};

// Starts argv[0] (a path) with argv, stdout → stdout_path, stderr → stderr_path (truncated), and
// waits at most `limit`; past it the child's process group gets SIGTERM, then SIGKILL. A failure to
// start is a Status; the child's own failure is in the result.
StatusOr<SubprocessResult> run_subprocess(const std::vector<std::string>& argv,
                                          const std::string& stdout_path,
                                          const std::string& stderr_path,
                                          std::chrono::milliseconds limit);

// The running executable's absolute path (/proc/self/exe).
StatusOr<std::string> current_executable();

}  // namespace gpuopt
