// Bounds-checked, loop-safe walks of the standard and extended capability lists of a config space.
#include "gpuopt/platform/pci_config.hpp"

#include <fmt/format.h>

#include <bitset>

namespace gpuopt::platform {

namespace {

constexpr std::size_t kStandardEnd = 0x100;
constexpr std::size_t kExtendedEnd = 0x1000;
constexpr std::uint8_t kCapPciExpress = 0x10;
constexpr std::uint16_t kExtCapAer = 0x0001;
constexpr std::uint16_t kExtCapAcs = 0x000D;
constexpr std::uint16_t kExtCapAts = 0x000F;
constexpr std::uint16_t kExtCapResizableBar = 0x0015;

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  bool has(std::size_t offset, std::size_t size) const {
    return offset <= bytes_.size() && size <= bytes_.size() - offset;
  }
  std::optional<std::uint8_t> u8(std::size_t offset) const {
    if (!has(offset, 1)) return std::nullopt;
    return bytes_[offset];
  }
  std::optional<std::uint16_t> u16(std::size_t offset) const {
    if (!has(offset, 2)) return std::nullopt;
    return static_cast<std::uint16_t>(bytes_[offset] | (bytes_[offset + 1] << 8));
  }
  std::optional<std::uint32_t> u32(std::size_t offset) const {
    if (!has(offset, 4)) return std::nullopt;
    return static_cast<std::uint32_t>(bytes_[offset]) |
           (static_cast<std::uint32_t>(bytes_[offset + 1]) << 8) |
           (static_cast<std::uint32_t>(bytes_[offset + 2]) << 16) |
           (static_cast<std::uint32_t>(bytes_[offset + 3]) << 24);
  }
  std::size_t size() const { return bytes_.size(); }

 private:
  std::span<const std::uint8_t> bytes_;
};

void parse_pcie_capability(const Reader& reader, std::size_t base, PciConfig& config) {
  config.pcie_present = true;
  if (auto flags = reader.u16(base + 0x02)) config.port_type = (*flags >> 4) & 0xF;
  if (auto link_cap = reader.u32(base + 0x0C)) {
    config.link_max_speed_code = static_cast<int>(*link_cap & 0xF);
    config.link_max_width = static_cast<int>((*link_cap >> 4) & 0x3F);
  }
  if (auto link_control = reader.u16(base + 0x10)) config.aspm_control = *link_control & 0x3;
  if (auto link_status = reader.u16(base + 0x12)) {
    config.link_current_speed_code = static_cast<int>(*link_status & 0xF);
    config.link_current_width = static_cast<int>((*link_status >> 4) & 0x3F);
  }
  if (!reader.has(base + 0x12, 2)) {
    config.problems.push_back(fmt::format("PCIe capability at 0x{:x} is cut off", base));
  }
}

void walk_standard(const Reader& reader, PciConfig& config) {
  auto status = reader.u16(0x06);
  if (!status || (*status & 0x10) == 0) return;  // no capability list
  auto header_type = reader.u8(0x0E);
  if (!header_type) return;
  // CardBus bridges (type 2) keep the list pointer at 0x14; the others at 0x34.
  std::size_t pointer_offset = (*header_type & 0x7F) == 2 ? 0x14 : 0x34;
  auto first = reader.u8(pointer_offset);
  if (!first) return;
  std::bitset<kStandardEnd> visited;
  std::size_t pointer = *first & 0xFC;
  while (pointer != 0) {
    if (pointer < 0x40) {
      config.problems.push_back(
          fmt::format("capability pointer 0x{:x} points into the header", pointer));
      return;
    }
    if (!reader.has(pointer, 2)) {
      // Only the visible prefix was read (64 bytes unprivileged): not malformed, just hidden.
      config.standard_capabilities_readable = false;
      return;
    }
    if (visited[pointer]) {
      config.problems.push_back(fmt::format("capability list loops at 0x{:x}", pointer));
      return;
    }
    visited[pointer] = true;
    std::uint8_t id = *reader.u8(pointer);
    if (id == kCapPciExpress) parse_pcie_capability(reader, pointer, config);
    pointer = *reader.u8(pointer + 1) & 0xFC;
  }
}

void parse_resizable_bar(const Reader& reader, std::size_t base, PciConfig& config) {
  auto first_control = reader.u32(base + 0x08);
  if (!first_control) return;
  int count = static_cast<int>((*first_control >> 5) & 0x7);
  if (count < 1 || count > 6) {
    config.problems.push_back(
        fmt::format("Resizable BAR capability at 0x{:x} lists {} BARs", base, count));
    return;
  }
  for (int i = 0; i < count; ++i) {
    auto capability = reader.u32(base + 0x04 + 8 * i);
    auto control = reader.u32(base + 0x08 + 8 * i);
    if (!capability || !control) {
      config.problems.push_back(
          fmt::format("Resizable BAR entry {} at 0x{:x} is cut off", i, base));
      return;
    }
    ResizableBar bar;
    bar.bar_index = static_cast<int>(*control & 0x7);
    // Size code n means 2^(n + 20) bytes (1 MiB << n); capability bits 4..31 are codes 0..27.
    unsigned current_code = (*control >> 8) & 0x3F;
    if (current_code > 43) {
      config.problems.push_back(fmt::format("Resizable BAR {} has size code {}, beyond 8 EiB",
                                            bar.bar_index, current_code));
    } else {
      bar.current_bytes = std::uint64_t{1} << (20 + current_code);
    }
    for (int code = 0; code < 28; ++code) {
      if (*capability & (1u << (code + 4)))
        bar.supported_bytes.push_back(std::uint64_t{1} << (20 + code));
    }
    config.resizable_bars.push_back(std::move(bar));
  }
}

void walk_extended(const Reader& reader, PciConfig& config) {
  auto first = reader.u32(kStandardEnd);
  if (!first || *first == 0 || *first == 0xFFFFFFFF) return;
  std::bitset<kExtendedEnd / 4> visited;
  std::size_t offset = kStandardEnd;
  while (offset != 0) {
    if (offset < kStandardEnd || offset + 4 > kExtendedEnd) {
      config.problems.push_back(
          fmt::format("extended capability pointer 0x{:x} is outside 0x100..0xfff", offset));
      return;
    }
    auto header = reader.u32(offset);
    if (!header) {
      config.problems.push_back(
          fmt::format("config space ends ({} bytes) inside the extended capability list at 0x{:x}",
                      reader.size(), offset));
      return;
    }
    if (visited[offset / 4]) {
      config.problems.push_back(fmt::format("extended capability list loops at 0x{:x}", offset));
      return;
    }
    visited[offset / 4] = true;
    auto id = static_cast<std::uint16_t>(*header & 0xFFFF);
    switch (id) {
      case kExtCapAer:
        config.aer_present = true;
        break;
      case kExtCapAts:
        config.ats_present = true;
        if (auto control = reader.u16(offset + 0x06)) config.ats_enabled = (*control & 0x8000) != 0;
        break;
      case kExtCapAcs:
        config.acs_present = true;
        config.acs_capability = reader.u16(offset + 0x04);
        config.acs_control = reader.u16(offset + 0x06);
        break;
      case kExtCapResizableBar:
        parse_resizable_bar(reader, offset, config);
        break;
      default:
        break;
    }
    offset = (*header >> 20) & 0xFFC;
  }
}

}  // namespace

PciConfig parse_pci_config(std::span<const std::uint8_t> bytes) {
  PciConfig config;
  config.length = bytes.size();
  Reader reader(bytes);
  if (bytes.size() < 64) {
    config.problems.push_back(
        fmt::format("config space has {} bytes, fewer than the 64-byte header", bytes.size()));
  }
  config.vendor_id = reader.u16(0x00);
  config.device_id = reader.u16(0x02);
  config.standard_capabilities_readable = bytes.size() >= kStandardEnd;
  config.extended_capabilities_readable = bytes.size() >= kExtendedEnd;
  walk_standard(reader, config);
  // Extended capabilities exist only on PCI Express functions with the full 4 KiB visible.
  if (config.pcie_present && bytes.size() > kStandardEnd) walk_extended(reader, config);
  return config;
}

std::string aspm_control_name(int control) {
  switch (control & 0x3) {
    case 0:
      return "disabled";
    case 1:
      return "L0s";
    case 2:
      return "L1";
    default:
      return "L0s L1";
  }
}

}  // namespace gpuopt::platform
