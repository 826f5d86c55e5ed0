// "Did you mean": distances worked out by hand, and which typos earn a suggestion.
#include "gpuopt/core/suggest.hpp"

#include <gtest/gtest.h>

namespace gpuopt {
namespace {

TEST(EditDistance, HandWorkedPairs) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("audit", "audit"), 0u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);  // k->s, e->i, +g
  EXPECT_EQ(edit_distance("adiut", "audit"), 2u);     // two neighbour swaps
  EXPECT_EQ(edit_distance("doctr", "doctor"), 1u);
  EXPECT_EQ(edit_distance("pcei", "pcie"), 1u);  // one swap
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);     // no substring edited twice
}

TEST(ClosestMatch, SuggestsTyposOnly) {
  const std::vector<std::string> commands = {"doctor",   "trace", "vector",
                                             "pipeline", "audit", "bench"};
  EXPECT_EQ(closest_match("doctr", commands), "doctor");
  EXPECT_EQ(closest_match("audti", commands), "audit");
  EXPECT_EQ(closest_match("pipline", commands), "pipeline");
  EXPECT_EQ(closest_match("pipe", commands), "pipeline");  // a unique prefix
  EXPECT_FALSE(closest_match("compile", commands).has_value());
  EXPECT_FALSE(closest_match("", commands).has_value());
  const std::vector<std::string> benches = {"pcie", "streams", "loader", "scaler", "gemm"};
  EXPECT_EQ(closest_match("stream", benches), "streams");
  EXPECT_EQ(closest_match("gemn", benches), "gemm");
  EXPECT_FALSE(closest_match("xyz", benches).has_value());
}

}  // namespace
}  // namespace gpuopt
