// How the wgmma W4A16 kernel splits a layer between its blocks (w4a16_sm90_wgmma.cu), shared by the
// kernel and the CPU tests. Host- and device-compilable.
//
// The output is `tiles` tiles (column tile x token tiles + token tile), each `k_stages` stages of
// 64 k. Units are (tile, stage) pairs numbered tile-major: u = tile * k_stages + stage. A block
// takes the units [begin, end) and computes them as segments, one per tile it touches; a tile's
// segments add their stage counts to its counter, and the one that completes k_stages fixes the
// tile up (a segment of all k_stages stores the tile directly).
#pragma once

#if !defined(GPUOPT_HOST_DEVICE)
#if defined(__CUDACC__)
#define GPUOPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GPUOPT_HOST_DEVICE inline
#endif
#endif

namespace gpuopt::kernels::w4a16_detail {

struct WgmmaUnits {
  long long begin, end;
};

// Block `block` of `blocks`. k-splits (stream_k false; blocks = tiles x splits): block
// (column tile x splits + split) x token_tiles + token tile takes split `split` of that tile's
// stages. Stream-K: an equal share of all tiles x k_stages units.
GPUOPT_HOST_DEVICE WgmmaUnits wgmma_block_units(int block, int blocks, int tiles, int k_stages,
                                                int splits, int token_tiles, bool stream_k) {
  if (!stream_k) {
    const int token_tile = block % token_tiles;
    const int rest = block / token_tiles;
    const int split = rest % splits;
    const long long first =
        static_cast<long long>((rest / splits) * token_tiles + token_tile) * k_stages;
    return {first + static_cast<long long>(split) * k_stages / splits,
            first + static_cast<long long>(split + 1) * k_stages / splits};
  }
  const long long units = static_cast<long long>(tiles) * k_stages;
  return {block * units / blocks, (block + 1LL) * units / blocks};
}

struct WgmmaSegment {
  int tile, s0, s1;  // stages [s0, s1) of `tile`
};

// The segment that starts at unit u of a block whose units end at `end`.
GPUOPT_HOST_DEVICE WgmmaSegment wgmma_segment(long long u, long long end, int k_stages) {
  const int tile = static_cast<int>(u / k_stages);
  const int s0 = static_cast<int>(u - static_cast<long long>(tile) * k_stages);
  const long long left = end - u;
  const int s1 = left < k_stages - s0 ? s0 + static_cast<int>(left) : k_stages;
  return {tile, s0, s1};
}

// Where a k-split block's piece of its tile sits, for the shared fix-up (each piece stores its
// partial into its own workspace slice, then every piece waits for the others and converts a share
// of the tile): slot = the split, one of `pieces` = splits, and its share is slot of `pieces`.
// 32-bit arithmetic only: in the kernel a 64-bit division is a subroutine call, and the epilogue's
// code weighs on the main loop's register allocation (w4a16_sm90_wgmma.cu, kScatter).
struct WgmmaPieces {
  int slot, pieces;
};

GPUOPT_HOST_DEVICE WgmmaPieces wgmma_split_pieces(int block, int splits, int token_tiles) {
  return {(block / token_tiles) % splits, splits};
}

// A tile of `quads` quads cut into `pieces` shares: share `slot` is [begin, end).
struct WgmmaShare {
  int begin, end;
};

GPUOPT_HOST_DEVICE WgmmaShare wgmma_share(int quads, int slot, int pieces) {
  return {quads * slot / pieces, quads * (slot + 1) / pieces};
}

}  // namespace gpuopt::kernels::w4a16_detail
