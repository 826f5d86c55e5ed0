// Checked CUDA runtime and driver calls (host-compilable; needs a build with GPUOPT_CUDA).
//   GPUOPT_CUDA_TRY(cudaMalloc(&p, n));            // returns the Status from the enclosing
//   function Status s = GPUOPT_CUDA_STATUS(cudaFree(p));    // just the Status
//   GPUOPT_CUDA_TRY_NO_THROW(cudaFree(p));         // destructors: report to stderr
//   GPUOPT_CUDA_TRY_LAUNCH();                      // after a <<<>>> launch
//   GPUOPT_CU_TRY(cuCtxGetDevice(&d));             // driver API result (CUresult as int)
#pragma once

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/status.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

namespace gpuopt {

// Maps a runtime error to a Status and clears the sticky last-error state.
Status cuda_runtime_status(cudaError_t error, const char* expression, const char* file, int line);
// Driver API result (CUresult); names resolved through cudaGetDriverEntryPointByVersion.
Status cuda_driver_status(int result, const char* expression, const char* file, int line);

// Looks up a driver API entry point without linking libcuda; nullptr when the driver lacks it.
void* driver_entry_point(const char* symbol, unsigned int cuda_version = 12000);

}  // namespace gpuopt

#define GPUOPT_CUDA_STATUS(expr) ::gpuopt::cuda_runtime_status((expr), #expr, __FILE__, __LINE__)
#define GPUOPT_CUDA_TRY(expr) GPUOPT_RETURN_IF_ERROR(GPUOPT_CUDA_STATUS(expr))
#define GPUOPT_CUDA_TRY_NO_THROW(expr) ::gpuopt::report_unreturnable(GPUOPT_CUDA_STATUS(expr))
#define GPUOPT_CUDA_TRY_LAUNCH() GPUOPT_CUDA_TRY(cudaGetLastError())
#define GPUOPT_CU_STATUS(expr) \
  ::gpuopt::cuda_driver_status(static_cast<int>(expr), #expr, __FILE__, __LINE__)
#define GPUOPT_CU_TRY(expr) GPUOPT_RETURN_IF_ERROR(GPUOPT_CU_STATUS(expr))
#endif  // GPUOPT_CUDA

namespace gpuopt {

// Number of usable CUDA devices. UNIMPLEMENTED when built without CUDA, UNAVAILABLE (with the
// runtime's reason: no driver, no device, driver too old) when none can be used.
StatusOr<int> cuda_device_count();

}  // namespace gpuopt
