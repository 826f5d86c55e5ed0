// Checked CUDA runtime/driver calls and device discovery.
#include "gpuopt/core/cuda_check.hpp"

#include <fmt/format.h>

#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt {

#if GPUOPT_CUDA
namespace {

StatusCode canonical_runtime_code(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return StatusCode::kUnavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidDevice:
      return StatusCode::kInvalidArgument;
    case cudaErrorNotSupported:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return StatusCode::kUnimplemented;
    case cudaErrorNotPermitted:
      return StatusCode::kPermissionDenied;
    default:
      return StatusCode::kInternal;
  }
}

}  // namespace

Status cuda_runtime_status(cudaError_t error, const char* expression, const char* file, int line) {
  if (error == cudaSuccess) return ok_status();
  // Non-sticky errors are cleared here so the next checked call does not report them again.
  (void)cudaGetLastError();
  return gpu_api_error(GpuApi::kCudaRuntime, canonical_runtime_code(error),
                       static_cast<long>(error), cudaGetErrorName(error), cudaGetErrorString(error),
                       expression, file, line);
}

void* driver_entry_point(const char* symbol, unsigned int cuda_version) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &function, cuda_version, cudaEnableDefault,
                                       &query) != cudaSuccess ||
      query != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return function;
}

Status cuda_driver_status(int result, const char* expression, const char* file, int line) {
  if (result == 0) return ok_status();
  using GetString = int (*)(int, const char**);
  static auto get_name = reinterpret_cast<GetString>(driver_entry_point("cuGetErrorName"));
  static auto get_text = reinterpret_cast<GetString>(driver_entry_point("cuGetErrorString"));
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown driver error";
  if (get_name != nullptr) get_name(result, &name);
  if (get_text != nullptr) get_text(result, &text);
  StatusCode canonical = StatusCode::kInternal;
  if (result == 2) canonical = StatusCode::kResourceExhausted;  // CUDA_ERROR_OUT_OF_MEMORY
  if (result == 1) canonical = StatusCode::kInvalidArgument;    // CUDA_ERROR_INVALID_VALUE
  if (result == 801) canonical = StatusCode::kUnimplemented;    // CUDA_ERROR_NOT_SUPPORTED
  if (result == 100 || result == 3 || result == 35) canonical = StatusCode::kUnavailable;
  return gpu_api_error(GpuApi::kCudaDriver, canonical, result, name, text, expression, file, line);
}

StatusOr<int> cuda_device_count() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    if (!DynamicLibrary::open({"libcuda.so.1"}).ok()) {
      return unavailable("no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)");
    }
    return unavailable(fmt::format("no usable CUDA device: {} ({})", cudaGetErrorName(error),
                                   cudaGetErrorString(error)));
  }
  if (count == 0) return unavailable("no CUDA device found");
  return count;
}
#else
StatusOr<int> cuda_device_count() {
  return unimplemented("gpuopt was built without CUDA (no nvcc when it was configured)");
}
#endif

}  // namespace gpuopt
