// GPUOPT_DISABLE_NVML=1 must make NVML absent even where a driver exists (own process state: the
// instance is cached, so this file sets the variable before any test touches NVML).
#include <gtest/gtest.h>

#include <cstdlib>

#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt {
namespace {

TEST(NvmlDisabled, EnvironmentSwitchRefusesToLoad) {
  ::setenv("GPUOPT_DISABLE_NVML", "1", 1);
  auto library = DynamicLibrary::open({"libnvidia-ml.so.1", "libnvidia-ml.so"}, "NVML");
  ::unsetenv("GPUOPT_DISABLE_NVML");
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(library.status().message().find("GPUOPT_DISABLE_NVML=1"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt
