// The checks every gpuopt file header shares (segments, the saved IVF index): an 8-byte magic, a
// version, and last the CRC32C of every byte before `header_crc`.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "segment.hpp"

namespace gpuopt::vector::detail {

// What is wrong with `header` as a `kind` file of `version` ("" when nothing): the magic first,
// then the checksum, then the version, so a foreign or damaged file is never read as a newer one.
template <class Header>
std::string header_problem(const Header& header, const char (&magic)[8], std::uint32_t version,
                           const char* kind) {
  static_assert(sizeof(header.magic) == 8, "gpuopt file headers open with an 8-byte magic");
  if (std::memcmp(header.magic, magic, sizeof(header.magic)) != 0) {
    return fmt::format("not a gpuopt {} (bad magic)", kind);
  }
  if (crc32c(0, &header, offsetof(Header, header_crc)) != header.header_crc) {
    return fmt::format("{} header checksum mismatch", kind);
  }
  if (header.version != version) {
    return fmt::format("{} version {} (this build reads version {})", kind, header.version,
                       version);
  }
  return {};
}

}  // namespace gpuopt::vector::detail
