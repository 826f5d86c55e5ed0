// The audit report: one JSON document (versioned) and one offline HTML file that renders it with
// Chart.js (Debian's libjs-chart.js, inlined at build time).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gpuopt::report {

// 2: a "verdict" object and ranked "actions" at the top; "verdict" on every stage, testcase and
// finding (report/judge.hpp).
inline constexpr int kReportSchemaVersion = 2;

// One stage of the audit (doctor, a bench family, the pipeline).
struct StageRecord {
  std::string key;                   // "doctor", "bench.pcie", ...
  std::string title;                 // for people
  std::vector<std::string> command;  // the gpuopt arguments that produced it
  std::string status;                // "ran", "failed", "skipped"
  std::string reason;                // why skipped or failed
  int exit_code = 0;
  double seconds = 0;
  nlohmann::json data;      // the stage's own --json output (null when none)
  std::string stderr_tail;  // last lines of its stderr, for failures
};

struct AuditReport {
  std::string gpuopt_version;
  std::string generated_at;  // ISO 8601 UTC
  std::string hostname;
  std::string kernel;
  bool gpu_present = false;
  std::string gpu_summary;  // device name or the reason there is none
  std::vector<StageRecord> stages;
};

nlohmann::json to_json(const AuditReport& report);

// JSON text safe inside <script type="application/json">: "</" and U+2028/2029 escaped.
std::string json_for_script(const nlohmann::json& value);

// A complete offline HTML page for the report JSON.
std::string render_html(const nlohmann::json& report);

// The inlined assets (generated at build time).
const std::string& chartjs_source();
const std::string& report_view_source();

}  // namespace gpuopt::report
