// libFuzzer target: the sysfs/procfs text parsers (link speed, hex ids, AER counters, /proc stat,
// kernel command line, ASPM policy, NVIDIA driver version) on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "gpuopt/platform/pci_devices.hpp"
#include "gpuopt/platform/pcie_link.hpp"
#include "gpuopt/platform/processes.hpp"
#include "gpuopt/platform/system_info.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  using namespace gpuopt::platform;
  (void)parse_link_speed_gts(text);
  (void)parse_sysfs_hex(text, 0xFFFFFF);
  (void)parse_sysfs_int(text);
  std::map<std::string, std::uint64_t> details;
  (void)parse_aer_counters(text, "fuzz", details);
  (void)parse_proc_stat(text);
  (void)parse_kernel_parameters(text);
  (void)parse_bracketed_choice(text);
  (void)parse_nvidia_driver_version(text);
  (void)is_pci_bdf(text);
  return 0;
}
