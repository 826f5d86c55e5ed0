// A CUDA workload with known activity counts, shared by the in-process tracer test (gpu_trace) and
// the program `gpuopt trace` runs (gpuopt_trace_workload): 7 kernels of 3 kinds on two streams,
// 4 H2D and 2 D2H copies, 1 memset, 2 NVTX ranges and 2 stream synchronizations, each kernel
// bracketed by CUDA events so traced durations can be checked against them.
#pragma once

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpuopt_trace_test {

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Spins for `ns` of wall time: a duration that does not depend on clocks or occupancy.
__global__ void k_spin_for(std::uint64_t ns, unsigned* done) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
  if (threadIdx.x == 0) atomicAdd(done, 1u);
}

__global__ void k_scale_after_spin(std::uint64_t ns, float* values, int count, float factor) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
  for (int i = threadIdx.x; i < count; i += blockDim.x) values[i] *= factor;
}

__global__ void k_sum_after_spin(std::uint64_t ns, const float* values, int count, float* total) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
  float partial = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) partial += values[i];
  atomicAdd(total, partial);
}

struct KernelTiming {
  std::string kernel;  // "k_spin_for", "k_scale_after_spin", "k_sum_after_spin"
  int stream = 0;      // 0 or 1, in launch order
  float event_ms = 0;
};

struct KnownCounts {
  int kernels = 7;
  int spin_kernels = 4;
  int scale_kernels = 2;
  int sum_kernels = 1;
  int h2d = 4;
  int d2h = 2;
  int memsets = 1;
  int nvtx_ranges = 2;
  int streams = 2;
  int host_synchronizations = 2;  // the two cudaStreamSynchronize at the end
};

inline const char* cuda_error_text(cudaError_t error) { return cudaGetErrorString(error); }

// Issues the workload on two streams the caller created and waits for it. Returns "" or the first
// CUDA error. Allocations happen before the first NVTX range, frees are the caller's business
// after tracing stops (see `release`).
struct KnownWorkload {
  static constexpr int kValues = 1 << 18;  // per buffer, floats
  float* device[2] = {nullptr, nullptr};
  float* host = nullptr;  // pinned, 2 buffers
  float* total = nullptr;
  unsigned* done = nullptr;
  cudaEvent_t events[7][2] = {};

  std::string prepare() {
    for (auto& buffer : device) {
      if (cudaError_t e = cudaMalloc(&buffer, kValues * sizeof(float)); e != cudaSuccess) {
        return cuda_error_text(e);
      }
    }
    if (cudaError_t e = cudaMalloc(&total, sizeof(float) + sizeof(unsigned)); e != cudaSuccess) {
      return cuda_error_text(e);
    }
    done = reinterpret_cast<unsigned*>(total + 1);
    if (cudaError_t e = cudaMallocHost(&host, 2 * kValues * sizeof(float)); e != cudaSuccess) {
      return cuda_error_text(e);
    }
    for (int i = 0; i < 2 * kValues; ++i) host[i] = 1.0f + static_cast<float>(i % 7);
    for (auto& pair : events) {
      for (auto& event : pair) {
        if (cudaError_t e = cudaEventCreate(&event); e != cudaSuccess) return cuda_error_text(e);
      }
    }
    return "";
  }

  std::string run(cudaStream_t streams[2], std::uint64_t kernel_ns,
                  std::vector<KernelTiming>* timings) {
    const std::size_t half = kValues / 2 * sizeof(float);
    nvtxRangePushA("upload");
    for (int s = 0; s < 2; ++s) {
      for (int part = 0; part < 2; ++part) {
        cudaMemcpyAsync(reinterpret_cast<char*>(device[s]) + part * half,
                        reinterpret_cast<char*>(host + s * kValues) + part * half, half,
                        cudaMemcpyHostToDevice, streams[s]);
      }
    }
    nvtxRangePop();
    cudaMemsetAsync(total, 0, sizeof(float) + sizeof(unsigned), streams[0]);
    // Launch order per stream: stream 0 spin, scale, spin, spin; stream 1 spin, scale, sum.
    struct Launch {
      int stream;
      int kind;  // 0 spin, 1 scale, 2 sum
    };
    const Launch launches[7] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 0}, {1, 2}, {0, 0}};
    const char* names[3] = {"k_spin_for", "k_scale_after_spin", "k_sum_after_spin"};
    nvtxRangePushA("compute");
    for (int i = 0; i < 7; ++i) {
      cudaStream_t stream = streams[launches[i].stream];
      cudaEventRecord(events[i][0], stream);
      // One block per kernel: kernels on the two streams never compete for SMs, so each event
      // pair measures its kernel alone.
      switch (launches[i].kind) {
        case 0:
          k_spin_for<<<1, 64, 0, stream>>>(kernel_ns, done);
          break;
        case 1:
          k_scale_after_spin<<<1, 256, 0, stream>>>(kernel_ns + kernel_ns / 5,
                                                    device[launches[i].stream], kValues, 0.5f);
          break;
        default:
          k_sum_after_spin<<<1, 256, 0, stream>>>(kernel_ns - kernel_ns / 5,
                                                  device[launches[i].stream], kValues, total);
          break;
      }
      cudaEventRecord(events[i][1], stream);
    }
    nvtxRangePop();
    for (int s = 0; s < 2; ++s) {
      cudaMemcpyAsync(host + s * kValues, device[s], half, cudaMemcpyDeviceToHost, streams[s]);
    }
    for (int s = 0; s < 2; ++s) {
      if (cudaError_t e = cudaStreamSynchronize(streams[s]); e != cudaSuccess) {
        return cuda_error_text(e);
      }
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error_text(e);
    if (timings != nullptr) {
      timings->clear();
      for (int i = 0; i < 7; ++i) {
        float ms = 0;
        if (cudaError_t e = cudaEventElapsedTime(&ms, events[i][0], events[i][1]);
            e != cudaSuccess) {
          return cuda_error_text(e);
        }
        timings->push_back({names[launches[i].kind], launches[i].stream, ms});
      }
    }
    return "";
  }

  void release() {
    for (auto& pair : events) {
      for (auto& event : pair) {
        if (event != nullptr) cudaEventDestroy(event);
        event = nullptr;
      }
    }
    for (auto& buffer : device) {
      if (buffer != nullptr) cudaFree(buffer);
      buffer = nullptr;
    }
    if (total != nullptr) cudaFree(total);
    if (host != nullptr) cudaFreeHost(host);
    total = nullptr;
    host = nullptr;
  }
};

}  // namespace gpuopt_trace_test
