// One checked-call family for every GPU API gpuopt talks to: CUDA runtime, CUDA driver, NVML,
// CUPTI. Each failure becomes a Status that names the expression, the API's error name and text,
// and file:line. API-specific wrappers (cuda_check.hpp, the NVML and CUPTI loaders) map their codes
// here.
#pragma once

#include <string_view>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

enum class GpuApi { kCudaRuntime, kCudaDriver, kNvml, kCupti, kVulkan, kCufile, kCublas, kCudnn };

std::string_view gpu_api_name(GpuApi api);

// Builds the Status for a failed call. `code` is the API's own numeric result.
Status gpu_api_error(GpuApi api, StatusCode canonical, long code, std::string_view error_name,
                     std::string_view error_text, const char* expression, const char* file,
                     int line);

// For destructors and other places that cannot return: prints the failure to stderr.
void report_unreturnable(const Status& status);

}  // namespace gpuopt
