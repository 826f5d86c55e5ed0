// TensorListScaler: unscale, unscale + L2 norm and the clip multiply over a tensor list given with
// every call. The list travels as a device table (pinned upload, reused while unchanged); each
// block walks chunks grid-stride and finds a chunk's tensor by binary search over the table (in
// shared memory up to kSharedEntries tensors).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "kernels/loss_scaler_tensor_list.hpp"

namespace gpuopt::kernels {
namespace detail {
namespace {

enum class ListMode {
  kUnscale,      // check, x = dtype(x * inv)
  kUnscaleNorm,  // check, sum of squares of dtype(x * inv); nothing written
  kScaleTwice,   // x = dtype(dtype(x * inv) * second); no check
};

constexpr int kListThreads = 256;
constexpr int kListVectorsInFlight = 4;  // 16-byte loads in flight per thread
// Tables up to this many tensors are copied to shared memory once per block, so finding a chunk's
// tensor costs shared-memory loads instead of a chain of dependent global loads per chunk.
constexpr unsigned kSharedEntries = 256;  // 8 KiB

template <GradientDtype kDtype>
__device__ __forceinline__ float round_to(float x) {
  if constexpr (kDtype == GradientDtype::kFloat16) {
    return __half2float(__float2half_rn(x));
  } else if constexpr (kDtype == GradientDtype::kBFloat16) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return x;
  }
}

// One element (as float): updates the inf/NaN flag and the sum of squares; returns the value to
// store (kUnscaleNorm stores nothing). __fmul_rn keeps each product a separately rounded multiply.
template <ListMode kMode, GradientDtype kDtype>
__device__ __forceinline__ float apply(float x, float first, float second, bool& bad, float& sum) {
  if constexpr (kMode == ListMode::kUnscale) {
    bad |= (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
    return __fmul_rn(x, first);
  } else if constexpr (kMode == ListMode::kUnscaleNorm) {
    bad |= (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
    const float y = round_to<kDtype>(__fmul_rn(x, first));
    sum = fmaf(y, y, sum);
    return x;
  } else {
    const float y = first == 1.0f ? x : round_to<kDtype>(__fmul_rn(x, first));
    return second == 1.0f ? y : __fmul_rn(y, second);
  }
}

template <ListMode kMode, GradientDtype kDtype>
__device__ __forceinline__ void apply_vector(uint4& v, float first, float second, bool& bad,
                                             float& sum) {
  std::uint32_t* words = reinterpret_cast<std::uint32_t*>(&v);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if constexpr (kDtype == GradientDtype::kFloat32) {
      words[w] =
          __float_as_uint(apply<kMode, kDtype>(__uint_as_float(words[w]), first, second, bad, sum));
    } else if constexpr (kDtype == GradientDtype::kFloat16) {
      float2 f = __half22float2(*reinterpret_cast<__half2*>(&words[w]));
      f.x = apply<kMode, kDtype>(f.x, first, second, bad, sum);
      f.y = apply<kMode, kDtype>(f.y, first, second, bad, sum);
      if constexpr (kMode != ListMode::kUnscaleNorm) {
        __half2 r = __floats2half2_rn(f.x, f.y);
        words[w] = *reinterpret_cast<std::uint32_t*>(&r);
      }
    } else {
      float2 f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&words[w]));
      f.x = apply<kMode, kDtype>(f.x, first, second, bad, sum);
      f.y = apply<kMode, kDtype>(f.y, first, second, bad, sum);
      if constexpr (kMode != ListMode::kUnscaleNorm) {
        __nv_bfloat162 r = __floats2bfloat162_rn(f.x, f.y);
        words[w] = *reinterpret_cast<std::uint32_t*>(&r);
      }
    }
  }
}

template <ListMode kMode, GradientDtype kDtype>
__device__ __forceinline__ void apply_scalar(char* address, float first, float second, bool write,
                                             bool& bad, float& sum) {
  if constexpr (kDtype == GradientDtype::kFloat32) {
    float* p = reinterpret_cast<float*>(address);
    const float y = apply<kMode, kDtype>(*p, first, second, bad, sum);
    if (kMode != ListMode::kUnscaleNorm && write) *p = y;
  } else if constexpr (kDtype == GradientDtype::kFloat16) {
    __half* p = reinterpret_cast<__half*>(address);
    const float y = apply<kMode, kDtype>(__half2float(*p), first, second, bad, sum);
    if (kMode != ListMode::kUnscaleNorm && write) *p = __float2half_rn(y);
  } else {
    __nv_bfloat16* p = reinterpret_cast<__nv_bfloat16*>(address);
    const float y = apply<kMode, kDtype>(__bfloat162float(*p), first, second, bad, sum);
    if (kMode != ListMode::kUnscaleNorm && write) *p = __float2bfloat16_rn(y);
  }
}

// `count` elements at `data` (element-aligned): a scalar head up to the first 16-byte boundary,
// 16-byte vectors with kListVectorsInFlight loads in flight per thread, a scalar tail.
template <ListMode kMode, GradientDtype kDtype>
__device__ __forceinline__ void process_span(char* data, unsigned count, float first, float second,
                                             bool write, bool& bad, float& sum) {
  constexpr unsigned kElement = kDtype == GradientDtype::kFloat32 ? 4 : 2;
  constexpr unsigned kPerVector = 16 / kElement;
  const unsigned misalignment = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(data) & 15u);
  unsigned head = misalignment == 0 ? 0 : (16 - misalignment) / kElement;
  if (head > count) head = count;
  if (threadIdx.x < head) {
    apply_scalar<kMode, kDtype>(data + threadIdx.x * kElement, first, second, write, bad, sum);
  }
  uint4* vectors = reinterpret_cast<uint4*>(data + head * kElement);
  const unsigned vector_count = (count - head) / kPerVector;
  for (unsigned base = threadIdx.x; base < vector_count;
       base += blockDim.x * kListVectorsInFlight) {
    uint4 v[kListVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kListVectorsInFlight; ++u) {
      const unsigned index = base + u * blockDim.x;
      if (index < vector_count) v[u] = __ldcs(vectors + index);
    }
#pragma unroll
    for (int u = 0; u < kListVectorsInFlight; ++u) {
      const unsigned index = base + u * blockDim.x;
      if (index < vector_count) {
        apply_vector<kMode, kDtype>(v[u], first, second, bad, sum);
        if (kMode != ListMode::kUnscaleNorm && write) __stcs(vectors + index, v[u]);
      }
    }
  }
  const unsigned tail_start = head + vector_count * kPerVector;
  if (threadIdx.x < count - tail_start) {
    apply_scalar<kMode, kDtype>(data + (tail_start + threadIdx.x) * kElement, first, second, write,
                                bad, sum);
  }
}

// Sum over the block; the result is valid in thread 0.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float warp_sums[kListThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if ((threadIdx.x & 31u) == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
  }
  return total;
}

// The phase-one kernel of every mode: grid-stride over all chunks of all tensors.
template <ListMode kMode>
__global__ void __launch_bounds__(kListThreads)
    k_tensor_list(const TensorEntry* __restrict__ table, unsigned entry_count,
                  unsigned long long chunk_count, const float* scale, const float* second_factor,
                  float* found_inf, float* partials) {
  // As GradScaler.unscale_: the reciprocal in fp64, rounded to fp32, applied in fp32.
  const float first =
      scale != nullptr ? static_cast<float>(1.0 / static_cast<double>(*scale)) : 1.0f;
  const float second =
      kMode == ListMode::kScaleTwice && second_factor != nullptr ? *second_factor : 1.0f;
  // torch leaves x as it is when inv == 1: nothing to write then, only the check.
  const bool write = kMode == ListMode::kUnscaleNorm ? false
                     : kMode == ListMode::kUnscale   ? first != 1.0f
                                                     : first != 1.0f || second != 1.0f;
  if (kMode == ListMode::kScaleTwice && !write) return;  // uniform over the grid
  __shared__ TensorEntry shared_table[kSharedEntries];
  const TensorEntry* lookup = table;
  if (entry_count <= kSharedEntries) {  // uniform over the grid
    for (unsigned i = threadIdx.x; i < entry_count; i += blockDim.x) shared_table[i] = table[i];
    __syncthreads();
    lookup = shared_table;
  }
  bool bad = false;
  float sum = 0.0f;
  for (unsigned long long c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const TensorEntry entry = lookup[entry_of_chunk(lookup, entry_count, c)];
    const unsigned long long offset = (c - entry.first_chunk) * entry.chunk_elements;
    const unsigned long long left = entry.count - offset;
    const unsigned count =
        static_cast<unsigned>(left < entry.chunk_elements ? left : entry.chunk_elements);
    switch (static_cast<GradientDtype>(entry.dtype)) {
      case GradientDtype::kFloat16:
        process_span<kMode, GradientDtype::kFloat16>(entry.data + offset * 2, count, first, second,
                                                     write, bad, sum);
        break;
      case GradientDtype::kBFloat16:
        process_span<kMode, GradientDtype::kBFloat16>(entry.data + offset * 2, count, first, second,
                                                      write, bad, sum);
        break;
      case GradientDtype::kFloat32:
        process_span<kMode, GradientDtype::kFloat32>(entry.data + offset * 4, count, first, second,
                                                     write, bad, sum);
        break;
    }
  }
  if constexpr (kMode != ListMode::kScaleTwice) {
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
  }
  if constexpr (kMode == ListMode::kUnscaleNorm) {
    const float total = block_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
  }
}

// Phase two, one block: the norm from the partial sums (added in fp64) and torch's clip factor
// in its own fp32 operations (clip_coefficient_reference).
__global__ void __launch_bounds__(kListThreads)
    k_finish_norm(const float* __restrict__ partials, unsigned count, float max_norm,
                  const float* scale, float* total_norm, float* coefficient,
                  float* combined_scale) {
  __shared__ double sums[kListThreads];
  double sum = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const float norm = static_cast<float>(sqrt(sums[0]));
  const float reciprocal = __frcp_rn(__fadd_rn(norm, 1e-6f));
  float clip = __fmul_rn(reciprocal, max_norm);
  if (clip > 1.0f) clip = 1.0f;  // NaN stays NaN, as torch.clamp
  *total_norm = norm;
  *coefficient = clip;
  if (combined_scale != nullptr) {
    *combined_scale = scale != nullptr ? __fdiv_rn(*scale, clip) : __frcp_rn(clip);
  }
}

// Restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0) GPUOPT_CUDA_TRY_NO_THROW(cudaSetDevice(previous_));
  }
  Status enter(int device) {
    int current = 0;
    GPUOPT_CUDA_TRY(cudaGetDevice(&current));
    if (current != device) {
      GPUOPT_CUDA_TRY(cudaSetDevice(device));
      previous_ = current;
    }
    return ok_status();
  }

 private:
  int previous_ = -1;
};

}  // namespace

// One device table with its pinned staging copy, the partial sums that follow it on the device,
// and the event recorded after the last launch that read either.
struct TableSlot {
  std::vector<TensorEntry> content;  // what the device copy holds
  std::uint64_t chunk_count = 0;
  bool has_content = false;
  TensorEntry* pinned = nullptr;
  std::size_t capacity = 0;      // entries
  runtime::DeviceBuffer device;  // capacity entries, then max_blocks floats
  cudaEvent_t done = nullptr;
  CUstream_st* last_stream = nullptr;

  TableSlot() = default;
  TableSlot(const TableSlot&) = delete;
  TableSlot& operator=(const TableSlot&) = delete;
  ~TableSlot() {
    // Queued work may still read the table: wait for it before the memory goes.
    if (done != nullptr) {
      GPUOPT_CUDA_TRY_NO_THROW(cudaEventSynchronize(done));
      GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(done));
    }
    if (pinned != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(pinned));
  }
  float* partials() const {
    return reinterpret_cast<float*>(device.data_as<char>() + capacity * sizeof(TensorEntry));
  }
};

}  // namespace detail

using detail::TableSlot;
using detail::TensorEntry;
using detail::TensorTable;

struct TensorListScaler::Impl {
  int device = 0;
  TensorListOptions options;
  int grid_blocks = 1;
  std::vector<std::unique_ptr<TableSlot>> slots;
  std::size_t next_slot = 0;  // where the search for an idle slot starts (round robin)
  std::uint64_t uploads = 0;

  // A slot holding `table` on the device, queued on `stream` when it had to be uploaded.
  StatusOr<TableSlot*> acquire(const TensorTable& table, CUstream_st* stream) {
    for (const auto& slot : slots) {
      if (!slot->has_content || slot->chunk_count != table.chunk_count ||
          slot->content != table.entries) {
        continue;
      }
      // The same table: reusable at once on its own stream (stream order protects the
      // partials); from another stream only once the work queued with it is done.
      if (slot->last_stream == stream) return slot.get();
      const cudaError_t state = cudaEventQuery(slot->done);
      if (state == cudaSuccess) return slot.get();
      if (state != cudaErrorNotReady) GPUOPT_CUDA_TRY(state);
    }
    TableSlot* chosen = nullptr;
    for (std::size_t k = 0; k < slots.size() && chosen == nullptr; ++k) {
      const std::size_t index = (next_slot + k) % slots.size();
      const cudaError_t state = cudaEventQuery(slots[index]->done);
      if (state == cudaSuccess) {
        chosen = slots[index].get();
        next_slot = index + 1;
      } else if (state != cudaErrorNotReady) {
        GPUOPT_CUDA_TRY(state);
      }
    }
    if (chosen == nullptr && slots.size() < static_cast<std::size_t>(options.max_table_slots)) {
      auto slot = std::make_unique<TableSlot>();
      GPUOPT_CUDA_TRY(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
      slots.push_back(std::move(slot));
      chosen = slots.back().get();
    }
    if (chosen == nullptr) {
      // Every table is still in use by queued work: the one synchronisation of this class.
      const std::size_t index = next_slot % slots.size();
      GPUOPT_CUDA_TRY(cudaEventSynchronize(slots[index]->done));
      chosen = slots[index].get();
      next_slot = index + 1;
    }
    if (chosen->capacity < table.entries.size() || chosen->device.empty()) {
      std::size_t capacity = 256;
      while (capacity < table.entries.size()) capacity *= 2;
      if (chosen->pinned != nullptr) {
        GPUOPT_CUDA_TRY(cudaFreeHost(chosen->pinned));
        chosen->pinned = nullptr;
      }
      chosen->device.reset();
      chosen->capacity = 0;
      void* pinned = nullptr;
      GPUOPT_CUDA_TRY(cudaHostAlloc(&pinned, capacity * sizeof(TensorEntry), cudaHostAllocDefault));
      chosen->pinned = static_cast<TensorEntry*>(pinned);
      GPUOPT_ASSIGN_OR_RETURN(
          chosen->device,
          runtime::DeviceBuffer::allocate(capacity * sizeof(TensorEntry) +
                                          static_cast<std::size_t>(grid_blocks) * sizeof(float)));
      chosen->capacity = capacity;
    }
    chosen->has_content = false;
    std::memcpy(chosen->pinned, table.entries.data(), table.entries.size() * sizeof(TensorEntry));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(chosen->device.data(), chosen->pinned,
                                    table.entries.size() * sizeof(TensorEntry),
                                    cudaMemcpyHostToDevice, stream));
    ++uploads;
    chosen->content = table.entries;
    chosen->chunk_count = table.chunk_count;
    chosen->has_content = true;
    return chosen;
  }

  // Marks the slot in use by everything queued on `stream` so far.
  Status release(TableSlot* slot, CUstream_st* stream) {
    GPUOPT_CUDA_TRY(cudaEventRecord(slot->done, stream));
    slot->last_stream = stream;
    return ok_status();
  }

  unsigned blocks_for(std::uint64_t chunk_count) const {
    const std::uint64_t blocks = std::min<std::uint64_t>(grid_blocks, chunk_count);
    return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
  }

  template <detail::ListMode kMode>
  Status launch(std::span<const GradientTensor> gradients, const float* scale, const float* second,
                float* found_inf, TableSlot** used, unsigned* blocks_used, CUstream_st* stream) {
    GPUOPT_ASSIGN_OR_RETURN(TensorTable table,
                            detail::build_tensor_table(gradients, options.chunk_bytes));
    *used = nullptr;
    *blocks_used = 0;
    if (table.chunk_count == 0) return ok_status();
    GPUOPT_ASSIGN_OR_RETURN(TableSlot * slot, acquire(table, stream));
    const unsigned blocks = blocks_for(table.chunk_count);
    detail::k_tensor_list<kMode><<<blocks, detail::kListThreads, 0, stream>>>(
        slot->device.data_as<const TensorEntry>(), static_cast<unsigned>(table.entries.size()),
        table.chunk_count, scale, second, found_inf, slot->partials());
    GPUOPT_CUDA_TRY_LAUNCH();
    *used = slot;
    *blocks_used = blocks;
    return ok_status();
  }
};

TensorListScaler::TensorListScaler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorListScaler::~TensorListScaler() = default;

StatusOr<std::unique_ptr<TensorListScaler>> TensorListScaler::create(
    int device, const TensorListOptions& options) {
  GPUOPT_RETURN_IF_ERROR(validate(options));
  int device_count = 0;
  GPUOPT_CUDA_TRY(cudaGetDeviceCount(&device_count));
  if (device < 0 || device >= device_count) {
    return invalid_argument("TensorListScaler: device " + std::to_string(device) +
                            " does not exist (" + std::to_string(device_count) + " devices)");
  }
  detail::DeviceGuard guard;
  GPUOPT_RETURN_IF_ERROR(guard.enter(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->options = options;
  int sms = 0, per_sm = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GPUOPT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, detail::k_tensor_list<detail::ListMode::kUnscale>, detail::kListThreads, 0));
  impl->grid_blocks = std::max(1, sms * per_sm);
  if (options.max_blocks > 0) impl->grid_blocks = std::min(impl->grid_blocks, options.max_blocks);
  return std::unique_ptr<TensorListScaler>(new TensorListScaler(std::move(impl)));
}

Status TensorListScaler::unscale(std::span<const GradientTensor> gradients, const float* scale,
                                 float* found_inf, CUstream_st* stream) {
  if (found_inf == nullptr) return invalid_argument("TensorListScaler::unscale: null found_inf");
  detail::DeviceGuard guard;
  GPUOPT_RETURN_IF_ERROR(guard.enter(impl_->device));
  TableSlot* slot = nullptr;
  unsigned blocks = 0;
  GPUOPT_RETURN_IF_ERROR(impl_->launch<detail::ListMode::kUnscale>(
      gradients, scale, nullptr, found_inf, &slot, &blocks, stream));
  if (slot != nullptr) GPUOPT_RETURN_IF_ERROR(impl_->release(slot, stream));
  return ok_status();
}

Status TensorListScaler::unscale_norm(std::span<const GradientTensor> gradients, const float* scale,
                                      float* found_inf, float max_norm, const NormOutputs& outputs,
                                      CUstream_st* stream) {
  if (found_inf == nullptr || outputs.total_norm == nullptr ||
      outputs.clip_coefficient == nullptr) {
    return invalid_argument(
        "TensorListScaler::unscale_norm: found_inf, total_norm and clip_coefficient are required");
  }
  detail::DeviceGuard guard;
  GPUOPT_RETURN_IF_ERROR(guard.enter(impl_->device));
  TableSlot* slot = nullptr;
  unsigned blocks = 0;
  GPUOPT_RETURN_IF_ERROR(impl_->launch<detail::ListMode::kUnscaleNorm>(
      gradients, scale, nullptr, found_inf, &slot, &blocks, stream));
  // No gradients: the norm of nothing is 0, as clip_grad_norm_ answers.
  detail::k_finish_norm<<<1, detail::kListThreads, 0, stream>>>(
      slot != nullptr ? slot->partials() : nullptr, blocks, max_norm, scale, outputs.total_norm,
      outputs.clip_coefficient, outputs.combined_scale);
  GPUOPT_CUDA_TRY_LAUNCH();
  if (slot != nullptr) GPUOPT_RETURN_IF_ERROR(impl_->release(slot, stream));
  return ok_status();
}

Status TensorListScaler::scale_twice(std::span<const GradientTensor> gradients, const float* scale,
                                     const float* second, CUstream_st* stream) {
  detail::DeviceGuard guard;
  GPUOPT_RETURN_IF_ERROR(guard.enter(impl_->device));
  TableSlot* slot = nullptr;
  unsigned blocks = 0;
  GPUOPT_RETURN_IF_ERROR(impl_->launch<detail::ListMode::kScaleTwice>(
      gradients, scale, second, nullptr, &slot, &blocks, stream));
  if (slot != nullptr) GPUOPT_RETURN_IF_ERROR(impl_->release(slot, stream));
  return ok_status();
}

std::size_t TensorListScaler::table_slots() const { return impl_->slots.size(); }
std::uint64_t TensorListScaler::table_uploads() const { return impl_->uploads; }
int TensorListScaler::grid_blocks() const { return impl_->grid_blocks; }

}  // namespace gpuopt::kernels
