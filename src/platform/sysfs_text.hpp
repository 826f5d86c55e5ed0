// Internal to platform: bounded reads of small sysfs/procfs text files and whitespace trimming,
// shared by the device scan and the system-wide readers.
#pragma once

#include <cctype>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "gpuopt/core/regular_file.hpp"

namespace gpuopt::platform::detail {

inline std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

// At most `limit` bytes of a file; nullopt when it cannot be opened or read, or is not a regular
// file (a FIFO or device under a recorded --root must not block the scan).
inline std::optional<std::string> read_text(const std::filesystem::path& path,
                                            std::size_t limit = 16 * 1024) {
  auto text = read_regular_file(path, limit);
  if (!text.ok()) return std::nullopt;
  return std::move(text).value();
}

}  // namespace gpuopt::platform::detail
