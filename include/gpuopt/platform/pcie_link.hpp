// PCIe link state from sysfs: speeds, widths, the path from a device up to its root port, and the
// theoretical rate of a link (generation × width × line encoding). Reads only.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::platform {

// "16.0 GT/s PCIe" or "8 GT/s" → 16.0 / 8.0; nullopt for "Unknown" or malformed text.
std::optional<double> parse_link_speed_gts(std::string_view text);
// 2.5 → 1, 5 → 2, 8 → 3, 16 → 4, 32 → 5, 64 → 6; nullopt for anything else.
std::optional<int> pcie_generation(double speed_gts);
// Transfer rate in GT/s of a generation (1..6); nullopt otherwise.
std::optional<double> pcie_speed_gts(int generation);
// Theoretical data rate per direction in GB/s (1e9 bytes) after line encoding:
// 8b/10b for Gen1-2, 128b/130b for Gen3-5, 242B/256B FLIT for Gen6.
std::optional<double> pcie_bandwidth_gbps(int generation, int width);

struct LinkState {
  std::optional<double> current_speed_gts;
  std::optional<double> max_speed_gts;
  std::optional<int> current_width;
  std::optional<int> max_width;
};

struct LinkHop {
  std::string bdf;         // "0000:01:00.0"
  std::string sysfs_path;  // resolved /sys/devices/pci.../0000:01:00.0 (under the root)
  LinkState link;
  std::vector<std::string> problems;  // unreadable or malformed attributes, named
};

// Reads current/max link speed and width of one device directory. Missing or malformed files
// leave the field empty and are named in `problems`.
LinkHop read_link_hop(const std::string& device_dir, std::string bdf);

// The device and every PCI bridge above it, device first, root port last. `root` is "/" or a
// recorded tree (tests/data). NOT_FOUND when /sys/bus/pci/devices/<bdf> does not exist.
StatusOr<std::vector<LinkHop>> read_link_path(const std::string& root, const std::string& bdf);

// The link the device actually gets: the minimum current speed and width along the path.
LinkState effective_link(const std::vector<LinkHop>& path);

// True for "0000:01:00.0"-shaped names.
bool is_pci_bdf(std::string_view name);

}  // namespace gpuopt::platform
