// ASPM policy, IOMMU groups and mode, kernel parameters and NVIDIA kernel module version from a
// root.
#include "gpuopt/platform/system_info.hpp"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

#include "sysfs_text.hpp"

namespace gpuopt::platform {

namespace fs = std::filesystem;

namespace {

using detail::read_text;
using detail::trim;

}  // namespace

std::optional<std::string> parse_bracketed_choice(std::string_view text) {
  auto open = text.find('[');
  if (open == std::string_view::npos) return std::nullopt;
  auto close = text.find(']', open + 1);
  if (close == std::string_view::npos || close == open + 1) return std::nullopt;
  return std::string(trim(text.substr(open + 1, close - open - 1)));
}

std::map<std::string, std::string> parse_kernel_parameters(std::string_view cmdline) {
  static const std::set<std::string, std::less<>> kRelevant = {
      "iommu",     "intel_iommu", "amd_iommu",  "iommu.passthrough", "iommu.strict",
      "pcie_aspm", "pci",         "pcie_ports", "pcie_acs_override", "pcie_aspm.policy"};
  std::map<std::string, std::string> parameters;
  std::size_t i = 0;
  while (i < cmdline.size()) {
    while (i < cmdline.size() && std::isspace(static_cast<unsigned char>(cmdline[i]))) ++i;
    if (i >= cmdline.size()) break;
    std::string token;
    bool quoted = false;
    while (i < cmdline.size() &&
           (quoted || !std::isspace(static_cast<unsigned char>(cmdline[i])))) {
      if (cmdline[i] == '"') {
        quoted = !quoted;
      } else {
        token.push_back(cmdline[i]);
      }
      ++i;
    }
    if (token == "--") break;  // the rest belongs to init
    auto equals = token.find('=');
    std::string name = token.substr(0, equals);
    if (kRelevant.count(name) != 0) {
      parameters[name] = equals == std::string::npos ? "" : token.substr(equals + 1);
    }
  }
  return parameters;
}

std::optional<std::string> parse_nvidia_driver_version(std::string_view text) {
  auto marker = text.find("Kernel Module");
  if (marker == std::string_view::npos) return std::nullopt;
  std::size_t i = marker + 13;
  // Skip to the first token that starts with a digit (an optional "for aarch64" may precede it).
  while (i < text.size() && text[i] != '\n') {
    while (i < text.size() && text[i] == ' ') ++i;
    std::size_t start = i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    std::string_view token = text.substr(start, i - start);
    if (!token.empty() && std::isdigit(static_cast<unsigned char>(token.front()))) {
      return std::string(token);
    }
    if (token.empty()) break;
  }
  return std::nullopt;
}

SystemInfo read_system_info(const std::string& root) {
  fs::path base(root.empty() ? "/" : root);
  SystemInfo info;
  if (auto text = read_text(base / "sys/module/pcie_aspm/parameters/policy")) {
    info.aspm_policy_raw = std::string(trim(*text));
    info.aspm_policy = parse_bracketed_choice(*text);
    if (!info.aspm_policy) {
      info.problems.push_back(
          fmt::format("ASPM policy '{}' has no selected entry", info.aspm_policy_raw));
    }
  }
  std::error_code error;
  fs::path groups = base / "sys/kernel/iommu_groups";
  int untyped = 0;
  for (const auto& entry : fs::directory_iterator(groups, error)) {
    ++info.iommu.group_count;
    if (auto type = read_text(entry.path() / "type", 64)) {
      std::string name(trim(*type));
      if (!name.empty()) {
        ++info.iommu.domain_types[name];
        continue;
      }
    }
    ++untyped;
  }
  if (info.iommu.group_count > 0) {
    bool translated = false;
    for (const auto& [type, count] : info.iommu.domain_types) {
      // "identity" is passthrough; "blocked" isolates a device; DMA and DMA-FQ translate.
      if (type == "DMA" || type == "DMA-FQ" || type == "unmanaged") translated = true;
    }
    if (translated) {
      info.iommu.mode = "translated";
    } else if (info.iommu.domain_types.count("identity") != 0) {
      info.iommu.mode = "passthrough";
    } else {
      info.iommu.mode = "unknown";
    }
    if (untyped > 0 && info.iommu.mode == "passthrough") info.iommu.mode = "unknown";
  }
  if (auto text = read_text(base / "proc/cmdline")) {
    info.cmdline = std::string(trim(*text));
    info.relevant_parameters = parse_kernel_parameters(info.cmdline);
  } else {
    info.problems.push_back(fmt::format("{} is not readable", (base / "proc/cmdline").string()));
  }
  if (auto text = read_text(base / "proc/sys/kernel/osrelease", 256)) {
    info.kernel_release = std::string(trim(*text));
  }
  if (auto text = read_text(base / "proc/driver/nvidia/version", 4096)) {
    info.nvidia_kernel_driver = parse_nvidia_driver_version(*text);
  }
  if (!info.nvidia_kernel_driver) {
    if (auto text = read_text(base / "sys/module/nvidia/version", 256)) {
      std::string version(trim(*text));
      if (!version.empty()) info.nvidia_kernel_driver = version;
    }
  }
  return info;
}

}  // namespace gpuopt::platform
