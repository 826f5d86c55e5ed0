// Vulkan through dlopen of libvulkan.so.1 (own minimal declarations, an instance with no layers):
// physical devices, their API version, and whether VK_KHR_get_physical_device_properties2 exists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::platform {

struct VulkanPhysicalDevice {
  std::string name;
  std::uint32_t vendor_id = 0;
  std::uint32_t device_id = 0;
  std::string type;         // "discrete", "integrated", "virtual", "cpu", "other"
  std::string api_version;  // "1.3.280"
  std::string driver_version_raw;
};

struct VulkanInfo {
  std::string loader_library;
  std::string instance_api_version;              // what the loader supports
  bool get_physical_device_properties2 = false;  // the instance extension (core since 1.1)
  std::vector<VulkanPhysicalDevice> devices;
};

// UNAVAILABLE when libvulkan cannot be loaded (or GPUOPT_DISABLE_VULKAN=1); other codes name the
// failing Vulkan call and its VkResult.
StatusOr<VulkanInfo> probe_vulkan();

// VK_MAKE_API_VERSION decoding: "major.minor.patch".
std::string vulkan_version_string(std::uint32_t version);

}  // namespace gpuopt::platform
