// CPU search kernels: register-tiled SIMD dot products (AVX-512 or AVX2+FMA picked at run time on
// x86-64, else portable 4-wide vectors), fused distance + top-k scans, and IVF-Flat training
// (k-means) and search.
#include "search_kernels.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

namespace gpuopt::vector::detail {

namespace {

// GPUOPT_X86_SIMD (a CMake option, on by default on x86-64) compiles the AVX-512 and AVX2 tiles
// and their run-time selection; without it, or on another architecture, the portable tile below is
// the only one.
#if GPUOPT_X86_SIMD && (defined(__x86_64__) || defined(__i386__))
#define GPUOPT_DOT_TILE_X86 1
#else
#define GPUOPT_DOT_TILE_X86 0
#endif

// One 4-query x 2-row register tile per step: 8 accumulators and 6 loads per W floats of dim.
// The vector width W is fixed per instruction set so the accumulators stay in registers. These are
// GCC/Clang generic vectors: the compiler emits the target's SIMD instructions for them (SSE on
// x86-64, NEON on aarch64) or scalar code where it has none.
typedef float Float16 __attribute__((vector_size(64)));
typedef float Float8 __attribute__((vector_size(32)));
typedef float Float4 __attribute__((vector_size(16)));

template <typename V, int W>
[[gnu::always_inline]] inline void dot_tile_generic(const float* queries, std::size_t query_count,
                                                    const float* rows, std::size_t row_count,
                                                    std::size_t dim, float* dots) {
  const std::size_t vector_dim = dim / W * W;
#define GPUOPT_LOAD(dst, src) \
  V dst;                      \
  __builtin_memcpy(&dst, (src), sizeof(V))
  std::size_t i = 0;
  for (; i + 4 <= query_count; i += 4) {
    const float* q0 = queries + i * dim;
    const float* q1 = q0 + dim;
    const float* q2 = q1 + dim;
    const float* q3 = q2 + dim;
    std::size_t j = 0;
    for (; j + 2 <= row_count; j += 2) {
      const float* x0 = rows + j * dim;
      const float* x1 = x0 + dim;
      V a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};
      for (std::size_t t = 0; t < vector_dim; t += W) {
        GPUOPT_LOAD(v0, x0 + t);
        GPUOPT_LOAD(v1, x1 + t);
        GPUOPT_LOAD(u0, q0 + t);
        a00 += u0 * v0;
        a01 += u0 * v1;
        GPUOPT_LOAD(u1, q1 + t);
        a10 += u1 * v0;
        a11 += u1 * v1;
        GPUOPT_LOAD(u2, q2 + t);
        a20 += u2 * v0;
        a21 += u2 * v1;
        GPUOPT_LOAD(u3, q3 + t);
        a30 += u3 * v0;
        a31 += u3 * v1;
      }
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int l = 0; l < W; ++l) {
        s[0] += a00[l];
        s[1] += a01[l];
        s[2] += a10[l];
        s[3] += a11[l];
        s[4] += a20[l];
        s[5] += a21[l];
        s[6] += a30[l];
        s[7] += a31[l];
      }
      for (std::size_t t = vector_dim; t < dim; ++t) {
        s[0] += q0[t] * x0[t];
        s[1] += q0[t] * x1[t];
        s[2] += q1[t] * x0[t];
        s[3] += q1[t] * x1[t];
        s[4] += q2[t] * x0[t];
        s[5] += q2[t] * x1[t];
        s[6] += q3[t] * x0[t];
        s[7] += q3[t] * x1[t];
      }
      for (int a = 0; a < 4; ++a) {
        dots[(i + a) * row_count + j] = s[2 * a];
        dots[(i + a) * row_count + j + 1] = s[2 * a + 1];
      }
    }
    for (; j < row_count; ++j) {
      const float* x0 = rows + j * dim;
      V a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (std::size_t t = 0; t < vector_dim; t += W) {
        GPUOPT_LOAD(v0, x0 + t);
        GPUOPT_LOAD(u0, q0 + t);
        GPUOPT_LOAD(u1, q1 + t);
        GPUOPT_LOAD(u2, q2 + t);
        GPUOPT_LOAD(u3, q3 + t);
        a0 += u0 * v0;
        a1 += u1 * v0;
        a2 += u2 * v0;
        a3 += u3 * v0;
      }
      float s[4] = {0, 0, 0, 0};
      for (int l = 0; l < W; ++l) {
        s[0] += a0[l];
        s[1] += a1[l];
        s[2] += a2[l];
        s[3] += a3[l];
      }
      for (std::size_t t = vector_dim; t < dim; ++t) {
        s[0] += q0[t] * x0[t];
        s[1] += q1[t] * x0[t];
        s[2] += q2[t] * x0[t];
        s[3] += q3[t] * x0[t];
      }
      for (int a = 0; a < 4; ++a) dots[(i + a) * row_count + j] = s[a];
    }
  }
  // Queries left over from the 4-query tiles: one row at a time with four accumulators over the
  // dimension, so each row is one sequential stream (reading four rows interleaved, as the tile
  // above does, ran ~25% slower for a lone query: measured on IVF lists of Fashion-MNIST).
  for (; i < query_count; ++i) {
    const float* q0 = queries + i * dim;
    std::size_t j = 0;
    for (; j < row_count; ++j) {
      const float* x0 = rows + j * dim;
      V c0 = {}, c1 = {}, c2 = {}, c3 = {};
      std::size_t t = 0;
      for (; t + 4 * W <= vector_dim; t += 4 * W) {
        GPUOPT_LOAD(u0, q0 + t);
        GPUOPT_LOAD(v0, x0 + t);
        GPUOPT_LOAD(u1, q0 + t + W);
        GPUOPT_LOAD(v1, x0 + t + W);
        GPUOPT_LOAD(u2, q0 + t + 2 * W);
        GPUOPT_LOAD(v2, x0 + t + 2 * W);
        GPUOPT_LOAD(u3, q0 + t + 3 * W);
        GPUOPT_LOAD(v3, x0 + t + 3 * W);
        c0 += u0 * v0;
        c1 += u1 * v1;
        c2 += u2 * v2;
        c3 += u3 * v3;
      }
      for (; t < vector_dim; t += W) {
        GPUOPT_LOAD(u0, q0 + t);
        GPUOPT_LOAD(v0, x0 + t);
        c0 += u0 * v0;
      }
      c0 += c1 + c2 + c3;
      float sum = 0;
      for (int l = 0; l < W; ++l) sum += c0[l];
      for (std::size_t t2 = vector_dim; t2 < dim; ++t2) sum += q0[t2] * x0[t2];
      dots[i * row_count + j] = sum;
    }
  }
#undef GPUOPT_LOAD
}

using DotTileFunction = void (*)(const float*, std::size_t, const float*, std::size_t, std::size_t,
                                 float*);

// The nearest centroid as a blocked GEMM (rows x centroids^T), the k-means assignment step. Rows
// are packed in panels of MR (a[k * MR + r]) and centroids in panels of NR = NV * W (b[k * NR +
// j]), both zero-padded, so a register tile of MR x NR dot products takes NV vector loads and MR
// broadcasts per step of the dimension, against 6 loads per 8 products in the dot tile above.
// A task is kNearestRowBlock rows: its packed rows stay in L2 while each centroid panel's K block
// (kNearestKBlock x NR) is reused from L1 by every row panel; dots land in a [row block, centroid
// block] buffer and each centroid block's argmin runs after it.
constexpr std::size_t kNearestRowBlock = 96;  // a multiple of every MR below
constexpr std::size_t kNearestKBlock = 256;
constexpr std::size_t kNearestCentroidBlock = 512;  // a multiple of every NR below

struct NearestJob {
  const float* rows;  // [count, dim]
  std::size_t count;
  const float* packed_centroids;  // [padded_nlist / NR][dim][NR]
  const float* padded_norms;      // [padded_nlist], +inf past nlist
  std::size_t nlist;
  std::size_t padded_nlist;
  std::size_t dim;
  std::uint32_t* lists;  // [count]
  float* distances;      // [count] or null
};

struct NearestScratch {
  std::vector<float> packed_rows, dots, row_norms, best;
  std::vector<std::uint32_t> best_list;
};

// dots[r * ldc + j] (+)= sum_k a[k * MR + r] * b[k * NR + j] for r < MR, j < NR.
template <typename V, int W, int MR, int NV>
[[gnu::always_inline]] inline void gemm_tile(const float* a, const float* b, std::size_t kc,
                                             float* c, std::size_t ldc, bool accumulate) {
  constexpr int NR = NV * W;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  }
  for (std::size_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * NR + v * W, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float av = a[k * MR + r];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += bv[v] * av;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = c + r * ldc + v * W;
      if (accumulate) {
        V old;
        __builtin_memcpy(&old, out, sizeof(V));
        acc[r][v] += old;
      }
      __builtin_memcpy(out, &acc[r][v], sizeof(V));
    }
  }
}

// The nearest centroid of rows [m0, m0 + kNearestRowBlock) of the job.
template <typename V, int W, int MR, int NV>
[[gnu::always_inline]] inline void nearest_rows_generic(const NearestJob& job, std::size_t m0,
                                                        NearestScratch& s) {
  constexpr std::size_t NR = std::size_t{NV} * W;
  static_assert(kNearestRowBlock % MR == 0 && kNearestCentroidBlock % NR == 0);
  const std::size_t dim = job.dim;
  const std::size_t rows = std::min(kNearestRowBlock, job.count - m0);
  const std::size_t padded_rows = (rows + MR - 1) / MR * MR;
  s.packed_rows.resize(padded_rows * dim);
  s.row_norms.resize(rows);
  for (std::size_t r = 0; r < padded_rows; ++r) {
    float* out = s.packed_rows.data() + r / MR * MR * dim + r % MR;
    if (r < rows) {
      const float* in = job.rows + (m0 + r) * dim;
      for (std::size_t k = 0; k < dim; ++k) out[k * MR] = in[k];
      s.row_norms[r] = dot(in, in, dim);
    } else {
      for (std::size_t k = 0; k < dim; ++k) out[k * MR] = 0.0f;
    }
  }
  s.best.assign(rows, __builtin_inff());
  s.best_list.assign(rows, 0);
  s.dots.resize(kNearestRowBlock * kNearestCentroidBlock);
  float* dots = s.dots.data();
  for (std::size_t n0 = 0; n0 < job.padded_nlist; n0 += kNearestCentroidBlock) {
    const std::size_t centroids = std::min(kNearestCentroidBlock, job.padded_nlist - n0);
    for (std::size_t k0 = 0; k0 < dim; k0 += kNearestKBlock) {
      const std::size_t kc = std::min(kNearestKBlock, dim - k0);
      for (std::size_t n = 0; n < centroids; n += NR) {
        const float* b = job.packed_centroids + (n0 + n) * dim + k0 * NR;
        for (std::size_t m = 0; m < padded_rows; m += MR) {
          gemm_tile<V, W, MR, NV>(s.packed_rows.data() + m * dim + k0 * MR, b, kc,
                                  dots + m * kNearestCentroidBlock + n, kNearestCentroidBlock,
                                  k0 != 0);
        }
      }
    }
    // Per lane, the first smallest distance and its index, then the lanes' smallest, lowest
    // index first: the same choice as a scan with `<` in index order. Padded centroids have an
    // infinite norm, so they never win.
    using Mask = decltype(V{} < V{});
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row_dots = dots + r * kNearestCentroidBlock;
      const float* norms = job.padded_norms + n0;
      const float row_norm = s.row_norms[r];
      V lane_best = V{} + __builtin_inff();
      Mask lane_index = {}, index = {};
      for (int l = 0; l < W; ++l) index[l] = l;
      for (std::size_t j = 0; j < centroids; j += W) {
        V dot_values, centroid_norms;
        __builtin_memcpy(&dot_values, row_dots + j, sizeof(V));
        __builtin_memcpy(&centroid_norms, norms + j, sizeof(V));
        // distance_from_dot for L2 (2 * dot is exact, so contraction cannot change the value).
        V distance = row_norm + centroid_norms - 2.0f * dot_values;
        distance = distance > 0.0f ? distance : V{};
        Mask less = distance < lane_best;
        lane_best = less ? distance : lane_best;
        lane_index = less ? index : lane_index;
        index += W;
      }
      float best = __builtin_inff();
      std::size_t best_index = 0;
      for (int l = 0; l < W; ++l) {
        const auto at = static_cast<std::size_t>(lane_index[l]);
        if (lane_best[l] < best || (lane_best[l] == best && at < best_index)) {
          best = lane_best[l];
          best_index = at;
        }
      }
      if (best < s.best[r]) {
        s.best[r] = best;
        s.best_list[r] = static_cast<std::uint32_t>(n0 + best_index);
      }
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    job.lists[m0 + r] = s.best_list[r];
    if (job.distances != nullptr) job.distances[m0 + r] = s.best[r];
  }
}

using NearestRowsFunction = void (*)(const NearestJob&, std::size_t, NearestScratch&);

struct KernelChoice {
  DotTileFunction dot_tile;
  NearestRowsFunction nearest_rows;
  std::size_t nearest_nr;  // the centroid panel width nearest_rows reads
  const char* name;
};

void nearest_rows_portable(const NearestJob& job, std::size_t m0, NearestScratch& s) {
  nearest_rows_generic<Float4, 4, 6, 2>(job, m0, s);
}

#if GPUOPT_DOT_TILE_X86
__attribute__((target("avx512f,avx512vl,fma"))) void dot_tile_avx512(const float* q, std::size_t nq,
                                                                     const float* x, std::size_t nr,
                                                                     std::size_t dim, float* out) {
  dot_tile_generic<Float16, 16>(q, nq, x, nr, dim, out);
}
__attribute__((target("avx2,fma"))) void dot_tile_avx2(const float* q, std::size_t nq,
                                                       const float* x, std::size_t nr,
                                                       std::size_t dim, float* out) {
  dot_tile_generic<Float8, 8>(q, nq, x, nr, dim, out);
}
// 12 x 32 tiles: 24 of the 32 vector registers accumulate.
__attribute__((target("avx512f,avx512vl,fma"))) void nearest_rows_avx512(const NearestJob& job,
                                                                         std::size_t m0,
                                                                         NearestScratch& s) {
  nearest_rows_generic<Float16, 16, 12, 2>(job, m0, s);
}
// 6 x 16 tiles: 12 of the 16 vector registers accumulate.
__attribute__((target("avx2,fma"))) void nearest_rows_avx2(const NearestJob& job, std::size_t m0,
                                                           NearestScratch& s) {
  nearest_rows_generic<Float8, 8, 6, 2>(job, m0, s);
}
#endif

void dot_tile_portable_function(const float* q, std::size_t nq, const float* x, std::size_t nr,
                                std::size_t dim, float* out) {
  dot_tile_generic<Float4, 4>(q, nq, x, nr, dim, out);
}

constexpr KernelChoice kPortableKernels = {dot_tile_portable_function, nearest_rows_portable, 8,
                                           "portable"};

KernelChoice select_kernels() {
#if GPUOPT_DOT_TILE_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) {
    return {dot_tile_avx512, nearest_rows_avx512, 32, "avx512"};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {dot_tile_avx2, nearest_rows_avx2, 16, "avx2"};
  }
#endif
  return kPortableKernels;
}

const KernelChoice kKernels = select_kernels();
const DotTileFunction kDotTile = kKernels.dot_tile;

constexpr std::size_t kQueryTile = 32;
constexpr std::size_t kRowTile = 128;
constexpr std::size_t kChunkRows = 4096;
// Multiply-adds below which a scan stays on the calling thread. Starting a thread costs tens of
// microseconds; 5e5 multiply-adds stream ~2 MB of vectors (~150 us on one core here), so above
// that a second thread pays for itself (one IVF query at nprobe 16 on Fashion-MNIST is 7.5e5).
constexpr double kParallelMinWork = 5e5;

std::uint64_t row_position(const RowBlock& block, std::size_t row) {
  return block.positions != nullptr ? block.positions[row] : block.first_position + row;
}

// Scans rows [begin, end) of `block` for queries [q_begin, q_end), pushing into `topk`.
void scan_rows(const RowBlock& block, std::size_t begin, std::size_t end, std::size_t dim,
               Metric metric, const float* queries, const float* query_norms, std::size_t q_begin,
               std::size_t q_end, const AllowMask* mask, std::vector<TopK>& topk,
               std::vector<float>& dots) {
  std::size_t tile_queries = q_end - q_begin;
  dots.resize(kQueryTile * kRowTile);
  for (std::size_t r0 = begin; r0 < end; r0 += kRowTile) {
    std::size_t tile_rows = std::min(kRowTile, end - r0);
    kDotTile(queries + q_begin * dim, tile_queries, block.vectors + r0 * dim, tile_rows, dim,
             dots.data());
    for (std::size_t q = 0; q < tile_queries; ++q) {
      TopK& best = topk[q_begin + q];
      const float* row_dots = dots.data() + q * tile_rows;
      float query_norm = query_norms[q_begin + q];
      for (std::size_t r = 0; r < tile_rows; ++r) {
        float distance = distance_from_dot(metric, row_dots[r], query_norm, block.norms[r0 + r]);
        if (distance >= best.threshold()) continue;
        std::uint64_t position = row_position(block, r0 + r);
        if (!allowed(mask, position)) continue;
        best.push(distance, position);
      }
    }
  }
}

}  // namespace

void dot_tile(const float* queries, std::size_t query_count, const float* rows,
              std::size_t row_count, std::size_t dim, float* dots) {
  kDotTile(queries, query_count, rows, row_count, dim, dots);
}

void dot_tile_portable(const float* queries, std::size_t query_count, const float* rows,
                       std::size_t row_count, std::size_t dim, float* dots) {
  dot_tile_portable_function(queries, query_count, rows, row_count, dim, dots);
}

const char* dot_tile_isa() { return kKernels.name; }

float dot(const float* a, const float* b, std::size_t dim) {
  float out = 0;
  kDotTile(a, 1, b, 1, dim, &out);
  return out;
}

void squared_norms(const float* rows, std::size_t row_count, std::size_t dim, float* norms) {
  for (std::size_t i = 0; i < row_count; ++i) norms[i] = dot(rows + i * dim, rows + i * dim, dim);
}

float direct_distance(Metric metric, const float* a, const float* b, std::size_t dim) {
  double sum = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < dim; ++i) {
    if (metric == Metric::kL2) {
      double d = double(a[i]) - double(b[i]);
      sum += d * d;
    } else {
      sum += double(a[i]) * double(b[i]);
      aa += double(a[i]) * double(a[i]);
      bb += double(b[i]) * double(b[i]);
    }
  }
  switch (metric) {
    case Metric::kL2:
      return static_cast<float>(sum);
    case Metric::kInnerProduct:
      return static_cast<float>(-sum);
    case Metric::kCosine:
      return aa > 0 && bb > 0 ? static_cast<float>(1.0 - sum / std::sqrt(aa * bb)) : 1.0f;
  }
  return 0;
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

void parallel_for(std::size_t tasks, int threads,
                  const std::function<void(std::size_t, int)>& body) {
  int workers = static_cast<int>(std::min<std::size_t>(tasks, resolve_threads(threads)));
  if (workers <= 1) {
    for (std::size_t t = 0; t < tasks; ++t) body(t, 0);
    return;
  }
  std::atomic<std::size_t> next{0};
  auto work = [&](int worker) {
    for (std::size_t t = next++; t < tasks; t = next++) body(t, worker);
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& thread : pool) thread.join();
}

std::vector<TopK> exact_scan(std::span<const RowBlock> blocks, std::size_t dim, Metric metric,
                             const float* queries, std::size_t query_count, std::size_t k,
                             const AllowMask* mask, int threads, const CancelToken* cancel) {
  std::vector<float> query_norms(query_count);
  squared_norms(queries, query_count, dim, query_norms.data());
  struct Chunk {
    std::size_t block, begin, end;
  };
  std::vector<Chunk> chunks;
  std::size_t total_rows = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    total_rows += blocks[b].rows;
    for (std::size_t r = 0; r < blocks[b].rows; r += kChunkRows) {
      chunks.push_back({b, r, std::min(blocks[b].rows, r + kChunkRows)});
    }
  }
  std::size_t query_tiles = (query_count + kQueryTile - 1) / kQueryTile;
  std::size_t tasks = chunks.size() * query_tiles;
  // Small scans stay on the calling thread: starting threads would cost more than they save.
  double work = double(total_rows) * double(query_count) * double(dim);
  int workers = work < kParallelMinWork ? 1 : resolve_threads(threads);
  std::vector<std::vector<TopK>> per_worker(static_cast<std::size_t>(workers),
                                            std::vector<TopK>(query_count, TopK(k)));
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(workers));
  parallel_for(tasks, workers, [&](std::size_t task, int worker) {
    if (is_cancelled(cancel)) return;
    const Chunk& chunk = chunks[task / query_tiles];
    std::size_t q_begin = (task % query_tiles) * kQueryTile;
    std::size_t q_end = std::min(query_count, q_begin + kQueryTile);
    scan_rows(blocks[chunk.block], chunk.begin, chunk.end, dim, metric, queries, query_norms.data(),
              q_begin, q_end, mask, per_worker[worker], buffers[worker]);
  });
  for (std::size_t w = 1; w < per_worker.size(); ++w) {
    for (std::size_t q = 0; q < query_count; ++q) per_worker[0][q].merge(per_worker[w][q]);
  }
  return std::move(per_worker[0]);
}

namespace {

// Fewer rows than this take exact_scan: packing every centroid would cost more than it saves.
constexpr std::size_t kNearestGemmMinRows = 16;

void nearest_centroids_with(const KernelChoice& kernels, const float* rows, std::size_t count,
                            const float* centroids, const float* centroid_norms, std::size_t nlist,
                            std::size_t dim, std::uint32_t* lists, float* distances, int threads,
                            const CancelToken* cancel) {
  if (count == 0 || nlist == 0) return;
  if (count < kNearestGemmMinRows || dim == 0) {
    RowBlock centroid_block{centroids, centroid_norms, nlist, 0, nullptr};
    auto found = exact_scan({&centroid_block, 1}, dim, Metric::kL2, rows, count, 1, nullptr,
                            threads, cancel);
    if (is_cancelled(cancel)) return;
    for (std::size_t i = 0; i < count; ++i) {
      lists[i] = static_cast<std::uint32_t>(found[i].items()[0].position);
      if (distances != nullptr) distances[i] = found[i].items()[0].distance;
    }
    return;
  }
  const std::size_t nr = kernels.nearest_nr;
  const std::size_t padded_nlist = (nlist + nr - 1) / nr * nr;
  std::vector<float> packed(padded_nlist * dim, 0.0f);
  for (std::size_t c = 0; c < nlist; ++c) {
    float* out = packed.data() + c / nr * nr * dim + c % nr;
    const float* in = centroids + c * dim;
    for (std::size_t k = 0; k < dim; ++k) out[k * nr] = in[k];
  }
  std::vector<float> padded_norms(padded_nlist, __builtin_inff());
  std::copy_n(centroid_norms, nlist, padded_norms.data());
  const NearestJob job{rows, count, packed.data(), padded_norms.data(), nlist, padded_nlist,
                       dim,  lists, distances};
  const std::size_t tasks = (count + kNearestRowBlock - 1) / kNearestRowBlock;
  double work = double(count) * double(nlist) * double(dim);
  int workers = work < kParallelMinWork ? 1 : resolve_threads(threads);
  workers = static_cast<int>(std::min<std::size_t>(tasks, static_cast<std::size_t>(workers)));
  std::vector<NearestScratch> scratch(static_cast<std::size_t>(workers));
  parallel_for(tasks, workers, [&](std::size_t task, int worker) {
    if (is_cancelled(cancel)) return;
    kernels.nearest_rows(job, task * kNearestRowBlock, scratch[worker]);
  });
}

}  // namespace

void nearest_centroids(const float* rows, std::size_t count, const float* centroids,
                       const float* centroid_norms, std::size_t nlist, std::size_t dim,
                       std::uint32_t* lists, float* distances, int threads,
                       const CancelToken* cancel) {
  nearest_centroids_with(kKernels, rows, count, centroids, centroid_norms, nlist, dim, lists,
                         distances, threads, cancel);
}

void nearest_centroids_portable(const float* rows, std::size_t count, const float* centroids,
                                const float* centroid_norms, std::size_t nlist, std::size_t dim,
                                std::uint32_t* lists, float* distances, int threads,
                                const CancelToken* cancel) {
  nearest_centroids_with(kPortableKernels, rows, count, centroids, centroid_norms, nlist, dim,
                         lists, distances, threads, cancel);
}

std::size_t default_nlist(std::size_t rows) {
  std::size_t nlist = 1;
  while (nlist * nlist < 16 * rows) nlist *= 2;  // about 4*sqrt(rows)
  return nlist;
}

std::vector<float> ivf_training_sample(std::span<const RowBlock> blocks, std::size_t dim,
                                       std::size_t nlist, const IvfParams& params) {
  std::size_t total = 0;
  for (const auto& block : blocks) total += block.rows;
  std::mt19937_64 rng(params.seed);
  std::size_t sample_count =
      std::min(total, nlist * std::max<std::size_t>(1, params.max_train_points_per_list));
  std::vector<std::size_t> order(total);
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = 0; i < sample_count; ++i) {
    std::uniform_int_distribution<std::size_t> pick(i, total - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  std::vector<std::size_t> block_starts;
  for (std::size_t b = 0, s = 0; b < blocks.size(); s += blocks[b].rows, ++b) {
    block_starts.push_back(s);
  }
  std::vector<float> sample(sample_count * dim);
  for (std::size_t i = 0; i < sample_count; ++i) {
    std::size_t flat = order[i];
    std::size_t b =
        static_cast<std::size_t>(std::upper_bound(block_starts.begin(), block_starts.end(), flat) -
                                 block_starts.begin() - 1);
    std::memcpy(&sample[i * dim], blocks[b].vectors + (flat - block_starts[b]) * dim,
                dim * sizeof(float));
  }
  return sample;
}

std::vector<float> kmeans_cpu(const float* sample, std::size_t count, std::size_t dim,
                              std::size_t nlist, int iterations, int threads,
                              const CancelToken* cancel) {
  std::vector<float> centroids(sample, sample + nlist * dim);
  std::vector<float> centroid_norms(nlist);
  std::vector<std::uint32_t> assignment(count);
  std::vector<std::size_t> counts(nlist), offsets(nlist + 1, 0), cursor(nlist), members(count);
  constexpr std::size_t kListsPerTask = 16;
  const int update_workers =
      double(count) * double(dim) < kParallelMinWork ? 1 : resolve_threads(threads);
  std::vector<std::vector<double>> sums(static_cast<std::size_t>(update_workers),
                                        std::vector<double>(dim));
  for (int iteration = 0; iteration < iterations; ++iteration) {
    if (is_cancelled(cancel)) return centroids;
    squared_norms(centroids.data(), nlist, dim, centroid_norms.data());
    nearest_centroids(sample, count, centroids.data(), centroid_norms.data(), nlist, dim,
                      assignment.data(), nullptr, threads, cancel);
    if (is_cancelled(cancel)) return centroids;  // the assignment is incomplete
    // Each list's rows in row order (a counting sort), so lists can be summed in parallel with
    // the same float64 sums, in the same order, on any thread count.
    std::fill(counts.begin(), counts.end(), 0);
    for (std::size_t i = 0; i < count; ++i) ++counts[assignment[i]];
    for (std::size_t c = 0; c < nlist; ++c) offsets[c + 1] = offsets[c] + counts[c];
    std::copy(offsets.begin(), offsets.end() - 1, cursor.begin());
    for (std::size_t i = 0; i < count; ++i) members[cursor[assignment[i]]++] = i;
    const std::size_t list_tasks = (nlist + kListsPerTask - 1) / kListsPerTask;
    parallel_for(list_tasks, update_workers, [&](std::size_t task, int worker) {
      std::vector<double>& sum = sums[static_cast<std::size_t>(worker)];
      for (std::size_t c = task * kListsPerTask; c < std::min(nlist, (task + 1) * kListsPerTask);
           ++c) {
        if (counts[c] == 0) continue;
        std::fill(sum.begin(), sum.end(), 0.0);
        for (std::size_t m = offsets[c]; m < offsets[c + 1]; ++m) {
          const float* x = sample + members[m] * dim;
          for (std::size_t t = 0; t < dim; ++t) sum[t] += x[t];
        }
        for (std::size_t t = 0; t < dim; ++t) {
          centroids[c * dim + t] = static_cast<float>(sum[t] / double(counts[c]));
        }
      }
    });
    split_empty_lists(centroids.data(), counts.data(), nlist, dim);
  }
  return centroids;
}

void split_empty_lists(float* centroids, std::size_t* counts, std::size_t nlist, std::size_t dim) {
  // Empty lists take a slightly moved copy of the largest list's centroid (as FAISS does), so
  // the next assignment splits that list in two.
  for (std::size_t c = 0; c < nlist; ++c) {
    if (counts[c] != 0) continue;
    std::size_t largest =
        static_cast<std::size_t>(std::max_element(counts, counts + nlist) - counts);
    for (std::size_t t = 0; t < dim; ++t) {
      float value = centroids[largest * dim + t];
      float nudge = (t % 2 ? 1.0f : -1.0f) * 1e-3f * (std::fabs(value) + 1e-3f);
      centroids[c * dim + t] = value + nudge;
      centroids[largest * dim + t] = value - nudge;
    }
    counts[c] = counts[largest] / 2;
    counts[largest] -= counts[c];
  }
}

double kmeans_inertia(const float* rows, std::size_t count, std::size_t dim, const float* centroids,
                      std::size_t nlist, int threads) {
  std::vector<float> centroid_norms(nlist);
  squared_norms(centroids, nlist, dim, centroid_norms.data());
  std::vector<std::uint32_t> nearest(count);
  nearest_centroids(rows, count, centroids, centroid_norms.data(), nlist, dim, nearest.data(),
                    nullptr, threads);
  double total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const float* c = centroids + std::size_t{nearest[i]} * dim;
    double d = 0;
    for (std::size_t t = 0; t < dim; ++t) {
      double diff = double(rows[i * dim + t]) - double(c[t]);
      d += diff * diff;
    }
    total += d;
  }
  return total;
}

IvfFlat IvfFlat::with_centroids(std::vector<float> centroids, std::size_t dim, Metric metric) {
  IvfFlat index;
  index.dim_ = dim;
  index.metric_ = metric;
  const std::size_t nlist = dim == 0 ? 0 : centroids.size() / dim;
  index.centroids_ = std::move(centroids);
  index.centroid_norms_.resize(nlist);
  squared_norms(index.centroids_.data(), nlist, dim, index.centroid_norms_.data());
  index.lists_.resize(nlist);
  return index;
}

void IvfFlat::nearest(const float* rows, std::size_t count, std::uint32_t* lists, float* distances,
                      int threads, const CancelToken* cancel) const {
  nearest_centroids(rows, count, centroids_.data(), centroid_norms_.data(), nlist(), dim_, lists,
                    distances, threads, cancel);
}

void IvfFlat::append(std::uint32_t list, const float* vector, float norm, std::uint64_t position) {
  List& target = lists_[list];
  target.vectors.insert(target.vectors.end(), vector, vector + dim_);
  target.norms.push_back(norm);
  target.positions.push_back(position);
  ++rows_;
}

void IvfFlat::reserve(std::uint32_t list, std::size_t rows) {
  List& target = lists_[list];
  target.vectors.reserve(target.vectors.size() + rows * dim_);
  target.norms.reserve(target.norms.size() + rows);
  target.positions.reserve(target.positions.size() + rows);
}

StatusOr<IvfFlat> IvfFlat::build(std::span<const RowBlock> blocks, std::size_t dim, Metric metric,
                                 const IvfParams& params, int threads) {
  auto start = std::chrono::steady_clock::now();
  std::size_t total = 0;
  for (const auto& block : blocks) total += block.rows;
  if (total == 0) return failed_precondition("IVF: the collection has no vectors to train on");
  std::size_t nlist = params.nlist != 0 ? params.nlist : default_nlist(total);
  if (nlist > total) {
    return invalid_argument(fmt::format("IVF: nlist {} exceeds the {} vectors", nlist, total));
  }
  std::vector<float> sample = ivf_training_sample(blocks, dim, nlist, params);
  IvfFlat index = with_centroids(
      kmeans_cpu(sample.data(), sample.size() / dim, dim, nlist, params.iterations, threads), dim,
      metric);
  for (const auto& block : blocks) {
    std::vector<std::uint32_t> lists(block.rows);
    index.nearest(block.vectors, block.rows, lists.data(), nullptr, threads);
    for (std::size_t r = 0; r < block.rows; ++r) {
      index.append(lists[r], block.vectors + r * dim, block.norms[r], row_position(block, r));
    }
  }
  index.train_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return index;
}

std::vector<std::vector<std::uint32_t>> IvfFlat::probes(const float* queries,
                                                        std::size_t query_count, std::size_t nprobe,
                                                        int threads) const {
  nprobe = std::clamp<std::size_t>(nprobe, 1, nlist());
  RowBlock centroid_block{centroids_.data(), centroid_norms_.data(), nlist(), 0, nullptr};
  auto found = exact_scan({&centroid_block, 1}, dim_, Metric::kL2, queries, query_count, nprobe,
                          nullptr, threads);
  std::vector<std::vector<std::uint32_t>> result(query_count);
  for (std::size_t q = 0; q < query_count; ++q) {
    for (const auto& item : found[q].items()) {
      result[q].push_back(static_cast<std::uint32_t>(item.position));
    }
  }
  return result;
}

std::vector<TopK> IvfFlat::search(const float* queries, std::size_t query_count, std::size_t k,
                                  std::size_t nprobe, const AllowMask* mask, int threads,
                                  const CancelToken* cancel) const {
  const std::size_t lists = nlist();
  auto probed = probes(queries, query_count, nprobe, threads);
  if (is_cancelled(cancel)) return std::vector<TopK>(query_count, TopK(k));
  // Invert the probes: which queries visit each list. Queries sharing a list are scanned as one
  // tile, so each list vector is read once per tile instead of once per query.
  std::vector<std::vector<std::uint32_t>> visitors(lists);
  std::size_t visited_rows = 0;
  for (std::size_t q = 0; q < query_count; ++q) {
    for (std::uint32_t list : probed[q]) {
      visitors[list].push_back(static_cast<std::uint32_t>(q));
      visited_rows += lists_[list].positions.size();
    }
  }
  std::vector<std::uint32_t> active;
  for (std::size_t l = 0; l < lists; ++l) {
    if (!visitors[l].empty() && !lists_[l].positions.empty()) {
      active.push_back(static_cast<std::uint32_t>(l));
    }
  }
  std::vector<float> query_norms(query_count);
  squared_norms(queries, query_count, dim_, query_norms.data());
  int workers =
      double(visited_rows) * double(dim_) < kParallelMinWork ? 1 : resolve_threads(threads);
  workers = static_cast<int>(std::min<std::size_t>(std::max<std::size_t>(active.size(), 1),
                                                   static_cast<std::size_t>(workers)));
  std::vector<std::vector<TopK>> per_worker(static_cast<std::size_t>(workers),
                                            std::vector<TopK>(query_count, TopK(k)));
  struct Scratch {
    std::vector<float> gathered, norms, dots;
    std::vector<TopK> topk;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(workers));
  parallel_for(active.size(), workers, [&](std::size_t task, int worker) {
    if (is_cancelled(cancel)) return;
    std::size_t list = active[task];
    const auto& queries_here = visitors[list];
    Scratch& s = scratch[worker];
    const List& rows = lists_[list];
    RowBlock block{rows.vectors.data(), rows.norms.data(), rows.positions.size(), 0,
                   rows.positions.data()};
    for (std::size_t t0 = 0; t0 < queries_here.size(); t0 += kQueryTile) {
      std::size_t tile = std::min(kQueryTile, queries_here.size() - t0);
      s.gathered.resize(tile * dim_);
      s.norms.resize(tile);
      s.topk.assign(tile, TopK(0));
      for (std::size_t i = 0; i < tile; ++i) {
        std::uint32_t q = queries_here[t0 + i];
        std::memcpy(&s.gathered[i * dim_], queries + q * dim_, dim_ * sizeof(float));
        s.norms[i] = query_norms[q];
        s.topk[i] = std::move(per_worker[worker][q]);
      }
      scan_rows(block, 0, block.rows, dim_, metric_, s.gathered.data(), s.norms.data(), 0, tile,
                mask, s.topk, s.dots);
      for (std::size_t i = 0; i < tile; ++i) {
        per_worker[worker][queries_here[t0 + i]] = std::move(s.topk[i]);
      }
    }
  });
  for (std::size_t w = 1; w < per_worker.size(); ++w) {
    for (std::size_t q = 0; q < query_count; ++q) per_worker[0][q].merge(per_worker[w][q]);
  }
  return std::move(per_worker[0]);
}

}  // namespace gpuopt::vector::detail
