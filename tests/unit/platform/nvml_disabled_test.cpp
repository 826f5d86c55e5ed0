// NVML switched off must be absent even where a driver exists (own process state: the instance is
// cached, so this file switches it off before any test touches NVML).
#include <gtest/gtest.h>

#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt {
namespace {

TEST(NvmlDisabled, SwitchRefusesToLoad) {
  DynamicLibrary::set_disabled("NVML", true);
  auto library = DynamicLibrary::open({"libnvidia-ml.so.1", "libnvidia-ml.so"}, "NVML");
  DynamicLibrary::set_disabled("NVML", false);
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(library.status().message().find("GPUOPT_DISABLE_NVML=1"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt
