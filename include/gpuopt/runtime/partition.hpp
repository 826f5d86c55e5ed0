// SM partitions: every co-running workload gets its own set of SMs (a green context) and its
// streams come only from the plan, so a latency-critical kernel never waits for SM slots held by
// a background kernel's blocks. Falls back to priority streams, with a message, when the driver
// lacks green contexts (driver < 12.4 or missing symbols). Driver calls go through
// driver_entry_point (no link to libcuda) behind SmPartitionBackend, which tests replace.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {

struct WorkloadSpec {
  std::string name;
  // SMs asked for; the driver rounds up to its granularity (8 on Hopper). 0 = all SMs the other
  // workloads leave (at most one workload may say so).
  int min_sms = 0;
  Priority priority = Priority::kNormal;  // stream priority inside the partition (or in fallback)
  int streams = 1;
};

// The driver operations a plan needs, as a function table so CPU tests can fake a driver.
struct SmPartitionBackend {
  // OK when green contexts can be made; otherwise the reason (shown in the fallback message).
  std::function<Status()> probe;
  std::function<int()> total_sms;
  // One SM group per entry (0 = the rest, at most one); returns the SMs each group received.
  std::function<StatusOr<std::vector<int>>(const std::vector<int>& min_sms)> split;
  std::function<StatusOr<StreamHandle>(int group, int priority)> group_stream;
  std::function<StatusOr<StreamHandle>(int priority)> priority_stream;  // the fallback
  std::function<void(StreamHandle)> destroy_stream;
  std::function<void()> destroy_groups;
  int least_priority = 0;
  int greatest_priority = 0;
};

// Green contexts through cudaGetDriverEntryPoint. UNIMPLEMENTED without CUDA; its probe says why
// green contexts are unusable on this driver.
StatusOr<SmPartitionBackend> green_context_backend(const Device& device);

// How a plan places its workloads.
struct PartitionOptions {
  // Priority streams on the whole device when green contexts are unusable (fallback_reason()
  // says why); false returns the reason as UNAVAILABLE instead.
  bool allow_fallback = true;
  // false: skip green contexts even where the driver has them, to measure the fallback on the
  // same machine (`gpuopt bench streams --no-green-contexts`).
  bool use_green_contexts = true;
};

// A workload's place in the plan: its SMs and its streams (owned by the plan).
class Workload {
 public:
  const std::string& name() const { return name_; }
  // SMs this workload may use; the whole device in fallback mode.
  int sm_count() const { return sm_count_; }
  int stream_count() const { return static_cast<int>(streams_.size()); }
  StreamHandle stream(int index = 0) const { return streams_.at(static_cast<std::size_t>(index)); }
  int priority() const { return priority_; }

 private:
  friend class PartitionPlan;
  std::string name_;
  int sm_count_ = 0;
  int priority_ = 0;
  std::vector<StreamHandle> streams_;
};

// While a plan is alive on a device, Stream::create and StreamPool::create on that device fail
// with FAILED_PRECONDITION: all work must take its streams from plan.workload(name), so no
// workload can run outside a partition by accident. One plan per device at a time.
class PartitionPlan {
 public:
  // Validates the specs (unique non-empty names, at most one "rest", SMs asked <= device SMs).
  // `backend` null = green_context_backend(device). Falls back to priority streams when
  // backend.probe() fails (or options.use_green_contexts is false) and options.allow_fallback;
  // fallback_reason() then says why.
  static StatusOr<std::unique_ptr<PartitionPlan>> create(
      int device_ordinal, const std::vector<WorkloadSpec>& workloads,
      std::shared_ptr<SmPartitionBackend> backend, const PartitionOptions& options);
  static StatusOr<std::unique_ptr<PartitionPlan>> create(const Device& device,
                                                         const std::vector<WorkloadSpec>& workloads,
                                                         const PartitionOptions& options);
  // The same with PartitionOptions{allow_fallback}.
  static StatusOr<std::unique_ptr<PartitionPlan>> create(
      int device_ordinal, const std::vector<WorkloadSpec>& workloads,
      std::shared_ptr<SmPartitionBackend> backend, bool allow_fallback = true);
  static StatusOr<std::unique_ptr<PartitionPlan>> create(const Device& device,
                                                         const std::vector<WorkloadSpec>& workloads,
                                                         bool allow_fallback = true);
  ~PartitionPlan();
  PartitionPlan(const PartitionPlan&) = delete;
  PartitionPlan& operator=(const PartitionPlan&) = delete;

  // True when workloads run on disjoint SM sets (green contexts).
  bool isolated() const { return isolated_; }
  // Empty when isolated; else why green contexts were not used and what that costs.
  const std::string& fallback_reason() const { return fallback_reason_; }
  // NOT_FOUND naming the known workloads.
  StatusOr<const Workload*> workload(std::string_view name) const;
  const std::vector<Workload>& workloads() const { return workloads_; }
  // "critical: 8 SMs, 1 stream; background: 124 SMs, 2 streams (green contexts)".
  std::string describe() const;

 private:
  PartitionPlan() = default;
  int device_ = 0;
  bool isolated_ = false;
  bool registered_ = false;
  std::string fallback_reason_;
  std::shared_ptr<SmPartitionBackend> backend_;
  std::vector<Workload> workloads_;
};

// True while a PartitionPlan is alive on `device_ordinal`.
bool partition_plan_active(int device_ordinal);

// The SMs that work on `stream` may use: its green context's SM count when the stream belongs to
// one (made by a PartitionPlan or by any other code through the driver), else its device's SM
// count (also where the driver has no green contexts). For planning per partition, e.g.
// kernels::W4A16Options::sm_count, when the stream comes from code that does not say its SMs.
// UNIMPLEMENTED without CUDA; the runtime's error (UNAVAILABLE with no device) otherwise.
StatusOr<int> stream_sm_count(StreamHandle stream);

}  // namespace gpuopt::runtime
