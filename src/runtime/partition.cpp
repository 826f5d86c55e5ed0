// PartitionPlan (validation, fallback, the one-plan-per-device rule) and the green-context backend
// over driver entry points resolved at run time (cuda.h for the types only; libcuda is not linked).
#include "gpuopt/runtime/partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "gpuopt/core/checked_call.hpp"
#include "gpuopt/core/cuda_check.hpp"

#if GPUOPT_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::runtime {

namespace {

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<int>& active_devices() {
  static std::set<int> devices;
  return devices;
}

}  // namespace

bool partition_plan_active(int device_ordinal) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return active_devices().count(device_ordinal) != 0;
}

StatusOr<std::unique_ptr<PartitionPlan>> PartitionPlan::create(
    int device_ordinal, const std::vector<WorkloadSpec>& workloads,
    std::shared_ptr<SmPartitionBackend> backend, const PartitionOptions& options) {
  if (backend == nullptr) return invalid_argument("PartitionPlan: null backend");
  if (workloads.empty()) return invalid_argument("PartitionPlan: no workloads to place");
  const int total_sms = backend->total_sms();
  std::set<std::string> names;
  int rest_count = 0;
  int asked = 0;
  for (const auto& spec : workloads) {
    if (spec.name.empty()) return invalid_argument("PartitionPlan: a workload has no name");
    if (!names.insert(spec.name).second) {
      return invalid_argument(fmt::format("PartitionPlan: workload '{}' named twice", spec.name));
    }
    if (spec.min_sms < 0) {
      return invalid_argument(
          fmt::format("PartitionPlan: workload '{}' asks for {} SMs", spec.name, spec.min_sms));
    }
    if (spec.streams < 1 || spec.streams > 32) {
      return invalid_argument(fmt::format(
          "PartitionPlan: workload '{}' asks for {} streams (1..32)", spec.name, spec.streams));
    }
    if (spec.min_sms == 0) ++rest_count;
    asked += spec.min_sms;
  }
  if (rest_count > 1) {
    return invalid_argument(
        "PartitionPlan: more than one workload asks for 'the rest' of the SMs (min_sms = 0)");
  }
  if (asked > total_sms || (rest_count == 1 && asked >= total_sms)) {
    return invalid_argument(fmt::format(
        "PartitionPlan: workloads ask for {} SMs of {} on device {}{}", asked, total_sms,
        device_ordinal, rest_count == 1 ? ", leaving none for the rest" : ""));
  }

  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (active_devices().count(device_ordinal) != 0) {
      return failed_precondition(fmt::format(
          "PartitionPlan: a plan is already active on device {}; add the workload to it",
          device_ordinal));
    }
    active_devices().insert(device_ordinal);
  }
  std::unique_ptr<PartitionPlan> plan(new PartitionPlan());
  plan->registered_ = true;
  plan->device_ = device_ordinal;
  plan->backend_ = backend;

  Status probe =
      options.use_green_contexts
          ? backend->probe()
          : unavailable("green contexts turned off (PartitionOptions::use_green_contexts)");
  std::vector<int> group_sms;
  if (probe.ok()) {
    std::vector<int> min_sms;
    for (const auto& spec : workloads) min_sms.push_back(spec.min_sms);
    auto split = backend->split(min_sms);
    if (split.ok()) {
      group_sms = *split;
      plan->isolated_ = true;
    } else {
      probe = split.status();
    }
  }
  if (!plan->isolated_) {
    if (!options.allow_fallback)
      return probe.with_context("PartitionPlan: SM partitions unavailable");
    plan->fallback_reason_ = fmt::format(
        "SM partitions unavailable ({}); using priority streams instead: a critical kernel can "
        "still wait for SM slots held by running background blocks",
        probe.message());
  }

  for (std::size_t i = 0; i < workloads.size(); ++i) {
    const auto& spec = workloads[i];
    Workload workload;
    workload.name_ = spec.name;
    workload.priority_ =
        priority_value(spec.priority, backend->least_priority, backend->greatest_priority);
    workload.sm_count_ = plan->isolated_ ? group_sms.at(i) : total_sms;
    for (int s = 0; s < spec.streams; ++s) {
      auto stream = plan->isolated_ ? backend->group_stream(static_cast<int>(i), workload.priority_)
                                    : backend->priority_stream(workload.priority_);
      if (!stream.ok()) {
        plan->workloads_.push_back(std::move(workload));  // so the destructor frees its streams
        return stream.status().with_context(
            fmt::format("PartitionPlan: stream for workload '{}'", spec.name));
      }
      workload.streams_.push_back(*stream);
    }
    plan->workloads_.push_back(std::move(workload));
  }
  return plan;
}

StatusOr<std::unique_ptr<PartitionPlan>> PartitionPlan::create(
    const Device& device, const std::vector<WorkloadSpec>& workloads,
    const PartitionOptions& options) {
  GPUOPT_ASSIGN_OR_RETURN(SmPartitionBackend backend, green_context_backend(device));
  return create(device.ordinal(), workloads,
                std::make_shared<SmPartitionBackend>(std::move(backend)), options);
}

StatusOr<std::unique_ptr<PartitionPlan>> PartitionPlan::create(
    int device_ordinal, const std::vector<WorkloadSpec>& workloads,
    std::shared_ptr<SmPartitionBackend> backend, bool allow_fallback) {
  PartitionOptions options;
  options.allow_fallback = allow_fallback;
  return create(device_ordinal, workloads, std::move(backend), options);
}

StatusOr<std::unique_ptr<PartitionPlan>> PartitionPlan::create(
    const Device& device, const std::vector<WorkloadSpec>& workloads, bool allow_fallback) {
  PartitionOptions options;
  options.allow_fallback = allow_fallback;
  return create(device, workloads, options);
}

PartitionPlan::~PartitionPlan() {
  if (backend_ != nullptr) {
    for (auto& workload : workloads_) {
      for (StreamHandle stream : workload.streams_) backend_->destroy_stream(stream);
    }
    backend_->destroy_groups();  // also frees groups of a split that failed half-way
  }
  if (registered_) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    active_devices().erase(device_);
  }
}

StatusOr<const Workload*> PartitionPlan::workload(std::string_view name) const {
  std::string known;
  for (const auto& workload : workloads_) {
    if (workload.name() == name) return &workload;
    known += (known.empty() ? "" : ", ") + workload.name();
  }
  return not_found(fmt::format("PartitionPlan: no workload '{}' (the plan has: {})", name, known));
}

std::string PartitionPlan::describe() const {
  std::string text;
  for (const auto& workload : workloads_) {
    if (!text.empty()) text += "; ";
    text += fmt::format("{}: {} SMs, {} stream{} (priority {})", workload.name(),
                        workload.sm_count(), workload.stream_count(),
                        workload.stream_count() == 1 ? "" : "s", workload.priority());
  }
  return text + (isolated_ ? " (green contexts)" : " (priority streams, no SM isolation)");
}

#if GPUOPT_CUDA

namespace {

// Driver entry points resolved once per backend; null when the driver lacks them.
struct GreenContextDriver {
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetDevResource) get_resource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) split_by_count = nullptr;
  decltype(&::cuDevResourceGenerateDesc) generate_desc = nullptr;
  decltype(&::cuGreenCtxCreate) create = nullptr;
  decltype(&::cuGreenCtxStreamCreate) stream_create = nullptr;
  decltype(&::cuGreenCtxDestroy) destroy = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  std::vector<CUgreenCtx> contexts;
  int ordinal = 0;
};

template <typename Fn>
void resolve(Fn& target, const char* symbol, unsigned int version, std::string& missing) {
  target = reinterpret_cast<Fn>(driver_entry_point(symbol, version));
  if (target == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
}

}  // namespace

StatusOr<SmPartitionBackend> green_context_backend(const Device& device) {
  auto driver = std::make_shared<GreenContextDriver>();
  driver->ordinal = device.ordinal();
  const auto& properties = device.properties();
  std::string missing;
  resolve(driver->device_get, "cuDeviceGet", 12000, missing);
  resolve(driver->get_resource, "cuDeviceGetDevResource", 12040, missing);
  resolve(driver->split_by_count, "cuDevSmResourceSplitByCount", 12040, missing);
  resolve(driver->generate_desc, "cuDevResourceGenerateDesc", 12040, missing);
  resolve(driver->create, "cuGreenCtxCreate", 12040, missing);
  // cuGreenCtxStreamCreate arrived in CUDA 12.5; asking for 12.4 finds nothing.
  resolve(driver->stream_create, "cuGreenCtxStreamCreate", 12050, missing);
  resolve(driver->destroy, "cuGreenCtxDestroy", 12040, missing);
  resolve(driver->stream_destroy, "cuStreamDestroy", 12000, missing);

  SmPartitionBackend backend;
  backend.least_priority = properties.least_priority;
  backend.greatest_priority = properties.greatest_priority;
  const int sms = properties.sm_count;
  const int driver_version = properties.driver_version;
  backend.total_sms = [sms] { return sms; };
  backend.probe = [driver, driver_version, missing]() -> Status {
    if (driver_version < 12040) {
      return unavailable(fmt::format("the driver supports CUDA {}.{}; green contexts need 12.4",
                                     driver_version / 1000, driver_version % 1000 / 10));
    }
    if (!missing.empty()) return unavailable("the driver lacks " + missing);
    return ok_status();
  };
  backend.split = [driver](const std::vector<int>& min_sms) -> StatusOr<std::vector<int>> {
    CUdevice device = 0;
    GPUOPT_CU_TRY(driver->device_get(&device, driver->ordinal));
    CUdevResource input{};
    GPUOPT_CU_TRY(driver->get_resource(device, &input, CU_DEV_RESOURCE_TYPE_SM));
    std::vector<CUdevResource> groups(min_sms.size());
    int rest = -1;
    for (std::size_t i = 0; i < min_sms.size(); ++i) {
      if (min_sms[i] == 0) {
        rest = static_cast<int>(i);
        continue;
      }
      unsigned int count = 1;
      CUdevResource remaining{};
      GPUOPT_CU_TRY(driver->split_by_count(&groups[i], &count, &input, &remaining, 0,
                                           static_cast<unsigned int>(min_sms[i])));
      if (count != 1) {
        return resource_exhausted(
            fmt::format("could not carve {} SMs (only {} left)", min_sms[i], input.sm.smCount));
      }
      input = remaining;
    }
    if (rest >= 0) {
      if (input.sm.smCount == 0) return resource_exhausted("no SMs left for the 'rest' workload");
      groups[static_cast<std::size_t>(rest)] = input;
    }
    std::vector<int> counts;
    for (auto& group : groups) {
      CUdevResourceDesc desc = nullptr;
      GPUOPT_CU_TRY(driver->generate_desc(&desc, &group, 1));
      CUgreenCtx context = nullptr;
      GPUOPT_CU_TRY(driver->create(&context, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
      driver->contexts.push_back(context);
      counts.push_back(static_cast<int>(group.sm.smCount));
    }
    return counts;
  };
  backend.group_stream = [driver](int group, int priority) -> StatusOr<StreamHandle> {
    CUstream stream = nullptr;
    GPUOPT_CU_TRY(driver->stream_create(&stream,
                                        driver->contexts.at(static_cast<std::size_t>(group)),
                                        CU_STREAM_NON_BLOCKING, priority));
    return static_cast<StreamHandle>(stream);
  };
  backend.priority_stream = [](int priority) -> StatusOr<StreamHandle> {
    cudaStream_t stream = nullptr;
    GPUOPT_CUDA_TRY(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
    return static_cast<StreamHandle>(stream);
  };
  backend.destroy_stream = [](StreamHandle stream) {
    GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  };
  backend.destroy_groups = [driver] {
    for (CUgreenCtx context : driver->contexts) {
      report_unreturnable(GPUOPT_CU_STATUS(driver->destroy(context)));
    }
    driver->contexts.clear();
  };
  return backend;
}

StatusOr<int> stream_sm_count(StreamHandle stream) {
  int device = 0;
  GPUOPT_CUDA_TRY(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device));
  int sms = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Both arrived with green contexts (CUDA 12.4): a driver without them has no green streams.
  static const auto get_green = reinterpret_cast<decltype(&::cuStreamGetGreenCtx)>(
      driver_entry_point("cuStreamGetGreenCtx", 12040));
  static const auto get_resource = reinterpret_cast<decltype(&::cuGreenCtxGetDevResource)>(
      driver_entry_point("cuGreenCtxGetDevResource", 12040));
  if (get_green == nullptr || get_resource == nullptr) return sms;
  CUgreenCtx green = nullptr;
  GPUOPT_CU_TRY(get_green(static_cast<CUstream>(stream), &green));
  if (green == nullptr) return sms;  // an ordinary stream: the whole device
  CUdevResource resource{};
  GPUOPT_CU_TRY(get_resource(green, &resource, CU_DEV_RESOURCE_TYPE_SM));
  return static_cast<int>(resource.sm.smCount);
}

#else  // !GPUOPT_CUDA

StatusOr<SmPartitionBackend> green_context_backend(const Device&) {
  return unimplemented("green contexts: gpuopt was built without CUDA");
}

StatusOr<int> stream_sm_count(StreamHandle) {
  return unimplemented("stream SM count: gpuopt was built without CUDA");
}

#endif  // GPUOPT_CUDA

}  // namespace gpuopt::runtime
