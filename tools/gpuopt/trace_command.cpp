// `gpuopt trace [-o FILE] [--summary-json FILE] [--json] -- CMD ARGS...`: traces a command through
// the CUPTI injection library, writes a Chrome trace and prints busy time beside NVML GPU-Util.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "command_registry.hpp"
#include "gpuopt/core/subprocess.hpp"
#include "gpuopt/trace/chrome_trace.hpp"
#include "gpuopt/trace/record_file.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/traced_run.hpp"
#include "gpuopt/trace/tracer.hpp"
#include "numeric_checks.hpp"
#include "output_options.hpp"

namespace gpuopt::cli {
namespace {

// The injection library's path when it is not where gpuopt looks (docs/trace.md); --inject-library
// takes precedence.
constexpr const char* kInjectLibraryEnv = "GPUOPT_TRACE_INJECT";

struct TraceArgs {
  std::string inject_library;
  std::string out = "gpuopt-trace.json";
  std::string summary_json;
  std::string records_json;
  bool json = false;  // the summary as JSON on stdout instead of text
  double nvml_period_s = 0.1;
  bool driver_api = false;
  std::vector<std::string> command;
};

int run_trace(const TraceArgs& args) {
  // Outputs are checked before the command starts: finding out afterwards loses the whole run.
  for (const std::string* path : {&args.out, &args.summary_json, &args.records_json}) {
    if (path == &args.out || !path->empty()) {
      if (Status usable = trace::check_output_path(*path); !usable.ok()) {
        std::fprintf(stderr, "gpuopt trace: %s\n", usable.message().c_str());
        return kExitErrors;
      }
    }
  }
  if (!trace::Tracer::built_with_cupti()) {
    std::fprintf(stderr,
                 "gpuopt trace: this gpuopt was built without CUDA, so it has no CUPTI tracer; "
                 "nothing was run\n");
    return kExitToolFailed;
  }
  auto executable = current_executable();
  if (!executable.ok()) {
    print_error("trace", executable.status());
    return kExitToolFailed;
  }
  std::string override_path = args.inject_library;
  std::string override_source = "--inject-library";
  if (const char* from_env = std::getenv(kInjectLibraryEnv);
      override_path.empty() && from_env != nullptr) {
    override_path = from_env;
    override_source = kInjectLibraryEnv;
  }
  auto library = trace::find_injection_library(*executable, override_path);
  if (!library.ok()) {
    const std::string hint =
        override_path.empty()
            ? fmt::format("; pass --inject-library PATH or set {}", kInjectLibraryEnv)
            : fmt::format(" (from {})", override_source);
    std::fprintf(stderr, "gpuopt trace: %s%s\n", plain_message(library.status()).c_str(),
                 hint.c_str());
    return kExitToolFailed;
  }
  trace::TracedRunOptions options;
  options.command = args.command;
  options.injection_library = *library;
  options.nvml_period_s = args.nvml_period_s;
  options.driver_api = args.driver_api;
  auto run = trace::run_traced(options);
  if (!run.ok()) {
    print_error("trace", run.status());
    return run.status().code() == StatusCode::kNotFound ? kExitErrors : kExitToolFailed;
  }
  for (const std::string& warning : run->warnings) {
    std::fprintf(stderr, "gpuopt trace: warning: %s\n", warning.c_str());
  }
  // The command's own status is what scripts wrapping `gpuopt trace` need to see; after a
  // SIGTERM or SIGHUP (passed on to the command) the conventional 128 + signal.
  const int status = run->forwarded_signal != 0 ? 128 + run->forwarded_signal : run->exit_status;
  if (run->forwarded_signal != 0) {
    std::fprintf(stderr, "gpuopt trace: received %s, passed it on to '%s'\n",
                 strsignal(run->forwarded_signal), args.command[0].c_str());
  }
  if (!run->trace) {
    std::fprintf(
        stderr,
        "gpuopt trace: nothing was traced: no process of '%s' initialised CUDA (no GPU, "
        "no driver, or the program does not use CUDA); exit status is the command's (%d)\n",
        args.command[0].c_str(), status);
    return status;
  }
  const trace::TraceData& data = *run->trace;
  trace::SummaryOptions summary_options;
  summary_options.nvml_samples = run->nvml_samples;
  summary_options.nvml_unavailable_reason = run->nvml_unavailable_reason;
  const trace::TraceSummary summary = trace::summarize(data, summary_options);

  int tool_status = kExitOk;
  trace::ChromeTraceOptions chrome_options;
  chrome_options.nvml_samples = run->nvml_samples;  // the GPU-Util counter track
  if (Status written = trace::write_chrome_trace(data, args.out, chrome_options); !written.ok()) {
    print_error("trace", written);
    tool_status = kExitToolFailed;
  }
  if (!args.summary_json.empty()) {
    std::ofstream out(args.summary_json);
    out << trace::to_json(summary).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "gpuopt trace: cannot write %s\n", args.summary_json.c_str());
      tool_status = kExitToolFailed;
    }
  }
  if (!args.records_json.empty()) {
    if (Status written = trace::write_record_file(data, args.records_json); !written.ok()) {
      print_error("trace", written);
      tool_status = kExitToolFailed;
    }
  }
  if (args.json) {
    std::printf("%s\n", trace::to_json(summary).dump(2).c_str());
  } else {
    std::fputs(trace::render_text(summary).c_str(), stdout);
  }
  if (tool_status == kExitOk && !args.json) {
    std::printf("Chrome trace: %s (open in https://ui.perfetto.dev)\n", args.out.c_str());
  }
  return tool_status != kExitOk ? tool_status : status;
}

GPUOPT_REGISTER_COMMAND("", 40, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<TraceArgs>();
  CLI::App* command = parent.add_subcommand(
      "trace",
      "Trace a CUDA program (PyTorch included) with CUPTI: Chrome trace + busy time vs NVML. "
      "Exit status: the command's own, or 3 when gpuopt itself fails");
  command
      ->add_option("-o,--output", args->out,
                   "Chrome trace JSON to write (open it in Perfetto); checked before the command "
                   "starts")
      ->capture_default_str();
  add_hidden_alias(*command, "--out", args->out);
  command->add_flag("--json", args->json, "Print the summary as JSON instead of text");
  command->add_option("--summary-json", args->summary_json, "Also write the summary as JSON");
  command->add_option("--records-json", args->records_json,
                      "Also write the raw activity records (gpuopt's record file)");
  command->add_option("--nvml-period", args->nvml_period_s, "NVML GPU-Util sampling period, s")
      ->capture_default_str()
      ->check(finite_number_in(0.01, 10.0));
  command->add_flag("--driver-api", args->driver_api, "Also trace CUDA driver API calls");
  command->add_option("--inject-library", args->inject_library,
                      "libgpuopt_trace_inject.so to load (default: $GPUOPT_TRACE_INJECT, else "
                      "next to gpuopt, then ../bin, ../lib, ../../bin)");
  command->add_option("command", args->command, "The command to trace, after --")
      ->required()
      ->expected(1, -1);
  command->callback([args, &exit_code] { exit_code = run_trace(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
