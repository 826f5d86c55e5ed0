// What every `gpuopt bench NAME` command shares: the flags (-o/--output, --json, -q/--quiet,
// --only NAMES, --list) and the run (--list, --only checked against the family's testcases with a
// "did you mean", the progress line, text or JSON to stdout or --output). Each command keeps its
// own options and its family's exit-code rule.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gpuopt/bench/testcase.hpp"
#include "output_options.hpp"

namespace gpuopt::cli {

struct BenchCommandArgs {
  OutputOptions output;
  std::vector<std::string> only;  // --only (and its old spelling --testcase)
  bool list = false;
};

// Adds -o/--output, --json, -q/--quiet, --only NAMES (a comma list; --testcase is kept as a
// hidden alias) and --list to `command`. `example` names a testcase or two for the help text.
void add_bench_flags(CLI::App& command, BenchCommandArgs& args, const std::string& example);

struct BenchFamily {
  std::string name;  // "pcie"
  // The family's testcases for --list and for checking --only: made without touching a device.
  std::function<bench::Suite()> catalogue;
  // The suite to run (may detect the device); empty = the catalogue.
  std::function<bench::Suite()> make_suite;
  // The family's exit-code rule over its results.
  std::function<int(const std::vector<bench::TestcaseResult>&)> exit_code_for;
};

// Checks --output (exit 2 when unusable), answers --list (exit 0), checks --only (exit 2 with the
// nearest testcase), then runs the suite with a progress line (a terminal only, not with --json
// or --quiet) and writes text or JSON. Returns the exit code.
int run_bench_command(const BenchFamily& family, bench::BenchOptions options,
                      const BenchCommandArgs& args);

// The first key of `only` that `suite` lacks, as "unknown testcase 'x'; did you mean 'y'? ..."
// (INVALID_ARGUMENT); OK when every key is known.
Status check_selection(const std::string& family, const bench::Suite& suite,
                       const std::vector<std::string>& only);

// The list --list prints: one line per testcase, key then description (text), or
// {"suite", "testcases": [{"key", "description"}]} (json).
std::string render_testcase_list(const bench::Suite& suite, bool json);

// Runs a suite and prints its results to stdout (text, or JSON with `json`); for commands that do
// not use run_bench_command yet.
std::vector<bench::TestcaseResult> run_and_print(const bench::Suite& suite,
                                                 const bench::BenchOptions& options, bool json);

}  // namespace gpuopt::cli
