// NVML loaded with dlopen and our own minimal declarations (no nvml.h needed to build), newest
// versioned symbol first so old drivers still answer through the older entry points.
#include "gpuopt/platform/nvml.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/dynamic_library.hpp"

namespace gpuopt::platform {

namespace {

// ---- Minimal NVML ABI (layouts as in NVIDIA's nvml.h; only what gpuopt reads) ----
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailableU64 = 0xFFFFFFFFFFFFFFFFull;

struct nvmlPciInfo_v3 {  // nvmlPciInfo_t of NVML 11+ (v2/v3 share the layout)
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char busId[32];
};
struct nvmlUtilization_t {
  unsigned gpu;
  unsigned memory;
};
struct nvmlBAR1Memory_t {
  unsigned long long bar1Total;
  unsigned long long bar1Free;
  unsigned long long bar1Used;
};
struct nvmlProcessInfo_v2 {  // _v2 and _v3 entry points
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
};
struct nvmlMemory_v1 {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlMemory_v2 {
  unsigned version;  // sizeof | 2 << 24 (NVML_STRUCT_VERSION)
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned kNvmlMemoryV2Version = sizeof(nvmlMemory_v2) | (2u << 24);
struct nvmlProcessUtilizationSample_t {
  unsigned pid;
  unsigned long long timeStamp;
  unsigned smUtil;
  unsigned memUtil;
  unsigned encUtil;
  unsigned decUtil;
};
// NVML_DEVICE_UUID_V2_BUFFER_SIZE: "GPU-" + 36 characters fits in 80 (v1); v2 allows 96.
constexpr unsigned kNvmlUuidBufferSize = 96;
constexpr nvmlReturn_t kNvmlNotFound = 6;

struct nvmlProcessInfo_v1 {  // the unversioned entry point
  unsigned pid;
  unsigned long long usedGpuMemory;
};

std::string_view nvml_error_name(nvmlReturn_t result) {
  switch (result) {
    case 0:
      return "NVML_SUCCESS";
    case 1:
      return "NVML_ERROR_UNINITIALIZED";
    case 2:
      return "NVML_ERROR_INVALID_ARGUMENT";
    case 3:
      return "NVML_ERROR_NOT_SUPPORTED";
    case 4:
      return "NVML_ERROR_NO_PERMISSION";
    case 5:
      return "NVML_ERROR_ALREADY_INITIALIZED";
    case 6:
      return "NVML_ERROR_NOT_FOUND";
    case 7:
      return "NVML_ERROR_INSUFFICIENT_SIZE";
    case 8:
      return "NVML_ERROR_INSUFFICIENT_POWER";
    case 9:
      return "NVML_ERROR_DRIVER_NOT_LOADED";
    case 10:
      return "NVML_ERROR_TIMEOUT";
    case 11:
      return "NVML_ERROR_IRQ_ISSUE";
    case 12:
      return "NVML_ERROR_LIBRARY_NOT_FOUND";
    case 13:
      return "NVML_ERROR_FUNCTION_NOT_FOUND";
    case 14:
      return "NVML_ERROR_CORRUPTED_INFOROM";
    case 15:
      return "NVML_ERROR_GPU_IS_LOST";
    case 16:
      return "NVML_ERROR_RESET_REQUIRED";
    case 17:
      return "NVML_ERROR_OPERATING_SYSTEM";
    case 18:
      return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case 19:
      return "NVML_ERROR_IN_USE";
    case 20:
      return "NVML_ERROR_MEMORY";
    case 21:
      return "NVML_ERROR_NO_DATA";
    case 22:
      return "NVML_ERROR_VGPU_ECC_NOT_ENABLED";
    case 23:
      return "NVML_ERROR_INSUFFICIENT_RESOURCES";
    case 24:
      return "NVML_ERROR_FREQ_NOT_SUPPORTED";
    case 25:
      return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    case 26:
      return "NVML_ERROR_DEPRECATED";
    case 27:
      return "NVML_ERROR_NOT_READY";
    case 28:
      return "NVML_ERROR_GPU_NOT_FOUND";
    case 29:
      return "NVML_ERROR_INVALID_STATE";
    default:
      return "NVML_ERROR_UNKNOWN";
  }
}

// NVML writes "00000000:1B:00.0"; sysfs (and the rest of gpuopt) uses "0000:1b:00.0".
std::string nvml_bus_id_to_sysfs(std::string_view bus_id) {
  std::string lower;
  for (char c : bus_id) {
    if (c == '\0') break;
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  auto colon = lower.find(':');
  if (colon != std::string::npos && colon > 4) {
    auto first_digit = lower.find_first_not_of('0');
    std::size_t keep = first_digit >= colon ? 1 : colon - first_digit;
    if (keep <= 4) lower = std::string(4 - keep, '0') + lower.substr(colon - keep);
  }
  return lower;
}

StatusCode nvml_canonical_code(nvmlReturn_t result) {
  switch (result) {
    case 2:
      return StatusCode::kInvalidArgument;
    case 3:
    case 13:
      return StatusCode::kUnimplemented;  // the device or driver lacks the feature
    case 4:
      return StatusCode::kPermissionDenied;
    case 6:
    case 28:
      return StatusCode::kNotFound;
    case 7:
      return StatusCode::kOutOfRange;
    case 1:
    case 9:
    case 12:
    case 15:
    case 16:
    case 18:
    case 27:
      return StatusCode::kUnavailable;
    case 10:
      return StatusCode::kDeadlineExceeded;
    case 20:
    case 23:
      return StatusCode::kResourceExhausted;
    default:
      return StatusCode::kUnknown;
  }
}

}  // namespace

// Entry points, resolved once at load. A null pointer means this driver lacks the function.
struct Nvml::Functions {
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*device_count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*memory_v2)(nvmlDevice_t, nvmlMemory_v2*) = nullptr;
  nvmlReturn_t (*memory_v1)(nvmlDevice_t, nvmlMemory_v1*) = nullptr;
  nvmlReturn_t (*process_utilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t*, unsigned*,
                                      unsigned long long) = nullptr;
  nvmlReturn_t (*pci_info)(nvmlDevice_t, nvmlPciInfo_v3*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*curr_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*max_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*gpu_max_gen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*curr_width)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*max_width)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcie_throughput)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*replay_counter)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*bar1)(nvmlDevice_t, nvmlBAR1Memory_t*) = nullptr;
  nvmlReturn_t (*persistence)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*pstate)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*clock_events)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*ecc_mode)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*ecc_total)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  // _v3/_v2 take nvmlProcessInfo_v2; the unversioned one takes nvmlProcessInfo_v1.
  nvmlReturn_t (*processes_v2)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v2*) = nullptr;
  nvmlReturn_t (*processes_v1)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1*) = nullptr;
  nvmlReturn_t (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn_t (*cuda_driver_version)(int*) = nullptr;
};

#define GPUOPT_NVML_CHECK(expr) check((expr), #expr, __FILE__, __LINE__)
// Fails with UNIMPLEMENTED when the loaded driver lacks the entry point.
#define GPUOPT_NVML_REQUIRE(fn)                                                        \
  do {                                                                                 \
    if (functions_->fn == nullptr) {                                                   \
      return unimplemented(                                                            \
          fmt::format("NVML in {} lacks the entry point for {}", library_name_, #fn)); \
    }                                                                                  \
  } while (0)

Status Nvml::check(int result, const char* expression, const char* file, int line) const {
  if (result == kNvmlSuccess) return ok_status();
  const char* text =
      functions_->error_string != nullptr ? functions_->error_string(result) : nullptr;
  return gpu_api_error(GpuApi::kNvml, nvml_canonical_code(result), result, nvml_error_name(result),
                       text != nullptr ? text : "no error string", expression, file, line);
}

StatusOr<const Nvml*> Nvml::instance() {
  // Loaded once; the result (instance or the reason it is absent) is shared by every thread.
  static const StatusOr<const Nvml*> loaded = []() -> StatusOr<const Nvml*> {
    auto library = DynamicLibrary::open({"libnvidia-ml.so.1", "libnvidia-ml.so"}, "NVML");
    if (!library.ok()) {
      return unavailable(
          fmt::format("no NVIDIA driver (NVML not loaded): {}", library.status().message()));
    }
    // The library stays mapped for the life of the process (DynamicLibrary never unloads).
    static DynamicLibrary kept = std::move(library).value();
    static Functions f;
    f.init = kept.function<decltype(f.init)>({"nvmlInit_v2", "nvmlInit"});
    f.error_string = kept.function<decltype(f.error_string)>({"nvmlErrorString"});
    f.device_count =
        kept.function<decltype(f.device_count)>({"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
    f.handle_by_index = kept.function<decltype(f.handle_by_index)>(
        {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
    f.handle_by_pci_bus_id = kept.function<decltype(f.handle_by_pci_bus_id)>(
        {"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId"});
    f.name = kept.function<decltype(f.name)>({"nvmlDeviceGetName"});
    f.uuid = kept.function<decltype(f.uuid)>({"nvmlDeviceGetUUID"});
    f.memory_v2 = kept.function<decltype(f.memory_v2)>({"nvmlDeviceGetMemoryInfo_v2"});
    f.memory_v1 = kept.function<decltype(f.memory_v1)>({"nvmlDeviceGetMemoryInfo"});
    f.process_utilization =
        kept.function<decltype(f.process_utilization)>({"nvmlDeviceGetProcessUtilization"});
    // The unversioned nvmlDeviceGetPciInfo has an older struct layout; only v3/v2 are used.
    f.pci_info =
        kept.function<decltype(f.pci_info)>({"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"});
    f.utilization = kept.function<decltype(f.utilization)>({"nvmlDeviceGetUtilizationRates"});
    f.curr_gen = kept.function<decltype(f.curr_gen)>({"nvmlDeviceGetCurrPcieLinkGeneration"});
    f.max_gen = kept.function<decltype(f.max_gen)>({"nvmlDeviceGetMaxPcieLinkGeneration"});
    f.gpu_max_gen =
        kept.function<decltype(f.gpu_max_gen)>({"nvmlDeviceGetGpuMaxPcieLinkGeneration"});
    f.curr_width = kept.function<decltype(f.curr_width)>({"nvmlDeviceGetCurrPcieLinkWidth"});
    f.max_width = kept.function<decltype(f.max_width)>({"nvmlDeviceGetMaxPcieLinkWidth"});
    f.pcie_throughput = kept.function<decltype(f.pcie_throughput)>({"nvmlDeviceGetPcieThroughput"});
    f.replay_counter =
        kept.function<decltype(f.replay_counter)>({"nvmlDeviceGetPcieReplayCounter"});
    f.bar1 = kept.function<decltype(f.bar1)>({"nvmlDeviceGetBAR1MemoryInfo"});
    f.persistence = kept.function<decltype(f.persistence)>({"nvmlDeviceGetPersistenceMode"});
    f.pstate = kept.function<decltype(f.pstate)>({"nvmlDeviceGetPerformanceState"});
    f.clock_events = kept.function<decltype(f.clock_events)>(
        {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
    f.temperature = kept.function<decltype(f.temperature)>({"nvmlDeviceGetTemperature"});
    f.power = kept.function<decltype(f.power)>({"nvmlDeviceGetPowerUsage"});
    f.power_limit = kept.function<decltype(f.power_limit)>({"nvmlDeviceGetEnforcedPowerLimit"});
    f.ecc_mode = kept.function<decltype(f.ecc_mode)>({"nvmlDeviceGetEccMode"});
    f.ecc_total = kept.function<decltype(f.ecc_total)>({"nvmlDeviceGetTotalEccErrors"});
    f.processes_v2 = kept.function<decltype(f.processes_v2)>(
        {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"});
    if (f.processes_v2 == nullptr) {
      f.processes_v1 =
          kept.function<decltype(f.processes_v1)>({"nvmlDeviceGetComputeRunningProcesses"});
    }
    f.driver_version = kept.function<decltype(f.driver_version)>({"nvmlSystemGetDriverVersion"});
    f.cuda_driver_version = kept.function<decltype(f.cuda_driver_version)>(
        {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"});
    if (f.init == nullptr) {
      return unavailable(fmt::format("{} has no nvmlInit_v2 or nvmlInit", kept.name()));
    }
    static Nvml nvml;
    nvml.functions_ = &f;
    nvml.library_name_ = kept.name();
    // Never shut down: other threads (trace sampling) may still be calling getters at exit.
    Status init = nvml.check(f.init(), "nvmlInit_v2()", __FILE__, __LINE__);
    if (!init.ok()) {
      return Status(
          StatusCode::kUnavailable,
          fmt::format("NVML loaded but not initialised (is the NVIDIA driver loaded?): {}",
                      init.message()));
    }
    return static_cast<const Nvml*>(&nvml);
  }();
  return loaded;
}

StatusOr<unsigned> Nvml::device_count() const {
  GPUOPT_NVML_REQUIRE(device_count);
  unsigned count = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->device_count(&count)));
  return count;
}

StatusOr<NvmlDevice> Nvml::device_by_index(unsigned index) const {
  GPUOPT_NVML_REQUIRE(handle_by_index);
  nvmlDevice_t handle = nullptr;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->handle_by_index(index, &handle)));
  return NvmlDevice{handle};
}

StatusOr<NvmlDevice> Nvml::device_by_pci_bus_id(const std::string& bus_id) const {
  GPUOPT_NVML_REQUIRE(handle_by_pci_bus_id);
  nvmlDevice_t handle = nullptr;
  GPUOPT_RETURN_IF_ERROR(
      GPUOPT_NVML_CHECK(functions_->handle_by_pci_bus_id(bus_id.c_str(), &handle)));
  return NvmlDevice{handle};
}

StatusOr<std::string> Nvml::name(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(name);
  char buffer[256] = {};
  GPUOPT_RETURN_IF_ERROR(
      GPUOPT_NVML_CHECK(functions_->name(device.handle, buffer, sizeof(buffer) - 1)));
  return std::string(buffer);
}

StatusOr<std::string> Nvml::uuid(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(uuid);
  char buffer[kNvmlUuidBufferSize] = {};
  GPUOPT_RETURN_IF_ERROR(
      GPUOPT_NVML_CHECK(functions_->uuid(device.handle, buffer, sizeof(buffer) - 1)));
  return std::string(buffer);
}

StatusOr<NvmlMemory> Nvml::memory(NvmlDevice device) const {
  if (functions_->memory_v2 != nullptr) {
    nvmlMemory_v2 raw{};
    raw.version = kNvmlMemoryV2Version;
    nvmlReturn_t result = functions_->memory_v2(device.handle, &raw);
    if (result == kNvmlSuccess) {
      return NvmlMemory{raw.total, raw.free, raw.used, raw.reserved};
    }
    // A driver that knows the symbol but not this struct version: fall back to v1.
    if (functions_->memory_v1 == nullptr) {
      GPUOPT_RETURN_IF_ERROR(
          check(result, "nvmlDeviceGetMemoryInfo_v2(device, &memory)", __FILE__, __LINE__));
    }
  }
  GPUOPT_NVML_REQUIRE(memory_v1);
  nvmlMemory_v1 raw{};
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->memory_v1(device.handle, &raw)));
  return NvmlMemory{raw.total, raw.free, raw.used, std::nullopt};
}

StatusOr<std::vector<NvmlProcessUtilization>> Nvml::process_utilization(
    NvmlDevice device, std::uint64_t since_us) const {
  GPUOPT_NVML_REQUIRE(process_utilization);
  // Size query first (INSUFFICIENT_SIZE with the count), then the read; samples may arrive in
  // between, so retry with room to spare.
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned count = 0;
    nvmlReturn_t result = functions_->process_utilization(device.handle, nullptr, &count, since_us);
    if (result == kNvmlNotFound) return std::vector<NvmlProcessUtilization>{};
    if (result != kNvmlInsufficientSize && result != kNvmlSuccess) {
      GPUOPT_RETURN_IF_ERROR(check(result, "nvmlDeviceGetProcessUtilization(device, NULL, &count)",
                                   __FILE__, __LINE__));
    }
    if (count == 0) return std::vector<NvmlProcessUtilization>{};
    count += 16;
    std::vector<nvmlProcessUtilizationSample_t> raw(count);
    result = functions_->process_utilization(device.handle, raw.data(), &count, since_us);
    if (result == kNvmlInsufficientSize) continue;
    if (result == kNvmlNotFound) return std::vector<NvmlProcessUtilization>{};
    GPUOPT_RETURN_IF_ERROR(check(result, "nvmlDeviceGetProcessUtilization(device, samples, &count)",
                                 __FILE__, __LINE__));
    std::vector<NvmlProcessUtilization> samples;
    for (unsigned i = 0; i < std::min<std::size_t>(count, raw.size()); ++i) {
      samples.push_back({raw[i].pid, raw[i].timeStamp, raw[i].smUtil, raw[i].memUtil});
    }
    return samples;
  }
  return resource_exhausted("NVML kept adding process utilisation samples");
}

StatusOr<std::string> Nvml::pci_bus_id(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(pci_info);
  nvmlPciInfo_v3 info{};
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->pci_info(device.handle, &info)));
  info.busId[sizeof(info.busId) - 1] = '\0';
  return nvml_bus_id_to_sysfs(info.busId);
}

StatusOr<NvmlUtilization> Nvml::utilization(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(utilization);
  nvmlUtilization_t raw{};
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->utilization(device.handle, &raw)));
  return NvmlUtilization{raw.gpu, raw.memory};
}

StatusOr<NvmlPcieLink> Nvml::current_pcie_link(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(curr_gen);
  GPUOPT_NVML_REQUIRE(curr_width);
  NvmlPcieLink link;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->curr_gen(device.handle, &link.generation)));
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->curr_width(device.handle, &link.width)));
  return link;
}

StatusOr<NvmlPcieLink> Nvml::max_pcie_link(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(max_gen);
  GPUOPT_NVML_REQUIRE(max_width);
  NvmlPcieLink link;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->max_gen(device.handle, &link.generation)));
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->max_width(device.handle, &link.width)));
  return link;
}

StatusOr<unsigned> Nvml::gpu_max_pcie_generation(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(gpu_max_gen);
  unsigned generation = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->gpu_max_gen(device.handle, &generation)));
  return generation;
}

StatusOr<unsigned> Nvml::pcie_throughput_kbps(NvmlDevice device, NvmlPcieCounter counter) const {
  GPUOPT_NVML_REQUIRE(pcie_throughput);
  unsigned value = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(
      functions_->pcie_throughput(device.handle, static_cast<int>(counter), &value)));
  return value;
}

StatusOr<unsigned> Nvml::pcie_replay_counter(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(replay_counter);
  unsigned value = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->replay_counter(device.handle, &value)));
  return value;
}

StatusOr<NvmlBar1> Nvml::bar1(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(bar1);
  nvmlBAR1Memory_t raw{};
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->bar1(device.handle, &raw)));
  return NvmlBar1{raw.bar1Total, raw.bar1Used};
}

StatusOr<bool> Nvml::persistence_mode(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(persistence);
  int mode = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->persistence(device.handle, &mode)));
  return mode != 0;
}

StatusOr<int> Nvml::performance_state(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(pstate);
  int state = 32;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->pstate(device.handle, &state)));
  if (state < 0 || state > 15) return unavailable("NVML reports the performance state as unknown");
  return state;
}

StatusOr<std::uint64_t> Nvml::clock_event_reasons(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(clock_events);
  unsigned long long reasons = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->clock_events(device.handle, &reasons)));
  return static_cast<std::uint64_t>(reasons);
}

StatusOr<unsigned> Nvml::temperature_c(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(temperature);
  unsigned value = 0;
  // Sensor 0 is NVML_TEMPERATURE_GPU.
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->temperature(device.handle, 0, &value)));
  return value;
}

StatusOr<double> Nvml::power_w(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(power);
  unsigned milliwatts = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->power(device.handle, &milliwatts)));
  return milliwatts / 1000.0;
}

StatusOr<double> Nvml::power_limit_w(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(power_limit);
  unsigned milliwatts = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->power_limit(device.handle, &milliwatts)));
  return milliwatts / 1000.0;
}

StatusOr<NvmlEcc> Nvml::ecc(NvmlDevice device) const {
  GPUOPT_NVML_REQUIRE(ecc_mode);
  int current = 0;
  int pending = 0;
  GPUOPT_RETURN_IF_ERROR(
      GPUOPT_NVML_CHECK(functions_->ecc_mode(device.handle, &current, &pending)));
  NvmlEcc ecc;
  ecc.enabled = current != 0;
  ecc.pending_enabled = pending != 0;
  if (ecc.enabled && functions_->ecc_total != nullptr) {
    // Error type 0 corrected, 1 uncorrected; counter type 0 volatile, 1 aggregate.
    auto read = [&](int type, int counter) -> std::optional<std::uint64_t> {
      unsigned long long value = 0;
      if (functions_->ecc_total(device.handle, type, counter, &value) != kNvmlSuccess) {
        return std::nullopt;
      }
      return value;
    };
    ecc.volatile_corrected = read(0, 0);
    ecc.volatile_uncorrected = read(1, 0);
    ecc.aggregate_corrected = read(0, 1);
    ecc.aggregate_uncorrected = read(1, 1);
  }
  return ecc;
}

StatusOr<std::vector<NvmlProcess>> Nvml::compute_processes(NvmlDevice device) const {
  if (functions_->processes_v2 == nullptr && functions_->processes_v1 == nullptr) {
    return unimplemented(
        fmt::format("NVML in {} lacks nvmlDeviceGetComputeRunningProcesses", library_name_));
  }
  // Processes come and go between the size query and the read: retry with a larger buffer.
  unsigned capacity = 64;
  for (int attempt = 0; attempt < 4; ++attempt, capacity *= 4) {
    unsigned count = capacity;
    std::vector<NvmlProcess> processes;
    nvmlReturn_t result;
    if (functions_->processes_v2 != nullptr) {
      std::vector<nvmlProcessInfo_v2> raw(capacity);
      result = functions_->processes_v2(device.handle, &count, raw.data());
      if (result == kNvmlSuccess) {
        for (unsigned i = 0; i < std::min(count, capacity); ++i) {
          processes.push_back({raw[i].pid, raw[i].usedGpuMemory});
        }
      }
    } else {
      std::vector<nvmlProcessInfo_v1> raw(capacity);
      result = functions_->processes_v1(device.handle, &count, raw.data());
      if (result == kNvmlSuccess) {
        for (unsigned i = 0; i < std::min(count, capacity); ++i) {
          processes.push_back({raw[i].pid, raw[i].usedGpuMemory});
        }
      }
    }
    if (result == kNvmlInsufficientSize) continue;
    GPUOPT_RETURN_IF_ERROR(check(result,
                                 "nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos)",
                                 __FILE__, __LINE__));
    for (auto& process : processes) {
      // NVML_VALUE_NOT_AVAILABLE (all ones) under some virtualisation and permission modes.
      if (process.used_memory_bytes == kNvmlValueNotAvailableU64) process.used_memory_bytes.reset();
    }
    return processes;
  }
  return resource_exhausted("more GPU processes than gpuopt will list (4096)");
}

StatusOr<std::string> Nvml::driver_version() const {
  GPUOPT_NVML_REQUIRE(driver_version);
  char buffer[96] = {};
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->driver_version(buffer, sizeof(buffer) - 1)));
  return std::string(buffer);
}

StatusOr<int> Nvml::cuda_driver_version() const {
  GPUOPT_NVML_REQUIRE(cuda_driver_version);
  int version = 0;
  GPUOPT_RETURN_IF_ERROR(GPUOPT_NVML_CHECK(functions_->cuda_driver_version(&version)));
  return version;
}

std::vector<std::string> clock_event_names(std::uint64_t reasons) {
  static constexpr std::pair<std::uint64_t, const char*> kNames[] = {
      {kClockEventGpuIdle, "gpu_idle"},
      {kClockEventApplicationsClocksSetting, "applications_clocks_setting"},
      {kClockEventSwPowerCap, "sw_power_cap"},
      {kClockEventHwSlowdown, "hw_slowdown"},
      {kClockEventSyncBoost, "sync_boost"},
      {kClockEventSwThermalSlowdown, "sw_thermal_slowdown"},
      {kClockEventHwThermalSlowdown, "hw_thermal_slowdown"},
      {kClockEventHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
      {kClockEventDisplayClockSetting, "display_clock_setting"},
  };
  std::vector<std::string> names;
  std::uint64_t known = 0;
  for (const auto& [bit, name] : kNames) {
    known |= bit;
    if (reasons & bit) names.emplace_back(name);
  }
  if (std::uint64_t unknown = reasons & ~known; unknown != 0) {
    names.push_back(fmt::format("0x{:x}", unknown));
  }
  return names;
}

std::optional<double> replay_budget_per_minute(int generation, int width) {
  static constexpr double kSpeeds[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  if (generation < 1 || generation > 6 || width < 1 || width > 32) return std::nullopt;
  double bits_per_second = kSpeeds[generation - 1] * 1e9 * width;
  return bits_per_second * 1e-12 * 60.0;
}

}  // namespace gpuopt::platform
