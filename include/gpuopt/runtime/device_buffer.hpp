// Device memory that owns itself: sized, move-only, freed when it goes out of scope (rmm's
// device_buffer is the model). Host-compilable; in a build without CUDA every allocation returns
// UNIMPLEMENTED, so callers need no #if of their own.
#pragma once

#include <cstddef>
#include <utility>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {

class DeviceBuffer {
 public:
  // cudaMalloc on the current device; freed with cudaFree. Zero bytes gives an empty buffer.
  // RESOURCE_EXHAUSTED when the device is out of memory (the message names the size).
  static StatusOr<DeviceBuffer> allocate(std::size_t bytes);
  // Stream-ordered: cudaMallocAsync on `stream`, freed with cudaFreeAsync on the same stream, so
  // work queued there before the free may still use it. INVALID_ARGUMENT for a null stream.
  static StatusOr<DeviceBuffer> allocate_async(std::size_t bytes, StreamHandle stream);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        stream_(std::exchange(other.stream_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size_bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  // The stream a stream-ordered buffer is freed on; nullptr for one from allocate().
  StreamHandle stream() const { return stream_; }

  // cudaMemsetAsync(0) of the whole buffer on `stream`.
  Status zero(StreamHandle stream) const;
  // Copies `bytes` (at most size_bytes()) from host memory (cudaMemcpyAsync on `stream`; the host
  // memory must stay valid until the stream reaches the copy, and pageable memory makes it
  // synchronous).
  Status copy_from_host(const void* host, std::size_t bytes, StreamHandle stream) const;
  // Copies the first `bytes` to host memory (cudaMemcpyAsync on `stream`; the caller waits for the
  // stream before reading `host`). INVALID_ARGUMENT when `bytes` exceeds size_bytes().
  Status copy_to_host(void* host, std::size_t bytes, StreamHandle stream) const;
  // Frees now (reported to stderr if the free fails) and leaves the buffer empty.
  void reset();

 private:
  DeviceBuffer(void* data, std::size_t bytes, StreamHandle stream)
      : data_(data), bytes_(bytes), stream_(stream) {}

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  StreamHandle stream_ = nullptr;
};

}  // namespace gpuopt::runtime
