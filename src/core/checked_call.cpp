// gpu_api_error: the single formatter behind every checked GPU API call.
#include "gpuopt/core/checked_call.hpp"

#include <fmt/format.h>

#include <cstdio>

namespace gpuopt {

std::string_view gpu_api_name(GpuApi api) {
  switch (api) {
    case GpuApi::kCudaRuntime:
      return "CUDA runtime";
    case GpuApi::kCudaDriver:
      return "CUDA driver";
    case GpuApi::kNvml:
      return "NVML";
    case GpuApi::kCupti:
      return "CUPTI";
    case GpuApi::kVulkan:
      return "Vulkan";
    case GpuApi::kCufile:
      return "cuFile";
    case GpuApi::kCublas:
      return "cuBLAS";
    case GpuApi::kCudnn:
      return "cuDNN";
  }
  return "unknown API";
}

Status gpu_api_error(GpuApi api, StatusCode canonical, long code, std::string_view error_name,
                     std::string_view error_text, const char* expression, const char* file,
                     int line) {
  return Status(canonical,
                fmt::format("{} call `{}` failed: {} ({}, code {}) at {}:{}", gpu_api_name(api),
                            expression, error_name, error_text, code, file, line));
}

void report_unreturnable(const Status& status) {
  if (!status.ok()) std::fprintf(stderr, "gpuopt: %s\n", status.to_string().c_str());
}

}  // namespace gpuopt
