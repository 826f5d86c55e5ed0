// Testcase registry runner, statistics, tables and JSON for every bench family.
#include "gpuopt/bench/testcase.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include "gpuopt/core/progress.hpp"

namespace gpuopt::bench {

namespace {

// Linear interpolation between closest ranks (numpy's default), q in [0, 1].
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double position = q * static_cast<double>(sorted.size() - 1);
  auto lower = static_cast<std::size_t>(std::floor(position));
  auto upper = static_cast<std::size_t>(std::ceil(position));
  double weight = position - static_cast<double>(lower);
  return sorted[lower] * (1 - weight) + sorted[upper] * weight;
}

}  // namespace

Summary summarize(std::span<const double> samples) {
  Summary summary;
  summary.count = samples.size();
  if (samples.empty()) return summary;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  summary.min = sorted.front();
  summary.max = sorted.back();
  summary.median = quantile(sorted, 0.5);
  summary.p10 = quantile(sorted, 0.10);
  summary.p90 = quantile(sorted, 0.90);
  summary.p99 = quantile(sorted, 0.99);
  summary.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / sorted.size();
  double squares = 0;
  for (double value : sorted) squares += (value - summary.mean) * (value - summary.mean);
  summary.stddev = sorted.size() > 1 ? std::sqrt(squares / (sorted.size() - 1)) : 0;
  return summary;
}

nlohmann::json to_json(const Summary& s) {
  return {{"count", s.count}, {"median", s.median}, {"mean", s.mean},
          {"min", s.min},     {"max", s.max},       {"stddev", s.stddev},
          {"p10", s.p10},     {"p90", s.p90},       {"p99", s.p99}};
}

std::string render_table(const Table& table) {
  std::vector<std::size_t> widths(table.columns.size(), 0);
  for (std::size_t c = 0; c < table.columns.size(); ++c) widths[c] = table.columns[c].size();
  for (const auto& row : table.rows) {
    for (std::size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  auto append_row = [&](const std::vector<std::string>& cells) {
    for (std::size_t c = 0; c < widths.size(); ++c) {
      const std::string& cell = c < cells.size() ? cells[c] : std::string();
      // First column left-aligned (labels), the rest right-aligned (numbers).
      out += c == 0 ? fmt::format("{:<{}}", cell, widths[c])
                    : fmt::format("  {:>{}}", cell, widths[c]);
    }
    out += '\n';
  };
  append_row(table.columns);
  std::size_t total = 0;
  for (std::size_t w : widths) total += w + 2;
  out += std::string(total > 2 ? total - 2 : 0, '-') + '\n';
  for (const auto& row : table.rows) append_row(row);
  return out;
}

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPassed:
      return "passed";
    case Outcome::kWaived:
      return "waived";
    case Outcome::kFailed:
      return "failed";
  }
  return "failed";
}

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHealthy:
      return "healthy";
    case Verdict::kInfo:
      return "info";
    case Verdict::kWarning:
      return "warning";
    case Verdict::kFailing:
      return "failing";
  }
  return "failing";
}

std::optional<Verdict> parse_verdict(std::string_view name) {
  for (Verdict verdict :
       {Verdict::kHealthy, Verdict::kInfo, Verdict::kWarning, Verdict::kFailing}) {
    if (verdict_name(verdict) == name) return verdict;
  }
  return std::nullopt;
}

int exit_code_for(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHealthy:
    case Verdict::kInfo:
      return 0;
    case Verdict::kWarning:
      return 1;
    case Verdict::kFailing:
      return 2;
  }
  return 2;
}

Verdict counted_verdict(const Check& check) {
  return check.development_target ? std::min(check.verdict, Verdict::kInfo) : check.verdict;
}

Check development_target(std::string id, bool met, std::string summary) {
  Check check;
  check.id = std::move(id);
  check.verdict = Verdict::kInfo;
  check.summary = fmt::format("development target {}: {}", met ? "met" : "not met", summary);
  check.development_target = true;
  return check;
}

nlohmann::json to_json(const Check& check) {
  auto optional = [](const std::optional<double>& value) {
    return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  };
  return {{"id", check.id},
          {"verdict", verdict_name(counted_verdict(check))},
          {"summary", check.summary},
          {"measured", optional(check.measured)},
          {"reference", optional(check.reference)},
          {"unit", check.unit},
          {"reference_name", check.reference_name},
          {"development_target", check.development_target}};
}

Verdict verdict_of(const TestcaseResult& result) {
  if (result.outcome == Outcome::kFailed) return Verdict::kFailing;
  if (result.outcome == Outcome::kWaived) return Verdict::kInfo;
  Verdict verdict = Verdict::kHealthy;
  for (const Check& check : result.checks) verdict = worst(verdict, counted_verdict(check));
  return verdict;
}

Verdict verdict_of(const std::vector<TestcaseResult>& results) {
  Verdict verdict = Verdict::kHealthy;
  for (const auto& result : results) verdict = worst(verdict, verdict_of(result));
  return verdict;
}

int verdict_exit_code(const std::vector<TestcaseResult>& results) {
  return exit_code_for(verdict_of(results));
}

std::vector<TestcaseResult> Suite::run(BenchContext& context) const {
  std::vector<TestcaseResult> results;
  const auto& only = context.options().only;
  auto selected = [&only](const std::string& key) {
    return only.empty() || std::find(only.begin(), only.end(), key) != only.end();
  };
  std::size_t count = 0;
  for (const auto& testcase : testcases_) count += selected(testcase->key()) ? 1 : 0;
  ProgressOptions progress_options;
  progress_options.enabled = context.options().progress;
  progress_options.label = "bench " + name_;
  progress_options.unit = "testcase";
  progress_options.total = static_cast<double>(count);
  ProgressLine progress(std::move(progress_options));
  std::size_t index = 0;
  for (const auto& testcase : testcases_) {
    const std::string key = testcase->key();
    if (!selected(key)) continue;
    context.set_progress_callback([&progress, &index, &key](double fraction) {
      progress.update(static_cast<double>(index) + std::clamp(fraction, 0.0, 1.0), key);
    });
    TestcaseResult result;
    result.key = key;
    result.description = testcase->description();
    if (Status filter = testcase->filter(context); !filter.ok()) {
      result.outcome = Outcome::kWaived;
      result.reason = filter.message();
      result.reason_code = status_code_name(filter.code());
    } else {
      context.progress(0);
      StatusOr<TestcaseResult> ran = testcase->run(context);
      if (ran.ok()) {
        result = std::move(ran).value();
        result.key = key;
        if (result.description.empty()) result.description = testcase->description();
      } else {
        result.outcome = Outcome::kFailed;
        result.reason = ran.status().message();
        result.reason_code = status_code_name(ran.status().code());
      }
      context.progress(1);
    }
    results.push_back(std::move(result));
    ++index;
  }
  context.set_progress_callback(nullptr);
  return results;
}

nlohmann::json to_json(const std::string& suite, const std::vector<TestcaseResult>& results) {
  nlohmann::json testcases = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json item = {{"key", r.key},
                           {"description", r.description},
                           {"outcome", outcome_name(r.outcome)},
                           {"verdict", verdict_name(verdict_of(r))},
                           {"notes", r.notes},
                           {"data", r.data.is_null() ? nlohmann::json::object() : r.data}};
    item["reason"] = r.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.reason);
    item["reason_code"] =
        r.reason_code.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.reason_code);
    nlohmann::json checks = nlohmann::json::array();
    for (const Check& check : r.checks) checks.push_back(to_json(check));
    item["checks"] = std::move(checks);
    testcases.push_back(std::move(item));
  }
  return {{"schema_version", 1},
          {"suite", suite},
          {"verdict", verdict_name(verdict_of(results))},
          {"testcases", std::move(testcases)}};
}

std::string render_text(const std::string& suite, const std::vector<TestcaseResult>& results) {
  std::string out = fmt::format("gpuopt bench {}\n", suite);
  for (const auto& r : results) {
    out += fmt::format("\n== {} ({}, {}): {}\n", r.key, outcome_name(r.outcome),
                       verdict_name(verdict_of(r)), r.description);
    if (!r.reason.empty()) out += fmt::format("   {}\n", r.reason);
    if (!r.table.columns.empty()) out += render_table(r.table);
    for (const auto& check : r.checks) {
      out += fmt::format("   [{}] {}\n", verdict_name(counted_verdict(check)), check.summary);
    }
    for (const auto& note : r.notes) out += fmt::format("   * {}\n", note);
  }
  return out;
}

StatusOr<std::vector<std::size_t>> parse_sizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    start = end + 1;
    // Trim spaces.
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty()) return invalid_argument(fmt::format("--sizes: empty item in '{}'", text));
    std::size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) ++digits;
    if (digits == 0 || digits > 12) {
      return invalid_argument(fmt::format("--sizes: '{}' does not start with a number", item));
    }
    std::size_t value = std::stoull(item.substr(0, digits));
    std::string suffix = item.substr(digits);
    for (auto& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    std::size_t multiplier = 0;
    if (suffix.empty() || suffix == "B")
      multiplier = 1;
    else if (suffix == "K" || suffix == "KB" || suffix == "KIB")
      multiplier = 1ull << 10;
    else if (suffix == "M" || suffix == "MB" || suffix == "MIB")
      multiplier = 1ull << 20;
    else if (suffix == "G" || suffix == "GB" || suffix == "GIB")
      multiplier = 1ull << 30;
    else
      return invalid_argument(fmt::format("--sizes: unknown unit '{}' in '{}'", suffix, item));
    if (value == 0) return invalid_argument(fmt::format("--sizes: '{}' is zero bytes", item));
    sizes.push_back(value * multiplier);
    if (end == text.size()) break;
  }
  return sizes;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace gpuopt::bench
