// Small-batch GPU exact search: one query (or up to 16) uses the whole GPU.
//
// Scan kernel. The rows are cut into one contiguous range per block, about two blocks per SM. Each
// warp of a block takes 16 rows at a time and multiplies them with the queries on tensor cores
// (mma.sync m16n8k16, fp16 inputs, fp32 accumulation): the rows are the 16-row A operand and the
// queries (8 or 16, padded with zero vectors) the 8-column B operand. The fragments are loaded
// straight from global memory, 16 bytes per lane, without shared memory: the order in which the
// dimensions meet inside the mma does not matter to a dot product, so lane (g, t) reads chunk
// t + 4i (8 halves) of rows g and g + 8 and the queries' same chunk, and both operands use the
// same dimension order. The inputs (unit-scaled fp16 rows and query), the accumulation and hence
// the error bound eps are those of the fused path (gpu_fused_search.cu, top comment), so a row is
// dropped only when its lower bound exceeds an upper bound of the true k-th distance.
//
// Each block keeps, per query, one candidate list in shared memory (approximate cosine + row). A
// step of the block adds at most 128 rows per query; after each step a list past kListKeep entries
// is compacted by one warp: its threshold T becomes the k-th smallest upper bound in the list, and
// the rows whose lower bound exceeds T leave. At the end each list is compacted once more and
// written out with its threshold. A list that still holds more than kListKeep rows after a
// compaction (hundreds of near-ties) marks its query as overflowed (count -1). Each written entry
// carries its bounds (lower bound, upper bound as an orderable key) beside its row, so the merge
// gathers nothing from the rows' norms.
//
// Merge kernel: one block per query. T0 = the smallest of the blocks' thresholds bounds the true
// k-th distance, so only candidates with lower bound <= T0 matter; the block finds each list's
// start with a prefix sum of the counts and stages those candidates in shared memory in one pass
// whose loads are all independent (a warp walking the lists one after another waited on three
// dependent global loads per list and pass: about 20 us per pass at 264 lists). T* = min(T0, the
// k-th smallest upper bound over the staged candidates: a radix select over the orderable keys,
// in shared memory); the candidates with lower bound <= T* are re-ranked with fp64 distances from
// the fp32 rows and sorted by (distance, position). When more candidates pass T0 than the stage
// holds (large k), the same passes read them from global memory instead. The answer is float64
// brute force's, ties aside, as for the fused path.
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpu_small_batch.cuh"

namespace gpuopt::vector::detail {

namespace {

constexpr int kScanWarps = 8;
constexpr int kScanThreads = kScanWarps * 32;
constexpr int kStepRows = kScanWarps * 16;            // rows a block scans between two list checks
constexpr int kListCapacity = 384;                    // per query and block (shared memory)
constexpr int kListKeep = kListCapacity - kStepRows;  // most entries at the start of a step
constexpr int kMergeThreads = 512;
constexpr int kMergeSurvivors = 1024;               // candidates the fp64 re-rank holds
constexpr int kMergeMaxGroups = 2 * kMergeThreads;  // lists one merge block indexes (2 a thread)
constexpr int kStageCapacity = 4096;                // candidates staged in shared memory
constexpr std::size_t kMergeSharedBytes =
    std::size_t(kStageCapacity) * (sizeof(float) + 2 * sizeof(std::uint32_t));
constexpr std::uint32_t kNoRow = 0xffffffffu;
constexpr int kMaxBlocksPerSm = 3;

static_assert(kListKeep >= int(kFusedMaxK) + 64, "lists must hold k rows plus near-ties");

std::string message(const char* format, long long a, long long b) {
  char buffer[200];
  std::snprintf(buffer, sizeof(buffer), format, a, b);
  return buffer;
}

// One warp: the query's squared norm and norm (fp64 sum, stored fp32) and, when `scaled` is not
// null, its unit-scaled fp16 copy zero-padded to `padded_dim`; the same arithmetic as the rows'
// preparation, so the scan and the merge (which both call it) see identical values.
__device__ void prepare_query(const float* __restrict__ v, int dim, int padded_dim, __half* scaled,
                              float* squared, float* norm, int lane) {
  double sum = 0;
  for (int i = lane; i < dim; i += 32) sum += double(v[i]) * double(v[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float n = static_cast<float>(sqrt(sum));
  if (lane == 0) {
    *squared = static_cast<float>(sum);
    *norm = n;
  }
  if (scaled == nullptr) return;
  const float inverse = n > 0 ? 1.0f / n : 0.0f;
  for (int i = lane; i < padded_dim; i += 32) {
    scaled[i] = __float2half_rn(i < dim ? v[i] * inverse : 0.0f);
  }
}

__device__ __forceinline__ std::uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

struct ScanParams {
  const __half* rows;  // [row_count, padded_dim]
  const float* row_norm;
  const float* row_squared;
  const std::uint64_t* allow;  // bitset or null
  std::size_t row_count;
  std::size_t rows_per_group;  // multiple of kStepRows
  int groups;
  const float* queries;  // [query_count, dim] fp32
  int query_count;
  int dim;
  int metric;
  float eps;
  int k;
  float* candidate_lower;         // [query, group, kListKeep]: lower bound
  std::uint32_t* candidate_key;   // [query, group, kListKeep]: orderable(upper bound)
  std::uint32_t* candidate_row;   // [query, group, kListKeep]
  std::int32_t* candidate_count;  // [query, group]; -1 = overflowed
  float* group_threshold;         // [query, group]
};

// Whole warp: tightens one list (see the file comment): updates its count and threshold, or marks
// it dead when near-ties keep more than kListKeep rows.
__device__ void compact(const ScanParams& p, float* values, std::uint32_t* rows, int* count,
                        float* threshold, int* dead, float query_norm, float query_squared,
                        int lane) {
  constexpr int kPerLane = kListCapacity / 32;
  const int n = *count;
  float lower[kPerLane], value[kPerLane];
  std::uint32_t row[kPerLane], key[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int index = e * 32 + lane;
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
  float limit = *threshold;
  if (n >= p.k) {
    std::uint32_t lo = 0, hi = 0xfffffffeu;
    while (lo < hi) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
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
    limit = fminf(limit, from_orderable(lo));
  }
  __syncwarp();
  int kept = 0;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const bool keep = e * 32 + lane < n && lower[e] <= limit;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (keep) {
      const int slot = kept + __popc(ballot & ((1u << lane) - 1));
      if (slot < kListKeep) {
        values[slot] = value[e];
        rows[slot] = row[e];
      }
    }
    kept += __popc(ballot);
  }
  __syncwarp();
  if (lane == 0) {
    if (kept > kListKeep) {
      *dead = 1;  // too many near-ties: the caller answers this query another way
      *count = 0;
      *threshold = -FLT_MAX;
    } else {
      *count = kept;
      *threshold = limit;
    }
  }
  __syncwarp();
}

template <int kChunkGroups, int kQueryTiles>
__global__ void __launch_bounds__(kScanThreads, 2) k_small_scan(const ScanParams p) {
  constexpr int kDim = kChunkGroups * 32;
  constexpr int kQueries = kQueryTiles * 8;
  __shared__ __align__(16) __half query_scaled[kQueries][kDim];
  __shared__ float query_norm[kQueries], query_squared[kQueries], list_threshold[kQueries];
  __shared__ int list_count[kQueries];
  __shared__ int list_dead[kQueries];  // 1 once the list overflowed
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  float* list_value = reinterpret_cast<float*>(dynamic_shared);  // [query_count][capacity]
  std::uint32_t* list_row =
      reinterpret_cast<std::uint32_t*>(list_value + p.query_count * kListCapacity);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  for (int q = warp; q < kQueries; q += kScanWarps) {
    if (q < p.query_count) {
      prepare_query(p.queries + std::size_t(q) * p.dim, p.dim, kDim, query_scaled[q],
                    &query_squared[q], &query_norm[q], lane);
    } else {
      for (int i = lane; i < kDim; i += 32) query_scaled[q][i] = __float2half_rn(0.0f);
      if (lane == 0) query_norm[q] = query_squared[q] = 0.0f;
    }
    if (lane == 0) {
      list_count[q] = 0;
      list_dead[q] = 0;
      list_threshold[q] = FLT_MAX;
    }
  }
  __syncthreads();
  // B fragments: query g of each 8-query tile, chunk t + 4i.
  uint4 b[kQueryTiles][kChunkGroups];
#pragma unroll
  for (int qt = 0; qt < kQueryTiles; ++qt) {
#pragma unroll
    for (int i = 0; i < kChunkGroups; ++i) {
      b[qt][i] = *reinterpret_cast<const uint4*>(&query_scaled[qt * 8 + g][(t + 4 * i) * 8]);
    }
  }
  float threshold[kQueryTiles][2];
#pragma unroll
  for (int qt = 0; qt < kQueryTiles; ++qt) threshold[qt][0] = threshold[qt][1] = FLT_MAX;

  const std::size_t begin = std::size_t(blockIdx.x) * p.rows_per_group;
  const std::size_t end =
      begin + p.rows_per_group < p.row_count ? begin + p.rows_per_group : p.row_count;
  for (std::size_t step = begin; step < end; step += kStepRows) {
    const std::size_t row0 = step + std::size_t(warp) * 16;
    if (row0 < end) {
      const std::size_t low = row0 + g, high = row0 + g + 8;
      uint4 a_low[kChunkGroups], a_high[kChunkGroups];
      const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kChunkGroups; ++i) {
        const int column = (t + 4 * i) * 8;
        a_low[i] = low < end ? *reinterpret_cast<const uint4*>(p.rows + low * kDim + column) : zero;
        a_high[i] =
            high < end ? *reinterpret_cast<const uint4*>(p.rows + high * kDim + column) : zero;
      }
      const float norm[2] = {low < end ? p.row_norm[low] : 0.0f,
                             high < end ? p.row_norm[high] : 0.0f};
      const float squared[2] = {low < end ? p.row_squared[low] : 0.0f,
                                high < end ? p.row_squared[high] : 0.0f};
      // row0 is a multiple of 16, so its 16 rows share one mask word.
      const unsigned live =
          p.allow != nullptr ? unsigned(p.allow[row0 >> 6] >> (row0 & 63)) & 0xffffu : 0xffffu;
      float acc[kQueryTiles][4];
#pragma unroll
      for (int qt = 0; qt < kQueryTiles; ++qt)
        acc[qt][0] = acc[qt][1] = acc[qt][2] = acc[qt][3] = 0;
#pragma unroll
      for (int i = 0; i < kChunkGroups; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::uint32_t a[4] = {word(a_low[i], 2 * h), word(a_high[i], 2 * h),
                                      word(a_low[i], 2 * h + 1), word(a_high[i], 2 * h + 1)};
#pragma unroll
          for (int qt = 0; qt < kQueryTiles; ++qt) {
            mma_16816(acc[qt], a, word(b[qt][i], 2 * h), word(b[qt][i], 2 * h + 1));
          }
        }
      }
      // Accumulator c of a tile: row g + 8 * (c >> 1), query 2t + (c & 1) of the tile.
#pragma unroll
      for (int qt = 0; qt < kQueryTiles; ++qt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int q = qt * 8 + 2 * t + (c & 1);
          const int local = g + 8 * (c >> 1);
          if (q >= p.query_count || row0 + local >= end || !((live >> local) & 1)) continue;
          const Bounds bounds = distance_bounds(p.metric, acc[qt][c], p.eps, query_norm[q],
                                                query_squared[q], norm[c >> 1], squared[c >> 1]);
          if (!(bounds.lower <= threshold[qt][c & 1]) || list_dead[q]) continue;
          const int slot = atomicAdd(&list_count[q], 1);
          list_value[q * kListCapacity + slot] = acc[qt][c];
          list_row[q * kListCapacity + slot] = static_cast<std::uint32_t>(row0 + local);
        }
      }
    }
    __syncthreads();
    for (int q = warp; q < p.query_count; q += kScanWarps) {
      if (list_count[q] > kListKeep && !list_dead[q]) {
        compact(p, list_value + q * kListCapacity, list_row + q * kListCapacity, &list_count[q],
                &list_threshold[q], &list_dead[q], query_norm[q], query_squared[q], lane);
      }
    }
    __syncthreads();
#pragma unroll
    for (int qt = 0; qt < kQueryTiles; ++qt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int q = qt * 8 + 2 * t + j;
        if (q < p.query_count) threshold[qt][j] = list_threshold[q];
      }
    }
  }
  // Final tightening; then each list goes to global memory for the merge.
  for (int q = warp; q < p.query_count; q += kScanWarps) {
    if (list_count[q] >= p.k && !list_dead[q]) {
      compact(p, list_value + q * kListCapacity, list_row + q * kListCapacity, &list_count[q],
              &list_threshold[q], &list_dead[q], query_norm[q], query_squared[q], lane);
    }
    const int count = list_count[q];
    const bool dead = list_dead[q] != 0;
    const std::size_t slot = std::size_t(q) * p.groups + blockIdx.x;
    if (!dead) {
      for (int c = lane; c < count; c += 32) {
        const std::uint32_t r = list_row[q * kListCapacity + c];
        const Bounds b =
            distance_bounds(p.metric, list_value[q * kListCapacity + c], p.eps, query_norm[q],
                            query_squared[q], p.row_norm[r], p.row_squared[r]);
        p.candidate_lower[slot * kListKeep + c] = b.lower;
        p.candidate_key[slot * kListKeep + c] = orderable(b.upper);
        p.candidate_row[slot * kListKeep + c] = r;
      }
    }
    if (lane == 0) {
      p.candidate_count[slot] = dead ? -1 : count;
      p.group_threshold[slot] = list_threshold[q];
    }
  }
}

struct MergeParams {
  const float* vectors;          // [row_count, dim] fp32
  const std::uint64_t* row_ids;  // device [row_count] or null
  const float* queries;          // [query_count, dim]
  int dim;
  int metric;
  int k;
  int groups;  // at most kMergeMaxGroups
  const float* candidate_lower;
  const std::uint32_t* candidate_key;
  const std::uint32_t* candidate_row;
  const std::int32_t* candidate_count;
  const float* group_threshold;
  float* out_distance;          // [query_count, k]
  std::uint64_t* out_position;  // [query_count, k]
  std::uint64_t* out_id;        // [query_count, k] or null
  std::int32_t* overflow;       // [query_count]
};

__device__ void write_unanswered(const MergeParams& p, float* out_distance,
                                 std::uint64_t* out_position, std::uint64_t* out_id, int query) {
  for (int i = threadIdx.x; i < p.k; i += kMergeThreads) {
    out_distance[i] = FLT_MAX;
    out_position[i] = ~std::uint64_t{0};
    if (out_id != nullptr) out_id[i] = ~std::uint64_t{0};
  }
  if (threadIdx.x == 0) p.overflow[query] = 1;
}

__global__ void __launch_bounds__(kMergeThreads) k_small_merge(const MergeParams p) {
  constexpr int kWarps = kMergeThreads / 32;
  constexpr int kUnroll = 4;
  __shared__ double distance[kMergeSurvivors];
  __shared__ std::uint32_t row[kMergeSurvivors];
  __shared__ int list_start[kMergeMaxGroups];  // exclusive prefix sum of the lists' counts
  __shared__ unsigned histogram[256];
  __shared__ float warp_min[kWarps];
  __shared__ int warp_total[kWarps];
  __shared__ int survivors, staged;
  __shared__ std::uint32_t selected_prefix;
  __shared__ unsigned selected_remaining;
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  std::uint32_t* stage_key = reinterpret_cast<std::uint32_t*>(dynamic_shared);
  std::uint32_t* stage_row = stage_key + kStageCapacity;
  float* stage_lower = reinterpret_cast<float*>(stage_row + kStageCapacity);

  const int query = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* out_distance = p.out_distance + std::size_t(query) * p.k;
  std::uint64_t* out_position = p.out_position + std::size_t(query) * p.k;
  std::uint64_t* out_id = p.out_id != nullptr ? p.out_id + std::size_t(query) * p.k : nullptr;
  const std::int32_t* counts = p.candidate_count + std::size_t(query) * p.groups;
  const float* thresholds = p.group_threshold + std::size_t(query) * p.groups;
  const std::size_t first_entry = std::size_t(query) * p.groups * kListKeep;

  // T0 from the lists' thresholds, any overflowed list, and the lists' starts: thread t owns
  // lists 2t and 2t + 1; a block-wide exclusive scan of their counts.
  int count[2] = {0, 0};
  float threshold = FLT_MAX;
  bool dead = false;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int group = 2 * threadIdx.x + j;
    if (group < p.groups) {
      const int c = counts[group];
      threshold = fminf(threshold, thresholds[group]);
      dead = dead || c < 0;
      count[j] = c < 0 ? 0 : c;
    }
  }
  const int mine = count[0] + count[1];
  int inclusive = mine;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    threshold = fminf(threshold, __shfl_xor_sync(0xffffffffu, threshold, offset));
  }
  if (lane == 31) warp_total[warp] = inclusive;
  if (lane == 0) warp_min[warp] = threshold;
  if (threadIdx.x == 0) {
    survivors = 0;
    staged = 0;
    selected_prefix = 0;
    selected_remaining = static_cast<unsigned>(p.k);
  }
  const bool overflowed = __syncthreads_or(dead) != 0;
  if (overflowed) {
    write_unanswered(p, out_distance, out_position, out_id, query);
    return;
  }
  int before = 0, total = 0;
  threshold = FLT_MAX;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_total[w];
    total += warp_total[w];
    threshold = fminf(threshold, warp_min[w]);
  }
  const float t0 = threshold;
  {
    const int start = before + inclusive - mine;
    if (2 * int(threadIdx.x) < p.groups) list_start[2 * threadIdx.x] = start;
    if (2 * int(threadIdx.x) + 1 < p.groups) list_start[2 * threadIdx.x + 1] = start + count[0];
  }
  __syncthreads();
  // Entry i of the query's candidates (lists concatenated) -> its index in the global arrays.
  auto locate = [&](int i) {
    int lo = 0, hi = p.groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (list_start[mid] <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return first_entry + std::size_t(lo) * kListKeep + std::size_t(i - list_start[lo]);
  };
  // Visits every candidate with lower bound <= T0 from global memory; kUnroll independent loads
  // in flight per thread.
  auto for_each_global = [&](auto&& visit) {
    for (int base = threadIdx.x; base < total; base += kUnroll * kMergeThreads) {
      float lower[kUnroll];
      std::uint32_t key[kUnroll], r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kMergeThreads;
        lower[u] = FLT_MAX;
        key[u] = r[u] = kNoRow;
        if (i < total) {
          const std::size_t at = locate(i);
          lower[u] = p.candidate_lower[at];
          key[u] = p.candidate_key[at];
          r[u] = p.candidate_row[at];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * kMergeThreads < total && lower[u] <= t0) visit(key[u], lower[u], r[u]);
      }
    }
  };
  // One pass stages the candidates that can matter (lower bound <= T0).
  for_each_global([&](std::uint32_t key, float lower, std::uint32_t r) {
    const int s = atomicAdd(&staged, 1);
    if (s < kStageCapacity) {
      stage_key[s] = key;
      stage_lower[s] = lower;
      stage_row[s] = r;
    }
  });
  __syncthreads();
  const int considered = staged;
  const bool in_stage = considered <= kStageCapacity;
  auto for_each = [&](auto&& visit) {
    if (in_stage) {
      for (int i = threadIdx.x; i < considered; i += kMergeThreads) {
        visit(stage_key[i], stage_lower[i], stage_row[i]);
      }
    } else {
      for_each_global(visit);
    }
  };
  // The k-th smallest upper bound over the considered candidates (any k distinct rows bound the
  // k-th distance): a radix select over the orderable keys, 8 bits per pass.
  if (considered >= p.k) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += kMergeThreads) histogram[i] = 0;
      __syncthreads();
      const std::uint32_t high = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
      const std::uint32_t prefix = selected_prefix;
      for_each([&](std::uint32_t key, float, std::uint32_t) {
        if ((key & high) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1u);
      });
      __syncthreads();
      if (warp == 0) {
        unsigned local[8], sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          local[i] = histogram[lane * 8 + i];
          sum += local[i];
        }
        unsigned running = sum;
        for (int offset = 1; offset < 32; offset *= 2) {
          const unsigned other = __shfl_up_sync(0xffffffffu, running, offset);
          if (lane >= offset) running += other;
        }
        const unsigned remaining = selected_remaining;
        unsigned below = running - sum;
        if (below < remaining && running >= remaining) {
          for (int i = 0; i < 8; ++i) {
            if (below + local[i] >= remaining) {
              selected_prefix = prefix | (std::uint32_t(lane * 8 + i) << shift);
              selected_remaining = remaining - below;
              break;
            }
            below += local[i];
          }
        }
      }
      __syncthreads();
    }
    threshold = fminf(threshold, from_orderable(selected_prefix));
  }
  for_each([&](std::uint32_t, float lower, std::uint32_t r) {
    if (lower <= threshold) {
      const int s = atomicAdd(&survivors, 1);
      if (s < kMergeSurvivors) row[s] = r;
    }
  });
  __syncthreads();
  const int n = survivors;
  if (n > kMergeSurvivors) {
    write_unanswered(p, out_distance, out_position, out_id, query);
    return;
  }
  const float* q = p.queries + std::size_t(query) * p.dim;
  for (int s = warp; s < n; s += kWarps) {
    const float* x = p.vectors + std::size_t(row[s]) * p.dim;
    double sum = 0, qq = 0, xx = 0;
    for (int i = lane; i < p.dim; i += 32) {
      const double a = q[i], c = x[i];
      if (p.metric == 0) {
        sum += (a - c) * (a - c);
      } else {
        sum += a * c;
        qq += a * a;
        xx += c * c;
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
  for (int s = n + threadIdx.x; s < padded; s += kMergeThreads) {
    distance[s] = HUGE_VAL;
    row[s] = kNoRow;
  }
  __syncthreads();
  // Bitonic sort by (distance, row).
  for (int size = 2; size <= padded; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < padded; i += kMergeThreads) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const bool j_first =
            distance[j] < distance[i] || (distance[j] == distance[i] && row[j] < row[i]);
        const bool ascending = (i & size) == 0;
        if (j_first == ascending) {
          const double d = distance[i];
          distance[i] = distance[j];
          distance[j] = d;
          const std::uint32_t r = row[i];
          row[i] = row[j];
          row[j] = r;
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < p.k; i += kMergeThreads) {
    const bool found = i < n;
    out_distance[i] = found ? static_cast<float>(distance[i]) : FLT_MAX;
    out_position[i] = found ? std::uint64_t{row[i]} : ~std::uint64_t{0};
    if (out_id != nullptr) {
      out_id[i] = found && p.row_ids != nullptr ? p.row_ids[row[i]] : ~std::uint64_t{0};
    }
  }
  if (threadIdx.x == 0) p.overflow[query] = 0;
}

__global__ void k_positions_to_ids(const std::uint64_t* __restrict__ position,
                                   const std::uint64_t* __restrict__ row_ids, std::size_t count,
                                   std::uint64_t* __restrict__ id) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const std::uint64_t p = position[i];
  id[i] = p == ~std::uint64_t{0} ? p : row_ids[p];
}

// The most dynamic shared memory a scan block asks for (16 queries' lists).
constexpr std::size_t kScanMaxSharedBytes =
    kSmallBatchMaxQueries * kListCapacity * (sizeof(float) + sizeof(std::uint32_t));

template <int kChunkGroups, int kQueryTiles>
Status configure_scan() {
  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_small_scan<kChunkGroups, kQueryTiles>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kScanMaxSharedBytes)));
  return ok_status();
}

// Lets every scan variant take kScanMaxSharedBytes and the merge its stage (past the 48 KiB default
// with static memory).
Status configure_scans() {
  GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_small_merge, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMergeSharedBytes)));
  GPUOPT_RETURN_IF_ERROR((configure_scan<1, 1>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<1, 2>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<2, 1>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<2, 2>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<3, 1>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<3, 2>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<4, 1>()));
  GPUOPT_RETURN_IF_ERROR((configure_scan<4, 2>()));
  return ok_status();
}

__global__ void k_clear_unanswered(const std::int32_t* __restrict__ flags, std::size_t count, int k,
                                   float* distance, std::uint64_t* position, std::uint64_t* id) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if (flags != nullptr && flags[i / k] == 0) return;
  if (distance != nullptr) distance[i] = FLT_MAX;
  if (position != nullptr) position[i] = ~std::uint64_t{0};
  if (id != nullptr) id[i] = ~std::uint64_t{0};
}

template <int kChunkGroups, int kQueryTiles>
Status launch_scan(const ScanParams& p, std::size_t shared_bytes, cudaStream_t stream) {
  auto kernel = k_small_scan<kChunkGroups, kQueryTiles>;
  kernel<<<static_cast<unsigned>(p.groups), kScanThreads, shared_bytes, stream>>>(p);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <int kChunkGroups>
Status launch_scan_for_queries(const ScanParams& p, std::size_t shared_bytes, cudaStream_t stream) {
  if (p.query_count <= 8) return launch_scan<kChunkGroups, 1>(p, shared_bytes, stream);
  return launch_scan<kChunkGroups, 2>(p, shared_bytes, stream);
}

Status launch_scan_for_dim(int padded_dim, const ScanParams& p, std::size_t shared_bytes,
                           cudaStream_t stream) {
  switch (padded_dim / 32) {
    case 1:
      return launch_scan_for_queries<1>(p, shared_bytes, stream);
    case 2:
      return launch_scan_for_queries<2>(p, shared_bytes, stream);
    case 3:
      return launch_scan_for_queries<3>(p, shared_bytes, stream);
    default:
      return launch_scan_for_queries<4>(p, shared_bytes, stream);
  }
}

}  // namespace

Status SmallBatchSearch::run(const FusedRows& rows, const std::uint64_t* row_ids,
                             const float* queries, std::size_t query_count, int k, float* distance,
                             std::uint64_t* position, std::uint64_t* id, std::int32_t* overflow,
                             cudaStream_t stream) {
  if (rows.padded_dim == 0 || rows.padded_dim > int(kFusedMaxDim) || rows.padded_dim % 32 != 0) {
    return invalid_argument(
        message("small-batch search: padded dimension %lld (dim %lld)", rows.padded_dim, rows.dim));
  }
  if (k < 1 || k > int(kFusedMaxK)) {
    return invalid_argument(message("small-batch search: k %lld outside 1..%lld", k, kFusedMaxK));
  }
  if (query_count < 1 || query_count > kSmallBatchMaxQueries) {
    return invalid_argument(message("small-batch search: %lld queries (1..%lld)",
                                    (long long)query_count, (long long)kSmallBatchMaxQueries));
  }
  if (rows.rows >= (std::size_t{1} << 32) - kStepRows) {
    return invalid_argument(message("small-batch search: %lld rows (limit 2^32 - %lld)",
                                    (long long)rows.rows, kStepRows));
  }
  if (sm_count_ == 0) {
    int device = 0, sms = 0;
    GPUOPT_CUDA_TRY(cudaGetDevice(&device));
    GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    GPUOPT_RETURN_IF_ERROR(configure_scans());
    // About two blocks per SM keep enough 16-byte loads in flight to saturate HBM; the scratch
    // is sized once for the most queries and groups.
    max_groups_ = std::min(sms * kMaxBlocksPerSm, kMergeMaxGroups);
    const std::size_t entries = kSmallBatchMaxQueries * std::size_t(max_groups_) * kListKeep;
    const std::size_t slots = kSmallBatchMaxQueries * std::size_t(max_groups_);
    GPUOPT_RETURN_IF_ERROR(reserve<float>(candidate_lower_, entries));
    GPUOPT_RETURN_IF_ERROR(reserve<std::uint32_t>(candidate_key_, entries));
    GPUOPT_RETURN_IF_ERROR(reserve<std::uint32_t>(candidate_row_, entries));
    GPUOPT_RETURN_IF_ERROR(reserve<std::int32_t>(candidate_count_, slots));
    GPUOPT_RETURN_IF_ERROR(reserve<float>(group_threshold_, slots));
    sm_count_ = sms;
  }
  const std::size_t steps = (rows.rows + kStepRows - 1) / kStepRows;
  const std::size_t wanted_groups =
      std::min<std::size_t>(std::min(sm_count_ * 2, max_groups_), steps);
  ScanParams scan{};
  scan.rows = rows.scaled;
  scan.row_norm = rows.norm;
  scan.row_squared = rows.squared_norm;
  scan.allow = rows.allow_mask;
  scan.row_count = rows.rows;
  scan.rows_per_group = std::max<std::size_t>(1, (steps + wanted_groups - 1) /
                                                     std::max<std::size_t>(wanted_groups, 1)) *
                        kStepRows;
  scan.groups = static_cast<int>(
      rows.rows == 0 ? 1 : (rows.rows + scan.rows_per_group - 1) / scan.rows_per_group);
  scan.queries = queries;
  scan.query_count = static_cast<int>(query_count);
  scan.dim = rows.dim;
  scan.metric = rows.metric;
  scan.eps = static_cast<float>(fused_cosine_error_bound(rows.padded_dim));
  scan.k = k;
  scan.candidate_lower = candidate_lower_.data_as<float>();
  scan.candidate_key = candidate_key_.data_as<std::uint32_t>();
  scan.candidate_row = candidate_row_.data_as<std::uint32_t>();
  scan.candidate_count = candidate_count_.data_as<std::int32_t>();
  scan.group_threshold = group_threshold_.data_as<float>();
  if (scan.groups > max_groups_) {
    return internal_error(message("small-batch search: %lld groups above the scratch's %lld",
                                  scan.groups, max_groups_));
  }
  const std::size_t shared_bytes =
      query_count * kListCapacity * (sizeof(float) + sizeof(std::uint32_t));
  GPUOPT_RETURN_IF_ERROR(launch_scan_for_dim(rows.padded_dim, scan, shared_bytes, stream));
  MergeParams merge{};
  merge.vectors = rows.vectors;
  merge.row_ids = row_ids;
  merge.queries = queries;
  merge.dim = rows.dim;
  merge.metric = rows.metric;
  merge.k = k;
  merge.groups = scan.groups;
  merge.candidate_lower = scan.candidate_lower;
  merge.candidate_key = scan.candidate_key;
  merge.candidate_row = scan.candidate_row;
  merge.candidate_count = scan.candidate_count;
  merge.group_threshold = scan.group_threshold;
  merge.out_distance = distance;
  merge.out_position = position;
  merge.out_id = id;
  merge.overflow = overflow;
  k_small_merge<<<static_cast<unsigned>(query_count), kMergeThreads, kMergeSharedBytes, stream>>>(
      merge);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status positions_to_ids(const std::uint64_t* position, const std::uint64_t* row_ids,
                        std::size_t count, std::uint64_t* id, cudaStream_t stream) {
  if (count == 0) return ok_status();
  k_positions_to_ids<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(
      position, row_ids, count, id);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status clear_unanswered(const std::int32_t* flags, std::size_t query_count, int k, float* distance,
                        std::uint64_t* position, std::uint64_t* id, cudaStream_t stream) {
  const std::size_t count = query_count * std::size_t(k);
  if (count == 0) return ok_status();
  k_clear_unanswered<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(
      flags, count, k, distance, position, id);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::vector::detail
