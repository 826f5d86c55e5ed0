// IVF-Flat on the GPU: k-means with the distance step as a cuBLAS GEMM (TF32 tensor cores while
// training, fp32 for the final assignment) + a warp-per-row argmin + atomic centroid sums, and
// IVF search: a coarse fp32 GEMM against the centroids, a block-per-query top-nprobe selection in
// shared memory, then a block-per-query scan of the probed lists (8 lanes per row, per-warp top-k
// lists in shared memory, merged at the end).
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
constexpr int kScanThreads = 256;  // 8 warps, each 4 groups of 8 lanes (one row per group)
constexpr int kScanWarps = kScanThreads / 32;
constexpr int kGroupLanes = 8;
constexpr int kSelectThreads = 256;
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
__global__ void k_ivf_select_probes(const float* __restrict__ dots, int nlist,
                                    const float* __restrict__ centroid_norms,
                                    const float* __restrict__ query_norms, int nprobe,
                                    int* __restrict__ probes) {
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

// One block per query: each warp scans 4 rows at a time (8 lanes per row) of the probed lists and
// keeps its own sorted top-k in shared memory; thread 0 merges the warps' lists at the end.
__global__ void k_ivf_scan(const float* __restrict__ queries, const float* __restrict__ query_norms,
                           int dim, int metric, const int* __restrict__ probes, int nprobe,
                           const std::uint64_t* __restrict__ offsets,
                           const float* __restrict__ vectors, const float* __restrict__ norms,
                           const std::uint64_t* __restrict__ positions,
                           const std::uint64_t* __restrict__ mask, int k,
                           std::uint64_t* __restrict__ out_positions,
                           float* __restrict__ out_distances) {
  extern __shared__ unsigned char scan_shared[];
  float* query = reinterpret_cast<float*>(scan_shared);
  float* top_distance = query + ((dim + 3) / 4) * 4;  // [warps, k]
  std::uint64_t* top_position = reinterpret_cast<std::uint64_t*>(
      top_distance + ((kScanWarps * k + 1) / 2) * 2);  // [warps, k]
  const int q = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = lane / kGroupLanes, lane_in_group = lane % kGroupLanes;
  for (int t = threadIdx.x; t < dim; t += blockDim.x) query[t] = queries[std::size_t(q) * dim + t];
  for (int i = threadIdx.x; i < kScanWarps * k; i += blockDim.x) {
    top_distance[i] = FLT_MAX;
    top_position[i] = kNoPosition;
  }
  __syncthreads();
  const float qn = query_norms[q];
  float* my_distance = top_distance + warp * k;
  std::uint64_t* my_position = top_position + warp * k;
  for (int p = 0; p < nprobe; ++p) {
    const int list = probes[std::size_t(q) * nprobe + p];
    const std::uint64_t begin = offsets[list], end = offsets[list + 1];
    for (std::uint64_t base = begin + std::uint64_t(warp) * 4; base < end;
         base += std::uint64_t(kScanWarps) * 4) {
      const std::uint64_t r = base + group;
      const bool valid = r < end;
      float dot = 0;
      if (valid) {
        const float* v = vectors + r * std::uint64_t(dim);
        for (int t = lane_in_group; t < dim; t += kGroupLanes) dot += v[t] * query[t];
      }
      dot += __shfl_xor_sync(0xffffffffu, dot, 4);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      float distance = FLT_MAX;
      std::uint64_t position = kNoPosition;
      if (valid) {
        position = positions[r];
        bool allowed = mask == nullptr || ((mask[position >> 6] >> (position & 63)) & 1u);
        if (allowed) distance = ivf_distance(metric, dot, qn, norms[r]);
      }
      for (int g = 0; g < 4; ++g) {
        float d = __shfl_sync(0xffffffffu, distance, g * kGroupLanes);
        unsigned long long pos =
            __shfl_sync(0xffffffffu, static_cast<unsigned long long>(position), g * kGroupLanes);
        if (lane == 0 && d < my_distance[k - 1]) {
          int i = k - 1;
          while (i > 0 && my_distance[i - 1] > d) {
            my_distance[i] = my_distance[i - 1];
            my_position[i] = my_position[i - 1];
            --i;
          }
          my_distance[i] = d;
          my_position[i] = pos;
        }
        __syncwarp();
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int head[kScanWarps] = {};
    for (int out = 0; out < k; ++out) {
      int best_warp = 0;
      float best = FLT_MAX;
      for (int w = 0; w < kScanWarps; ++w) {
        float d = head[w] < k ? top_distance[w * k + head[w]] : FLT_MAX;
        if (d < best) {
          best = d;
          best_warp = w;
        }
      }
      std::size_t slot = std::size_t(q) * k + out;
      if (best == FLT_MAX) {
        out_distances[slot] = FLT_MAX;
        out_positions[slot] = kNoPosition;
      } else {
        out_distances[slot] = best;
        out_positions[slot] = top_position[best_warp * k + head[best_warp]];
        ++head[best_warp];
      }
    }
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
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.queries, query_count * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.query_norms, query_count * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.coarse, query_count * s.nlist * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(ensure_bytes(s.probes, query_count * nprobe * sizeof(int)));
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
  // Coarse quantiser in fp32, so the probes are the CPU's (ties aside).
  GPUOPT_RETURN_IF_ERROR(gemm_dots(s.cublas, s.centroids.data_as<float>(), s.nlist,
                                   s.queries.data_as<float>(), query_count, dim,
                                   s.coarse.data_as<float>(), /*tf32=*/false));
  if (select_shared > 48 * 1024) {
    GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_ivf_select_probes,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(select_shared)));
  }
  k_ivf_select_probes<<<static_cast<unsigned>(query_count), kSelectThreads, select_shared,
                        s.stream>>>(
      s.coarse.data_as<float>(), static_cast<int>(s.nlist), s.centroid_norms.data_as<float>(),
      s.query_norms.data_as<float>(), static_cast<int>(nprobe), s.probes.data_as<int>());
  GPUOPT_CUDA_TRY_LAUNCH();
  const std::size_t query_floats = (dim + 3) / 4 * 4;
  const std::size_t top_floats = (kScanWarps * k + 1) / 2 * 2;
  const std::size_t scan_shared =
      (query_floats + top_floats) * sizeof(float) + kScanWarps * k * sizeof(std::uint64_t);
  if (scan_shared > 48 * 1024) {
    GPUOPT_CUDA_TRY(cudaFuncSetAttribute(k_ivf_scan, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(scan_shared)));
  }
  k_ivf_scan<<<static_cast<unsigned>(query_count), kScanThreads, scan_shared, s.stream>>>(
      s.queries.data_as<float>(), s.query_norms.data_as<float>(), static_cast<int>(dim),
      metric_code(s.metric), s.probes.data_as<int>(), static_cast<int>(nprobe),
      s.offsets.data_as<std::uint64_t>(), s.vectors.data_as<float>(), s.norms.data_as<float>(),
      s.positions.data_as<std::uint64_t>(), device_mask, static_cast<int>(k),
      s.out_positions.data_as<std::uint64_t>(), s.out_distances.data_as<float>());
  GPUOPT_CUDA_TRY_LAUNCH();
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
