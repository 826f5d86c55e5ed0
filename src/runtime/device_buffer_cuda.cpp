// DeviceBuffer over the CUDA runtime's allocators (device_buffer_unavailable.cpp: without CUDA).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::runtime {

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

Status check_copy_size(std::size_t bytes, std::size_t capacity, const char* direction) {
  if (bytes <= capacity) return ok_status();
  return invalid_argument(
      fmt::format("copy of {} bytes {} a device buffer of {} bytes", bytes, direction, capacity));
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

Status DeviceBuffer::copy_from_host(const void* host, std::size_t bytes,
                                    StreamHandle stream) const {
  GPUOPT_RETURN_IF_ERROR(check_copy_size(bytes, bytes_, "into"));
  if (bytes == 0) return ok_status();
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(data_, host, bytes, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(stream)));
  return ok_status();
}

Status DeviceBuffer::copy_to_host(void* host, std::size_t bytes, StreamHandle stream) const {
  GPUOPT_RETURN_IF_ERROR(check_copy_size(bytes, bytes_, "out of"));
  if (bytes == 0) return ok_status();
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(host, data_, bytes, cudaMemcpyDeviceToHost,
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

}  // namespace gpuopt::runtime
