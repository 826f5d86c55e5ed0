// libFuzzer target: any byte string as a PCI config space must parse without a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <span>

#include "gpuopt/platform/pci_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto config = gpuopt::platform::parse_pci_config(std::span<const std::uint8_t>(data, size));
  if (config.length != size) __builtin_trap();
  return 0;
}
