// PCI enumeration from sysfs (any root), names from pci.ids through libpci, and the sysfs text
// parsers.
#include "gpuopt/platform/pci_devices.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "sysfs_text.hpp"

extern "C" {
#include <pci/pci.h>
}

namespace gpuopt::platform {

namespace fs = std::filesystem;

namespace {

using detail::read_text;
using detail::trim;

std::optional<std::vector<std::uint8_t>> read_bytes(const fs::path& path, std::string& error) {
  auto text = read_regular_file(path, 4096);
  if (!text.ok()) {
    error = text.status().code() == StatusCode::kNotFound          ? "absent"
            : text.status().code() == StatusCode::kInvalidArgument ? "not a regular file"
                                                                   : "not readable";
    return std::nullopt;
  }
  return std::vector<std::uint8_t>(text->begin(), text->end());
}

std::string link_target_name(const fs::path& link) {
  std::error_code error;
  fs::path target = fs::read_symlink(link, error);
  if (error) return {};
  return target.filename().string();
}

void noop_message(char*, ...) {}

// A /sys/bus/pci/devices/<bdf> link of a recorded tree points at an absolute /sys/devices/...
// path: take it relative to the root, so recorded machines never read the host's sysfs.
fs::path device_directory(const fs::path& root, const std::string& bdf) {
  fs::path link = root / "sys/bus/pci/devices" / bdf;
  std::error_code error;
  fs::path target = fs::read_symlink(link, error);
  if (error) return link;
  if (target.is_absolute()) return root / target.relative_path();
  return link.parent_path() / target;
}

}  // namespace

std::optional<std::uint32_t> parse_sysfs_hex(std::string_view text, std::uint32_t max) {
  text = trim(text);
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
    text.remove_prefix(2);
  if (text.empty()) return std::nullopt;
  std::uint32_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (error != std::errc() || end != text.data() + text.size() || value > max) return std::nullopt;
  return value;
}

std::optional<int> parse_sysfs_int(std::string_view text) {
  text = trim(text);
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  if (value < 0) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> parse_aer_counters(std::string_view text, std::string_view prefix,
                                                std::map<std::string, std::uint64_t>& details) {
  std::optional<std::uint64_t> total;
  std::uint64_t sum = 0;
  bool any = false;
  while (!text.empty()) {
    auto newline = text.find('\n');
    std::string_view line = trim(text.substr(0, newline));
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    auto space = line.find_last_of(" \t");
    if (space == std::string_view::npos) continue;
    std::string_view name = trim(line.substr(0, space));
    std::string_view number = line.substr(space + 1);
    std::uint64_t value = 0;
    auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (error != std::errc() || end != number.data() + number.size() || name.empty()) continue;
    any = true;
    if (name.substr(0, 6) == "TOTAL_") {
      total = value;
    } else {
      if (value > UINT64_MAX - sum) return std::nullopt;  // a corrupt file, not a count
      sum += value;
      if (value != 0) details[fmt::format("{}.{}", prefix, name)] = value;
    }
  }
  if (!any) return std::nullopt;
  return total ? *total : sum;
}

PciNames lookup_pci_names(std::uint16_t vendor_id, std::uint16_t device_id,
                          std::uint32_t class_code) {
  // One libpci handle for the process; it parses pci.ids on first use. libpci is not thread-safe.
  static std::mutex mutex;
  static pci_access* access = [] {
    pci_access* created = pci_alloc();
    if (created != nullptr) {
      created->warning = noop_message;
      created->debug = noop_message;
      // Names come from pci.ids only. libpci's udev hwdb lookup creates a udev context that it
      // never releases when no hwdb.bin exists (a machine without the udev package), which
      // LeakSanitizer reports; the flag below covers libpci versions without the parameter.
      char param[] = "hwdb.disable";
      char value[] = "1";
      pci_set_param(created, param, value);
    }
    return created;
  }();
  constexpr int kLookupFlags = PCI_LOOKUP_NO_NUMBERS | PCI_LOOKUP_NO_HWDB;
  PciNames names;
  if (access == nullptr) return names;
  std::lock_guard<std::mutex> lock(mutex);
  char buffer[256];
  if (const char* name = pci_lookup_name(access, buffer, sizeof(buffer),
                                         PCI_LOOKUP_VENDOR | kLookupFlags, vendor_id)) {
    names.vendor = name;
  }
  if (const char* name = pci_lookup_name(access, buffer, sizeof(buffer),
                                         PCI_LOOKUP_DEVICE | kLookupFlags, vendor_id, device_id)) {
    names.device = name;
  }
  if (const char* name =
          pci_lookup_name(access, buffer, sizeof(buffer), PCI_LOOKUP_CLASS | kLookupFlags,
                          static_cast<int>(class_code >> 8))) {
    names.class_name = name;
  }
  return names;
}

namespace {

PciDevice describe_device(const fs::path& root, const std::string& bdf, std::uint32_t class_code) {
  PciDevice device;
  device.bdf = bdf;
  device.class_code = class_code;
  fs::path dir = device_directory(root, bdf);
  auto hex_attribute = [&](const char* name, std::uint32_t max) -> std::optional<std::uint32_t> {
    auto text = read_text(dir / name, 256);
    if (!text) return std::nullopt;
    auto value = parse_sysfs_hex(*text, max);
    if (!value) {
      device.problems.push_back(
          fmt::format("{}/{}: malformed value '{}'", dir.string(), name, trim(*text)));
    }
    return value;
  };
  device.vendor_id = static_cast<std::uint16_t>(hex_attribute("vendor", 0xFFFF).value_or(0));
  device.device_id = static_cast<std::uint16_t>(hex_attribute("device", 0xFFFF).value_or(0));
  if (auto value = hex_attribute("subsystem_vendor", 0xFFFF)) device.subsystem_vendor_id = *value;
  if (auto value = hex_attribute("subsystem_device", 0xFFFF)) device.subsystem_device_id = *value;
  PciNames names = lookup_pci_names(device.vendor_id, device.device_id, class_code);
  device.vendor_name = names.vendor;
  device.device_name = names.device;
  device.class_name = names.class_name;
  device.driver = link_target_name(dir / "driver");
  if (auto text = read_text(dir / "numa_node", 64)) device.numa_node = parse_sysfs_int(*text);
  if (auto text = read_text(dir / "local_cpulist", 4096)) device.local_cpulist = trim(*text);
  if (auto text = read_text(dir / "boot_vga", 16)) device.boot_vga = trim(*text) == "1";
  if (auto text = read_text(dir / "power/runtime_status", 64)) device.runtime_status = trim(*text);
  if (std::string group = link_target_name(dir / "iommu_group"); !group.empty()) {
    device.iommu_group = parse_sysfs_int(group);
    if (auto type = read_text(root / "sys/kernel/iommu_groups" / group / "type", 64)) {
      device.iommu_domain_type = trim(*type);
    }
  }

  auto path = read_link_path(root.string(), bdf);
  if (!path.ok()) {
    device.problems.push_back(path.status().message());
  } else {
    std::vector<LinkHop> hops = std::move(path).value();
    device.effective_link = effective_link(hops);
    for (auto& hop : hops) {
      PciHop pci_hop;
      for (const auto& problem : hop.problems) device.problems.push_back(problem);
      std::string error;
      if (auto bytes = read_bytes(fs::path(hop.sysfs_path) / "config", error)) {
        pci_hop.config = parse_pci_config(*bytes);
        for (const auto& problem : pci_hop.config->problems) {
          device.problems.push_back(fmt::format("{}/config: {}", hop.sysfs_path, problem));
        }
      } else {
        pci_hop.config_error = fmt::format("{}/config: {}", hop.sysfs_path, error);
      }
      if (auto text = read_text(fs::path(hop.sysfs_path) / "class", 64)) {
        pci_hop.class_code = parse_sysfs_hex(*text, 0xFFFFFF);
      }
      pci_hop.link = std::move(hop);
      device.path.push_back(std::move(pci_hop));
    }
    if (!device.path.empty()) device.config = device.path.front().config;
  }

  static constexpr std::pair<const char*, const char*> kAerFiles[] = {
      {"aer_dev_correctable", "correctable"},
      {"aer_dev_fatal", "fatal"},
      {"aer_dev_nonfatal", "nonfatal"},
  };
  for (const auto& [file, prefix] : kAerFiles) {
    auto text = read_text(dir / file, 64 * 1024);
    if (!text) continue;  // AER not supported or not enabled by the platform
    auto total = parse_aer_counters(*text, prefix, device.aer.details);
    if (!total) {
      device.problems.push_back(
          fmt::format("{}/{}: no counters could be parsed", dir.string(), file));
      continue;
    }
    std::string_view which = prefix;
    (which == "correctable" ? device.aer.correctable
     : which == "fatal"     ? device.aer.fatal
                            : device.aer.nonfatal) = *total;
  }

  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir / "link", error)) {
    std::string name = entry.path().filename().string();
    if (name.size() < 5 || name.substr(name.size() - 5) != "_aspm") continue;
    if (auto text = read_text(entry.path(), 16)) {
      auto value = parse_sysfs_int(*text);
      if (value) device.aspm.states[name] = *value != 0;
    }
  }
  return device;
}

}  // namespace

StatusOr<PciScan> scan_pci_devices(const std::string& root, bool all) {
  fs::path root_path(root.empty() ? "/" : root);
  fs::path bus = root_path / "sys/bus/pci/devices";
  std::error_code error;
  if (!fs::is_directory(bus, error)) {
    return not_found(fmt::format("{} does not exist: no PCI bus visible", bus.string()));
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(bus, error)) {
    std::string name = entry.path().filename().string();
    if (is_pci_bdf(name)) names.push_back(name);
  }
  if (error) return unavailable(fmt::format("cannot list {}: {}", bus.string(), error.message()));
  std::sort(names.begin(), names.end());
  PciScan scan;
  for (const auto& bdf : names) {
    ++scan.scanned;
    auto text = read_text(device_directory(root_path, bdf) / "class", 64);
    auto class_code = text ? parse_sysfs_hex(*text, 0xFFFFFF) : std::nullopt;
    if (!class_code) {
      scan.problems.push_back(
          fmt::format("{}/{}/class: unreadable or malformed", bus.string(), bdf));
      continue;
    }
    std::uint32_t base = *class_code >> 16;
    if (!all && base != 0x03 && base != 0x12) {
      std::string name = lookup_pci_names(0, 0, *class_code).class_name;
      if (name.empty()) name = fmt::format("class {:06x}", *class_code);
      ++scan.other_classes[name];
      continue;
    }
    scan.devices.push_back(describe_device(root_path, bdf, *class_code));
  }
  return scan;
}

}  // namespace gpuopt::platform
