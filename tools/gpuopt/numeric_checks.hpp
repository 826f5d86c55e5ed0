// CLI11 checks for whole-number flags (counts, sizes, ids) with messages a person can act on: CLI11
// adds the flag's name, so "--k: -1 is below the minimum 1".
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace gpuopt::cli {

inline CLI::Validator whole_number_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        long long value = 0;
        const char* end = text.data() + text.size();
        auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc::result_out_of_range) return fmt::format("{} is too large", text);
        if (error != std::errc() || stop != end || text.empty()) {
          return fmt::format("'{}' is not a whole number", text);
        }
        if (value < minimum) return fmt::format("{} is below the minimum {}", text, minimum);
        return {};
      },
      fmt::format("INT>={}", minimum));
}

// Real-valued flags (periods, durations): a finite number in [minimum, maximum], so that "nan",
// "inf" and 1e-300 (a busy loop) are refused by name.
inline CLI::Validator finite_number_in(double minimum, double maximum) {
  return CLI::Validator(
      [minimum, maximum](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || stop != end || text.empty() || !std::isfinite(value)) {
          return fmt::format("'{}' is not a finite number", text);
        }
        if (value < minimum || value > maximum) {
          return fmt::format("{} is outside [{}, {}]", text, minimum, maximum);
        }
        return {};
      },
      fmt::format("NUMBER in [{}, {}]", minimum, maximum));
}

}  // namespace gpuopt::cli
