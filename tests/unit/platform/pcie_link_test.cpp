// PCIe link parsing, theoretical rates, and the path walk over a recorded sysfs tree.
#include "gpuopt/platform/pcie_link.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gpuopt::platform {
namespace {

namespace fs = std::filesystem;

TEST(PcieLink, ParsesSysfsSpeedText) {
  EXPECT_DOUBLE_EQ(*parse_link_speed_gts("16.0 GT/s PCIe"), 16.0);
  EXPECT_DOUBLE_EQ(*parse_link_speed_gts("2.5 GT/s"), 2.5);
  EXPECT_DOUBLE_EQ(*parse_link_speed_gts("32.0 GT/s PCIe\n"), 32.0);
  EXPECT_FALSE(parse_link_speed_gts("Unknown").has_value());
  EXPECT_FALSE(parse_link_speed_gts("16.0 Gb/s").has_value());
  EXPECT_FALSE(parse_link_speed_gts("").has_value());
  EXPECT_FALSE(parse_link_speed_gts("-8 GT/s").has_value());
}

TEST(PcieLink, GenerationsAndHandComputedRates) {
  EXPECT_EQ(*pcie_generation(16.0), 4);
  EXPECT_EQ(*pcie_generation(2.5), 1);
  EXPECT_FALSE(pcie_generation(10.0).has_value());
  // Gen5 x16: 32 GT/s × 16 × 128/130 / 8 = 63.015 GB/s per direction.
  EXPECT_NEAR(*pcie_bandwidth_gbps(5, 16), 63.0154, 1e-3);
  // Gen4 x8 (RTX 4060 Laptop): 16 × 8 × 128/130 / 8 = 15.754 GB/s.
  EXPECT_NEAR(*pcie_bandwidth_gbps(4, 8), 15.7538, 1e-3);
  // Gen2 x1: 5 × 1 × 0.8 / 8 = 0.5 GB/s.
  EXPECT_DOUBLE_EQ(*pcie_bandwidth_gbps(2, 1), 0.5);
  EXPECT_FALSE(pcie_bandwidth_gbps(7, 16).has_value());
  EXPECT_FALSE(pcie_bandwidth_gbps(4, 0).has_value());
}

TEST(PcieLink, BdfShape) {
  EXPECT_TRUE(is_pci_bdf("0000:01:00.0"));
  EXPECT_TRUE(is_pci_bdf("0000:c1:1f.7"));
  EXPECT_FALSE(is_pci_bdf("pci0000:00"));
  EXPECT_FALSE(is_pci_bdf("0000:01:00"));
}

class LinkTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fs::path("gpuopt_link_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::path port = root_ / "sys/devices/pci0000:00/0000:00:01.0";
    fs::path gpu = port / "0000:01:00.0";
    fs::create_directories(gpu);
    fs::create_directories(root_ / "sys/bus/pci/devices");
    write(port / "current_link_speed", "16.0 GT/s PCIe");
    write(port / "max_link_speed", "16.0 GT/s PCIe");
    write(port / "current_link_width", "8");
    write(port / "max_link_width", "8");
    write(gpu / "current_link_speed", "16.0 GT/s PCIe");
    write(gpu / "max_link_speed", "32.0 GT/s PCIe");
    write(gpu / "current_link_width", "16");
    write(gpu / "max_link_width", "16");
    // Absolute link as the kernel writes it; resolved under the recorded root.
    fs::create_symlink("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                       root_ / "sys/bus/pci/devices/0000:01:00.0");
    fs::create_symlink("../../../devices/pci0000:00/0000:00:01.0",
                       root_ / "sys/bus/pci/devices/0000:00:01.0");
  }
  void TearDown() override { fs::remove_all(root_); }
  static void write(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text << "\n";
  }
  fs::path root_;
};

TEST_F(LinkTree, EffectiveLinkIsTheMinimumAlongThePath) {
  auto path = read_link_path(root_.string(), "0000:01:00.0");
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  ASSERT_EQ(path->size(), 2u);
  EXPECT_EQ((*path)[0].bdf, "0000:01:00.0");
  EXPECT_EQ((*path)[1].bdf, "0000:00:01.0");
  LinkState effective = effective_link(*path);
  EXPECT_DOUBLE_EQ(*effective.current_speed_gts, 16.0);
  EXPECT_EQ(*effective.current_width, 8);  // the slot (root port) is x8
  EXPECT_EQ(*effective.max_width, 8);
  EXPECT_DOUBLE_EQ(*effective.max_speed_gts, 16.0);
}

TEST_F(LinkTree, RelativeLinksResolveToo) {
  auto path = read_link_path(root_.string(), "0000:00:01.0");
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  ASSERT_EQ(path->size(), 1u);
  EXPECT_EQ(*(*path)[0].link.current_width, 8);
}

TEST_F(LinkTree, MalformedAttributeIsNamedAndTheRestIsRead) {
  write(root_ / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/current_link_width", "x16?");
  auto path = read_link_path(root_.string(), "0000:01:00.0");
  ASSERT_TRUE(path.ok());
  const LinkHop& gpu = (*path)[0];
  EXPECT_FALSE(gpu.link.current_width.has_value());
  EXPECT_TRUE(gpu.link.max_width.has_value());
  ASSERT_EQ(gpu.problems.size(), 1u);
  EXPECT_NE(gpu.problems[0].find("current_link_width"), std::string::npos);
}

TEST_F(LinkTree, MissingDeviceAndBadAddress) {
  EXPECT_EQ(read_link_path(root_.string(), "0000:02:00.0").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(read_link_path(root_.string(), "../../etc").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::platform
