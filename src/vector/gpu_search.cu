// GPU exact search: the fused tensor-core path (gpu_fused_search.cu) where it applies, else cuBLAS
// dot-product tiles + a per-tile top-k kernel + a merge kernel (+ an fp32 re-rank for the TF32
// mode); allow masks for filters and deletes; stream-ordered ingest from device pointers.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpu_fused_search.cuh"
#include "gpu_small_batch.cuh"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/gpu_search.hpp"

namespace gpuopt::vector {

namespace {

// nvcc cannot compile fmt; messages are built with snprintf here.
template <typename... Args>
std::string message(const char* format, Args... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

constexpr int kThreads = 128;
constexpr int kMaxCandidates = 128;  // k up to 128 (local memory; the fallback path)
static_assert(std::size_t(kMaxCandidates) == kGpuMaxK);
constexpr std::uint64_t kNoPosition = ~std::uint64_t{0};

Status cublas_status(cublasStatus_t status, const char* expression) {
  if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
  std::string message = std::string(expression) + " failed: " + cublasGetStatusString(status) +
                        " (" + std::to_string(int(status)) + ")";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted(message);
  if (status == CUBLAS_STATUS_NOT_INITIALIZED) return unavailable(message);
  return internal_error(message);
}
#define GPUOPT_CUBLAS_TRY(expr) GPUOPT_RETURN_IF_ERROR(cublas_status((expr), #expr))

__device__ float distance_from_dot(int metric, float dot, float query_norm, float row_norm) {
  if (metric == 0) return fmaxf(query_norm + row_norm - 2.0f * dot, 0.0f);
  if (metric == 1) return -dot;
  float scale = query_norm * row_norm;
  return scale > 0 ? 1.0f - dot / sqrtf(scale) : 1.0f;
}

// One warp per row: squared L2 norm.
__global__ void k_squared_norms_f32(const float* __restrict__ vectors, std::size_t rows, int dim,
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

// A thread's best `count` candidates, sorted ascending; lives in registers/local memory.
struct LocalTopK {
  float distance[kMaxCandidates];
  std::uint64_t position[kMaxCandidates];
  int count;
  __device__ void init(int capacity) {
    count = capacity;
    for (int i = 0; i < kMaxCandidates; ++i) {
      distance[i] = FLT_MAX;
      position[i] = kNoPosition;
    }
  }
  __device__ void push(float d, std::uint64_t p) {
    if (!(d < distance[count - 1])) return;
    int i = count - 1;
    while (i > 0 && distance[i - 1] > d) {
      distance[i] = distance[i - 1];
      position[i] = position[i - 1];
      --i;
    }
    distance[i] = d;
    position[i] = p;
  }
};

// Merges the threads' sorted lists: `count` rounds of a block-wide argmin over list heads.
__device__ void block_merge(LocalTopK& local, int count, float* out_distance,
                            std::uint64_t* out_position) {
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_owner[kThreads / 32];
  __shared__ int winner;
  int head = 0;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int round = 0; round < count; ++round) {
    float mine = head < count ? local.distance[head] : FLT_MAX;
    float best = mine;
    int owner = threadIdx.x;
    for (int offset = 16; offset > 0; offset /= 2) {
      float other = __shfl_down_sync(0xffffffffu, best, offset);
      int other_owner = __shfl_down_sync(0xffffffffu, owner, offset);
      if (other < best || (other == best && other_owner < owner)) {
        best = other;
        owner = other_owner;
      }
    }
    if (lane == 0) {
      warp_best[warp] = best;
      warp_owner[warp] = owner;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float b = warp_best[0];
      int o = warp_owner[0];
      for (int w = 1; w < kThreads / 32; ++w) {
        if (warp_best[w] < b || (warp_best[w] == b && warp_owner[w] < o)) {
          b = warp_best[w];
          o = warp_owner[w];
        }
      }
      winner = o;
    }
    __syncthreads();
    if (threadIdx.x == winner) {
      out_distance[round] = head < count ? local.distance[head] : FLT_MAX;
      out_position[round] = head < count ? local.position[head] : kNoPosition;
      ++head;
    }
    __syncthreads();
  }
}

// One block per query: distances of one tile from its dot products, top `count` of the tile.
// dots: [query_count, tile_rows] (row q at q * tile_rows). Output slot [query, tile, count].
__global__ void k_tile_topk(const float* __restrict__ dots, int tile_rows,
                            const float* __restrict__ row_norms,
                            const float* __restrict__ query_norms, int metric, int count,
                            std::uint64_t first_row, const std::uint64_t* __restrict__ allow_mask,
                            int tile, int tiles, float* __restrict__ out_distance,
                            std::uint64_t* __restrict__ out_position) {
  int query = blockIdx.x;
  LocalTopK local;
  local.init(count);
  const float* row = dots + std::size_t(query) * tile_rows;
  float query_norm = query_norms[query];
  for (int r = threadIdx.x; r < tile_rows; r += blockDim.x) {
    std::uint64_t position = first_row + r;
    if (allow_mask != nullptr && !((allow_mask[position >> 6] >> (position & 63)) & 1)) continue;
    local.push(distance_from_dot(metric, row[r], query_norm, row_norms[r]), position);
  }
  std::size_t slot = (std::size_t(query) * tiles + tile) * count;
  block_merge(local, count, out_distance + slot, out_position + slot);
}

// One block per query: top `count` of its [tiles * count] candidates.
__global__ void k_merge_candidates(const float* __restrict__ in_distance,
                                   const std::uint64_t* __restrict__ in_position, int candidates,
                                   int count, float* __restrict__ out_distance,
                                   std::uint64_t* __restrict__ out_position) {
  int query = blockIdx.x;
  LocalTopK local;
  local.init(count);
  const float* d = in_distance + std::size_t(query) * candidates;
  const std::uint64_t* p = in_position + std::size_t(query) * candidates;
  for (int i = threadIdx.x; i < candidates; i += blockDim.x) local.push(d[i], p[i]);
  block_merge(local, count, out_distance + std::size_t(query) * count,
              out_position + std::size_t(query) * count);
}

// One warp per query: exact fp32 distances of the `candidates` (<= 128) approximate winners,
// then the best k of them. Used after the TF32 pass.
__global__ void k_rerank(const float* __restrict__ vectors, const float* __restrict__ queries,
                         int dim, int metric, const std::uint64_t* __restrict__ in_position,
                         int candidates, int k, float* __restrict__ out_distance,
                         std::uint64_t* __restrict__ out_position) {
  int query = blockIdx.x;
  int lane = threadIdx.x;
  const float* q = queries + std::size_t(query) * dim;
  constexpr int kPerLane = kMaxCandidates / 32;
  float distance[kPerLane];
  std::uint64_t position[kPerLane];
  for (int s = 0; s < kPerLane; ++s) {
    distance[s] = FLT_MAX;
    position[s] = kNoPosition;
  }
  for (int s = 0; s < kPerLane; ++s) {
    int c = lane + 32 * s;
    if (c >= candidates) continue;
    std::uint64_t p = in_position[std::size_t(query) * candidates + c];
    if (p == kNoPosition) continue;
    const float* x = vectors + p * dim;
    float sum = 0, qq = 0, xx = 0;
    for (int i = 0; i < dim; ++i) {
      if (metric == 0) {
        float diff = q[i] - x[i];
        sum += diff * diff;
      } else {
        sum += q[i] * x[i];
        qq += q[i] * q[i];
        xx += x[i] * x[i];
      }
    }
    distance[s] = metric == 0   ? sum
                  : metric == 1 ? -sum
                                : (qq * xx > 0 ? 1.0f - sum / sqrtf(qq * xx) : 1.0f);
    position[s] = p;
  }
  for (int round = 0; round < k; ++round) {
    int pick = 0;
    for (int s = 1; s < kPerLane; ++s) {
      if (distance[s] < distance[pick]) pick = s;
    }
    float best = distance[pick];
    int owner = lane * kPerLane + pick;
    for (int offset = 16; offset > 0; offset /= 2) {
      float other = __shfl_xor_sync(0xffffffffu, best, offset);
      int other_owner = __shfl_xor_sync(0xffffffffu, owner, offset);
      if (other < best || (other == best && other_owner < owner)) {
        best = other;
        owner = other_owner;
      }
    }
    if (owner / kPerLane == lane) {
      for (int s = 0; s < kPerLane; ++s) {
        if (s != owner % kPerLane) continue;  // constant indices keep the arrays in registers
        out_distance[std::size_t(query) * k + round] = distance[s];
        out_position[std::size_t(query) * k + round] = position[s];
        distance[s] = FLT_MAX;
        position[s] = kNoPosition;
      }
    }
  }
}

using detail::reserve;
using runtime::DeviceBuffer;

int metric_code(Metric metric) {
  return metric == Metric::kL2 ? 0 : metric == Metric::kInnerProduct ? 1 : 2;
}

// Pinned host memory (cudaHostAlloc), grown on demand; the contents are not kept.
struct PinnedBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  ~PinnedBuffer() {
    if (data != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(data));
  }
  Status reserve(std::size_t wanted) {
    if (wanted <= bytes) return ok_status();
    if (data != nullptr) GPUOPT_CUDA_TRY(cudaFreeHost(data));
    data = nullptr;
    bytes = 0;
    GPUOPT_CUDA_TRY(cudaHostAlloc(&data, wanted, cudaHostAllocDefault));
    bytes = wanted;
    return ok_status();
  }
};

// The small-batch path's device outputs, packed so that one copy brings them back:
// float distance [count], then std::uint64_t position [count], then std::int32_t overflow
// [queries].
struct PackedResults {
  std::size_t distance_offset = 0, position_offset = 0, overflow_offset = 0, bytes = 0;
  PackedResults(std::size_t queries, std::size_t k) {
    const std::size_t count = queries * k;
    position_offset = (count * sizeof(float) + 7) / 8 * 8;
    overflow_offset = position_offset + count * sizeof(std::uint64_t);
    bytes = overflow_offset + queries * sizeof(std::int32_t);
  }
};

}  // namespace

struct GpuDataset::State {
  int device = 0;
  std::size_t dim = 0;
  int padded_dim = 0;  // width of the fp16 copy; 0 = no fused path for this dimension
  Metric metric = Metric::kL2;
  std::size_t rows = 0;
  std::size_t capacity = 0;
  // float [capacity, dim], [capacity], [capacity]: norms are squared (fp64 sums, stored fp32)
  DeviceBuffer vectors, norms, row_norms;
  DeviceBuffer scaled;  // __half [capacity, padded_dim]: fp16 of v / |v|
  cublasHandle_t cublas = nullptr;
  cudaStream_t own_stream = nullptr;  // used when a caller passes no stream
  // Search scratch, grown on demand: float, then std::uint64_t, then std::int32_t elements.
  DeviceBuffer queries, query_norms, dots, tile_distance, merged_distance, final_distance;
  DeviceBuffer tile_position, merged_position, final_position, mask;
  DeviceBuffer overflow;
  detail::FusedSearch fused;
  std::vector<std::uint64_t> ids;  // [rows] on the host: what search() reports for each row
  DeviceBuffer device_ids;         // std::uint64_t [capacity]: the same ids on the device
  std::size_t memory_budget = 0;   // bytes the row buffers may take; 0 = no cap
  std::uint64_t mask_version = 0;  // GpuSearchOptions::allow_mask_version of `mask`'s contents
  std::size_t mask_words = 0;
  // Small-batch path: its kernels' scratch, the packed device outputs, pinned staging for the
  // query upload and the result download (one copy each way).
  detail::SmallBatchSearch small;
  DeviceBuffer small_out;
  PinnedBuffer pinned_queries, pinned_results, pinned_flags;
  ~State() {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (own_stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(own_stream));
  }
  // Never the legacy default stream: a null stream means the dataset's own non-blocking one.
  cudaStream_t resolve(void* stream) const {
    return stream != nullptr ? static_cast<cudaStream_t>(stream) : own_stream;
  }

  // Grows `buffer` from `keep` to `size` elements of T, keeping the first `keep`.
  template <typename T>
  static Status grow_buffer(DeviceBuffer& buffer, std::size_t keep, std::size_t size,
                            cudaStream_t stream) {
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer bigger, DeviceBuffer::allocate(size * sizeof(T)));
    if (keep > 0) {
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(bigger.data(), buffer.data(), keep * sizeof(T),
                                      cudaMemcpyDeviceToDevice, stream));
    }
    std::swap(buffer, bigger);
    // The old buffer is freed when `bigger` goes out of scope: the copy must be done by then.
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
    return ok_status();
  }

  Status reserve_rows(std::size_t needed, cudaStream_t stream) {
    if (needed <= capacity) return ok_status();
    std::size_t bigger = std::max(needed, 2 * capacity);
    const std::size_t per_row = GpuDataset::device_bytes_per_row(dim);
    if (memory_budget > 0) {
      if (needed * per_row > memory_budget) {
        return resource_exhausted(
            message("GPU dataset: %zu rows x %zu dimensions need %zu bytes of device memory, "
                    "above the budget of %zu bytes",
                    needed, dim, needed * per_row, memory_budget));
      }
      bigger = std::max(needed, std::min(bigger, memory_budget / per_row));
    }
    GPUOPT_RETURN_IF_ERROR(grow_buffer<float>(vectors, rows * dim, bigger * dim, stream));
    GPUOPT_RETURN_IF_ERROR(grow_buffer<float>(norms, rows, bigger, stream));
    GPUOPT_RETURN_IF_ERROR(grow_buffer<float>(row_norms, rows, bigger, stream));
    if (padded_dim > 0) {
      GPUOPT_RETURN_IF_ERROR(
          grow_buffer<__half>(scaled, rows * padded_dim, bigger * padded_dim, stream));
    }
    GPUOPT_RETURN_IF_ERROR(grow_buffer<std::uint64_t>(device_ids, rows, bigger, stream));
    capacity = bigger;
    return ok_status();
  }

  Status append(const float* source, std::size_t count, std::span<const std::uint64_t> row_ids,
                cudaMemcpyKind kind, cudaStream_t stream) {
    if (!row_ids.empty() && row_ids.size() != count) {
      return invalid_argument(message("GPU append: %zu ids for %zu rows", row_ids.size(), count));
    }
    if (count == 0) return ok_status();
    if (source == nullptr) return invalid_argument("GPU append: vectors is null");
    GPUOPT_CUDA_TRY(cudaSetDevice(device));
    GPUOPT_RETURN_IF_ERROR(reserve_rows(rows + count, stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(vectors.data_as<float>() + rows * dim, source,
                                    count * dim * sizeof(float), kind, stream));
    GPUOPT_RETURN_IF_ERROR(detail::fused_prepare_rows(
        vectors.data_as<float>() + rows * dim, count, static_cast<int>(dim), padded_dim,
        norms.data_as<float>() + rows, row_norms.data_as<float>() + rows,
        padded_dim > 0 ? scaled.data_as<__half>() + rows * padded_dim : nullptr, stream));
    if (row_ids.empty()) {
      for (std::size_t i = 0; i < count; ++i) ids.push_back(rows + i);
    } else {
      ids.insert(ids.end(), row_ids.begin(), row_ids.end());
    }
    // Pageable source: the call returns once the ids are staged, so `ids` may grow afterwards.
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(device_ids.data_as<std::uint64_t>() + rows, ids.data() + rows,
                                    count * sizeof(std::uint64_t), cudaMemcpyHostToDevice, stream));
    rows += count;
    return ok_status();
  }

  // Row positions and distances; search() adds the ids.
  StatusOr<GpuSearchResult> search_positions(const float* queries, std::size_t query_count,
                                             const GpuSearchOptions& options, void* stream);

  // The cuBLAS path. `mask_device`: device bitset or null.
  Status tiled_search(const float* host_queries, std::size_t query_count, std::size_t k, bool tf32,
                      std::size_t tile_rows_option, const std::uint64_t* mask_device,
                      GpuSearchResult& result, cudaStream_t stream,
                      cudaMemcpyKind query_kind = cudaMemcpyHostToDevice);

  // The device bitset for `options` (the caller's, or the host one copied), or null.
  StatusOr<const std::uint64_t*> device_mask(const GpuSearchOptions& options, cudaStream_t stream);
  detail::FusedRows fused_rows(const std::uint64_t* mask_device) const;
  bool fused_applies(const GpuSearchOptions& options) const {
    return options.precision == GpuPrecision::kFp32 && padded_dim > 0 &&
           options.k <= detail::kFusedMaxK && rows < (std::size_t{1} << 31);
  }
  bool small_batch_applies(const GpuSearchOptions& options, std::size_t query_count) const {
    return fused_applies(options) &&
           query_count <= std::min(options.small_batch_max_queries, kGpuSmallBatchMaxQueries);
  }
  // Answers the host queries flagged in `overflow` with the cuBLAS fp32 path, into `result`.
  Status redo_overflowed(const float* queries, const std::int32_t* overflow,
                         std::size_t query_count, const GpuSearchOptions& options,
                         const std::uint64_t* mask_device, GpuSearchResult& result,
                         cudaStream_t stream);
  // The small-batch path for host queries: one pinned upload, two kernels, one pinned download.
  Status small_batch_search(const float* queries, std::size_t query_count,
                            const GpuSearchOptions& options, const std::uint64_t* mask_device,
                            GpuSearchResult& result, cudaStream_t stream);
};

GpuDataset::GpuDataset(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuDataset::~GpuDataset() = default;

StatusOr<std::unique_ptr<GpuDataset>> GpuDataset::create(std::size_t dim, Metric metric,
                                                         std::size_t capacity, int device) {
  GPUOPT_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  if (device < 0 || device >= devices) {
    return invalid_argument(message("GPU device %d does not exist (%d present)", device, devices));
  }
  if (dim == 0 || dim > 65536) return invalid_argument(message("GPU dataset dimension %zu", dim));
  auto state = std::make_unique<State>();
  state->device = device;
  state->dim = dim;
  state->metric = metric;
  state->padded_dim = detail::fused_padded_dim(dim);
  GPUOPT_CUDA_TRY(cudaSetDevice(device));
  GPUOPT_CUBLAS_TRY(cublasCreate(&state->cublas));
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&state->own_stream, cudaStreamNonBlocking));
  GPUOPT_RETURN_IF_ERROR(
      state->reserve_rows(std::max<std::size_t>(capacity, 1), state->own_stream));
  return std::unique_ptr<GpuDataset>(new GpuDataset(std::move(state)));
}

Status GpuDataset::append_host(const float* vectors, std::size_t rows, void* stream,
                               std::span<const std::uint64_t> ids) {
  return state_->append(vectors, rows, ids, cudaMemcpyHostToDevice, state_->resolve(stream));
}

Status GpuDataset::append_device(const float* device_vectors, std::size_t rows, void* stream,
                                 std::span<const std::uint64_t> ids) {
  cudaPointerAttributes attributes{};
  GPUOPT_CUDA_TRY(cudaPointerGetAttributes(&attributes, device_vectors));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return invalid_argument("GPU append_device: the pointer is not device memory");
  }
  return state_->append(device_vectors, rows, ids, cudaMemcpyDeviceToDevice,
                        state_->resolve(stream));
}

Status GpuDataset::append_dlpack(const DLTensor& tensor, void* stream,
                                 std::span<const std::uint64_t> ids) {
  if (tensor.ndim != 2 || tensor.shape == nullptr) {
    return invalid_argument(
        message("DLPack tensor: expected 2-D [rows, dim], got %d-D", tensor.ndim));
  }
  if (tensor.dtype.code != 2 || tensor.dtype.bits != 32 || tensor.dtype.lanes != 1) {
    return invalid_argument("DLPack tensor: expected float32");
  }
  if (tensor.shape[1] != static_cast<std::int64_t>(state_->dim) || tensor.shape[0] < 0) {
    return invalid_argument(message("DLPack tensor: shape [%lld, %lld], dataset dimension %zu",
                                    (long long)tensor.shape[0], (long long)tensor.shape[1],
                                    state_->dim));
  }
  if (tensor.strides != nullptr &&
      (tensor.strides[1] != 1 || tensor.strides[0] != tensor.shape[1])) {
    return invalid_argument("DLPack tensor: must be compact row-major");
  }
  const float* data =
      reinterpret_cast<const float*>(static_cast<const char*>(tensor.data) + tensor.byte_offset);
  std::size_t rows = static_cast<std::size_t>(tensor.shape[0]);
  switch (tensor.device.device_type) {
    case 2:
    case 13:
      if (tensor.device.device_id != state_->device) {
        return invalid_argument(message("DLPack tensor is on GPU %d, the dataset on GPU %d",
                                        tensor.device.device_id, state_->device));
      }
      return state_->append(data, rows, ids, cudaMemcpyDeviceToDevice, state_->resolve(stream));
    case 1:
    case 3:
      return state_->append(data, rows, ids, cudaMemcpyHostToDevice, state_->resolve(stream));
    default:
      return invalid_argument(
          message("DLPack tensor: device type %d is not supported", tensor.device.device_type));
  }
}

Status GpuDataset::State::tiled_search(const float* host_queries, std::size_t query_count,
                                       std::size_t k, bool tf32, std::size_t tile_rows_option,
                                       const std::uint64_t* mask_device, GpuSearchResult& result,
                                       cudaStream_t stream, cudaMemcpyKind query_kind) {
  State& s = *this;
  const std::size_t count = tf32 ? std::min<std::size_t>(kMaxCandidates, 4 * k) : k;
  const std::size_t tile_rows = std::clamp<std::size_t>(tile_rows_option, 256, 1 << 20);
  const std::size_t tiles = (s.rows + tile_rows - 1) / tile_rows;
  // Queries go in chunks so the [chunk, tile] dot block stays about 64 MiB.
  const std::size_t chunk =
      std::clamp<std::size_t>((64u << 20) / (tile_rows * sizeof(float)), 1, 65535);
  const std::size_t chunk_queries = std::min(chunk, query_count);
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.queries, query_count * dim));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.query_norms, query_count));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.dots, chunk_queries * tile_rows));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.tile_distance, chunk_queries * tiles * count));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(s.tile_position, chunk_queries * tiles * count));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.merged_distance, query_count * count));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(s.merged_position, query_count * count));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.final_distance, query_count * k));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(s.final_position, query_count * k));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.queries.data_as<float>(), host_queries,
                                  query_count * dim * sizeof(float), query_kind, stream));
  k_squared_norms_f32<<<static_cast<unsigned>((query_count * 32 + 255) / 256), 256, 0, stream>>>(
      s.queries.data_as<float>(), query_count, static_cast<int>(dim),
      s.query_norms.data_as<float>());
  GPUOPT_CUDA_TRY_LAUNCH();
  GPUOPT_CUBLAS_TRY(cublasSetStream(s.cublas, stream));
  GPUOPT_CUBLAS_TRY(
      cublasSetMathMode(s.cublas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
  const int metric_id = metric_code(s.metric);
  const float one = 1.0f, zero = 0.0f;
  for (std::size_t q0 = 0; q0 < query_count; q0 += chunk_queries) {
    std::size_t nq = std::min(chunk_queries, query_count - q0);
    for (std::size_t t = 0; t < tiles; ++t) {
      std::size_t r0 = t * tile_rows;
      std::size_t nr = std::min(tile_rows, s.rows - r0);
      // Column-major C[nr, nq] = X_tile[nr, dim] * Q[dim, nq]: row q of the result is query q.
      GPUOPT_CUBLAS_TRY(cublasSgemm(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr),
                                    static_cast<int>(nq), static_cast<int>(dim), &one,
                                    s.vectors.data_as<float>() + r0 * dim, static_cast<int>(dim),
                                    s.queries.data_as<float>() + q0 * dim, static_cast<int>(dim),
                                    &zero, s.dots.data_as<float>(), static_cast<int>(nr)));
      k_tile_topk<<<static_cast<unsigned>(nq), kThreads, 0, stream>>>(
          s.dots.data_as<float>(), static_cast<int>(nr), s.norms.data_as<float>() + r0,
          s.query_norms.data_as<float>() + q0, metric_id, static_cast<int>(count), r0, mask_device,
          static_cast<int>(t), static_cast<int>(tiles), s.tile_distance.data_as<float>(),
          s.tile_position.data_as<std::uint64_t>());
      GPUOPT_CUDA_TRY_LAUNCH();
    }
    k_merge_candidates<<<static_cast<unsigned>(nq), kThreads, 0, stream>>>(
        s.tile_distance.data_as<float>(), s.tile_position.data_as<std::uint64_t>(),
        static_cast<int>(tiles * count), static_cast<int>(count),
        s.merged_distance.data_as<float>() + q0 * count,
        s.merged_position.data_as<std::uint64_t>() + q0 * count);
    GPUOPT_CUDA_TRY_LAUNCH();
  }
  const float* out_distance = s.merged_distance.data_as<float>();
  const std::uint64_t* out_position = s.merged_position.data_as<std::uint64_t>();
  if (tf32) {
    k_rerank<<<static_cast<unsigned>(query_count), 32, 0, stream>>>(
        s.vectors.data_as<float>(), s.queries.data_as<float>(), static_cast<int>(dim), metric_id,
        s.merged_position.data_as<std::uint64_t>(), static_cast<int>(count), static_cast<int>(k),
        s.final_distance.data_as<float>(), s.final_position.data_as<std::uint64_t>());
    GPUOPT_CUDA_TRY_LAUNCH();
    out_distance = s.final_distance.data_as<float>();
    out_position = s.final_position.data_as<std::uint64_t>();
  } else if (count != k) {
    return internal_error("tiled search: candidate count differs from k without re-rank");
  }
  // Without re-rank, merged_* holds [query_count, k] (count == k).
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result.distances.data(), out_distance,
                                  query_count * k * sizeof(float), cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result.positions.data(), out_position,
                                  query_count * k * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                  stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  return ok_status();
}

StatusOr<GpuSearchResult> GpuDataset::search(const float* queries, std::size_t query_count,
                                             const GpuSearchOptions& options, void* stream) {
  GPUOPT_ASSIGN_OR_RETURN(GpuSearchResult result,
                          state_->search_positions(queries, query_count, options, stream));
  // Positions to ids on the host, after the copies back: no device work added.
  const std::vector<std::uint64_t>& ids = state_->ids;
  result.ids.resize(result.positions.size());
  for (std::size_t i = 0; i < result.positions.size(); ++i) {
    const std::uint64_t p = result.positions[i];
    result.ids[i] = p < ids.size() ? ids[p] : kNoPosition;
  }
  return result;
}

StatusOr<const std::uint64_t*> GpuDataset::State::device_mask(const GpuSearchOptions& options,
                                                              cudaStream_t stream) {
  if (options.device_allow_mask != nullptr) return options.device_allow_mask;
  if (options.allow_mask == nullptr) return static_cast<const std::uint64_t*>(nullptr);
  const std::size_t words = (rows + 63) / 64;
  if (options.allow_mask_version != 0 && options.allow_mask_version == mask_version &&
      words == mask_words) {
    return mask.data_as<std::uint64_t>();
  }
  mask_version = 0;
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(mask, words));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(mask.data_as<std::uint64_t>(), options.allow_mask,
                                  words * sizeof(std::uint64_t), cudaMemcpyHostToDevice, stream));
  mask_version = options.allow_mask_version;
  mask_words = words;
  return mask.data_as<std::uint64_t>();
}

detail::FusedRows GpuDataset::State::fused_rows(const std::uint64_t* mask_device) const {
  detail::FusedRows r;
  r.vectors = vectors.data_as<float>();
  r.squared_norm = norms.data_as<float>();
  r.norm = row_norms.data_as<float>();
  r.scaled = scaled.data_as<__half>();
  r.allow_mask = mask_device;
  r.rows = rows;
  r.dim = static_cast<int>(dim);
  r.padded_dim = padded_dim;
  r.metric = metric_code(metric);
  return r;
}

Status GpuDataset::State::redo_overflowed(const float* queries, const std::int32_t* overflow,
                                          std::size_t query_count, const GpuSearchOptions& options,
                                          const std::uint64_t* mask_device, GpuSearchResult& result,
                                          cudaStream_t stream) {
  const std::size_t k = options.k;
  std::vector<std::size_t> redo;
  for (std::size_t q = 0; q < query_count; ++q) {
    if (overflow[q] != 0) redo.push_back(q);
  }
  if (redo.empty()) return ok_status();
  std::vector<float> subset(redo.size() * dim);
  for (std::size_t i = 0; i < redo.size(); ++i) {
    std::copy_n(queries + redo[i] * dim, dim, subset.data() + i * dim);
  }
  GpuSearchResult partial;
  partial.positions.assign(redo.size() * k, kNoPosition);
  partial.distances.assign(redo.size() * k, FLT_MAX);
  GPUOPT_RETURN_IF_ERROR(tiled_search(subset.data(), redo.size(), k, false, options.tile_rows,
                                      mask_device, partial, stream));
  for (std::size_t i = 0; i < redo.size(); ++i) {
    std::copy_n(partial.positions.data() + i * k, k, result.positions.data() + redo[i] * k);
    std::copy_n(partial.distances.data() + i * k, k, result.distances.data() + redo[i] * k);
  }
  result.fallback_queries = redo.size();
  return ok_status();
}

Status GpuDataset::State::small_batch_search(const float* queries, std::size_t query_count,
                                             const GpuSearchOptions& options,
                                             const std::uint64_t* mask_device,
                                             GpuSearchResult& result, cudaStream_t stream) {
  const std::size_t k = options.k;
  const std::size_t query_bytes = query_count * dim * sizeof(float);
  const PackedResults packed(query_count, k);
  const PackedResults largest(kGpuSmallBatchMaxQueries, kGpuMaxK);
  GPUOPT_RETURN_IF_ERROR(reserve<float>(this->queries, kGpuSmallBatchMaxQueries * dim));
  GPUOPT_RETURN_IF_ERROR(reserve<unsigned char>(small_out, largest.bytes));
  GPUOPT_RETURN_IF_ERROR(pinned_queries.reserve(kGpuSmallBatchMaxQueries * dim * sizeof(float)));
  GPUOPT_RETURN_IF_ERROR(pinned_results.reserve(largest.bytes));
  std::memcpy(pinned_queries.data, queries, query_bytes);
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(this->queries.data(), pinned_queries.data, query_bytes,
                                  cudaMemcpyHostToDevice, stream));
  auto* out = small_out.data_as<unsigned char>();
  GPUOPT_RETURN_IF_ERROR(
      small.run(fused_rows(mask_device), nullptr, this->queries.data_as<float>(), query_count,
                static_cast<int>(k), reinterpret_cast<float*>(out + packed.distance_offset),
                reinterpret_cast<std::uint64_t*>(out + packed.position_offset), nullptr,
                reinterpret_cast<std::int32_t*>(out + packed.overflow_offset), stream));
  GPUOPT_CUDA_TRY(
      cudaMemcpyAsync(pinned_results.data, out, packed.bytes, cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  const auto* back = static_cast<const unsigned char*>(pinned_results.data);
  std::memcpy(result.distances.data(), back + packed.distance_offset,
              query_count * k * sizeof(float));
  std::memcpy(result.positions.data(), back + packed.position_offset,
              query_count * k * sizeof(std::uint64_t));
  std::int32_t overflow[kGpuSmallBatchMaxQueries];
  std::memcpy(overflow, back + packed.overflow_offset, query_count * sizeof(std::int32_t));
  result.fused = true;
  result.small_batch = true;
  return redo_overflowed(queries, overflow, query_count, options, mask_device, result, stream);
}

StatusOr<GpuSearchResult> GpuDataset::State::search_positions(const float* queries,
                                                              std::size_t query_count,
                                                              const GpuSearchOptions& options,
                                                              void* stream_pointer) {
  State& s = *this;
  cudaStream_t stream = s.resolve(stream_pointer);
  const std::size_t k = options.k;
  if (k == 0 || k > std::size_t(kMaxCandidates)) {
    return invalid_argument(message("GPU search: k %zu must be 1..%d", k, kMaxCandidates));
  }
  if (query_count > 0 && queries == nullptr) return invalid_argument("GPU search: queries is null");
  GpuSearchResult result;
  result.positions.assign(query_count * k, kNoPosition);
  result.distances.assign(query_count * k, FLT_MAX);
  if (query_count == 0 || s.rows == 0) return result;
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  GPUOPT_ASSIGN_OR_RETURN(const std::uint64_t* mask_device, s.device_mask(options, stream));
  if (s.small_batch_applies(options, query_count)) {
    GPUOPT_RETURN_IF_ERROR(
        s.small_batch_search(queries, query_count, options, mask_device, result, stream));
    return result;
  }
  if (!s.fused_applies(options)) {
    GPUOPT_RETURN_IF_ERROR(s.tiled_search(queries, query_count, k,
                                          options.precision == GpuPrecision::kTf32Rerank,
                                          options.tile_rows, mask_device, result, stream));
    return result;
  }
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.queries, query_count * s.dim));
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.final_distance, query_count * k));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(s.final_position, query_count * k));
  GPUOPT_RETURN_IF_ERROR(reserve<std::int32_t>(s.overflow, query_count));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.queries.data_as<float>(), queries,
                                  query_count * s.dim * sizeof(float), cudaMemcpyHostToDevice,
                                  stream));
  Status status = s.fused.run(s.fused_rows(mask_device), s.queries.data_as<float>(), query_count,
                              static_cast<int>(k), s.final_distance.data_as<float>(),
                              s.final_position.data_as<std::uint64_t>(),
                              s.overflow.data_as<std::int32_t>(), stream);
  if (status.code() == StatusCode::kUnavailable) {
    // This GPU cannot hold the fused kernel's shared memory: the cuBLAS path answers.
    GPUOPT_RETURN_IF_ERROR(s.tiled_search(queries, query_count, k, false, options.tile_rows,
                                          mask_device, result, stream));
    return result;
  }
  GPUOPT_RETURN_IF_ERROR(status);
  std::vector<std::int32_t> overflow(query_count);
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result.distances.data(), s.final_distance.data_as<float>(),
                                  query_count * k * sizeof(float), cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(
      cudaMemcpyAsync(result.positions.data(), s.final_position.data_as<std::uint64_t>(),
                      query_count * k * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(overflow.data(), s.overflow.data_as<std::int32_t>(),
                                  query_count * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                  stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  result.fused = true;
  // Queries with more near-ties than the candidate lists hold: the cuBLAS fp32 path answers them.
  GPUOPT_RETURN_IF_ERROR(s.redo_overflowed(queries, overflow.data(), query_count, options,
                                           mask_device, result, stream));
  return result;
}

Status GpuDataset::search_device(const float* device_queries, std::size_t query_count,
                                 const GpuSearchOptions& options, const GpuDeviceResults& results,
                                 void* stream_pointer) {
  State& s = *state_;
  cudaStream_t stream = s.resolve(stream_pointer);
  const std::size_t k = options.k;
  if (k == 0 || k > std::size_t(kMaxCandidates)) {
    return invalid_argument(message("GPU search_device: k %zu must be 1..%d", k, kMaxCandidates));
  }
  if (query_count == 0) return ok_status();
  if (device_queries == nullptr) return invalid_argument("GPU search_device: queries is null");
  if (results.distances == nullptr && results.ids == nullptr && results.positions == nullptr) {
    return invalid_argument("GPU search_device: no output array given");
  }
  GPUOPT_CUDA_TRY(cudaSetDevice(s.device));
  cudaPointerAttributes attributes{};
  GPUOPT_CUDA_TRY(cudaPointerGetAttributes(&attributes, device_queries));
  if ((attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) ||
      attributes.device != s.device) {
    return invalid_argument(
        message("GPU search_device: the queries are not device memory of GPU %d", s.device));
  }
  if (s.rows == 0) {
    return detail::clear_unanswered(nullptr, query_count, static_cast<int>(k), results.distances,
                                    results.positions, results.ids, stream);
  }
  GPUOPT_ASSIGN_OR_RETURN(const std::uint64_t* mask_device, s.device_mask(options, stream));
  if (!s.fused_applies(options)) {
    // The cuBLAS path: its results come back to the host and go out again (it waits).
    GpuSearchResult host;
    host.positions.assign(query_count * k, kNoPosition);
    host.distances.assign(query_count * k, FLT_MAX);
    GPUOPT_RETURN_IF_ERROR(s.tiled_search(
        device_queries, query_count, k, options.precision == GpuPrecision::kTf32Rerank,
        options.tile_rows, mask_device, host, stream, cudaMemcpyDeviceToDevice));
    std::vector<std::uint64_t> ids(host.positions.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = host.positions[i] < s.ids.size() ? s.ids[host.positions[i]] : kNoPosition;
    }
    if (results.distances != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(results.distances, host.distances.data(),
                                      host.distances.size() * sizeof(float), cudaMemcpyHostToDevice,
                                      stream));
    }
    if (results.positions != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(results.positions, host.positions.data(),
                                      host.positions.size() * sizeof(std::uint64_t),
                                      cudaMemcpyHostToDevice, stream));
    }
    if (results.ids != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(results.ids, ids.data(), ids.size() * sizeof(std::uint64_t),
                                      cudaMemcpyHostToDevice, stream));
    }
    if (results.unresolved != nullptr) {
      GPUOPT_CUDA_TRY(
          cudaMemsetAsync(results.unresolved, 0, query_count * sizeof(std::int32_t), stream));
    }
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));  // the host arrays die here
    return ok_status();
  }
  // Caller arrays where given, the dataset's scratch otherwise.
  GPUOPT_RETURN_IF_ERROR(reserve<float>(s.final_distance, query_count * k));
  GPUOPT_RETURN_IF_ERROR(reserve<std::uint64_t>(s.final_position, query_count * k));
  GPUOPT_RETURN_IF_ERROR(reserve<std::int32_t>(s.overflow, query_count));
  float* distance =
      results.distances != nullptr ? results.distances : s.final_distance.data_as<float>();
  std::uint64_t* position =
      results.positions != nullptr ? results.positions : s.final_position.data_as<std::uint64_t>();
  std::int32_t* flags =
      results.unresolved != nullptr ? results.unresolved : s.overflow.data_as<std::int32_t>();
  const detail::FusedRows rows = s.fused_rows(mask_device);
  bool answered = false;
  if (s.small_batch_applies(options, query_count)) {
    GPUOPT_RETURN_IF_ERROR(s.small.run(rows, s.device_ids.data_as<std::uint64_t>(), device_queries,
                                       query_count, static_cast<int>(k), distance, position,
                                       results.ids, flags, stream));
    answered = true;
  } else {
    Status status = s.fused.run(rows, device_queries, query_count, static_cast<int>(k), distance,
                                position, flags, stream);
    if (status.ok()) {
      // Overflowed queries were left unwritten by the re-rank: clear them, then map the ids.
      GPUOPT_RETURN_IF_ERROR(detail::clear_unanswered(flags, query_count, static_cast<int>(k),
                                                      distance, position, nullptr, stream));
      if (results.ids != nullptr) {
        GPUOPT_RETURN_IF_ERROR(detail::positions_to_ids(
            position, s.device_ids.data_as<std::uint64_t>(), query_count * k, results.ids, stream));
      }
      answered = true;
    } else if (status.code() != StatusCode::kUnavailable) {
      return status;
    }
  }
  if (!answered) {
    // This GPU cannot hold the fused kernel: every query goes to the cuBLAS path below.
    GPUOPT_CUDA_TRY(cudaMemsetAsync(flags, 0xff, query_count * sizeof(std::int32_t), stream));
    if (results.unresolved != nullptr) {
      return unavailable(
          "GPU search_device: the fused kernel does not fit this GPU; call it "
          "without `unresolved` (the cuBLAS path answers, with a wait)");
    }
  }
  if (results.unresolved != nullptr) return ok_status();
  // Wait for the flags; answer the flagged queries with the cuBLAS path and write them back.
  GPUOPT_RETURN_IF_ERROR(s.pinned_flags.reserve(query_count * sizeof(std::int32_t)));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(s.pinned_flags.data, flags, query_count * sizeof(std::int32_t),
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  const auto* flag = static_cast<const std::int32_t*>(s.pinned_flags.data);
  for (std::size_t q = 0; q < query_count; ++q) {
    if (flag[q] == 0) continue;
    std::vector<float> query(s.dim);
    GPUOPT_CUDA_TRY(cudaMemcpy(query.data(), device_queries + q * s.dim, s.dim * sizeof(float),
                               cudaMemcpyDeviceToHost));
    GpuSearchResult one;
    one.positions.assign(k, kNoPosition);
    one.distances.assign(k, FLT_MAX);
    GPUOPT_RETURN_IF_ERROR(
        s.tiled_search(query.data(), 1, k, false, options.tile_rows, mask_device, one, stream));
    std::vector<std::uint64_t> ids(k);
    for (std::size_t i = 0; i < k; ++i) {
      ids[i] = one.positions[i] < s.ids.size() ? s.ids[one.positions[i]] : kNoPosition;
    }
    if (results.distances != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpy(results.distances + q * k, one.distances.data(), k * sizeof(float),
                                 cudaMemcpyHostToDevice));
    }
    if (results.positions != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpy(results.positions + q * k, one.positions.data(),
                                 k * sizeof(std::uint64_t), cudaMemcpyHostToDevice));
    }
    if (results.ids != nullptr) {
      GPUOPT_CUDA_TRY(cudaMemcpy(results.ids + q * k, ids.data(), k * sizeof(std::uint64_t),
                                 cudaMemcpyHostToDevice));
    }
  }
  return ok_status();
}

Status GpuDataset::search_dlpack(const DLTensor& queries, const GpuSearchOptions& options,
                                 const GpuDeviceResults& results, void* stream) {
  if (queries.ndim != 2 || queries.shape == nullptr) {
    return invalid_argument(
        message("DLPack queries: expected 2-D [queries, dim], got %d-D", queries.ndim));
  }
  if (queries.dtype.code != 2 || queries.dtype.bits != 32 || queries.dtype.lanes != 1) {
    return invalid_argument("DLPack queries: expected float32");
  }
  if (queries.shape[1] != static_cast<std::int64_t>(state_->dim) || queries.shape[0] < 0) {
    return invalid_argument(message("DLPack queries: shape [%lld, %lld], dataset dimension %zu",
                                    (long long)queries.shape[0], (long long)queries.shape[1],
                                    state_->dim));
  }
  if (queries.strides != nullptr &&
      (queries.strides[1] != 1 || queries.strides[0] != queries.shape[1])) {
    return invalid_argument("DLPack queries: must be compact row-major");
  }
  if (queries.device.device_type != 2 || queries.device.device_id != state_->device) {
    return invalid_argument(
        message("DLPack queries: device type %d id %d; expected CUDA (2) on "
                "GPU %d",
                queries.device.device_type, queries.device.device_id, state_->device));
  }
  const float* data =
      reinterpret_cast<const float*>(static_cast<const char*>(queries.data) + queries.byte_offset);
  return search_device(data, static_cast<std::size_t>(queries.shape[0]), options, results, stream);
}

void GpuDataset::set_memory_budget(std::size_t bytes) { state_->memory_budget = bytes; }
std::size_t GpuDataset::device_bytes() const {
  return state_->capacity * device_bytes_per_row(state_->dim);
}
const std::uint64_t* GpuDataset::device_ids() const {
  return state_->device_ids.data_as<std::uint64_t>();
}
int GpuDataset::device() const { return state_->device; }

std::size_t GpuDataset::rows() const { return state_->rows; }
std::size_t GpuDataset::dim() const { return state_->dim; }
const float* GpuDataset::device_vectors() const { return state_->vectors.data_as<float>(); }
const float* GpuDataset::device_norms() const { return state_->norms.data_as<float>(); }

}  // namespace gpuopt::vector
