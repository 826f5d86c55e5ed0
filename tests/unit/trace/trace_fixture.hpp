// A hand-built trace whose busy times, overlaps and counts are worked out in summary_test.cpp.
#pragma once

#include "gpuopt/trace/trace_types.hpp"

namespace gpuopt::trace::testing {

inline ActivityRecord device_record(ActivityKind kind, const char* name, std::uint64_t start,
                                    std::uint64_t end, std::uint32_t stream,
                                    std::uint32_t correlation = 0) {
  ActivityRecord record;
  record.kind = kind;
  record.name = name;
  record.start_ns = start;
  record.end_ns = end;
  record.stream_id = stream;
  record.correlation_id = correlation;
  return record;
}

inline ActivityRecord kernel(const char* name, std::uint64_t start, std::uint64_t end,
                             std::uint32_t stream, int blocks) {
  ActivityRecord record = device_record(ActivityKind::kKernel, name, start, end, stream);
  record.grid = {blocks, 1, 1};
  record.block = {128, 1, 1};
  return record;
}

inline ActivityRecord copy(CopyDirection direction, std::uint64_t start, std::uint64_t end,
                           std::uint32_t stream, std::uint64_t bytes,
                           std::uint32_t correlation = 0) {
  ActivityRecord record =
      device_record(ActivityKind::kMemcpy, "memcpy", start, end, stream, correlation);
  record.direction = direction;
  record.bytes = bytes;
  return record;
}

inline ActivityRecord api(const char* name, std::uint64_t start, std::uint32_t correlation = 0) {
  ActivityRecord record;
  record.kind = ActivityKind::kRuntimeApi;
  record.name = name;
  record.start_ns = start;
  record.end_ns = start + 5;
  record.process_id = 4242;
  record.thread_id = 17;
  record.correlation_id = correlation;
  return record;
}

// Window [0, 1000) on device 0 with 4 SMs. Deliberately unsorted.
inline TraceData fixture_trace() {
  TraceData data;
  data.window_start_ns = 0;
  data.window_end_ns = 1000;
  data.realtime_offset_ns = 1'000'000;
  data.devices = {{0, "Test GPU", 4}};
  data.process_ids = {4242};
  data.records = {
      kernel("k_b", 300, 400, 7, 8),  // adjacent to the k_a on stream 7
      kernel("k_a", 100, 300, 7, 2),
      kernel("k_a", 250, 350, 9, 1),
      copy(CopyDirection::kHostToDevice, 0, 100, 7, 1000),
      copy(CopyDirection::kHostToDevice, 50, 120, 9, 500),
      copy(CopyDirection::kDeviceToHost, 350, 450, 9, 2000, 43),
      copy(CopyDirection::kDeviceToDevice, 600, 700, 9, 10, 42),
      device_record(ActivityKind::kMemset, "memset", 450, 460, 7),
      api("cudaLaunchKernel_v7000", 90),
      api("cudaLaunchKernel_v7000", 95),
      api("cudaLaunchKernel_v7000", 240),
      api("cudaStreamSynchronize_v3020", 460),
      api("cudaStreamSynchronize_ptsz_v7000", 470),
      api("cudaMemcpy_v3020", 590, 42),  // device to device: does not block the host
      api("cudaMemcpy_v3020", 340, 43),  // device to host: blocks
  };
  ActivityRecord range;
  range.kind = ActivityKind::kNvtxRange;
  range.name = "step";
  range.start_ns = 80;
  range.end_ns = 480;
  range.process_id = 4242;
  range.thread_id = 17;
  data.records.push_back(range);
  return data;
}

}  // namespace gpuopt::trace::testing
