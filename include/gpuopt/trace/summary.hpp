// What a trace says in numbers: counts, per-stream and per-copy-direction busy time over the traced
// window, overlap between streams, host synchronizations, and NVML GPU-Util beside busy time.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace {

// True for runtime/driver API names that block the calling host thread until the GPU catches up:
// device/stream/event synchronize and the synchronous memcpy family. Version suffixes ("_v2") are
// ignored. The loss-scaler's "no host synchronisation" evidence counts these.
bool is_host_synchronizing_api(std::string_view api_name);

// One NVML GPU-Util reading, its time in CLOCK_REALTIME ns.
struct UtilizationSample {
  std::uint64_t realtime_ns = 0;
  std::uint32_t device_id = 0;  // CUDA ordinal
  unsigned gpu_percent = 0;
};

struct StreamSummary {
  std::uint32_t device_id = 0;
  std::uint32_t stream_id = 0;
  std::int64_t kernels = 0;
  std::int64_t memsets = 0;
  std::int64_t memcpys = 0;
  std::uint64_t kernel_busy_ns = 0;  // union of this stream's kernel intervals in the window
  double kernel_busy_percent = 0;    // of the window
};

struct CopySummary {
  std::uint32_t device_id = 0;
  CopyDirection direction = CopyDirection::kUnknown;
  std::int64_t count = 0;
  std::uint64_t bytes = 0;
  std::uint64_t busy_ns = 0;  // union of this direction's copy intervals in the window
  double busy_percent = 0;
};

struct DeviceSummary {
  std::uint32_t device_id = 0;
  std::string name;
  std::optional<int> sm_count;
  std::int64_t kernels = 0;
  std::uint64_t kernel_busy_ns = 0;  // union of all kernels on the device, in the window
  double kernel_busy_percent = 0;    // over the traced window
  // First to last device activity: excludes start-up (context creation, imports) and tear-down.
  std::uint64_t active_span_ns = 0;
  double kernel_busy_percent_of_active = 0;
  // Kernel busy time weighted by min(1, blocks / SMs): how much of the GPU's SMs had any block.
  // nullopt without an SM count. One block spinning on one SM counts as 1/SMs busy.
  std::optional<double> sm_coverage_busy_percent_of_active;
  std::uint64_t stream_overlap_ns = 0;        // kernels of two or more streams running at once
  std::uint64_t copy_compute_overlap_ns = 0;  // any copy running while any kernel runs
  std::uint64_t any_engine_busy_ns = 0;       // kernels, copies or memsets
  // NVML GPU-Util averaged over the samples taken in the active span (and in the whole window).
  std::optional<double> nvml_gpu_util_percent_of_active;
  std::optional<double> nvml_gpu_util_percent;
  int nvml_samples = 0;
};

struct KernelNameSummary {
  std::string name;
  std::int64_t count = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t max_ns = 0;
};

struct TraceSummary {
  std::uint64_t window_ns = 0;
  std::int64_t kernels = 0;
  std::int64_t memcpys = 0;
  std::int64_t memsets = 0;
  std::int64_t runtime_api_calls = 0;
  std::int64_t driver_api_calls = 0;
  std::int64_t nvtx_ranges = 0;
  std::int64_t synchronization_records = 0;
  // Runtime (and driver, when traced) API calls that block the host (is_host_synchronizing_api).
  std::int64_t host_synchronizations = 0;
  std::map<std::string, std::int64_t> api_calls;             // per API name, runtime and driver
  std::map<std::string, std::int64_t> memcpys_by_direction;  // "H2D" -> count
  std::vector<DeviceSummary> devices;
  std::vector<StreamSummary> streams;
  std::vector<CopySummary> copies;
  std::vector<KernelNameSummary> top_kernels;  // by total time, at most `top_kernel_count`
  std::uint64_t dropped_records = 0;
  std::optional<std::string> nvml_unavailable_reason;
};

struct SummaryOptions {
  int top_kernel_count = 10;
  std::vector<UtilizationSample> nvml_samples;         // empty: NVML figures stay null
  std::optional<std::string> nvml_unavailable_reason;  // why there are no samples
};

TraceSummary summarize(const TraceData& data, const SummaryOptions& options = {});

nlohmann::json to_json(const TraceSummary& summary);
// A few lines for people: window, counts, busy per device/stream/direction, NVML beside busy.
std::string render_text(const TraceSummary& summary);

}  // namespace gpuopt::trace
