// The wgmma W4A16 kernel's split of a layer between blocks (w4a16_wgmma_partition.hpp), k-splits
// and stream-K: every (tile, stage) unit is computed by exactly one block's segment, each tile's
// segments add up to its k_stages (the count after which the kernel's fix-up runs), a segment
// stores directly only when it is the whole tile, and with stream-K no block is left without work
// when there are at least as many units as blocks.
#include "kernels/w4a16_wgmma_partition.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpuopt::kernels::w4a16_detail {
namespace {

struct Layout {
  int tiles, k_stages, splits, token_tiles, blocks;  // splits 0: stream-K over `blocks`
};

std::string name(const Layout& l) {
  return std::to_string(l.tiles) + " tiles x " + std::to_string(l.k_stages) + " stages, " +
         (l.splits == 0 ? "stream-K over " + std::to_string(l.blocks) + " blocks"
                        : std::to_string(l.splits) + " k-splits") +
         ", " + std::to_string(l.token_tiles) + " token tiles";
}

void check_layout(const Layout& l) {
  SCOPED_TRACE(name(l));
  const bool stream_k = l.splits == 0;
  const int blocks = stream_k ? l.blocks : l.tiles * l.splits;
  std::vector<int> taken(static_cast<std::size_t>(l.tiles) * l.k_stages, 0);
  std::vector<int> counted(l.tiles, 0);
  std::vector<int> stored(l.tiles, 0);
  for (int b = 0; b < blocks; ++b) {
    const WgmmaUnits units =
        wgmma_block_units(b, blocks, l.tiles, l.k_stages, l.splits, l.token_tiles, stream_k);
    ASSERT_LE(units.begin, units.end);
    if (stream_k && static_cast<long long>(l.tiles) * l.k_stages >= blocks) {
      EXPECT_LT(units.begin, units.end) << "block " << b << " has no work";
    }
    if (!stream_k) {
      // The block's tile from its index, as the k-split launch numbers them (token tiles fastest).
      const int tile = (b / l.token_tiles / l.splits) * l.token_tiles + b % l.token_tiles;
      ASSERT_EQ(units.begin / l.k_stages, tile) << "block " << b;
      ASSERT_EQ((units.end - 1) / l.k_stages, tile) << "block " << b << " leaves its tile";
    }
    for (long long u = units.begin; u < units.end;) {
      const WgmmaSegment s = wgmma_segment(u, units.end, l.k_stages);
      ASSERT_GE(s.tile, 0);
      ASSERT_LT(s.tile, l.tiles);
      ASSERT_LT(s.s0, s.s1);
      ASSERT_LE(s.s1, l.k_stages);
      for (int stage = s.s0; stage < s.s1; ++stage) {
        ++taken[static_cast<std::size_t>(s.tile) * l.k_stages + stage];
      }
      counted[s.tile] += s.s1 - s.s0;
      if (s.s0 == 0 && s.s1 == l.k_stages) ++stored[s.tile];
      u += s.s1 - s.s0;
    }
  }
  for (std::size_t i = 0; i < taken.size(); ++i) {
    ASSERT_EQ(taken[i], 1) << "tile " << i / l.k_stages << " stage " << i % l.k_stages;
  }
  for (int t = 0; t < l.tiles; ++t) {
    EXPECT_EQ(counted[t], l.k_stages) << "tile " << t;
    EXPECT_LE(stored[t], 1) << "tile " << t;
  }
}

TEST(W4A16WgmmaPartition, KSplitsCoverEveryUnitOnce) {
  for (const Layout& l :
       {Layout{112, 128, 4, 1, 0}, Layout{32, 448, 8, 1, 0}, Layout{2, 17, 3, 1, 0},
        Layout{6, 48, 7, 3, 0}, Layout{48, 16, 1, 3, 0}, Layout{5, 21, 21, 1, 0}}) {
    check_layout(l);
  }
}

TEST(W4A16WgmmaPartition, StreamKCoversEveryUnitOnce) {
  // The H200 shapes the planner runs stream-K on (132 SMs x 2 blocks), cuts that leave one-stage
  // segments, more blocks than units, token tiles, and a tile count that does not divide.
  for (const Layout& l : {Layout{112, 128, 0, 1, 264}, Layout{56, 64, 0, 1, 264},
                          Layout{2, 48, 0, 1, 96}, Layout{48, 16, 0, 3, 132},
                          Layout{3, 5, 0, 1, 20}, Layout{7, 33, 0, 1, 13}, Layout{1, 1, 0, 1, 1}}) {
    check_layout(l);
  }
}

// A block that is handed fewer units than a tile (stream-K over many blocks) touches at most two
// tiles; over fewer blocks than tiles a block spans several whole tiles, stored directly.
TEST(W4A16WgmmaPartition, StreamKSegmentsPerBlock) {
  const int tiles = 112, k_stages = 128, blocks = 264;
  for (int b = 0; b < blocks; ++b) {
    const WgmmaUnits units = wgmma_block_units(b, blocks, tiles, k_stages, 1, 1, true);
    int segments = 0;
    for (long long u = units.begin; u < units.end; ++segments) {
      u += wgmma_segment(u, units.end, k_stages).s1 - wgmma_segment(u, units.end, k_stages).s0;
    }
    EXPECT_GE(segments, 1);
    EXPECT_LE(segments, 2) << "block " << b;
  }
  const WgmmaUnits wide = wgmma_block_units(0, 2, 8, 10, 1, 1, true);  // 4 whole tiles
  int whole = 0;
  for (long long u = wide.begin; u < wide.end;) {
    const WgmmaSegment s = wgmma_segment(u, wide.end, 10);
    whole += s.s0 == 0 && s.s1 == 10 ? 1 : 0;
    u += s.s1 - s.s0;
  }
  EXPECT_EQ(whole, 4);
}

// The shared fix-up of k-splits: each block's slot is its split (so the tile's slots are
// 0..splits-1, each once), and the shares of a tile's quads cover them exactly once for any quad
// count.
TEST(W4A16WgmmaPartition, SplitPiecesAndShares) {
  for (const Layout& l : {Layout{32, 448, 8, 1, 0}, Layout{6, 48, 7, 3, 0}, Layout{2, 17, 3, 1, 0},
                          Layout{6, 21, 16, 2, 0}}) {
    SCOPED_TRACE(name(l));
    std::vector<std::vector<int>> slots(l.tiles);
    for (int b = 0; b < l.tiles * l.splits; ++b) {
      const WgmmaUnits units = wgmma_block_units(b, l.tiles * l.splits, l.tiles, l.k_stages,
                                                 l.splits, l.token_tiles, false);
      const int tile = static_cast<int>(units.begin / l.k_stages);
      const WgmmaPieces pieces = wgmma_split_pieces(b, l.splits, l.token_tiles);
      EXPECT_EQ(pieces.pieces, l.splits);
      // The split is the block's place in its tile's k-range.
      EXPECT_EQ(units.begin - static_cast<long long>(tile) * l.k_stages,
                static_cast<long long>(pieces.slot) * l.k_stages / l.splits)
          << "block " << b;
      slots[tile].push_back(pieces.slot);
    }
    for (int t = 0; t < l.tiles; ++t) {
      std::vector<int> seen(l.splits, 0);
      for (int slot : slots[t]) ++seen[slot];
      for (int s = 0; s < l.splits; ++s) EXPECT_EQ(seen[s], 1) << "tile " << t << " slot " << s;
    }
  }
  for (int quads : {1, 7, 64, 1000, 4096, 8192}) {
    for (int pieces : {1, 2, 3, 8, 16}) {
      std::vector<int> covered(quads, 0);
      for (int slot = 0; slot < pieces; ++slot) {
        const WgmmaShare share = wgmma_share(quads, slot, pieces);
        ASSERT_LE(share.begin, share.end);
        for (int q = share.begin; q < share.end; ++q) ++covered[q];
      }
      for (int q = 0; q < quads; ++q) {
        ASSERT_EQ(covered[q], 1) << quads << " quads, " << pieces << " pieces, quad " << q;
      }
    }
  }
}

}  // namespace
}  // namespace gpuopt::kernels::w4a16_detail
