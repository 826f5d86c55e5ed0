// Internal to platform: bounded reads of small sysfs/procfs text files and whitespace trimming,
// shared by the device scan and the system-wide readers.
#pragma once

#include <cctype>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

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

// At most `limit` bytes of a file; nullopt when it cannot be opened or read.
inline std::optional<std::string> read_text(const std::filesystem::path& path,
                                            std::size_t limit = 16 * 1024) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(limit, '\0');
  in.read(text.data(), static_cast<std::streamsize>(limit));
  if (in.bad()) return std::nullopt;
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

}  // namespace gpuopt::platform::detail
