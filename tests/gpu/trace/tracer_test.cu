// The in-process Tracer on a workload with known counts: exactly those kernels, copies and memsets,
// kernel durations within 5% of CUDA events around each kernel, host synchronizations counted.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "common/test_support.hpp"
#include "gpuopt/trace/chrome_trace.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/tracer.hpp"
#include "programs/known_workload.cuh"

namespace gpuopt::trace {
namespace {

using gpuopt_trace_test::KernelTiming;
using gpuopt_trace_test::KnownCounts;
using gpuopt_trace_test::KnownWorkload;

constexpr std::uint64_t kKernelNs = 1'000'000;  // ~1 ms: event overheads are well under 5%

class TracerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUOPT_REQUIRE_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    for (auto& stream : streams_) {
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    }
    ASSERT_EQ(workload_.prepare(), "");
  }
  void TearDown() override {
    workload_.release();
    for (auto& stream : streams_) {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  }

  // One traced run after an untraced warm-up (module loading would otherwise land between the
  // first kernel's events). The warm-up runs under a throwaway trace so that start() has routed
  // NVTX to CUPTI before the workload's first NVTX call.
  TraceData traced_run(std::vector<KernelTiming>* timings) {
    Tracer warm_up_tracer;
    EXPECT_TRUE(warm_up_tracer.start().ok());
    EXPECT_EQ(workload_.run(streams_, kKernelNs, nullptr), "");
    EXPECT_TRUE(warm_up_tracer.stop().ok());

    Tracer tracer;
    Status started = tracer.start();
    EXPECT_TRUE(started.ok()) << started.to_string();
    EXPECT_EQ(workload_.run(streams_, kKernelNs, timings), "");
    auto data = tracer.stop();
    EXPECT_TRUE(data.ok()) << data.status().to_string();
    return data.ok() ? *data : TraceData{};
  }

  cudaStream_t streams_[2] = {nullptr, nullptr};
  KnownWorkload workload_;
};

int count_kernels(const TraceData& data, const std::string& prefix) {
  return static_cast<int>(std::count_if(data.records.begin(), data.records.end(), [&](auto& r) {
    return r.kind == ActivityKind::kKernel && r.name.rfind(prefix, 0) == 0;
  }));
}

TEST_F(TracerGpuTest, KnownWorkloadHasExactlyTheKnownCounts) {
  std::vector<KernelTiming> timings;
  const TraceData data = traced_run(&timings);
  TraceSummary summary = summarize(data);
  const KnownCounts expected;
  EXPECT_EQ(summary.dropped_records, 0u);
  EXPECT_EQ(summary.kernels, expected.kernels);
  EXPECT_EQ(count_kernels(data, "gpuopt_trace_test::k_spin_for"), expected.spin_kernels);
  EXPECT_EQ(count_kernels(data, "gpuopt_trace_test::k_scale_after_spin"), expected.scale_kernels);
  EXPECT_EQ(count_kernels(data, "gpuopt_trace_test::k_sum_after_spin"), expected.sum_kernels);
  EXPECT_EQ(summary.memcpys, expected.h2d + expected.d2h);
  EXPECT_EQ(summary.memcpys_by_direction["H2D"], expected.h2d);
  EXPECT_EQ(summary.memcpys_by_direction["D2H"], expected.d2h);
  EXPECT_EQ(summary.memsets, expected.memsets);
  EXPECT_EQ(summary.host_synchronizations, expected.host_synchronizations);
  EXPECT_EQ(summary.api_calls["cudaStreamSynchronize"], 2);
  EXPECT_EQ(summary.api_calls["cudaLaunchKernel"], expected.kernels);
  std::set<std::uint32_t> kernel_streams;
  for (const ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kKernel) kernel_streams.insert(record.stream_id);
    if (record.on_device()) {
      EXPECT_GE(record.start_ns, data.window_start_ns);
      EXPECT_LE(record.end_ns, data.window_end_ns);
    }
  }
  EXPECT_EQ(static_cast<int>(kernel_streams.size()), expected.streams);
  ASSERT_EQ(summary.devices.size(), 1u);
  EXPECT_GT(summary.devices[0].stream_overlap_ns, 0u);  // the two streams ran side by side
}

// The host track of an API call is the OS thread that made it (gettid, as top -H and Nsight
// Systems show it), and the Chrome trace draws one launch arrow per kernel, copy and memset the
// workload issued, each from a call on this thread.
TEST_F(TracerGpuTest, ApiCallsCarryTheOsThreadIdAndEveryLaunchHasAnArrow) {
  const TraceData data = traced_run(nullptr);
  const auto this_thread = static_cast<std::uint32_t>(::syscall(SYS_gettid));
  const auto this_process = static_cast<std::uint32_t>(::getpid());
  int api_calls = 0, device_work = 0;
  for (const ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kRuntimeApi) {
      ++api_calls;
      EXPECT_EQ(record.thread_id, this_thread) << record.name;
      EXPECT_EQ(record.process_id, this_process) << record.name;
    }
    if (record.on_device()) {
      ++device_work;
      EXPECT_EQ(record.process_id, this_process) << record.name;
    }
  }
  ASSERT_GT(api_calls, 0);
  const nlohmann::json trace = chrome_trace_json(data);
  int starts = 0, finishes = 0;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    if (event["ph"] == "s") {
      ++starts;
      EXPECT_EQ(event["tid"], this_thread);
    }
    if (event["ph"] == "f") ++finishes;
  }
  const KnownCounts expected;
  EXPECT_EQ(device_work, expected.kernels + expected.h2d + expected.d2h + expected.memsets);
  EXPECT_EQ(starts, device_work);
  EXPECT_EQ(finishes, device_work);
}

// Each traced kernel lasts what the CUDA events around it say, within 5 % or 75 us: the events
// also bracket the launch, which under activity tracing took up to 58 us more than the kernel on
// one H200 (2026-11-30, a 1.0 ms kernel: events 1.059 ms), a fixed cost, not a share.
TEST_F(TracerGpuTest, KernelDurationsMatchEvents) {
  std::vector<KernelTiming> timings;
  const TraceData data = traced_run(&timings);
  ASSERT_EQ(timings.size(), 7u);
  // Match per stream in launch order: the traced kernels of one stream, sorted by start time,
  // are the launches on that stream in order. The two workload streams are told apart by their
  // kernel sequences (stream 0 has four kernels, stream 1 three).
  std::map<std::uint32_t, std::vector<const ActivityRecord*>> by_stream;
  for (const ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kKernel) by_stream[record.stream_id].push_back(&record);
  }
  ASSERT_EQ(by_stream.size(), 2u);
  std::vector<std::vector<const ActivityRecord*>> traced;
  for (auto& [id, kernels] : by_stream) {
    std::sort(kernels.begin(), kernels.end(),
              [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
    traced.push_back(kernels);
  }
  if (traced[0].size() != 4) std::swap(traced[0], traced[1]);
  ASSERT_EQ(traced[0].size(), 4u);
  ASSERT_EQ(traced[1].size(), 3u);
  std::size_t next[2] = {0, 0};
  double worst = 0;
  for (const KernelTiming& timing : timings) {
    const ActivityRecord* kernel = traced[timing.stream][next[timing.stream]++];
    EXPECT_NE(kernel->name.find(timing.kernel), std::string::npos)
        << kernel->name << " vs " << timing.kernel;
    const double traced_ms = static_cast<double>(kernel->duration_ns()) / 1e6;
    const double error = std::abs(traced_ms - timing.event_ms) / timing.event_ms;
    worst = std::max(worst, error);
    EXPECT_TRUE(error < 0.05 || std::abs(traced_ms - timing.event_ms) < 0.075)
        << timing.kernel << " on stream " << timing.stream << ": traced " << traced_ms
        << " ms, events " << timing.event_ms << " ms";
    EXPECT_GT(traced_ms, 0.5);  // the kernels spin for 0.8..1.2 ms
  }
  std::printf("max kernel duration error vs CUDA events: %.3f%%\n", worst * 100);
}

TEST_F(TracerGpuTest, NvtxRangesAreRecorded) {
  const TraceData data = traced_run(nullptr);
  std::set<std::string> names;
  for (const ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kNvtxRange) {
      names.insert(record.name);
      EXPECT_GE(record.end_ns, record.start_ns);
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"upload", "compute"}));
}

TEST_F(TracerGpuTest, AsyncOnlyWorkHasZeroHostSynchronizations) {
  Tracer tracer;
  ASSERT_TRUE(tracer.start().ok());
  unsigned* done = workload_.done;
  for (int i = 0; i < 5; ++i) {
    gpuopt_trace_test::k_spin_for<<<1, 32, 0, streams_[0]>>>(20'000, done);
  }
  // Poll instead of synchronizing: cudaStreamQuery never blocks the host.
  while (cudaStreamQuery(streams_[0]) == cudaErrorNotReady) {
  }
  auto data = tracer.stop();
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  TraceSummary summary = summarize(*data);
  EXPECT_EQ(summary.kernels, 5);
  EXPECT_EQ(summary.host_synchronizations, 0);
  EXPECT_GE(summary.api_calls["cudaStreamQuery"], 1);

  // And one explicit synchronize is seen as one.
  ASSERT_TRUE(tracer.start().ok());
  gpuopt_trace_test::k_spin_for<<<1, 32, 0, streams_[0]>>>(20'000, done);
  ASSERT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess);
  auto synced = tracer.stop();
  ASSERT_TRUE(synced.ok());
  EXPECT_EQ(summarize(*synced).host_synchronizations, 1);
}

TEST_F(TracerGpuTest, OneActiveTracerPerProcess) {
  Tracer first;
  Tracer second;
  EXPECT_EQ(second.stop().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(first.start().ok());
  EXPECT_EQ(second.start().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(first.stop().ok());
  EXPECT_TRUE(second.start().ok());
  EXPECT_TRUE(second.stop().ok());
}

}  // namespace
}  // namespace gpuopt::trace
