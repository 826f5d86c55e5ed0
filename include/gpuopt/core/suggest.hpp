// "Did you mean": the closest of a few known names to a word a user mistyped.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuopt {

// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `word`, if it is near enough to be a typo: at most 1 edit for words up
// to 4 characters, 2 up to 8, 3 beyond; a prefix of one candidate alone also counts. Ties go to
// the earlier candidate.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

}  // namespace gpuopt
