// LLM stage: programmatic dependent launch (sm_90) for the decode step's kernels, their launch
// helpers and the asynchronous copy they share. A kernel
// launched with `programmatic` may start while the previous kernel of the stream still runs; it
// must call pdl_wait() before it reads or writes anything an earlier kernel touches (weights,
// which never change, may be loaded before). pdl_trigger() lets the next kernel start early.
// Where griddepcontrol is missing (before sm_90) both are no-ops and launches are plain.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::pipeline::llm_detail {

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// 16-byte asynchronous copy global -> shared (sm_80+), bypassing L1 and registers: how the decode
// GEMM stages its x rows and residual, and the decode attention its K and V rows.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// `cluster` > 1: thread block clusters of that many consecutive blocks along x (sm_90).
template <typename... Params, typename... Args>
Status launch_kernel_clustered(void (*kernel)(Params...), dim3 grid, dim3 block,
                               std::size_t shared_bytes, cudaStream_t stream, bool programmatic,
                               int cluster, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(cluster);
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  return GPUOPT_CUDA_STATUS(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
Status launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                     cudaStream_t stream, bool programmatic, Args&&... args) {
  return launch_kernel_clustered(kernel, grid, block, shared_bytes, stream, programmatic, 1,
                                 std::forward<Args>(args)...);
}

}  // namespace gpuopt::pipeline::llm_detail
