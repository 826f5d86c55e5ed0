// DynamicLibrary: ordered fallbacks, versioned symbols, and the disable switch.
#include "gpuopt/core/dynamic_library.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt {
namespace {

TEST(DynamicLibrary, MissingLibraryNamesEveryAttempt) {
  auto library = DynamicLibrary::open({"libgpuopt-does-not-exist.so.1", "libalso-missing.so"});
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(library.status().message().find("libgpuopt-does-not-exist.so.1"), std::string::npos);
  EXPECT_NE(library.status().message().find("libalso-missing.so"), std::string::npos);
}

TEST(DynamicLibrary, FallsBackToTheNextNameAndPrefersTheFirstSymbol) {
  auto library = DynamicLibrary::open({"libgpuopt-does-not-exist.so.1", "libm.so.6"});
  ASSERT_TRUE(library.ok()) << library.status().to_string();
  EXPECT_EQ(library->name(), "libm.so.6");
  std::string found;
  using Cos = double (*)(double);
  Cos cosine = library->function<Cos>({"cos_v99_absent", "cos"}, &found);
  ASSERT_NE(cosine, nullptr);
  EXPECT_EQ(found, "cos");
  EXPECT_DOUBLE_EQ(cosine(0.0), 1.0);
  EXPECT_EQ(library->symbol({"no_such_symbol_anywhere"}), nullptr);
}

TEST(DynamicLibrary, DisableSwitchSimulatesAbsence) {
  DynamicLibrary::set_disabled("TESTLIB", true);
  EXPECT_TRUE(DynamicLibrary::disabled("TESTLIB"));
  auto library = DynamicLibrary::open({"libm.so.6"}, "TESTLIB");
  auto other_tag = DynamicLibrary::open({"libm.so.6"}, "OTHERLIB");
  DynamicLibrary::set_disabled("TESTLIB", false);
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(library.status().message().find("GPUOPT_DISABLE_TESTLIB"), std::string::npos);
  EXPECT_TRUE(other_tag.ok()) << other_tag.status().to_string();
  // Switched on again, the same library loads.
  EXPECT_TRUE(DynamicLibrary::open({"libm.so.6"}, "TESTLIB").ok());
}

TEST(CheckedCall, MessageNamesApiExpressionAndLocation) {
  Status status =
      gpu_api_error(GpuApi::kNvml, StatusCode::kPermissionDenied, 4, "NVML_ERROR_NO_PERMISSION",
                    "Insufficient Permissions", "nvmlDeviceGetPcieReplayCounter(device, &count)",
                    "platform.cpp", 42);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(),
            "NVML call `nvmlDeviceGetPcieReplayCounter(device, &count)` failed: "
            "NVML_ERROR_NO_PERMISSION (Insufficient Permissions, code 4) at platform.cpp:42");
}

#if GPUOPT_CUDA
TEST(CudaCheck, RuntimeErrorBecomesStatusWithName) {
  Status status = GPUOPT_CUDA_STATUS(cudaErrorMemoryAllocation);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_NE(status.message().find("dynamic_library_test.cpp"), std::string::npos);
  EXPECT_TRUE(GPUOPT_CUDA_STATUS(cudaSuccess).ok());
}
#endif

TEST(CudaCheck, DeviceCountSaysWhyWhenNoneIsUsable) {
  auto count = cuda_device_count();
  if (count.ok()) {
    EXPECT_GT(*count, 0);
  } else {
    EXPECT_TRUE(count.status().code() == StatusCode::kUnavailable ||
                count.status().code() == StatusCode::kUnimplemented);
    EXPECT_FALSE(count.status().message().empty());
  }
}

}  // namespace
}  // namespace gpuopt
