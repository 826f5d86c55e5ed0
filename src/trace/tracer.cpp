// CUPTI Activity API collector behind Tracer: aligned activity buffers handed to CUPTI on request
// and converted to ActivityRecords when CUPTI completes them (the scheme Kineto uses).
#include "gpuopt/trace/tracer.hpp"

#include "gpuopt/core/checked_call.hpp"

#if GPUOPT_CUDA
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <unordered_map>

#include "gpuopt/core/cuda_check.hpp"
#endif

namespace gpuopt::trace {

#if GPUOPT_CUDA
namespace {

Status cupti_status(CUptiResult result, const char* expression, const char* file, int line) {
  if (result == CUPTI_SUCCESS) return ok_status();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuptiGetResultString(result, &name) != CUPTI_SUCCESS || name == nullptr) name = "?";
  if (cuptiGetErrorMessage(result, &text) != CUPTI_SUCCESS || text == nullptr) text = name;
  StatusCode code = StatusCode::kInternal;
  switch (result) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      code = StatusCode::kPermissionDenied;
      break;
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_INVALID_DEVICE:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_COMPATIBLE:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
      code = StatusCode::kUnavailable;
      break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      code = StatusCode::kFailedPrecondition;
      break;
    case CUPTI_ERROR_OUT_OF_MEMORY:
      code = StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return gpu_api_error(GpuApi::kCupti, code, static_cast<long>(result), name, text, expression,
                       file, line);
}

#define GPUOPT_CUPTI_STATUS(expr) cupti_status((expr), #expr, __FILE__, __LINE__)
#define GPUOPT_CUPTI_TRY(expr) GPUOPT_RETURN_IF_ERROR(GPUOPT_CUPTI_STATUS(expr))

// CUPTI requires activity buffers aligned to 8 bytes.
constexpr std::size_t kBufferAlignment = 8;

std::uint64_t cupti_now() {
  std::uint64_t timestamp = 0;
  if (cuptiGetTimestamp(&timestamp) != CUPTI_SUCCESS) return 0;
  return timestamp;
}

std::int64_t realtime_now_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

CopyDirection direction_of(std::uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return CopyDirection::kHostToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return CopyDirection::kDeviceToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return CopyDirection::kDeviceToDevice;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return CopyDirection::kHostToHost;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return CopyDirection::kPeerToPeer;
    default:
      return CopyDirection::kUnknown;
  }
}

const char* synchronization_name(CUpti_ActivitySynchronizationType type) {
  switch (type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
      return "event synchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT:
      return "stream wait event";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
      return "stream synchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
      return "context synchronize";
    default:
      return "synchronization";
  }
}

// Process-wide: CUPTI's buffer callbacks carry no user pointer. Never destroyed, because the
// injection library flushes from an atexit handler after static destructors may have run.
struct Collector {
  std::mutex mutex;
  bool active = false;
  bool callbacks_registered = false;
  std::size_t buffer_bytes = 8u << 20;
  std::uint64_t max_records = 0;
  TraceData data;
  Status first_error;
  std::unordered_map<const char*, std::string> kernel_names;  // CUPTI shares one pointer per kernel
  std::unordered_map<std::uint32_t, std::string> api_names[2];    // runtime, driver; by cbid
  std::unordered_map<std::uint32_t, ActivityRecord> open_ranges;  // NVTX starts by marker id
  std::map<std::uint32_t, DeviceInfo> devices;

  void note_error(Status status) {
    if (first_error.ok() && !status.ok()) first_error = std::move(status);
  }

  const std::string& kernel_name(const char* mangled) {
    auto it = kernel_names.find(mangled);
    if (it != kernel_names.end()) return it->second;
    std::string name = mangled != nullptr ? mangled : "";
    int demangle_status = -1;
    char* demangled = mangled != nullptr
                          ? abi::__cxa_demangle(mangled, nullptr, nullptr, &demangle_status)
                          : nullptr;
    if (demangle_status == 0 && demangled != nullptr) name = demangled;
    std::free(demangled);
    return kernel_names.emplace(mangled, std::move(name)).first->second;
  }

  const std::string& api_name(bool runtime, CUpti_CallbackId cbid) {
    auto& names = api_names[runtime ? 0 : 1];
    auto it = names.find(cbid);
    if (it != names.end()) return it->second;
    const char* name = nullptr;
    const CUpti_CallbackDomain domain =
        runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
    std::string text = cuptiGetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name
                           ? std::string(name)
                           : (runtime ? "runtime#" : "driver#") + std::to_string(cbid);
    return names.emplace(cbid, std::move(text)).first->second;
  }

  void push(ActivityRecord record) {
    if (max_records != 0 && data.records.size() >= max_records) {
      ++data.dropped_records;
      return;
    }
    // CUPTI's device records name no process; this one issued them. With it a merged trace of
    // several processes still joins each kernel to its launch (correlation ids are per process).
    if (record.on_device()) record.process_id = static_cast<std::uint32_t>(getpid());
    data.records.push_back(std::move(record));
  }

  void convert(const CUpti_Activity* activity) {
    switch (activity->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
        ActivityRecord record;
        record.kind = ActivityKind::kKernel;
        record.name = kernel_name(kernel->name);
        record.start_ns = kernel->start;
        record.end_ns = kernel->end;
        record.device_id = kernel->deviceId;
        record.context_id = kernel->contextId;
        record.stream_id = kernel->streamId;
        record.correlation_id = kernel->correlationId;
        record.grid = {kernel->gridX, kernel->gridY, kernel->gridZ};
        record.block = {kernel->blockX, kernel->blockY, kernel->blockZ};
        record.shared_memory_bytes = kernel->staticSharedMemory + kernel->dynamicSharedMemory;
        record.registers_per_thread = kernel->registersPerThread;
        push(std::move(record));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(activity);
        ActivityRecord record;
        record.kind = ActivityKind::kMemcpy;
        record.direction = direction_of(copy->copyKind);
        record.name = std::string("memcpy ") + std::string(copy_direction_name(record.direction));
        record.start_ns = copy->start;
        record.end_ns = copy->end;
        record.device_id = copy->deviceId;
        record.context_id = copy->contextId;
        record.stream_id = copy->streamId;
        record.correlation_id = copy->correlationId;
        record.bytes = copy->bytes;
        push(std::move(record));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
        ActivityRecord record;
        record.kind = ActivityKind::kMemset;
        record.name = "memset";
        record.start_ns = set->start;
        record.end_ns = set->end;
        record.device_id = set->deviceId;
        record.context_id = set->contextId;
        record.stream_id = set->streamId;
        record.correlation_id = set->correlationId;
        record.bytes = set->bytes;
        push(std::move(record));
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(activity);
        const bool runtime = activity->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        ActivityRecord record;
        record.kind = runtime ? ActivityKind::kRuntimeApi : ActivityKind::kDriverApi;
        record.name = api_name(runtime, api->cbid);
        record.start_ns = api->start;
        record.end_ns = api->end;
        record.process_id = api->processId;
        record.thread_id = api->threadId;
        record.correlation_id = api->correlationId;
        push(std::move(record));
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const auto* sync = reinterpret_cast<const CUpti_ActivitySynchronization2*>(activity);
        ActivityRecord record;
        record.kind = ActivityKind::kSynchronization;
        record.name = synchronization_name(sync->type);
        record.start_ns = sync->start;
        record.end_ns = sync->end;
        record.context_id = sync->contextId;
        record.stream_id = sync->streamId;
        record.correlation_id = sync->correlationId;
        record.process_id = static_cast<std::uint32_t>(getpid());
        push(std::move(record));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER: {
        const auto* marker = reinterpret_cast<const CUpti_ActivityMarker2*>(activity);
        const bool on_thread = marker->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ||
                               marker->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS;
        if (marker->flags & CUPTI_ACTIVITY_FLAG_MARKER_START ||
            marker->flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
          ActivityRecord record;
          record.kind = ActivityKind::kNvtxRange;
          record.name = marker->name != nullptr ? marker->name : "";
          record.domain = marker->domain != nullptr ? marker->domain : "";
          record.start_ns = marker->timestamp;
          record.end_ns = marker->timestamp;
          if (on_thread) {
            record.process_id = marker->objectId.pt.processId;
            record.thread_id = marker->objectId.pt.threadId;
          }
          if (marker->flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
            push(std::move(record));
          } else {
            open_ranges[marker->id] = std::move(record);
          }
        } else if (marker->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
          auto it = open_ranges.find(marker->id);
          if (it != open_ranges.end()) {
            it->second.end_ns = std::max(it->second.start_ns, marker->timestamp);
            push(std::move(it->second));
            open_ranges.erase(it);
          }
        }
        break;
      }
      case CUPTI_ACTIVITY_KIND_DEVICE: {
        const auto* device = reinterpret_cast<const CUpti_ActivityDevice5*>(activity);
        DeviceInfo info;
        info.id = device->id;
        info.name = device->name != nullptr ? device->name : "";
        info.sm_count = static_cast<int>(device->numMultiprocessors);
        devices[info.id] = std::move(info);
        break;
      }
      default:
        break;
    }
  }
};

Collector& collector() {
  static Collector* instance = new Collector();  // deliberately leaked, see Collector
  return *instance;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  const std::size_t bytes = collector().buffer_bytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, bytes));
  *size = *buffer != nullptr ? bytes : 0;  // 0 makes CUPTI drop records rather than crash
  *max_records = 0;                        // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                               size_t /*size*/, size_t valid_size) {
  Collector& state = collector();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    CUpti_Activity* activity = nullptr;
    while (true) {
      const CUptiResult result = cuptiActivityGetNextRecord(buffer, valid_size, &activity);
      if (result == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of this buffer
      if (result != CUPTI_SUCCESS) {
        state.note_error(
            cupti_status(result, "cuptiActivityGetNextRecord(buffer, ...)", __FILE__, __LINE__));
        break;
      }
      if (state.active) state.convert(activity);
    }
    std::size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS &&
        state.active) {
      state.data.dropped_records += dropped;
    }
  }
  std::free(buffer);
}

// Points NVTX at the libcupti this process loaded, so NVTX ranges reach CUPTI; a user's own
// setting wins. NVTX reads it at the program's first NVTX call only.
void route_nvtx_to_cupti() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuptiActivityEnable), &info) != 0 &&
      info.dli_fname != nullptr) {
    setenv("NVTX_INJECTION64_PATH", info.dli_fname, /*overwrite=*/0);
  }
}

std::vector<CUpti_ActivityKind> kinds_for(const TracerOptions& options) {
  std::vector<CUpti_ActivityKind> kinds = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                           CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};
  if (options.runtime_api) kinds.push_back(CUPTI_ACTIVITY_KIND_RUNTIME);
  if (options.driver_api) kinds.push_back(CUPTI_ACTIVITY_KIND_DRIVER);
  if (options.synchronization) kinds.push_back(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  if (options.nvtx) kinds.push_back(CUPTI_ACTIVITY_KIND_MARKER);
  return kinds;
}

}  // namespace

bool Tracer::built_with_cupti() { return true; }

Tracer::Tracer(TracerOptions options) : options_(options) {}

Tracer::~Tracer() {
  if (active_) {
    auto data = stop();
    if (!data.ok()) report_unreturnable(data.status());
  }
}

Status Tracer::start() {
  if (active_) return failed_precondition("Tracer::start(): this tracer is already active");
  if (options_.require_device) {
    auto devices = cuda_device_count();
    if (!devices.ok()) return devices.status().with_context("cannot trace");
  }
  Collector& state = collector();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.active) {
      return failed_precondition(
          "another gpuopt Tracer is active in this process (CUPTI activity state is per process)");
    }
    state.buffer_bytes = std::max<std::size_t>(
        64 * 1024, options_.buffer_bytes / kBufferAlignment * kBufferAlignment);
    state.max_records = options_.max_records;
    state.data = TraceData{};
    state.first_error = ok_status();
    state.open_ranges.clear();
    state.devices.clear();
  }
  if (options_.nvtx) route_nvtx_to_cupti();
  // API and NVTX records carry the OS thread id (gettid), as top, perf and Nsight Systems show it,
  // instead of CUPTI's default, a truncated pthread_t. Best effort: an older CUPTI keeps its own.
  cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
  if (!state.callbacks_registered) {
    GPUOPT_CUPTI_TRY(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    state.callbacks_registered = true;
  }
  const std::vector<CUpti_ActivityKind> kinds = kinds_for(options_);
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    Status status = GPUOPT_CUPTI_STATUS(cuptiActivityEnable(kinds[i]));
    if (!status.ok()) {
      for (std::size_t j = 0; j < i; ++j) cuptiActivityDisable(kinds[j]);
      return status;
    }
  }
  // Best effort: device records only add the SM count for the coverage-weighted busy figure.
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DEVICE);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.data.window_start_ns = cupti_now();
    state.data.realtime_offset_ns =
        realtime_now_ns() - static_cast<std::int64_t>(state.data.window_start_ns);
    state.active = true;
  }
  active_ = true;
  return ok_status();
}

StatusOr<TraceData> Tracer::stop() {
  if (!active_) return failed_precondition("Tracer::stop() without a successful start()");
  active_ = false;
  Collector& state = collector();
  const std::uint64_t window_end = cupti_now();
  // Forced: also hands back buffers that are not full yet.
  Status flushed = GPUOPT_CUPTI_STATUS(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  Status disabled;
  for (CUpti_ActivityKind kind : kinds_for(options_)) {
    Status status = GPUOPT_CUPTI_STATUS(cuptiActivityDisable(kind));
    if (disabled.ok()) disabled = status;
  }
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DEVICE);
  TraceData data;
  Status callback_error;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.active = false;
    data = std::move(state.data);
    state.data = TraceData{};
    callback_error = state.first_error;
    for (auto& [id, device] : state.devices) data.devices.push_back(device);
    state.open_ranges.clear();  // ranges never closed inside the window are left out
  }
  data.window_end_ns = std::max(window_end, data.window_start_ns);
  data.process_ids = {static_cast<std::uint32_t>(getpid())};
  std::stable_sort(
      data.records.begin(), data.records.end(),
      [](const ActivityRecord& a, const ActivityRecord& b) { return a.start_ns < b.start_ns; });
  GPUOPT_RETURN_IF_ERROR(flushed);
  GPUOPT_RETURN_IF_ERROR(callback_error);
  GPUOPT_RETURN_IF_ERROR(disabled);
  return data;
}

#else  // !GPUOPT_CUDA

bool Tracer::built_with_cupti() { return false; }
Tracer::Tracer(TracerOptions options) : options_(options) {}
Tracer::~Tracer() = default;
Status Tracer::start() {
  return unimplemented("gpuopt was built without CUDA, so it has no CUPTI tracer");
}
StatusOr<TraceData> Tracer::stop() {
  return unimplemented("gpuopt was built without CUDA, so it has no CUPTI tracer");
}

#endif  // GPUOPT_CUDA

}  // namespace gpuopt::trace
