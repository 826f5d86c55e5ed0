// doctor's rules: turn what collect() read into findings with stable ids, judged as DCGM does
// (an idle GPU lowers its link on purpose; NVML, when present, is the authority on the link).
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {

namespace {

std::string gen_text(std::optional<double> speed_gts) {
  if (!speed_gts) return "unknown";
  auto generation = platform::pcie_generation(*speed_gts);
  return generation ? fmt::format("Gen{} ({:g} GT/s)", *generation, *speed_gts)
                    : fmt::format("{:g} GT/s", *speed_gts);
}

std::string link_text(std::optional<double> speed_gts, std::optional<int> width) {
  return fmt::format("{} x{}", gen_text(speed_gts), width ? std::to_string(*width) : "?");
}

std::string nvml_link_text(std::optional<unsigned> generation, std::optional<unsigned> width) {
  return fmt::format("Gen{} x{}", generation ? std::to_string(*generation) : "?",
                     width ? std::to_string(*width) : "?");
}

const NvidiaGpu* nvml_gpu(const Report& report, const std::string& bdf) {
  for (const auto& gpu : report.nvml.gpus) {
    if (gpu.bdf == bdf) return &gpu;
  }
  return nullptr;
}

const LoadSample* load_sample(const Report& report, const std::string& bdf) {
  for (const auto& sample : report.load) {
    if (sample.bdf == bdf && sample.status.empty()) return &sample;
  }
  return nullptr;
}

bool translated_domain(const std::string& type) { return type == "DMA" || type == "DMA-FQ"; }

void add(Report& report, Finding finding) { report.findings.push_back(std::move(finding)); }

// ---- Hybrid laptops ----

// Ada mobile parts with an x8 PCIe interface, by PCI device id (pci.ids names in the comments).
struct X8Gpu {
  std::uint16_t device_id;
  const char* chip;
};
constexpr X8Gpu kX8Gpus[] = {
    {0x2820, "AD106M"},    // GeForce RTX 4070 Max-Q / Mobile
    {0x2860, "AD106M"},    // GeForce RTX 4070 Max-Q / Mobile
    {0x2838, "AD106GLM"},  // RTX 3000 Ada Generation Laptop GPU
    {0x28a0, "AD107M"},    // GeForce RTX 4060 Max-Q / Mobile
    {0x28a1, "AD107M"},    // GeForce RTX 4050 Max-Q / Mobile
    {0x28b8, "AD107GLM"},  // RTX 2000 Ada Generation Laptop GPU
    {0x28e0, "AD107M"},    // GeForce RTX 4060 Max-Q / Mobile
    {0x28e1, "AD107M"},    // GeForce RTX 4050 Max-Q / Mobile
};
constexpr const char* kX8Chips[] = {"AD106M", "AD106GLM", "AD107M", "AD107GLM"};

std::string device_label(const platform::PciDevice& device) {
  return device.device_name.empty()
             ? fmt::format("{:04x}:{:04x}", device.vendor_id, device.device_id)
             : device.device_name;
}

void judge_x8_by_design(Report& report, const platform::PciDevice& device) {
  auto chip = x8_link_by_design(device.vendor_id, device.device_id, device.device_name);
  if (!chip) return;
  const auto& link = device.effective_link;
  const NvidiaGpu* gpu = nvml_gpu(report, device.bdf);
  std::optional<int> width = link.current_width;
  if (gpu != nullptr && gpu->current_width) width = static_cast<int>(*gpu->current_width);
  std::optional<int> max_width = link.max_width;
  if (gpu != nullptr && gpu->max_width) max_width = static_cast<int>(*gpu->max_width);
  if (width.value_or(max_width.value_or(0)) != 8) return;  // x4 on an x8 chip is a fault
  std::optional<double> max_speed = link.max_speed_gts;
  std::string rate;
  if (auto generation = max_speed ? platform::pcie_generation(*max_speed) : std::nullopt) {
    if (auto gbps = platform::pcie_bandwidth_gbps(*generation, 8)) {
      rate = fmt::format("Gen{} x8, about {:.1f} GB/s per direction", *generation, *gbps);
    }
  }
  add(report,
      {"pcie.link_width_by_design",
       Severity::kInfo,
       device.bdf,
       fmt::format("{} has an eight-lane PCIe interface: its x8 link is its design, not a "
                   "fault{}",
                   device.device_name.rfind(*chip, 0) == 0
                       ? device.device_name
                       : fmt::format("{} ({})", device_label(device), *chip),
                   rate.empty() ? "" : " (" + rate + ")"),
       {{"chip", *chip},
        {"device_id", fmt::format("0x{:04x}", device.device_id)},
        {"current_width", width ? std::to_string(*width) : "?"},
        {"max_width", max_width ? std::to_string(*max_width) : "?"}},
       "Nothing to fix. Keep host<->device copies large and pinned; an x16 slot would not make "
       "this GPU faster.",
       "None (read-only check)."});
}

bool is_gpu(const platform::PciDevice& device) {
  return device.is_display() || device.is_accelerator();
}

void judge_display(Report& report) {
  for (const auto& device : report.pci.devices) {
    if (!device.is_nvidia() || !is_gpu(device) || device.boot_vga != true) continue;
    int gpus = 0;
    for (const auto& other : report.pci.devices) gpus += is_gpu(other) ? 1 : 0;
    add(report,
        {"gpu.drives_display",
         Severity::kInfo,
         device.bdf,
         fmt::format("{} drives the display (boot_vga): the desktop shares its memory and time, "
                     "and the display watchdog can end long kernels",
                     device_label(device)),
         {{"boot_vga", "1"}, {"gpus", std::to_string(gpus)}},
         gpus > 1 ? "On a hybrid laptop, let the integrated GPU drive the desktop (firmware "
                    "'hybrid'/'Optimus' mode instead of 'discrete', or `sudo prime-select "
                    "on-demand`) so the NVIDIA GPU only computes."
                  : "Connect the monitor to another GPU, or run compute jobs without a desktop "
                    "session on this GPU.",
         "A hybrid mode may need a reboot; external monitors wired to the NVIDIA GPU then go "
         "through the integrated one."});
  }
}

void judge_runtime_power(Report& report, const platform::PciDevice& device) {
  if (!device.is_nvidia() || !is_gpu(device)) return;
  if (device.runtime_status != "suspended" && device.runtime_status != "suspending") return;
  add(report,
      {"gpu.runtime_suspended",
       Severity::kInfo,
       device.bdf,
       fmt::format("{} is runtime-suspended (power/runtime_status = {}): the first CUDA or NVML "
                   "call wakes it and pays the resume latency, so a first call or a benchmark's "
                   "first sample is slow",
                   device_label(device), device.runtime_status),
       {{"runtime_status", device.runtime_status}},
       fmt::format("Warm up before timing; to keep it awake until reboot: `echo on | sudo tee "
                   "/sys/bus/pci/devices/{}/power/control` (back to `auto` to save power again).",
                   device.bdf),
       "An awake dGPU draws power all the time: shorter battery life."});
}

// ---- PCIe link rules ----

void judge_link_sysfs(Report& report, const platform::PciDevice& device) {
  if (device.path.empty()) return;
  const auto& own = device.path.front().link.link;
  std::optional<double> upstream_speed;
  std::optional<int> upstream_width;
  std::string narrowest_hop;
  for (std::size_t i = 1; i < device.path.size(); ++i) {
    const auto& hop = device.path[i].link;
    if (hop.link.max_speed_gts && (!upstream_speed || *hop.link.max_speed_gts < *upstream_speed)) {
      upstream_speed = hop.link.max_speed_gts;
      narrowest_hop = hop.bdf;
    }
    if (hop.link.max_width && (!upstream_width || *hop.link.max_width < *upstream_width)) {
      upstream_width = hop.link.max_width;
      if (narrowest_hop.empty()) narrowest_hop = hop.bdf;
    }
  }
  bool slower_slot = own.max_speed_gts && upstream_speed && *upstream_speed < *own.max_speed_gts;
  // A GPU with eight lanes by design in an x8 slot is not limited by it.
  bool narrower_slot = own.max_width && upstream_width && *upstream_width < *own.max_width &&
                       !(*upstream_width == 8 &&
                         x8_link_by_design(device.vendor_id, device.device_id, device.device_name));
  if (slower_slot || narrower_slot) {
    add(report,
        {"pcie.slot_limited",
         Severity::kWarning,
         device.bdf,
         "the device can link faster than the slot or a bridge above it allows",
         {{"device_max", link_text(own.max_speed_gts, own.max_width)},
          {"path_max", link_text(upstream_speed, upstream_width)},
          {"limiting_hop", narrowest_hop}},
         fmt::format("Move the card to a slot wired for {} (see the board manual), or set that "
                     "slot's link speed to Auto in the firmware setup; `sudo lspci -vv -s {}` "
                     "shows LnkCap of the limiting port.",
                     link_text(own.max_speed_gts, own.max_width), narrowest_hop),
         "Needs a power-off to move the card; none otherwise."});
  }
  const auto& link = device.effective_link;
  const bool suspended = device.runtime_status == "suspended";
  if (link.current_speed_gts && link.max_speed_gts &&
      *link.current_speed_gts < *link.max_speed_gts && suspended) {
    report.notes.push_back(fmt::format(
        "{}: link at {} while runtime-suspended: its lowest rate until the GPU wakes, not judged",
        device.bdf, link_text(link.current_speed_gts, link.current_width)));
  } else if (link.current_speed_gts && link.max_speed_gts &&
             *link.current_speed_gts < *link.max_speed_gts) {
    add(report,
        {"pcie.link_downgraded",
         Severity::kInfo,
         device.bdf,
         "the link runs below its maximum speed; the power state is unknown, so this may be the "
         "normal idle downtraining of a GPU",
         {{"current", link_text(link.current_speed_gts, link.current_width)},
          {"max", link_text(link.max_speed_gts, link.max_width)},
          {"power_state", "unknown (no NVML or a recorded machine)"}},
         "Judge it under load: run `gpuopt doctor --load` on the machine with the NVIDIA driver, "
         "or watch `nvidia-smi -q -d PERFORMANCE,PCIE` while a job runs.",
         "None (read-only check)."});
  }
  const bool x8_design =
      x8_link_by_design(device.vendor_id, device.device_id, device.device_name).has_value();
  if (link.current_width && link.max_width && *link.current_width < *link.max_width &&
      !(x8_design && *link.current_width == 8)) {
    add(report,
        {"pcie.link_width_reduced",
         Severity::kWarning,
         device.bdf,
         "the link trained with fewer lanes than both ends support",
         {{"current", link_text(link.current_speed_gts, link.current_width)},
          {"max", link_text(link.max_speed_gts, link.max_width)}},
         "Reseat the card and its riser or cable; check the slot's lane sharing (M.2/bifurcation "
         "settings) in the firmware setup.",
         "Needs a power-off to reseat."});
  }
}

void judge_link_nvml(Report& report, const platform::PciDevice& device, const NvidiaGpu& gpu) {
  // NVML's max already accounts for the slot (DCGM's view); the GPU's own max tells slot limits.
  if (gpu.gpu_max_generation && gpu.max_generation &&
      *gpu.gpu_max_generation > *gpu.max_generation) {
    add(report,
        {"pcie.slot_limited",
         Severity::kWarning,
         device.bdf,
         "the GPU supports a faster PCIe generation than the system gives it",
         {{"gpu_max_generation", std::to_string(*gpu.gpu_max_generation)},
          {"system_max", nvml_link_text(gpu.max_generation, gpu.max_width)}},
         "Move the GPU to a slot (or riser) of its generation, or set the slot's link speed to "
         "Auto in the firmware setup.",
         "Needs a power-off to move the card; none otherwise."});
  }
  if (!gpu.current_generation || !gpu.max_generation) return;
  const LoadSample* load = load_sample(report, device.bdf);
  std::optional<unsigned> generation = load ? load->generation : gpu.current_generation;
  std::optional<unsigned> width = load ? load->width : gpu.current_width;
  std::optional<int> pstate = load ? load->performance_state : gpu.performance_state;
  bool busy = load != nullptr || (pstate && *pstate == 0);
  std::string when = load ? "under --load" : pstate ? fmt::format("in P{}", *pstate) : "";
  if (generation && *generation < *gpu.max_generation) {
    if (busy) {
      add(report,
          {"pcie.link_downgraded",
           Severity::kWarning,
           device.bdf,
           fmt::format("the link runs below its maximum generation {}", when),
           {{"current", nvml_link_text(generation, width)},
            {"max", nvml_link_text(gpu.max_generation, gpu.max_width)},
            {"performance_state", pstate ? fmt::format("P{}", *pstate) : "unknown"}},
           "Reseat the GPU and its riser; set the slot to its full generation in the firmware "
           "setup; if it persists, check AER counters (`gpuopt doctor --watch 60`).",
           "Needs a power-off to reseat."});
    } else if (pstate) {
      report.notes.push_back(fmt::format(
          "{}: link at Gen{} while idle (P{}): normal power saving, not judged; `gpuopt doctor "
          "--load` judges it under load",
          device.bdf, *generation, *pstate));
    }
  }
  const bool x8_design =
      x8_link_by_design(device.vendor_id, device.device_id, device.device_name).has_value();
  if (width && gpu.max_width && *width < *gpu.max_width && !(x8_design && *width == 8)) {
    add(report, {"pcie.link_width_reduced",
                 Severity::kWarning,
                 device.bdf,
                 "the link trained with fewer lanes than the GPU and slot support",
                 {{"current", nvml_link_text(generation, width)},
                  {"max", nvml_link_text(gpu.max_generation, gpu.max_width)}},
                 "Reseat the GPU and its riser or cable; check lane sharing in the firmware setup.",
                 "Needs a power-off to reseat."});
  }
}

void judge_replay_snapshot(Report& report, const NvidiaGpu& gpu) {
  if (!gpu.replay_counter || *gpu.replay_counter == 0 || !report.uptime_s) return;
  unsigned generation = gpu.max_generation.value_or(gpu.current_generation.value_or(0));
  unsigned width = gpu.max_width.value_or(gpu.current_width.value_or(0));
  auto budget =
      platform::replay_budget_per_minute(static_cast<int>(generation), static_cast<int>(width));
  if (!budget) return;
  double per_minute = *gpu.replay_counter / (*report.uptime_s / 60.0);
  if (per_minute <= *budget) return;
  add(report, {"pcie.replay_rate",
               Severity::kWarning,
               gpu.bdf,
               "PCIe replays since boot average more than a link at BER 1e-12 allows",
               {{"replay_counter", std::to_string(*gpu.replay_counter)},
                {"uptime_s", fmt::format("{:.0f}", *report.uptime_s)},
                {"replays_per_minute", fmt::format("{:.2f}", per_minute)},
                {"budget_per_minute", fmt::format("{:.2f}", *budget)}},
               "Measure the current rate with `gpuopt doctor --watch 5 --duration 120`; persistent "
               "replays mean signal problems: reseat the GPU, riser and cables.",
               "Needs a power-off to reseat."});
}

// ---- Capabilities ----

void judge_capabilities(Report& report, const platform::PciDevice& device, int accelerators) {
  if (device.config && device.config->ats_present && device.config->ats_enabled == false &&
      translated_domain(device.iommu_domain_type)) {
    add(report,
        {"pcie.ats_disabled",
         Severity::kInfo,
         device.bdf,
         "the IOMMU translates this device's DMA but the device's ATS is off, so every DMA "
         "translation is done by the IOMMU",
         {{"ats_present", "true"},
          {"ats_enabled", "false"},
          {"iommu_domain_type", device.iommu_domain_type}},
         "Prefer iommu=pt (see iommu.translated_mode); with translation kept, enable ATS in the "
         "firmware setup (\"ATS\"/\"PCIe ATS support\") so the kernel can turn it on.",
         "ATS lets the device cache translations: a faulty device could use stale ones."});
  }
  std::vector<std::string> redirecting;
  for (std::size_t i = 1; i < device.path.size(); ++i) {
    const auto& config = device.path[i].config;
    if (config && (config->acs_p2p_request_redirect() || config->acs_p2p_completion_redirect())) {
      redirecting.push_back(fmt::format("{} (ACS control 0x{:04x})", device.path[i].link.bdf,
                                        config->acs_control.value_or(0)));
    }
  }
  if (!redirecting.empty()) {
    std::string bridges;
    for (const auto& bridge : redirecting) bridges += (bridges.empty() ? "" : ", ") + bridge;
    add(report,
        {"pcie.acs_redirect",
         accelerators >= 2 ? Severity::kWarning : Severity::kInfo,
         device.bdf,
         "bridges above the device redirect peer-to-peer requests to the root complex, so GPU "
         "P2P traffic cannot go switch-local",
         {{"bridges", bridges}, {"accelerators", std::to_string(accelerators)}},
         fmt::format("On bare metal without VFIO: disable ACS in the firmware setup, or per boot "
                     "`sudo setpci -s {} ECAP_ACS+6.w=0000`.",
                     device.path[1].link.bdf),
         "Devices below the bridge can then reach each other without the IOMMU: IOMMU groups "
         "merge, unsafe when passing devices to VMs."});
  }
}

void judge_aer(Report& report, const platform::PciDevice& device) {
  std::uint64_t correctable = device.aer.correctable.value_or(0);
  std::uint64_t uncorrectable = device.aer.fatal.value_or(0) + device.aer.nonfatal.value_or(0);
  if (correctable == 0 && uncorrectable == 0) return;
  Finding finding{"pcie.aer_errors",
                  uncorrectable > 0 ? Severity::kError : Severity::kWarning,
                  device.bdf,
                  "the device logged PCIe errors since boot (AER)",
                  {{"correctable", std::to_string(correctable)},
                   {"fatal", std::to_string(device.aer.fatal.value_or(0))},
                   {"nonfatal", std::to_string(device.aer.nonfatal.value_or(0))}},
                  "Look at `sudo journalctl -k | grep -i aer` for when they happened; a growing "
                  "count means signal problems: reseat the card, riser and cables.",
                  "Needs a power-off to reseat."};
  for (const auto& [name, count] : device.aer.details) {
    finding.evidence.emplace_back(name, std::to_string(count));
  }
  add(report, std::move(finding));
}

void judge_aspm_device(Report& report, const platform::PciDevice& device, bool policy_flagged) {
  if (policy_flagged) return;
  std::vector<std::string> enabled;
  for (const auto& [name, on] : device.aspm.states) {
    if (on) enabled.push_back(name);
  }
  if (enabled.empty() && device.config && device.config->aspm_control.value_or(0) != 0) {
    enabled.push_back(platform::aspm_control_name(*device.config->aspm_control));
  }
  if (enabled.empty()) return;
  std::string states;
  for (const auto& state : enabled) states += (states.empty() ? "" : " ") + state;
  add(report,
      {"pcie.aspm_policy",
       Severity::kInfo,
       device.bdf,
       "ASPM low-power link states are enabled on this device's link (firmware or driver set)",
       {{"enabled_states", states}},
       fmt::format("Until reboot: `echo 0 | sudo tee /sys/bus/pci/devices/{}/link/l1_aspm`; "
                   "permanently: kernel parameter pcie_aspm.policy=performance.",
                   device.bdf),
       "More idle power (a few watts per link)."});
}

// ---- NVIDIA ----

void judge_nvidia(Report& report, const NvidiaGpu& gpu) {
  if (gpu.persistence_mode == false) {
    add(report,
        {"gpu.persistence_off",
         Severity::kWarning,
         gpu.bdf,
         "persistence mode is off: the driver tears the GPU down when the last client exits, so "
         "each new job pays the initialisation again",
         {{"persistence_mode", "disabled"}},
         "`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1` until "
         "reboot).",
         "The GPU stays initialised: slightly more idle power."});
  }
  if (gpu.clock_event_reasons) {
    std::uint64_t reasons = *gpu.clock_event_reasons;
    std::uint64_t hardware = platform::kClockEventHwSlowdown |
                             platform::kClockEventHwThermalSlowdown |
                             platform::kClockEventHwPowerBrakeSlowdown;
    std::uint64_t software =
        platform::kClockEventSwThermalSlowdown | platform::kClockEventSwPowerCap;
    if (reasons & (hardware | software)) {
      std::string names;
      for (const auto& name : platform::clock_event_names(reasons)) {
        names += (names.empty() ? "" : " ") + name;
      }
      std::vector<std::pair<std::string, std::string>> evidence = {
          {"reasons", names}, {"bitmask", fmt::format("0x{:x}", reasons)}};
      if (gpu.temperature_c)
        evidence.emplace_back("temperature_c", std::to_string(*gpu.temperature_c));
      if (gpu.power_w) evidence.emplace_back("power_w", fmt::format("{:.1f}", *gpu.power_w));
      if (gpu.power_limit_w) {
        evidence.emplace_back("power_limit_w", fmt::format("{:.1f}", *gpu.power_limit_w));
      }
      add(report,
          {"gpu.clock_events", (reasons & hardware) ? Severity::kError : Severity::kWarning,
           gpu.bdf, "clocks are held down by power or thermal limits", std::move(evidence),
           "Check cooling and power delivery (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`); "
           "hardware slowdown means the board or PSU asserted it.",
           "None (read-only check)."});
    }
  }
}

// ---- Memory ----

std::string gib_text(std::uint64_t bytes) {
  return fmt::format("{:.1f} GiB", bytes / double(1ull << 30));
}

const platform::ProcessInfo* process_info(const Report& report, int pid) {
  for (const auto& process : report.processes.processes) {
    if (process.pid == pid) return &process;
  }
  return nullptr;
}

// A process holding memory that ran nothing in NVML's sample window (an idle notebook kernel, a
// finished job waiting on input, a leaked worker), and memory in use that no listed process
// holds (processes of other containers or PID namespaces).
void judge_memory(Report& report, const NvidiaGpu& gpu) {
  std::uint64_t listed = 0;
  for (const auto& held : gpu.processes) {
    if (!held.used_memory_bytes) continue;
    listed += *held.used_memory_bytes;
    if (!gpu.process_utilization || *held.used_memory_bytes < kIdleHolderBytes) continue;
    const platform::ProcessInfo* info = process_info(report, static_cast<int>(held.pid));
    if (info != nullptr && info->state == 'Z') continue;  // gpu.context_leak names it already
    int samples = 0;
    bool active = false;
    for (const auto& sample : *gpu.process_utilization) {
      if (sample.pid != held.pid) continue;
      ++samples;
      active = active || sample.sm_percent > 0 || sample.memory_percent > 0;
    }
    if (active) continue;
    const std::string name = info != nullptr ? info->comm : "?";
    std::vector<std::pair<std::string, std::string>> evidence = {
        {"pid", std::to_string(held.pid)},
        {"name", name},
        {"gpu", fmt::format("{} ({})", gpu.index, gpu.bdf)},
        {"used_memory_bytes", std::to_string(*held.used_memory_bytes)},
        {"samples", samples == 0 ? fmt::format("none in the last {:g} s", gpu.process_window_s)
                                 : fmt::format("{} in the last {:g} s, all at 0 %", samples,
                                               gpu.process_window_s)}};
    std::string share;
    if (gpu.memory && gpu.memory->total_bytes > 0) {
      share = fmt::format(" ({:.0f} % of the GPU)",
                          100.0 * *held.used_memory_bytes / gpu.memory->total_bytes);
      evidence.emplace_back("gpu_total_bytes", std::to_string(gpu.memory->total_bytes));
    }
    if (info != nullptr) evidence.emplace_back("state", std::string(1, info->state));
    add(report,
        {"gpu.idle_memory_holder", Severity::kWarning, fmt::format("pid {}", held.pid),
         fmt::format("{} (pid {}) holds {}{} on GPU {} but ran nothing on it in the last {:g} s",
                     name, held.pid, gib_text(*held.used_memory_bytes), share, gpu.index,
                     gpu.process_window_s),
         std::move(evidence),
         fmt::format("If it is an idle notebook or a finished job, end it (`kill -TERM {}`); if it "
                     "is yours and must stay, release PyTorch's cache "
                     "(`torch.cuda.empty_cache()`) or cap it "
                     "(`torch.cuda.set_per_process_memory_fraction`).",
                     held.pid),
         "Ending it loses its state (a notebook's variables, a job's progress)."});
  }
  if (!gpu.memory) return;
  const std::uint64_t used = gpu.memory->used_bytes;
  if (used > listed && used - listed >= kIdleHolderBytes) {
    std::vector<std::pair<std::string, std::string>> evidence = {
        {"used_bytes", std::to_string(used)},
        {"listed_process_bytes", std::to_string(listed)},
        {"processes_listed", std::to_string(gpu.processes.size())}};
    if (gpu.memory->reserved_bytes) {
      evidence.emplace_back("reserved_bytes", std::to_string(*gpu.memory->reserved_bytes));
    }
    add(report,
        {"gpu.memory_unaccounted", Severity::kInfo, gpu.bdf,
         fmt::format("{} of GPU {}'s memory is in use by no process listed here: processes in "
                     "other containers or PID namespaces, or a context the driver has not freed",
                     gib_text(used - listed), gpu.index),
         std::move(evidence),
         "Run `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` on the host, outside "
         "any container, to see every holder.",
         "None (read-only check)."});
  }
}

// ---- Processes ----

void judge_processes(Report& report) {
  for (const auto& process : report.processes.processes) {
    std::vector<std::string> reasons;
    Severity severity = Severity::kInfo;
    if (process.state == 'Z') {
      reasons.push_back("zombie (state Z): its memory is freed only when the parent reaps it");
      severity = Severity::kError;
    }
    bool orphan = (!process.parent_exists || process.ppid == 1) && !process.session_leader_exists;
    if (orphan) {
      reasons.push_back("orphaned: reparented to init and its session is gone");
      severity = std::max(severity, Severity::kWarning);
    }
    bool other_container = platform::is_container_cgroup(process.cgroup) &&
                           process.cgroup != report.processes.own_cgroup;
    if (other_container) reasons.push_back("belongs to another container (cgroup)");
    if (reasons.empty()) continue;
    std::optional<std::uint64_t> used;
    for (const auto& gpu : report.nvml.gpus) {
      for (const auto& held : gpu.processes) {
        if (static_cast<int>(held.pid) == process.pid && held.used_memory_bytes) {
          used = used.value_or(0) + *held.used_memory_bytes;
        }
      }
    }
    std::string why;
    for (const auto& reason : reasons) why += (why.empty() ? "" : "; ") + reason;
    std::string files;
    for (const auto& file : process.gpu_files) files += (files.empty() ? "" : " ") + file;
    Finding finding{"gpu.context_leak",
                    severity,
                    fmt::format("pid {}", process.pid),
                    fmt::format("{} (pid {}) holds the GPU: {}", process.comm, process.pid, why),
                    {{"pid", std::to_string(process.pid)},
                     {"name", process.comm},
                     {"state", std::string(1, process.state)},
                     {"parent", process.parent_exists
                                    ? fmt::format("{} (pid {})", process.parent_comm, process.ppid)
                                    : fmt::format("gone (pid {})", process.ppid)},
                     {"cgroup", process.cgroup},
                     {"gpu_files", files.empty() ? "(from NVML)" : files}},
                    "",
                    ""};
    if (used) finding.evidence.emplace_back("gpu_memory_bytes", std::to_string(*used));
    if (process.state == 'Z' && process.parent_exists && process.ppid != 1) {
      finding.fix = fmt::format(
          "The parent {} (pid {}) has not reaped it: stop the parent, `kill -TERM {}`, so init "
          "reaps the zombie and the driver frees its memory.",
          process.parent_comm, process.ppid, process.ppid);
      finding.risk = fmt::format("Ends {} (pid {}) and any work it still does.",
                                 process.parent_comm, process.ppid);
    } else if (process.state == 'Z') {
      finding.fix =
          "A zombie whose parent is init is stuck in the driver (a thread in D state): "
          "only a GPU reset (`sudo nvidia-smi -r`) or a reboot frees its memory.";
      finding.risk = "Resetting ends every job on that GPU.";
    } else if (orphan) {
      finding.fix = fmt::format("If nobody uses it: `kill -TERM {}`.", process.pid);
      finding.risk = fmt::format("Ends {} (pid {}).", process.comm, process.pid);
    } else {
      finding.fix =
          "Check that the container is still meant to use this GPU (`docker ps`, "
          "`crictl ps`); stop it if not.";
      finding.risk = "Stopping the container ends its work.";
    }
    add(report, std::move(finding));
  }
}

}  // namespace

std::optional<std::string> x8_link_by_design(std::uint16_t vendor_id, std::uint16_t device_id,
                                             std::string_view device_name) {
  if (vendor_id != 0x10de) return std::nullopt;
  for (const auto& gpu : kX8Gpus) {
    if (gpu.device_id == device_id) return std::string(gpu.chip);
  }
  for (const char* chip : kX8Chips) {
    const std::string_view prefix(chip);
    // "AD107M [GeForce RTX 4060 Max-Q / Mobile]": the chip, then a space or the end.
    if (device_name.substr(0, prefix.size()) == prefix &&
        (device_name.size() == prefix.size() || device_name[prefix.size()] == ' ')) {
      return std::string(chip);
    }
  }
  return std::nullopt;
}

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
  }
  return "info";
}

void judge(Report& report) {
  report.findings.clear();
  const auto& policy = report.system.aspm_policy;
  bool policy_flagged = policy && (*policy == "powersave" || *policy == "powersupersave");
  int accelerators = 0;
  for (const auto& device : report.pci.devices) {
    if ((device.is_display() && device.is_nvidia()) || device.is_accelerator()) ++accelerators;
  }
  if (policy_flagged) {
    add(report,
        {"pcie.aspm_policy",
         Severity::kWarning,
         "system",
         "the kernel's ASPM policy puts PCIe links into low-power states; a GPU link then pays "
         "exit latency on every burst of traffic",
         {{"policy", *policy}, {"policy_file", report.system.aspm_policy_raw}},
         "Kernel parameter pcie_aspm.policy=performance (add it to GRUB_CMDLINE_LINUX in "
         "/etc/default/grub, `sudo update-grub`, reboot); until reboot: `echo performance | sudo "
         "tee /sys/module/pcie_aspm/parameters/policy`.",
         "More idle power (a few watts per link); laptops lose some battery life."});
  }
  std::set<int> translated_groups;
  for (const auto& device : report.pci.devices) {
    const NvidiaGpu* gpu = nvml_gpu(report, device.bdf);
    if (gpu != nullptr) {
      judge_link_nvml(report, device, *gpu);
    } else {
      judge_link_sysfs(report, device);
    }
    judge_x8_by_design(report, device);
    judge_runtime_power(report, device);
    judge_capabilities(report, device, accelerators);
    judge_aer(report, device);
    judge_aspm_device(report, device, policy_flagged);
    if (translated_domain(device.iommu_domain_type) && device.driver != "vfio-pci") {
      add(report,
          {"iommu.translated_mode",
           Severity::kWarning,
           device.bdf,
           "the IOMMU translates this device's DMA: every host-memory access pays an IOTLB "
           "lookup, which lowers host-to-device bandwidth for large transfers",
           {{"iommu_group", device.iommu_group ? std::to_string(*device.iommu_group) : "?"},
            {"domain_type", device.iommu_domain_type},
            {"iommu_mode", report.system.iommu.mode}},
           "Kernel parameter iommu=pt (with intel_iommu=on or amd_iommu=on as the platform needs) "
           "in GRUB_CMDLINE_LINUX, `sudo update-grub`, reboot.",
           "Host DMA from passthrough devices is no longer isolated by the IOMMU; devices given "
           "to VMs through VFIO keep their own translation."});
    }
    if (device.config && !device.config->extended_capabilities_readable) {
      report.notes.push_back(fmt::format(
          "{}: config space shows {} bytes; ATS, ACS and Resizable BAR need the full 4096 (run "
          "as root)",
          device.bdf, device.config->length));
    } else if (!device.config && !device.path.empty()) {
      report.notes.push_back(fmt::format("{}: {}", device.bdf, device.path.front().config_error));
    }
    if (device.is_nvidia() && (device.driver.empty() || device.driver == "nouveau") &&
        !report.recorded) {
      report.notes.push_back(fmt::format("{}: NVIDIA device with {} bound", device.bdf,
                                         device.driver.empty() ? "no driver" : device.driver));
    }
  }
  for (const auto& gpu : report.nvml.gpus) {
    judge_nvidia(report, gpu);
    judge_replay_snapshot(report, gpu);
    judge_memory(report, gpu);
  }
  judge_processes(report);
  judge_display(report);
  if (report.vulkan.available && !report.vulkan.info.get_physical_device_properties2) {
    add(report,
        {"vulkan.missing_extension",
         Severity::kWarning,
         "system",
         "the Vulkan instance lacks VK_KHR_get_physical_device_properties2, which compute "
         "back ends use to query device features",
         {{"loader", report.vulkan.info.loader_library},
          {"instance_api_version", report.vulkan.info.instance_api_version}},
         "Update the Vulkan loader and the GPU's Vulkan driver (ICD), e.g. `sudo apt install "
         "libvulkan1 mesa-vulkan-drivers` or the NVIDIA driver's Vulkan package.",
         "None beyond a package update."});
  }
  if (!report.recorded && !report.nvml.available) {
    report.notes.push_back(fmt::format("No NVIDIA driver present ({})", report.nvml.status));
  }
  if (report.vulkan.probed && !report.vulkan.available) {
    report.notes.push_back(fmt::format("Vulkan not available: {}", report.vulkan.status));
  }
  std::stable_sort(report.findings.begin(), report.findings.end(),
                   [](const Finding& a, const Finding& b) {
                     if (a.severity != b.severity) return a.severity > b.severity;
                     if (a.id != b.id) return a.id < b.id;
                     return a.device < b.device;
                   });
}

int exit_code(const Report& report) {
  int code = 0;
  for (const auto& finding : report.findings) {
    if (finding.severity == Severity::kError) code = 2;
    if (finding.severity == Severity::kWarning) code = std::max(code, 1);
  }
  return code;
}

}  // namespace gpuopt::doctor
