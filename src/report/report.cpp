// Audit report: JSON document and the offline HTML page around it.
#include "gpuopt/report/report.hpp"

#include <fmt/format.h>

namespace gpuopt::report {

nlohmann::json to_json(const AuditReport& report) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& stage : report.stages) {
    stages.push_back({{"key", stage.key},
                      {"title", stage.title},
                      {"command", stage.command},
                      {"status", stage.status},
                      {"reason", stage.reason},
                      {"exit_code", stage.exit_code},
                      {"seconds", stage.seconds},
                      {"data", stage.data},
                      {"stderr_tail", stage.stderr_tail}});
  }
  return {{"schema_version", kReportSchemaVersion},
          {"tool", "gpuopt"},
          {"gpuopt_version", report.gpuopt_version},
          {"generated_at", report.generated_at},
          {"host", {{"hostname", report.hostname}, {"kernel", report.kernel}}},
          {"gpu", {{"present", report.gpu_present}, {"summary", report.gpu_summary}}},
          {"stages", std::move(stages)}};
}

std::string json_for_script(const nlohmann::json& value) {
  // ensure_ascii keeps U+2028/2029 (line terminators in older JS parsers) as \u escapes.
  std::string text =
      value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    // "</script>" inside a string would end the element; "<!--" would open a comment state.
    if (text[i] == '<') {
      out += "\\u003c";
    } else {
      out += text[i];
    }
  }
  return out;
}

namespace {

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr const char* kStyle = R"css(
body { font-family: system-ui, sans-serif; margin: 1.2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { margin: 0; font-size: 1.6em; } .machine { color: #444; margin: 0.2em 0 0.6em; }
.meta { color: #666; margin-top: 0.3em; }
.verdict { display: flex; gap: 1em; align-items: baseline; padding: 0.6em 1em; border-radius: 6px;
  border-left: 8px solid; font-size: 1.15em; }
.verdict-word { font-weight: bold; letter-spacing: 0.05em; }
.verdict.v-healthy { background: #dafbe1; border-color: #1a7f37; }
.verdict.v-info { background: #ddf4ff; border-color: #0969da; }
.verdict.v-warning { background: #fff8c5; border-color: #9a6700; }
.verdict.v-failing { background: #ffebe9; border-color: #cf222e; }
.skipped { color: #555; font-size: 0.9em; margin: 0.4em 0; }
#actions h2 { margin: 0.6em 0 0.3em; font-size: 1.2em; }
ol.actions { margin: 0; padding-left: 1.4em; } ol.actions li { margin: 0.35em 0; }
.action-head { display: flex; gap: 0.8em; align-items: baseline; }
.gain { background: #eef1f4; border-radius: 10px; padding: 0 0.6em; font-size: 0.85em; white-space: nowrap; }
.evidence, .fix { font-size: 0.9em; color: #333; } .fix { color: #0a3069; }
.badge { border-radius: 10px; padding: 0 0.5em; font-size: 0.85em; color: #fff; }
.badge.v-healthy { background: #1a7f37; } .badge.v-info { background: #0969da; }
.badge.v-warning { background: #9a6700; } .badge.v-failing { background: #cf222e; }
.badge.v-unknown, .badge.v-error { background: #6e7781; }
nav#contents ol { columns: 2; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td ul.checks { margin: 0; padding-left: 1em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
section.stage, #appendix { border-top: 1px solid #ddd; margin-top: 1.5em; }
.failed-data { border-left: 4px solid #cf222e; padding-left: 0.8em; }
.chart { max-width: 1000px; height: 340px; } pre { background: #f6f8fa; padding: 0.6em; overflow-x: auto; }
)css";

// Counts script errors and console.error calls on <html data-errors>, so a headless browser test
// can tell that the page rendered cleanly.
constexpr const char* kErrorCounter = R"js(
(function () {
  var html = document.documentElement;
  html.setAttribute('data-errors', '0');
  function bump(what) {
    html.setAttribute('data-errors', String(Number(html.getAttribute('data-errors')) + 1));
    html.setAttribute('data-last-error', String(what));
  }
  window.addEventListener('error', function (event) { bump(event.message); });
  var original = console.error;
  console.error = function () { bump(Array.prototype.join.call(arguments, ' ')); original.apply(console, arguments); };
})();
)js";

}  // namespace

std::string render_html(const nlohmann::json& report) {
  std::string title = "gpuopt audit";
  if (report.contains("host") && report["host"].contains("hostname")) {
    title += " — " + report["host"]["hostname"].get<std::string>();
  }
  // Chart.js, the data and the view are inline so the file works offline, from disk.
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>{}</title>\n<link rel=\"icon\" href=\"data:,\">\n<style>{}</style>\n"
      "<script>{}</script>\n<script>{}</script>\n</head>\n<body>\n<div "
      "id=\"report\"><noscript>This report needs "
      "JavaScript; report.json beside it has the same data.</noscript></div>\n"
      "<script id=\"report-data\" type=\"application/json\">{}</script>\n"
      "<script>{}</script>\n</body>\n</html>\n",
      html_escape(title), kStyle, kErrorCounter, chartjs_source(), json_for_script(report),
      report_view_source());
}

}  // namespace gpuopt::report
