// Each recorded machine under tests/data/doctor must produce exactly the findings it should.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "common/test_support.hpp"
#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {
namespace {

using Expected = std::multiset<std::pair<std::string, std::string>>;  // (id, severity)

Report judged(const std::string& machine) {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/" + machine;
  auto report = collect(options);
  EXPECT_TRUE(report.ok()) << report.status().to_string();
  if (!report.ok()) return {};
  judge(*report);
  return std::move(report).value();
}

Expected findings_of(const Report& report) {
  Expected out;
  for (const auto& finding : report.findings) {
    out.emplace(finding.id, severity_name(finding.severity));
  }
  return out;
}

std::string describe(const Report& report) {
  std::string text;
  for (const auto& finding : report.findings) {
    text += finding.id + "/" + severity_name(finding.severity) + " [" + finding.device + "] " +
            finding.summary + "\n";
  }
  return text;
}

TEST(DoctorFixtures, HealthyH200HasNoFindings) {
  Report report = judged("h200-healthy");
  EXPECT_EQ(findings_of(report), Expected{}) << describe(report);
  EXPECT_EQ(exit_code(report), 0);
  ASSERT_EQ(report.pci.devices.size(), 1u);  // the root port is a bridge, not described
  const auto& gpu = report.pci.devices[0];
  EXPECT_EQ(gpu.bdf, "0000:17:00.0");
  EXPECT_EQ(gpu.vendor_id, 0x10de);
  EXPECT_EQ(gpu.device_id, 0x2335);
  EXPECT_EQ(gpu.driver, "nvidia");
  EXPECT_EQ(gpu.numa_node, 0);
  EXPECT_EQ(gpu.local_cpulist, "0-47");
  EXPECT_EQ(gpu.path.size(), 2u);
  EXPECT_DOUBLE_EQ(*gpu.effective_link.current_speed_gts, 32.0);
  EXPECT_EQ(*gpu.effective_link.current_width, 16);
  ASSERT_TRUE(gpu.config.has_value());
  EXPECT_TRUE(gpu.config->ats_present);
  ASSERT_EQ(gpu.config->resizable_bars.size(), 1u);
  EXPECT_EQ(gpu.config->resizable_bars[0].current_bytes, std::uint64_t{256} << 30);
  EXPECT_EQ(report.system.iommu.mode, "passthrough");
  EXPECT_EQ(report.system.aspm_policy, "default");
  EXPECT_EQ(report.system.relevant_parameters.at("iommu"), "pt");
}

TEST(DoctorFixtures, LaptopDgpuBelowMaxIsInfoBecausePowerStateIsUnknown) {
  Report report = judged("laptop-igpu-dgpu");
  EXPECT_EQ(findings_of(report),
            (Expected{{"pcie.link_downgraded", "info"}, {"pcie.link_width_by_design", "info"}}))
      << describe(report);
  EXPECT_EQ(exit_code(report), 0);
  ASSERT_EQ(report.pci.devices.size(), 2u);
  EXPECT_EQ(report.pci.devices[0].bdf, "0000:00:02.0");  // iGPU: no PCIe link of its own
  EXPECT_EQ(report.pci.devices[0].driver, "i915");
  EXPECT_EQ(report.findings[0].device, "0000:01:00.0");
  EXPECT_EQ(report.findings[1].device, "0000:01:00.0");
  // The iGPU drives the display; the dGPU is awake.
  EXPECT_EQ(report.pci.devices[0].boot_vga, true);
  EXPECT_EQ(report.pci.devices[1].boot_vga, false);
  EXPECT_EQ(report.pci.devices[1].runtime_status, "active");
  EXPECT_EQ(to_json(report)["platform"]["display_gpu"], "0000:00:02.0");
  EXPECT_NE(render_text(report, false).find("0000:00:02.0  Intel"), std::string::npos);
  // Recorded without root: the note says what needs root.
  bool needs_root = std::any_of(report.notes.begin(), report.notes.end(), [](const auto& note) {
    return note.find("0000:01:00.0") != std::string::npos && note.find("root") != std::string::npos;
  });
  EXPECT_TRUE(needs_root);
}

TEST(DoctorFixtures, AspmPowersaveIsOneSystemWarning) {
  Report report = judged("aspm-powersave");
  EXPECT_EQ(findings_of(report), (Expected{{"pcie.aspm_policy", "warning"}})) << describe(report);
  EXPECT_EQ(report.findings[0].device, "system");
  EXPECT_EQ(exit_code(report), 1);
}

TEST(DoctorFixtures, IommuTranslatedMode) {
  Report report = judged("iommu-translated");
  EXPECT_EQ(findings_of(report), (Expected{{"iommu.translated_mode", "warning"},
                                           {"pcie.ats_disabled", "info"},
                                           {"pcie.acs_redirect", "info"}}))
      << describe(report);
  EXPECT_EQ(report.system.iommu.mode, "translated");
  EXPECT_EQ(exit_code(report), 1);
}

TEST(DoctorFixtures, AerErrors) {
  Report report = judged("aer-errors");
  EXPECT_EQ(findings_of(report), (Expected{{"pcie.aer_errors", "warning"}})) << describe(report);
  const auto& evidence = report.findings[0].evidence;
  auto correctable = std::find_if(evidence.begin(), evidence.end(),
                                  [](const auto& item) { return item.first == "correctable"; });
  ASSERT_NE(correctable, evidence.end());
  EXPECT_EQ(correctable->second, "37");
}

TEST(DoctorFixtures, ZombieHoldingTheGpuIsNamedWithItsParent) {
  Report report = judged("zombie-holding-gpu");
  EXPECT_EQ(findings_of(report), (Expected{{"gpu.context_leak", "error"}})) << describe(report);
  EXPECT_EQ(exit_code(report), 2);
  const Finding& leak = report.findings[0];
  EXPECT_EQ(leak.device, "pid 4242");
  EXPECT_NE(leak.summary.find("python3"), std::string::npos);
  EXPECT_NE(leak.fix.find("kill -TERM 4100"), std::string::npos) << leak.fix;
  // The healthy daemon holding /dev/nvidiactl was seen but is not a leak.
  EXPECT_EQ(report.processes.processes.size(), 2u);
}

TEST(DoctorFixtures, JsonAndPrometheusCarryTheSameFindings) {
  Report report = judged("iommu-translated");
  auto json = to_json(report);
  EXPECT_EQ(json["schema_version"], kSchemaVersion);
  EXPECT_EQ(json["findings"].size(), report.findings.size());
  EXPECT_EQ(json["devices"].size(), 1u);
  EXPECT_EQ(json["links"][0]["path"].size(), 2u);
  std::string prometheus = render_prometheus(report);
  // dcgm-exporter's labels: the GPU's index, its bus id with an 8-digit domain, the host.
  EXPECT_NE(
      prometheus.find("DCGM_FI_DEV_PCIE_LINK_GEN{gpu=\"0\",UUID=\"\",pci_bus_id=\"00000000:17:"
                      "00.0\",device=\"nvidia0\","),
      std::string::npos)
      << prometheus;
  EXPECT_NE(
      prometheus.find("GPUOPT_DOCTOR_FINDINGS{id=\"iommu.translated_mode\",severity=\"warning\","),
      std::string::npos);
  // One family per metric: every sample follows its own family's HELP and TYPE, and no family
  // is announced twice.
  std::set<std::string> announced;
  std::string current;
  std::istringstream lines(prometheus);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(announced.insert(name).second) << name << " announced twice";
      current = name;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      EXPECT_EQ(line.substr(7, line.find(' ', 7) - 7), current) << line;
      continue;
    }
    EXPECT_EQ(line.substr(0, line.find('{')), current) << line;
  }
  std::string text = render_text(report, /*color=*/false);
  EXPECT_EQ(text.find("\033["), std::string::npos);
  EXPECT_NE(text.find("iommu.translated_mode"), std::string::npos);
}

TEST(DoctorFixtures, MissingRootIsAToolError) {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/no-such-machine";
  auto report = collect(options);
  EXPECT_FALSE(report.ok());
}

TEST(DoctorWatch, CountsLinkChanges) {
  std::vector<WatchSample> samples(4);
  samples[0].speed_gts = 32.0;
  samples[1].speed_gts = 2.5;
  samples[2].speed_gts = 2.5;
  samples[3].speed_gts = 32.0;
  EXPECT_EQ(count_link_changes(samples), 2);
  samples[2].width = 8;
  EXPECT_EQ(count_link_changes(samples), 3);
}

TEST(DoctorWatch, RejectsBadIntervals) {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/h200-healthy";
  Report report;
  EXPECT_FALSE(watch(options, report, 0, 1).ok());
  EXPECT_FALSE(watch(options, report, 2, 1).ok());
}

TEST(DoctorWatch, RecordedMachineSamplesWithoutFindings) {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/h200-healthy";
  auto report = collect(options);
  ASSERT_TRUE(report.ok());
  judge(*report);
  auto result = watch(options, *report, 0.05, 0.15);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_EQ(result->devices.size(), 1u);
  EXPECT_GE(result->devices[0].samples, 3);
  EXPECT_EQ(result->devices[0].link_changes, 0);
  EXPECT_TRUE(report->findings.empty());
}

}  // namespace
}  // namespace gpuopt::doctor

namespace gpuopt::doctor {
namespace {

const Finding* find_finding(const Report& report, const std::string& id) {
  for (const auto& finding : report.findings) {
    if (finding.id == id) return &finding;
  }
  return nullptr;
}

std::string evidence_of(const Finding& finding, const std::string& key) {
  for (const auto& [name, value] : finding.evidence) {
    if (name == key) return value;
  }
  return "";
}

TEST(DoctorMemory, IdleHolderAndUnlistedMemory) {
  Report report = judged("idle-memory-holder");
  EXPECT_EQ(findings_of(report),
            (Expected{{"gpu.idle_memory_holder", "warning"}, {"gpu.memory_unaccounted", "info"}}))
      << describe(report);
  EXPECT_EQ(exit_code(report), 1);
  ASSERT_TRUE(report.nvml.recorded);
  ASSERT_EQ(report.nvml.gpus.size(), 1u);
  const NvidiaGpu& gpu = report.nvml.gpus[0];
  ASSERT_TRUE(gpu.memory.has_value());
  EXPECT_EQ(gpu.memory->total_bytes, 140ull << 30);
  // The notebook kernel (60 GiB, no sample in the window) is named; the training job (samples
  // at 97 %) and the 600 MiB idle context (under the 1 GiB threshold) are not.
  const Finding* idle = find_finding(report, "gpu.idle_memory_holder");
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->device, "pid 5100");
  EXPECT_EQ(evidence_of(*idle, "used_memory_bytes"), std::to_string(60ull << 30));
  EXPECT_EQ(evidence_of(*idle, "name"), "python3");
  EXPECT_NE(idle->summary.find("43 %"), std::string::npos) << idle->summary;  // 60 / 140
  EXPECT_NE(idle->fix.find("kill -TERM 5100"), std::string::npos);
  // used 138 GiB + 600 MiB - listed (60 GiB + 70 GiB + 600 MiB) = 8 GiB held by no listed pid.
  const Finding* unlisted = find_finding(report, "gpu.memory_unaccounted");
  ASSERT_NE(unlisted, nullptr);
  EXPECT_NE(unlisted->summary.find("8.0 GiB"), std::string::npos) << unlisted->summary;
  // Text, JSON and Prometheus carry the memory; Prometheus carries the UUID label.
  std::string text = render_text(report, false);
  EXPECT_NE(text.find("memory: 138.6 GiB used of 140.0 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("pid 5100 python3: 60.0 GiB, idle 10 s"), std::string::npos) << text;
  EXPECT_NE(text.find("pid 5200 torchrun: 70.0 GiB, SM up to 97 %"), std::string::npos) << text;
  auto json = to_json(report);
  EXPECT_EQ(json["nvidia"]["gpus"][0]["memory"]["free_bytes"],
            (140ull << 30) - (138ull << 30) - (600ull << 20) - (512ull << 20));
  std::string prometheus = render_prometheus(report);
  EXPECT_NE(prometheus.find("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-00000000-1111-2222-3333-"
                            "444444444444\",pci_bus_id=\"00000000:17:00.0\""),
            std::string::npos)
      << prometheus;
}

TEST(DoctorMemory, ZombieLeakCarriesItsMemory) {
  Report report = judged("zombie-holding-gpu");
  // The zombie's memory is evidence of the leak, not a second finding.
  ASSERT_EQ(report.findings.size(), 1u) << describe(report);
  EXPECT_EQ(evidence_of(report.findings[0], "gpu_memory_bytes"), std::to_string(20ull << 30));
}

TEST(DoctorMemory, RecordedViewRoundTripsThroughJson) {
  Report report = judged("idle-memory-holder");
  auto view = nvml_view_from_json(to_json(report)["nvidia"], "round trip");
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  ASSERT_EQ(view->gpus.size(), 1u);
  EXPECT_EQ(view->gpus[0].uuid, report.nvml.gpus[0].uuid);
  EXPECT_EQ(view->gpus[0].memory->used_bytes, report.nvml.gpus[0].memory->used_bytes);
  EXPECT_EQ(view->gpus[0].processes.size(), 3u);
  EXPECT_EQ(view->gpus[0].process_utilization->size(), 2u);
  // Wrong types are named, not taken as zero.
  auto bad = nvml_view_from_json(
      nlohmann::json::parse(R"({"gpus": [{"memory": {"total_bytes": "lots"}}]})"), "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("total_bytes"), std::string::npos);
  EXPECT_FALSE(nvml_view_from_json(nlohmann::json::array(), "x.json").ok());
}

}  // namespace
}  // namespace gpuopt::doctor

namespace gpuopt::doctor {
namespace {

TEST(DoctorLaptop, X8IsTheDesignOfAnAdaLaptopGpu) {
  Report report = judged("laptop-igpu-dgpu");
  const Finding* design = nullptr;
  for (const auto& finding : report.findings) {
    if (finding.id == "pcie.link_width_by_design") design = &finding;
  }
  ASSERT_NE(design, nullptr) << describe(report);
  EXPECT_NE(design->summary.find("AD107M"), std::string::npos) << design->summary;
  EXPECT_NE(design->summary.find("Gen4 x8"), std::string::npos) << design->summary;
  // By device id, by the chip at the start of the pci.ids name, and nothing else.
  EXPECT_EQ(x8_link_by_design(0x10de, 0x28e0, ""), "AD107M");
  EXPECT_EQ(x8_link_by_design(0x10de, 0x2860, ""), "AD106M");
  EXPECT_EQ(x8_link_by_design(0x10de, 0x0001, "AD107M [GeForce RTX 4060 Max-Q / Mobile]"),
            "AD107M");
  EXPECT_FALSE(x8_link_by_design(0x10de, 0x2335, "GH100 [H200 SXM 141GB]").has_value());
  EXPECT_FALSE(x8_link_by_design(0x10de, 0x0001, "AD107MX").has_value());
  EXPECT_FALSE(x8_link_by_design(0x8086, 0x28e0, "").has_value());  // another vendor's id
}

TEST(DoctorLaptop, TheSameChipAtX4IsStillAFault) {
  Report report = judged("laptop-dgpu-x4");
  EXPECT_EQ(findings_of(report), (Expected{{"pcie.link_width_reduced", "warning"}}))
      << describe(report);
  EXPECT_EQ(exit_code(report), 1);
}

TEST(DoctorLaptop, SuspendedDgpuExplainsASlowFirstCall) {
  Report report = judged("laptop-dgpu-suspended");
  // The Gen1 link of a sleeping GPU is not judged; the suspension is named.
  EXPECT_EQ(findings_of(report),
            (Expected{{"gpu.runtime_suspended", "info"}, {"pcie.link_width_by_design", "info"}}))
      << describe(report);
  const Finding* suspended = find_finding(report, "gpu.runtime_suspended");
  ASSERT_NE(suspended, nullptr);
  EXPECT_EQ(suspended->device, "0000:01:00.0");
  EXPECT_NE(suspended->fix.find("/sys/bus/pci/devices/0000:01:00.0/power/control"),
            std::string::npos);
  EXPECT_EQ(exit_code(report), 0);
  bool noted = std::any_of(report.notes.begin(), report.notes.end(), [](const auto& note) {
    return note.find("runtime-suspended") != std::string::npos;
  });
  EXPECT_TRUE(noted);
}

TEST(DoctorLaptop, DgpuDrivingTheDisplayIsNamed) {
  Report report = judged("laptop-dgpu-display");
  const Finding* display = find_finding(report, "gpu.drives_display");
  ASSERT_NE(display, nullptr) << describe(report);
  EXPECT_EQ(display->device, "0000:01:00.0");
  EXPECT_NE(display->fix.find("prime-select on-demand"), std::string::npos);
  EXPECT_EQ(to_json(report)["platform"]["display_gpu"], "0000:01:00.0");
  // The laptop whose iGPU drives the display has no such finding.
  EXPECT_EQ(find_finding(judged("laptop-igpu-dgpu"), "gpu.drives_display"), nullptr);
}

}  // namespace
}  // namespace gpuopt::doctor

namespace gpuopt::doctor {
namespace {

TEST(DoctorWatch, OneLinePerSampleLikeDmon) {
  WatchSample sample;
  sample.t_s = 12.34;
  sample.bdf = "0000:17:00.0";
  sample.gpu_index = 0;
  sample.speed_gts = 32.0;
  sample.width = 16;
  sample.nvml_generation = 5;
  sample.nvml_width = 16;
  sample.sm_percent = 97;
  sample.memory_used_bytes = std::uint64_t{70} << 30;
  sample.power_w = 612.4;
  sample.temperature_c = 61;
  sample.rx_kbps = 25'000'000;
  sample.tx_kbps = 1'500;
  sample.replay_counter = 3;
  const std::string line = watch_sample_line(sample);
  EXPECT_EQ(line,
            "      12.3   0 0000:17:00.0  Gen5x16  Gen5x16  97   71680    612   61   25000       1"
            "       3\n");
  // Unread values are "-", never 0.
  WatchSample bare;
  bare.bdf = "0000:01:00.0";
  const std::string bare_line = watch_sample_line(bare);
  const std::string after_bus_id = bare_line.substr(bare_line.find("0000:01:00.0") + 12);
  EXPECT_EQ(after_bus_id.find_first_of("0123456789"), std::string::npos) << bare_line;
  EXPECT_EQ(std::count(bare_line.begin(), bare_line.end(), '-'), 10) << bare_line;
  const std::string header = watch_header_lines();
  EXPECT_EQ(header.substr(0, 2), "# ");
  // Columns line up: each header line is as wide as a sample line.
  EXPECT_EQ(header.find('\n'), line.size() - 1);
}

TEST(DoctorWatch, EverySampleReachesTheCallback) {
  Options options;
  options.root = gpuopt::testing::test_data_dir() + "/doctor/laptop-igpu-dgpu";
  auto report = collect(options);
  ASSERT_TRUE(report.ok());
  int seen = 0;
  auto result = watch(options, *report, 0.05, 0.1, [&](const WatchSample&) { ++seen; });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(seen, static_cast<int>(result->samples.size()));
  EXPECT_GE(seen, 4);  // two devices, at least two samples each
}

}  // namespace
}  // namespace gpuopt::doctor
