// Benchmarks as a registry of testcases (as nvbandwidth's testcase.h): each has a key, a
// description, a filter that waives it with a reason, and a run that returns its figures. An error
// in one testcase is recorded in its result and never stops the others.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::bench {

// Median and spread of repeated samples (all in the caller's unit).
struct Summary {
  std::size_t count = 0;
  double median = 0, mean = 0, min = 0, max = 0, stddev = 0;
  double p10 = 0, p90 = 0, p99 = 0;
  // (p90 - p10) / median: the spread quoted next to a median.
  double relative_spread() const { return median != 0 ? (p90 - p10) / median : 0; }
};
Summary summarize(std::span<const double> samples);
nlohmann::json to_json(const Summary& summary);

// Options shared by every bench family; each family reads what applies to it.
struct BenchOptions {
  bool quick = false;              // short run for `gpuopt audit`
  std::vector<std::size_t> sizes;  // bytes; empty = the family's default sweep
  int samples = 0;                 // 0 = the family's default
  int warmup = 0;                  // 0 = the family's default
  int device = 0;                  // CUDA device ordinal
  std::vector<std::string> only;   // testcase keys to run; empty = all
  bool progress = false;           // draw a progress line on stderr (core/progress.hpp)
  bool use_green_contexts = true;  // false: SM partitions fall back to priority streams
};

// A small text table for people; JSON carries the same figures for programs.
struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};
std::string render_table(const Table& table);

enum class Outcome { kPassed, kWaived, kFailed };
std::string_view outcome_name(Outcome outcome);

// What a result means for the machine, for people: healthy (as the hardware allows), info (nothing
// wrong: a skipped testcase, advice, a development target), warning (below what the hardware and
// the anchors measured in the same run say it can do), failing (wrong results, a broken link, a
// crash). Ordered: a testcase's verdict is the worst of its checks.
enum class Verdict { kHealthy = 0, kInfo = 1, kWarning = 2, kFailing = 3 };
std::string_view verdict_name(Verdict verdict);
std::optional<Verdict> parse_verdict(std::string_view name);
inline Verdict worst(Verdict a, Verdict b) { return a < b ? b : a; }
// The CLI's exit code for a verdict: 0 healthy or info, 1 warning, 2 failing.
int exit_code_for(Verdict verdict);

// One judged figure of a testcase: the measured value against a limit or an anchor (the link
// rate, a device copy, cuBLAS), with a sentence for people that quotes both.
struct Check {
  std::string id;  // stable within the testcase: "link_efficiency.host_to_device"
  Verdict verdict = Verdict::kHealthy;
  std::string summary;  // "pinned 1 GiB copies reach 55.4 GB/s, 88% of Gen5 x16"
  std::optional<double> measured;
  std::optional<double> reference;  // the limit or anchor it was judged against
  std::string unit;                 // of measured and reference: "GB/s", "us", "x"
  std::string reference_name;       // "link rate", "cuBLAS fp16", "device copy"
  // A goal the project set for its own code (the W4A16 GEMM's speedup over cuBLAS): whatever
  // verdict it carries, it is reported as info and never makes a healthy machine fail.
  bool development_target = false;
};
// The verdict a check counts with: a development target never counts above info.
Verdict counted_verdict(const Check& check);
// A development target met or missed: info either way, the summary says which.
Check development_target(std::string id, bool met, std::string summary);
nlohmann::json to_json(const Check& check);

struct TestcaseResult {
  std::string key;
  std::string description;
  Outcome outcome = Outcome::kPassed;
  std::string reason;       // why waived or failed, in plain words
  std::string reason_code;  // the status code behind `reason` ("UNAVAILABLE"); empty = none
  Table table;              // for the text report
  nlohmann::json data;      // figures, with units in the key names (bandwidth_gbps, latency_us)
  std::vector<std::string> notes;  // verdicts and explanations, one line each
  std::vector<Check> checks;       // judged figures; none = nothing judged beyond the outcome
};

// failed -> failing, waived -> info, passed -> the worst counted verdict of its checks (healthy
// when it has none).
Verdict verdict_of(const TestcaseResult& result);
// The worst testcase verdict (healthy for none).
Verdict verdict_of(const std::vector<TestcaseResult>& results);
// Exit code of a bench command that judges by verdicts (0 / 1 / 2 as exit_code_for(Verdict)).
int verdict_exit_code(const std::vector<TestcaseResult>& results);

class BenchContext;

class Testcase {
 public:
  virtual ~Testcase() = default;
  virtual std::string key() const = 0;
  virtual std::string description() const = 0;
  // Non-OK waives the testcase with the status message as reason (no GPU, one GPU only, ...).
  virtual Status filter(const BenchContext& context) const { return ok_status(); }
  virtual StatusOr<TestcaseResult> run(BenchContext& context) = 0;
};

// What testcases may share: options, a progress callback, and family-specific state.
class BenchContext {
 public:
  explicit BenchContext(BenchOptions options) : options_(std::move(options)) {}
  const BenchOptions& options() const { return options_; }
  // Reports progress within the running testcase (fraction in [0, 1]).
  void progress(double fraction) const {
    if (on_progress_) on_progress_(fraction);
  }
  void set_progress_callback(std::function<void(double)> callback) {
    on_progress_ = std::move(callback);
  }

 private:
  BenchOptions options_;
  std::function<void(double)> on_progress_;
};

// An ordered list of testcases, run one after another.
class Suite {
 public:
  explicit Suite(std::string name) : name_(std::move(name)) {}
  void add(std::unique_ptr<Testcase> testcase) { testcases_.push_back(std::move(testcase)); }
  const std::vector<std::unique_ptr<Testcase>>& testcases() const { return testcases_; }
  const std::string& name() const { return name_; }

  // Runs every selected testcase: filter → waived, run error → failed with the message.
  std::vector<TestcaseResult> run(BenchContext& context) const;

 private:
  std::string name_;
  std::vector<std::unique_ptr<Testcase>> testcases_;
};

// {"schema_version": 1, "suite": ..., "verdict": ..., "testcases": [...]}; each testcase carries
// its "verdict" and "checks", and a waived or failed one its "reason" and "reason_code".
nlohmann::json to_json(const std::string& suite, const std::vector<TestcaseResult>& results);
// Text for people: one block per testcase with its table and notes.
std::string render_text(const std::string& suite, const std::vector<TestcaseResult>& results);

// Parses "4K,1M,256MiB,1G" (K/M/G as KiB/MiB/GiB) into bytes; names the bad item.
StatusOr<std::vector<std::size_t>> parse_sizes(const std::string& text);
std::string format_bytes(std::size_t bytes);

}  // namespace gpuopt::bench
