// PCIe link state from sysfs and the theoretical rate of a link.
#include "gpuopt/platform/pcie_link.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "sysfs_text.hpp"

namespace gpuopt::platform {

namespace fs = std::filesystem;

std::optional<double> parse_link_speed_gts(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return std::nullopt;
  std::string_view rest(end, text.data() + text.size() - end);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.substr(0, 4) != "GT/s") return std::nullopt;
  if (!(value > 0) || value > 1024) return std::nullopt;
  return value;
}

std::optional<int> pcie_generation(double speed_gts) {
  static constexpr double kSpeeds[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  for (int generation = 1; generation <= 6; ++generation) {
    if (std::fabs(speed_gts - kSpeeds[generation - 1]) < 0.05) return generation;
  }
  return std::nullopt;
}

std::optional<double> pcie_speed_gts(int generation) {
  static constexpr double kSpeeds[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  if (generation < 1 || generation > 6) return std::nullopt;
  return kSpeeds[generation - 1];
}

std::optional<double> pcie_bandwidth_gbps(int generation, int width) {
  auto speed = pcie_speed_gts(generation);
  if (!speed || width < 1 || width > 32) return std::nullopt;
  double encoding = generation <= 2 ? 8.0 / 10.0 : generation <= 5 ? 128.0 / 130.0 : 242.0 / 256.0;
  // GT/s per lane × lanes × encoding efficiency gives Gbit/s of data; / 8 for GB/s.
  return *speed * width * encoding / 8.0;
}

bool is_pci_bdf(std::string_view name) {
  // dddd:bb:dd.f with hexadecimal digits.
  if (name.size() != 12) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (i == 4 || i == 7) {
      if (c != ':') return false;
    } else if (i == 10) {
      if (c != '.') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

namespace {

std::optional<std::string> read_first_line(const fs::path& path) {
  auto text = detail::read_text(path, 4096);
  if (!text) return std::nullopt;
  return text->substr(0, text->find('\n'));
}

std::optional<int> parse_width(std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value < 1 || value > 32) return std::nullopt;
  return value;
}

// Resolves a link inside a recorded tree: absolute targets are taken relative to `root`.
fs::path resolve_under_root(const fs::path& root, const fs::path& link) {
  std::error_code error;
  fs::path target = fs::read_symlink(link, error);
  if (error) return fs::weakly_canonical(link, error);
  if (target.is_absolute()) return root / target.relative_path();
  return fs::weakly_canonical(link.parent_path() / target, error);
}

}  // namespace

LinkHop read_link_hop(const std::string& device_dir, std::string bdf) {
  LinkHop hop;
  hop.bdf = std::move(bdf);
  hop.sysfs_path = device_dir;
  fs::path dir(device_dir);
  auto speed = [&](const char* name, std::optional<double>& out) {
    auto text = read_first_line(dir / name);
    if (!text) return;  // absent on devices without a PCIe capability: not a problem
    out = parse_link_speed_gts(*text);
    if (!out && text->find("Unknown") == std::string::npos) {
      hop.problems.push_back(fmt::format("{}/{}: malformed speed '{}'", device_dir, name, *text));
    }
  };
  auto width = [&](const char* name, std::optional<int>& out) {
    auto text = read_first_line(dir / name);
    if (!text) return;
    out = parse_width(*text);
    // Width 0 means the link is down or the attribute is not meaningful for this function.
    if (!out && *text != "0") {
      hop.problems.push_back(fmt::format("{}/{}: malformed width '{}'", device_dir, name, *text));
    }
  };
  speed("current_link_speed", hop.link.current_speed_gts);
  speed("max_link_speed", hop.link.max_speed_gts);
  width("current_link_width", hop.link.current_width);
  width("max_link_width", hop.link.max_width);
  return hop;
}

StatusOr<std::vector<LinkHop>> read_link_path(const std::string& root, const std::string& bdf) {
  if (!is_pci_bdf(bdf)) return invalid_argument(fmt::format("'{}' is not a PCI address", bdf));
  fs::path root_path(root.empty() ? "/" : root);
  fs::path link = root_path / "sys/bus/pci/devices" / bdf;
  std::error_code error;
  if (!fs::exists(fs::symlink_status(link, error))) {
    return not_found(fmt::format("{} does not exist", link.string()));
  }
  fs::path device = resolve_under_root(root_path, link);
  std::vector<LinkHop> path;
  // Walk up the /sys/devices/pciDDDD:BB/... hierarchy while the directory names are PCI addresses.
  for (fs::path current = device; is_pci_bdf(current.filename().string());
       current = current.parent_path()) {
    path.push_back(read_link_hop(current.string(), current.filename().string()));
    if (path.size() > 32) return data_loss(fmt::format("PCI path above {} is too deep", bdf));
  }
  if (path.empty()) {
    return data_loss(fmt::format("{} resolves to {}, which is not a PCI device directory",
                                 link.string(), device.string()));
  }
  return path;
}

LinkState effective_link(const std::vector<LinkHop>& path) {
  LinkState effective;
  auto take_min = [](auto& target, const auto& value) {
    if (!value) return;
    target = target ? std::min(*target, *value) : *value;
  };
  for (const auto& hop : path) {
    take_min(effective.current_speed_gts, hop.link.current_speed_gts);
    take_min(effective.max_speed_gts, hop.link.max_speed_gts);
    take_min(effective.current_width, hop.link.current_width);
    take_min(effective.max_width, hop.link.max_width);
  }
  return effective;
}

}  // namespace gpuopt::platform
