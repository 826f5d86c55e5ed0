// The audit's verdicts and actions: each stage's testcases and findings judged against the
// hardware and the anchors measured in the same run, and what to do about it, ranked.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpuopt/bench/testcase.hpp"

namespace gpuopt::report {

using bench::Verdict;

// One thing the user can do, derived from measured figures (never from fixed numbers).
struct Action {
  std::string id;        // stable: "pcie.pin_host_memory"
  std::string stage;     // the stage whose data is the evidence
  std::string headline;  // "pageable copies at 16% of pinned: pin your memory"
  std::string evidence;  // the figures, with units and what they were measured on
  std::string fix;       // what to change, as exactly as the data allows
  // Expected gain as a factor (>= 1) of the figure the fix improves, from the same run's data;
  // 0 when the data gives none (a platform finding).
  double gain = 0;
  std::string gain_text;             // "6.3x copy bandwidth"
  Verdict verdict = Verdict::kInfo;  // warning/failing when it fixes a problem, else info
};
nlohmann::json to_json(const Action& action);

// Fixes for problems first (failing, then warning), then advice by expected gain.
void rank_actions(std::vector<Action>& actions);

// Judges one stage's record in place (the object report::to_json writes for a stage): sets
// "verdict" and "verdict_summary" on the stage, "verdict" and "checks" on every testcase, and
// "verdict" on every doctor finding; appends the actions its data supports. Checks a testcase
// already carries (bench::Check) are kept and counted.
void judge_stage(nlohmann::json& stage, std::vector<Action>& actions);

// Judges every stage of a report document (report::to_json's output) and sets its "verdict"
// object: {"verdict", "headline", "skipped": [...], "exit_code"} and the ranked "actions".
void judge_report(nlohmann::json& report);

// The stage's verdict as stored by judge_stage (failing when absent or unreadable).
Verdict stage_verdict(const nlohmann::json& stage);

}  // namespace gpuopt::report
