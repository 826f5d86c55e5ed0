// The summary of a hand-built trace: every figure below is worked out by hand in the comments.
#include "gpuopt/trace/summary.hpp"

#include <gtest/gtest.h>

#include "trace_fixture.hpp"

namespace gpuopt::trace {
namespace {

using testing::fixture_trace;

TEST(HostSynchronizingApi, RecognisesBlockingCallsWithSuffixes) {
  EXPECT_TRUE(is_host_synchronizing_api("cudaDeviceSynchronize_v3020"));
  EXPECT_TRUE(is_host_synchronizing_api("cudaStreamSynchronize_ptsz_v7000"));
  EXPECT_TRUE(is_host_synchronizing_api("cudaEventSynchronize"));
  EXPECT_TRUE(is_host_synchronizing_api("cudaMemcpy_ptds_v7000"));
  EXPECT_TRUE(is_host_synchronizing_api("cuCtxSynchronize"));
  EXPECT_FALSE(is_host_synchronizing_api("cudaMemcpyAsync_v3020"));
  EXPECT_FALSE(is_host_synchronizing_api("cudaMemcpyAsync_ptsz_v7000"));
  EXPECT_FALSE(is_host_synchronizing_api("cudaLaunchKernel_v7000"));
  EXPECT_FALSE(is_host_synchronizing_api("cudaStreamWaitEvent_v3020"));
  EXPECT_FALSE(is_host_synchronizing_api("cudaEventQuery"));
  EXPECT_FALSE(is_host_synchronizing_api(""));
}

TEST(Summary, CountsAndHostSynchronizations) {
  const TraceSummary summary = summarize(fixture_trace());
  EXPECT_EQ(summary.window_ns, 1000u);
  EXPECT_EQ(summary.kernels, 3);
  EXPECT_EQ(summary.memcpys, 4);
  EXPECT_EQ(summary.memsets, 1);
  EXPECT_EQ(summary.runtime_api_calls, 7);
  EXPECT_EQ(summary.nvtx_ranges, 1);
  // Two stream synchronizes + the D2H cudaMemcpy; the D2D cudaMemcpy does not block the host.
  EXPECT_EQ(summary.host_synchronizations, 3);
  EXPECT_EQ(summary.api_calls.at("cudaLaunchKernel"), 3);
  EXPECT_EQ(summary.api_calls.at("cudaStreamSynchronize"), 2);
  EXPECT_EQ(summary.api_calls.at("cudaMemcpy"), 2);
  EXPECT_EQ(summary.memcpys_by_direction.at("H2D"), 2);
  EXPECT_EQ(summary.memcpys_by_direction.at("D2H"), 1);
  EXPECT_EQ(summary.memcpys_by_direction.at("D2D"), 1);
}

TEST(Summary, DeviceBusyTimeAndOverlaps) {
  const TraceSummary summary = summarize(fixture_trace());
  ASSERT_EQ(summary.devices.size(), 1u);
  const DeviceSummary& device = summary.devices[0];
  EXPECT_EQ(device.name, "Test GPU");
  EXPECT_EQ(device.kernels, 3);
  // Kernels [100,300) [300,400) [250,350): union [100,400) = 300 of the 1000 ns window.
  EXPECT_EQ(device.kernel_busy_ns, 300u);
  EXPECT_DOUBLE_EQ(device.kernel_busy_percent, 30.0);
  // Device activity spans [0,700): copies from 0, the D2D copy ends at 700.
  EXPECT_EQ(device.active_span_ns, 700u);
  EXPECT_DOUBLE_EQ(device.kernel_busy_percent_of_active, 300.0 / 700.0 * 100.0);
  // Streams 7 and 9 both run kernels in [250,350).
  EXPECT_EQ(device.stream_overlap_ns, 100u);
  // Copies [0,120) [350,450) [600,700) against kernels [100,400): [100,120) + [350,400) = 70.
  EXPECT_EQ(device.copy_compute_overlap_ns, 70u);
  // Anything: [0,460) + [600,700) = 560.
  EXPECT_EQ(device.any_engine_busy_ns, 560u);
  // SM coverage with 4 SMs: k_a(2 blocks) 0.5, k_b(8) 1, k_a(1) 0.25:
  // [100,250) 0.5 = 75, [250,300) 0.75 = 37.5, [300,350) min(1,1.25) = 50, [350,400) 1 = 50.
  ASSERT_TRUE(device.sm_coverage_busy_percent_of_active.has_value());
  EXPECT_NEAR(*device.sm_coverage_busy_percent_of_active, 212.5 / 700.0 * 100.0, 1e-9);
  EXPECT_FALSE(device.nvml_gpu_util_percent.has_value());
}

TEST(Summary, PerStreamAndPerDirection) {
  const TraceSummary summary = summarize(fixture_trace());
  ASSERT_EQ(summary.streams.size(), 2u);
  EXPECT_EQ(summary.streams[0].stream_id, 7u);
  EXPECT_EQ(summary.streams[0].kernels, 2);
  EXPECT_EQ(summary.streams[0].memsets, 1);
  EXPECT_EQ(summary.streams[0].memcpys, 1);
  EXPECT_EQ(summary.streams[0].kernel_busy_ns, 300u);  // adjacent kernels merge
  EXPECT_EQ(summary.streams[1].stream_id, 9u);
  EXPECT_EQ(summary.streams[1].kernels, 1);
  EXPECT_EQ(summary.streams[1].memcpys, 3);
  EXPECT_EQ(summary.streams[1].kernel_busy_ns, 100u);
  EXPECT_DOUBLE_EQ(summary.streams[1].kernel_busy_percent, 10.0);

  ASSERT_EQ(summary.copies.size(), 3u);  // H2D, D2H, D2D in enum order
  EXPECT_EQ(summary.copies[0].direction, CopyDirection::kHostToDevice);
  EXPECT_EQ(summary.copies[0].count, 2);
  EXPECT_EQ(summary.copies[0].bytes, 1500u);
  EXPECT_EQ(summary.copies[0].busy_ns, 120u);  // [0,100) and [50,120) overlap
  EXPECT_EQ(summary.copies[1].direction, CopyDirection::kDeviceToHost);
  EXPECT_EQ(summary.copies[1].busy_ns, 100u);
  EXPECT_EQ(summary.copies[2].direction, CopyDirection::kDeviceToDevice);
  EXPECT_DOUBLE_EQ(summary.copies[2].busy_percent, 10.0);
}

TEST(Summary, TopKernelsByTotalTime) {
  const TraceSummary summary = summarize(fixture_trace());
  ASSERT_EQ(summary.top_kernels.size(), 2u);
  EXPECT_EQ(summary.top_kernels[0].name, "k_a");
  EXPECT_EQ(summary.top_kernels[0].count, 2);
  EXPECT_EQ(summary.top_kernels[0].total_ns, 300u);
  EXPECT_EQ(summary.top_kernels[0].max_ns, 200u);
  EXPECT_EQ(summary.top_kernels[1].name, "k_b");
  SummaryOptions options;
  options.top_kernel_count = 1;
  EXPECT_EQ(summarize(fixture_trace(), options).top_kernels.size(), 1u);
}

TEST(Summary, NvmlSamplesAveragedOverWindowAndActiveSpan) {
  SummaryOptions options;
  // realtime = CUPTI time + 1'000'000 in the fixture.
  options.nvml_samples = {{1'000'050, 0, 90},
                          {1'000'500, 0, 100},
                          {1'000'900, 0, 10},
                          {1'002'000, 0, 0},    // after the window
                          {1'000'500, 1, 55}};  // another device
  const TraceSummary summary = summarize(fixture_trace(), options);
  const DeviceSummary& device = summary.devices[0];
  EXPECT_EQ(device.nvml_samples, 3);
  ASSERT_TRUE(device.nvml_gpu_util_percent.has_value());
  EXPECT_DOUBLE_EQ(*device.nvml_gpu_util_percent, (90.0 + 100.0 + 10.0) / 3.0);
  ASSERT_TRUE(device.nvml_gpu_util_percent_of_active.has_value());
  EXPECT_DOUBLE_EQ(*device.nvml_gpu_util_percent_of_active, 95.0);  // samples at 50 and 500
}

TEST(Summary, WindowClipsIntervals) {
  TraceData data = fixture_trace();
  data.window_start_ns = 200;
  data.window_end_ns = 300;
  const TraceSummary summary = summarize(data);
  // Kernels inside [200,300): [200,300) from k_a and [250,300) from stream 9 -> union 100.
  EXPECT_EQ(summary.devices[0].kernel_busy_ns, 100u);
  EXPECT_DOUBLE_EQ(summary.devices[0].kernel_busy_percent, 100.0);
}

TEST(Summary, EmptyTraceAndMissingWindow) {
  const TraceSummary empty = summarize(TraceData{});
  EXPECT_EQ(empty.window_ns, 0u);
  EXPECT_EQ(empty.kernels, 0);
  EXPECT_TRUE(empty.devices.empty());
  // Without a window, the records' hull is used: [0,700) here, so 300/700 busy.
  TraceData data = fixture_trace();
  data.window_start_ns = data.window_end_ns = 0;
  const TraceSummary summary = summarize(data);
  EXPECT_EQ(summary.window_ns, 700u);
  // No SM count: no coverage figure rather than a made-up one.
  data.devices.clear();
  EXPECT_FALSE(summarize(data).devices[0].sm_coverage_busy_percent_of_active.has_value());
}

TEST(Summary, JsonAndTextCarryTheFigures) {
  SummaryOptions options;
  options.nvml_unavailable_reason = "UNAVAILABLE: no NVML here";
  const TraceSummary summary = summarize(fixture_trace(), options);
  const nlohmann::json json = to_json(summary);
  EXPECT_EQ(json["schema_version"], 1);
  EXPECT_EQ(json["host_synchronizations"], 3);
  EXPECT_EQ(json["devices"][0]["kernel_busy_ns"], 300);
  EXPECT_TRUE(json["devices"][0]["nvml_gpu_util_percent"].is_null());
  EXPECT_EQ(json["nvml_unavailable_reason"], "UNAVAILABLE: no NVML here");
  EXPECT_EQ(json["copies"][0]["direction"], "H2D");
  const std::string text = render_text(summary);
  EXPECT_NE(text.find("3 host synchronizations"), std::string::npos) << text;
  EXPECT_NE(text.find("kernel busy 30.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("NVML unavailable"), std::string::npos) << text;
}

}  // namespace
}  // namespace gpuopt::trace
