// Timed copy loops of the PCIe bench: spin-held event timing (as nvbandwidth), host-clock timing
// for pageable memory, single-copy latency, and GPU-side verification.
#include <fmt/format.h>

#include <atomic>
#include <chrono>

#include "bench/pcie_device.hpp"

namespace gpuopt::bench::pcie::detail {

namespace {
// Long enough for any sane enqueue of a sample's copies; short enough that a stuck host thread
// costs seconds, not a hung benchmark.
constexpr std::uint64_t kSpinTimeoutNs = 10'000'000'000ull;
}  // namespace

StatusOr<PinnedMemory> allocate_pinned(std::size_t bytes) {
  void* p = nullptr;
  GPUOPT_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  return PinnedMemory(p);
}

StatusOr<void*> device_pointer_of(void* host) {
  void* device = nullptr;
  GPUOPT_CUDA_TRY(cudaHostGetDevicePointer(&device, host, 0));
  return device;
}

StatusOr<Stream> Stream::create() {
  cudaStream_t stream = nullptr;
  GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return Stream(stream);
}
Stream::~Stream() {
  if (stream_ != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream_));
}

StatusOr<Event> Event::create() {
  cudaEvent_t event = nullptr;
  GPUOPT_CUDA_TRY(cudaEventCreate(&event));
  return Event(event);
}
Event::~Event() {
  if (event_ != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(event_));
}

StatusOr<SpinTimer> SpinTimer::create(int device) {
  SpinTimer timer;
  GPUOPT_ASSIGN_OR_RETURN(timer.flags_, allocate_pinned(2 * sizeof(int)));
  GPUOPT_ASSIGN_OR_RETURN(void* device_flags, device_pointer_of(timer.flags_.get()));
  timer.device_flags_ = static_cast<int*>(device_flags);
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&timer.sm_count_, cudaDevAttrMultiProcessorCount, device));
  return timer;
}

Status enqueue_copy(const Lane& lane, int sm_blocks) {
  if (lane.sm_kernel) return launch_sm_copy(lane.dst, lane.src, lane.bytes, sm_blocks, lane.stream);
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(lane.dst, lane.src, lane.bytes, cudaMemcpyDefault, lane.stream));
  return ok_status();
}

StatusOr<std::vector<std::vector<double>>> SpinTimer::time_lanes(const std::vector<Lane>& lanes,
                                                                 int copies, int warmup,
                                                                 int samples) {
  std::vector<Event> starts, ends;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    GPUOPT_ASSIGN_OR_RETURN(Event start, Event::create());
    GPUOPT_ASSIGN_OR_RETURN(Event end, Event::create());
    starts.push_back(std::move(start));
    ends.push_back(std::move(end));
  }
  // Blocks enough to keep every SM busy several times over (host reads are latency-bound).
  const int sm_blocks = sm_count_ * 4;
  volatile int* host_flags = static_cast<volatile int*>(flags_.get());
  std::vector<std::vector<double>> milliseconds(lanes.size());
  for (int sample = -warmup; sample < samples; ++sample) {
    host_flags[0] = 0;
    host_flags[1] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      GPUOPT_RETURN_IF_ERROR(
          launch_spin(device_flags_, device_flags_ + 1, kSpinTimeoutNs, lanes[i].stream));
      GPUOPT_CUDA_TRY(cudaEventRecord(starts[i].get(), lanes[i].stream));
    }
    Status queued = ok_status();
    for (int copy = 0; copy < copies && queued.ok(); ++copy) {
      for (const Lane& lane : lanes) {
        queued = enqueue_copy(lane, sm_blocks);
        if (!queued.ok()) break;
      }
    }
    for (std::size_t i = 0; i < lanes.size() && queued.ok(); ++i) {
      queued = GPUOPT_CUDA_STATUS(cudaEventRecord(ends[i].get(), lanes[i].stream));
    }
    // Release the spin even after an error, so the streams drain instead of waiting for timeout.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    host_flags[0] = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (const Lane& lane : lanes) GPUOPT_CUDA_TRY(cudaStreamSynchronize(lane.stream));
    GPUOPT_RETURN_IF_ERROR(queued);
    if (host_flags[1] != 0) {
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("the spin kernel gave up after {} s before the host released it; "
                                "the sample's copies took too long to queue",
                                kSpinTimeoutNs / 1'000'000'000ull));
    }
    if (sample < 0) continue;
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      float ms = 0;
      GPUOPT_CUDA_TRY(cudaEventElapsedTime(&ms, starts[i].get(), ends[i].get()));
      milliseconds[i].push_back(ms);
    }
  }
  return milliseconds;
}

StatusOr<std::vector<double>> time_on_host(const Lane& lane, int copies, int warmup, int samples) {
  std::vector<double> milliseconds;
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(lane.stream));
  for (int sample = -warmup; sample < samples; ++sample) {
    auto start = std::chrono::steady_clock::now();
    for (int copy = 0; copy < copies; ++copy) GPUOPT_RETURN_IF_ERROR(enqueue_copy(lane, 1));
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(lane.stream));
    auto end = std::chrono::steady_clock::now();
    if (sample >= 0) {
      milliseconds.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    }
  }
  return milliseconds;
}

StatusOr<LatencySamples> time_single_copies(const Lane& lane, int warmup, int iterations) {
  GPUOPT_ASSIGN_OR_RETURN(Event start, Event::create());
  GPUOPT_ASSIGN_OR_RETURN(Event end, Event::create());
  LatencySamples out;
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(lane.stream));
  for (int i = -warmup; i < iterations; ++i) {
    auto host_start = std::chrono::steady_clock::now();
    GPUOPT_CUDA_TRY(cudaEventRecord(start.get(), lane.stream));
    GPUOPT_RETURN_IF_ERROR(enqueue_copy(lane, 1));
    GPUOPT_CUDA_TRY(cudaEventRecord(end.get(), lane.stream));
    GPUOPT_CUDA_TRY(cudaEventSynchronize(end.get()));
    auto host_end = std::chrono::steady_clock::now();
    if (i < 0) continue;
    float ms = 0;
    GPUOPT_CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), end.get()));
    out.event_us.push_back(ms * 1e3);
    out.round_trip_us.push_back(
        std::chrono::duration<double, std::micro>(host_end - host_start).count());
  }
  return out;
}

StatusOr<std::size_t> count_mismatches_on_device(const void* data, std::size_t bytes,
                                                 std::uint64_t seed, cudaStream_t stream) {
  GPUOPT_ASSIGN_OR_RETURN(PinnedMemory counter, allocate_pinned(sizeof(unsigned long long)));
  GPUOPT_ASSIGN_OR_RETURN(void* device_counter, device_pointer_of(counter.get()));
  *static_cast<volatile unsigned long long*>(counter.get()) = 0;
  GPUOPT_RETURN_IF_ERROR(launch_count_mismatches(
      data, bytes, seed, static_cast<unsigned long long*>(device_counter), stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  return static_cast<std::size_t>(*static_cast<volatile unsigned long long*>(counter.get()));
}

}  // namespace gpuopt::bench::pcie::detail
