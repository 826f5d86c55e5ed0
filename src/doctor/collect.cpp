// doctor's collection pass: reads sysfs/procfs under the root, NVML and Vulkan for a live machine.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <sstream>

#include "gpuopt/core/regular_file.hpp"
#include "gpuopt/doctor/doctor.hpp"
#include "gpuopt/doctor/load.hpp"

namespace gpuopt::doctor {

namespace fs = std::filesystem;

namespace {

constexpr double kProcessWindowS = 10;

template <typename T>
std::optional<T> keep(StatusOr<T> value, const char* what, std::vector<std::string>& problems) {
  if (value.ok()) return std::move(value).value();
  // NOT_SUPPORTED is normal on many boards (e.g. power on some SKUs): keep it quiet but recorded.
  problems.push_back(fmt::format("{}: {}", what, value.status().to_string()));
  return std::nullopt;
}

NvidiaGpu read_nvidia_gpu(const platform::Nvml& nvml, unsigned index, platform::NvmlDevice handle) {
  NvidiaGpu gpu;
  gpu.index = index;
  auto& p = gpu.problems;
  gpu.bdf = keep(nvml.pci_bus_id(handle), "PCI bus id", p).value_or("");
  gpu.name = keep(nvml.name(handle), "name", p).value_or("");
  gpu.uuid = keep(nvml.uuid(handle), "UUID", p).value_or("");
  gpu.memory = keep(nvml.memory(handle), "memory", p);
  if (auto link = keep(nvml.current_pcie_link(handle), "current PCIe link", p)) {
    gpu.current_generation = link->generation;
    gpu.current_width = link->width;
  }
  if (auto link = keep(nvml.max_pcie_link(handle), "max PCIe link", p)) {
    gpu.max_generation = link->generation;
    gpu.max_width = link->width;
  }
  gpu.gpu_max_generation = keep(nvml.gpu_max_pcie_generation(handle), "GPU max PCIe generation", p);
  gpu.tx_kbps =
      keep(nvml.pcie_throughput_kbps(handle, platform::NvmlPcieCounter::kTx), "PCIe TX", p);
  gpu.rx_kbps =
      keep(nvml.pcie_throughput_kbps(handle, platform::NvmlPcieCounter::kRx), "PCIe RX", p);
  gpu.replay_counter = keep(nvml.pcie_replay_counter(handle), "PCIe replay counter", p);
  gpu.bar1 = keep(nvml.bar1(handle), "BAR1", p);
  gpu.persistence_mode = keep(nvml.persistence_mode(handle), "persistence mode", p);
  gpu.performance_state = keep(nvml.performance_state(handle), "performance state", p);
  gpu.clock_event_reasons = keep(nvml.clock_event_reasons(handle), "clock event reasons", p);
  gpu.temperature_c = keep(nvml.temperature_c(handle), "temperature", p);
  gpu.power_w = keep(nvml.power_w(handle), "power", p);
  gpu.power_limit_w = keep(nvml.power_limit_w(handle), "power limit", p);
  gpu.ecc = keep(nvml.ecc(handle), "ECC", p);
  gpu.utilization = keep(nvml.utilization(handle), "utilization", p);
  if (auto processes = keep(nvml.compute_processes(handle), "compute processes", p)) {
    gpu.processes = std::move(*processes);
  }
  // NVML keeps a short history of per-process samples; ask for the last kProcessWindowS seconds.
  const auto now_us =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  gpu.process_window_s = kProcessWindowS;
  gpu.process_utilization = keep(
      nvml.process_utilization(handle, now_us - static_cast<std::uint64_t>(kProcessWindowS * 1e6)),
      "process utilization", p);
  return gpu;
}

void collect_nvml(Report& report) {
  auto nvml = platform::Nvml::instance();
  if (!nvml.ok()) {
    report.nvml.status = nvml.status().message();
    return;
  }
  const platform::Nvml& api = **nvml;
  auto count = api.device_count();
  if (!count.ok()) {
    report.nvml.status = count.status().message();
    return;
  }
  report.nvml.available = true;
  if (auto version = api.driver_version(); version.ok()) report.nvml.driver_version = *version;
  if (auto version = api.cuda_driver_version(); version.ok()) {
    report.nvml.cuda_driver_version = *version;
  }
  for (unsigned i = 0; i < *count; ++i) {
    auto handle = api.device_by_index(i);
    if (!handle.ok()) {
      report.notes.push_back(fmt::format("NVML GPU {}: {}", i, handle.status().message()));
      continue;
    }
    report.nvml.gpus.push_back(read_nvidia_gpu(api, i, *handle));
  }
}

void collect_load(Report& report) {
  auto nvml = platform::Nvml::instance();
  for (const auto& gpu : report.nvml.gpus) {
    LoadSample sample;
    sample.bdf = gpu.bdf;
    auto handle = nvml.ok() ? (*nvml)->device_by_index(gpu.index)
                            : StatusOr<platform::NvmlDevice>(nvml.status());
    auto ran = run_under_load(gpu.bdf, 500, [&] {
      if (!handle.ok()) return;
      if (auto link = (*nvml)->current_pcie_link(*handle); link.ok()) {
        sample.generation = link->generation;
        sample.width = link->width;
      }
      if (auto state = (*nvml)->performance_state(*handle); state.ok()) {
        sample.performance_state = *state;
      }
    });
    if (!ran.ok()) sample.status = ran.status().message();
    report.load.push_back(std::move(sample));
  }
}

}  // namespace

StatusOr<NvmlView> nvml_view_from_json(const nlohmann::json& nvidia, const std::string& origin) {
  using nlohmann::json;
  auto bad = [&](const std::string& what) {
    return invalid_argument(fmt::format("{}: recorded NVML view: {}", origin, what));
  };
  if (!nvidia.is_object() || !nvidia.contains("gpus") || !nvidia["gpus"].is_array()) {
    return bad("expected an object with a \"gpus\" list");
  }
  // Optional members: absent or null leave the metric absent; a wrong type is an error.
  auto unsigned_of = [&](const json& object, const char* key, auto& out) -> Status {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return ok_status();
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<std::int64_t>() >= 0)) {
      return bad(fmt::format("\"{}\" is not a non-negative integer", key));
    }
    out = it->get<std::uint64_t>();
    return ok_status();
  };
  NvmlView view;
  view.available = true;
  view.recorded = true;
  if (auto it = nvidia.find("driver_version"); it != nvidia.end() && it->is_string()) {
    view.driver_version = it->get<std::string>();
  }
  if (auto it = nvidia.find("cuda_driver_version"); it != nvidia.end() && it->is_number_integer()) {
    view.cuda_driver_version = it->get<int>();
  }
  for (const auto& item : nvidia["gpus"]) {
    if (!item.is_object()) return bad("a GPU is not an object");
    NvidiaGpu gpu;
    std::optional<std::uint64_t> index;
    GPUOPT_RETURN_IF_ERROR(unsigned_of(item, "index", index));
    gpu.index = static_cast<unsigned>(index.value_or(view.gpus.size()));
    for (auto [key, out] :
         {std::pair{"bdf", &gpu.bdf}, std::pair{"name", &gpu.name}, std::pair{"uuid", &gpu.uuid}}) {
      if (auto it = item.find(key); it != item.end() && it->is_string())
        *out = it->get<std::string>();
    }
    if (auto it = item.find("memory"); it != item.end() && it->is_object()) {
      std::optional<std::uint64_t> total, free, used, reserved;
      GPUOPT_RETURN_IF_ERROR(unsigned_of(*it, "total_bytes", total));
      GPUOPT_RETURN_IF_ERROR(unsigned_of(*it, "free_bytes", free));
      GPUOPT_RETURN_IF_ERROR(unsigned_of(*it, "used_bytes", used));
      GPUOPT_RETURN_IF_ERROR(unsigned_of(*it, "reserved_bytes", reserved));
      if (!total || !free || !used) return bad("memory needs total_bytes, free_bytes, used_bytes");
      gpu.memory = platform::NvmlMemory{*total, *free, *used, reserved};
    }
    std::optional<std::uint64_t> value;
    GPUOPT_RETURN_IF_ERROR(unsigned_of(item, "utilization_gpu_percent", value));
    if (value) gpu.utilization = platform::NvmlUtilization{static_cast<unsigned>(*value), 0};
    value.reset();
    GPUOPT_RETURN_IF_ERROR(unsigned_of(item, "performance_state", value));
    if (value) gpu.performance_state = static_cast<int>(*value);
    if (auto it = item.find("persistence_mode"); it != item.end() && it->is_boolean()) {
      gpu.persistence_mode = it->get<bool>();
    }
    if (auto pcie = item.find("pcie"); pcie != item.end() && pcie->is_object()) {
      for (auto [key, out] : {std::pair{"current_generation", &gpu.current_generation},
                              std::pair{"current_width", &gpu.current_width},
                              std::pair{"max_generation", &gpu.max_generation},
                              std::pair{"max_width", &gpu.max_width}}) {
        value.reset();
        GPUOPT_RETURN_IF_ERROR(unsigned_of(*pcie, key, value));
        if (value) *out = static_cast<unsigned>(*value);
      }
    }
    if (auto it = item.find("processes"); it != item.end() && it->is_array()) {
      for (const auto& process : *it) {
        if (!process.is_object()) return bad("a process is not an object");
        std::optional<std::uint64_t> pid, used;
        GPUOPT_RETURN_IF_ERROR(unsigned_of(process, "pid", pid));
        GPUOPT_RETURN_IF_ERROR(unsigned_of(process, "used_memory_bytes", used));
        if (!pid || *pid == 0 || *pid > 0x3fffffff) return bad("a process lacks a valid pid");
        gpu.processes.push_back({static_cast<unsigned>(*pid), used});
      }
    }
    if (auto it = item.find("process_utilization"); it != item.end() && it->is_object()) {
      if (auto window = it->find("window_s"); window != it->end() && window->is_number()) {
        gpu.process_window_s = window->get<double>();
      }
      std::vector<platform::NvmlProcessUtilization> samples;
      if (auto list = it->find("samples"); list != it->end() && list->is_array()) {
        for (const auto& sample : *list) {
          std::optional<std::uint64_t> pid, sm, memory;
          GPUOPT_RETURN_IF_ERROR(unsigned_of(sample, "pid", pid));
          GPUOPT_RETURN_IF_ERROR(unsigned_of(sample, "sm_percent", sm));
          GPUOPT_RETURN_IF_ERROR(unsigned_of(sample, "memory_percent", memory));
          if (!pid) return bad("a utilisation sample lacks its pid");
          samples.push_back({static_cast<unsigned>(*pid), 0, static_cast<unsigned>(sm.value_or(0)),
                             static_cast<unsigned>(memory.value_or(0))});
        }
      }
      gpu.process_utilization = std::move(samples);
    }
    view.gpus.push_back(std::move(gpu));
  }
  return view;
}

StatusOr<Report> collect(const Options& options) {
  auto start = std::chrono::steady_clock::now();
  Report report;
  report.root = options.root.empty() ? "/" : options.root;
  report.recorded = options.recorded();
  std::error_code error;
  if (!fs::is_directory(report.root, error)) {
    return not_found(fmt::format("--root {} is not a directory", report.root));
  }
  report.system = platform::read_system_info(report.root);
  auto scan = platform::scan_pci_devices(report.root, options.all_devices);
  if (scan.ok()) {
    report.pci = std::move(scan).value();
  } else {
    report.notes.push_back(scan.status().message());
  }
  if (options.use_nvml && !report.recorded) {
    collect_nvml(report);
  } else if (report.recorded && fs::exists(fs::path(report.root) / "nvml.json", error)) {
    const fs::path path = fs::path(report.root) / "nvml.json";
    auto text = read_regular_file(path, 16u << 20);
    nlohmann::json parsed =
        text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    auto view =
        text.ok() && !parsed.is_discarded()
            ? nvml_view_from_json(parsed, path.string())
            : StatusOr<NvmlView>(invalid_argument(fmt::format(
                  "{}: {}", path.string(), text.ok() ? "not JSON" : text.status().message())));
    if (view.ok()) {
      report.nvml = std::move(view).value();
    } else {
      report.nvml.status = view.status().message();
      report.notes.push_back(view.status().message());
    }
  } else {
    report.nvml.status =
        report.recorded ? "not used for a recorded machine (--root)" : "disabled by option";
  }
  std::vector<int> nvml_pids;
  for (const auto& gpu : report.nvml.gpus) {
    for (const auto& process : gpu.processes) nvml_pids.push_back(static_cast<int>(process.pid));
  }
  report.processes = platform::scan_gpu_processes(report.root, nvml_pids);
  if (auto uptime = read_regular_file(fs::path(report.root) / "proc/uptime", 256); uptime.ok()) {
    double seconds = 0;
    if (std::istringstream(*uptime) >> seconds && seconds > 0) report.uptime_s = seconds;
  }
  if (options.use_vulkan && !report.recorded) {
    report.vulkan.probed = true;
    auto vulkan = platform::probe_vulkan();
    if (vulkan.ok()) {
      report.vulkan.available = true;
      report.vulkan.info = std::move(vulkan).value();
    } else {
      report.vulkan.status = vulkan.status().message();
    }
  }
  if (options.load) {
    if (report.recorded) {
      report.notes.push_back("--load ignored for a recorded machine (--root)");
    } else if (!report.nvml.available) {
      report.notes.push_back("--load needs NVML to read the link under load; skipped");
    } else {
      collect_load(report);
    }
  }
  report.elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace gpuopt::doctor
