// Platform-wide state that decides PCIe and DMA behaviour: ASPM policy, IOMMU mode and groups,
// kernel parameters that matter, and the NVIDIA kernel driver version, all read under a root.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuopt::platform {

struct IommuInfo {
  int group_count = 0;
  std::map<std::string, int> domain_types;  // "identity" → 3, "DMA-FQ" → 1 (from groups/*/type)
  // "passthrough" (every typed group is identity), "translated" (some group translates DMA),
  // "off" (no groups), or "unknown" (groups without a readable type).
  std::string mode = "off";
};

struct SystemInfo {
  std::optional<std::string> aspm_policy;  // the bracketed entry of pcie_aspm/parameters/policy
  std::string aspm_policy_raw;
  IommuInfo iommu;
  std::string cmdline;
  // Parameters of the kernel command line that change PCIe/IOMMU behaviour, name → value ("" when
  // given without a value): iommu, intel_iommu, amd_iommu, iommu.passthrough, iommu.strict,
  // pcie_aspm, pci, pcie_ports, pcie_acs_override.
  std::map<std::string, std::string> relevant_parameters;
  std::optional<std::string> kernel_release;
  std::optional<std::string> nvidia_kernel_driver;  // /proc/driver/nvidia/version or /sys/module
  std::vector<std::string> problems;
};

SystemInfo read_system_info(const std::string& root);

// "[default] performance powersave" → "default"; nullopt when nothing is bracketed.
std::optional<std::string> parse_bracketed_choice(std::string_view text);
// The relevant parameters of a kernel command line (quotes honoured; stops at "--").
std::map<std::string, std::string> parse_kernel_parameters(std::string_view cmdline);
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." → "580.65.06".
std::optional<std::string> parse_nvidia_driver_version(std::string_view text);

}  // namespace gpuopt::platform
