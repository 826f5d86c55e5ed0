// Config-space parser: capabilities read from hand-built bytes, and malformed spaces (loops,
// truncation, pointers into the header) reported instead of crashing or looping.
#include "gpuopt/platform/pci_config.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gpuopt/platform/pci_devices.hpp"
#include "gpuopt/platform/processes.hpp"
#include "gpuopt/platform/system_info.hpp"

namespace gpuopt::platform {
namespace {

void put16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t v) {
  b[at] = v & 0xFF;
  b[at + 1] = v >> 8;
}
void put32(std::vector<std::uint8_t>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = (v >> (8 * i)) & 0xFF;
}

// An endpoint with a PCIe capability at 0x40 (Gen4 x8 max, Gen1 x8 now, L1 on) and extended
// capabilities: AER at 0x100 → ATS (enabled) at 0x140 → ACS (RR|CR) at 0x180 → ReBAR at 0x1c0.
std::vector<std::uint8_t> endpoint() {
  std::vector<std::uint8_t> b(4096, 0);
  put16(b, 0, 0x10de);
  put16(b, 2, 0x28e0);
  put16(b, 0x06, 0x10);
  b[0x34] = 0x40;
  b[0x40] = 0x10;
  put16(b, 0x42, 0x0002);
  put32(b, 0x4C, 4 | (8 << 4));
  put16(b, 0x50, 0x2);
  put16(b, 0x52, 1 | (8 << 4));
  put32(b, 0x100, 0x0001 | (1 << 16) | (0x140u << 20));
  put32(b, 0x140, 0x000F | (1 << 16) | (0x180u << 20));
  put16(b, 0x146, 0x8000);
  put32(b, 0x180, 0x000D | (1 << 16) | (0x1c0u << 20));
  put16(b, 0x184, 0x5f);
  put16(b, 0x186, 0x0c);
  put32(b, 0x1c0, 0x0015 | (1 << 16));
  put32(b, 0x1c4, (1u << 4) | (1u << 12));   // 1 MiB and 256 MiB
  put32(b, 0x1c8, 1 | (1 << 5) | (8 << 8));  // BAR1, one entry, 256 MiB now
  return b;
}

TEST(PciConfig, ReadsEveryCapability) {
  auto bytes = endpoint();
  PciConfig config = parse_pci_config(bytes);
  EXPECT_TRUE(config.problems.empty());
  EXPECT_EQ(config.vendor_id, 0x10de);
  EXPECT_TRUE(config.pcie_present);
  EXPECT_EQ(config.port_type, 0);
  EXPECT_EQ(config.link_max_speed_code, 4);
  EXPECT_EQ(config.link_max_width, 8);
  EXPECT_EQ(config.link_current_speed_code, 1);
  EXPECT_EQ(config.aspm_control, 2);
  EXPECT_EQ(aspm_control_name(*config.aspm_control), "L1");
  EXPECT_TRUE(config.aer_present);
  EXPECT_TRUE(config.ats_present);
  EXPECT_EQ(config.ats_enabled, true);
  EXPECT_TRUE(config.acs_p2p_request_redirect());
  EXPECT_TRUE(config.acs_p2p_completion_redirect());
  ASSERT_EQ(config.resizable_bars.size(), 1u);
  EXPECT_EQ(config.resizable_bars[0].bar_index, 1);
  EXPECT_EQ(config.resizable_bars[0].current_bytes, std::uint64_t{256} << 20);
  EXPECT_EQ(config.resizable_bars[0].supported_bytes,
            (std::vector<std::uint64_t>{std::uint64_t{1} << 20, std::uint64_t{256} << 20}));
}

TEST(PciConfig, UnprivilegedSixtyFourBytesSayWhatIsHidden) {
  auto bytes = endpoint();
  bytes.resize(64);
  PciConfig config = parse_pci_config(bytes);
  EXPECT_TRUE(config.problems.empty());
  EXPECT_FALSE(config.standard_capabilities_readable);
  EXPECT_FALSE(config.extended_capabilities_readable);
  EXPECT_FALSE(config.pcie_present);
  EXPECT_FALSE(config.ats_present);
}

TEST(PciConfig, LoopsAndBadPointersAreProblemsNotHangs) {
  auto bytes = endpoint();
  bytes[0x41] = 0x40;                                        // the standard list points at itself
  put32(bytes, 0x180, 0x000D | (1 << 16) | (0x100u << 20));  // extended list loops back
  PciConfig config = parse_pci_config(bytes);
  ASSERT_EQ(config.problems.size(), 2u);
  EXPECT_NE(config.problems[0].find("loops"), std::string::npos);
  EXPECT_NE(config.problems[1].find("loops"), std::string::npos);

  auto header = endpoint();
  header[0x34] = 0x10;  // into the header
  EXPECT_EQ(parse_pci_config(header).problems.size(), 1u);

  auto cut = endpoint();
  cut.resize(0x150);  // extended list cut inside the ATS entry's successor
  PciConfig truncated = parse_pci_config(cut);
  EXPECT_TRUE(truncated.ats_present);
  EXPECT_FALSE(truncated.problems.empty());
}

TEST(PciConfig, RandomBytesNeverCrash) {
  std::mt19937 random(12345);
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::uint8_t> bytes(random() % 4200);
    for (auto& byte : bytes) byte = random() & 0xFF;
    if (bytes.size() > 0x34) bytes[0x34] |= 0x40;
    if (bytes.size() > 6) bytes[6] |= 0x10;
    PciConfig config = parse_pci_config(bytes);
    EXPECT_EQ(config.length, bytes.size());
  }
}

TEST(SysfsText, HexIntAndAer) {
  EXPECT_EQ(parse_sysfs_hex("0x10de\n", 0xFFFF), 0x10deu);
  EXPECT_FALSE(parse_sysfs_hex("0x10000", 0xFFFF).has_value());
  EXPECT_FALSE(parse_sysfs_hex("zz", 0xFFFF).has_value());
  EXPECT_EQ(parse_sysfs_int("-1\n"), std::nullopt);
  EXPECT_EQ(parse_sysfs_int("3\n"), 3);
  std::map<std::string, std::uint64_t> details;
  EXPECT_EQ(parse_aer_counters("RxErr 35\nBadTLP 2\nTOTAL_ERR_COR 37\n", "correctable", details),
            37u);
  EXPECT_EQ(details.at("correctable.RxErr"), 35u);
  EXPECT_EQ(parse_aer_counters("RxErr 1\nBadTLP 2\n", "c", details), 3u);  // no TOTAL line
  EXPECT_FALSE(parse_aer_counters("garbage", "c", details).has_value());
}

TEST(SysfsText, ProcStatCmdlineAndDriverVersion) {
  auto stat = parse_proc_stat("4242 (py thon) x) Z 4100 4100 4100 0 -1");
  ASSERT_TRUE(stat.has_value());
  EXPECT_EQ(stat->comm, "py thon) x");
  EXPECT_EQ(stat->state, 'Z');
  EXPECT_EQ(stat->ppid, 4100);
  EXPECT_FALSE(parse_proc_stat("4242 python Z").has_value());
  // Found by fuzz_sysfs_text: a newline right after ')' once looped forever.
  auto newline = parse_proc_stat("1 (a)\nZ 2 3 4");
  ASSERT_TRUE(newline.has_value());
  EXPECT_EQ(newline->ppid, 2);
  auto parameters =
      parse_kernel_parameters("ro quiet intel_iommu=on iommu=pt pcie_aspm=off -- iommu=x");
  EXPECT_EQ(parameters.size(), 3u);
  EXPECT_EQ(parameters.at("iommu"), "pt");
  EXPECT_EQ(parameters.at("pcie_aspm"), "off");
  EXPECT_EQ(parse_bracketed_choice("default [powersave] x"), "powersave");
  EXPECT_FALSE(parse_bracketed_choice("default").has_value());
  EXPECT_EQ(parse_nvidia_driver_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 2025\n"),
            "580.65.06");
  EXPECT_EQ(
      parse_nvidia_driver_version(
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build"),
      "580.65.06");
}

}  // namespace
}  // namespace gpuopt::platform
