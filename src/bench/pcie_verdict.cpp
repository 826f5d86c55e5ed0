// PCIe bench arithmetic that needs no GPU: bandwidth, efficiency, verdicts with explanations, the
// exit code, and the CPU twin of the data pattern the fill/verify kernels use.
#include <fmt/format.h>

#include <cstring>

#include "gpuopt/bench/pcie.hpp"

namespace gpuopt::bench::pcie {

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHealthy:
      return "healthy";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
    case Verdict::kUnknown:
      return "unknown";
  }
  return "unknown";
}

double bandwidth_gbps(double bytes, double milliseconds) {
  if (!(milliseconds > 0)) return 0;
  return bytes / (milliseconds * 1e-3) / 1e9;
}

std::optional<double> link_efficiency(double measured_gbps,
                                      std::optional<double> theoretical_gbps) {
  if (!theoretical_gbps || !(*theoretical_gbps > 0) || measured_gbps < 0) return std::nullopt;
  return measured_gbps / *theoretical_gbps;
}

Verdict verdict_for(std::optional<double> efficiency) {
  if (!efficiency || *efficiency > kImplausibleEfficiency) return Verdict::kUnknown;
  if (*efficiency >= kHealthyEfficiency) return Verdict::kHealthy;
  if (*efficiency >= kFailEfficiency) return Verdict::kWarn;
  return Verdict::kFail;
}

nlohmann::json to_json(const LinkInfo& link) {
  auto optional = [](const auto& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  return {{"bus_id", link.bus_id},
          {"generation", optional(link.generation)},
          {"width", optional(link.width)},
          {"current_speed_gts", optional(link.current_speed_gts)},
          {"current_width", optional(link.current_width)},
          {"theoretical_gbps", optional(link.theoretical_gbps)},
          {"notes", link.notes}};
}

DirectionVerdict judge_direction(const DirectionFigures& figures, const LinkInfo& link) {
  DirectionVerdict out;
  out.direction = figures.direction;
  if (!figures.pinned_local_gbps) {
    out.explanations.push_back("no pinned figure was measured for this direction");
    return out;
  }
  const double pinned = *figures.pinned_local_gbps;
  out.efficiency = link_efficiency(pinned, link.theoretical_gbps);
  out.verdict = verdict_for(out.efficiency);
  const std::string size = format_bytes(figures.bytes);
  if (!link.theoretical_gbps) {
    out.explanations.push_back("the link's generation or width is unknown, so no efficiency");
  } else if (out.efficiency && *out.efficiency > kImplausibleEfficiency) {
    out.explanations.push_back(fmt::format(
        "{:.1f} GB/s is {:.0f}% of the reported Gen{} x{} link ({:.1f} GB/s): the reported link "
        "is not the one carrying the data (virtual bridge?)",
        pinned, *out.efficiency * 100, link.generation.value_or(0), link.width.value_or(0),
        *link.theoretical_gbps));
  } else if (out.efficiency) {
    out.explanations.push_back(fmt::format(
        "pinned {} copies reach {:.1f} GB/s, {:.1f}% of Gen{} x{} ({:.2f} GB/s per direction)",
        size, pinned, *out.efficiency * 100, link.generation.value_or(0), link.width.value_or(0),
        *link.theoretical_gbps));
  }
  if (out.verdict == Verdict::kWarn || out.verdict == Verdict::kFail) {
    // A link that trained narrower or slower than it can is the usual hardware cause.
    if (link.current_width && link.width && *link.current_width < *link.width) {
      out.explanations.push_back(
          fmt::format("the link runs at x{} of its x{} lanes (reseat or check "
                      "the slot/riser)",
                      *link.current_width, *link.width));
    }
  }
  if (figures.pageable_gbps && pinned > 0) {
    double ratio = *figures.pageable_gbps / pinned;
    if (ratio < 0.9) {
      out.explanations.push_back(fmt::format(
          "pageable memory reaches {:.1f} GB/s, {:.0f}% of pinned: copies from plain malloc/new "
          "memory are staged through a driver buffer; pin it (cudaHostRegister / "
          "pin_memory=True) to get the link's rate",
          *figures.pageable_gbps, ratio * 100));
    } else {
      out.explanations.push_back(fmt::format("pageable memory reaches {:.1f} GB/s, close to pinned",
                                             *figures.pageable_gbps));
    }
  }
  if (figures.pinned_remote_gbps && pinned > 0) {
    double ratio = *figures.pinned_remote_gbps / pinned;
    std::string node = figures.remote_node ? fmt::format("node {}", *figures.remote_node)
                                           : std::string("a remote node");
    if (ratio < 0.9) {
      out.explanations.push_back(fmt::format(
          "pinned memory on NUMA {} reaches {:.1f} GB/s, {:.0f}% of the GPU's own node: allocate "
          "host buffers on the GPU's node (numactl --membind / hwloc)",
          node, *figures.pinned_remote_gbps, ratio * 100));
    } else {
      out.explanations.push_back(
          fmt::format("pinned memory on NUMA {} reaches {:.1f} GB/s, close to the GPU's own node",
                      node, *figures.pinned_remote_gbps));
    }
  }
  return out;
}

nlohmann::json to_json(const DirectionVerdict& verdict) {
  return {{"direction", verdict.direction},
          {"verdict", verdict_name(verdict.verdict)},
          {"efficiency",
           verdict.efficiency ? nlohmann::json(*verdict.efficiency) : nlohmann::json(nullptr)},
          {"explanations", verdict.explanations}};
}

int exit_code_for(const std::vector<TestcaseResult>& results) {
  int code = 0;
  for (const auto& result : results) {
    if (result.outcome == Outcome::kFailed) code = std::max(code, 2);
    if (!result.data.is_object() || !result.data.contains("verdicts")) continue;
    for (const auto& verdict : result.data["verdicts"]) {
      const std::string name = verdict.value("verdict", "unknown");
      if (name == "fail") code = std::max(code, 2);
      if (name == "warn") code = std::max(code, 1);
    }
  }
  return code;
}

std::uint64_t pattern_word(std::uint64_t word_index, std::uint64_t seed) {
  std::uint64_t z = word_index + seed * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_pattern_reference(void* data, std::size_t bytes, std::uint64_t seed) {
  auto* out = static_cast<unsigned char*>(data);
  const std::size_t words = bytes / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t word = pattern_word(i, seed);
    std::memcpy(out + i * 8, &word, 8);
  }
  if (std::size_t tail = bytes % 8; tail != 0) {
    std::uint64_t word = pattern_word(words, seed);
    std::memcpy(out + words * 8, &word, tail);  // little-endian: the low bytes
  }
}

std::size_t count_mismatches_reference(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* in = static_cast<const unsigned char*>(data);
  std::size_t mismatches = 0;
  const std::size_t words = bytes / 8;
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t expected = pattern_word(i, seed);
    std::uint64_t actual = 0;
    std::memcpy(&actual, in + i * 8, 8);
    if (actual != expected) {
      for (int b = 0; b < 8; ++b) {
        mismatches += ((actual >> (8 * b)) & 0xff) != ((expected >> (8 * b)) & 0xff);
      }
    }
  }
  if (std::size_t tail = bytes % 8; tail != 0) {
    std::uint64_t expected = pattern_word(words, seed);
    for (std::size_t b = 0; b < tail; ++b) {
      mismatches += in[words * 8 + b] != ((expected >> (8 * b)) & 0xff);
    }
  }
  return mismatches;
}

std::vector<std::size_t> default_sizes(bool quick) {
  if (quick) return {1ull << 20, 256ull << 20};
  return {4ull << 10, 64ull << 10, 1ull << 20, 16ull << 20, 256ull << 20, 1ull << 30};
}

}  // namespace gpuopt::bench::pcie
