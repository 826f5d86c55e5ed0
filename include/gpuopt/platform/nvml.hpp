// NVML through dlopen: one shared, lazily loaded instance whose getters are safe to call from any
// thread. Every metric is a StatusOr (absent metrics are errors, never zeros), as nvtop does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::platform {

// Opaque NVML device handle (nvmlDevice_t). Valid for the life of the process once obtained.
struct NvmlDevice {
  void* handle = nullptr;
};

struct NvmlUtilization {
  unsigned gpu_percent = 0;     // time a kernel ran during the last sample period
  unsigned memory_percent = 0;  // time device memory was read or written
};

struct NvmlPcieLink {
  unsigned generation = 0;
  unsigned width = 0;
};

struct NvmlBar1 {
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;
};

struct NvmlEcc {
  bool enabled = false;
  bool pending_enabled = false;
  std::optional<std::uint64_t> volatile_corrected;
  std::optional<std::uint64_t> volatile_uncorrected;
  std::optional<std::uint64_t> aggregate_corrected;
  std::optional<std::uint64_t> aggregate_uncorrected;
};

struct NvmlProcess {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_memory_bytes;  // NVML reports "not available" under some modes
};

// Device memory as the driver accounts it. `reserved` (driver and firmware) comes only from
// nvmlDeviceGetMemoryInfo_v2; with the older entry point it is inside `used`.
struct NvmlMemory {
  std::uint64_t total_bytes = 0;
  std::uint64_t free_bytes = 0;
  std::uint64_t used_bytes = 0;
  std::optional<std::uint64_t> reserved_bytes;
};

// One process's share of the GPU in one sample period (nvmlDeviceGetProcessUtilization).
struct NvmlProcessUtilization {
  unsigned pid = 0;
  std::uint64_t timestamp_us = 0;  // CPU clock, microseconds since the epoch
  unsigned sm_percent = 0;
  unsigned memory_percent = 0;
};

// Clock event (formerly "throttle") reason bits, as NVML defines them.
enum NvmlClockEvent : std::uint64_t {
  kClockEventGpuIdle = 0x1,
  kClockEventApplicationsClocksSetting = 0x2,
  kClockEventSwPowerCap = 0x4,
  kClockEventHwSlowdown = 0x8,
  kClockEventSyncBoost = 0x10,
  kClockEventSwThermalSlowdown = 0x20,
  kClockEventHwThermalSlowdown = 0x40,
  kClockEventHwPowerBrakeSlowdown = 0x80,
  kClockEventDisplayClockSetting = 0x100,
};

// Names of the set bits ("gpu_idle", "sw_power_cap", ...); unknown bits as "0x...".
std::vector<std::string> clock_event_names(std::uint64_t reasons);

// PCIe throughput counters as NVML reports them (KB/s over a ~20 ms window).
enum class NvmlPcieCounter { kTx = 0, kRx = 1 };

class Nvml {
 public:
  // The process-wide instance, loaded and initialised on first use (thread-safe). UNAVAILABLE with
  // the reason (library absent, GPUOPT_DISABLE_NVML=1, driver not loaded, nvmlInit failed).
  static StatusOr<const Nvml*> instance();

  // Which library file and which init symbol were used, for reports.
  const std::string& library_name() const { return library_name_; }

  StatusOr<unsigned> device_count() const;
  StatusOr<NvmlDevice> device_by_index(unsigned index) const;
  // `bus_id` as sysfs spells it ("0000:01:00.0"); NVML's own form is also accepted.
  StatusOr<NvmlDevice> device_by_pci_bus_id(const std::string& bus_id) const;

  StatusOr<std::string> name(NvmlDevice device) const;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi and dcgm-exporter print.
  StatusOr<std::string> uuid(NvmlDevice device) const;
  StatusOr<NvmlMemory> memory(NvmlDevice device) const;
  // Samples newer than `since_us` (microseconds since the epoch; 0: all NVML still holds). Empty
  // when no process ran in that window (NVML answers NOT_FOUND then).
  StatusOr<std::vector<NvmlProcessUtilization>> process_utilization(NvmlDevice device,
                                                                    std::uint64_t since_us) const;
  // In sysfs form: lower-case, 4-digit domain ("0000:01:00.0").
  StatusOr<std::string> pci_bus_id(NvmlDevice device) const;
  StatusOr<NvmlUtilization> utilization(NvmlDevice device) const;
  StatusOr<NvmlPcieLink> current_pcie_link(NvmlDevice device) const;
  // What the device and the system it sits in can reach (NVML "max": limited by the slot).
  StatusOr<NvmlPcieLink> max_pcie_link(NvmlDevice device) const;
  // What the GPU itself supports, regardless of the slot (nvmlDeviceGetGpuMaxPcieLinkGeneration).
  StatusOr<unsigned> gpu_max_pcie_generation(NvmlDevice device) const;
  StatusOr<unsigned> pcie_throughput_kbps(NvmlDevice device, NvmlPcieCounter counter) const;
  StatusOr<unsigned> pcie_replay_counter(NvmlDevice device) const;
  StatusOr<NvmlBar1> bar1(NvmlDevice device) const;
  StatusOr<bool> persistence_mode(NvmlDevice device) const;
  // 0 (P0, maximum performance) .. 15; UNAVAILABLE for "unknown" (32).
  StatusOr<int> performance_state(NvmlDevice device) const;
  StatusOr<std::uint64_t> clock_event_reasons(NvmlDevice device) const;
  StatusOr<unsigned> temperature_c(NvmlDevice device) const;
  StatusOr<double> power_w(NvmlDevice device) const;
  StatusOr<double> power_limit_w(NvmlDevice device) const;
  StatusOr<NvmlEcc> ecc(NvmlDevice device) const;
  StatusOr<std::vector<NvmlProcess>> compute_processes(NvmlDevice device) const;
  StatusOr<std::string> driver_version() const;
  // e.g. 13000 for CUDA 13.0.
  StatusOr<int> cuda_driver_version() const;

  struct Functions;  // resolved entry points (defined in nvml.cpp)

 private:
  Nvml() = default;
  Status check(int result, const char* expression, const char* file, int line) const;

  const Functions* functions_ = nullptr;
  std::string library_name_;
};

// Theoretical PCIe replay budget per minute for a link at BER 1e-12, DCGM's rule: a replay is
// expected at most once per 1e12 bits, so rate limit = link bits per second × 1e-12 × 60.
// Gen5 x16 ≈ 30.7/min. Uses the raw lane rate (GT/s × width), as DCGM does.
std::optional<double> replay_budget_per_minute(int generation, int width);

}  // namespace gpuopt::platform
