// Fused GPU exact search: fp16 tensor-core distance tiles reduced at once into per-query candidate
// lists under a provably conservative error bound, then an exact fp64 re-rank of the candidates.
//
// Why it is exact. Let a = q/|q| and b = x/|x| (real numbers) and c = a.b the true cosine. Rows and
// queries are stored as fp16(fp32(v / |v|)), so each component has |â_i - a_i| <= u|a_i| + eta
// with u = 2^-11 + 2^-20 (fp16 rounding plus the fp32 division and the fp32 norm) and
// eta = 2^-25 (half the fp16 subnormal spacing). Summing |â_i b̂_i - a_i b_i| over the D padded
// components, with sum|a_i||b_i| <= 1 and sum|a_i| <= sqrt(D) (Cauchy-Schwarz):
//   rounding error <= 2u + u^2 + 2 (1 + u) eta sqrt(D) + D eta^2.
// fp16 products are exact in fp32; the tensor core adds them with fp32 accumulation (aligned and
// possibly truncated, 2^-23 per step at worst); we allow D * 2^-22 * sum|â_i b̂_i|, twice the
// truncating worst case. The sum eps = 1.01 * (all of the above) bounds |approx - c| (about 1.0e-3
// at D = 128). Each distance is then an affine function of c with the fp32 norms:
//   L2: |q|^2 + |x|^2 - 2|q||x|c  (error <= 2|q||x| eps)   IP: -|q||x|c  (<= |q||x| eps)
//   cosine: 1 - c  (<= eps)
// and the few fp32 operations that evaluate these (norms stored as fp32 from fp64 sums) add at
// most delta = 2^-18 times the largest magnitude involved ((|q| + |x|)^2, |q||x| or 1). So for
// every row, lb = approx - e <= exact <= approx + e = ub.
//
// Selection. Any k rows' upper bounds give T = (k-th smallest ub) >= the true k-th distance, so a
// row with lb > T cannot be among the k nearest, not even tied. Each warp keeps, for each of its 32
// queries and for its CTA's share of the rows, a list of rows with lb <= T; when a list fills, the
// warp recomputes T from the list's upper bounds and drops the rows with lb > T. A second kernel
// takes T* = min over the row groups, keeps lb <= T*, computes those rows' distances in fp64 and
// sorts them by (distance, position): the answer is float64 brute force's, ties aside. (When no
// row group saw k allowed rows, e.g. under a sparse mask, the k-th smallest upper bound over all
// the candidates serves as T* instead.) If a query
// has more near-ties than its list holds (e.g. many duplicate vectors at the k-th distance), it is
// flagged and the caller answers it with the fp32 cuBLAS path.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpu_fused_search.cuh"

namespace gpuopt::vector::detail {

namespace {

constexpr int kTileRows = 64;  // database rows per shared-memory tile
constexpr std::uint32_t kNoRow = 0xffffffffu;

// ---- small PTX helpers (sm_80+) ----

__device__ __forceinline__ void cp_async_16(void* shared, const void* global, int bytes) {
  unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// ---- row / query preparation ----

// One warp per vector: fp64 norm, then the unit-scaled fp16 copy (zero-padded to padded_dim).
__global__ void k_prepare_rows_f16(const float* __restrict__ vectors, std::size_t rows, int dim,
                                   int padded_dim, float* __restrict__ squared_norm,
                                   float* __restrict__ norm, __half* __restrict__ scaled) {
  std::size_t row = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* v = vectors + row * dim;
  double sum = 0;
  for (int i = lane; i < dim; i += 32) sum += double(v[i]) * double(v[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  float n = static_cast<float>(std::sqrt(sum));
  if (lane == 0) {
    squared_norm[row] = static_cast<float>(sum);
    norm[row] = n;
  }
  if (scaled == nullptr) return;
  float inverse = n > 0 ? 1.0f / n : 0.0f;
  __half* out = scaled + row * padded_dim;
  for (int i = lane; i < padded_dim; i += 32) {
    out[i] = __float2half_rn(i < dim ? v[i] * inverse : 0.0f);
  }
}

// ---- the fused select kernel ----

struct SelectParams {
  const __half* rows;          // [row_count, D]
  const float* row_norm;       // [row_count]
  const float* row_squared;    // [row_count]
  const std::uint64_t* allow;  // bitset or null
  std::size_t row_count;
  std::size_t rows_per_group;  // multiple of kTileRows
  int groups;
  const __half* queries;  // [gridDim.x * warps * 32, D], zero rows past query_count
  const float* query_norm;
  const float* query_squared;
  int query_count;
  int metric;
  float eps;
  int k;
  float* candidate_value;         // [query, group, capacity] approximate cosine
  std::uint32_t* candidate_row;   // [query, group, capacity]
  std::int32_t* candidate_count;  // [query, group]
  float* group_threshold;         // [query, group]
  std::int32_t* overflow;         // [query]
};

template <int kCapacity>
struct WarpLists {
  float* value;        // [32, kCapacity]
  std::uint32_t* row;  // [32, kCapacity]
  int* count;          // [32]; may run past kCapacity when inserts failed
  float* threshold;    // [32]
};

// Whole warp: recomputes list `list`'s threshold from its upper bounds and keeps the rows whose
// lower bound is within it. Flags the query when near-ties fill most of the list.
template <int kCapacity>
__device__ void compact_list(const SelectParams& p, const WarpLists<kCapacity>& lists, int list,
                             int query, float query_norm, float query_squared, int lane) {
  constexpr int kPerLane = kCapacity / 32;
  int n = min(lists.count[list], kCapacity);
  float* values = lists.value + list * kCapacity;
  std::uint32_t* rows = lists.row + list * kCapacity;
  float lower[kPerLane], value[kPerLane];
  std::uint32_t row[kPerLane], key[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    int index = e * 32 + lane;
    key[e] = 0xffffffffu;
    lower[e] = FLT_MAX;
    value[e] = 0.0f;
    row[e] = kNoRow;
    if (index < n) {
      value[e] = values[index];
      row[e] = rows[index];
      Bounds b = distance_bounds(p.metric, value[e], p.eps, query_norm, query_squared,
                                 p.row_norm[row[e]], p.row_squared[row[e]]);
      lower[e] = b.lower;
      key[e] = orderable(b.upper);
    }
  }
  float threshold = lists.threshold[list];
  if (n >= p.k) {
    // The k-th smallest key, by binary search on the key (32 warp-wide counting rounds).
    std::uint32_t lo = 0, hi = 0xfffffffeu;
    while (lo < hi) {
      std::uint32_t mid = lo + (hi - lo) / 2;
      unsigned c = 0;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) c += key[e] <= mid;
      c = __reduce_add_sync(0xffffffffu, c);
      if (c >= static_cast<unsigned>(p.k)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    threshold = fminf(threshold, from_orderable(lo));
  }
  __syncwarp();
  int kept = 0;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    bool keep = e * 32 + lane < n && lower[e] <= threshold;
    unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (keep) {
      int slot = kept + __popc(ballot & ((1u << lane) - 1));
      values[slot] = value[e];
      rows[slot] = row[e];
    }
    kept += __popc(ballot);
  }
  __syncwarp();
  if (lane == 0) {
    if (kept > kCapacity * 3 / 4) {
      // Too many near-ties to make progress: give this query to the fallback path.
      lists.count[list] = 0;
      lists.threshold[list] = -FLT_MAX;
      if (query < p.query_count) p.overflow[query] = 1;
    } else {
      lists.count[list] = kept;
      lists.threshold[list] = threshold;
    }
  }
  __syncwarp();
}

// Block: kWarps warps; warp w owns queries blockIdx.x * kWarps * 32 + w * 32 + [0, 32) with their
// fp16 fragments in registers. blockIdx.y is the row group; all warps stream its rows through
// shared memory tile by tile (double-buffered with cp.async).
template <int kKSteps, int kWarps, int kCapacity>
__global__ void __launch_bounds__(kWarps * 32) k_fused_select_f16(const SelectParams p) {
  constexpr int kDim = kKSteps * 16;
  constexpr int kStride = kDim + 8;  // halves; the 16-byte skew keeps ldmatrix conflict-free
  extern __shared__ __align__(16) unsigned char shared[];
  __half* tiles = reinterpret_cast<__half*>(shared);                             // [2][64][kStride]
  float* tile_norm = reinterpret_cast<float*>(tiles + 2 * kTileRows * kStride);  // [2][64]
  float* tile_squared = tile_norm + 2 * kTileRows;                               // [2][64]
  float* list_value = tile_squared + 2 * kTileRows;
  std::uint32_t* list_row = reinterpret_cast<std::uint32_t*>(list_value + kWarps * 32 * kCapacity);
  int* list_count = reinterpret_cast<int*>(list_row + kWarps * 32 * kCapacity);
  float* list_threshold = reinterpret_cast<float*>(list_count + kWarps * 32);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int warp_query = (blockIdx.x * kWarps + warp) * 32;
  WarpLists<kCapacity> lists{list_value + warp * 32 * kCapacity, list_row + warp * 32 * kCapacity,
                             list_count + warp * 32, list_threshold + warp * 32};
  lists.count[lane] = 0;
  lists.threshold[lane] = warp_query + lane < p.query_count ? FLT_MAX : -FLT_MAX;

  // This thread's four queries (mma accumulator rows g, g + 8 of the two 16-row tiles).
  float query_norm[4], query_squared[4];
  int query_list[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    query_list[j] = (j >> 1) * 16 + (j & 1) * 8 + g;
    int q = min(warp_query + query_list[j], p.query_count - 1);
    query_norm[j] = p.query_norm[q];
    query_squared[j] = p.query_squared[q];
  }
  // A fragments of m16n8k16 (row-major 16x16): rows g / g+8, columns 2t / 2t+8.
  std::uint32_t a[2][kKSteps][4];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const __half* q = p.queries + std::size_t(warp_query + m * 16 + g) * kDim + ks * 16 + 2 * t;
      a[m][ks][0] = *reinterpret_cast<const std::uint32_t*>(q);
      a[m][ks][1] = *reinterpret_cast<const std::uint32_t*>(q + 8 * kDim);
      a[m][ks][2] = *reinterpret_cast<const std::uint32_t*>(q + 8);
      a[m][ks][3] = *reinterpret_cast<const std::uint32_t*>(q + 8 * kDim + 8);
    }
  }
  __syncwarp();
  float threshold[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) threshold[j] = lists.threshold[query_list[j]];

  const std::size_t row_begin = std::size_t(blockIdx.y) * p.rows_per_group;
  const std::size_t row_end =
      row_begin + p.rows_per_group < p.row_count ? row_begin + p.rows_per_group : p.row_count;
  const int tile_count =
      row_begin < row_end ? static_cast<int>((row_end - row_begin + kTileRows - 1) / kTileRows) : 0;

  auto load_tile = [&](int tile, int stage) {
    const std::size_t row0 = row_begin + std::size_t(tile) * kTileRows;
    __half* destination = tiles + stage * kTileRows * kStride;
    constexpr int kChunksPerRow = kDim / 8;
    for (int c = threadIdx.x; c < kTileRows * kChunksPerRow; c += kWarps * 32) {
      int r = c / kChunksPerRow, column = (c % kChunksPerRow) * 8;
      bool valid = row0 + r < row_end;
      const __half* source = p.rows + (valid ? (row0 + r) * kDim + column : 0);
      cp_async_16(destination + r * kStride + column, source, valid ? 16 : 0);
    }
    for (int c = threadIdx.x; c < 2 * kTileRows / 4; c += kWarps * 32) {
      int which = c / (kTileRows / 4), r = (c % (kTileRows / 4)) * 4;
      std::size_t row = row0 + r;
      const float* source = which ? p.row_squared : p.row_norm;
      float* target = (which ? tile_squared : tile_norm) + stage * kTileRows + r;
      if (row + 4 <= row_end) {
        cp_async_16(target, source + row, 16);
      } else {
        // The array's tail: plain loads (a partial cp.async still reads as 16 bytes to
        // compute-sanitizer). Visible to all after the next iteration's __syncthreads.
        for (int i = 0; i < 4; ++i) target[i] = row + i < row_end ? source[row + i] : 0.0f;
      }
    }
  };

  if (tile_count > 0) load_tile(0, 0);
  cp_async_commit();
  for (int tile = 0; tile < tile_count; ++tile) {
    const int stage = tile & 1;
    cp_async_wait_all();
    __syncthreads();
    if (tile + 1 < tile_count) load_tile(tile + 1, stage ^ 1);
    cp_async_commit();

    const std::size_t row0 = row_begin + std::size_t(tile) * kTileRows;
    // The tile is 64 rows starting at a multiple of 64: one mask word covers it.
    std::uint64_t live = p.allow != nullptr ? p.allow[row0 / 64] : ~std::uint64_t{0};
    if (row_end - row0 < 64) live &= (std::uint64_t{1} << (row_end - row0)) - 1;
    const __half* tile_rows = tiles + stage * kTileRows * kStride;
    const unsigned tile_address = static_cast<unsigned>(__cvta_generic_to_shared(tile_rows));
    const float* norms = tile_norm + stage * kTileRows;
    const float* squares = tile_squared + stage * kTileRows;

#pragma unroll 1
    for (int nt = 0; nt < kTileRows / 8; nt += 2) {
      float acc[2][2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[n][m][c] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ks += 2) {
        std::uint32_t b[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          int r = (nt + n) * 8 + (lane & 7);
          int column = ks * 16 + (lane >> 3) * 8;
          ldmatrix_x4(b[n], tile_address + (r * kStride + column) * 2);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma_16816(acc[n][m], a[m][ks], b[n][0], b[n][1]);
            mma_16816(acc[n][m], a[m][ks + 1], b[n][2], b[n][3]);
          }
        }
      }
      // Epilogue: accumulator element c of tile m is query row g + 8 * (c >> 1), database row
      // 2t + (c & 1) of the 8-row slice.
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int local = (nt + n) * 8 + 2 * t;
        const float row_norm[2] = {norms[local], norms[local + 1]};
        const float row_squared[2] = {squares[local], squares[local + 1]};
        unsigned pending = 0;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            int j = m * 2 + (c >> 1), r = c & 1;
            Bounds bounds = distance_bounds(p.metric, acc[n][m][c], p.eps, query_norm[j],
                                            query_squared[j], row_norm[r], row_squared[r]);
            if (bounds.lower <= threshold[j] && ((live >> (local + r)) & 1)) {
              pending |= 1u << (m * 4 + c);
            }
          }
        }
        while (__any_sync(0xffffffffu, pending != 0)) {
          unsigned failed = 0;
#pragma unroll
          for (int bit = 0; bit < 8; ++bit) {
            if (!((pending >> bit) & 1)) continue;
            int m = bit >> 2, c = bit & 3, j = m * 2 + (c >> 1);
            int list = query_list[j];
            int slot = atomicAdd(&lists.count[list], 1);
            if (slot < kCapacity) {
              lists.value[list * kCapacity + slot] = acc[n][m][c];
              lists.row[list * kCapacity + slot] =
                  static_cast<std::uint32_t>(row0 + local + (c & 1));
            } else {
              failed |= 1u << bit;
            }
          }
          pending = failed;
          if (!__any_sync(0xffffffffu, pending != 0)) break;
          __syncwarp();
          // Some lists are full: tighten their thresholds, then retry what did not fit.
          for (int list = 0; list < 32; ++list) {
            if (lists.count[list] >= kCapacity) {
              int q = min(warp_query + list, p.query_count - 1);
              compact_list<kCapacity>(p, lists, list, warp_query + list, p.query_norm[q],
                                      p.query_squared[q], lane);
            }
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) threshold[j] = lists.threshold[query_list[j]];
#pragma unroll
          for (int bit = 0; bit < 8; ++bit) {
            if (!((pending >> bit) & 1)) continue;
            int m = bit >> 2, c = bit & 3, j = m * 2 + (c >> 1), r = c & 1;
            Bounds bounds = distance_bounds(p.metric, acc[n][m][c], p.eps, query_norm[j],
                                            query_squared[j], row_norm[r], row_squared[r]);
            if (!(bounds.lower <= threshold[j])) pending &= ~(1u << bit);
          }
        }
      }
    }
  }
  cp_async_wait_all();
  __syncwarp();
  // Final tightening, then each list goes to global memory for the merge kernel.
  for (int list = 0; list < 32; ++list) {
    int query = warp_query + list;
    if (query >= p.query_count) break;
    if (lists.count[list] >= p.k) {
      compact_list<kCapacity>(p, lists, list, query, p.query_norm[query], p.query_squared[query],
                              lane);
    }
    std::size_t slot = std::size_t(query) * p.groups + blockIdx.y;
    int count = min(lists.count[list], kCapacity);
    for (int c = lane; c < count; c += 32) {
      p.candidate_value[slot * kCapacity + c] = lists.value[list * kCapacity + c];
      p.candidate_row[slot * kCapacity + c] = lists.row[list * kCapacity + c];
    }
    if (lane == 0) {
      p.candidate_count[slot] = count;
      p.group_threshold[slot] = lists.threshold[list];
    }
  }
}

// ---- merge + fp64 re-rank: one block per query ----

struct RerankParams {
  const float* vectors;  // [row_count, dim]
  const float* row_norm;
  const float* row_squared;
  const float* queries;  // [query_count, dim] fp32
  const float* query_norm;
  const float* query_squared;
  int dim;
  int metric;
  float eps;
  int k;
  int groups;
  const float* candidate_value;
  const std::uint32_t* candidate_row;
  const std::int32_t* candidate_count;
  const float* group_threshold;
  std::int32_t* overflow;
  float* out_distance;          // [query_count, k]
  std::uint64_t* out_position;  // [query_count, k]
};

constexpr int kRerankThreads = 128;

template <int kCapacity>
__global__ void __launch_bounds__(kRerankThreads) k_fused_rerank_f64(const RerankParams p) {
  constexpr int kSurvivors = 4 * kCapacity;
  __shared__ double distance[kSurvivors];
  __shared__ std::uint32_t row[kSurvivors];
  __shared__ float warp_min[kRerankThreads / 32];
  __shared__ int survivors;
  const int query = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* out_distance = p.out_distance + std::size_t(query) * p.k;
  std::uint64_t* out_position = p.out_position + std::size_t(query) * p.k;
  if (p.overflow[query] != 0) return;  // the caller answers this query

  // T* = min over the row groups' thresholds (each bounds the true k-th distance).
  float threshold = FLT_MAX;
  for (int group = threadIdx.x; group < p.groups; group += kRerankThreads) {
    threshold = fminf(threshold, p.group_threshold[std::size_t(query) * p.groups + group]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    threshold = fminf(threshold, __shfl_xor_sync(0xffffffffu, threshold, offset));
  }
  if (lane == 0) warp_min[warp] = threshold;
  if (threadIdx.x == 0) survivors = 0;
  __syncthreads();
  threshold = warp_min[0];
  for (int w = 1; w < kRerankThreads / 32; ++w) threshold = fminf(threshold, warp_min[w]);

  const float query_norm = p.query_norm[query], query_squared = p.query_squared[query];
  const int entries = p.groups * kCapacity;
  auto bounds_of = [&](int index, Bounds& b, std::uint32_t& r) {
    std::size_t slot = std::size_t(query) * p.groups + index / kCapacity;
    if (index % kCapacity >= p.candidate_count[slot]) return false;
    std::size_t entry = slot * kCapacity + index % kCapacity;
    r = p.candidate_row[entry];
    b = distance_bounds(p.metric, p.candidate_value[entry], p.eps, query_norm, query_squared,
                        p.row_norm[r], p.row_squared[r]);
    return true;
  };
  // When no row group saw k allowed rows (sparse masks), its threshold says nothing: then the k-th
  // smallest upper bound over all candidates (any k rows' bounds will do) tightens T*.
  {
    int local = 0;
    for (int index = threadIdx.x; index < entries; index += kRerankThreads) {
      Bounds b;
      std::uint32_t r;
      if (bounds_of(index, b, r) && b.lower <= threshold) ++local;
    }
    atomicAdd(&survivors, local);
    __syncthreads();
    const bool too_many = survivors > kSurvivors;
    __syncthreads();
    if (too_many) {
      std::uint32_t lo = 0, hi = 0xfffffffeu;
      while (lo < hi) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        if (threadIdx.x == 0) survivors = 0;
        __syncthreads();
        int below = 0;
        for (int index = threadIdx.x; index < entries; index += kRerankThreads) {
          Bounds b;
          std::uint32_t r;
          if (bounds_of(index, b, r) && orderable(b.upper) <= mid) ++below;
        }
        atomicAdd(&survivors, below);
        __syncthreads();
        if (survivors >= p.k) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
        __syncthreads();
      }
      threshold = fminf(threshold, from_orderable(lo));
    }
    if (threadIdx.x == 0) survivors = 0;
    __syncthreads();
  }
  for (int index = threadIdx.x; index < entries; index += kRerankThreads) {
    Bounds b;
    std::uint32_t r;
    if (bounds_of(index, b, r) && b.lower <= threshold) {
      int s = atomicAdd(&survivors, 1);
      if (s < kSurvivors) row[s] = r;
    }
  }
  __syncthreads();
  const int n = survivors;
  if (n > kSurvivors) {
    if (threadIdx.x == 0) p.overflow[query] = 1;
    return;
  }
  const float* q = p.queries + std::size_t(query) * p.dim;
  for (int s = warp; s < n; s += kRerankThreads / 32) {
    const float* x = p.vectors + std::size_t(row[s]) * p.dim;
    double sum = 0, qq = 0, xx = 0;
    for (int i = lane; i < p.dim; i += 32) {
      double a = q[i], b = x[i];
      if (p.metric == 0) {
        sum += (a - b) * (a - b);
      } else {
        sum += a * b;
        qq += a * a;
        xx += b * b;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      qq += __shfl_xor_sync(0xffffffffu, qq, offset);
      xx += __shfl_xor_sync(0xffffffffu, xx, offset);
    }
    if (lane == 0) {
      distance[s] = p.metric == 0   ? sum
                    : p.metric == 1 ? -sum
                                    : (qq * xx > 0 ? 1.0 - sum / sqrt(qq * xx) : 1.0);
    }
  }
  int padded = 1;
  while (padded < n) padded *= 2;
  for (int s = n + threadIdx.x; s < padded; s += kRerankThreads) {
    distance[s] = HUGE_VAL;
    row[s] = kNoRow;
  }
  __syncthreads();
  // Bitonic sort by (distance, row).
  for (int size = 2; size <= padded; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < padded; i += kRerankThreads) {
        int j = i ^ stride;
        if (j <= i) continue;
        bool j_first = distance[j] < distance[i] || (distance[j] == distance[i] && row[j] < row[i]);
        bool ascending = (i & size) == 0;
        if (j_first == ascending) {
          double d = distance[i];
          distance[i] = distance[j];
          distance[j] = d;
          std::uint32_t r = row[i];
          row[i] = row[j];
          row[j] = r;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < p.k; i += kRerankThreads) {
    bool found = i < n;
    out_distance[i] = found ? static_cast<float>(distance[i]) : FLT_MAX;
    out_position[i] = found ? std::uint64_t{row[i]} : ~std::uint64_t{0};
  }
}

template <int kKSteps, int kWarps, int kCapacity>
std::size_t select_shared_bytes() {
  constexpr int kStride = kKSteps * 16 + 8;
  return 2 * kTileRows * kStride * sizeof(__half) + 4 * kTileRows * sizeof(float) +
         kWarps * 32 * kCapacity * (sizeof(float) + sizeof(std::uint32_t)) +
         kWarps * 32 * (sizeof(int) + sizeof(float));
}

std::string message(const char* format, long long a, long long b) {
  char buffer[200];
  std::snprintf(buffer, sizeof(buffer), format, a, b);
  return buffer;
}

}  // namespace

int fused_padded_dim(std::size_t dim) {
  if (dim == 0 || dim > kFusedMaxDim) return 0;
  return static_cast<int>((dim + 31) / 32 * 32);
}

double fused_cosine_error_bound(int padded_dim) {
  const double u = std::ldexp(1.0, -11) + std::ldexp(1.0, -20);
  const double eta = std::ldexp(1.0, -25);
  const double d = padded_dim;
  double rounding = 2 * u + u * u + 2 * (1 + u) * eta * std::sqrt(d) + d * eta * eta;
  double accumulation = d * std::ldexp(1.0, -22) * (1 + u) * (1 + u);
  return 1.01 * (rounding + accumulation);
}

Status fused_prepare_rows(const float* vectors, std::size_t rows, int dim, int padded_dim,
                          float* squared_norm, float* norm, __half* scaled, cudaStream_t stream) {
  if (rows == 0) return ok_status();
  unsigned blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  k_prepare_rows_f16<<<blocks, 256, 0, stream>>>(vectors, rows, dim, padded_dim, squared_norm, norm,
                                                 scaled);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

namespace {

template <int kKSteps, int kWarps, int kCapacity>
Status launch_fused(SelectParams select, RerankParams rerank, std::size_t query_count, int sms,
                    cudaStream_t stream) {
  auto kernel = k_fused_select_f16<kKSteps, kWarps, kCapacity>;
  const std::size_t shared_bytes = select_shared_bytes<kKSteps, kWarps, kCapacity>();
  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared_bytes)));
  int per_sm = 0;
  GPUOPT_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, shared_bytes));
  if (per_sm < 1) {
    return unavailable(
        message("fused search: %lld bytes of shared memory per block do not fit "
                "(%lld blocks per SM)",
                (long long)shared_bytes, per_sm));
  }
  const int queries_per_block = kWarps * 32;
  const int query_blocks =
      static_cast<int>((query_count + queries_per_block - 1) / queries_per_block);
  // Enough row groups to fill the GPU once; more groups only lengthen the merge.
  const std::size_t row_tiles = (select.row_count + kTileRows - 1) / kTileRows;
  // select.groups arrives as the most the candidate buffers hold.
  std::size_t groups = std::max<std::size_t>(1, std::size_t(sms) * per_sm / query_blocks);
  groups = std::min({groups, row_tiles, std::size_t(select.groups)});
  select.rows_per_group = (row_tiles + groups - 1) / groups * kTileRows;
  groups = (select.row_count + select.rows_per_group - 1) / select.rows_per_group;
  select.groups = static_cast<int>(groups);
  rerank.groups = select.groups;
  dim3 grid(static_cast<unsigned>(query_blocks), static_cast<unsigned>(groups));
  kernel<<<grid, kWarps * 32, shared_bytes, stream>>>(select);
  GPUOPT_CUDA_TRY_LAUNCH();
  k_fused_rerank_f64<kCapacity>
      <<<static_cast<unsigned>(query_count), kRerankThreads, 0, stream>>>(rerank);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <int kKSteps>
Status launch_for_capacity(SelectParams select, RerankParams rerank, std::size_t query_count,
                           int sms, cudaStream_t stream) {
  // Lists hold at least 2k rows so a compaction frees room for k more.
  if (select.k <= 32) {
    return launch_fused<kKSteps, 4, 64>(select, rerank, query_count, sms, stream);
  }
  return launch_fused<kKSteps, 2, 256>(select, rerank, query_count, sms, stream);
}

Status launch_for_dim(int padded_dim, const SelectParams& select, const RerankParams& rerank,
                      std::size_t query_count, int sms, cudaStream_t stream) {
  switch (padded_dim / 16) {
    case 2:
      return launch_for_capacity<2>(select, rerank, query_count, sms, stream);
    case 4:
      return launch_for_capacity<4>(select, rerank, query_count, sms, stream);
    case 6:
      return launch_for_capacity<6>(select, rerank, query_count, sms, stream);
    default:
      return launch_for_capacity<8>(select, rerank, query_count, sms, stream);
  }
}

int capacity_for(int k) { return k <= 32 ? 64 : 256; }
int queries_per_block_for(int k) { return k <= 32 ? 128 : 64; }

}  // namespace

Status FusedSearch::run(const FusedRows& rows, const float* queries, std::size_t query_count, int k,
                        float* distance, std::uint64_t* position, std::int32_t* overflow,
                        cudaStream_t stream) {
  if (rows.padded_dim == 0 || rows.padded_dim > int(kFusedMaxDim) || rows.padded_dim % 32 != 0) {
    return invalid_argument(
        message("fused search: padded dimension %lld (dim %lld)", rows.padded_dim, rows.dim));
  }
  if (k < 1 || k > int(kFusedMaxK)) {
    return invalid_argument(message("fused search: k %lld outside 1..%lld", k, kFusedMaxK));
  }
  if (rows.rows >= (std::size_t{1} << 32) - kTileRows) {
    return invalid_argument(
        message("fused search: %lld rows (limit 2^32 - %lld)", (long long)rows.rows, kTileRows));
  }
  if (query_count == 0) return ok_status();
  if (sm_count_ == 0) {
    int device = 0;
    GPUOPT_CUDA_TRY(cudaGetDevice(&device));
    GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  }
  GPUOPT_CUDA_TRY(cudaMemsetAsync(overflow, 0, query_count * sizeof(std::int32_t), stream));
  if (rows.rows == 0) return ok_status();
  const int capacity = capacity_for(k);
  const int per_block = queries_per_block_for(k);
  // Query chunks bound the candidate buffers ([chunk, groups, capacity]).
  const std::size_t chunk = std::min<std::size_t>(query_count, 8192);
  const std::size_t padded_queries = (chunk + per_block - 1) / per_block * per_block;
  const std::size_t max_groups =
      std::max<std::size_t>(1, std::size_t(sm_count_) * 4 / ((chunk + per_block - 1) / per_block));
  GPUOPT_RETURN_IF_ERROR(reserve<__half>(query_scaled_, padded_queries * rows.padded_dim));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(query_norm_, chunk));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(query_squared_norm_, chunk));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(candidate_value_, chunk * max_groups * capacity));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint32_t>(candidate_row_, chunk * max_groups * capacity));
  GPUOPT_RETURN_IF_ERROR(reserve<std::int32_t>(candidate_count_, chunk * max_groups));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(group_threshold_, chunk * max_groups));
  const float eps = static_cast<float>(fused_cosine_error_bound(rows.padded_dim));
  for (std::size_t first = 0; first < query_count; first += chunk) {
    const std::size_t count = std::min(chunk, query_count - first);
    const std::size_t padded = (count + per_block - 1) / per_block * per_block;
    const float* chunk_queries = queries + first * rows.dim;
    if (padded > count) {
      GPUOPT_CUDA_TRY(cudaMemsetAsync(query_scaled_.data_as<__half>() + count * rows.padded_dim, 0,
                                      (padded - count) * rows.padded_dim * sizeof(__half), stream));
    }
    GPUOPT_RETURN_IF_ERROR(fused_prepare_rows(
        chunk_queries, count, rows.dim, rows.padded_dim, query_squared_norm_.data_as<float>(),
        query_norm_.data_as<float>(), query_scaled_.data_as<__half>(), stream));
    SelectParams select{};
    select.rows = rows.scaled;
    select.row_norm = rows.norm;
    select.row_squared = rows.squared_norm;
    select.allow = rows.allow_mask;
    select.row_count = rows.rows;
    select.queries = query_scaled_.data_as<__half>();
    select.query_norm = query_norm_.data_as<float>();
    select.query_squared = query_squared_norm_.data_as<float>();
    select.query_count = static_cast<int>(count);
    select.metric = rows.metric;
    select.eps = eps;
    select.k = k;
    select.candidate_value = candidate_value_.data_as<float>();
    select.candidate_row = candidate_row_.data_as<std::uint32_t>();
    select.candidate_count = candidate_count_.data_as<std::int32_t>();
    select.group_threshold = group_threshold_.data_as<float>();
    select.overflow = overflow + first;
    select.groups = static_cast<int>(max_groups);
    RerankParams rerank{};
    rerank.vectors = rows.vectors;
    rerank.row_norm = rows.norm;
    rerank.row_squared = rows.squared_norm;
    rerank.queries = chunk_queries;
    rerank.query_norm = query_norm_.data_as<float>();
    rerank.query_squared = query_squared_norm_.data_as<float>();
    rerank.dim = rows.dim;
    rerank.metric = rows.metric;
    rerank.eps = eps;
    rerank.k = k;
    rerank.candidate_value = candidate_value_.data_as<float>();
    rerank.candidate_row = candidate_row_.data_as<std::uint32_t>();
    rerank.candidate_count = candidate_count_.data_as<std::int32_t>();
    rerank.group_threshold = group_threshold_.data_as<float>();
    rerank.overflow = overflow + first;
    rerank.out_distance = distance + first * k;
    rerank.out_position = position + first * k;
    GPUOPT_RETURN_IF_ERROR(
        launch_for_dim(rows.padded_dim, select, rerank, count, sm_count_, stream));
  }
  return ok_status();
}

}  // namespace gpuopt::vector::detail
