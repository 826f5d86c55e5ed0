// RAII device, stream and event over the CUDA runtime; UNIMPLEMENTED in CPU-only builds.
#include "gpuopt/runtime/stream.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/partition.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::runtime {

namespace {
[[maybe_unused]] Status not_built_with_cuda(std::string_view what) {
  return unimplemented(fmt::format("{}: gpuopt was built without CUDA", what));
}
}  // namespace

std::string_view priority_name(Priority priority) {
  switch (priority) {
    case Priority::kCritical:
      return "critical";
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kBackground:
      return "background";
  }
  return "unknown";
}

StatusOr<Priority> parse_priority(std::string_view text) {
  for (int level = 0; level < kPriorityLevels; ++level) {
    auto priority = static_cast<Priority>(level);
    if (text == priority_name(priority)) return priority;
  }
  return invalid_argument(
      fmt::format("unknown priority '{}': expected critical, high, normal or background", text));
}

int priority_value(Priority priority, int least_priority, int greatest_priority) {
  // Ranks 0..3 spread over the span; rounding keeps critical at `greatest` and background at
  // `least`.
  const int span = least_priority - greatest_priority;  // >= 0
  const int rank = static_cast<int>(priority);
  const int offset = (span * rank * 2 + (kPriorityLevels - 1)) / (2 * (kPriorityLevels - 1));
  return std::clamp(greatest_priority + offset, std::min(greatest_priority, least_priority),
                    std::max(greatest_priority, least_priority));
}

#if GPUOPT_CUDA

StatusOr<Device> Device::open(int ordinal) {
  GPUOPT_ASSIGN_OR_RETURN(int count, cuda_device_count());
  if (ordinal < 0 || ordinal >= count) {
    return invalid_argument(
        fmt::format("CUDA device {} does not exist: {} device(s) present", ordinal, count));
  }
  Device device;
  DeviceProperties& p = device.properties_;
  p.ordinal = ordinal;
  GPUOPT_CUDA_TRY(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  GPUOPT_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal));
  p.name = prop.name;
  p.sm_count = prop.multiProcessorCount;
  p.compute_major = prop.major;
  p.compute_minor = prop.minor;
  p.total_memory_bytes = prop.totalGlobalMem;
  GPUOPT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&p.least_priority, &p.greatest_priority));
  GPUOPT_CUDA_TRY(cudaDriverGetVersion(&p.driver_version));
  GPUOPT_CUDA_TRY(cudaRuntimeGetVersion(&p.runtime_version));
  return device;
}

Status Device::make_current() const { return GPUOPT_CUDA_STATUS(cudaSetDevice(ordinal())); }

StatusOr<Stream> Stream::create(const Device& device, int priority) {
  if (partition_plan_active(device.ordinal())) {
    return failed_precondition(
        fmt::format("Stream::create: an SM PartitionPlan is active on device {}; take streams from "
                    "plan.workload(name) so every workload runs inside its partition",
                    device.ordinal()));
  }
  GPUOPT_RETURN_IF_ERROR(device.make_current());
  const auto& p = device.properties();
  priority = std::clamp(priority, p.greatest_priority, p.least_priority);
  cudaStream_t stream = nullptr;
  GPUOPT_CUDA_TRY(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return adopt(stream, priority);
}

Stream Stream::adopt(StreamHandle handle, int priority) {
  Stream stream;
  stream.handle_ = handle;
  stream.priority_ = priority;
  return stream;
}

Stream::~Stream() {
  if (handle_ != nullptr)
    GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(static_cast<cudaStream_t>(handle_)));
}

Status Stream::wait(const Event& event) const {
  return GPUOPT_CUDA_STATUS(cudaStreamWaitEvent(static_cast<cudaStream_t>(handle_),
                                                static_cast<cudaEvent_t>(event.handle()), 0));
}

Status Stream::synchronize() const {
  return GPUOPT_CUDA_STATUS(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

StatusOr<Event> Event::create(bool timing) {
  cudaEvent_t event = nullptr;
  GPUOPT_CUDA_TRY(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  Event result;
  result.handle_ = event;
  result.timing_ = timing;
  return result;
}

Event::~Event() {
  if (handle_ != nullptr)
    GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(static_cast<cudaEvent_t>(handle_)));
}

Status Event::record(StreamHandle stream) const {
  if (stream == nullptr)
    return invalid_argument("Event::record: null stream (the legacy default stream is never used)");
  return GPUOPT_CUDA_STATUS(
      cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream)));
}

StatusOr<bool> Event::query() const {
  cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (error == cudaErrorNotReady) return false;
  GPUOPT_CUDA_TRY(error);
  return true;
}

Status Event::synchronize() const {
  return GPUOPT_CUDA_STATUS(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

StatusOr<float> Event::elapsed_ms(const Event& start, const Event& end) {
  if (!start.timing_ || !end.timing_) {
    return invalid_argument("Event::elapsed_ms needs two events created with timing = true");
  }
  float ms = 0;
  GPUOPT_CUDA_TRY(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                       static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

#else  // !GPUOPT_CUDA

StatusOr<Device> Device::open(int) { return not_built_with_cuda("Device::open"); }
Status Device::make_current() const { return not_built_with_cuda("Device::make_current"); }
StatusOr<Stream> Stream::create(const Device&, int) {
  return not_built_with_cuda("Stream::create");
}
Stream Stream::adopt(StreamHandle handle, int priority) {
  Stream stream;
  stream.handle_ = handle;
  stream.priority_ = priority;
  return stream;
}
Stream::~Stream() = default;
Status Stream::wait(const Event&) const { return not_built_with_cuda("Stream::wait"); }
Status Stream::synchronize() const { return not_built_with_cuda("Stream::synchronize"); }
StatusOr<Event> Event::create(bool) { return not_built_with_cuda("Event::create"); }
Event::~Event() = default;
Status Event::record(StreamHandle) const { return not_built_with_cuda("Event::record"); }
StatusOr<bool> Event::query() const { return not_built_with_cuda("Event::query"); }
Status Event::synchronize() const { return not_built_with_cuda("Event::synchronize"); }
StatusOr<float> Event::elapsed_ms(const Event&, const Event&) {
  return not_built_with_cuda("Event::elapsed_ms");
}

#endif  // GPUOPT_CUDA

Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), priority_(other.priority_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
    priority_ = other.priority_;
  }
  return *this;
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), timing_(other.timing_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
    timing_ = other.timing_;
  }
  return *this;
}

StatusOr<StreamPool> StreamPool::create(const Device& device, int streams_per_level) {
  if (streams_per_level < 1 || streams_per_level > 64) {
    return invalid_argument(
        fmt::format("StreamPool: streams_per_level must be in [1, 64], got {}", streams_per_level));
  }
  StreamPool pool;
  pool.streams_per_level_ = streams_per_level;
  const auto& p = device.properties();
  for (int level = 0; level < kPriorityLevels; ++level) {
    int value = runtime::priority_value(static_cast<Priority>(level), p.least_priority,
                                        p.greatest_priority);
    for (int i = 0; i < streams_per_level; ++i) {
      GPUOPT_ASSIGN_OR_RETURN(Stream stream, Stream::create(device, value));
      pool.streams_[level].push_back(std::move(stream));
    }
  }
  return pool;
}

const Stream& StreamPool::next(Priority priority) {
  auto level = static_cast<std::size_t>(priority);
  auto& streams = streams_[level];
  GPUOPT_CHECK(!streams.empty());
  return streams[cursor_[level]++ % streams.size()];
}

int StreamPool::priority_value(Priority priority) const {
  const auto& streams = streams_[static_cast<std::size_t>(priority)];
  return streams.empty() ? 0 : streams.front().priority();
}

}  // namespace gpuopt::runtime
