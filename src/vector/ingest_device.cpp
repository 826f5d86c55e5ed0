// Collection::add_device / add_dlpack: commits rows that live in GPU memory (one stream-ordered
// DMA into pinned staging, then the usual segment + SQLite commit) or in a DLPack tensor.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime.h>
#endif

namespace gpuopt::vector {

namespace {

constexpr std::int32_t kDLCPU = 1;
constexpr std::int32_t kDLCUDA = 2;
constexpr std::int32_t kDLCUDAHost = 3;
constexpr std::int32_t kDLCUDAManaged = 13;

}  // namespace

Status Collection::add_device(std::span<const std::uint64_t> ids, const float* device_vectors,
                              void* stream, std::span<const Metadata> metadata, bool replace) {
#if GPUOPT_CUDA
  if (ids.empty()) return ok_status();
  if (device_vectors == nullptr) return invalid_argument("add_device: device_vectors is null");
  cudaPointerAttributes attributes{};
  GPUOPT_CUDA_TRY(cudaPointerGetAttributes(&attributes, device_vectors));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return invalid_argument(
        "add_device: the pointer is not GPU memory (use add() for host vectors)");
  }
  const std::size_t bytes = ids.size() * dim() * sizeof(float);
  if (device_staging_bytes_ < bytes) {
    // Grow geometrically so a stream of equal batches allocates once.
    std::size_t want = std::max(bytes, device_staging_bytes_ * 2);
    void* pinned = nullptr;
    GPUOPT_CUDA_TRY(cudaHostAlloc(&pinned, want, cudaHostAllocDefault));
    device_staging_.reset(pinned, [](void* p) { GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(p)); });
    device_staging_bytes_ = want;
  }
  cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamPerThread;
  GPUOPT_CUDA_TRY(
      cudaMemcpyAsync(device_staging_.get(), device_vectors, bytes, cudaMemcpyDeviceToHost, s));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(s));
  return write_batch(ids, static_cast<const float*>(device_staging_.get()), metadata, replace);
#else
  (void)ids;
  (void)device_vectors;
  (void)stream;
  (void)metadata;
  (void)replace;
  return unimplemented("add_device: gpuopt was built without CUDA");
#endif
}

Status Collection::add_dlpack(std::span<const std::uint64_t> ids, const DLTensor& tensor,
                              void* stream, std::span<const Metadata> metadata, bool replace) {
  if (tensor.ndim != 2 || tensor.shape == nullptr) {
    return invalid_argument(
        fmt::format("add_dlpack: expected a 2-D [rows, dim] tensor, got {}-D", tensor.ndim));
  }
  if (tensor.dtype.code != 2 || tensor.dtype.bits != 32 || tensor.dtype.lanes != 1) {
    return invalid_argument(
        fmt::format("add_dlpack: expected float32, got code {} bits {} lanes {}", tensor.dtype.code,
                    tensor.dtype.bits, tensor.dtype.lanes));
  }
  const std::int64_t rows = tensor.shape[0];
  const std::int64_t columns = tensor.shape[1];
  if (columns != static_cast<std::int64_t>(dim()) || rows < 0) {
    return invalid_argument(
        fmt::format("add_dlpack: tensor shape [{}, {}], collection \"{}\" has "
                    "dimension {}",
                    rows, columns, name(), dim()));
  }
  if (static_cast<std::uint64_t>(rows) != ids.size()) {
    return invalid_argument(
        fmt::format("add_dlpack: tensor has {} rows for {} ids", rows, ids.size()));
  }
  // Strides of a size-1 dimension carry no meaning (PyTorch reports arbitrary ones there).
  if (tensor.strides != nullptr &&
      ((columns > 1 && tensor.strides[1] != 1) || (rows > 1 && tensor.strides[0] != columns))) {
    return invalid_argument(
        fmt::format("add_dlpack: strides [{}, {}]: the tensor must be compact "
                    "row-major (call .contiguous() first)",
                    tensor.strides[0], tensor.strides[1]));
  }
  if (rows == 0) return ok_status();
  if (tensor.data == nullptr) return invalid_argument("add_dlpack: tensor data is null");
  const float* data =
      reinterpret_cast<const float*>(static_cast<const char*>(tensor.data) + tensor.byte_offset);
  switch (tensor.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return write_batch(ids, data, metadata, replace);
    case kDLCUDA:
    case kDLCUDAManaged: {
#if GPUOPT_CUDA
      int current = 0;
      GPUOPT_CUDA_TRY(cudaGetDevice(&current));
      if (tensor.device.device_id != current) {
        return invalid_argument(
            fmt::format("add_dlpack: the tensor is on GPU {}, the current device is GPU {}",
                        tensor.device.device_id, current));
      }
#endif
      return add_device(ids, data, stream, metadata, replace);
    }
    default:
      return invalid_argument(
          fmt::format("add_dlpack: DLPack device type {} is not supported "
                      "(CPU, CUDA, CUDA host and CUDA managed are)",
                      tensor.device.device_type));
  }
}

}  // namespace gpuopt::vector
