// The spin kernel behind `doctor --load`: one block per SM spins on the global timer so the GPU
// leaves its idle power state and retrains its PCIe link to full speed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/doctor/load.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::doctor {

namespace {

__device__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void k_spin_global_timer(unsigned long long duration_ns,
                                    unsigned long long* observed_ns) {
  unsigned long long start = global_timer_ns();
  unsigned long long now = start;
  while (now - start < duration_ns) now = global_timer_ns();
  if (blockIdx.x == 0 && threadIdx.x == 0) *observed_ns = now - start;
}

}  // namespace

StatusOr<long long> run_under_load(const std::string& bdf, int milliseconds,
                                   const std::function<void()>& during) {
  if (milliseconds < 1 || milliseconds > 10000) {
    return invalid_argument("load duration " + std::to_string(milliseconds) +
                            " ms is outside 1..10000");
  }
  int device = -1;
  cudaError_t lookup = cudaDeviceGetByPCIBusId(&device, bdf.c_str());
  if (lookup != cudaSuccess) {
    Status status = GPUOPT_CUDA_STATUS(lookup);
    return unavailable("no CUDA device at " + bdf + ": " + status.message());
  }
  GPUOPT_CUDA_TRY(cudaSetDevice(device));
  int sms = 1;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream = nullptr;
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned long long* observed = nullptr;
  auto buffer = runtime::DeviceBuffer::allocate_async(sizeof(*observed), stream);
  Status status = buffer.status();
  if (status.ok()) {
    observed = buffer->data_as<unsigned long long>();
    // Poison first so a kernel that never ran cannot look like one that did.
    status = buffer->zero(stream);
  }
  unsigned long long host_observed = 0;
  if (status.ok()) {
    k_spin_global_timer<<<sms, 32, 0, stream>>>(
        static_cast<unsigned long long>(milliseconds) * 1000000ull, observed);
    status = GPUOPT_CUDA_STATUS(cudaGetLastError());
  }
  if (status.ok()) {
    // Give the GPU a moment to leave its idle state and retrain the link before sampling.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(milliseconds / 3, 150)));
    during();
    status = GPUOPT_CUDA_STATUS(cudaMemcpyAsync(&host_observed, observed, sizeof(host_observed),
                                                cudaMemcpyDeviceToHost, stream));
  }
  if (status.ok()) status = GPUOPT_CUDA_STATUS(cudaStreamSynchronize(stream));
  if (buffer.ok()) buffer->reset();  // queued on the stream, before it is destroyed
  GPUOPT_CUDA_TRY_NO_THROW(cudaStreamSynchronize(stream));
  GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
  GPUOPT_RETURN_IF_ERROR(status);
  return static_cast<long long>(host_observed);
}

}  // namespace gpuopt::doctor
