// The activity record model shared by the CUPTI collector, the record file, the Chrome trace writer
// and the summary: plain structs, host-compilable, no CUDA types.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuopt::trace {

enum class ActivityKind {
  kKernel,           // a kernel on a device stream
  kMemcpy,           // a copy; `direction` says which way
  kMemset,           // a memset on a device stream
  kRuntimeApi,       // a CUDA runtime call on a host thread
  kDriverApi,        // a CUDA driver call on a host thread
  kNvtxRange,        // an NVTX push/pop or start/end range on a host thread
  kSynchronization,  // CUPTI's synchronization record (event/stream/context sync, stream wait)
};

enum class CopyDirection {
  kHostToDevice,
  kDeviceToHost,
  kDeviceToDevice,
  kHostToHost,
  kPeerToPeer,
  kUnknown,
};

std::string_view activity_kind_name(ActivityKind kind);         // "kernel", "memcpy", ...
std::string_view copy_direction_name(CopyDirection direction);  // "H2D", "D2H", ...
// A CUDA API name as people know it: CUPTI's callback name less its version and per-thread
// default-stream suffixes ("cudaLaunchKernel_v7000" -> "cudaLaunchKernel",
// "cudaStreamSynchronize_ptsz_v7000" -> "cudaStreamSynchronize", "cuMemcpyHtoD_v2" ->
// "cuMemcpyHtoD"). A name without such a suffix comes back unchanged.
std::string clean_api_name(std::string_view name);
// Inverse of the two above; nullopt for an unknown name.
std::optional<ActivityKind> parse_activity_kind(std::string_view name);
std::optional<CopyDirection> parse_copy_direction(std::string_view name);

// One activity with start/end in CUPTI's clock (ns). Device activities fill device/stream (and the
// process that issued them, 0 when unknown), host activities fill process/thread (the OS thread
// id); fields that do not apply stay zero.
struct ActivityRecord {
  ActivityKind kind = ActivityKind::kKernel;
  // Kernel (demangled), API ("cudaStreamSynchronize"), NVTX message, or synchronization type.
  std::string name;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint32_t device_id = 0;
  std::uint32_t context_id = 0;
  std::uint32_t stream_id = 0;
  std::uint32_t correlation_id = 0;  // links a device activity to the API call that issued it
  std::uint32_t process_id = 0;
  std::uint32_t thread_id = 0;
  // Copies and memsets.
  CopyDirection direction = CopyDirection::kUnknown;
  std::uint64_t bytes = 0;
  // Kernels.
  std::array<std::int32_t, 3> grid = {0, 0, 0};
  std::array<std::int32_t, 3> block = {0, 0, 0};
  std::int32_t shared_memory_bytes = 0;  // static + dynamic
  std::uint16_t registers_per_thread = 0;
  // NVTX ranges: the domain, empty for the default one.
  std::string domain;

  std::uint64_t duration_ns() const { return end_ns > start_ns ? end_ns - start_ns : 0; }
  std::int64_t grid_blocks() const {
    return static_cast<std::int64_t>(grid[0]) * grid[1] * grid[2];
  }
  bool on_device() const {
    return kind == ActivityKind::kKernel || kind == ActivityKind::kMemcpy ||
           kind == ActivityKind::kMemset;
  }
};

struct DeviceInfo {
  std::uint32_t id = 0;  // CUDA device ordinal, as in ActivityRecord::device_id
  std::string name;
  std::optional<int> sm_count;
};

// Everything one traced process (or a merge of several) produced.
struct TraceData {
  std::vector<ActivityRecord> records;
  std::vector<DeviceInfo> devices;
  // The traced window in CUPTI's clock: Tracer::start..stop, or injection..process exit.
  std::uint64_t window_start_ns = 0;
  std::uint64_t window_end_ns = 0;
  // CLOCK_REALTIME minus CUPTI's clock at the window start, to place host-side samples (NVML).
  std::int64_t realtime_offset_ns = 0;
  std::uint64_t dropped_records = 0;  // records CUPTI or the record cap lost
  std::vector<std::uint32_t> process_ids;
};

}  // namespace gpuopt::trace
