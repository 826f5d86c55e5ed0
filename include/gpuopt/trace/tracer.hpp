// In-process tracing with the CUPTI Activity API: start(), run GPU work, synchronize, stop() → the
// records. CUPTI's activity state is per process, so one Tracer may be active at a time (the
// injection library used by `gpuopt trace` is built on the same class).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpuopt/core/status.hpp"
#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

struct TracerOptions {
  bool runtime_api = true;      // CUDA runtime calls (needed for host_synchronizations)
  bool driver_api = false;      // CUDA driver calls: many records, off by default
  bool nvtx = true;             // NVTX ranges (needs NVTX_INJECTION64_PATH; start() sets it)
  bool synchronization = true;  // CUPTI synchronization records
  std::size_t buffer_bytes = 8u << 20;     // each CUPTI activity buffer
  std::uint64_t max_records = 20'000'000;  // beyond this, records are counted as dropped
  // start() first checks that a CUDA device is usable. The injection library turns this off: it
  // runs inside the driver's cuInit, where calling the runtime back would deadlock.
  bool require_device = true;
};

class Tracer {
 public:
  // True when this build has CUPTI (built with CUDA). Whether a GPU is present is start()'s call.
  static bool built_with_cupti();

  explicit Tracer(TracerOptions options = {});
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  ~Tracer();  // stops an active trace, reporting (not returning) errors

  // Enables the activity kinds. UNIMPLEMENTED without CUDA, FAILED_PRECONDITION when another Tracer
  // in this process is active, CUPTI's error otherwise. NVTX ranges are only seen when
  // NVTX_INJECTION64_PATH pointed at libcupti before the program's first NVTX call; start() sets it
  // (without overriding) for programs that have not called NVTX yet.
  Status start();
  // Flushes every buffer (forced, so records of finished work are never left behind) and returns
  // what was collected. Synchronize the streams first: kernels still running are not reported.
  StatusOr<TraceData> stop();

  bool active() const { return active_; }

 private:
  TracerOptions options_;
  bool active_ = false;
};

}  // namespace gpuopt::trace
