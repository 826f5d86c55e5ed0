// PCI configuration-space parser for the bytes of sysfs `config`: capability list walks that are
// bounds-checked and loop-safe, and the capabilities doctor judges (PCIe link, ASPM control, ATS,
// ACS, Resizable BAR, AER). Unprivileged reads of `config` return only 64 bytes; the parser says
// which answers needed more ("needs root") instead of guessing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpuopt::platform {

struct ResizableBar {
  int bar_index = 0;
  std::uint64_t current_bytes = 0;
  std::vector<std::uint64_t> supported_bytes;  // ascending
};

struct PciConfig {
  std::size_t length = 0;  // bytes available
  std::optional<std::uint16_t> vendor_id;
  std::optional<std::uint16_t> device_id;
  // Standard capabilities live in bytes 0x40..0xFF, extended ones from 0x100: an unprivileged read
  // (64 bytes) or a conventional-PCI function (256 bytes) cannot show them.
  bool standard_capabilities_readable = false;
  bool extended_capabilities_readable = false;

  // PCI Express capability (id 0x10).
  bool pcie_present = false;
  std::optional<int> port_type;            // 0 endpoint, 4 root port, 5 upstream, 6 downstream, ...
  std::optional<int> link_max_speed_code;  // Link Capabilities 3:0 (1 = 2.5 GT/s ... 6 = 64)
  std::optional<int> link_max_width;       // Link Capabilities 9:4
  std::optional<int> link_current_speed_code;
  std::optional<int> link_current_width;
  std::optional<int> aspm_control;  // Link Control 1:0: bit 0 L0s, bit 1 L1 enabled

  // Extended capabilities (need the full 4 KiB).
  bool aer_present = false;
  bool ats_present = false;
  std::optional<bool> ats_enabled;
  bool acs_present = false;
  std::optional<std::uint16_t> acs_capability;
  std::optional<std::uint16_t> acs_control;  // bit 2 P2P request redirect, 3 completion redirect
  std::vector<ResizableBar> resizable_bars;

  // Structural problems: truncation, capability loops, pointers into the header, short reads.
  std::vector<std::string> problems;

  bool acs_p2p_request_redirect() const { return acs_control && (*acs_control & 0x4) != 0; }
  bool acs_p2p_completion_redirect() const { return acs_control && (*acs_control & 0x8) != 0; }
};

// Parses whatever bytes there are; never reads outside `bytes`, never loops forever.
PciConfig parse_pci_config(std::span<const std::uint8_t> bytes);

// "L0s L1", "L1", "disabled" for an ASPM control value.
std::string aspm_control_name(int control);

}  // namespace gpuopt::platform
