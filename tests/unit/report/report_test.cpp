// The audit report: JSON fields, script-safe embedding, and the offline page's parts.
#include "gpuopt/report/report.hpp"

#include <gtest/gtest.h>

namespace gpuopt::report {
namespace {

AuditReport sample() {
  AuditReport report;
  report.gpuopt_version = "0.1.0";
  report.generated_at = "2026-11-29T23:00:00Z";
  report.hostname = "box";
  report.gpu_present = false;
  report.gpu_summary = "no CUDA device found";
  StageRecord stage;
  stage.key = "doctor";
  stage.status = "ran";
  stage.data = {{"findings", nlohmann::json::array({{{"id", "pcie.aspm_policy"},
                                                     {"severity", "warning"},
                                                     {"fix", "</script><script>alert(1)"}}})}};
  report.stages.push_back(stage);
  return report;
}

TEST(Report, JsonCarriesSchemaAndStages) {
  nlohmann::json json = to_json(sample());
  EXPECT_EQ(json["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(json["gpu"]["present"], false);
  ASSERT_EQ(json["stages"].size(), 1u);
  EXPECT_EQ(json["stages"][0]["data"]["findings"][0]["id"], "pcie.aspm_policy");
}

TEST(Report, ScriptEmbeddingCannotCloseTheElement) {
  nlohmann::json value = {{"text", "a</script>b<!--c\u2028d"}};
  std::string text = json_for_script(value);
  EXPECT_EQ(text.find('<'), std::string::npos);
  EXPECT_EQ(text.find("\u2028"), std::string::npos);
  // The escaped text still parses back to the same value.
  EXPECT_EQ(nlohmann::json::parse(text), value);
}

TEST(Report, HtmlIsOfflineWithChartJsAndTheData) {
  std::string html = render_html(to_json(sample()));
  EXPECT_NE(html.find("Chart.js v3"), std::string::npos);  // Debian's libjs-chart.js, inlined
  EXPECT_NE(html.find("report-data"), std::string::npos);
  // Nothing is fetched: no external scripts, styles or images.
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  // The hostile finding text is inside the JSON, escaped, never as markup.
  EXPECT_EQ(html.find("<script>alert(1)"), std::string::npos);
  EXPECT_GT(chartjs_source().size(), 100000u);
  EXPECT_NE(report_view_source().find("report-data"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::report
