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
