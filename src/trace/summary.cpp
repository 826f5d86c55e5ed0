// Busy time from activity records: unions of kernel and copy intervals per device, stream and copy
// direction, clipped to the traced window, with NVML GPU-Util averaged over the same span.
#include "gpuopt/trace/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <set>
#include <unordered_map>

#include "gpuopt/trace/intervals.hpp"

namespace gpuopt::trace {
namespace {

using nlohmann::json;

constexpr int kSummarySchemaVersion = 1;

// "cudaMemcpy_v3020" -> "cudaMemcpy", "cudaStreamSynchronize_ptsz_v7000" ->
// "cudaStreamSynchronize" (per-thread default stream variants count as the call they stand for).
std::string_view base_api_name(std::string_view name) {
  const std::size_t underscore = name.rfind('_');
  if (underscore != std::string_view::npos && underscore + 2 < name.size() &&
      name[underscore + 1] == 'v') {
    const std::string_view digits = name.substr(underscore + 2);
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c) != 0; })) {
      name = name.substr(0, underscore);
    }
  }
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) name.remove_suffix(suffix.size());
  }
  return name;
}

// Calls that return only once the GPU has caught up: the explicit synchronizations and the
// synchronous copies (which wait for the stream and, from the device, for the copy itself).
constexpr std::array<std::string_view, 26> kHostSynchronizingApis = {
    "cudaDeviceSynchronize",
    "cudaThreadSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpy3D",
    "cudaMemcpyPeer",
    "cudaMemcpy3DPeer",
    "cudaMemcpyFromSymbol",
    "cudaMemcpyToSymbol",
    "cudaMemcpyFromArray",
    "cudaMemcpyToArray",
    "cudaMemcpy2DFromArray",
    "cudaMemcpy2DToArray",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemcpy",
    "cuMemcpyDtoH",
    "cuMemcpyHtoD",
    "cuMemcpy2D",
    "cuMemcpy3D",
    "cuMemcpyPeer",
    "cuMemcpyAtoH",
    "cuMemcpyHtoA",
};

double percent(std::uint64_t part, std::uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

json optional_json(const std::optional<double>& value) {
  return value ? json(*value) : json(nullptr);
}

struct DeviceIntervals {
  std::vector<Interval> kernels;
  std::vector<WeightedInterval> weighted_kernels;
  std::vector<Interval> copies;
  std::vector<Interval> all;
  std::map<std::uint32_t, std::vector<Interval>> kernels_by_stream;
  std::int64_t kernel_count = 0;
};

}  // namespace

bool is_host_synchronizing_api(std::string_view api_name) {
  const std::string_view base = base_api_name(api_name);
  return std::find(kHostSynchronizingApis.begin(), kHostSynchronizingApis.end(), base) !=
         kHostSynchronizingApis.end();
}

TraceSummary summarize(const TraceData& data, const SummaryOptions& options) {
  TraceSummary summary;
  summary.dropped_records = data.dropped_records;
  summary.nvml_unavailable_reason = options.nvml_unavailable_reason;

  Interval window{data.window_start_ns, data.window_end_ns};
  if (window.length() == 0 && !data.records.empty()) {
    window = {UINT64_MAX, 0};
    for (const ActivityRecord& record : data.records) {
      window.start_ns = std::min(window.start_ns, record.start_ns);
      window.end_ns = std::max(window.end_ns, record.end_ns);
    }
  }
  summary.window_ns = window.length();

  std::map<std::uint32_t, const DeviceInfo*> device_info;
  for (const DeviceInfo& device : data.devices) device_info[device.id] = &device;

  std::unordered_map<std::uint32_t, CopyDirection> copy_direction_by_correlation;
  for (const ActivityRecord& record : data.records) {
    if (record.kind == ActivityKind::kMemcpy) {
      copy_direction_by_correlation[record.correlation_id] = record.direction;
    }
  }

  std::map<std::uint32_t, DeviceIntervals> devices;
  std::map<std::tuple<std::uint32_t, std::uint32_t>, StreamSummary> streams;
  std::map<std::tuple<std::uint32_t, CopyDirection>, std::vector<Interval>> copy_intervals;
  std::map<std::tuple<std::uint32_t, CopyDirection>, CopySummary> copies;
  std::map<std::string, KernelNameSummary> kernel_names;

  for (const ActivityRecord& record : data.records) {
    const Interval interval{record.start_ns, record.end_ns};
    switch (record.kind) {
      case ActivityKind::kKernel: {
        ++summary.kernels;
        DeviceIntervals& device = devices[record.device_id];
        ++device.kernel_count;
        device.kernels.push_back(interval);
        device.all.push_back(interval);
        device.kernels_by_stream[record.stream_id].push_back(interval);
        double weight = 1.0;
        auto info = device_info.find(record.device_id);
        if (info != device_info.end() && info->second->sm_count && *info->second->sm_count > 0) {
          weight = std::min(1.0, static_cast<double>(record.grid_blocks()) /
                                     static_cast<double>(*info->second->sm_count));
        }
        device.weighted_kernels.push_back({interval, weight});
        StreamSummary& stream = streams[{record.device_id, record.stream_id}];
        stream.device_id = record.device_id;
        stream.stream_id = record.stream_id;
        ++stream.kernels;
        KernelNameSummary& by_name = kernel_names[record.name];
        by_name.name = record.name;
        ++by_name.count;
        by_name.total_ns += record.duration_ns();
        by_name.max_ns = std::max(by_name.max_ns, record.duration_ns());
        break;
      }
      case ActivityKind::kMemcpy: {
        ++summary.memcpys;
        ++summary.memcpys_by_direction[std::string(copy_direction_name(record.direction))];
        DeviceIntervals& device = devices[record.device_id];
        device.copies.push_back(interval);
        device.all.push_back(interval);
        copy_intervals[{record.device_id, record.direction}].push_back(interval);
        CopySummary& copy = copies[{record.device_id, record.direction}];
        copy.device_id = record.device_id;
        copy.direction = record.direction;
        ++copy.count;
        copy.bytes += record.bytes;
        StreamSummary& stream = streams[{record.device_id, record.stream_id}];
        stream.device_id = record.device_id;
        stream.stream_id = record.stream_id;
        ++stream.memcpys;
        break;
      }
      case ActivityKind::kMemset: {
        ++summary.memsets;
        devices[record.device_id].all.push_back(interval);
        StreamSummary& stream = streams[{record.device_id, record.stream_id}];
        stream.device_id = record.device_id;
        stream.stream_id = record.stream_id;
        ++stream.memsets;
        break;
      }
      case ActivityKind::kRuntimeApi:
      case ActivityKind::kDriverApi: {
        const bool runtime = record.kind == ActivityKind::kRuntimeApi;
        (runtime ? summary.runtime_api_calls : summary.driver_api_calls) += 1;
        const std::string base(base_api_name(record.name));
        ++summary.api_calls[base];
        // Only runtime calls count: the runtime's own driver calls would count twice.
        if (runtime && is_host_synchronizing_api(base)) {
          auto copy = copy_direction_by_correlation.find(record.correlation_id);
          // A synchronous device-to-device copy does not block the host (CUDA API sync rules).
          const bool device_to_device = copy != copy_direction_by_correlation.end() &&
                                        copy->second == CopyDirection::kDeviceToDevice;
          if (!device_to_device) ++summary.host_synchronizations;
        }
        break;
      }
      case ActivityKind::kNvtxRange:
        ++summary.nvtx_ranges;
        break;
      case ActivityKind::kSynchronization:
        ++summary.synchronization_records;
        break;
    }
  }

  for (auto& [id, intervals] : devices) {
    DeviceSummary device;
    device.device_id = id;
    auto info = device_info.find(id);
    if (info != device_info.end()) {
      device.name = info->second->name;
      device.sm_count = info->second->sm_count;
    }
    device.kernels = intervals.kernel_count;
    const std::vector<Interval> kernels = clip_to(intervals.kernels, window);
    device.kernel_busy_ns = union_length(kernels);
    device.kernel_busy_percent = percent(device.kernel_busy_ns, window.length());
    const std::vector<Interval> all = union_of(clip_to(intervals.all, window));
    Interval active{0, 0};
    if (!all.empty()) active = {all.front().start_ns, all.back().end_ns};
    device.active_span_ns = active.length();
    device.kernel_busy_percent_of_active = percent(device.kernel_busy_ns, active.length());
    if (device.sm_count && active.length() > 0) {
      std::vector<WeightedInterval> weighted;
      for (const WeightedInterval& kernel : intervals.weighted_kernels) {
        for (const Interval& cut : clip_to(std::span(&kernel.interval, 1), window)) {
          weighted.push_back({cut, kernel.weight});
        }
      }
      device.sm_coverage_busy_percent_of_active =
          100.0 * weighted_coverage_ns(weighted) / static_cast<double>(active.length());
    }
    std::vector<Interval> stream_unions;
    for (auto& [stream_id, stream_kernels] : intervals.kernels_by_stream) {
      const std::vector<Interval> clipped = union_of(clip_to(stream_kernels, window));
      const std::uint64_t busy = union_length(clipped);
      StreamSummary& stream = streams[{id, stream_id}];
      stream.kernel_busy_ns = busy;
      stream.kernel_busy_percent = percent(busy, window.length());
      stream_unions.insert(stream_unions.end(), clipped.begin(), clipped.end());
    }
    device.stream_overlap_ns = covered_at_least(stream_unions, 2);
    device.copy_compute_overlap_ns =
        intersection_length(clip_to(intervals.copies, window), kernels);
    device.any_engine_busy_ns = union_length(all);

    // NVML samples mapped into CUPTI's clock.
    double sum_window = 0, sum_active = 0;
    int count_window = 0, count_active = 0;
    for (const UtilizationSample& sample : options.nvml_samples) {
      if (sample.device_id != id) continue;
      const auto time = static_cast<std::uint64_t>(static_cast<std::int64_t>(sample.realtime_ns) -
                                                   data.realtime_offset_ns);
      if (time >= window.start_ns && time <= window.end_ns) {
        sum_window += sample.gpu_percent;
        ++count_window;
      }
      if (time >= active.start_ns && time <= active.end_ns) {
        sum_active += sample.gpu_percent;
        ++count_active;
      }
    }
    device.nvml_samples = count_window;
    if (count_window > 0) device.nvml_gpu_util_percent = sum_window / count_window;
    if (count_active > 0) device.nvml_gpu_util_percent_of_active = sum_active / count_active;
    summary.devices.push_back(std::move(device));
  }

  for (auto& [key, stream] : streams) summary.streams.push_back(stream);
  for (auto& [key, copy] : copies) {
    copy.busy_ns = union_length(clip_to(copy_intervals[key], window));
    copy.busy_percent = percent(copy.busy_ns, window.length());
    summary.copies.push_back(copy);
  }
  for (auto& [name, by_name] : kernel_names) summary.top_kernels.push_back(by_name);
  std::sort(summary.top_kernels.begin(), summary.top_kernels.end(),
            [](const KernelNameSummary& a, const KernelNameSummary& b) {
              return a.total_ns > b.total_ns || (a.total_ns == b.total_ns && a.name < b.name);
            });
  if (summary.top_kernels.size() >
      static_cast<std::size_t>(std::max(0, options.top_kernel_count))) {
    summary.top_kernels.resize(static_cast<std::size_t>(std::max(0, options.top_kernel_count)));
  }
  return summary;
}

json to_json(const TraceSummary& summary) {
  json devices = json::array();
  for (const DeviceSummary& d : summary.devices) {
    devices.push_back({
        {"device_id", d.device_id},
        {"name", d.name},
        {"sm_count", d.sm_count ? json(*d.sm_count) : json(nullptr)},
        {"kernels", d.kernels},
        {"kernel_busy_ns", d.kernel_busy_ns},
        {"kernel_busy_percent", d.kernel_busy_percent},
        {"active_span_ns", d.active_span_ns},
        {"kernel_busy_percent_of_active", d.kernel_busy_percent_of_active},
        {"sm_coverage_busy_percent_of_active", optional_json(d.sm_coverage_busy_percent_of_active)},
        {"stream_overlap_ns", d.stream_overlap_ns},
        {"copy_compute_overlap_ns", d.copy_compute_overlap_ns},
        {"any_engine_busy_ns", d.any_engine_busy_ns},
        {"nvml_gpu_util_percent", optional_json(d.nvml_gpu_util_percent)},
        {"nvml_gpu_util_percent_of_active", optional_json(d.nvml_gpu_util_percent_of_active)},
        {"nvml_samples", d.nvml_samples},
    });
  }
  json streams = json::array();
  for (const StreamSummary& s : summary.streams) {
    streams.push_back({{"device_id", s.device_id},
                       {"stream_id", s.stream_id},
                       {"kernels", s.kernels},
                       {"memcpys", s.memcpys},
                       {"memsets", s.memsets},
                       {"kernel_busy_ns", s.kernel_busy_ns},
                       {"kernel_busy_percent", s.kernel_busy_percent}});
  }
  json copies = json::array();
  for (const CopySummary& c : summary.copies) {
    copies.push_back({{"device_id", c.device_id},
                      {"direction", copy_direction_name(c.direction)},
                      {"count", c.count},
                      {"bytes", c.bytes},
                      {"busy_ns", c.busy_ns},
                      {"busy_percent", c.busy_percent}});
  }
  json kernels = json::array();
  for (const KernelNameSummary& k : summary.top_kernels) {
    kernels.push_back(
        {{"name", k.name}, {"count", k.count}, {"total_ns", k.total_ns}, {"max_ns", k.max_ns}});
  }
  return {
      {"schema_version", kSummarySchemaVersion},
      {"window_ns", summary.window_ns},
      {"kernels", summary.kernels},
      {"memcpys", summary.memcpys},
      {"memcpys_by_direction", summary.memcpys_by_direction},
      {"memsets", summary.memsets},
      {"runtime_api_calls", summary.runtime_api_calls},
      {"driver_api_calls", summary.driver_api_calls},
      {"nvtx_ranges", summary.nvtx_ranges},
      {"synchronization_records", summary.synchronization_records},
      {"host_synchronizations", summary.host_synchronizations},
      {"api_calls", summary.api_calls},
      {"devices", devices},
      {"streams", streams},
      {"copies", copies},
      {"top_kernels", kernels},
      {"dropped_records", summary.dropped_records},
      {"nvml_unavailable_reason",
       summary.nvml_unavailable_reason ? json(*summary.nvml_unavailable_reason) : json(nullptr)}};
}

std::string render_text(const TraceSummary& summary) {
  auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string text = fmt::format(
      "window {:.3f} ms: {} kernels, {} copies, {} memsets, {} runtime API calls, {} NVTX ranges, "
      "{} host synchronizations\n",
      ms(summary.window_ns), summary.kernels, summary.memcpys, summary.memsets,
      summary.runtime_api_calls, summary.nvtx_ranges, summary.host_synchronizations);
  for (const DeviceSummary& d : summary.devices) {
    text += fmt::format(
        "GPU {}{}: kernel busy {:.1f}% of the window ({:.1f}% of the {:.3f} ms "
        "active span)",
        d.device_id, d.name.empty() ? "" : " (" + d.name + ")", d.kernel_busy_percent,
        d.kernel_busy_percent_of_active, ms(d.active_span_ns));
    if (d.sm_coverage_busy_percent_of_active) {
      text += fmt::format(", SM-coverage-weighted {:.1f}%", *d.sm_coverage_busy_percent_of_active);
    }
    if (d.nvml_gpu_util_percent_of_active) {
      text += fmt::format("; NVML GPU-Util {:.1f}% over the active span ({} samples in the window)",
                          *d.nvml_gpu_util_percent_of_active, d.nvml_samples);
    } else if (d.nvml_gpu_util_percent) {
      text += fmt::format("; NVML GPU-Util {:.1f}% over the window", *d.nvml_gpu_util_percent);
    } else {
      text += "; NVML GPU-Util: no samples";
    }
    text += fmt::format("\n  streams overlapping {:.3f} ms, copies overlapping kernels {:.3f} ms\n",
                        ms(d.stream_overlap_ns), ms(d.copy_compute_overlap_ns));
  }
  if (summary.nvml_unavailable_reason) {
    text += fmt::format("NVML unavailable: {}\n", *summary.nvml_unavailable_reason);
  }
  for (const StreamSummary& s : summary.streams) {
    text += fmt::format("  GPU {} stream {}: {} kernels ({:.1f}% busy), {} copies, {} memsets\n",
                        s.device_id, s.stream_id, s.kernels, s.kernel_busy_percent, s.memcpys,
                        s.memsets);
  }
  for (const CopySummary& c : summary.copies) {
    text += fmt::format("  GPU {} copies {}: {} ({} bytes), {:.1f}% busy\n", c.device_id,
                        copy_direction_name(c.direction), c.count, c.bytes, c.busy_percent);
  }
  if (!summary.top_kernels.empty()) text += "top kernels by total time:\n";
  for (const KernelNameSummary& k : summary.top_kernels) {
    text += fmt::format("  {:10.3f} ms  {:6}x  {}\n", ms(k.total_ns), k.count,
                        k.name.size() > 100 ? k.name.substr(0, 97) + "..." : k.name);
  }
  if (summary.dropped_records > 0) {
    text += fmt::format("warning: {} records were dropped; figures undercount\n",
                        summary.dropped_records);
  }
  return text;
}

}  // namespace gpuopt::trace
