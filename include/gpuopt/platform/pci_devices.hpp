// PCI devices from sysfs under a root ("/" or a recorded tree): identity, names from pci.ids
// (libpci), driver, NUMA locality, the link path up to the root port, config-space capabilities of
// the device and every bridge above it, AER counters, per-link ASPM state and IOMMU group.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/platform/pci_config.hpp"
#include "gpuopt/platform/pcie_link.hpp"

namespace gpuopt::platform {

// Totals from aer_dev_correctable / aer_dev_fatal / aer_dev_nonfatal.
struct AerCounts {
  std::optional<std::uint64_t> correctable;
  std::optional<std::uint64_t> fatal;
  std::optional<std::uint64_t> nonfatal;
  std::map<std::string, std::uint64_t> details;  // non-zero named counters, "correctable.RxErr"
};

// sysfs <dev>/link/{l0s,l1,l1_1,l1_2,l1_1_pcipm,l1_2_pcipm,clkpm}_aspm: which states are enabled.
struct AspmLinkState {
  std::map<std::string, bool> states;  // "l1_aspm" → true
};

struct PciHop {
  LinkHop link;
  std::optional<PciConfig> config;  // absent when `config` could not be read
  std::string config_error;         // why not
  std::optional<std::uint32_t> class_code;
};

struct PciDevice {
  std::string bdf;
  std::uint32_t class_code = 0;  // 0xCCSSPP
  std::uint16_t vendor_id = 0;
  std::uint16_t device_id = 0;
  std::optional<std::uint16_t> subsystem_vendor_id;
  std::optional<std::uint16_t> subsystem_device_id;
  std::string vendor_name;  // from pci.ids; empty when unknown
  std::string device_name;
  std::string class_name;
  std::string driver;            // bound driver name; empty when none
  std::optional<int> numa_node;  // absent when sysfs says -1 or nothing
  std::string local_cpulist;
  std::optional<bool> boot_vga;  // the firmware's boot display device (the one driving the display)
  // power/runtime_status: "active", "suspended", "suspending", "resuming", "error", "unsupported";
  // empty when absent. A suspended dGPU wakes on the first access and pays the resume latency.
  std::string runtime_status;
  std::vector<PciHop> path;         // device first, root port last
  LinkState effective_link;         // minimum along the path
  std::optional<PciConfig> config;  // the device's own (same as path[0].config)
  AerCounts aer;
  AspmLinkState aspm;
  std::optional<int> iommu_group;
  std::string iommu_domain_type;      // groups/<n>/type: "identity", "DMA", "DMA-FQ", ...
  std::vector<std::string> problems;  // unreadable or malformed inputs, named

  bool is_display() const { return (class_code >> 16) == 0x03; }
  bool is_accelerator() const { return (class_code >> 16) == 0x12; }
  bool is_nvidia() const { return vendor_id == 0x10DE; }
};

struct PciScan {
  std::vector<PciDevice> devices;            // those that passed the filter, in BDF order
  int scanned = 0;                           // every device under sys/bus/pci/devices
  std::map<std::string, int> other_classes;  // class name → count of filtered-out devices
  std::vector<std::string> problems;
};

// Reads <root>/sys/bus/pci/devices. With `all` false, only display (0x03) and accelerator (0x12)
// class devices are described in full. NOT_FOUND when the directory does not exist.
StatusOr<PciScan> scan_pci_devices(const std::string& root, bool all = false);

// ---- Parsers for sysfs text, exposed for tests and fuzzing ----
// "0x10de\n" → 0x10de; nullopt when malformed or out of range.
std::optional<std::uint32_t> parse_sysfs_hex(std::string_view text, std::uint32_t max);
// "-1" → nullopt, "0" → 0; nullopt when malformed.
std::optional<int> parse_sysfs_int(std::string_view text);
// aer_dev_* content: lines "RxErr 0", ..., "TOTAL_ERR_COR 2". Returns the total (the TOTAL_ line,
// or the sum when there is none) and fills `details` (prefixed) with non-zero counters. nullopt
// when no line parses.
std::optional<std::uint64_t> parse_aer_counters(std::string_view text, std::string_view prefix,
                                                std::map<std::string, std::uint64_t>& details);

// Vendor/device/class names from pci.ids through libpci; empty strings when unknown.
struct PciNames {
  std::string vendor;
  std::string device;
  std::string class_name;
};
PciNames lookup_pci_names(std::uint16_t vendor_id, std::uint16_t device_id,
                          std::uint32_t class_code);

}  // namespace gpuopt::platform
