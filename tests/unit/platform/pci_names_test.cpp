// PCI names come from pci.ids, never from udev's hwdb: the expected names are read from the same
// pci.ids file here, so the test holds whatever version the machine has. Under ASan (CI) it also
// checks that a lookup leaks nothing on a machine without hwdb.bin.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gpuopt/platform/pci_devices.hpp"

namespace gpuopt::platform {
namespace {

std::optional<std::string> find_pci_ids() {
  for (const char* path :
       {"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids"}) {
    if (std::filesystem::is_regular_file(path)) return std::string(path);
  }
  return std::nullopt;
}

// The vendor line "10de  NVIDIA Corporation" and the device line "\t2335  GH100 [...]".
struct ExpectedNames {
  std::string vendor, device;
};
ExpectedNames read_names(const std::string& path, const std::string& vendor_hex,
                         const std::string& device_hex) {
  ExpectedNames names;
  std::ifstream in(path);
  std::string line;
  bool in_vendor = false;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] != '\t') {
      in_vendor = line.rfind(vendor_hex + "  ", 0) == 0;
      if (in_vendor) names.vendor = line.substr(vendor_hex.size() + 2);
      continue;
    }
    if (in_vendor && line.size() > 1 && line[1] != '\t' &&
        line.rfind("\t" + device_hex + "  ", 0) == 0) {
      names.device = line.substr(device_hex.size() + 3);
      return names;
    }
  }
  return names;
}

TEST(PciNames, VendorAndDeviceComeFromPciIds) {
  auto path = find_pci_ids();
  if (!path) GTEST_SKIP() << "no pci.ids on this machine (Debian package pci.ids)";
  ExpectedNames expected = read_names(*path, "10de", "2330");
  if (expected.vendor.empty() || expected.device.empty()) {
    GTEST_SKIP() << *path << " has no entry for 10de:2330";
  }
  PciNames names = lookup_pci_names(0x10de, 0x2330, 0x030200);
  EXPECT_EQ(names.vendor, expected.vendor);
  EXPECT_EQ(names.device, expected.device);
  EXPECT_FALSE(names.class_name.empty());
}

TEST(PciNames, UnknownIdsGiveEmptyNames) {
  if (!find_pci_ids()) GTEST_SKIP() << "no pci.ids on this machine (Debian package pci.ids)";
  PciNames names = lookup_pci_names(0xfffe, 0xfffe, 0xff0000);
  EXPECT_TRUE(names.device.empty());
}

}  // namespace
}  // namespace gpuopt::platform
