// DeviceBuffer over the CUDA runtime's allocators; UNIMPLEMENTED in CPU-only builds.
#include "gpuopt/runtime/device_buffer.hpp"

#include <fmt/format.h>

#include <utility>

#include "gpuopt/core/cuda_check.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::runtime {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

#if GPUOPT_CUDA

namespace {
Status allocation_status(cudaError_t error, std::size_t bytes, const char* how) {
  if (error == cudaSuccess) return ok_status();
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return resource_exhausted(
        fmt::format("{} of {} bytes: the device is out of memory", how, bytes));
  }
  return GPUOPT_CUDA_STATUS(error);
}
}  // namespace

StatusOr<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  void* data = nullptr;
  GPUOPT_RETURN_IF_ERROR(allocation_status(cudaMalloc(&data, bytes), bytes, "cudaMalloc"));
  return DeviceBuffer(data, bytes, nullptr);
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate_async(std::size_t bytes, StreamHandle stream) {
  if (stream == nullptr) {
    return invalid_argument("DeviceBuffer::allocate_async needs a stream (not the default stream)");
  }
  if (bytes == 0) return DeviceBuffer();
  void* data = nullptr;
  GPUOPT_RETURN_IF_ERROR(allocation_status(
      cudaMallocAsync(&data, bytes, static_cast<cudaStream_t>(stream)), bytes, "cudaMallocAsync"));
  return DeviceBuffer(data, bytes, stream);
}

Status DeviceBuffer::zero(StreamHandle stream) const {
  if (bytes_ == 0) return ok_status();
  GPUOPT_CUDA_TRY(cudaMemsetAsync(data_, 0, bytes_, static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status DeviceBuffer::copy_from_host(const void* host, std::size_t bytes, StreamHandle stream) const {
  if (bytes > bytes_) {
    return invalid_argument(
        fmt::format("copy of {} bytes into a device buffer of {} bytes", bytes, bytes_));
  }
  if (bytes == 0) return ok_status();
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(data_, host, bytes, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(stream)));
  return ok_status();
}

void DeviceBuffer::reset() {
  if (data_ == nullptr) return;
  if (stream_ != nullptr) {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeAsync(data_, static_cast<cudaStream_t>(stream_)));
  } else {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(data_));
  }
  data_ = nullptr;
  bytes_ = 0;
  stream_ = nullptr;
}

#else  // !GPUOPT_CUDA

StatusOr<DeviceBuffer> DeviceBuffer::allocate(std::size_t) {
  return unimplemented("DeviceBuffer::allocate: gpuopt was built without CUDA");
}
StatusOr<DeviceBuffer> DeviceBuffer::allocate_async(std::size_t, StreamHandle) {
  return unimplemented("DeviceBuffer::allocate_async: gpuopt was built without CUDA");
}
Status DeviceBuffer::zero(StreamHandle) const {
  return unimplemented("DeviceBuffer::zero: gpuopt was built without CUDA");
}
Status DeviceBuffer::copy_from_host(const void*, std::size_t, StreamHandle) const {
  return unimplemented("DeviceBuffer::copy_from_host: gpuopt was built without CUDA");
}
void DeviceBuffer::reset() {
  data_ = nullptr;
  bytes_ = 0;
  stream_ = nullptr;
}

#endif  // GPUOPT_CUDA

}  // namespace gpuopt::runtime
