// gpuopt doctor: collect the platform (PCI, links, IOMMU, ASPM, NVML, processes, Vulkan) once,
// judge it into findings with stable ids, and render text, JSON or Prometheus from the same
// structs.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpuopt/platform/nvml.hpp"
#include "gpuopt/platform/pci_devices.hpp"
#include "gpuopt/platform/processes.hpp"
#include "gpuopt/platform/system_info.hpp"
#include "gpuopt/platform/vulkan.hpp"

namespace gpuopt::doctor {

inline constexpr int kSchemaVersion = 1;

enum class Severity { kInfo = 0, kWarning = 1, kError = 2 };
const char* severity_name(Severity severity);

struct Finding {
  std::string id;  // stable: "pcie.link_downgraded"
  Severity severity = Severity::kInfo;
  std::string device;  // BDF, "system", or "pid N"
  std::string summary;
  std::vector<std::pair<std::string, std::string>> evidence;  // values read, in order
  std::string fix;   // what to do, with the exact command or kernel parameter
  std::string risk;  // what the fix costs
};

// What NVML says about one GPU; each metric is absent when NVML could not give it.
struct NvidiaGpu {
  unsigned index = 0;
  std::string bdf;
  std::string name;
  std::string uuid;  // "GPU-..." (empty when NVML refused it)
  std::optional<platform::NvmlMemory> memory;
  std::optional<unsigned> current_generation, current_width, max_generation, max_width;
  std::optional<unsigned> gpu_max_generation;
  std::optional<unsigned> tx_kbps, rx_kbps;
  std::optional<unsigned> replay_counter;
  std::optional<platform::NvmlBar1> bar1;
  std::optional<bool> persistence_mode;
  std::optional<int> performance_state;
  std::optional<std::uint64_t> clock_event_reasons;
  std::optional<unsigned> temperature_c;
  std::optional<double> power_w, power_limit_w;
  std::optional<platform::NvmlEcc> ecc;
  std::optional<platform::NvmlUtilization> utilization;
  std::vector<platform::NvmlProcess> processes;
  // Per-process samples of the last `process_window_s` seconds; absent when NVML refused them (a
  // process without a sample ran nothing in the window).
  std::optional<std::vector<platform::NvmlProcessUtilization>> process_utilization;
  double process_window_s = 0;
  std::vector<std::string> problems;  // metrics NVML refused, with its reason
};

struct NvmlView {
  bool available = false;
  bool recorded = false;  // read from <root>/nvml.json, the "nvidia" object of doctor --json
  std::string status;     // why not, when unavailable
  std::optional<std::string> driver_version;
  std::optional<int> cuda_driver_version;
  std::vector<NvidiaGpu> gpus;
};

struct VulkanView {
  bool probed = false;  // false for recorded machines
  bool available = false;
  std::string status;
  platform::VulkanInfo info;
};

// The link of an NVIDIA GPU sampled while `--load` kept it busy.
struct LoadSample {
  std::string bdf;
  std::optional<unsigned> generation, width;
  std::optional<int> performance_state;
  std::string status;  // empty when the load ran
};

struct Options {
  std::string root = "/";  // anything else: a recorded machine (no NVML, no Vulkan)
  bool all_devices = false;
  bool load = false;
  bool use_nvml = true;
  bool use_vulkan = true;
  bool recorded() const { return !root.empty() && root != "/"; }
};

struct Report {
  int schema_version = kSchemaVersion;
  std::string root;
  bool recorded = false;
  platform::SystemInfo system;
  platform::PciScan pci;
  NvmlView nvml;
  platform::GpuProcessScan processes;
  VulkanView vulkan;
  std::vector<LoadSample> load;
  std::optional<double> uptime_s;
  std::vector<Finding> findings;
  std::vector<std::string> notes;  // what could not be judged, and why
  double elapsed_ms = 0;
};

// Reads everything. NOT_FOUND/INVALID_ARGUMENT only when the root itself is unusable; every other
// failure becomes a note or a problem inside the report.
StatusOr<Report> collect(const Options& options);

// Fills report.findings (sorted: errors first) from what collect() read.
void judge(Report& report);

// 0 when nothing is above info, 1 warnings, 2 errors.
int exit_code(const Report& report);

nlohmann::json to_json(const Report& report);
// to_json's document as text that always parses: strings read from the machine (process names,
// cgroup paths, fd targets, vendor strings) are raw bytes, and any byte that is not UTF-8 becomes
// U+FFFD instead of failing the whole dump.
std::string dump_json(const nlohmann::json& document);
// For people: strings read from the machine are escaped (\n, \x1b, \xff), never sent raw.
std::string render_text(const Report& report, bool color);
std::string render_prometheus(const Report& report);

// ---- --watch ----
struct WatchSample {
  double t_s = 0;
  std::string bdf;
  std::optional<double> speed_gts;  // sysfs current link (effective along the path)
  std::optional<int> width;
  std::optional<unsigned> nvml_generation, nvml_width;
  std::optional<unsigned> replay_counter;
  std::optional<unsigned> tx_kbps, rx_kbps;
  std::optional<unsigned> gpu_index;  // NVML's
  std::optional<unsigned> sm_percent;
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<double> power_w;
  std::optional<unsigned> temperature_c;
};

// One line per sample, as `nvidia-smi dmon` prints them: a two-line header (names, then units),
// then fixed-width columns with "-" for a value that could not be read.
std::string watch_header_lines();
std::string watch_sample_line(const WatchSample& sample);

struct WatchDeviceSummary {
  std::string bdf;
  int samples = 0;
  int link_changes = 0;  // speed or width differs from the previous sample
  std::optional<double> replays_per_minute;
  std::optional<double> replay_budget_per_minute;
  std::optional<unsigned> max_tx_kbps, max_rx_kbps;
};

struct WatchResult {
  double interval_s = 0;
  double duration_s = 0;
  std::vector<WatchSample> samples;
  std::vector<WatchDeviceSummary> devices;
};

// Samples every described device every `interval_s` for `duration_s`, then adds the findings
// (pcie.link_flapping, pcie.replay_rate) that one snapshot misses to `report`.
// `on_sample`, when set, is called with each sample as it is taken (the CLI prints it at once).
StatusOr<WatchResult> watch(const Options& options, Report& report, double interval_s,
                            double duration_s,
                            const std::function<void(const WatchSample&)>& on_sample = {});
nlohmann::json watch_to_json(const WatchResult& result);
std::string render_watch_text(const WatchResult& result);

// A recorded NVML view: the "nvidia" object of `doctor --json` (docs/schemas/doctor.schema.json).
// collect() reads it from <root>/nvml.json for a recorded machine.
StatusOr<NvmlView> nvml_view_from_json(const nlohmann::json& nvidia, const std::string& origin);

// Memory held by a process that ran nothing in the sample window is judged from this size up.
inline constexpr std::uint64_t kIdleHolderBytes = std::uint64_t{1} << 30;

// GPUs whose PCIe interface has eight lanes by design (Ada AD106/AD107 laptop and workstation
// laptop parts: RTX 4050/4060/4070 Laptop, RTX 2000/3000 Ada Laptop): the chip name ("AD107M")
// when `device_id` is in the table or the pci.ids name starts with one of those chips; nullopt
// otherwise. A Gen4 x8 link on these is their full rate, not a fault.
std::optional<std::string> x8_link_by_design(std::uint16_t vendor_id, std::uint16_t device_id,
                                             std::string_view device_name);

// Pure rules, exposed for tests.
// Flapping: link changes between consecutive samples.
int count_link_changes(const std::vector<WatchSample>& samples_of_one_device);

}  // namespace gpuopt::doctor
