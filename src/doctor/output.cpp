// doctor's renderers: JSON (docs/schemas/doctor.schema.json), text for people, Prometheus text.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string_view>
#include <type_traits>

#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {

namespace {

using nlohmann::json;

// Machine-supplied text (process names, cgroup paths, sysfs strings) made safe for a terminal:
// control characters, C1 controls and bytes that are not UTF-8 become visible escapes (\n, \x1b,
// \u009b, \xff), so a process name cannot move the cursor, recolour or forge output lines.
std::string terminal_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      if (lead == '\n') {
        out += "\\n";
      } else if (lead == '\t') {
        out += "\\t";
      } else if (lead < 0x20 || lead == 0x7f) {
        out += fmt::format("\\x{:02x}", lead);
      } else {
        out += static_cast<char>(lead);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence: no overlong forms, no surrogates, nothing past U+10FFFF.
    const std::size_t length = lead >= 0xc2 && lead <= 0xdf   ? 2
                               : lead >= 0xe0 && lead <= 0xef ? 3
                               : lead >= 0xf0 && lead <= 0xf4 ? 4
                                                              : 0;
    std::uint32_t code_point = lead & (0xff >> (length + 1));
    bool valid = length != 0 && i + length <= text.size();
    for (std::size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xc0) == 0x80;
      code_point = (code_point << 6) | (next & 0x3f);
    }
    if (valid) {
      const std::uint32_t smallest = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
      valid = code_point >= smallest && code_point <= 0x10ffff &&
              !(code_point >= 0xd800 && code_point <= 0xdfff);
    }
    if (!valid) {
      out += fmt::format("\\x{:02x}", lead);
      ++i;
    } else if (code_point <= 0x9f) {
      out += fmt::format("\\u{:04x}", code_point);  // C1 control: some terminals obey it
      i += length;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

// A copy of the report with every string that came from the machine passed through terminal_text.
Report terminal_safe(Report report) {
  auto clean = [](std::string& text) { text = terminal_text(text); };
  auto clean_optional = [&](std::optional<std::string>& text) {
    if (text) clean(*text);
  };
  auto clean_map = [&](auto& map) {
    std::remove_reference_t<decltype(map)> cleaned;
    for (auto& [key, value] : map) {
      auto copy = value;
      if constexpr (std::is_same_v<decltype(copy), std::string>) clean(copy);
      cleaned.emplace(terminal_text(key), std::move(copy));
    }
    map = std::move(cleaned);
  };
  clean(report.root);
  clean_optional(report.system.kernel_release);
  clean_optional(report.system.aspm_policy);
  clean(report.system.iommu.mode);
  clean_map(report.system.relevant_parameters);
  clean_map(report.pci.other_classes);
  for (auto& device : report.pci.devices) {
    for (auto* text : {&device.vendor_name, &device.device_name, &device.class_name, &device.driver,
                       &device.local_cpulist, &device.iommu_domain_type, &device.runtime_status}) {
      clean(*text);
    }
    for (auto& problem : device.problems) clean(problem);
  }
  clean_optional(report.nvml.driver_version);
  for (auto& gpu : report.nvml.gpus) {
    clean(gpu.name);
    clean(gpu.uuid);
  }
  clean(report.vulkan.info.loader_library);
  clean(report.vulkan.info.instance_api_version);
  for (auto& device : report.vulkan.info.devices) {
    for (auto* text : {&device.name, &device.type, &device.api_version}) clean(*text);
  }
  for (auto& finding : report.findings) {
    for (auto* text :
         {&finding.id, &finding.device, &finding.summary, &finding.fix, &finding.risk}) {
      clean(*text);
    }
    for (auto& [key, value] : finding.evidence) {
      clean(key);
      clean(value);
    }
  }
  for (auto& note : report.notes) clean(note);
  return report;
}

template <typename T>
json opt(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json link_json(const platform::LinkState& link) {
  return {{"current_speed_gts", opt(link.current_speed_gts)},
          {"max_speed_gts", opt(link.max_speed_gts)},
          {"current_width", opt(link.current_width)},
          {"max_width", opt(link.max_width)}};
}

json config_json(const std::optional<platform::PciConfig>& config) {
  if (!config) return nullptr;
  json bars = json::array();
  for (const auto& bar : config->resizable_bars) {
    bars.push_back({{"bar", bar.bar_index},
                    {"current_bytes", bar.current_bytes},
                    {"supported_bytes", bar.supported_bytes}});
  }
  return {
      {"bytes_readable", config->length},
      {"needs_root", !config->extended_capabilities_readable},
      {"ats_present", config->extended_capabilities_readable ? json(config->ats_present) : json()},
      {"ats_enabled", opt(config->ats_enabled)},
      {"acs_control", opt(config->acs_control)},
      {"acs_p2p_request_redirect",
       config->acs_control ? json(config->acs_p2p_request_redirect()) : json()},
      {"aer_present", config->extended_capabilities_readable ? json(config->aer_present) : json()},
      {"aspm_control",
       config->aspm_control ? json(platform::aspm_control_name(*config->aspm_control)) : json()},
      {"resizable_bars", bars},
      {"problems", config->problems}};
}

std::string gen(std::optional<double> speed) {
  if (!speed) return "?";
  auto generation = platform::pcie_generation(*speed);
  return generation ? fmt::format("Gen{}", *generation) : fmt::format("{:g}GT/s", *speed);
}

std::string gib(std::uint64_t bytes) {
  return fmt::format("{:.1f} GiB", bytes / double(1ull << 30));
}

std::string width(std::optional<int> value) { return value ? fmt::format("x{}", *value) : "x?"; }

std::string bytes_text(std::uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.0f} GiB", bytes / double(1ull << 30));
  return fmt::format("{:.0f} MiB", bytes / double(1ull << 20));
}

std::string prom_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

json to_json(const Report& report) {
  json devices = json::array();
  json links = json::array();
  for (const auto& device : report.pci.devices) {
    json path = json::array();
    for (const auto& hop : device.path) {
      path.push_back(
          {{"bdf", hop.link.bdf},
           {"class", hop.class_code ? json(fmt::format("0x{:06x}", *hop.class_code)) : json()},
           {"link", link_json(hop.link.link)},
           {"config", config_json(hop.config)}});
    }
    links.push_back(
        {{"device", device.bdf}, {"effective", link_json(device.effective_link)}, {"path", path}});
    json aspm = json::object();
    for (const auto& [name, on] : device.aspm.states) aspm[name] = on;
    devices.push_back(
        {{"bdf", device.bdf},
         {"class", fmt::format("0x{:06x}", device.class_code)},
         {"class_name", device.class_name},
         {"vendor_id", fmt::format("0x{:04x}", device.vendor_id)},
         {"device_id", fmt::format("0x{:04x}", device.device_id)},
         {"vendor_name", device.vendor_name},
         {"device_name", device.device_name},
         {"driver", device.driver.empty() ? json() : json(device.driver)},
         {"numa_node", opt(device.numa_node)},
         {"local_cpulist", device.local_cpulist},
         {"boot_vga", opt(device.boot_vga)},
         {"runtime_status", device.runtime_status.empty() ? json() : json(device.runtime_status)},
         {"iommu_group", opt(device.iommu_group)},
         {"iommu_domain_type",
          device.iommu_domain_type.empty() ? json() : json(device.iommu_domain_type)},
         {"aer",
          {{"correctable", opt(device.aer.correctable)},
           {"fatal", opt(device.aer.fatal)},
           {"nonfatal", opt(device.aer.nonfatal)}}},
         {"aspm_link_states", aspm},
         {"capabilities", config_json(device.config)},
         {"problems", device.problems}});
  }
  json gpus = json::array();
  for (const auto& gpu : report.nvml.gpus) {
    json processes = json::array();
    for (const auto& process : gpu.processes) {
      processes.push_back(
          {{"pid", process.pid}, {"used_memory_bytes", opt(process.used_memory_bytes)}});
    }
    json ecc = nullptr;
    if (gpu.ecc) {
      ecc = {{"enabled", gpu.ecc->enabled},
             {"volatile_corrected", opt(gpu.ecc->volatile_corrected)},
             {"volatile_uncorrected", opt(gpu.ecc->volatile_uncorrected)},
             {"aggregate_corrected", opt(gpu.ecc->aggregate_corrected)},
             {"aggregate_uncorrected", opt(gpu.ecc->aggregate_uncorrected)}};
    }
    json memory = nullptr;
    if (gpu.memory) {
      memory = {{"total_bytes", gpu.memory->total_bytes},
                {"free_bytes", gpu.memory->free_bytes},
                {"used_bytes", gpu.memory->used_bytes},
                {"reserved_bytes", opt(gpu.memory->reserved_bytes)}};
    }
    json process_utilization = nullptr;
    if (gpu.process_utilization) {
      json samples = json::array();
      for (const auto& sample : *gpu.process_utilization) {
        samples.push_back({{"pid", sample.pid},
                           {"sm_percent", sample.sm_percent},
                           {"memory_percent", sample.memory_percent}});
      }
      process_utilization = {{"window_s", gpu.process_window_s}, {"samples", samples}};
    }
    gpus.push_back(
        {{"index", gpu.index},
         {"bdf", gpu.bdf},
         {"name", gpu.name},
         {"uuid", gpu.uuid.empty() ? json() : json(gpu.uuid)},
         {"memory", memory},
         {"process_utilization", process_utilization},
         {"pcie",
          {{"current_generation", opt(gpu.current_generation)},
           {"current_width", opt(gpu.current_width)},
           {"max_generation", opt(gpu.max_generation)},
           {"max_width", opt(gpu.max_width)},
           {"gpu_max_generation", opt(gpu.gpu_max_generation)},
           {"tx_kbps", opt(gpu.tx_kbps)},
           {"rx_kbps", opt(gpu.rx_kbps)},
           {"replay_counter", opt(gpu.replay_counter)}}},
         {"bar1_total_bytes", gpu.bar1 ? json(gpu.bar1->total_bytes) : json()},
         {"bar1_used_bytes", gpu.bar1 ? json(gpu.bar1->used_bytes) : json()},
         {"persistence_mode", opt(gpu.persistence_mode)},
         {"performance_state", opt(gpu.performance_state)},
         {"clock_event_reasons", gpu.clock_event_reasons
                                     ? json(platform::clock_event_names(*gpu.clock_event_reasons))
                                     : json()},
         {"temperature_c", opt(gpu.temperature_c)},
         {"power_w", opt(gpu.power_w)},
         {"power_limit_w", opt(gpu.power_limit_w)},
         {"utilization_gpu_percent", gpu.utilization ? json(gpu.utilization->gpu_percent) : json()},
         {"ecc", ecc},
         {"processes", processes},
         {"problems", gpu.problems}});
  }
  json findings = json::array();
  for (const auto& finding : report.findings) {
    json evidence = json::object();
    for (const auto& [key, value] : finding.evidence) evidence[key] = value;
    findings.push_back({{"id", finding.id},
                        {"severity", severity_name(finding.severity)},
                        {"device", finding.device},
                        {"summary", finding.summary},
                        {"evidence", evidence},
                        {"fix", finding.fix},
                        {"risk", finding.risk}});
  }
  json processes = json::array();
  for (const auto& process : report.processes.processes) {
    processes.push_back(
        {{"pid", process.pid},
         {"name", process.comm},
         {"state", std::string(1, process.state)},
         {"ppid", process.ppid},
         {"parent_name", process.parent_exists ? json(process.parent_comm) : json()},
         {"cgroup", process.cgroup},
         {"gpu_files", process.gpu_files}});
  }
  json load = json::array();
  for (const auto& sample : report.load) {
    load.push_back({{"bdf", sample.bdf},
                    {"generation", opt(sample.generation)},
                    {"width", opt(sample.width)},
                    {"performance_state", opt(sample.performance_state)},
                    {"status", sample.status.empty() ? json() : json(sample.status)}});
  }
  json vulkan_devices = json::array();
  for (const auto& device : report.vulkan.info.devices) {
    vulkan_devices.push_back({{"name", device.name},
                              {"type", device.type},
                              {"api_version", device.api_version},
                              {"vendor_id", fmt::format("0x{:04x}", device.vendor_id)}});
  }
  std::optional<std::string> display_gpu;
  for (const auto& device : report.pci.devices) {
    if (device.boot_vga == true && !display_gpu) display_gpu = device.bdf;
  }
  json parameters = json::object();
  for (const auto& [name, value] : report.system.relevant_parameters) parameters[name] = value;
  json domain_types = json::object();
  for (const auto& [type, count] : report.system.iommu.domain_types) domain_types[type] = count;
  return {{"schema_version", report.schema_version},
          {"tool", "gpuopt doctor"},
          {"root", report.root},
          {"recorded", report.recorded},
          {"elapsed_ms", report.elapsed_ms},
          {"platform",
           {{"kernel_release", opt(report.system.kernel_release)},
            {"aspm_policy", opt(report.system.aspm_policy)},
            {"iommu",
             {{"mode", report.system.iommu.mode},
              {"group_count", report.system.iommu.group_count},
              {"domain_types", domain_types}}},
            {"kernel_parameters", parameters},
            {"nvidia_kernel_driver", opt(report.system.nvidia_kernel_driver)},
            {"pci_devices_scanned", report.pci.scanned},
            {"display_gpu", display_gpu ? json(*display_gpu) : json()},
            {"problems", report.system.problems}}},
          {"nvidia",
           {{"available", report.nvml.available},
            {"status", report.nvml.status.empty() ? json() : json(report.nvml.status)},
            {"recorded", report.nvml.recorded},
            {"driver_version", opt(report.nvml.driver_version)},
            {"cuda_driver_version", opt(report.nvml.cuda_driver_version)},
            {"gpus", gpus}}},
          {"devices", devices},
          {"links", links},
          {"gpu_processes", processes},
          {"vulkan",
           {{"probed", report.vulkan.probed},
            {"available", report.vulkan.available},
            {"status", report.vulkan.status.empty() ? json() : json(report.vulkan.status)},
            {"instance_api_version",
             report.vulkan.available ? json(report.vulkan.info.instance_api_version) : json()},
            {"get_physical_device_properties2",
             report.vulkan.available ? json(report.vulkan.info.get_physical_device_properties2)
                                     : json()},
            {"devices", vulkan_devices}}},
          {"load", load},
          {"findings", findings},
          {"notes", report.notes},
          {"exit_code", exit_code(report)}};
}

std::string render_text(const Report& raw_report, bool color) {
  const Report report = terminal_safe(raw_report);
  auto paint = [&](const char* code, const std::string& text) {
    return color ? fmt::format("\033[{}m{}\033[0m", code, text) : text;
  };
  std::string out;
  out += paint("1", "gpuopt doctor") +
         (report.recorded ? fmt::format(" (recorded machine: {})", report.root) : "") + "\n";
  out += fmt::format("Platform: kernel {}, ASPM policy {}, IOMMU {} ({} groups)\n",
                     report.system.kernel_release.value_or("?"),
                     report.system.aspm_policy.value_or("?"), report.system.iommu.mode,
                     report.system.iommu.group_count);
  if (!report.system.relevant_parameters.empty()) {
    std::string parameters;
    for (const auto& [name, value] : report.system.relevant_parameters) {
      parameters += fmt::format(" {}{}{}", name, value.empty() ? "" : "=", value);
    }
    out += "Kernel parameters:" + parameters + "\n";
  }
  if (report.nvml.available) {
    out += fmt::format("NVIDIA driver {} (CUDA {}), {} GPU(s) via NVML\n",
                       report.nvml.driver_version.value_or("?"),
                       report.nvml.cuda_driver_version
                           ? fmt::format("{}.{}", *report.nvml.cuda_driver_version / 1000,
                                         (*report.nvml.cuda_driver_version % 1000) / 10)
                           : "?",
                       report.nvml.gpus.size());
  }
  std::string others;
  for (const auto& [name, count] : report.pci.other_classes) {
    others += fmt::format("{}{} {}", others.empty() ? "" : ", ", count, name);
  }
  out += fmt::format("PCI: {} devices scanned, {} described{}\n", report.pci.scanned,
                     report.pci.devices.size(), others.empty() ? "" : " (others: " + others + ")");
  for (const auto& device : report.pci.devices) {
    out += "\n" +
           paint("1",
                 fmt::format("{}  {} {}", device.bdf,
                             device.vendor_name.empty() ? fmt::format("[{:04x}]", device.vendor_id)
                                                        : device.vendor_name,
                             device.device_name.empty() ? fmt::format("[{:04x}]", device.device_id)
                                                        : device.device_name)) +
           "\n";
    out += fmt::format("  class {} ({:06x}), driver {}, NUMA node {}, local CPUs {}\n",
                       device.class_name.empty() ? "?" : device.class_name, device.class_code,
                       device.driver.empty() ? "none" : device.driver,
                       device.numa_node ? std::to_string(*device.numa_node) : "?",
                       device.local_cpulist.empty() ? "?" : device.local_cpulist);
    if (device.boot_vga == true) out += "  drives the display (boot_vga)\n";
    if (!device.runtime_status.empty() && device.runtime_status != "active") {
      out += fmt::format("  runtime power: {}\n", device.runtime_status);
    }
    const auto& link = device.effective_link;
    if (link.max_speed_gts || link.current_speed_gts) {
      out += fmt::format("  PCIe link: {} {} now, {} {} max along {} hop(s)",
                         gen(link.current_speed_gts), width(link.current_width),
                         gen(link.max_speed_gts), width(link.max_width), device.path.size());
      if (auto generation =
              link.max_speed_gts ? platform::pcie_generation(*link.max_speed_gts) : std::nullopt;
          generation && link.max_width) {
        if (auto rate = platform::pcie_bandwidth_gbps(*generation, *link.max_width)) {
          out += fmt::format(" ({:.1f} GB/s per direction at max)", *rate);
        }
      }
      out += "\n";
    }
    if (device.config) {
      const auto& config = *device.config;
      if (config.extended_capabilities_readable) {
        out += fmt::format("  ATS {}, AER {}, Resizable BAR {}\n",
                           config.ats_present
                               ? (config.ats_enabled.value_or(false) ? "enabled" : "present, off")
                               : "absent",
                           config.aer_present ? "present" : "absent",
                           config.resizable_bars.empty()
                               ? std::string("absent")
                               : fmt::format("BAR{} {}", config.resizable_bars[0].bar_index,
                                             bytes_text(config.resizable_bars[0].current_bytes)));
      } else {
        out += fmt::format("  capabilities: {} config bytes readable, needs root\n", config.length);
      }
    }
    if (device.aer.correctable || device.aer.fatal || device.aer.nonfatal) {
      out += fmt::format("  AER: correctable {}, nonfatal {}, fatal {}\n",
                         device.aer.correctable.value_or(0), device.aer.nonfatal.value_or(0),
                         device.aer.fatal.value_or(0));
    }
    if (device.iommu_group) {
      out +=
          fmt::format("  IOMMU group {} ({})\n", *device.iommu_group,
                      device.iommu_domain_type.empty() ? "type unknown" : device.iommu_domain_type);
    }
    for (const auto& gpu : report.nvml.gpus) {
      if (gpu.bdf != device.bdf) continue;
      out += fmt::format(
          "  NVML: {}, link Gen{} x{} (max Gen{} x{}), P{}, persistence {}, BAR1 {}, "
          "replays {}\n",
          gpu.name, gpu.current_generation.value_or(0), gpu.current_width.value_or(0),
          gpu.max_generation.value_or(0), gpu.max_width.value_or(0),
          gpu.performance_state.value_or(-1),
          gpu.persistence_mode ? (*gpu.persistence_mode ? "on" : "off") : "?",
          gpu.bar1 ? bytes_text(gpu.bar1->total_bytes) : "?",
          gpu.replay_counter ? std::to_string(*gpu.replay_counter) : "?");
      if (!gpu.uuid.empty()) out += "  UUID: " + gpu.uuid + "\n";
      if (gpu.memory) {
        const auto& memory = *gpu.memory;
        out += fmt::format(
            "  memory: {} used of {} ({:.0f} %), {} free{}\n", gib(memory.used_bytes),
            gib(memory.total_bytes),
            memory.total_bytes ? 100.0 * memory.used_bytes / memory.total_bytes : 0.0,
            gib(memory.free_bytes),
            memory.reserved_bytes
                ? fmt::format(", {} reserved by the driver", gib(*memory.reserved_bytes))
                : "");
      }
      for (const auto& held : gpu.processes) {
        std::string name = "?";
        for (const auto& process : report.processes.processes) {
          if (process.pid == static_cast<int>(held.pid)) name = process.comm;
        }
        std::string activity = "activity unknown";
        if (gpu.process_utilization) {
          unsigned sm = 0;
          bool sampled = false;
          for (const auto& sample : *gpu.process_utilization) {
            if (sample.pid != held.pid) continue;
            sampled = true;
            sm = std::max(sm, sample.sm_percent);
          }
          activity = sampled ? fmt::format("SM up to {} %", sm)
                             : fmt::format("idle {:g} s", gpu.process_window_s);
        }
        out +=
            fmt::format("    pid {} {}: {}, {}\n", held.pid, name,
                        held.used_memory_bytes ? gib(*held.used_memory_bytes) : "? GiB", activity);
      }
    }
    for (const auto& problem : device.problems) out += "  problem: " + problem + "\n";
  }
  if (report.vulkan.available) {
    out += fmt::format("\nVulkan {} ({}), {} physical device(s)\n",
                       report.vulkan.info.instance_api_version, report.vulkan.info.loader_library,
                       report.vulkan.info.devices.size());
    for (const auto& device : report.vulkan.info.devices) {
      out += fmt::format("  {} ({}, API {})\n", device.name, device.type, device.api_version);
    }
  }
  out += "\n" + paint("1", fmt::format("Findings: {}", report.findings.size())) + "\n";
  for (const auto& finding : report.findings) {
    const char* code = finding.severity == Severity::kError     ? "31"
                       : finding.severity == Severity::kWarning ? "33"
                                                                : "36";
    out += fmt::format("{} {} [{}]: {}\n", paint(code, severity_name(finding.severity)), finding.id,
                       finding.device, finding.summary);
    for (const auto& [key, value] : finding.evidence)
      out += fmt::format("    {} = {}\n", key, value);
    out += "    fix: " + finding.fix + "\n";
    out += "    risk: " + finding.risk + "\n";
  }
  for (const auto& note : report.notes) out += "note: " + note + "\n";
  out += fmt::format("({:.0f} ms)\n", report.elapsed_ms);
  return out;
}

namespace {

// DCGM's spelling of a PCI address: 8-digit domain, upper-case hex ("00000000:17:00.0"), so that
// these series join dcgm-exporter's on pci_bus_id.
std::string dcgm_bus_id(const std::string& bdf) {
  std::string domain = "0000", rest = bdf;
  if (auto colon = bdf.find(':');
      colon != std::string::npos && bdf.find(':', colon + 1) != std::string::npos) {
    domain = bdf.substr(0, colon);
    rest = bdf.substr(colon + 1);
  }
  std::string out =
      std::string(domain.size() < 8 ? 8 - domain.size() : 0, '0') + domain + ":" + rest;
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// One metric family: its HELP and TYPE lines, then all of its samples (the exposition format's
// rule; a parser types samples that follow another family's TYPE line as that family's).
struct Family {
  const char* name;
  const char* help;
  const char* type;
  std::vector<std::string> samples;  // "{labels} value"
};

}  // namespace

std::string dump_json(const nlohmann::json& document) {
  return document.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string render_prometheus(const Report& report) {
  char host[256] = {0};
  const std::string hostname = gethostname(host, sizeof(host) - 1) == 0 ? host : "";
  // dcgm-exporter's labels: gpu (the NVML index), UUID, pci_bus_id, device, modelName, Hostname.
  // A device NVML did not list keeps its order among the NVIDIA devices as its index.
  auto labels = [&](const std::string& bdf, const std::string& model) {
    std::optional<unsigned> index;
    std::string uuid;
    for (const auto& gpu : report.nvml.gpus) {
      if (gpu.bdf == bdf) {
        index = gpu.index;
        uuid = gpu.uuid;
      }
    }
    if (!index) {
      unsigned order = 0;
      for (const auto& device : report.pci.devices) {
        if (!device.is_nvidia() || !(device.is_display() || device.is_accelerator())) continue;
        if (device.bdf == bdf) index = order;
        ++order;
      }
    }
    return fmt::format(
        "{{gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{}\",modelName=\"{}\","
        "Hostname=\"{}\"}}",
        index ? std::to_string(*index) : std::string(), prom_escape(uuid),
        prom_escape(dcgm_bus_id(bdf)), index ? std::to_string(*index) : std::string(),
        prom_escape(model), prom_escape(hostname));
  };
  Family link_gen{"DCGM_FI_DEV_PCIE_LINK_GEN",
                  "Current PCIe link generation (sysfs along the path, or NVML).",
                  "gauge",
                  {}};
  Family link_width{
      "DCGM_FI_DEV_PCIE_LINK_WIDTH", "Current PCIe link width in lanes.", "gauge", {}};
  Family max_gen{
      "GPUOPT_PCIE_MAX_LINK_GEN", "Maximum PCIe link generation along the path.", "gauge", {}};
  Family aer_correctable{
      "GPUOPT_PCIE_AER_CORRECTABLE_TOTAL", "AER correctable errors since boot.", "counter", {}};
  Family aer_uncorrectable{"GPUOPT_PCIE_AER_UNCORRECTABLE_TOTAL",
                           "AER fatal + non-fatal errors since boot.",
                           "counter",
                           {}};
  for (const auto& device : report.pci.devices) {
    const std::string l = labels(device.bdf, device.device_name);
    const auto& link = device.effective_link;
    if (link.current_speed_gts) {
      if (auto generation = platform::pcie_generation(*link.current_speed_gts)) {
        link_gen.samples.push_back(fmt::format("{} {}", l, *generation));
      }
    }
    if (link.current_width)
      link_width.samples.push_back(fmt::format("{} {}", l, *link.current_width));
    if (link.max_speed_gts) {
      if (auto generation = platform::pcie_generation(*link.max_speed_gts)) {
        max_gen.samples.push_back(fmt::format("{} {}", l, *generation));
      }
    }
    if (device.aer.correctable) {
      aer_correctable.samples.push_back(fmt::format("{} {}", l, *device.aer.correctable));
    }
    if (device.aer.fatal || device.aer.nonfatal) {
      aer_uncorrectable.samples.push_back(
          fmt::format("{} {}", l, device.aer.fatal.value_or(0) + device.aer.nonfatal.value_or(0)));
    }
  }
  Family replay{"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays (NVML).", "counter", {}};
  Family tx{
      "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe transmit throughput in KB/s (NVML).", "gauge", {}};
  Family rx{
      "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe receive throughput in KB/s (NVML).", "gauge", {}};
  Family bar1{"DCGM_FI_DEV_BAR1_TOTAL", "BAR1 size in MiB (NVML).", "gauge", {}};
  Family persistence{
      "DCGM_FI_DEV_PERSISTENCE_MODE", "1 when persistence mode is on (NVML).", "gauge", {}};
  Family pstate{"DCGM_FI_DEV_PSTATE", "Performance state, 0 = P0 (NVML).", "gauge", {}};
  Family throttle{
      "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Clock event reason bitmask (NVML).", "gauge", {}};
  Family temperature{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature in C (NVML).", "gauge", {}};
  Family power{"DCGM_FI_DEV_POWER_USAGE", "Power draw in W (NVML).", "gauge", {}};
  Family fb_total{"DCGM_FI_DEV_FB_TOTAL", "Device memory in MiB (NVML).", "gauge", {}};
  Family fb_used{"DCGM_FI_DEV_FB_USED", "Device memory used in MiB (NVML).", "gauge", {}};
  Family fb_free{"DCGM_FI_DEV_FB_FREE", "Device memory free in MiB (NVML).", "gauge", {}};
  for (const auto& gpu : report.nvml.gpus) {
    const std::string l = labels(gpu.bdf, gpu.name);
    auto add = [&](Family& family, auto value) {
      family.samples.push_back(fmt::format("{} {}", l, value));
    };
    if (gpu.replay_counter) add(replay, *gpu.replay_counter);
    if (gpu.tx_kbps) add(tx, *gpu.tx_kbps);
    if (gpu.rx_kbps) add(rx, *gpu.rx_kbps);
    if (gpu.bar1) add(bar1, gpu.bar1->total_bytes >> 20);
    if (gpu.persistence_mode) add(persistence, *gpu.persistence_mode ? 1 : 0);
    if (gpu.performance_state) add(pstate, *gpu.performance_state);
    if (gpu.clock_event_reasons) add(throttle, *gpu.clock_event_reasons);
    if (gpu.temperature_c) add(temperature, *gpu.temperature_c);
    if (gpu.power_w) add(power, fmt::format("{:.3f}", *gpu.power_w));
    if (gpu.memory) {
      add(fb_total, gpu.memory->total_bytes >> 20);
      add(fb_used, gpu.memory->used_bytes >> 20);
      add(fb_free, gpu.memory->free_bytes >> 20);
    }
  }
  Family findings{
      "GPUOPT_DOCTOR_FINDINGS", "Findings of gpuopt doctor by id and severity.", "gauge", {}};
  std::map<std::pair<std::string, std::string>, int> counts;
  for (const auto& finding : report.findings) {
    ++counts[{finding.id, severity_name(finding.severity)}];
  }
  for (const auto& [key, count] : counts) {
    findings.samples.push_back(fmt::format("{{id=\"{}\",severity=\"{}\",Hostname=\"{}\"}} {}",
                                           prom_escape(key.first), key.second,
                                           prom_escape(hostname), count));
  }
  std::string out;
  for (const Family* family :
       {&link_gen, &link_width, &max_gen, &aer_correctable, &aer_uncorrectable, &replay, &tx, &rx,
        &bar1, &persistence, &pstate, &throttle, &temperature, &power, &fb_total, &fb_used,
        &fb_free, &findings}) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", family->name, family->help, family->name,
                       family->type);
    for (const auto& sample : family->samples) out += family->name + sample + "\n";
  }
  return out;
}

}  // namespace gpuopt::doctor
