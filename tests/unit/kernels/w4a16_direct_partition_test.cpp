// The direct W4A16 kernel's split of a layer between warps (w4a16_direct_partition.hpp): every
// (strip, unit) pair is taken by exactly one warp, and the pieces a strip's warps add up to its
// units (the completion count the kernel's fix-up waits for), for even and uneven k-slices, more
// warps than pairs, and the H200 shapes the planner picks.
#include "kernels/w4a16_direct_partition.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpuopt::kernels::w4a16_detail {
namespace {

struct Layout {
  int strips, units_per_strip, slices, slice_blocks, warps_per_block;
};

std::string name(const Layout& l) {
  return std::to_string(l.strips) + " strips x " + std::to_string(l.units_per_strip) + " units, " +
         std::to_string(l.slices) + " slices x " + std::to_string(l.slice_blocks) + " blocks x " +
         std::to_string(l.warps_per_block) + " warps";
}

// Walks every warp's range the way the kernel does (strip-major within its slice, a new piece
// where a strip ends) and checks the coverage and the per-strip piece sums.
void check_layout(const Layout& l) {
  SCOPED_TRACE(name(l));
  std::vector<int> taken(static_cast<std::size_t>(l.strips) * l.units_per_strip, 0);
  std::vector<int> counted(l.strips, 0);
  const long long warps = static_cast<long long>(l.slice_blocks) * l.warps_per_block;
  for (int slice = 0; slice < l.slices; ++slice) {
    const int first = direct_slice_first(slice, l.slices, l.units_per_strip);
    const int units = direct_slice_first(slice + 1, l.slices, l.units_per_strip) - first;
    ASSERT_GE(units, 1);
    const long long total = static_cast<long long>(l.strips) * units;
    int previous_end = 0;
    for (long long w = 0; w < warps; ++w) {
      const int begin = direct_warp_first(w, warps, total);
      const int end = direct_warp_first(w + 1, warps, total);
      ASSERT_EQ(begin, previous_end)
          << "warp " << w << " does not start where warp " << w - 1 << " ended";
      previous_end = end;
      int strip = -1, piece = 0;
      for (int v = begin; v < end; ++v) {
        if (v / units != strip) {
          if (strip >= 0) counted[strip] += piece;
          strip = v / units;
          piece = 0;
        }
        ++taken[static_cast<std::size_t>(strip) * l.units_per_strip + first + v % units];
        ++piece;
      }
      if (strip >= 0) counted[strip] += piece;
    }
    EXPECT_EQ(previous_end, total) << "slice " << slice << " not covered to its end";
  }
  for (int strip = 0; strip < l.strips; ++strip) {
    EXPECT_EQ(counted[strip], l.units_per_strip) << "strip " << strip;
    for (int unit = 0; unit < l.units_per_strip; ++unit) {
      ASSERT_EQ(taken[static_cast<std::size_t>(strip) * l.units_per_strip + unit], 1)
          << "strip " << strip << " unit " << unit;
    }
  }
}

TEST(W4A16DirectPartition, EveryPairOnceAndEveryStripCountsItsUnits) {
  // The planner's H200 choices for the 70B and 8B shapes (8 and 16 rows).
  check_layout({448, 128, 2, 66, 16});
  check_layout({448, 128, 3, 44, 16});
  check_layout({448, 128, 3, 44, 12});
  check_layout({128, 448, 16, 8, 16});
  check_layout({128, 448, 11, 12, 12});
  check_layout({224, 64, 4, 33, 12});
  check_layout({64, 64, 32, 4, 16});
  // Uneven slices (16 units in 3: 5, 5, 6), one block per slice, one slice of all units.
  check_layout({8, 16, 3, 44, 16});
  check_layout({32, 64, 2, 1, 12});
  check_layout({32, 16, 1, 1, 16});
  // More warps than pairs (most warps get nothing), and a single strip.
  check_layout({1, 3, 3, 44, 16});
  check_layout({1, 3, 1, 132, 4});
  check_layout({21, 32, 7, 18, 12});
}

}  // namespace
}  // namespace gpuopt::kernels::w4a16_detail
