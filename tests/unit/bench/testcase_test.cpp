// The bench registry: waivers, recorded failures, statistics and size parsing.
#include "gpuopt/bench/testcase.hpp"

#include <gtest/gtest.h>

namespace gpuopt::bench {
namespace {

class FixedTestcase : public Testcase {
 public:
  FixedTestcase(std::string key, Status filter, Status run)
      : key_(key), filter_(filter), run_(run) {}
  std::string key() const override { return key_; }
  std::string description() const override { return "fixture " + key_; }
  Status filter(const BenchContext&) const override { return filter_; }
  StatusOr<TestcaseResult> run(BenchContext&) override {
    if (!run_.ok()) return run_;
    TestcaseResult result;
    result.data = {{"value", 1}};
    return result;
  }

 private:
  std::string key_;
  Status filter_, run_;
};

TEST(Summary, MedianAndQuantilesOfAKnownSample) {
  std::vector<double> samples = {5, 1, 4, 2, 3};
  Summary s = summarize(samples);
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);  // numpy.percentile([1..5], 10)
  EXPECT_DOUBLE_EQ(s.p90, 4.6);
  EXPECT_NEAR(s.stddev, 1.5811388, 1e-6);
  std::vector<double> even = {1, 2, 3, 10};
  EXPECT_DOUBLE_EQ(summarize(even).median, 2.5);
  EXPECT_EQ(summarize(std::span<const double>()).count, 0u);
}

TEST(Suite, WaivesFailsAndRunsIndependently) {
  Suite suite("fixture");
  suite.add(std::make_unique<FixedTestcase>("a", unavailable("no GPU"), ok_status()));
  suite.add(std::make_unique<FixedTestcase>("b", ok_status(), internal_error("copy mismatch")));
  suite.add(std::make_unique<FixedTestcase>("c", ok_status(), ok_status()));
  BenchContext context{BenchOptions{}};
  auto results = suite.run(context);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].outcome, Outcome::kWaived);
  EXPECT_EQ(results[0].reason, "no GPU");
  EXPECT_EQ(results[1].outcome, Outcome::kFailed);
  EXPECT_NE(results[1].reason.find("copy mismatch"), std::string::npos);
  EXPECT_EQ(results[2].outcome, Outcome::kPassed);
  EXPECT_EQ(results[2].key, "c");
  EXPECT_EQ(results[2].description, "fixture c");

  nlohmann::json json = to_json("fixture", results);
  EXPECT_EQ(json["schema_version"], 1);
  EXPECT_EQ(json["testcases"][0]["outcome"], "waived");
  EXPECT_TRUE(json["testcases"][2]["reason"].is_null());
  EXPECT_EQ(json["testcases"][2]["data"]["value"], 1);
}

TEST(Suite, OnlySelectsByKey) {
  Suite suite("fixture");
  suite.add(std::make_unique<FixedTestcase>("a", ok_status(), ok_status()));
  suite.add(std::make_unique<FixedTestcase>("b", ok_status(), ok_status()));
  BenchOptions options;
  options.only = {"b"};
  BenchContext context{options};
  auto results = suite.run(context);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].key, "b");
}

TEST(ParseSizes, UnitsAndErrors) {
  auto sizes = parse_sizes("4K, 1MiB,256M,1G,512");
  ASSERT_TRUE(sizes.ok()) << sizes.status().to_string();
  EXPECT_EQ(*sizes, (std::vector<std::size_t>{4096, 1 << 20, 256u << 20, 1u << 30, 512}));
  EXPECT_FALSE(parse_sizes("4X").ok());
  EXPECT_NE(parse_sizes("4K,,8K").status().message().find("empty item"), std::string::npos);
  EXPECT_NE(parse_sizes("abc").status().message().find("'abc'"), std::string::npos);
  EXPECT_FALSE(parse_sizes("0").ok());
}

TEST(Table, AlignsColumns) {
  Table table{{"size", "GB/s"}, {{"4 KiB", "1.5"}, {"1 GiB", "55.25"}}};
  EXPECT_EQ(render_table(table),
            "size    GB/s\n"
            "------------\n"
            "4 KiB    1.5\n"
            "1 GiB  55.25\n");
  EXPECT_EQ(format_bytes(256u << 20), "256 MiB");
  EXPECT_EQ(format_bytes(1000), "1000 B");
}

// A testcase that reports the checks it was built with.
class CheckedTestcase : public Testcase {
 public:
  explicit CheckedTestcase(std::vector<Check> checks) : checks_(std::move(checks)) {}
  std::string key() const override { return "checked"; }
  std::string description() const override { return "fixture with checks"; }
  StatusOr<TestcaseResult> run(BenchContext&) override {
    TestcaseResult result;
    result.checks = checks_;
    return result;
  }

 private:
  std::vector<Check> checks_;
};

Check check_of(const std::string& id, Verdict verdict) {
  Check check;
  check.id = id;
  check.verdict = verdict;
  check.summary = id;
  return check;
}

TEST(Verdict, NamesRoundTripAndOrder) {
  for (Verdict v : {Verdict::kHealthy, Verdict::kInfo, Verdict::kWarning, Verdict::kFailing}) {
    EXPECT_EQ(parse_verdict(verdict_name(v)), v);
  }
  EXPECT_FALSE(parse_verdict("fine").has_value());
  EXPECT_EQ(worst(Verdict::kInfo, Verdict::kWarning), Verdict::kWarning);
  EXPECT_EQ(worst(Verdict::kFailing, Verdict::kHealthy), Verdict::kFailing);
  EXPECT_EQ(exit_code_for(Verdict::kHealthy), 0);
  EXPECT_EQ(exit_code_for(Verdict::kInfo), 0);
  EXPECT_EQ(exit_code_for(Verdict::kWarning), 1);
  EXPECT_EQ(exit_code_for(Verdict::kFailing), 2);
}

TEST(Verdict, TestcaseIsTheWorstOfItsChecksAndOutcome) {
  TestcaseResult result;
  EXPECT_EQ(verdict_of(result), Verdict::kHealthy);  // passed, nothing judged
  result.checks = {check_of("a", Verdict::kHealthy), check_of("b", Verdict::kWarning)};
  EXPECT_EQ(verdict_of(result), Verdict::kWarning);
  result.outcome = Outcome::kWaived;
  EXPECT_EQ(verdict_of(result), Verdict::kInfo);
  result.outcome = Outcome::kFailed;
  EXPECT_EQ(verdict_of(result), Verdict::kFailing);
}

TEST(Verdict, DevelopmentTargetNeverFailsAHealthyMachine) {
  Check missed = check_of("speedup_target", Verdict::kFailing);
  missed.development_target = true;
  EXPECT_EQ(counted_verdict(missed), Verdict::kInfo);
  Check target = development_target("speedup_target", false, "3.04x of the 3.3x goal");
  EXPECT_EQ(target.verdict, Verdict::kInfo);
  EXPECT_TRUE(target.development_target);
  EXPECT_NE(target.summary.find("not met"), std::string::npos);

  Suite suite("fixture");
  suite.add(std::make_unique<CheckedTestcase>(
      std::vector<Check>{check_of("link", Verdict::kHealthy), missed}));
  BenchContext context{BenchOptions{}};
  auto results = suite.run(context);
  EXPECT_EQ(verdict_of(results), Verdict::kInfo);
  EXPECT_EQ(verdict_exit_code(results), 0);

  nlohmann::json json = to_json("fixture", results);
  EXPECT_EQ(json["verdict"], "info");
  EXPECT_EQ(json["testcases"][0]["verdict"], "info");
  ASSERT_EQ(json["testcases"][0]["checks"].size(), 2u);
  EXPECT_EQ(json["testcases"][0]["checks"][1]["verdict"], "info");
  EXPECT_EQ(json["testcases"][0]["checks"][1]["development_target"], true);
  // A real warning beside it still counts.
  results[0].checks.push_back(check_of("pageable", Verdict::kWarning));
  EXPECT_EQ(verdict_exit_code(results), 1);
  EXPECT_NE(render_text("fixture", results).find("[warning] pageable"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::bench
