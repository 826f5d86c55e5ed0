// `gpuopt audit`: the main job. Runs doctor, the short benches and the pipeline, each as a child
// process of this binary (so one stage can fail or hang without taking the others down), and
// writes report.json + an offline report.html.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>

#include "command_registry.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/output_file.hpp"
#include "gpuopt/core/progress.hpp"
#include "gpuopt/core/subprocess.hpp"
#include "gpuopt/core/suggest.hpp"
#include "gpuopt/report/judge.hpp"
#include "gpuopt/report/report.hpp"
#include "gpuopt/version.hpp"
#include "output_options.hpp"

namespace gpuopt::cli {
namespace {

namespace fs = std::filesystem;

struct AuditOptions {
  std::string out_dir = "gpuopt-audit";
  OutputOptions
      output;        // -o/--output, --json, -q/--quiet: the summary (or report.json) and progress
  std::string from;  // a report.json to judge and render again instead of running the stages
  std::vector<std::string> skip;
  int stage_timeout_s = 300;
  bool full = false;
};

struct StagePlan {
  std::string key;
  std::string title;
  std::vector<std::string> command;  // path of subcommands + flags
  std::size_t subcommand_depth;      // how many leading words name the subcommand
};

std::vector<StagePlan> audit_plan(bool full) {
  std::vector<std::string> quick =
      full ? std::vector<std::string>{} : std::vector<std::string>{"--quick"};
  auto with = [&](std::vector<std::string> words) {
    words.insert(words.end(), quick.begin(), quick.end());
    words.push_back("--json");
    return words;
  };
  return {
      {"doctor", "Platform diagnosis (doctor)", {"doctor", "--json"}, 1},
      {"bench.pcie", "PCIe transfers (bench pcie)", with({"bench", "pcie"}), 2},
      {"bench.streams", "Stream priorities and SM partitions (bench streams)",
       with({"bench", "streams"}), 2},
      {"bench.loader", "Adaptive prefetch loader (bench loader)", with({"bench", "loader"}), 2},
      {"bench.scaler", "Loss scaler (bench scaler)", with({"bench", "scaler"}), 2},
      {"bench.gemm", "W4A16 GEMM (bench gemm)", with({"bench", "gemm"}), 2},
      {"bench.vector", "Vector store (bench vector)", with({"bench", "vector"}), 2},
      {"pipeline", "Multi-stream pipeline, baseline vs optimized (pipeline)", with({"pipeline"}),
       1},
  };
}

bool has_subcommand(CLI::App& app, const std::vector<std::string>& path, std::size_t depth) {
  CLI::App* current = &app;
  for (std::size_t i = 0; i < depth; ++i) {
    CLI::App* next = nullptr;
    for (CLI::App* sub : current->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->get_name() == path[i]) next = sub;
    }
    if (next == nullptr) return false;
    current = next;
  }
  return true;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tail_lines(const std::string& text, int lines) {
  std::size_t position = text.size();
  for (int i = 0; i <= lines && position != std::string::npos && position > 0; ++i) {
    position = text.rfind('\n', position - 1);
  }
  return position == std::string::npos || position == 0 ? text : text.substr(position + 1);
}

std::string iso_now() {
  std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buffer;
}

// Name of device 0, or why there is none.
std::pair<bool, std::string> gpu_summary() {
  auto count = cuda_device_count();
  if (!count.ok()) return {false, count.status().message()};
#if GPUOPT_CUDA
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess) {
    return {true, fmt::format("{} x {} (sm_{}{}, {} SMs)", *count, properties.name,
                              properties.major, properties.minor, properties.multiProcessorCount)};
  }
#endif
  return {true, fmt::format("{} CUDA device(s)", *count)};
}

// A bench suite whose testcases were all waived ran nothing: call it skipped, with the reasons.
void classify_waived(report::StageRecord& stage) {
  if (stage.data.is_object() && stage.data.contains("skipped") &&
      stage.data["skipped"].is_string()) {
    stage.status = "skipped";
    stage.reason = stage.data["skipped"].get<std::string>();
    return;
  }
  if (!stage.data.is_object() || !stage.data.contains("testcases")) return;
  const auto& testcases = stage.data["testcases"];
  if (!testcases.is_array() || testcases.empty()) return;
  std::set<std::string> reasons;
  for (const auto& testcase : testcases) {
    if (testcase.value("outcome", "") != "waived") return;
    if (testcase.contains("reason") && testcase["reason"].is_string()) {
      reasons.insert(testcase["reason"].get<std::string>());
    }
  }
  stage.status = "skipped";
  std::string joined;
  for (const auto& reason : reasons) joined += (joined.empty() ? "" : "; ") + reason;
  stage.reason = "every testcase waived: " + joined;
}

// Writes report.json and report.html, then the summary (text, or with --json the report itself)
// to stdout or --output; returns the exit code of the document's verdict.
int write_report(const fs::path& out, const nlohmann::json& document, const OutputOptions& output) {
  const std::string report_json = document.dump(2) + "\n";
  for (const auto& [name, contents] :
       {std::pair<std::string, std::string>{"report.json", report_json},
        {"report.html", report::render_html(document)}}) {
    if (Status written = write_file_atomically((out / name).string(), contents); !written.ok()) {
      print_error("audit", written);
      return kExitToolFailed;
    }
  }
  const nlohmann::json& verdict = document["verdict"];
  std::string text;
  auto append = std::back_inserter(text);
  if (output.json) {
    text = report_json;
  } else {
    fmt::format_to(append, "gpuopt audit: {}\n", verdict.value("headline", ""));
    for (const auto& skipped : verdict.value("skipped", nlohmann::json::array())) {
      fmt::format_to(append, "  skipped {}: {}\n", skipped.value("stage", ""),
                     skipped.value("reason", ""));
    }
    int shown = 0;
    for (const auto& action : document.value("actions", nlohmann::json::array())) {
      if (shown++ == 3) break;
      fmt::format_to(append, "  {}. {}\n", shown, action.value("headline", ""));
    }
    fmt::format_to(append, "gpuopt audit: wrote {} and {}\n", (out / "report.html").string(),
                   (out / "report.json").string());
  }
  if (!write_output("audit", output, text)) return kExitToolFailed;
  return verdict.value("exit_code", kExitErrors);
}

// Judges a recorded report.json again (with this build's rules) and renders it.
int rejudge(const AuditOptions& options) {
  std::ifstream in(options.from);
  if (!in) {
    fmt::print(stderr, "gpuopt audit: --from: cannot read {}\n", options.from);
    return kExitErrors;
  }
  nlohmann::json document = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object() || !document.contains("stages") ||
      !document["stages"].is_array()) {
    fmt::print(stderr, "gpuopt audit: {} is not an audit report.json (no \"stages\" array)\n",
               options.from);
    return kExitErrors;
  }
  document["schema_version"] = report::kReportSchemaVersion;
  report::judge_report(document);
  return write_report(options.out_dir, document, options.output);
}

// Before any stage runs: --output must be writable and --out-dir (with stages/ for a run) must
// exist or be creatable; a bad path is the caller's error (exit 2).
bool paths_usable(const AuditOptions& options) {
  if (!output_usable("audit", options.output)) return false;
  std::error_code error;
  const fs::path folder =
      options.from.empty() ? fs::path(options.out_dir) / "stages" : fs::path(options.out_dir);
  fs::create_directories(folder, error);
  if (error) {
    fmt::print(stderr, "gpuopt audit: --out-dir: cannot create {}: {}\n", folder.string(),
               error.message());
    return false;
  }
  return true;
}

int run_audit(CLI::App& app, const AuditOptions& options) {
  if (!paths_usable(options)) return kExitErrors;
  if (!options.from.empty()) return rejudge(options);
  fs::path out(options.out_dir);
  auto self = current_executable();
  if (!self.ok()) {
    print_error("audit", self.status());
    return kExitToolFailed;
  }

  report::AuditReport audit;
  audit.gpuopt_version = build_info::kVersion;
  audit.generated_at = iso_now();
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) audit.hostname = host;
  struct utsname uts {};
  if (uname(&uts) == 0) audit.kernel = fmt::format("{} {}", uts.sysname, uts.release);
  std::tie(audit.gpu_present, audit.gpu_summary) = gpu_summary();
  fmt::print(stderr, "gpuopt audit: {}\n",
             audit.gpu_present ? "GPU: " + audit.gpu_summary : "no GPU: " + audit.gpu_summary);

  auto plan = audit_plan(options.full);
  ProgressOptions progress_options;
  progress_options.enabled = progress_wanted(options.output);
  progress_options.label = "audit";
  progress_options.unit = "stage";
  progress_options.total = static_cast<double>(plan.size());
  ProgressLine progress(std::move(progress_options));
  // Elapsed time and ETA keep moving while a stage runs.
  progress.start_ticker(std::chrono::milliseconds(500));
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const StagePlan& step = plan[i];
    report::StageRecord stage;
    stage.key = step.key;
    stage.title = step.title;
    stage.command = step.command;
    const std::string log_prefix = fmt::format("[{}/{}] {:<14} ", i + 1, plan.size(), step.key);
    // Without a progress line the log line starts now, so a stage that hangs is named.
    if (!progress.enabled()) fmt::print(stderr, "{}", log_prefix);
    progress.update(static_cast<double>(i), step.key);
    if (std::find(options.skip.begin(), options.skip.end(), step.key) != options.skip.end()) {
      stage.status = "skipped";
      stage.reason = "skipped by --skip";
    } else if (!has_subcommand(app, step.command, step.subcommand_depth)) {
      stage.status = "skipped";
      stage.reason = "not available in this build of gpuopt";
    } else {
      std::vector<std::string> argv{*self};
      argv.insert(argv.end(), step.command.begin(), step.command.end());
      fs::path stdout_path = out / "stages" / (step.key + ".json");
      fs::path stderr_path = out / "stages" / (step.key + ".stderr");
      auto ran = run_subprocess(argv, stdout_path.string(), stderr_path.string(),
                                std::chrono::seconds(options.stage_timeout_s));
      if (!ran.ok()) {
        stage.status = "failed";
        stage.reason = plain_message(ran.status());
      } else {
        stage.seconds = ran->seconds;
        stage.exit_code = ran->exit_code;
        std::string text = read_text(stdout_path);
        stage.data = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (stage.data.is_discarded()) stage.data = nullptr;
        // Every stage uses the CLI's codes: 1 = warnings (a target missed, a finding), 2 = errors
        // found, 3 = the tool itself failed. 0-2 with JSON means the stage ran and said so.
        bool exit_ok = ran->exit_code >= 0 && ran->exit_code <= 2;
        if (ran->timed_out) {
          stage.status = "failed";
          stage.reason =
              fmt::format("ran past the {} s limit and was stopped", options.stage_timeout_s);
        } else if (ran->signal != 0) {
          stage.status = "failed";
          stage.reason = fmt::format("killed by signal {}", ran->signal);
        } else if (!exit_ok) {
          stage.status = "failed";
          stage.reason = fmt::format("exit code {}", ran->exit_code);
        } else if (stage.data.is_null()) {
          stage.status = "failed";
          stage.reason = "its output was not JSON";
        } else {
          stage.status = "ran";
          classify_waived(stage);
        }
        // The stage's own exit code is kept as data only: the audit judges the stage's JSON
        // (report/judge.hpp), where a missed development target is info, not a warning.
        if (stage.status == "failed") stage.stderr_tail = tail_lines(read_text(stderr_path), 20);
      }
    }
    // The stage's verdict, for the progress line.
    report::AuditReport single;
    single.stages.push_back(stage);
    nlohmann::json judged = report::to_json(single);
    std::vector<report::Action> ignored;
    report::judge_stage(judged["stages"][0], ignored);
    progress.clear();
    fmt::print(
        stderr, "{}{:<8} {:6.1f} s  {:<8} {}\n", progress.enabled() ? log_prefix : "", stage.status,
        stage.seconds, judged["stages"][0].value("verdict", ""),
        stage.status == "ran" ? judged["stages"][0].value("verdict_summary", "") : stage.reason);
    audit.stages.push_back(std::move(stage));
    progress.update(static_cast<double>(i + 1));
  }
  progress.stop_ticker();
  progress.clear();

  nlohmann::json document = report::to_json(audit);
  report::judge_report(document);
  return write_report(out, document, options.output);
}

GPUOPT_REGISTER_COMMAND("", 100, [](CLI::App& parent, int& exit_code) {
  auto options = std::make_shared<AuditOptions>();
  CLI::App* command = parent.add_subcommand(
      "audit", "The main job: doctor + short benches + pipeline, one report.html + report.json");
  add_out_dir_flag(*command, options->out_dir, "Folder for report.html, report.json and stages/",
                   {"--out"})
      ->capture_default_str();
  OutputFlags output_flags = OutputFlags::with_quiet();
  output_flags.json_help = "Print report.json instead of the summary (to stdout or --output)";
  add_output_flags(*command, options->output, output_flags);
  command->add_option("--from", options->from,
                      "Judge and render a recorded report.json again instead of running stages");
  command->add_option("--skip", options->skip, "Stage keys to skip (e.g. bench.gemm)")
      ->check(CLI::Validator(
          [](std::string& key) -> std::string {
            std::vector<std::string> keys;
            for (const StagePlan& step : audit_plan(false)) keys.push_back(step.key);
            if (std::find(keys.begin(), keys.end(), key) != keys.end()) return {};
            // "pcie" is as good a spelling of "bench.pcie" as "bench.pcei": match the last part.
            std::vector<std::string> short_keys;
            for (const auto& k : keys) short_keys.push_back(k.substr(k.rfind('.') + 1));
            std::string short_key = key.substr(key.rfind('.') + 1);
            auto near = closest_match(key, keys);
            if (!near) {
              if (auto part = closest_match(short_key, short_keys)) {
                near = keys[std::find(short_keys.begin(), short_keys.end(), *part) -
                            short_keys.begin()];
              }
            }
            return fmt::format("'{}' is not a stage{}; the stages are {}", key,
                               near ? fmt::format(" (did you mean '{}'?)", *near) : "",
                               fmt::join(keys, ", "));
          },
          "STAGE"));
  command
      ->add_option("--stage-timeout", options->stage_timeout_s, "Seconds before a stage is stopped")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  command->add_flag("--full", options->full, "Full benches instead of the short ones");
  command->callback([&parent, options, &exit_code] { exit_code = run_audit(parent, *options); });
});

}  // namespace
}  // namespace gpuopt::cli
