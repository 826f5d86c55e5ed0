// IVF-Flat on the GPU: k-means with the distance step as a cuBLAS GEMM (TF32 tensor cores while
// training, fp32 for the final assignment) + a warp-per-row argmin + atomic centroid sums, and
// IVF search: a coarse fp32 GEMM against the centroids, a block-per-query top-nprobe selection in
// shared memory, then a scan grouped by list: the (query, probe) pairs are ordered by list, each
// tile of up to 8 queries sharing a list reads the list's rows (or one chunk of them) once and
// keeps a top-k per query, and a warp per query merges its pairs' partial top-k lists. Ties are
// broken by the lower position.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <string>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "ivf_gpu.hpp"

namespace gpuopt::vector::detail {

namespace {

using runtime::DeviceBuffer;

// nvcc cannot compile fmt; messages are built with snprintf here.
template <typename... Args>
std::string message(const char* format, Args... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

Status cublas_status(cublasStatus_t status, const char* expression) {
  if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
  std::string text = std::string(expression) + " failed: " + cublasGetStatusString(status) + " (" +
                     std::to_string(int(status)) + ")";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted(text);
  if (status == CUBLAS_STATUS_NOT_INITIALIZED) return unavailable(text);
  return internal_error(text);
}
#define GPUOPT_IVF_CUBLAS_TRY(expr) GPUOPT_RETURN_IF_ERROR(cublas_status((expr), #expr))

constexpr std::uint64_t kNoPosition = ~std::uint64_t{0};
constexpr int kScanThreads = 128;  // 4 warps, each 4 groups of 8 lanes (one row per group)
constexpr int kScanWarps = kScanThreads / 32;
constexpr int kGroupLanes = 8;
constexpr int kStepRows = kScanWarps * (32 / kGroupLanes) * 2;  // two rows per group and step
static_assert(kStepRows == 32, "a step's rows are one warp's lanes in the top-k update");
static_assert(kGpuIvfMaxK % 32 == 0, "the top-k insertion reads k in whole warps");
constexpr int kSelectThreads = 256;
constexpr int kPlanThreads = 1024;
// Queries a scan tile holds at most, and the shared memory the tile's arrays may take.
constexpr int kMaxQueryTile = 8;
constexpr std::size_t kTileSharedBudget = 47 * 1024;  // below 48 KiB with the static arrays
// Rows of a list one tile scans at least; larger lists are cut into at most kMaxRowChunks chunks
// so that one long list does not hold up the end of the scan.
constexpr std::size_t kMinChunkRows = 128;
constexpr std::size_t kMaxRowChunks = 8;
// Most bytes the partial top-k lists of one pass may take; larger batches run in several passes.
constexpr std::size_t kPartialBudget = std::size_t{256} << 20;
// Rows per GEMM chunk so that a [chunk, nlist] fp32 distance block stays near 1 GiB.
constexpr std::size_t kChunkElements = std::size_t{1} << 28;

// Grows `buffer` to at least `bytes` (contents not kept).
Status ensure_bytes(DeviceBuffer& buffer, std::size_t bytes) {
  if (buffer.size_bytes() >= bytes && !buffer.empty()) return ok_status();
  buffer.reset();
  GPUOPT_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(std::max<std::size_t>(bytes, 16)));
  return ok_status();
}

// dots [rows, nlist] row-major = rows [rows, dim] x centroids [nlist, dim]^T.
Status gemm_dots(cublasHandle_t handle, const float* centroids, std::size_t nlist,
                 const float* rows, std::size_t count, std::size_t dim, float* dots, bool tf32) {
  const float one = 1.0f, zero = 0.0f;
  GPUOPT_IVF_CUBLAS_TRY(cublasGemmEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nlist), static_cast<int>(count),
      static_cast<int>(dim), &one, centroids, CUDA_R_32F, static_cast<int>(dim), rows, CUDA_R_32F,
      static_cast<int>(dim), &zero, dots, CUDA_R_32F, static_cast<int>(nlist),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return ok_status();
}

// One warp per row: squared L2 norm.
__global__ void k_ivf_squared_norms(const float* __restrict__ vectors, std::size_t rows, int dim,
                                    float* __restrict__ norms) {
  std::size_t row = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* v = vectors + row * dim;
  float sum = 0;
  for (int i = lane; i < dim; i += 32) sum += v[i] * v[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (lane == 0) norms[row] = sum;
}

Status launch_norms(const float* vectors, std::size_t rows, std::size_t dim, float* norms,
                    cudaStream_t stream) {
  if (rows == 0) return ok_status();
  unsigned blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  k_ivf_squared_norms<<<blocks, 256, 0, stream>>>(vectors, rows, static_cast<int>(dim), norms);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

// One warp per row: the centroid minimising ||c||^2 - 2 x.c (ties: the lower index), and the
// squared distance ||x||^2 + that, clamped at 0.
__global__ void k_ivf_argmin(const float* __restrict__ dots, std::size_t rows, int nlist,
                             const float* __restrict__ centroid_norms,
                             const float* __restrict__ row_norms, std::uint32_t* __restrict__ lists,
                             float* __restrict__ distances) {
  std::size_t row = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* d = dots + row * std::size_t(nlist);
  float best = FLT_MAX;
  int best_list = 0x7fffffff;
  for (int c = lane; c < nlist; c += 32) {
    float value = centroid_norms[c] - 2.0f * d[c];
    if (value < best) {
      best = value;
      best_list = c;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    float other = __shfl_down_sync(0xffffffffu, best, offset);
    int other_list = __shfl_down_sync(0xffffffffu, best_list, offset);
    if (other < best || (other == best && other_list < best_list)) {
      best = other;
      best_list = other_list;
    }
  }
  if (lane == 0) {
    lists[row] = static_cast<std::uint32_t>(best_list);
    if (distances != nullptr) distances[row] = fmaxf(row_norms[row] + best, 0.0f);
  }
}

// Adds each row into its list's sum and count (one thread per element).
__global__ void k_ivf_accumulate(const float* __restrict__ rows, std::size_t count, int dim,
                                 const std::uint32_t* __restrict__ lists, float* __restrict__ sums,
                                 unsigned long long* __restrict__ counts) {
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * std::size_t(dim)) return;
  std::size_t row = i / dim;
  int t = static_cast<int>(i % dim);
  std::uint32_t list = lists[row];
  atomicAdd(&sums[std::size_t(list) * dim + t], rows[i]);
  if (t == 0) atomicAdd(&counts[list], 1ull);
}

// Distances to the centroids, then the nprobe smallest (ties: lower index), nearest first. One
// block per query; the row of distances lives in shared memory.
// Each probe also takes the next rank among its list's pairs (list_count, zeroed beforehand),
// which places it in the list-ordered pair array that k_ivf_plan fills.
__global__ void k_ivf_select_probes(const float* __restrict__ dots, int nlist,
                                    const float* __restrict__ centroid_norms,
                                    const float* __restrict__ query_norms, int nprobe,
                                    int* __restrict__ probes, int* __restrict__ list_count,
                                    int* __restrict__ rank) {
  extern __shared__ float shared_distance[];
  __shared__ float warp_best[kSelectThreads / 32];
  __shared__ int warp_list[kSelectThreads / 32];
  const int q = blockIdx.x;
  const float qn = query_norms[q];
  const float* d = dots + std::size_t(q) * nlist;
  for (int c = threadIdx.x; c < nlist; c += blockDim.x) {
    shared_distance[c] = fmaxf(qn + centroid_norms[c] - 2.0f * d[c], 0.0f);
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int p = 0; p < nprobe; ++p) {
    float best = FLT_MAX;
    int best_list = 0x7fffffff;
    for (int c = threadIdx.x; c < nlist; c += blockDim.x) {
      float value = shared_distance[c];
      if (value < best || (value == best && c < best_list)) {
        best = value;
        best_list = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      float other = __shfl_down_sync(0xffffffffu, best, offset);
      int other_list = __shfl_down_sync(0xffffffffu, best_list, offset);
      if (other < best || (other == best && other_list < best_list)) {
        best = other;
        best_list = other_list;
      }
    }
    if (lane == 0) {
      warp_best[warp] = best;
      warp_list[warp] = best_list;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kSelectThreads / 32; ++w) {
        if (warp_best[w] < best || (warp_best[w] == best && warp_list[w] < best_list)) {
          best = warp_best[w];
          best_list = warp_list[w];
        }
      }
      if (best_list >= nlist) best_list = 0;  // cannot happen while nprobe <= nlist
      probes[std::size_t(q) * nprobe + p] = best_list;
      rank[std::size_t(q) * nprobe + p] = atomicAdd(&list_count[best_list], 1);
      shared_distance[best_list] = FLT_MAX;
    }
    __syncthreads();
  }
}

__device__ float ivf_distance(int metric, float dot, float query_norm, float row_norm) {
  if (metric == 0) return fmaxf(query_norm + row_norm - 2.0f * dot, 0.0f);
  if (metric == 1) return -dot;
  float scale = query_norm * row_norm;
  return scale > 0 ? 1.0f - dot / sqrtf(scale) : 1.0f;
}

// Orders candidates by distance, then by position (the lower position wins a tie), so a top-k is
// one well-defined set whatever order the rows were visited in.
__device__ __forceinline__ bool ivf_before(float d, std::uint64_t p, float other_d,
                                           std::uint64_t other_p) {
  return d < other_d || (d == other_d && p < other_p);
}

// The rows of list `list` that tile chunk `chunk` covers: [begin, end) in the list arrays.
__device__ __forceinline__ int ivf_row_chunks(const std::uint64_t* offsets, int list,
                                              int chunk_rows) {
  const std::uint64_t rows = offsets[list + 1] - offsets[list];
  return static_cast<int>((rows + chunk_rows - 1) / chunk_rows);
}

// One block (kPlanThreads threads): from the per-list pair counts, the start of each list's pairs
// (pair_start) and of its tiles (tile_start, ceil(pairs / query_tile) * row chunks tiles per list),
// both [nlist + 1]; then sorted_pairs[pair_start[list] + rank[pair]] = pair.
__global__ void k_ivf_plan(const int* __restrict__ probes, const int* __restrict__ rank, int pairs,
                           const int* __restrict__ list_count, int nlist,
                           const std::uint64_t* __restrict__ offsets, int chunk_rows,
                           int query_tile, int* __restrict__ pair_start,
                           int* __restrict__ tile_start, int* __restrict__ sorted_pairs) {
  __shared__ int warp_pairs[kPlanThreads / 32], warp_tiles[kPlanThreads / 32];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int per_thread = (nlist + kPlanThreads - 1) / kPlanThreads;
  const int first = min(nlist, t * per_thread), last = min(nlist, first + per_thread);
  int my_pairs = 0, my_tiles = 0;
  for (int l = first; l < last; ++l) {
    my_pairs += list_count[l];
    my_tiles +=
        (list_count[l] + query_tile - 1) / query_tile * ivf_row_chunks(offsets, l, chunk_rows);
  }
  // Inclusive warp scans, then the warps' totals.
  int scan_pairs = my_pairs, scan_tiles = my_tiles;
  for (int offset = 1; offset < 32; offset *= 2) {
    int p = __shfl_up_sync(0xffffffffu, scan_pairs, offset);
    int q = __shfl_up_sync(0xffffffffu, scan_tiles, offset);
    if (lane >= offset) {
      scan_pairs += p;
      scan_tiles += q;
    }
  }
  if (lane == 31) {
    warp_pairs[warp] = scan_pairs;
    warp_tiles[warp] = scan_tiles;
  }
  __syncthreads();
  int before_pairs = scan_pairs - my_pairs, before_tiles = scan_tiles - my_tiles;
  for (int w = 0; w < warp; ++w) {
    before_pairs += warp_pairs[w];
    before_tiles += warp_tiles[w];
  }
  for (int l = first; l < last; ++l) {
    pair_start[l] = before_pairs;
    tile_start[l] = before_tiles;
    before_pairs += list_count[l];
    before_tiles +=
        (list_count[l] + query_tile - 1) / query_tile * ivf_row_chunks(offsets, l, chunk_rows);
  }
  if (t == kPlanThreads - 1) {
    pair_start[nlist] = before_pairs;
    tile_start[nlist] = before_tiles;
  }
  __syncthreads();  // pair_start is read back below by other threads of this block
  for (int i = t; i < pairs; i += kPlanThreads) sorted_pairs[pair_start[probes[i]] + rank[i]] = i;
}

// The scan. A tile is (list, up to QT of the queries probing it, one chunk of at most chunk_rows of
// its rows); blocks take tiles from a shared counter. The tile's queries sit in shared memory;
// each row is read once from global memory and dotted with all of them: a group of 8 lanes holds
// a row, a warp four rows, and each group takes two rows per step (32 rows a step in a block).
// The step's distances go to shared memory; then warp w keeps the top-k of queries w, w + 4, ...
// (sorted by distance, then position), inserting the step's candidates that beat its k-th entry.
// Each (pair, chunk) ends with its partial top-k in `part_*`, slot pair * max_chunks + chunk.
template <int QT, bool kVec4>
__global__ void __launch_bounds__(kScanThreads)
    k_ivf_scan_tiles(const float* __restrict__ queries, const float* __restrict__ query_norms,
                     int dim, int metric, int nprobe, int nlist, const int* __restrict__ pair_start,
                     const int* __restrict__ tile_start, const int* __restrict__ sorted_pairs,
                     int* __restrict__ tile_counter, const std::uint64_t* __restrict__ offsets,
                     int chunk_rows, int max_chunks, const float* __restrict__ vectors,
                     const float* __restrict__ norms, const std::uint64_t* __restrict__ positions,
                     const std::uint64_t* __restrict__ mask, int k,
                     float* __restrict__ part_distance, std::uint64_t* __restrict__ part_position) {
  extern __shared__ __align__(16) unsigned char tile_shared[];
  const int dim4 = (dim + 3) / 4 * 4;
  float* query = reinterpret_cast<float*>(tile_shared);                        // [QT, dim4]
  std::uint64_t* top_p = reinterpret_cast<std::uint64_t*>(query + QT * dim4);  // [QT, k]
  std::uint64_t* row_p = top_p + QT * k;                                       // [kStepRows]
  float* top_d = reinterpret_cast<float*>(row_p + kStepRows);                  // [QT, k]
  float* step_d = top_d + QT * k;                                              // [QT, kStepRows]
  float* qn = step_d + QT * kStepRows;                                         // [QT]
  int* pair = reinterpret_cast<int*>(qn + QT);                                 // [QT]
  __shared__ int tile_info[4];  // tile, list, chunk, query count
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = lane / kGroupLanes, lane_in_group = lane % kGroupLanes;
  const int total_tiles = tile_start[nlist];
  for (;;) {
    if (threadIdx.x == 0) {
      const int tile = atomicAdd(tile_counter, 1);
      tile_info[0] = tile;
      if (tile < total_tiles) {
        int lo = 0, hi = nlist;  // tile_start[lo] <= tile < tile_start[hi]
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (tile_start[mid] <= tile) {
            lo = mid;
          } else {
            hi = mid;
          }
        }
        const int chunks = ivf_row_chunks(offsets, lo, chunk_rows);
        const int local = tile - tile_start[lo];
        const int first_pair = pair_start[lo] + (local / chunks) * QT;
        tile_info[1] = lo;
        tile_info[2] = local % chunks;
        tile_info[3] = min(QT, pair_start[lo + 1] - first_pair);
        for (int j = 0; j < tile_info[3]; ++j) pair[j] = sorted_pairs[first_pair + j];
      }
    }
    __syncthreads();
    if (tile_info[0] >= total_tiles) return;
    const int list = tile_info[1], chunk = tile_info[2], nq = tile_info[3];
    for (int j = 0; j < nq; ++j) {
      const float* source = queries + std::size_t(pair[j] / nprobe) * dim;
      for (int t = threadIdx.x; t < dim4; t += kScanThreads) {
        query[j * dim4 + t] = t < dim ? source[t] : 0.0f;
      }
    }
    if (threadIdx.x < nq) qn[threadIdx.x] = query_norms[pair[threadIdx.x] / nprobe];
    for (int i = threadIdx.x; i < nq * k; i += kScanThreads) {
      top_d[i] = FLT_MAX;
      top_p[i] = kNoPosition;
    }
    __syncthreads();
    const std::uint64_t begin = offsets[list] + std::uint64_t(chunk) * chunk_rows;
    const std::uint64_t chunk_end = begin + std::uint64_t(chunk_rows);
    const std::uint64_t end = offsets[list + 1] < chunk_end ? offsets[list + 1] : chunk_end;
    for (std::uint64_t step = begin; step < end; step += kStepRows) {
      const int slot0 = warp * 4 + group, slot1 = slot0 + kStepRows / 2;
      const std::uint64_t r0 = step + slot0, r1 = step + slot1;
      std::uint64_t p0 = kNoPosition, p1 = kNoPosition;
      if (r0 < end) p0 = positions[r0];
      if (r1 < end) p1 = positions[r1];
      if (mask != nullptr) {
        if (p0 != kNoPosition && !((mask[p0 >> 6] >> (p0 & 63)) & 1u)) p0 = kNoPosition;
        if (p1 != kNoPosition && !((mask[p1 >> 6] >> (p1 & 63)) & 1u)) p1 = kNoPosition;
      }
      const bool ok0 = p0 != kNoPosition, ok1 = p1 != kNoPosition;
      float acc0[QT], acc1[QT];
#pragma unroll
      for (int j = 0; j < QT; ++j) acc0[j] = acc1[j] = 0.0f;
      if (ok0 || ok1) {
        // A row that is not scanned reads row r0 (or r1) of a valid pair instead; its sums are
        // dropped below.
        const std::uint64_t row0 = ok0 ? r0 : r1, row1 = ok1 ? r1 : r0;
        if constexpr (kVec4) {
          const float4* v0 = reinterpret_cast<const float4*>(vectors + row0 * dim);
          const float4* v1 = reinterpret_cast<const float4*>(vectors + row1 * dim);
          const float4* q4 = reinterpret_cast<const float4*>(query);
          const int words = dim / 4, stride = dim4 / 4;
#pragma unroll 2
          for (int c = lane_in_group; c < words; c += kGroupLanes) {
            const float4 a = __ldg(v0 + c), b = __ldg(v1 + c);
#pragma unroll
            for (int j = 0; j < QT; ++j) {
              if (j < nq) {
                const float4 x = q4[j * stride + c];
                acc0[j] = fmaf(a.x, x.x, fmaf(a.y, x.y, fmaf(a.z, x.z, fmaf(a.w, x.w, acc0[j]))));
                acc1[j] = fmaf(b.x, x.x, fmaf(b.y, x.y, fmaf(b.z, x.z, fmaf(b.w, x.w, acc1[j]))));
              }
            }
          }
        } else {
          const float* v0 = vectors + row0 * dim;
          const float* v1 = vectors + row1 * dim;
#pragma unroll 4
          for (int t = lane_in_group; t < dim; t += kGroupLanes) {
            const float a = __ldg(v0 + t), b = __ldg(v1 + t);
#pragma unroll
            for (int j = 0; j < QT; ++j) {
              if (j < nq) {
                const float x = query[j * dim4 + t];
                acc0[j] = fmaf(a, x, acc0[j]);
                acc1[j] = fmaf(b, x, acc1[j]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < QT; ++j) {
        for (int offset = kGroupLanes / 2; offset > 0; offset /= 2) {
          acc0[j] += __shfl_xor_sync(0xffffffffu, acc0[j], offset);
          acc1[j] += __shfl_xor_sync(0xffffffffu, acc1[j], offset);
        }
      }
      if (lane_in_group == 0) {
        const float n0 = ok0 ? norms[r0] : 0.0f, n1 = ok1 ? norms[r1] : 0.0f;
#pragma unroll
        for (int j = 0; j < QT; ++j) {
          if (j < nq) {
            step_d[j * kStepRows + slot0] =
                ok0 ? ivf_distance(metric, acc0[j], qn[j], n0) : FLT_MAX;
            step_d[j * kStepRows + slot1] =
                ok1 ? ivf_distance(metric, acc1[j], qn[j], n1) : FLT_MAX;
          }
        }
        row_p[slot0] = p0;
        row_p[slot1] = p1;
      }
      __syncthreads();
      // Warp w keeps the lists of queries w, w + kScanWarps, ...; lane i holds step row i.
      for (int j = warp; j < nq; j += kScanWarps) {
        float* my_d = top_d + j * k;
        std::uint64_t* my_p = top_p + j * k;
        const float d = step_d[j * kStepRows + lane];
        const std::uint64_t p = row_p[lane];
        unsigned pending = __ballot_sync(0xffffffffu, ivf_before(d, p, my_d[k - 1], my_p[k - 1]));
        while (pending != 0) {
          const int source = __ffs(pending) - 1;
          pending &= pending - 1;
          const float cd = __shfl_sync(0xffffffffu, d, source);
          const std::uint64_t cp = __shfl_sync(0xffffffffu, p, source);
          if (!ivf_before(cd, cp, my_d[k - 1], my_p[k - 1])) continue;  // same for every lane
          // Its rank among the kept entries, and the entries from there on move down by one.
          int at = 0;
          float keep_d[kGpuIvfMaxK / 32];
          std::uint64_t keep_p[kGpuIvfMaxK / 32];
#pragma unroll
          for (int m = 0; m < int(kGpuIvfMaxK / 32); ++m) {
            const int i = m * 32 + lane;
            keep_d[m] = FLT_MAX;
            keep_p[m] = kNoPosition;
            if (i < k) {
              keep_d[m] = my_d[i];
              keep_p[m] = my_p[i];
            }
            at += __popc(
                __ballot_sync(0xffffffffu, i < k && ivf_before(keep_d[m], keep_p[m], cd, cp)));
          }
          __syncwarp();
#pragma unroll
          for (int m = 0; m < int(kGpuIvfMaxK / 32); ++m) {
            const int i = m * 32 + lane;
            if (i >= at && i + 1 < k) {
              my_d[i + 1] = keep_d[m];
              my_p[i + 1] = keep_p[m];
            }
          }
          if (lane == 0) {
            my_d[at] = cd;
            my_p[at] = cp;
          }
          __syncwarp();
        }
      }
      __syncthreads();
    }
    // The partial top-k of each pair for this chunk.
    for (int j = warp; j < nq; j += kScanWarps) {
      const std::size_t slot = (std::size_t(pair[j]) * max_chunks + chunk) * k;
      for (int i = lane; i < k; i += 32) {
        part_distance[slot + i] = top_d[j * k + i];
        part_position[slot + i] = top_p[j * k + i];
      }
    }
    __syncthreads();  // before the next tile overwrites the shared arrays
  }
}

// One warp per query: merges its partial lists (one per probe and row chunk, each sorted) into
// the top-k. Lane l owns sources l, l + 32, ...; `head` (shared, [nprobe * max_chunks]) is each
// source's next entry; each lane keeps the best head among its sources, the warp takes the
// smallest, and only the winning lane looks again.
__global__ void k_ivf_merge(const int* __restrict__ probes, int nprobe,
                            const std::uint64_t* __restrict__ offsets, int chunk_rows,
                            int max_chunks, const float* __restrict__ part_distance,
                            const std::uint64_t* __restrict__ part_position, int k,
                            std::uint64_t* __restrict__ out_positions,
                            float* __restrict__ out_distances) {
  extern __shared__ int head[];
  const int q = blockIdx.x, lane = threadIdx.x;
  const int sources = nprobe * max_chunks;
  for (int s = lane; s < sources; s += 32) {
    const int probe = s / max_chunks, chunk = s % max_chunks;
    const int list = probes[std::size_t(q) * nprobe + probe];
    head[s] = chunk < ivf_row_chunks(offsets, list, chunk_rows) ? 0 : k;
  }
  __syncwarp();
  const std::size_t base = std::size_t(q) * sources;
  auto best_of_lane = [&](float& best_d, std::uint64_t& best_p, int& best_s) {
    best_d = FLT_MAX;
    best_p = kNoPosition;
    best_s = -1;
    for (int s = lane; s < sources; s += 32) {
      const int h = head[s];
      if (h >= k) continue;
      const std::size_t at = (base + s) * k + h;
      const std::uint64_t p = part_position[at];
      if (p == kNoPosition) continue;  // the rest of this list is empty
      const float d = part_distance[at];
      if (best_s < 0 || ivf_before(d, p, best_d, best_p)) {
        best_d = d;
        best_p = p;
        best_s = s;
      }
    }
  };
  float best_d;
  std::uint64_t best_p;
  int best_s;
  best_of_lane(best_d, best_p, best_s);
  for (int out = 0; out < k; ++out) {
    float d = best_d;
    std::uint64_t p = best_p;
    int s = best_s;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_d = __shfl_xor_sync(0xffffffffu, d, offset);
      const std::uint64_t other_p = __shfl_xor_sync(0xffffffffu, p, offset);
      const int other_s = __shfl_xor_sync(0xffffffffu, s, offset);
      if (other_s >= 0 && (s < 0 || ivf_before(other_d, other_p, d, p))) {
        d = other_d;
        p = other_p;
        s = other_s;
      }
    }
    const std::size_t slot = std::size_t(q) * k + out;
    if (lane == 0) {
      out_distances[slot] = s < 0 ? FLT_MAX : d;
      out_positions[slot] = s < 0 ? kNoPosition : p;
    }
    if (s < 0) continue;
    if (s % 32 == lane) {
      ++head[s];
      best_of_lane(best_d, best_p, best_s);
    }
    __syncwarp();
  }
}

int metric_code(Metric metric) {
  return metric == Metric::kL2 ? 0 : metric == Metric::kInnerProduct ? 1 : 2;
}

Status check_device(int device) {
  GPUOPT_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  if (devices == 0) return unavailable("no CUDA device is present");
  if (device < 0 || device >= devices) {
    return invalid_argument(message("GPU device %d does not exist (%d present)", device, devices));
  }
  return ok_status();
}

}  // namespace

struct GpuKmeans::State {
  int device = 0;
  std::size_t dim = 0;
  cublasHandle_t cublas = nullptr;
  cudaStream_t stream = nullptr;
  DeviceBuffer rows, row_norms, centroids, centroid_norms, dots, lists, distances, sums, counts;
  ~State() {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
  }
  Status upload_centroids(const float* host, std::size_t nlist) {
    GPUOPT_RETURN_IF_ERROR(ensure_bytes(centroids, nlist * dim * sizeof(float)));
    GPUOPT_RETURN_IF_ERROR(ensure_bytes(centroid_norms, nlist * sizeof(float)));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(centroids.data(), host, nlist * dim * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    return launch_norms(centroids.data_as<float>(), nlist, dim, centroid_norms.data_as<float>(),
                        stream);
  }
  // Assigns device rows [count, dim] (norms beside them) in chunks; lists/distances on device.
  Status assign_device(const float* device_rows, const float* device_norms, std::size_t count,
                       std::size_t nlist, std::uint32_t* device_lists, float* device_distances,
                       bool tf32) {
    const std::size_t chunk = std::max<std::size_t>(1, std::min(count, kChunkElements / nlist));
    GPUOPT_RETURN_IF_ERROR(ensure_bytes(dots, chunk * nlist * sizeof(float)));
    for (std::size_t begin = 0; begin < count; begin += chunk) {
      std::size_t n = std::min(chunk, count - begin);
      GPUOPT_RETURN_IF_ERROR(gemm_dots(cublas, centroids.data_as<float>(), nlist,
                                       device_rows + begin * dim, n, dim, dots.data_as<float>(),
                                       tf32));
      unsigned blocks = static_cast<unsigned>((n * 32 + 255) / 256);
      k_ivf_argmin<<<blocks, 256, 0, stream>>>(
          dots.data_as<float>(), n, static_cast<int>(nlist), centroid_norms.data_as<float>(),
          device_norms + begin, device_lists + begin,
          device_distances != nullptr ? device_distances + begin : nullptr);
      GPUOPT_CUDA_TRY_LAUNCH();
    }
    return ok_status();
  }
};

GpuKmeans::GpuKmeans(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuKmeans::~GpuKmeans() = default;

StatusOr<std::unique_ptr<GpuKmeans>> GpuKmeans::create(std::size_t dim, int device) {
  GPUOPT_RETURN_IF_ERROR(check_device(device));
  if (dim == 0) return invalid_argument("GPU k-means: dimension 0");
  auto state = std::make_unique<State>();
  state->device = device;
  state->dim = dim;
  GPUOPT_CUDA_TRY(cudaSetDevice(device));
  GPUOPT_IVF_CUBLAS_TRY(cublasCreate(&state->cublas));
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
  GPUOPT_IVF_CUBLAS_TRY(cublasSetStream(state->cublas, state->stream));
  return std::unique_ptr<GpuKmeans>(new GpuKmeans(std::move(state)));
}

StatusOr<std::vector<float>> GpuKmeans::train(const float* sample, std::size_t count,
                                              std::size_t nlist, int iterations,
                                              const CancelToken* cancel) {
  State& s = *state_;
  const std::size_t dim = s.dim;
  if (nlist == 0 || nlist > count) {
    return invalid_argument(message("GPU k-means: nlist %zu for %zu points", nlist, count));
  }
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.rows, count * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.row_norms, count * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.lists, count * sizeof(std::uint32_t)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.sums, nlist * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.counts, nlist * sizeof(unsigned long long)));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.rows.data(), sample, count * dim * sizeof(float),
                                  cudaMemcpyHostToDevice, s.stream));
  GPUOPT_RETURN_IF_ERROR(
      launch_norms(s.rows.data_as<float>(), count, dim, s.row_norms.data_as<float>(), s.stream));
  std::vector<float> centroids(sample, sample + nlist * dim);
  std::vector<float> sums(nlist * dim);
  std::vector<unsigned long long> device_counts(nlist);
  std::vector<std::size_t> counts(nlist);
  for (int iteration = 0; iteration < iterations; ++iteration) {
    GPUOPT_RETURN_IF_ERROR(s.upload_centroids(centroids.data(), nlist));
    GPUOPT_RETURN_IF_ERROR(s.assign_device(s.rows.data_as<float>(), s.row_norms.data_as<float>(),
                                           count, nlist, s.lists.data_as<std::uint32_t>(), nullptr,
                                           /*tf32=*/true));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(s.sums.data(), 0, nlist * dim * sizeof(float), s.stream));
    GPUOPT_CUDA_TRY(
        cudaMemsetAsync(s.counts.data(), 0, nlist * sizeof(unsigned long long), s.stream));
    std::size_t elements = count * dim;
    k_ivf_accumulate<<<static_cast<unsigned>((elements + 255) / 256), 256, 0, s.stream>>>(
        s.rows.data_as<float>(), count, static_cast<int>(dim), s.lists.data_as<std::uint32_t>(),
        s.sums.data_as<float>(), s.counts.data_as<unsigned long long>());
    GPUOPT_CUDA_TRY_LAUNCH();
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(sums.data(), s.sums.data(), nlist * dim * sizeof(float),
                                    cudaMemcpyDeviceToHost, s.stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(device_counts.data(), s.counts.data(),
                                    nlist * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                    s.stream));
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(s.stream));
    for (std::size_t c = 0; c < nlist; ++c) {
      counts[c] = static_cast<std::size_t>(device_counts[c]);
      if (counts[c] == 0) continue;
      for (std::size_t t = 0; t < dim; ++t) {
        centroids[c * dim + t] = sums[c * dim + t] / static_cast<float>(counts[c]);
      }
    }
    split_empty_lists(centroids.data(), counts.data(), nlist, dim);
    // The stream is idle here (synchronized above): stopping leaves nothing in flight.
    if (is_cancelled(cancel)) return cancelled("GPU k-means");
  }
  return centroids;
}

Status GpuKmeans::assign(const float* centroids, std::size_t nlist, const float* rows,
                         std::size_t count, std::uint32_t* lists, float* distances) {
  State& s = *state_;
  const std::size_t dim = s.dim;
  if (count == 0) return ok_status();
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  GPUOPT_RETURN_IF_ERROR(s.upload_centroids(centroids, nlist));
  // Rows travel in chunks so that a large collection needs no device copy of its own.
  const std::size_t chunk = std::min<std::size_t>(count, std::size_t{1} << 20);
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.rows, chunk * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.row_norms, chunk * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.lists, chunk * sizeof(std::uint32_t)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.distances, chunk * sizeof(float)));
  for (std::size_t begin = 0; begin < count; begin += chunk) {
    std::size_t n = std::min(chunk, count - begin);
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.rows.data(), rows + begin * dim, n * dim * sizeof(float),
                                    cudaMemcpyHostToDevice, s.stream));
    GPUOPT_RETURN_IF_ERROR(
        launch_norms(s.rows.data_as<float>(), n, dim, s.row_norms.data_as<float>(), s.stream));
    GPUOPT_RETURN_IF_ERROR(s.assign_device(s.rows.data_as<float>(), s.row_norms.data_as<float>(), n,
                                           nlist, s.lists.data_as<std::uint32_t>(),
                                           s.distances.data_as<float>(), /*tf32=*/false));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(lists + begin, s.lists.data(), n * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, s.stream));
    if (distances != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(distances + begin, s.distances.data(), n * sizeof(float),
                                      cudaMemcpyDeviceToHost, s.stream));
    }
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(s.stream));
  }
  return ok_status();
}

struct GpuIvfLists::State {
  int device = 0;
  std::size_t dim = 0, nlist = 0, rows = 0;
  Metric metric = Metric::kL2;
  cublasHandle_t cublas = nullptr;
  cudaStream_t stream = nullptr;
  DeviceBuffer centroids, centroid_norms, offsets, vectors, norms, positions;
  DeviceBuffer queries, query_norms, coarse, probes, mask, out_positions, out_distances;
  // The scan's plan (per-list pair counts + the tile counter, ranks, starts, list-ordered pairs)
  // and the partial top-k lists of each (pair, row chunk).
  DeviceBuffer list_count, rank, pair_start, tile_start, sorted_pairs, part_distances,
      part_positions;
  std::size_t max_list_rows = 0;
  int multiprocessors = 1;
  ~State() {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
  }
};

GpuIvfLists::GpuIvfLists(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuIvfLists::~GpuIvfLists() = default;
std::size_t GpuIvfLists::rows() const { return state_->rows; }
int GpuIvfLists::device() const { return state_->device; }

StatusOr<std::unique_ptr<GpuIvfLists>> GpuIvfLists::create(const IvfFlat& index, int device) {
  GPUOPT_RETURN_IF_ERROR(check_device(device));
  const std::size_t dim = index.dim(), nlist = index.nlist();
  if (dim == 0 || dim > kGpuIvfMaxDim) {
    return invalid_argument(
        message("GPU IVF: dimension %zu (the GPU search takes 1..%zu)", dim, kGpuIvfMaxDim));
  }
  auto state = std::make_unique<State>();
  State& s = *state;
  s.device = device;
  s.dim = dim;
  s.nlist = nlist;
  s.rows = index.rows();
  s.metric = index.metric();
  GPUOPT_CUDA_TRY(cudaSetDevice(device));
  GPUOPT_CUDA_TRY(
      cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  GPUOPT_IVF_CUBLAS_TRY(cublasCreate(&s.cublas));
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  GPUOPT_IVF_CUBLAS_TRY(cublasSetStream(s.cublas, s.stream));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.centroids, nlist * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.centroid_norms, nlist * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.offsets, (nlist + 1) * sizeof(std::uint64_t)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.vectors, s.rows * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.norms, s.rows * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.positions, s.rows * sizeof(std::uint64_t)));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.centroids.data(), index.centroids().data(),
                                  nlist * dim * sizeof(float), cudaMemcpyHostToDevice, s.stream));
  GPUOPT_RETURN_IF_ERROR(launch_norms(s.centroids.data_as<float>(), nlist, dim,
                                      s.centroid_norms.data_as<float>(), s.stream));
  std::vector<std::uint64_t> offsets(nlist + 1, 0);
  for (std::size_t l = 0; l < nlist; ++l) {
    const auto& list = index.list(l);
    const std::size_t n = list.positions.size(), at = offsets[l];
    offsets[l + 1] = at + n;
    s.max_list_rows = std::max(s.max_list_rows, n);
    if (n == 0) continue;
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.vectors.data_as<float>() + at * dim, list.vectors.data(),
                                    n * dim * sizeof(float), cudaMemcpyHostToDevice, s.stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.norms.data_as<float>() + at, list.norms.data(),
                                    n * sizeof(float), cudaMemcpyHostToDevice, s.stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.positions.data_as<std::uint64_t>() + at,
                                    list.positions.data(), n * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s.stream));
  }
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.offsets.data(), offsets.data(),
                                  offsets.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice,
                                  s.stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(s.stream));
  return std::unique_ptr<GpuIvfLists>(new GpuIvfLists(std::move(state)));
}

namespace {

// Shared memory of a scan tile holding `query_tile` queries (see k_ivf_scan_tiles).
std::size_t tile_shared_bytes(std::size_t query_tile, std::size_t dim, std::size_t k) {
  const std::size_t dim4 = (dim + 3) / 4 * 4;
  return query_tile * dim4 * sizeof(float) +
         query_tile * k * (sizeof(std::uint64_t) + sizeof(float)) +
         kStepRows * sizeof(std::uint64_t) + query_tile * kStepRows * sizeof(float) +
         query_tile * (sizeof(float) + sizeof(int));
}

struct ScanTiles {
  const float* queries;
  const float* query_norms;
  int dim, metric, nprobe, nlist;
  const int *pair_start, *tile_start, *sorted_pairs;
  int* tile_counter;
  const std::uint64_t* offsets;
  int chunk_rows, max_chunks;
  const float *vectors, *norms;
  const std::uint64_t *positions, *mask;
  int k;
  float* part_distance;
  std::uint64_t* part_position;
};

template <int QT, bool kVec4>
Status launch_scan_tiles(const ScanTiles& a, unsigned upper_tiles, int multiprocessors,
                         std::size_t shared, cudaStream_t stream) {
  auto kernel = k_ivf_scan_tiles<QT, kVec4>;
  int per_sm = 0;
  GPUOPT_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kScanThreads, shared));
  const unsigned resident = static_cast<unsigned>(std::max(1, per_sm) * multiprocessors);
  const unsigned blocks = std::max(1u, std::min(upper_tiles, resident));
  kernel<<<blocks, kScanThreads, shared, stream>>>(
      a.queries, a.query_norms, a.dim, a.metric, a.nprobe, a.nlist, a.pair_start, a.tile_start,
      a.sorted_pairs, a.tile_counter, a.offsets, a.chunk_rows, a.max_chunks, a.vectors, a.norms,
      a.positions, a.mask, a.k, a.part_distance, a.part_position);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <bool kVec4>
Status dispatch_scan_tiles(int query_tile, const ScanTiles& a, unsigned upper_tiles,
                           int multiprocessors, std::size_t shared, cudaStream_t stream) {
  switch (query_tile) {
    case 8:
      return launch_scan_tiles<8, kVec4>(a, upper_tiles, multiprocessors, shared, stream);
    case 4:
      return launch_scan_tiles<4, kVec4>(a, upper_tiles, multiprocessors, shared, stream);
    case 2:
      return launch_scan_tiles<2, kVec4>(a, upper_tiles, multiprocessors, shared, stream);
    default:
      return launch_scan_tiles<1, kVec4>(a, upper_tiles, multiprocessors, shared, stream);
  }
}

}  // namespace

StatusOr<GpuIvfLists::Result> GpuIvfLists::search(const float* queries, std::size_t query_count,
                                                  std::size_t k, std::size_t nprobe,
                                                  const std::uint64_t* allow_mask,
                                                  std::size_t mask_words) {
  State& s = *state_;
  if (k == 0 || k > kGpuIvfMaxK) {
    return invalid_argument(
        message("GPU IVF: k %zu (the GPU search takes 1..%zu)", k, kGpuIvfMaxK));
  }
  nprobe = std::clamp<std::size_t>(nprobe, 1, s.nlist);
  if (nprobe > kGpuIvfMaxProbe) {
    return invalid_argument(
        message("GPU IVF: nprobe %zu (the GPU search takes up to %zu)", nprobe, kGpuIvfMaxProbe));
  }
  const std::size_t select_shared = s.nlist * sizeof(float);
  constexpr std::size_t kMaxShared = 160 * 1024;
  if (select_shared > kMaxShared) {
    return invalid_argument(message("GPU IVF: %zu lists (the GPU search takes up to %zu)", s.nlist,
                                    kMaxShared / sizeof(float)));
  }
  Result result;
  result.positions.assign(query_count * k, kNoPosition);
  result.distances.assign(query_count * k, FLT_MAX);
  if (query_count == 0) return result;
  const std::size_t dim = s.dim;
  // The scan's shape: queries per tile (as many as fit the shared budget, up to 8), rows per
  // chunk, and the queries of one pass (bounded by the partial lists' memory).
  int query_tile = kMaxQueryTile;
  while (query_tile > 1 && tile_shared_bytes(query_tile, dim, k) > kTileSharedBudget) {
    query_tile /= 2;
  }
  const std::size_t tile_shared = tile_shared_bytes(query_tile, dim, k);
  if (tile_shared > kTileSharedBudget) {
    return invalid_argument(
        message("GPU IVF: dimension %zu with k %zu needs %zu bytes of shared "
                "memory per block (the GPU search has %zu)",
                dim, k, tile_shared, kTileSharedBudget));
  }
  std::size_t chunk_rows =
      std::max(kMinChunkRows, (s.max_list_rows + kMaxRowChunks - 1) / kMaxRowChunks);
  chunk_rows = (chunk_rows + kStepRows - 1) / kStepRows * kStepRows;
  const std::size_t max_chunks =
      std::max<std::size_t>(1, (s.max_list_rows + chunk_rows - 1) / chunk_rows);
  const std::size_t partial_per_query =
      nprobe * max_chunks * k * (sizeof(float) + sizeof(std::uint64_t));
  const std::size_t pass_queries =
      std::clamp<std::size_t>(kPartialBudget / partial_per_query, 1, query_count);
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.queries, query_count * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.query_norms, query_count * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.coarse, pass_queries * s.nlist * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.probes, pass_queries * nprobe * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.rank, pass_queries * nprobe * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.sorted_pairs, pass_queries * nprobe * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.list_count, (s.nlist + 1) * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.pair_start, (s.nlist + 1) * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.tile_start, (s.nlist + 1) * sizeof(int)));
  GPUOPT_RETURN_IF_ERROR(
      ensure_bytes(s.part_distances, pass_queries * nprobe * max_chunks * k * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(
      s.part_positions, pass_queries * nprobe * max_chunks * k * sizeof(std::uint64_t)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.out_positions, query_count * k * sizeof(std::uint64_t)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.out_distances, query_count * k * sizeof(float)));
  const std::uint64_t* device_mask = nullptr;
  if (allow_mask != nullptr) {
    if (mask_words * 64 < s.rows) {
      return invalid_argument(
          message("GPU IVF: allow mask of %zu words for %zu rows", mask_words, s.rows));
    }
    GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.mask, mask_words * sizeof(std::uint64_t)));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.mask.data(), allow_mask, mask_words * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s.stream));
    device_mask = s.mask.data_as<std::uint64_t>();
  }
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.queries.data(), queries, query_count * dim * sizeof(float),
                                  cudaMemcpyHostToDevice, s.stream));
  GPUOPT_RETURN_IF_ERROR(launch_norms(s.queries.data_as<float>(), query_count, dim,
                                      s.query_norms.data_as<float>(), s.stream));
  if (select_shared > 48 * 1024) {
    GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_ivf_select_probes,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(select_shared)));
  }
  int* list_count = s.list_count.data_as<int>();
  int* tile_counter = list_count + s.nlist;
  for (std::size_t first = 0; first < query_count; first += pass_queries) {
    const std::size_t n = std::min(pass_queries, query_count - first);
    const std::size_t pairs = n * nprobe;
    const float* pass_queries_data = s.queries.data_as<float>() + first * dim;
    const float* pass_norms = s.query_norms.data_as<float>() + first;
    GPUOPT_CUDA_TRY(cudaMemsetAsync(list_count, 0, (s.nlist + 1) * sizeof(int), s.stream));
    // Coarse quantiser in fp32, so the probes are the CPU's (ties aside).
    GPUOPT_RETURN_IF_ERROR(gemm_dots(s.cublas, s.centroids.data_as<float>(), s.nlist,
                                     pass_queries_data, n, dim, s.coarse.data_as<float>(),
                                     /*tf32=*/false));
    k_ivf_select_probes<<<static_cast<unsigned>(n), kSelectThreads, select_shared, s.stream>>>(
        s.coarse.data_as<float>(), static_cast<int>(s.nlist), s.centroid_norms.data_as<float>(),
        pass_norms, static_cast<int>(nprobe), s.probes.data_as<int>(), list_count,
        s.rank.data_as<int>());
    GPUOPT_CUDA_TRY_LAUNCH();
    k_ivf_plan<<<1, kPlanThreads, 0, s.stream>>>(
        s.probes.data_as<int>(), s.rank.data_as<int>(), static_cast<int>(pairs), list_count,
        static_cast<int>(s.nlist), s.offsets.data_as<std::uint64_t>(), static_cast<int>(chunk_rows),
        query_tile, s.pair_start.data_as<int>(), s.tile_start.data_as<int>(),
        s.sorted_pairs.data_as<int>());
    GPUOPT_CUDA_TRY_LAUNCH();
    ScanTiles tiles{pass_queries_data,
                    pass_norms,
                    static_cast<int>(dim),
                    metric_code(s.metric),
                    static_cast<int>(nprobe),
                    static_cast<int>(s.nlist),
                    s.pair_start.data_as<int>(),
                    s.tile_start.data_as<int>(),
                    s.sorted_pairs.data_as<int>(),
                    tile_counter,
                    s.offsets.data_as<std::uint64_t>(),
                    static_cast<int>(chunk_rows),
                    static_cast<int>(max_chunks),
                    s.vectors.data_as<float>(),
                    s.norms.data_as<float>(),
                    s.positions.data_as<std::uint64_t>(),
                    device_mask,
                    static_cast<int>(k),
                    s.part_distances.data_as<float>(),
                    s.part_positions.data_as<std::uint64_t>()};
    // At most ceil(pairs of a list / query_tile) * chunks tiles per list.
    const std::size_t upper_tiles =
        max_chunks * ((pairs + query_tile - 1) / query_tile + std::min(pairs, s.nlist));
    const unsigned upper = static_cast<unsigned>(std::min<std::size_t>(upper_tiles, 1u << 30));
    if (dim % 4 == 0) {
      GPUOPT_RETURN_IF_ERROR(dispatch_scan_tiles<true>(query_tile, tiles, upper, s.multiprocessors,
                                                       tile_shared, s.stream));
    } else {
      GPUOPT_RETURN_IF_ERROR(dispatch_scan_tiles<false>(query_tile, tiles, upper, s.multiprocessors,
                                                        tile_shared, s.stream));
    }
    k_ivf_merge<<<static_cast<unsigned>(n), 32, nprobe * max_chunks * sizeof(int), s.stream>>>(
        s.probes.data_as<int>(), static_cast<int>(nprobe), s.offsets.data_as<std::uint64_t>(),
        static_cast<int>(chunk_rows), static_cast<int>(max_chunks),
        s.part_distances.data_as<float>(), s.part_positions.data_as<std::uint64_t>(),
        static_cast<int>(k), s.out_positions.data_as<std::uint64_t>() + first * k,
        s.out_distances.data_as<float>() + first * k);
    GPUOPT_CUDA_TRY_LAUNCH();
  }
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result.positions.data(), s.out_positions.data(),
                                  query_count * k * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                  s.stream));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result.distances.data(), s.out_distances.data(),
                                  query_count * k * sizeof(float), cudaMemcpyDeviceToHost,
                                  s.stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(s.stream));
  return result;
}

}  // namespace gpuopt::vector::detail
