// Typo suggestions for the CLI (suggest.hpp): optimal string alignment distance.
#include "gpuopt/core/suggest.hpp"

#include <algorithm>

namespace gpuopt {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // rows[i][j] = distance between a[0, i) and b[0, j); three rows suffice for the swap rule.
  const std::size_t n = b.size();
  std::vector<std::size_t> before(n + 1), previous(n + 1), current(n + 1);
  for (std::size_t j = 0; j <= n; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    before.swap(previous);
    previous.swap(current);
  }
  return previous[n];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates) {
  if (word.empty()) return std::nullopt;
  const std::size_t allowed = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const auto& candidate : candidates) {
    const std::size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  if (best) return best;
  // "bench stre" -> "streams": a prefix that names one candidate only.
  std::vector<std::string> prefixed;
  for (const auto& candidate : candidates) {
    if (candidate.size() > word.size() && candidate.compare(0, word.size(), word) == 0) {
      prefixed.push_back(candidate);
    }
  }
  if (prefixed.size() == 1) return prefixed.front();
  return std::nullopt;
}

}  // namespace gpuopt
