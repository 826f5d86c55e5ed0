// gpuopt.runtime's native half: device properties, the priority stream pool, green-context SM
// partitions and stream_sm_count. Streams cross into Python as integers (cudaStream_t values),
// which torch.cuda.ExternalStream accepts; the pool or plan that made them owns them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace nb = nanobind;

namespace gpuopt::python {
namespace {

runtime::Device open_device(int ordinal) {
  nb::gil_scoped_release release;
  return value_or_throw(runtime::Device::open(ordinal));
}

class PyStreamPool {
 public:
  PyStreamPool(int ordinal, int streams_per_level) {
    runtime::Device device = open_device(ordinal);
    nb::gil_scoped_release release;
    pool_.emplace(value_or_throw(runtime::StreamPool::create(device, streams_per_level)));
  }
  PyStreamPool(const PyStreamPool&) = delete;
  PyStreamPool& operator=(const PyStreamPool&) = delete;
  std::uintptr_t next(const std::string& priority) {
    auto level = value_or_throw(runtime::parse_priority(priority));
    return reinterpret_cast<std::uintptr_t>(pool_->next(level).handle());
  }
  int priority_value(const std::string& priority) const {
    return pool_->priority_value(value_or_throw(runtime::parse_priority(priority)));
  }
  int streams_per_level() const { return pool_->streams_per_level(); }

 private:
  std::optional<runtime::StreamPool> pool_;
};

// (name, min_sms, priority, streams) per workload.
using WorkloadTuple = std::tuple<std::string, int, std::string, int>;

class PyPartitionPlan {
 public:
  PyPartitionPlan(int ordinal, const std::vector<WorkloadTuple>& workloads, bool allow_fallback) {
    std::vector<runtime::WorkloadSpec> specs;
    for (const auto& [name, min_sms, priority, streams] : workloads) {
      runtime::WorkloadSpec spec;
      spec.name = name;
      spec.min_sms = min_sms;
      spec.priority = value_or_throw(runtime::parse_priority(priority));
      spec.streams = streams;
      specs.push_back(spec);
    }
    runtime::Device device = open_device(ordinal);
    nb::gil_scoped_release release;
    plan_ = value_or_throw(runtime::PartitionPlan::create(device, specs, allow_fallback));
  }
  bool isolated() const { return plan().isolated(); }
  const std::string& fallback_reason() const { return plan().fallback_reason(); }
  std::string describe() const { return plan().describe(); }
  nb::list workloads() const {
    nb::list result;
    for (const runtime::Workload& workload : plan().workloads()) {
      nb::dict entry;
      entry["name"] = workload.name();
      entry["sm_count"] = workload.sm_count();
      entry["priority"] = workload.priority();
      nb::list streams;
      for (int i = 0; i < workload.stream_count(); ++i) {
        streams.append(reinterpret_cast<std::uintptr_t>(workload.stream(i)));
      }
      entry["streams"] = streams;
      result.append(entry);
    }
    return result;
  }
  // Destroys the partitions and their streams now (after work on them is done).
  void close() { plan_.reset(); }

 private:
  const runtime::PartitionPlan& plan() const {
    if (!plan_) throw StatusError(failed_precondition("the partition plan is closed"));
    return *plan_;
  }
  std::unique_ptr<runtime::PartitionPlan> plan_;
};

}  // namespace

void bind_runtime(nb::module_& module) {
  module.def(
      "device_properties",
      [](int ordinal) {
        runtime::Device device = open_device(ordinal);
        const runtime::DeviceProperties& p = device.properties();
        nb::dict result;
        result["ordinal"] = p.ordinal;
        result["name"] = p.name;
        result["sm_count"] = p.sm_count;
        result["compute_capability"] = nb::make_tuple(p.compute_major, p.compute_minor);
        result["total_memory_bytes"] = p.total_memory_bytes;
        result["least_priority"] = p.least_priority;
        result["greatest_priority"] = p.greatest_priority;
        result["driver_version"] = p.driver_version;
        result["runtime_version"] = p.runtime_version;
        return result;
      },
      nb::arg("ordinal") = 0, "Properties of CUDA device `ordinal` as a dict.");
  module.def(
      "stream_sm_count",
      [](std::uintptr_t stream) {
        nb::gil_scoped_release release;
        return value_or_throw(runtime::stream_sm_count(reinterpret_cast<void*>(stream)));
      },
      nb::arg("stream"),
      "SMs that work on `stream` (a cudaStream_t as an integer) may use: its green context's "
      "count, else its device's.");
  module.def(
      "partition_plan_active", [](int ordinal) { return runtime::partition_plan_active(ordinal); },
      nb::arg("ordinal") = 0, "True while a PartitionPlan is alive on the device.");

  nb::class_<PyStreamPool>(module, "StreamPool",
                           "A fixed set of non-blocking streams per priority level, handed out "
                           "round-robin (native half of gpuopt.runtime.StreamPool).")
      .def(nb::init<int, int>(), nb::arg("device") = 0, nb::arg("streams_per_level") = 2,
           "Creates streams_per_level streams at each of critical, high, normal, background.")
      .def("next", &PyStreamPool::next, nb::arg("priority"),
           "The next stream (cudaStream_t as an integer) of a level, round-robin.")
      .def("priority_value", &PyStreamPool::priority_value, nb::arg("priority"),
           "The CUDA priority number a level maps to on this device.")
      .def_prop_ro("streams_per_level", &PyStreamPool::streams_per_level,
                   "Streams per priority level.");

  nb::class_<PyPartitionPlan>(module, "PartitionPlan",
                              "Green-context SM partitions with their streams (native half of "
                              "gpuopt.runtime.PartitionPlan).")
      .def(nb::init<int, const std::vector<WorkloadTuple>&, bool>(), nb::arg("device"),
           nb::arg("workloads"), nb::arg("allow_fallback") = true,
           "workloads: (name, min_sms, priority, streams) tuples; min_sms 0 = the rest.")
      .def_prop_ro("isolated", &PyPartitionPlan::isolated,
                   "True when workloads run on disjoint SM sets (green contexts).")
      .def_prop_ro("fallback_reason", &PyPartitionPlan::fallback_reason,
                   "Why green contexts were not used; empty when isolated.")
      .def("describe", &PyPartitionPlan::describe, "One line describing the plan.")
      .def("workloads", &PyPartitionPlan::workloads,
           "Each workload as a dict: name, sm_count, priority, streams (integers).")
      .def("close", &PyPartitionPlan::close, "Destroys the partitions and their streams.");
}

}  // namespace gpuopt::python
