// Audit verdicts and actions, on hand-written stage records whose expected verdicts and figures
// follow from the rules in report/judge.hpp.
#include "gpuopt/report/judge.hpp"

#include <gtest/gtest.h>

namespace gpuopt::report {
namespace {

using nlohmann::json;

json stage(const std::string& key, json data, const std::string& status = "ran") {
  return {{"key", key},     {"title", key},   {"status", status},        {"reason", ""},
          {"exit_code", 0}, {"seconds", 1.0}, {"data", std::move(data)}, {"stderr_tail", ""}};
}

json testcase(const std::string& key, json data, const std::string& outcome = "passed") {
  return {{"key", key},
          {"outcome", outcome},
          {"reason", nullptr},
          {"notes", json::array()},
          {"data", std::move(data)}};
}

json copy(const std::string& key, double bytes, double gbps) {
  return testcase(key, {{"sizes", {{{"bytes", bytes}, {"bandwidth_gbps", {{"median", gbps}}}}}}});
}

// A pcie stage: pinned 50 GB/s each way on a 62.5 GB/s link, pageable 10 and 40 GB/s.
json pcie_stage(const std::string& h2d_verdict, double h2d_efficiency) {
  const double gib = 1 << 30;
  json verdicts = {
      {{"direction", "host_to_device"}, {"verdict", h2d_verdict}, {"efficiency", h2d_efficiency}},
      {{"direction", "device_to_host"}, {"verdict", "healthy"}, {"efficiency", 0.8}}};
  return stage(
      "bench.pcie",
      {{"testcases",
        {copy("host_to_device_memcpy_ce_pinned", gib, 50),
         copy("device_to_host_memcpy_ce_pinned", gib, 50),
         copy("host_to_device_memcpy_ce_pageable", gib, 10),
         copy("device_to_host_memcpy_ce_pageable", gib, 40),
         testcase("pcie_link_verdict",
                  {{"compared_bytes", gib},
                   {"link", {{"generation", 5}, {"width", 16}, {"theoretical_gbps", 62.5}}},
                   {"verdicts", verdicts}})}}});
}

TEST(Judge, HealthyLinkWithPageableAdvice) {
  json s = pcie_stage("healthy", 0.8);
  std::vector<Action> actions;
  judge_stage(s, actions);
  EXPECT_EQ(s["verdict"], "healthy");
  const json& checks = s["data"]["testcases"][4]["checks"];
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[0]["verdict"], "healthy");
  EXPECT_DOUBLE_EQ(checks[0]["measured"].get<double>(), 0.8 * 62.5);
  EXPECT_DOUBLE_EQ(checks[0]["reference"].get<double>(), 62.5);
  // The worse direction: 10 of 50 GB/s = 20% (the other is 80%).
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].id, "pcie.pin_host_memory");
  EXPECT_EQ(actions[0].headline, "pageable copies at 20% of pinned: pin your memory");
  EXPECT_DOUBLE_EQ(actions[0].gain, 5.0);
  EXPECT_EQ(actions[0].verdict, Verdict::kInfo);
}

TEST(Judge, SlowLinkWarnsAndFailingLinkFails) {
  json warn = pcie_stage("warn", 0.78);
  std::vector<Action> actions;
  judge_stage(warn, actions);
  EXPECT_EQ(warn["verdict"], "warning");
  ASSERT_FALSE(actions.empty());
  EXPECT_EQ(actions[0].id, "pcie.link_slow.host_to_device");
  EXPECT_EQ(actions[0].verdict, Verdict::kWarning);
  json fail = pcie_stage("fail", 0.5);
  judge_stage(fail, actions);
  EXPECT_EQ(fail["verdict"], "failing");
}

TEST(Judge, MissedDevelopmentTargetIsInfoNotAWarning) {
  json rows = {{{"m", 1},
                {"gpuopt_fp16_us", 40.0},
                {"cublas_fp16_us", 120.0},
                {"speedup_vs_cublas_fp16", 3.0}}};
  json s =
      stage("bench.gemm",
            {{"testcases",
              {testcase("k8192_n28672",
                        {{"k", 8192}, {"n", 28672}, {"rows", rows}, {"targets_met", false}})}}});
  s["exit_code"] = 1;  // what bench gemm exits with for missed targets
  std::vector<Action> actions;
  judge_stage(s, actions);
  EXPECT_EQ(s["verdict"], "info");
  const json& check = s["data"]["testcases"][0]["checks"][0];
  EXPECT_EQ(check["development_target"], true);
  EXPECT_EQ(check["verdict"], "info");
  EXPECT_NE(s["verdict_summary"].get<std::string>().find("development target"), std::string::npos);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_DOUBLE_EQ(actions[0].gain, 3.0);
}

TEST(Judge, TestcaseChecksAreKeptAndFailuresFail) {
  json own = testcase("custom", json::object());
  own["checks"] = {
      {{"id", "x"}, {"verdict", "warning"}, {"summary", "own"}, {"development_target", false}}};
  json s = stage("bench.vector",
                 {{"testcases", {own, testcase("exact-cpu", {{"criteria_met", false}})}}});
  std::vector<Action> actions;
  judge_stage(s, actions);
  EXPECT_EQ(s["data"]["testcases"][0]["verdict"], "warning");
  EXPECT_EQ(s["data"]["testcases"][1]["verdict"], "failing");  // exact search gave wrong answers
  EXPECT_EQ(s["verdict"], "failing");

  json crashed = stage("bench.loader", nullptr, "failed");
  judge_stage(crashed, actions);
  EXPECT_EQ(crashed["verdict"], "failing");
}

TEST(Judge, StreamsPartitionActionQuotesTheFigures) {
  json modes = {{{"mode", "critical_alone"}, {"critical_p99_us", 26.0}},
                {{"mode", "high_priority"}, {"critical_p99_us", 1.0e6}},
                {{"mode", "sm_partition"},
                 {"critical_p99_us", 40.0},
                 {"isolated_sms", true},
                 {"critical_sms", 8}}};
  json s =
      stage("bench.streams",
            {{"testcases",
              {testcase("contention", {{"modes", modes}, {"workload", {{"sm_count", 132}}}})}}});
  std::vector<Action> actions;
  judge_stage(s, actions);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].headline,
            "stream priorities leave a critical task waiting 1.00 s (p99) under load while an SM "
            "partition holds it at 40 µs: use a partition");
  EXPECT_DOUBLE_EQ(actions[0].gain, 25000);
}

TEST(Judge, ReportVerdictSkippedStagesAndRanking) {
  json doctor = stage("doctor", {{"findings",
                                  {{{"id", "pcie.aspm"},
                                    {"severity", "warning"},
                                    {"summary", "ASPM saves power on the GPU's link"},
                                    {"evidence", {{"policy", "powersave"}}},
                                    {"fix", "pcie_aspm=off"}}}}});
  json report = {
      {"stages",
       {doctor, pcie_stage("healthy", 0.8), stage("bench.gemm", {{"skipped", "no CUDA device"}}),
        stage("pipeline", nullptr, "skipped")}}};
  report["stages"][3]["reason"] = "skipped by --skip";
  judge_report(report);
  EXPECT_EQ(report["verdict"]["verdict"], "warning");
  EXPECT_EQ(report["verdict"]["exit_code"], 1);
  ASSERT_EQ(report["verdict"]["skipped"].size(), 2u);
  EXPECT_EQ(report["verdict"]["skipped"][1]["reason"], "skipped by --skip");
  // The warning's fix comes before advice with a larger gain.
  ASSERT_EQ(report["actions"].size(), 2u);
  EXPECT_EQ(report["actions"][0]["id"], "doctor.pcie.aspm");
  EXPECT_EQ(report["actions"][1]["id"], "pcie.pin_host_memory");
  EXPECT_EQ(report["stages"][0]["data"]["findings"][0]["verdict"], "warning");

  // A bench whose build has no testcases measured nothing: skipped, not healthy.
  json quiet = {{"stages",
                 {stage("bench.gemm", {{"skipped", "no CUDA device"}}),
                  stage("bench.scaler", {{"testcases", json::array()}})}}};
  judge_report(quiet);
  EXPECT_EQ(quiet["verdict"]["verdict"], "info");
  EXPECT_EQ(quiet["verdict"]["skipped"].size(), 2u) << quiet.dump();
  EXPECT_EQ(quiet["stages"][1]["verdict"], "info");
  EXPECT_EQ(quiet["verdict"]["exit_code"], 0);
}

}  // namespace
}  // namespace gpuopt::report
