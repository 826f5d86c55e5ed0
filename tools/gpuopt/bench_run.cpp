// Shared flags and run of the `gpuopt bench` commands (bench_run.hpp).
#include "bench_run.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "command_registry.hpp"
#include "gpuopt/core/suggest.hpp"

namespace gpuopt::cli {

void add_bench_flags(CLI::App& command, BenchCommandArgs& args, const std::string& example) {
  add_output_flags(command, args.output, OutputFlags::with_quiet());
  command
      .add_option(
          "--only", args.only,
          fmt::format("Run only these testcases, a comma list (e.g. {}); see --list", example))
      ->delimiter(',')
      ->type_name("NAMES");
  command.add_option("--testcase", args.only)->delimiter(',')->group("");
  command.add_flag("--list", args.list, "Print the testcases with a line on each, then exit");
}

Status check_selection(const std::string& family, const bench::Suite& suite,
                       const std::vector<std::string>& only) {
  std::vector<std::string> keys;
  for (const auto& testcase : suite.testcases()) keys.push_back(testcase->key());
  for (const auto& key : only) {
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    if (keys.empty()) {
      return invalid_argument(fmt::format(
          "--only: unknown testcase '{}': this build has no {} testcases", key, family));
    }
    const auto near = closest_match(key, keys);
    return invalid_argument(fmt::format(
        "--only: unknown testcase '{}'{}; `gpuopt bench {} --list` shows all {}", key,
        near ? fmt::format(" (did you mean '{}'?)", *near) : std::string(), family, keys.size()));
  }
  return ok_status();
}

std::string render_testcase_list(const bench::Suite& suite, bool json) {
  if (json) {
    nlohmann::json testcases = nlohmann::json::array();
    for (const auto& testcase : suite.testcases()) {
      testcases.push_back({{"key", testcase->key()}, {"description", testcase->description()}});
    }
    return nlohmann::json{{"schema_version", 1}, {"suite", suite.name()}, {"testcases", testcases}}
               .dump(2) +
           "\n";
  }
  std::size_t width = 0;
  for (const auto& testcase : suite.testcases()) width = std::max(width, testcase->key().size());
  std::string out;
  for (const auto& testcase : suite.testcases()) {
    out += fmt::format("{:<{}}  {}\n", testcase->key(), width, testcase->description());
  }
  return out;
}

namespace {

std::string render_results(const bench::Suite& suite,
                           const std::vector<bench::TestcaseResult>& results, bool json) {
  return json ? bench::to_json(suite.name(), results).dump(2) + "\n"
              : bench::render_text(suite.name(), results);
}

}  // namespace

int run_bench_command(const BenchFamily& family, bench::BenchOptions options,
                      const BenchCommandArgs& args) {
  const std::string command = "bench " + family.name;
  if (!output_usable(command, args.output)) return kExitErrors;
  const bench::Suite catalogue = family.catalogue();
  if (args.list) {
    return write_output(command, args.output, render_testcase_list(catalogue, args.output.json))
               ? kExitOk
               : kExitToolFailed;
  }
  if (Status selection = check_selection(family.name, catalogue, args.only); !selection.ok()) {
    print_error(command, selection);
    return kExitErrors;
  }
  options.only = args.only;
  options.progress = progress_wanted(args.output);
  const bench::Suite suite = family.make_suite ? family.make_suite() : family.catalogue();
  bench::BenchContext context(options);
  const std::vector<bench::TestcaseResult> results = suite.run(context);
  if (!write_output(command, args.output, render_results(suite, results, args.output.json))) {
    return kExitToolFailed;
  }
  return family.exit_code_for(results);
}

std::vector<bench::TestcaseResult> run_and_print(const bench::Suite& suite,
                                                 const bench::BenchOptions& options, bool json) {
  bench::BenchContext context(options);
  std::vector<bench::TestcaseResult> results = suite.run(context);
  const std::string text = render_results(suite, results, json);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return results;
}

}  // namespace gpuopt::cli
