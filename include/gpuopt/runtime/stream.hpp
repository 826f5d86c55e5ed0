// RAII CUDA device, stream and event, and a pool of streams at named priority levels.
// Host-compilable: CUDA handles cross this header as opaque pointers (StreamHandle, EventHandle),
// so a cudaStream_t converts implicitly to StreamHandle and CPU-only builds see the same API.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::runtime {

// A cudaStream_t / CUstream as an opaque pointer; nullptr never means "the default stream" here.
using StreamHandle = void*;
// A cudaEvent_t as an opaque pointer.
using EventHandle = void*;

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::size_t total_memory_bytes = 0;
  // cudaDeviceGetStreamPriorityRange: numerically lower = higher priority (greatest <= least).
  int least_priority = 0;
  int greatest_priority = 0;
  int driver_version = 0;   // e.g. 13000
  int runtime_version = 0;  // e.g. 13000
};

// A CUDA device made current on construction. The primary context is retained by the runtime for
// the process lifetime, so the destructor releases nothing (no device-wide reset on the hot path).
class Device {
 public:
  // UNIMPLEMENTED without CUDA, UNAVAILABLE with no usable device, INVALID_ARGUMENT for a bad
  // ordinal.
  static StatusOr<Device> open(int ordinal = 0);

  const DeviceProperties& properties() const { return properties_; }
  int ordinal() const { return properties_.ordinal; }
  int sm_count() const { return properties_.sm_count; }
  // Makes this device current on the calling thread (each thread must do it once).
  Status make_current() const;

 private:
  DeviceProperties properties_;
};

class Event;

// A non-blocking stream (never synchronises with the legacy default stream) with a priority.
class Stream {
 public:
  // `priority` is clamped to the device's range; see StreamPool for named levels.
  static StatusOr<Stream> create(const Device& device, int priority = 0);
  // Takes ownership of a stream created elsewhere (green-context streams); destroyed with this.
  static Stream adopt(StreamHandle handle, int priority);

  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  StreamHandle handle() const { return handle_; }
  int priority() const { return priority_; }
  bool valid() const { return handle_ != nullptr; }

  // Work queued after this call waits on the device for `event` (no host blocking).
  Status wait(const Event& event) const;
  // Blocks the host until the stream drains. Not for the hot path: prefer events.
  Status synchronize() const;

 private:
  StreamHandle handle_ = nullptr;
  int priority_ = 0;
};

class Event {
 public:
  // `timing` = false gives a lighter event for dependencies only (cudaEventDisableTiming).
  static StatusOr<Event> create(bool timing = false);

  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  EventHandle handle() const { return handle_; }
  bool timing() const { return timing_; }

  Status record(StreamHandle stream) const;
  Status record(const Stream& stream) const { return record(stream.handle()); }
  // True when the recorded work completed; errors other than "not ready" are returned.
  StatusOr<bool> query() const;
  Status synchronize() const;
  // Milliseconds between two timing events, both completed.
  static StatusOr<float> elapsed_ms(const Event& start, const Event& end);

 private:
  EventHandle handle_ = nullptr;
  bool timing_ = false;
};

// Named priority levels, highest first.
enum class Priority { kCritical = 0, kHigh = 1, kNormal = 2, kBackground = 3 };
inline constexpr int kPriorityLevels = 4;
std::string_view priority_name(Priority priority);
// Parses "critical", "high", "normal", "background".
StatusOr<Priority> parse_priority(std::string_view text);

// Maps a named level onto a device range [greatest, least] (greatest is numerically lowest):
// critical = greatest, background = least, high and normal evenly between (they collapse onto
// neighbours when the range has fewer than four values; a range of one value maps all to it).
int priority_value(Priority priority, int least_priority, int greatest_priority);

// A fixed set of streams per priority level, handed out round-robin. Create once at start-up:
// creating streams on the hot path costs a driver call and may serialise with other work.
class StreamPool {
 public:
  static StatusOr<StreamPool> create(const Device& device, int streams_per_level = 2);

  // The next stream of a level (round-robin). The pool keeps ownership.
  const Stream& next(Priority priority);
  int priority_value(Priority priority) const;
  int streams_per_level() const { return streams_per_level_; }

 private:
  int streams_per_level_ = 0;
  std::array<std::vector<Stream>, kPriorityLevels> streams_;
  std::array<std::size_t, kPriorityLevels> cursor_{};
};

}  // namespace gpuopt::runtime
