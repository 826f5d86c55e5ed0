// doctor --watch: samples links, replay counters and throughput over time and judges what one
// snapshot misses (a link that flaps, a replay rate above the BER 1e-12 budget).
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <thread>

#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {

int count_link_changes(const std::vector<WatchSample>& samples) {
  int changes = 0;
  for (std::size_t i = 1; i < samples.size(); ++i) {
    const auto& a = samples[i - 1];
    const auto& b = samples[i];
    if (a.speed_gts != b.speed_gts || a.width != b.width ||
        a.nvml_generation != b.nvml_generation || a.nvml_width != b.nvml_width) {
      ++changes;
    }
  }
  return changes;
}

std::string watch_header_lines() {
  return fmt::format(
      "# {:>8} {:>3} {:<12} {:>8} {:>8} {:>3} {:>7} {:>6} {:>4} {:>7} {:>7} {:>7}\n"
      "# {:>8} {:>3} {:<12} {:>8} {:>8} {:>3} {:>7} {:>6} {:>4} {:>7} {:>7} {:>7}\n",
      "time", "gpu", "bus_id", "link", "nvml", "sm", "fb", "pwr", "temp", "rxpci", "txpci",
      "replay", "s", "idx", "", "sysfs", "link", "%", "MiB", "W", "C", "MB/s", "MB/s", "count");
}

std::string watch_sample_line(const WatchSample& sample) {
  auto or_dash = [](const auto& value, auto&& format) -> std::string {
    return value ? format(*value) : std::string("-");
  };
  auto integer = [](auto value) { return fmt::format("{}", value); };
  std::string link = "-";
  if (sample.speed_gts || sample.width) {
    auto generation =
        sample.speed_gts ? platform::pcie_generation(*sample.speed_gts) : std::nullopt;
    link = fmt::format("{}x{}", generation ? fmt::format("Gen{}", *generation) : std::string("?"),
                       sample.width ? std::to_string(*sample.width) : "?");
  }
  std::string nvml_link = "-";
  if (sample.nvml_generation || sample.nvml_width) {
    nvml_link = fmt::format("Gen{}x{}", or_dash(sample.nvml_generation, integer),
                            or_dash(sample.nvml_width, integer));
  }
  return fmt::format(
      "  {:>8.1f} {:>3} {:<12} {:>8} {:>8} {:>3} {:>7} {:>6} {:>4} {:>7} {:>7} {:>7}\n", sample.t_s,
      or_dash(sample.gpu_index, integer), sample.bdf, link, nvml_link,
      or_dash(sample.sm_percent, integer),
      or_dash(sample.memory_used_bytes,
              [](std::uint64_t bytes) { return fmt::format("{}", bytes >> 20); }),
      or_dash(sample.power_w, [](double watts) { return fmt::format("{:.0f}", watts); }),
      or_dash(sample.temperature_c, integer),
      or_dash(sample.rx_kbps, [](unsigned kbps) { return fmt::format("{}", kbps / 1000); }),
      or_dash(sample.tx_kbps, [](unsigned kbps) { return fmt::format("{}", kbps / 1000); }),
      or_dash(sample.replay_counter, integer));
}

StatusOr<WatchResult> watch(const Options& options, Report& report, double interval_s,
                            double duration_s,
                            const std::function<void(const WatchSample&)>& on_sample) {
  if (!(interval_s > 0) || !(duration_s >= interval_s) || duration_s > 7 * 24 * 3600) {
    return invalid_argument(
        fmt::format("--watch {} --duration {}: need 0 < interval <= duration <= 1 week", interval_s,
                    duration_s));
  }
  WatchResult result;
  result.interval_s = interval_s;
  result.duration_s = duration_s;
  auto nvml = options.recorded() || !options.use_nvml
                  ? StatusOr<const platform::Nvml*>(unavailable("not used"))
                  : platform::Nvml::instance();
  auto start = std::chrono::steady_clock::now();
  for (int step = 0;; ++step) {
    auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(step * interval_s));
    std::this_thread::sleep_until(due);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (t > duration_s + interval_s / 2) break;
    for (const auto& device : report.pci.devices) {
      WatchSample sample;
      sample.t_s = t;
      sample.bdf = device.bdf;
      if (auto path = platform::read_link_path(report.root, device.bdf); path.ok()) {
        auto link = platform::effective_link(*path);
        sample.speed_gts = link.current_speed_gts;
        sample.width = link.current_width;
      }
      if (nvml.ok() && device.is_nvidia()) {
        if (auto handle = (*nvml)->device_by_pci_bus_id(device.bdf); handle.ok()) {
          if (auto link = (*nvml)->current_pcie_link(*handle); link.ok()) {
            sample.nvml_generation = link->generation;
            sample.nvml_width = link->width;
          }
          if (auto value = (*nvml)->pcie_replay_counter(*handle); value.ok())
            sample.replay_counter = *value;
          if (auto value = (*nvml)->pcie_throughput_kbps(*handle, platform::NvmlPcieCounter::kTx);
              value.ok()) {
            sample.tx_kbps = *value;
          }
          if (auto value = (*nvml)->pcie_throughput_kbps(*handle, platform::NvmlPcieCounter::kRx);
              value.ok()) {
            sample.rx_kbps = *value;
          }
          if (auto value = (*nvml)->utilization(*handle); value.ok()) {
            sample.sm_percent = value->gpu_percent;
          }
          if (auto value = (*nvml)->memory(*handle); value.ok()) {
            sample.memory_used_bytes = value->used_bytes;
          }
          if (auto value = (*nvml)->power_w(*handle); value.ok()) sample.power_w = *value;
          if (auto value = (*nvml)->temperature_c(*handle); value.ok()) {
            sample.temperature_c = *value;
          }
        }
      }
      for (const auto& gpu : report.nvml.gpus) {
        if (gpu.bdf == device.bdf) sample.gpu_index = gpu.index;
      }
      if (on_sample) on_sample(sample);
      result.samples.push_back(sample);
    }
    if (report.pci.devices.empty() && t >= duration_s) break;
  }
  std::map<std::string, std::vector<WatchSample>> by_device;
  for (const auto& sample : result.samples) by_device[sample.bdf].push_back(sample);
  for (const auto& [bdf, samples] : by_device) {
    WatchDeviceSummary summary;
    summary.bdf = bdf;
    summary.samples = static_cast<int>(samples.size());
    summary.link_changes = count_link_changes(samples);
    for (const auto& sample : samples) {
      if (sample.tx_kbps)
        summary.max_tx_kbps = std::max(summary.max_tx_kbps.value_or(0), *sample.tx_kbps);
      if (sample.rx_kbps)
        summary.max_rx_kbps = std::max(summary.max_rx_kbps.value_or(0), *sample.rx_kbps);
    }
    const auto& first = samples.front();
    const auto& last = samples.back();
    double minutes = (last.t_s - first.t_s) / 60.0;
    if (first.replay_counter && last.replay_counter && minutes > 0 &&
        *last.replay_counter >= *first.replay_counter) {
      summary.replays_per_minute = (*last.replay_counter - *first.replay_counter) / minutes;
    }
    for (const auto& gpu : report.nvml.gpus) {
      if (gpu.bdf == bdf && gpu.max_generation && gpu.max_width) {
        summary.replay_budget_per_minute = platform::replay_budget_per_minute(
            static_cast<int>(*gpu.max_generation), static_cast<int>(*gpu.max_width));
      }
    }
    // Idle GPUs change speed as they enter and leave low-power states; more than one change per
    // sample pair on average, or any width change, is flapping rather than power management.
    bool width_changed = false;
    for (std::size_t i = 1; i < samples.size(); ++i) {
      if (samples[i].width != samples[i - 1].width ||
          samples[i].nvml_width != samples[i - 1].nvml_width) {
        width_changed = true;
      }
    }
    if (width_changed || summary.link_changes * 2 > summary.samples) {
      report.findings.push_back(
          {"pcie.link_flapping",
           Severity::kWarning,
           bdf,
           "the link changed state repeatedly while watched",
           {{"samples", std::to_string(summary.samples)},
            {"link_changes", std::to_string(summary.link_changes)},
            {"width_changed", width_changed ? "true" : "false"}},
           "Reseat the card, riser and cables; check AER counters and `sudo journalctl -k | grep "
           "-i 'link'` for retraining messages.",
           "Needs a power-off to reseat."});
    }
    if (summary.replays_per_minute && summary.replay_budget_per_minute &&
        *summary.replays_per_minute > *summary.replay_budget_per_minute) {
      report.findings.push_back(
          {"pcie.replay_rate",
           Severity::kWarning,
           bdf,
           "PCIe replays while watched exceed what a link at BER 1e-12 allows (DCGM's rule)",
           {{"replays_per_minute", fmt::format("{:.2f}", *summary.replays_per_minute)},
            {"budget_per_minute", fmt::format("{:.2f}", *summary.replay_budget_per_minute)},
            {"window_s", fmt::format("{:.1f}", last.t_s - first.t_s)}},
           "Reseat the GPU, riser and cables; if it persists, the slot or GPU needs service.",
           "Needs a power-off to reseat."});
    }
    result.devices.push_back(summary);
  }
  return result;
}

nlohmann::json watch_to_json(const WatchResult& result) {
  using nlohmann::json;
  auto opt = [](const auto& value) { return value ? json(*value) : json(nullptr); };
  json devices = json::array();
  for (const auto& device : result.devices) {
    devices.push_back({{"bdf", device.bdf},
                       {"samples", device.samples},
                       {"link_changes", device.link_changes},
                       {"replays_per_minute", opt(device.replays_per_minute)},
                       {"replay_budget_per_minute", opt(device.replay_budget_per_minute)},
                       {"max_tx_kbps", opt(device.max_tx_kbps)},
                       {"max_rx_kbps", opt(device.max_rx_kbps)}});
  }
  json samples = json::array();
  for (const auto& sample : result.samples) {
    samples.push_back({{"t_s", sample.t_s},
                       {"bdf", sample.bdf},
                       {"speed_gts", opt(sample.speed_gts)},
                       {"width", opt(sample.width)},
                       {"nvml_generation", opt(sample.nvml_generation)},
                       {"nvml_width", opt(sample.nvml_width)},
                       {"replay_counter", opt(sample.replay_counter)},
                       {"tx_kbps", opt(sample.tx_kbps)},
                       {"rx_kbps", opt(sample.rx_kbps)},
                       {"gpu", opt(sample.gpu_index)},
                       {"sm_percent", opt(sample.sm_percent)},
                       {"memory_used_bytes", opt(sample.memory_used_bytes)},
                       {"power_w", opt(sample.power_w)},
                       {"temperature_c", opt(sample.temperature_c)}});
  }
  return {{"interval_s", result.interval_s},
          {"duration_s", result.duration_s},
          {"devices", devices},
          {"samples", samples}};
}

std::string render_watch_text(const WatchResult& result) {
  std::string out =
      fmt::format("\nWatched every {:g} s for {:g} s:\n", result.interval_s, result.duration_s);
  for (const auto& device : result.devices) {
    out += fmt::format(
        "  {}: {} samples, {} link changes, replays/min {} (budget {}), max TX {} "
        "KB/s, max RX {} KB/s\n",
        device.bdf, device.samples, device.link_changes,
        device.replays_per_minute ? fmt::format("{:.2f}", *device.replays_per_minute) : "?",
        device.replay_budget_per_minute ? fmt::format("{:.2f}", *device.replay_budget_per_minute)
                                        : "?",
        device.max_tx_kbps ? std::to_string(*device.max_tx_kbps) : "?",
        device.max_rx_kbps ? std::to_string(*device.max_rx_kbps) : "?");
  }
  return out;
}

}  // namespace gpuopt::doctor
