// gpuopt_trace_workload: programs for `gpuopt trace` to trace on the GPU machine.
//   known [--timings FILE]        the known-count workload; writes expected counts + event timings
//   spin --blocks N --threads T --seconds S [--kernel-ms K] [--idle-ms I]
//                                  back-to-back spinning kernels (N = 0: 8 blocks per SM), with an
//                                  optional host sleep between kernels, for busy time vs NVML
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "known_workload.cuh"

namespace {

using gpuopt_trace_test::KnownCounts;
using gpuopt_trace_test::KnownWorkload;

int fail(const char* what, const std::string& error) {
  std::fprintf(stderr, "gpuopt_trace_workload: %s: %s\n", what, error.c_str());
  return 1;
}

#define WORKLOAD_CUDA(expr)                                                                      \
  do {                                                                                           \
    cudaError_t workload_error_ = (expr);                                                        \
    if (workload_error_ != cudaSuccess) return fail(#expr, cudaGetErrorString(workload_error_)); \
  } while (0)

const char* option(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

int run_known(int argc, char** argv) {
  WORKLOAD_CUDA(cudaSetDevice(0));
  cudaStream_t streams[2];
  for (auto& stream : streams) {
    WORKLOAD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  KnownWorkload workload;
  if (std::string error = workload.prepare(); !error.empty()) return fail("prepare", error);
  std::vector<gpuopt_trace_test::KernelTiming> timings;
  if (std::string error = workload.run(streams, 1'000'000, &timings); !error.empty()) {
    return fail("run", error);
  }
  const char* path = option(argc, argv, "--timings", nullptr);
  if (path != nullptr) {
    FILE* out = std::fopen(path, "w");
    if (out == nullptr) return fail("open", path);
    const KnownCounts counts;
    std::fprintf(out,
                 "{\"expected\": {\"kernels\": %d, \"k_spin_for\": %d, \"k_scale_after_spin\": %d, "
                 "\"k_sum_after_spin\": %d, \"H2D\": %d, \"D2H\": %d, \"memsets\": %d, "
                 "\"nvtx_ranges\": %d, \"streams\": %d},\n \"kernels\": [",
                 counts.kernels, counts.spin_kernels, counts.scale_kernels, counts.sum_kernels,
                 counts.h2d, counts.d2h, counts.memsets, counts.nvtx_ranges, counts.streams);
    for (std::size_t i = 0; i < timings.size(); ++i) {
      std::fprintf(out, "%s{\"name\": \"%s\", \"stream\": %d, \"event_ms\": %.6f}",
                   i == 0 ? "" : ", ", timings[i].kernel.c_str(), timings[i].stream,
                   timings[i].event_ms);
    }
    std::fprintf(out, "]}\n");
    std::fclose(out);
  }
  workload.release();
  for (auto& stream : streams) WORKLOAD_CUDA(cudaStreamDestroy(stream));
  std::printf("known workload done: 7 kernels, 4 H2D, 2 D2H, 1 memset on 2 streams\n");
  return 0;
}

int run_spin(int argc, char** argv) {
  WORKLOAD_CUDA(cudaSetDevice(0));
  int sm_count = 0;
  WORKLOAD_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  int blocks = std::atoi(option(argc, argv, "--blocks", "1"));
  const int threads = std::atoi(option(argc, argv, "--threads", "32"));
  const double seconds = std::atof(option(argc, argv, "--seconds", "2"));
  const double kernel_ms = std::atof(option(argc, argv, "--kernel-ms", "10"));
  const double idle_ms = std::atof(option(argc, argv, "--idle-ms", "0"));
  if (blocks <= 0) blocks = sm_count * 8;
  if (threads <= 0 || threads > 1024 || seconds <= 0 || kernel_ms <= 0 || idle_ms < 0) {
    return fail("arguments", "need --threads 1..1024, --seconds > 0, --kernel-ms > 0");
  }
  cudaStream_t stream;
  WORKLOAD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned* done = nullptr;
  WORKLOAD_CUDA(cudaMalloc(&done, sizeof(unsigned)));
  WORKLOAD_CUDA(cudaMemsetAsync(done, 0, sizeof(unsigned), stream));
  const auto kernel_ns = static_cast<std::uint64_t>(kernel_ms * 1e6);
  const auto start = std::chrono::steady_clock::now();
  int launched = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    if (idle_ms > 0) {
      gpuopt_trace_test::k_spin_for<<<blocks, threads, 0, stream>>>(kernel_ns, done);
      WORKLOAD_CUDA(cudaGetLastError());
      ++launched;
      WORKLOAD_CUDA(cudaStreamSynchronize(stream));
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(idle_ms * 1e3)));
    } else {
      // Keep a few kernels queued so the GPU never waits for the host.
      for (int i = 0; i < 4; ++i) {
        gpuopt_trace_test::k_spin_for<<<blocks, threads, 0, stream>>>(kernel_ns, done);
        ++launched;
      }
      WORKLOAD_CUDA(cudaGetLastError());
      WORKLOAD_CUDA(cudaStreamSynchronize(stream));
    }
  }
  WORKLOAD_CUDA(cudaStreamSynchronize(stream));
  WORKLOAD_CUDA(cudaFree(done));
  WORKLOAD_CUDA(cudaStreamDestroy(stream));
  std::printf("spin workload done: %d kernels of %d blocks x %d threads (%d SMs), %.1f ms each\n",
              launched, blocks, threads, sm_count, kernel_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "known") return run_known(argc, argv);
  if (mode == "spin") return run_spin(argc, argv);
  std::fprintf(stderr,
               "usage: gpuopt_trace_workload known [--timings FILE] | spin --blocks N "
               "--threads T --seconds S [--kernel-ms K] [--idle-ms I]\n");
  return 2;
}
