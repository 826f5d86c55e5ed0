// Shared by the tests: fixture location and the GPU skip rule.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::testing {

// tests/data, or $GPUOPT_TEST_DATA_DIR when the tests run from a copied build (the GPU machine).
inline std::string test_data_dir() {
  const char* override_dir = std::getenv("GPUOPT_TEST_DATA_DIR");
  return override_dir != nullptr ? std::string(override_dir) : std::string(GPUOPT_TEST_DATA_DIR);
}

}  // namespace gpuopt::testing

// Skips the current test, with the reason, when no CUDA device can be used.
#define GPUOPT_REQUIRE_GPU()                                                   \
  do {                                                                         \
    auto gpuopt_device_count_ = ::gpuopt::cuda_device_count();                 \
    if (!gpuopt_device_count_.ok()) {                                          \
      GTEST_SKIP() << "no GPU: " << gpuopt_device_count_.status().to_string(); \
    }                                                                          \
  } while (0)
