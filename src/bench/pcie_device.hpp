// Private to the PCIe bench: RAII owners for CUDA resources, the kernel launchers (pcie_kernels.cu)
// and the timed measurement loops (pcie_measure.cpp). Only in builds with CUDA.
#pragma once

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::bench::pcie::detail {

// ---- Kernel launchers (pcie_kernels.cu) -------------------------------------------------------

// Holds `stream` until *release_flag != 0 (host-written, mapped pinned memory) so every copy of a
// sample is queued before the first starts; gives up after timeout_ns and sets *timed_out.
Status launch_spin(const volatile int* release_flag, int* timed_out, std::uint64_t timeout_ns,
                   cudaStream_t stream);
// Grid-stride 16-byte-vector copy by SMs; src/dst are device-accessible (device memory or the
// device pointer of mapped host memory). Both must be 16-byte aligned.
Status launch_sm_copy(void* dst, const void* src, std::size_t bytes, int blocks,
                      cudaStream_t stream);
// The pattern of fill_pattern_reference, written by the GPU.
Status launch_fill_pattern(void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);
// Adds to *mismatches (device memory) the bytes that differ from the pattern.
Status launch_count_mismatches(const void* data, std::size_t bytes, std::uint64_t seed,
                               unsigned long long* mismatches, cudaStream_t stream);

// ---- RAII owners -----------------------------------------------------------------------------

// Device memory is runtime::DeviceBuffer. Host buffers stay here: they are mapped (kernels read
// them through device_pointer_of), which runtime::PinnedPool's blocks are not.
struct PinnedMemoryDeleter {
  void operator()(void* p) const { GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(p)); }
};
using PinnedMemory = std::unique_ptr<void, PinnedMemoryDeleter>;

// cudaHostAlloc, portable and mapped.
StatusOr<PinnedMemory> allocate_pinned(std::size_t bytes);
// The device pointer of mapped (pinned or registered) host memory.
StatusOr<void*> device_pointer_of(void* host);

class Stream {
 public:
  static StatusOr<Stream> create();
  Stream(Stream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  Stream& operator=(Stream&&) = delete;
  ~Stream();
  cudaStream_t get() const { return stream_; }

 private:
  explicit Stream(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  static StatusOr<Event> create();
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event& operator=(Event&&) = delete;
  ~Event();
  cudaEvent_t get() const { return event_; }

 private:
  explicit Event(cudaEvent_t event) : event_(event) {}
  cudaEvent_t event_ = nullptr;
};

// ---- Measurement -----------------------------------------------------------------------------

// One stream's work in a sample: `copies` back-to-back copies of `bytes` from src to dst.
struct Lane {
  cudaStream_t stream = nullptr;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  bool sm_kernel = false;  // false: cudaMemcpyAsync (copy engine); true: launch_sm_copy
};

// Times samples the nvbandwidth way: every lane's stream is held by a spin kernel, start events,
// all copies queued, end events, then the host releases the spin; per lane, milliseconds per
// sample for `copies` copies.
class SpinTimer {
 public:
  static StatusOr<SpinTimer> create(int device);
  SpinTimer(SpinTimer&&) noexcept = default;
  ~SpinTimer() = default;

  StatusOr<std::vector<std::vector<double>>> time_lanes(const std::vector<Lane>& lanes, int copies,
                                                        int warmup, int samples);
  int sm_count() const { return sm_count_; }

 private:
  SpinTimer() = default;
  PinnedMemory flags_;  // [0] release flag, [1] timed-out flag
  int* device_flags_ = nullptr;
  int sm_count_ = 1;
};

// Enqueues one copy of a lane (no timing).
Status enqueue_copy(const Lane& lane, int sm_blocks);

// Host-clock timing for pageable memory, where cudaMemcpyAsync blocks the host while it stages
// the data, so a spin kernel would never be released: milliseconds per sample of `copies` copies,
// from the first enqueue to the stream's completion.
StatusOr<std::vector<double>> time_on_host(const Lane& lane, int copies, int warmup, int samples);

// Latency of single small copies: per iteration, the GPU time between events around the copy and
// the host's enqueue-to-synchronized round trip, in microseconds.
struct LatencySamples {
  std::vector<double> event_us;
  std::vector<double> round_trip_us;
};
StatusOr<LatencySamples> time_single_copies(const Lane& lane, int warmup, int iterations);

// Bytes of `data` (device or mapped host memory) that differ from the pattern, counted by the GPU.
StatusOr<std::size_t> count_mismatches_on_device(const void* data, std::size_t bytes,
                                                 std::uint64_t seed, cudaStream_t stream);

}  // namespace gpuopt::bench::pcie::detail
#endif  // GPUOPT_CUDA
