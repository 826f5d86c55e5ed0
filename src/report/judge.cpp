// Audit verdicts and actions from each stage's JSON (see judge.hpp). Each family's figures are
// read by name; a figure that is absent leaves its check out rather than guessing.
#include "gpuopt/report/judge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace gpuopt::report {

namespace {

using bench::Check;
using bench::counted_verdict;
using bench::verdict_name;
using nlohmann::json;

std::optional<double> number(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key)) return std::nullopt;
  const json& value = object[key];
  if (value.is_number()) return value.get<double>();
  // A distribution summary (bench::to_json(Summary)) counts with its median.
  if (value.is_object() && value.contains("median") && value["median"].is_number()) {
    return value["median"].get<double>();
  }
  return std::nullopt;
}

// The array at `key`, by reference (an empty one when absent), so pointers into it stay valid.
const json& array_at(const json& object, const char* key) {
  static const json empty = json::array();
  if (!object.is_object() || !object.contains(key) || !object[key].is_array()) return empty;
  return object[key];
}

std::string text(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_string()) return "";
  return object[key].get<std::string>();
}

// Three significant figures at most: 1.23, 12.3, 123.
std::string significant(double value) {
  if (value < 10) return fmt::format("{:.2f}", value);
  if (value < 100) return fmt::format("{:.1f}", value);
  return fmt::format("{:.0f}", value);
}

// 37 µs, 12.3 ms, 341 ms, 1.91 s.
std::string duration_us(double us) {
  if (us < 1e3) return fmt::format("{:.0f} µs", us);
  if (us < 1e6) return significant(us / 1e3) + " ms";
  return significant(us / 1e6) + " s";
}

// A gain factor for people: 1.4x, 9.1x, 63x, 16000x (two significant figures).
std::string factor(double gain) {
  if (gain < 10) return fmt::format("{:.1f}x", gain);
  const double scale = std::pow(10.0, std::floor(std::log10(gain)) - 1);
  return fmt::format("{:.0f}x", std::round(gain / scale) * scale);
}

std::string percent(double fraction) {
  return fraction < 0.1 ? fmt::format("{:.1f}%", fraction * 100)
                        : fmt::format("{:.0f}%", fraction * 100);
}

std::string size_text(double bytes) { return bench::format_bytes(static_cast<std::size_t>(bytes)); }

json* find_testcase(json& data, const std::string& key) {
  if (!data.is_object() || !data.contains("testcases") || !data["testcases"].is_array()) {
    return nullptr;
  }
  for (auto& testcase : data["testcases"]) {
    if (testcase.value("key", "") == key) return &testcase;
  }
  return nullptr;
}

bool passed(const json* testcase) {
  return testcase != nullptr && testcase->value("outcome", "") == "passed";
}

void add_check(json& testcase, const Check& check) {
  if (!testcase.contains("checks") || !testcase["checks"].is_array()) {
    testcase["checks"] = json::array();
  }
  for (const auto& existing : testcase["checks"]) {
    if (existing.value("id", "") == check.id) return;  // the testcase judged it itself
  }
  testcase["checks"].push_back(bench::to_json(check));
}

Verdict parse_or(const json& object, Verdict fallback) {
  if (!object.is_object() || !object.contains("verdict") || !object["verdict"].is_string()) {
    return fallback;
  }
  return bench::parse_verdict(object["verdict"].get<std::string>()).value_or(fallback);
}

// ---- bench pcie -------------------------------------------------------------------------------

// Median GB/s of a copy testcase at `bytes` (its sizes[] rows).
std::optional<double> copy_gbps(json& data, const std::string& key, double bytes) {
  json* testcase = find_testcase(data, key);
  if (!passed(testcase)) return std::nullopt;
  const json& testcase_data = (*testcase)["data"];
  if (!testcase_data.contains("sizes") || !testcase_data["sizes"].is_array()) return std::nullopt;
  for (const auto& row : testcase_data["sizes"]) {
    if (number(row, "bytes") == bytes) return number(row, "bandwidth_gbps");
  }
  return std::nullopt;
}

void judge_pcie(json& data, const std::string& stage, std::vector<Action>& actions) {
  json* verdict = find_testcase(data, "pcie_link_verdict");
  if (!passed(verdict)) return;
  json& verdict_data = (*verdict)["data"];
  const std::optional<double> link_gbps = verdict_data.contains("link")
                                              ? number(verdict_data["link"], "theoretical_gbps")
                                              : std::nullopt;
  const std::optional<double> bytes = number(verdict_data, "compared_bytes");
  const auto& link = verdict_data.value("link", json::object());
  const std::string link_name =
      link.contains("generation") && link["generation"].is_number() && link.contains("width") &&
              link["width"].is_number()
          ? fmt::format("Gen{} x{}", link["generation"].get<int>(), link["width"].get<int>())
          : std::string("the link");
  for (const auto& direction : array_at(verdict_data, "verdicts")) {
    Check check;
    const std::string name = text(direction, "direction");
    check.id = "link_efficiency." + name;
    const std::string said = text(direction, "verdict");
    check.verdict = said == "healthy" ? Verdict::kHealthy
                    : said == "warn"  ? Verdict::kWarning
                    : said == "fail"  ? Verdict::kFailing
                                      : Verdict::kInfo;
    const std::optional<double> efficiency = number(direction, "efficiency");
    check.reference = link_gbps;
    check.reference_name = link_name + " link rate";
    check.unit = "GB/s";
    if (efficiency && link_gbps) check.measured = *efficiency * *link_gbps;
    check.summary =
        check.measured
            ? fmt::format("{}: pinned copies reach {:.1f} GB/s, {} of the {} rate ({:.1f} GB/s)",
                          name, *check.measured, percent(*efficiency), link_name, *link_gbps)
            : fmt::format("{}: no efficiency (the link's rate is unknown)", name);
    add_check(*verdict, check);
    if (check.verdict == Verdict::kWarning || check.verdict == Verdict::kFailing) {
      Action action;
      action.id = "pcie.link_slow." + name;
      action.stage = stage;
      action.verdict = check.verdict;
      action.headline = fmt::format("{} copies at {} of the {} link rate: check the link", name,
                                    efficiency ? percent(*efficiency) : "?", link_name);
      action.evidence = check.summary;
      action.fix =
          "compare the link's current speed and width with its maximum (gpuopt doctor), reseat the "
          "card or move it to a slot wired to the CPU; check BIOS PCIe settings";
      if (efficiency && *efficiency > 0) {
        action.gain = 1 / *efficiency;
        action.gain_text = fmt::format("up to {:.1f}x copy bandwidth", action.gain);
      }
      actions.push_back(action);
    }
  }
  if (!bytes) return;
  // Pageable and remote-node copies against pinned copies on the GPU's own node, same size.
  struct Loss {
    std::string direction;
    double slow = 0, pinned = 0;
  };
  std::optional<Loss> worst_pageable, worst_remote;
  for (const std::string direction : {"host_to_device", "device_to_host"}) {
    auto pinned = copy_gbps(data, direction + "_memcpy_ce_pinned", *bytes);
    if (!pinned || *pinned <= 0) continue;
    if (auto pageable = copy_gbps(data, direction + "_memcpy_ce_pageable", *bytes)) {
      if (!worst_pageable || *pageable / *pinned < worst_pageable->slow / worst_pageable->pinned) {
        worst_pageable = Loss{direction, *pageable, *pinned};
      }
    }
    if (auto remote = copy_gbps(data, direction + "_memcpy_ce_remote_node", *bytes)) {
      if (!worst_remote || *remote / *pinned < worst_remote->slow / worst_remote->pinned) {
        worst_remote = Loss{direction, *remote, *pinned};
      }
    }
  }
  if (worst_pageable && worst_pageable->slow < 0.9 * worst_pageable->pinned) {
    const Loss& loss = *worst_pageable;
    Action action;
    action.id = "pcie.pin_host_memory";
    action.stage = stage;
    action.headline = fmt::format("pageable copies at {} of pinned: pin your memory",
                                  percent(loss.slow / loss.pinned));
    action.evidence = fmt::format("{} copies of {}: pageable {:.1f} GB/s, pinned {:.1f} GB/s",
                                  loss.direction, size_text(*bytes), loss.slow, loss.pinned);
    action.fix =
        "allocate host buffers that feed the GPU as pinned memory (cudaMallocHost or "
        "cudaHostRegister; PyTorch: DataLoader(pin_memory=True), tensor.pin_memory())";
    action.gain = loss.pinned / loss.slow;
    action.gain_text = fmt::format("{:.1f}x copy bandwidth", action.gain);
    actions.push_back(action);
  }
  if (worst_remote && worst_remote->slow < 0.9 * worst_remote->pinned) {
    const Loss& loss = *worst_remote;
    Action action;
    action.id = "pcie.numa_local_memory";
    action.stage = stage;
    action.headline = fmt::format(
        "host memory on the far NUMA node copies at {} of the GPU's own node: bind to "
        "the GPU's node",
        percent(loss.slow / loss.pinned));
    action.evidence = fmt::format("{} copies of {}: remote node {:.1f} GB/s, local {:.1f} GB/s",
                                  loss.direction, size_text(*bytes), loss.slow, loss.pinned);
    action.fix = "run the process on the GPU's NUMA node (numactl --cpunodebind=N --membind=N)";
    action.gain = loss.pinned / loss.slow;
    action.gain_text = fmt::format("{:.1f}x copy bandwidth", action.gain);
    actions.push_back(action);
  }
}

// ---- bench streams ----------------------------------------------------------------------------

void judge_streams(json& data, const std::string& stage, std::vector<Action>& actions) {
  if (json* contention = find_testcase(data, "contention"); passed(contention)) {
    json& d = (*contention)["data"];
    std::optional<double> partition_p99, priority_p99, solo_p99;
    bool isolated = false;
    int critical_sms = 0, total_sms = 0;
    for (const auto& mode : array_at(d, "modes")) {
      const std::string name = text(mode, "mode");
      auto p99 = number(mode, "critical_p99_us");
      if (name == "sm_partition") {
        partition_p99 = p99;
        isolated = mode.value("isolated_sms", false);
        critical_sms = mode.value("critical_sms", 0);
      }
      if (name == "high_priority") priority_p99 = p99;
      if (name == "critical_alone") solo_p99 = p99;
    }
    if (d.contains("workload")) total_sms = d["workload"].value("sm_count", 0);
    if (d.contains("criterion") && d["criterion"].is_object()) {
      const json& criterion = d["criterion"];
      add_check(*contention,
                bench::development_target(
                    "partition_criterion", criterion.value("met", false),
                    fmt::format("SM partition p99 {:.2f}x the solo p99 (goal <= 2x), background "
                                "keeps {:.1f}% of its throughput (goal >= 80%)",
                                number(criterion, "partition_p99_over_solo_p99").value_or(0),
                                number(criterion, "background_throughput_pct").value_or(0))));
    }
    if (partition_p99 && priority_p99 && isolated && *partition_p99 > 0 &&
        *priority_p99 > 2 * *partition_p99) {
      Action action;
      action.id = "streams.use_sm_partition";
      action.stage = stage;
      action.headline = fmt::format(
          "stream priorities leave a critical task waiting {} (p99) under load while an SM "
          "partition holds it at {}: use a partition",
          duration_us(*priority_p99), duration_us(*partition_p99));
      action.evidence = fmt::format(
          "critical task p99, host issue to completion: highest-priority stream {}, "
          "green-context partition of {} of {} SMs {}{}",
          duration_us(*priority_p99), critical_sms, total_sms, duration_us(*partition_p99),
          solo_p99 ? fmt::format(", alone on the GPU {}", duration_us(*solo_p99)) : "");
      action.fix = fmt::format(
          "run latency-critical work on its own green-context SM partition "
          "(gpuopt runtime::PartitionPlan, {} SMs here) instead of relying on stream priorities",
          critical_sms);
      action.gain = *priority_p99 / *partition_p99;
      action.gain_text = factor(action.gain) + " lower p99 latency";
      actions.push_back(action);
    }
  }
  if (json* graph = find_testcase(data, "graph_launch"); passed(graph)) {
    const json& d = (*graph)["data"];
    auto eager = number(d, "eager_us_per_kernel");
    auto replay = number(d, "graph_us_per_kernel");
    if (eager && replay && *replay > 0 && *eager > 1.5 * *replay) {
      Action action;
      action.id = "streams.use_cuda_graphs";
      action.stage = stage;
      action.headline = fmt::format(
          "small kernels launched one by one cost {:.2f} µs each, {:.2f} µs from a CUDA graph: "
          "capture repeated launch sequences",
          *eager, *replay);
      action.evidence = fmt::format(
          "{} tiny kernels, median per kernel: eager {:.2f} µs, graph "
          "replay {:.2f} µs",
          d.value("kernels", 0), *eager, *replay);
      action.fix =
          "capture the fixed part of each step in a CUDA graph (cudaStreamBeginCapture / "
          "torch.cuda.CUDAGraph) and replay it";
      action.gain = *eager / *replay;
      action.gain_text = fmt::format("{:.1f}x lower launch overhead", action.gain);
      actions.push_back(action);
    }
  }
}

// ---- bench loader, scaler, gemm, vector --------------------------------------------------------

void judge_loader(json& data, const std::string& stage, std::vector<Action>& actions) {
  if (!data.contains("testcases")) return;
  for (auto& testcase : data["testcases"]) {
    if (!passed(&testcase)) continue;
    json& d = testcase["data"];
    if (d.contains("criteria_met") && d["criteria_met"].is_boolean()) {
      std::string said;
      for (const auto& note : array_at(testcase, "notes")) {
        if (note.is_string() && said.empty()) said = note.get<std::string>();
      }
      add_check(testcase,
                bench::development_target("loader_criteria", d["criteria_met"].get<bool>(), said));
    }
    if (text(d, "scenario") != "bursty") continue;
    const json *fixed = nullptr, *adaptive = nullptr;
    for (const auto& run : array_at(d, "runs")) {
      if (text(run, "config") == "fixed-2") fixed = &run;
      if (text(run, "config") == "adaptive") adaptive = &run;
    }
    if (fixed == nullptr || adaptive == nullptr) continue;
    auto fixed_wait = number(*fixed, "wait_fraction");
    auto adaptive_wait = number(*adaptive, "wait_fraction");
    if (!fixed_wait || !adaptive_wait || *fixed_wait < 0.05 || *fixed_wait >= 1 ||
        *adaptive_wait >= 1 || *fixed_wait < 2 * *adaptive_wait) {
      continue;
    }
    Action action;
    action.id = "loader.adaptive_prefetch";
    action.stage = stage;
    action.headline = fmt::format(
        "with a fixed prefetch depth of 2 the consumer waits {} of the time for a bursty input "
        "pipeline, {} with an adaptive depth: prefetch adaptively",
        percent(*fixed_wait), percent(*adaptive_wait));
    action.evidence = fmt::format(
        "bursty producer, {} mode, share of wall time the consumer waited: fixed depth 2 {}, "
        "adaptive depth {}",
        text(d, "mode"), percent(*fixed_wait), percent(*adaptive_wait));
    action.fix =
        "let the prefetch depth follow the producer (gpuopt data::Loader with the adaptive depth "
        "controller; PyTorch: raise prefetch_factor and num_workers until the wait stops falling)";
    // The consumer's work is the same in both runs, so wall time scales as 1 / (1 - wait).
    action.gain = (1 - *adaptive_wait) / (1 - *fixed_wait);
    action.gain_text = fmt::format("{:.2f}x shorter wall time", action.gain);
    if (action.gain > 1.05) actions.push_back(action);
  }
}

void judge_scaler(json& data) {
  if (!data.contains("testcases")) return;
  for (auto& testcase : data["testcases"]) {
    if (!passed(&testcase)) continue;
    const json& d = testcase["data"];
    auto ratio = number(d, "ratio");
    if (!ratio) continue;
    // The scaler's goal is its own: the fused kernel against a device copy of the same bytes.
    add_check(testcase, bench::development_target(
                            "speed_vs_device_copy", *ratio >= 0.80,
                            fmt::format("fused unscale at {:.2f}x the speed of a device copy of "
                                        "the same bytes (goal >= 0.80x)",
                                        *ratio)));
  }
}

void judge_gemm(json& data, const std::string& stage, std::vector<Action>& actions) {
  if (!data.contains("testcases")) return;
  const json* best_row = nullptr;
  std::string best_shape;
  for (auto& testcase : data["testcases"]) {
    if (!passed(&testcase)) continue;
    const json& d = testcase["data"];
    if (d.contains("targets_met") && d["targets_met"].is_boolean()) {
      std::string said;
      for (const auto& note : array_at(testcase, "notes")) {
        if (note.is_string() && note.get<std::string>().rfind("targets", 0) == 0) {
          said = note.get<std::string>();
        }
      }
      add_check(testcase,
                bench::development_target(
                    "speedup_targets", d["targets_met"].get<bool>(),
                    said.empty() ? "gpuopt's W4A16 speedup goals over cuBLAS fp16" : said));
    }
    for (const auto& row : array_at(d, "rows")) {
      auto m = number(row, "m");
      auto speedup = number(row, "speedup_vs_cublas_fp16");
      if (!m || !speedup || *m > 16) continue;
      if (best_row == nullptr || *speedup > *number(*best_row, "speedup_vs_cublas_fp16")) {
        best_row = &row;
        best_shape = fmt::format("K={} N={}", d.value("k", 0), d.value("n", 0));
      }
    }
  }
  if (best_row == nullptr) return;
  const double speedup = *number(*best_row, "speedup_vs_cublas_fp16");
  if (speedup < 1.2) return;
  Action action;
  action.id = "gemm.int4_weights_for_decode";
  action.stage = stage;
  action.headline = fmt::format(
      "small-batch decode GEMMs run {:.1f}x faster from 4-bit weights than cuBLAS fp16: quantise "
      "weights for decode",
      speedup);
  action.evidence = fmt::format("{}, M={}: gpuopt W4A16 {:.1f} µs, cuBLAS fp16 {:.1f} µs",
                                best_shape, number(*best_row, "m").value_or(0),
                                number(*best_row, "gpuopt_fp16_us").value_or(0),
                                number(*best_row, "cublas_fp16_us").value_or(0));
  action.fix =
      "for batch <= 16 decoding, store linear weights as int4 with group scales and use a W4A16 "
      "kernel (gpuopt kernels::W4A16Gemm) where the accuracy allows";
  action.gain = speedup;
  action.gain_text = fmt::format("{:.1f}x faster decode GEMMs", speedup);
  actions.push_back(action);
}

void judge_vector(json& data) {
  if (!data.contains("testcases")) return;
  for (auto& testcase : data["testcases"]) {
    if (!passed(&testcase)) continue;
    const json& d = testcase["data"];
    if (!d.contains("criteria_met") || !d["criteria_met"].is_boolean()) continue;
    const bool met = d["criteria_met"].get<bool>();
    if (auto recall = number(d, "best_distance_recall")) {
      // Approximate search: recall depends on the index settings, a goal of the project.
      add_check(testcase, bench::development_target(
                              "ivf_recall", met,
                              fmt::format("best recall@k {:.3f} over the nprobe sweep (goal >= "
                                          "0.95)",
                                          *recall)));
      continue;
    }
    // Exact search must return the true neighbours: a miss is a wrong answer.
    Check check;
    check.id = "exact_results";
    check.verdict = met ? Verdict::kHealthy : Verdict::kFailing;
    check.summary = met ? "exact search returned the true neighbours"
                        : "exact search missed true neighbours: wrong results";
    add_check(testcase, check);
  }
}

// ---- pipeline ---------------------------------------------------------------------------------

void judge_pipeline(json& stage_json, json& data, std::vector<Action>& actions) {
  const std::string stage = text(stage_json, "key");
  json checks = json::array();
  const json* baseline = nullptr;
  const json* optimized = nullptr;
  for (const auto& run : array_at(data, "runs")) {
    if (text(run, "mode") == "baseline" && baseline == nullptr) baseline = &run;
    if (text(run, "mode") == "optimized" && optimized == nullptr) optimized = &run;
  }
  for (const auto& comparison : array_at(data, "comparisons")) {
    Check check;
    check.id = fmt::format("same_results.{}cam", comparison.value("cameras", 0));
    const bool same = comparison.value("same_results", false);
    check.verdict = same ? Verdict::kHealthy : Verdict::kFailing;
    check.summary = same ? "baseline and optimized modes produced the same results"
                         : "baseline and optimized modes produced different results";
    checks.push_back(bench::to_json(check));
  }
  stage_json["checks"] = checks;
  if (baseline == nullptr || optimized == nullptr) return;
  auto offered = number(*baseline, "offered_fps");
  auto base_fps = number(*baseline, "throughput_fps");
  auto opt_fps = number(*optimized, "throughput_fps");
  auto base_p99 = number(*baseline, "latency_p99_ms");
  auto opt_p99 = number(*optimized, "latency_p99_ms");
  if (!offered || !base_fps || !opt_fps || !base_p99 || !opt_p99 || *base_fps <= 0) return;
  if (*opt_fps < 1.1 * *base_fps) return;
  Action action;
  action.id = "pipeline.batch_and_overlap";
  action.stage = stage;
  action.headline = fmt::format(
      "the pipeline as usually written serves {:.0f} of {:.0f} frames/s offered, p99 latency {}; "
      "batched and overlapped: {:.0f} frames/s at {}",
      *base_fps, *offered, duration_us(*base_p99 * 1e3), *opt_fps, duration_us(*opt_p99 * 1e3));
  action.evidence =
      fmt::format("{} cameras: baseline {:.1f} fps, p99 {}; optimized {:.1f} fps, p99 {}",
                  baseline->value("cameras", 0), *base_fps, duration_us(*base_p99 * 1e3), *opt_fps,
                  duration_us(*opt_p99 * 1e3));
  action.fix =
      "batch requests to the LLM, replay the vision stages as one CUDA graph, and give each "
      "camera its own stream with pinned staging (gpuopt pipeline --mode optimized shows how)";
  action.gain = *opt_fps / *base_fps;
  action.gain_text = factor(action.gain) + " throughput";
  actions.push_back(action);
}

// ---- doctor -----------------------------------------------------------------------------------

Verdict finding_verdict(const std::string& severity) {
  if (severity == "error") return Verdict::kFailing;
  if (severity == "warning") return Verdict::kWarning;
  return Verdict::kInfo;
}

Verdict judge_doctor(json& data, const std::string& stage, std::vector<Action>& actions) {
  Verdict verdict = Verdict::kHealthy;
  if (!data.contains("findings") || !data["findings"].is_array()) return verdict;
  for (auto& finding : data["findings"]) {
    const Verdict v = finding_verdict(text(finding, "severity"));
    finding["verdict"] = verdict_name(v);
    verdict = bench::worst(verdict, v);
    if (v < Verdict::kWarning || text(finding, "fix").empty()) continue;
    Action action;
    action.id = "doctor." + text(finding, "id");
    action.stage = stage;
    action.verdict = v;
    action.headline = text(finding, "summary");
    std::string evidence;
    if (finding.contains("evidence") && finding["evidence"].is_object()) {
      for (const auto& [key, value] : finding["evidence"].items()) {
        evidence += (evidence.empty() ? "" : "; ") + key + " " +
                    (value.is_string() ? value.get<std::string>() : value.dump());
      }
    }
    action.evidence = evidence;
    action.fix = text(finding, "fix");
    actions.push_back(action);
  }
  return verdict;
}

// Why a stage measured nothing, when it did not: skipped by the audit, skipped by itself (no GPU),
// or a bench whose build has no testcases to run.
std::optional<std::string> skipped_reason(const json& stage) {
  if (text(stage, "status") == "skipped") return text(stage, "reason");
  if (text(stage, "status") != "ran") return std::nullopt;
  const json& data = stage["data"];
  if (data.is_object() && data.contains("skipped") && data["skipped"].is_string()) {
    return text(data, "skipped");
  }
  if (data.is_object() && data.contains("testcases") && data["testcases"].is_array() &&
      data["testcases"].empty()) {
    return "no testcase to run in this build of gpuopt";
  }
  return std::nullopt;
}

}  // namespace

json to_json(const Action& action) {
  return {{"id", action.id},
          {"stage", action.stage},
          {"verdict", verdict_name(action.verdict)},
          {"headline", action.headline},
          {"evidence", action.evidence},
          {"fix", action.fix},
          {"gain", action.gain > 0 ? json(action.gain) : json(nullptr)},
          {"gain_text", action.gain_text}};
}

void rank_actions(std::vector<Action>& actions) {
  std::stable_sort(actions.begin(), actions.end(), [](const Action& a, const Action& b) {
    if (a.verdict != b.verdict) return a.verdict > b.verdict;
    return a.gain > b.gain;
  });
}

Verdict stage_verdict(const json& stage) { return parse_or(stage, Verdict::kFailing); }

void judge_stage(json& stage, std::vector<Action>& actions) {
  const std::string key = text(stage, "key");
  const std::string status = text(stage, "status");
  stage["checks"] = json::array();
  if (status == "skipped") {
    stage["verdict"] = verdict_name(Verdict::kInfo);
    stage["verdict_summary"] = "skipped: " + text(stage, "reason");
    return;
  }
  if (status != "ran") {
    stage["verdict"] = verdict_name(Verdict::kFailing);
    stage["verdict_summary"] = "the stage failed: " + text(stage, "reason");
    return;
  }
  json& data = stage["data"];
  if (auto reason = skipped_reason(stage)) {
    stage["verdict"] = verdict_name(Verdict::kInfo);
    stage["verdict_summary"] = "skipped: " + *reason;
    return;
  }
  Verdict verdict = Verdict::kHealthy;
  if (key == "doctor") verdict = judge_doctor(data, key, actions);
  if (key == "bench.pcie") judge_pcie(data, key, actions);
  if (key == "bench.streams") judge_streams(data, key, actions);
  if (key == "bench.loader") judge_loader(data, key, actions);
  if (key == "bench.scaler") judge_scaler(data);
  if (key == "bench.gemm") judge_gemm(data, key, actions);
  if (key == "bench.vector") judge_vector(data);
  if (key == "pipeline") judge_pipeline(stage, data, actions);

  int counts[4] = {0, 0, 0, 0};
  int development_missed = 0;
  if (data.is_object() && data.contains("testcases") && data["testcases"].is_array()) {
    for (auto& testcase : data["testcases"]) {
      const std::string outcome = text(testcase, "outcome");
      Verdict v = outcome == "failed"   ? Verdict::kFailing
                  : outcome == "waived" ? Verdict::kInfo
                                        : Verdict::kHealthy;
      if (!testcase.contains("checks") || !testcase["checks"].is_array()) {
        testcase["checks"] = json::array();
      }
      for (const auto& check : testcase["checks"]) {
        Verdict counted = parse_or(check, Verdict::kInfo);
        if (check.value("development_target", false)) {
          counted = std::min(counted, Verdict::kInfo);
          if (text(check, "summary").find("not met") != std::string::npos) ++development_missed;
        }
        if (outcome == "passed") v = bench::worst(v, counted);
      }
      testcase["verdict"] = verdict_name(v);
      ++counts[static_cast<int>(v)];
      verdict = bench::worst(verdict, v);
    }
  }
  for (const auto& check : stage["checks"])
    verdict = bench::worst(verdict, parse_or(check, Verdict::kInfo));
  stage["verdict"] = verdict_name(verdict);
  std::string summary;
  const int total = counts[0] + counts[1] + counts[2] + counts[3];
  if (total > 0) {
    summary = fmt::format("{} testcases: {} healthy, {} info, {} warning, {} failing", total,
                          counts[0], counts[1], counts[2], counts[3]);
    if (development_missed > 0) {
      summary += fmt::format("; {} development target(s) of gpuopt not met (info only)",
                             development_missed);
    }
  } else if (data.is_object() && data.contains("findings") && data["findings"].is_array()) {
    summary = fmt::format("{} findings", data["findings"].size());
  } else if (data.is_object() && data.contains("skipped")) {
    summary = "skipped: " + text(data, "skipped");
  } else {
    summary = verdict == Verdict::kHealthy ? "ran, nothing to flag" : "see the checks";
  }
  stage["verdict_summary"] = summary;
}

void judge_report(json& report) {
  std::vector<Action> actions;
  Verdict overall = Verdict::kHealthy;
  json skipped = json::array();
  int ran = 0, problems = 0;
  if (report.contains("stages") && report["stages"].is_array()) {
    for (auto& stage : report["stages"]) {
      judge_stage(stage, actions);
      const Verdict v = stage_verdict(stage);
      overall = bench::worst(overall, v);
      if (auto reason = skipped_reason(stage)) {
        skipped.push_back({{"stage", text(stage, "key")}, {"reason", *reason}});
      } else {
        ++ran;
      }
      if (v >= Verdict::kWarning) ++problems;
    }
  }
  // Notes alone (waived testcases, development targets) on a machine where every stage ran do
  // not make it less than healthy; a skipped stage leaves it at info: not everything was seen.
  if (overall == Verdict::kInfo && skipped.empty()) overall = Verdict::kHealthy;
  rank_actions(actions);
  json ranked = json::array();
  for (const auto& action : actions) ranked.push_back(to_json(action));
  const std::size_t total = report.value("stages", json::array()).size();
  std::string headline;
  switch (overall) {
    case Verdict::kHealthy:
      headline = fmt::format("all {} stages ran and found nothing wrong with this machine", total);
      break;
    case Verdict::kInfo:
      headline =
          fmt::format("nothing wrong found in what could run: {} of {} stages ran, {} skipped", ran,
                      total, skipped.size());
      break;
    case Verdict::kWarning:
      headline = fmt::format("warning: {} of {} stages found something to fix", problems, total);
      break;
    case Verdict::kFailing:
      headline = fmt::format("failing: {} of {} stages failed or found faults", problems, total);
      break;
  }
  report["verdict"] = {{"verdict", verdict_name(overall)},
                       {"headline", headline},
                       {"skipped", skipped},
                       {"exit_code", bench::exit_code_for(overall)}};
  report["actions"] = ranked;
}

}  // namespace gpuopt::report
