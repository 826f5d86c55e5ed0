// Vulkan probe: loader via dlopen, a throw-away instance without layers, physical-device
// properties.
#include "gpuopt/platform/vulkan.hpp"

#include <fmt/format.h>

#include <cstring>

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt::platform {

namespace {

// ---- Minimal Vulkan ABI (layouts as in vulkan_core.h; only what gpuopt reads) ----
using VkResult = int;
using VkInstance = void*;
using VkPhysicalDevice = void*;
using PFN_vkVoidFunction = void (*)();
constexpr int kVkStructureTypeApplicationInfo = 0;
constexpr int kVkStructureTypeInstanceCreateInfo = 1;
constexpr VkResult kVkSuccess = 0;
constexpr VkResult kVkIncomplete = 5;

struct VkApplicationInfo {
  int sType;
  const void* pNext;
  const char* pApplicationName;
  std::uint32_t applicationVersion;
  const char* pEngineName;
  std::uint32_t engineVersion;
  std::uint32_t apiVersion;
};
struct VkInstanceCreateInfo {
  int sType;
  const void* pNext;
  std::uint32_t flags;
  const VkApplicationInfo* pApplicationInfo;
  std::uint32_t enabledLayerCount;
  const char* const* ppEnabledLayerNames;
  std::uint32_t enabledExtensionCount;
  const char* const* ppEnabledExtensionNames;
};
struct VkExtensionProperties {
  char extensionName[256];
  std::uint32_t specVersion;
};
// VkPhysicalDeviceProperties begins with these fields; the rest (limits, sparse properties) is
// large, so it is read into an oversized, aligned buffer and only the prefix is interpreted.
struct VkPhysicalDevicePropertiesPrefix {
  std::uint32_t apiVersion;
  std::uint32_t driverVersion;
  std::uint32_t vendorID;
  std::uint32_t deviceID;
  int deviceType;
  char deviceName[256];
};

using PFN_vkGetInstanceProcAddr = PFN_vkVoidFunction (*)(VkInstance, const char*);
using PFN_vkEnumerateInstanceVersion = VkResult (*)(std::uint32_t*);
using PFN_vkEnumerateInstanceExtensionProperties = VkResult (*)(const char*, std::uint32_t*,
                                                                VkExtensionProperties*);
using PFN_vkCreateInstance = VkResult (*)(const VkInstanceCreateInfo*, const void*, VkInstance*);
using PFN_vkDestroyInstance = void (*)(VkInstance, const void*);
using PFN_vkEnumeratePhysicalDevices = VkResult (*)(VkInstance, std::uint32_t*, VkPhysicalDevice*);
using PFN_vkGetPhysicalDeviceProperties = void (*)(VkPhysicalDevice, void*);

std::string_view vk_result_name(VkResult result) {
  switch (result) {
    case 0:
      return "VK_SUCCESS";
    case 5:
      return "VK_INCOMPLETE";
    case -1:
      return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case -2:
      return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case -3:
      return "VK_ERROR_INITIALIZATION_FAILED";
    case -6:
      return "VK_ERROR_LAYER_NOT_PRESENT";
    case -7:
      return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case -9:
      return "VK_ERROR_INCOMPATIBLE_DRIVER";
    default:
      return "VK_ERROR_UNKNOWN";
  }
}

Status vk_check(VkResult result, const char* expression, const char* file, int line) {
  if (result == kVkSuccess || result == kVkIncomplete) return ok_status();
  StatusCode code = result == -9 || result == -3 ? StatusCode::kUnavailable : StatusCode::kInternal;
  return gpu_api_error(GpuApi::kVulkan, code, result, vk_result_name(result),
                       result == -9 ? "no Vulkan driver (ICD) for this machine" : "see the name",
                       expression, file, line);
}
#define GPUOPT_VK_TRY(expr) GPUOPT_RETURN_IF_ERROR(vk_check((expr), #expr, __FILE__, __LINE__))

const char* device_type_name(int type) {
  switch (type) {
    case 1:
      return "integrated";
    case 2:
      return "discrete";
    case 3:
      return "virtual";
    case 4:
      return "cpu";
    default:
      return "other";
  }
}

}  // namespace

std::string vulkan_version_string(std::uint32_t version) {
  return fmt::format("{}.{}.{}", (version >> 22) & 0x7F, (version >> 12) & 0x3FF, version & 0xFFF);
}

StatusOr<VulkanInfo> probe_vulkan() {
  auto library = DynamicLibrary::open({"libvulkan.so.1", "libvulkan.so"}, "VULKAN");
  if (!library.ok()) {
    return unavailable(fmt::format("no Vulkan loader: {}", library.status().message()));
  }
  VulkanInfo info;
  info.loader_library = library->name();
  auto get_proc = library->function<PFN_vkGetInstanceProcAddr>({"vkGetInstanceProcAddr"});
  if (get_proc == nullptr) {
    return unavailable(fmt::format("{} has no vkGetInstanceProcAddr", library->name()));
  }
  auto global = [&](const char* name) { return get_proc(nullptr, name); };
  std::uint32_t loader_version = (1u << 22);  // 1.0 when vkEnumerateInstanceVersion is absent
  if (auto enumerate_version =
          reinterpret_cast<PFN_vkEnumerateInstanceVersion>(global("vkEnumerateInstanceVersion"))) {
    GPUOPT_VK_TRY(enumerate_version(&loader_version));
  }
  info.instance_api_version = vulkan_version_string(loader_version);
  auto enumerate_extensions = reinterpret_cast<PFN_vkEnumerateInstanceExtensionProperties>(
      global("vkEnumerateInstanceExtensionProperties"));
  auto create_instance = reinterpret_cast<PFN_vkCreateInstance>(global("vkCreateInstance"));
  if (enumerate_extensions == nullptr || create_instance == nullptr) {
    return unavailable(fmt::format("{} lacks vkCreateInstance", library->name()));
  }
  std::uint32_t count = 0;
  GPUOPT_VK_TRY(enumerate_extensions(nullptr, &count, nullptr));
  std::vector<VkExtensionProperties> extensions(count);
  GPUOPT_VK_TRY(enumerate_extensions(nullptr, &count, extensions.data()));
  extensions.resize(count);
  for (const auto& extension : extensions) {
    if (std::strncmp(extension.extensionName, "VK_KHR_get_physical_device_properties2", 256) == 0) {
      info.get_physical_device_properties2 = true;
    }
  }

  VkApplicationInfo application{};
  application.sType = kVkStructureTypeApplicationInfo;
  application.pApplicationName = "gpuopt doctor";
  application.apiVersion =
      loader_version >= ((1u << 22) | (1u << 12)) ? ((1u << 22) | (1u << 12)) : (1u << 22);
  VkInstanceCreateInfo create{};
  create.sType = kVkStructureTypeInstanceCreateInfo;
  create.pApplicationInfo = &application;
  VkInstance instance = nullptr;
  GPUOPT_VK_TRY(create_instance(&create, nullptr, &instance));
  auto destroy = reinterpret_cast<PFN_vkDestroyInstance>(get_proc(instance, "vkDestroyInstance"));
  auto enumerate_devices = reinterpret_cast<PFN_vkEnumeratePhysicalDevices>(
      get_proc(instance, "vkEnumeratePhysicalDevices"));
  auto properties = reinterpret_cast<PFN_vkGetPhysicalDeviceProperties>(
      get_proc(instance, "vkGetPhysicalDeviceProperties"));
  Status status;
  if (enumerate_devices == nullptr || properties == nullptr) {
    status = unavailable("Vulkan instance lacks vkEnumeratePhysicalDevices");
  } else {
    std::uint32_t device_count = 0;
    status = vk_check(enumerate_devices(instance, &device_count, nullptr),
                      "vkEnumeratePhysicalDevices(instance, &count, nullptr)", __FILE__, __LINE__);
    std::vector<VkPhysicalDevice> devices(device_count);
    if (status.ok() && device_count > 0) {
      status =
          vk_check(enumerate_devices(instance, &device_count, devices.data()),
                   "vkEnumeratePhysicalDevices(instance, &count, devices)", __FILE__, __LINE__);
    }
    if (status.ok()) {
      devices.resize(device_count);
      for (VkPhysicalDevice device : devices) {
        // VkPhysicalDeviceProperties is ~824 bytes; 4 KiB leaves room for any future growth.
        alignas(16) unsigned char buffer[4096] = {};
        properties(device, buffer);
        VkPhysicalDevicePropertiesPrefix prefix;
        std::memcpy(&prefix, buffer, sizeof(prefix));
        prefix.deviceName[255] = '\0';
        VulkanPhysicalDevice out;
        out.name = prefix.deviceName;
        out.vendor_id = prefix.vendorID;
        out.device_id = prefix.deviceID;
        out.type = device_type_name(prefix.deviceType);
        out.api_version = vulkan_version_string(prefix.apiVersion);
        out.driver_version_raw = fmt::format("0x{:08x}", prefix.driverVersion);
        info.devices.push_back(std::move(out));
      }
    }
  }
  if (destroy != nullptr) destroy(instance, nullptr);
  GPUOPT_RETURN_IF_ERROR(status);
  return info;
}

}  // namespace gpuopt::platform
