// PCIe bench logic without a GPU: bandwidth and efficiency arithmetic, verdict thresholds,
// explanations, exit codes, the data pattern's CPU twin, and the no-GPU waivers with valid JSON.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gpuopt/bench/pcie.hpp"
#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::bench::pcie {
namespace {

LinkInfo gen5_x16() {
  LinkInfo link;
  link.bus_id = "0000:1b:00.0";
  link.generation = 5;
  link.width = 16;
  link.current_width = 16;
  link.theoretical_gbps = 32.0 * 16 * 128.0 / 130.0 / 8.0;  // 63.015 GB/s, by hand
  return link;
}

TEST(PcieVerdict, BandwidthFromBytesAndMilliseconds) {
  // 1 GiB in 20 ms = 1073741824 / 0.020 / 1e9 = 53.687 GB/s.
  EXPECT_NEAR(bandwidth_gbps(1073741824.0, 20.0), 53.6870912, 1e-6);
  EXPECT_EQ(bandwidth_gbps(1e9, 0.0), 0.0);
  EXPECT_EQ(bandwidth_gbps(1e9, -1.0), 0.0);
}

TEST(PcieVerdict, EfficiencyAndThresholds) {
  EXPECT_NEAR(*link_efficiency(54.0, 63.0154), 0.85694, 1e-4);
  EXPECT_FALSE(link_efficiency(54.0, std::nullopt).has_value());
  EXPECT_FALSE(link_efficiency(54.0, 0.0).has_value());
  EXPECT_EQ(verdict_for(0.80), Verdict::kHealthy);
  EXPECT_EQ(verdict_for(0.95), Verdict::kHealthy);
  EXPECT_EQ(verdict_for(0.7999), Verdict::kWarn);
  EXPECT_EQ(verdict_for(0.76), Verdict::kWarn);
  EXPECT_EQ(verdict_for(0.7599), Verdict::kFail);
  EXPECT_EQ(verdict_for(0.10), Verdict::kFail);
  EXPECT_EQ(verdict_for(1.2), Verdict::kUnknown);  // the reported link cannot be the real one
  EXPECT_EQ(verdict_for(std::nullopt), Verdict::kUnknown);
  EXPECT_EQ(verdict_name(Verdict::kWarn), "warn");
}

TEST(PcieVerdict, HealthyLinkWithPageableAndRemoteExplanations) {
  DirectionFigures figures;
  figures.direction = "host_to_device";
  figures.bytes = 256ull << 20;
  figures.pinned_local_gbps = 55.0;
  figures.pageable_gbps = 20.0;
  figures.pinned_remote_gbps = 40.0;
  figures.remote_node = 1;
  DirectionVerdict verdict = judge_direction(figures, gen5_x16());
  EXPECT_EQ(verdict.verdict, Verdict::kHealthy);
  ASSERT_TRUE(verdict.efficiency.has_value());
  EXPECT_NEAR(*verdict.efficiency, 55.0 / 63.01538, 1e-4);
  std::string all;
  for (const auto& line : verdict.explanations) all += line + "\n";
  EXPECT_NE(all.find("pageable memory reaches 20.0 GB/s, 36%"), std::string::npos) << all;
  EXPECT_NE(all.find("NUMA node 1 reaches 40.0 GB/s, 73%"), std::string::npos) << all;
  nlohmann::json json = to_json(verdict);
  EXPECT_EQ(json["verdict"], "healthy");
}

TEST(PcieVerdict, NarrowLinkFailsAndSaysWhy) {
  LinkInfo link = gen5_x16();
  link.current_width = 8;
  DirectionFigures figures;
  figures.direction = "device_to_host";
  figures.bytes = 1ull << 30;
  figures.pinned_local_gbps = 27.0;
  DirectionVerdict verdict = judge_direction(figures, link);
  EXPECT_EQ(verdict.verdict, Verdict::kFail);
  std::string all;
  for (const auto& line : verdict.explanations) all += line + "\n";
  EXPECT_NE(all.find("x8 of its x16"), std::string::npos) << all;
}

TEST(PcieVerdict, UnknownLinkOrMissingFigure) {
  DirectionFigures figures;
  figures.direction = "host_to_device";
  EXPECT_EQ(judge_direction(figures, gen5_x16()).verdict, Verdict::kUnknown);
  figures.pinned_local_gbps = 50.0;
  EXPECT_EQ(judge_direction(figures, LinkInfo{}).verdict, Verdict::kUnknown);
  figures.pinned_local_gbps = 48.5;  // 76.97%: warn
  EXPECT_EQ(judge_direction(figures, gen5_x16()).verdict, Verdict::kWarn);
}

TEST(PcieVerdict, ExitCodeFollowsVerdictsAndFailures) {
  auto with_verdict = [](const char* name) {
    TestcaseResult result;
    result.data = {
        {"verdicts", nlohmann::json::array({{{"verdict", "healthy"}}, {{"verdict", name}}})}};
    return result;
  };
  EXPECT_EQ(exit_code_for({with_verdict("healthy")}), 0);
  EXPECT_EQ(exit_code_for({with_verdict("unknown")}), 0);
  EXPECT_EQ(exit_code_for({with_verdict("warn")}), 1);
  EXPECT_EQ(exit_code_for({with_verdict("fail")}), 2);
  TestcaseResult waived;
  waived.outcome = Outcome::kWaived;
  EXPECT_EQ(exit_code_for({waived}), 0);
  TestcaseResult failed;
  failed.outcome = Outcome::kFailed;
  EXPECT_EQ(exit_code_for({waived, failed, with_verdict("warn")}), 2);
}

TEST(PcieVerdict, PatternDetectsCorruptionAndPrefixesAgree) {
  std::mt19937_64 random(std::random_device{}());
  const std::uint64_t seed = random();
  const std::size_t bytes = 4096 + 13;  // a partial last word
  std::vector<unsigned char> data(bytes, 0xA5);
  EXPECT_GT(count_mismatches_reference(data.data(), bytes, seed), bytes / 2);  // poisoned
  fill_pattern_reference(data.data(), bytes, seed);
  EXPECT_EQ(count_mismatches_reference(data.data(), bytes, seed), 0u);
  // Every prefix is the pattern of its own size (one fill serves a whole size sweep).
  std::vector<unsigned char> prefix(1001);
  fill_pattern_reference(prefix.data(), prefix.size(), seed);
  EXPECT_EQ(std::memcmp(prefix.data(), data.data(), prefix.size()), 0);
  // Flipped bytes are each counted, including in the tail.
  std::size_t a = random() % bytes, b = bytes - 1;
  data[a] ^= 0x01;
  if (b != a) data[b] ^= 0x80;
  EXPECT_EQ(count_mismatches_reference(data.data(), bytes, seed), a == b ? 1u : 2u);
  // Another seed does not match.
  fill_pattern_reference(data.data(), bytes, seed + 1);
  EXPECT_GT(count_mismatches_reference(data.data(), bytes, seed), bytes / 2);
  // Little-endian word layout (what the GPU kernel writes).
  std::uint64_t word = 0;
  std::memcpy(&word, data.data(), 8);
  EXPECT_EQ(word, pattern_word(0, seed + 1));
}

TEST(PcieVerdict, DefaultSweepAndKeys) {
  auto sizes = default_sizes(false);
  EXPECT_EQ(sizes.front(), 4096u);
  EXPECT_EQ(sizes.back(), 1ull << 30);
  EXPECT_TRUE(std::is_sorted(sizes.begin(), sizes.end()));
  auto keys = testcase_keys();
  EXPECT_NE(std::find(keys.begin(), keys.end(), "host_to_device_memcpy_ce_pinned"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "pcie_link_verdict"), keys.end());
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "duplicate key";
}

TEST(PcieVerdict, NoGpuWaivesEveryTestcaseWithReasonAndValidJson) {
  if (cuda_device_count().ok()) GTEST_SKIP() << "a GPU is present; the waiver path needs none";
  BenchOptions options;
  options.sizes = {4096};
  BenchContext context(options);
  Suite suite = make_suite(options);
  auto results = suite.run(context);
  ASSERT_EQ(results.size(), testcase_keys().size());
  for (const auto& result : results) {
    EXPECT_EQ(result.outcome, Outcome::kWaived) << result.key;
    EXPECT_FALSE(result.reason.empty()) << result.key;
  }
  EXPECT_EQ(exit_code_for(results), 0);
  std::string text = to_json(suite.name(), results).dump();
  nlohmann::json parsed = nlohmann::json::parse(text);
  EXPECT_EQ(parsed["suite"], "pcie");
  EXPECT_EQ(parsed["testcases"].size(), results.size());
}

}  // namespace
}  // namespace gpuopt::bench::pcie
