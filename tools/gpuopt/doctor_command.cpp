// `gpuopt doctor`: diagnose the GPU platform (PCIe, IOMMU, ASPM, NVML, leaks, Vulkan); read-only.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <optional>

#include "command_registry.hpp"
#include "gpuopt/doctor/doctor.hpp"
#include "gpuopt/doctor/fit.hpp"
#include "numeric_checks.hpp"
#include "output_options.hpp"

namespace {

struct DoctorArguments {
  std::string root = "/";
  bool json = false;
  bool prometheus = false;
  bool all = false;
  bool load = false;
  bool no_vulkan = false;
  double watch_s = 0;
  double duration_s = 0;
  gpuopt::cli::OutputOptions out;  // -o/--output
  // --fit
  std::string fit;
  std::int64_t batch = 1;
  std::int64_t context = 4096;
  unsigned device = 0;
  std::string dtype;
  std::string quant;
  std::string kv_dtype = "bf16";
  std::optional<std::uint64_t> free_bytes;
  double reserve_gib = 1.0;
};

int run_fit(const DoctorArguments& arguments) {
  using namespace gpuopt::doctor;
  FitOptions options;
  options.batch = arguments.batch;
  options.context = arguments.context;
  options.kv_cache_bytes = arguments.kv_dtype == "fp8" ? 1 : 2;
  options.reserve_bytes = static_cast<std::uint64_t>(arguments.reserve_gib * (1ull << 30));
  std::string format_name =
      !arguments.quant.empty() && arguments.quant != "none" ? arguments.quant : arguments.dtype;
  if (!format_name.empty()) {
    auto format = parse_weight_format(format_name);
    if (!format.ok()) {
      std::fprintf(stderr, "gpuopt doctor: %s\n", format.status().message().c_str());
      return gpuopt::cli::kExitErrors;
    }
    options.weight_format = *format;
  }
  std::string why_unknown;
  if (arguments.free_bytes) {
    options.free_bytes = arguments.free_bytes;
    options.device = "--free-bytes";
  } else {
    // Free memory and its idle or leaked holders, from NVML or a recorded machine's nvml.json.
    Options doctor_options;
    doctor_options.root = arguments.root;
    doctor_options.use_vulkan = false;
    auto collected = collect(doctor_options);
    if (!collected.ok()) {
      std::fprintf(stderr, "gpuopt doctor: %s\n", collected.status().message().c_str());
      return gpuopt::cli::kExitToolFailed;
    }
    judge(*collected);
    if (auto from_report = fit_memory_from_report(*collected, arguments.device, options);
        from_report.ok()) {
      options = std::move(from_report).value();
    } else {
      why_unknown = from_report.status().message();
    }
  }
  auto estimate = estimate_fit(arguments.fit, options);
  if (!estimate.ok()) {
    std::fprintf(stderr, "gpuopt doctor: %s\n", estimate.status().message().c_str());
    return gpuopt::cli::kExitToolFailed;
  }
  if (!why_unknown.empty()) estimate->notes.push_back("free memory not read: " + why_unknown);
  if (arguments.json) {
    std::fputs((dump_json(fit_to_json(*estimate)) + "\n").c_str(), stdout);
  } else {
    std::fputs(render_fit_text(*estimate).c_str(), stdout);
  }
  return fit_exit_code(*estimate);
}

int run_doctor(const DoctorArguments& arguments) {
  using namespace gpuopt::doctor;
  if (!arguments.fit.empty()) return run_fit(arguments);
  if (!gpuopt::cli::output_usable("doctor", arguments.out)) return gpuopt::cli::kExitErrors;
  Options options;
  options.root = arguments.root;
  options.all_devices = arguments.all;
  options.load = arguments.load;
  options.use_vulkan = !arguments.no_vulkan;
  auto collected = collect(options);
  if (!collected.ok()) {
    std::fprintf(stderr, "gpuopt doctor: %s\n", collected.status().message().c_str());
    return gpuopt::cli::kExitToolFailed;
  }
  Report report = std::move(collected).value();
  judge(report);
  std::optional<WatchResult> watched;
  if (arguments.watch_s > 0) {
    double duration = arguments.duration_s > 0 ? arguments.duration_s : arguments.watch_s * 10;
    // Text: one line per sample as it is taken, as `nvidia-smi dmon` prints them.
    std::function<void(const WatchSample&)> print_sample;
    if (!arguments.json && !arguments.prometheus) {
      std::fputs(watch_header_lines().c_str(), stdout);
      std::fflush(stdout);
      print_sample = [](const WatchSample& sample) {
        std::fputs(watch_sample_line(sample).c_str(), stdout);
        std::fflush(stdout);
      };
    }
    auto result = watch(options, report, arguments.watch_s, duration, print_sample);
    if (!result.ok()) {
      std::fprintf(stderr, "gpuopt doctor: %s\n", result.status().message().c_str());
      return gpuopt::cli::kExitToolFailed;
    }
    watched = std::move(result).value();
  }
  std::string text;
  if (arguments.json) {
    auto json = to_json(report);
    if (watched) json["watch"] = watch_to_json(*watched);
    text = dump_json(json) + "\n";
  } else if (arguments.prometheus) {
    text = render_prometheus(report);
  } else {
    text = render_text(report, arguments.out.to_stdout() && gpuopt::cli::use_color(STDOUT_FILENO));
    if (watched) text += render_watch_text(*watched);
  }
  // To a file, the write is atomic (a temporary file renamed into place): what node_exporter's
  // textfile collector needs of `doctor --prometheus -o DIR/gpuopt.prom` run from cron.
  if (!gpuopt::cli::write_output("doctor", arguments.out, text))
    return gpuopt::cli::kExitToolFailed;
  return exit_code(report);
}

GPUOPT_REGISTER_COMMAND("", 10, [](CLI::App& parent, int& exit_code) {
  auto arguments = std::make_shared<DoctorArguments>();
  CLI::App* command = parent.add_subcommand(
      "doctor",
      "Diagnose the GPU platform: PCIe links, IOMMU, ASPM, NVML, leaked contexts, Vulkan");
  command->add_option("--root", arguments->root,
                      "Read /sys, /proc and /etc under DIR (a recorded machine; no NVML)");
  // A missing --root is checked by collect(): the tool's failure (exit 3), as docs/doctor.md says,
  // not a usage error.
  auto* json =
      command->add_flag("--json", arguments->json, "JSON (docs/schemas/doctor.schema.json)");
  command->add_flag("--prometheus", arguments->prometheus, "Prometheus text exposition")
      ->excludes(json);
  command->add_option("-o,--output", arguments->out.output,
                      "Write the report to FILE, atomically (e.g. a node_exporter textfile "
                      "collector's DIR/gpuopt.prom); '-' = stdout");
  command->add_flag("--all", arguments->all,
                    "Describe every PCI device, not only GPUs/accelerators");
  command->add_flag("--load", arguments->load,
                    "Judge the link under a short GPU load (launches a 0.5 s spin kernel)");
  command->add_flag("--no-vulkan", arguments->no_vulkan, "Skip the Vulkan probe");
  command->add_option("--watch", arguments->watch_s, "Sample every SECONDS")
      ->check(gpuopt::cli::finite_number_in(0.01, 86400.0));
  command->add_option("--duration", arguments->duration_s, "Watch for SECONDS (default 10 samples)")
      ->check(gpuopt::cli::finite_number_in(0.01, 1e7));
  auto* fit = command->add_option(
      "--fit", arguments->fit,
      "Estimate whether CHECKPOINT (a directory with config.json and *.safetensors, or a "
      "config.json) fits in free GPU memory: weights + KV cache + activations");
  command->add_option("--batch", arguments->batch, "--fit: sequences at once (default 1)")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(fit);
  command
      ->add_option("--context", arguments->context,
                   "--fit: tokens per sequence, prompt + output (default 4096)")
      ->check(CLI::Range(1, 1 << 30))
      ->needs(fit);
  command->add_option("--device", arguments->device, "--fit: NVML index of the GPU (default 0)")
      ->needs(fit);
  command
      ->add_option("--dtype", arguments->dtype,
                   "--fit on a config alone: weight dtype (bf16, fp16, fp32; default the "
                   "config's torch_dtype)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32", "bfloat16", "float16", "float32"}))
      ->needs(fit);
  command
      ->add_option("--quant", arguments->quant,
                   "--fit on a config alone: quantised weights (int8, int4, none)")
      ->check(CLI::IsMember({"int8", "int4", "none"}))
      ->needs(fit);
  command->add_option("--kv-dtype", arguments->kv_dtype, "--fit: KV cache dtype (bf16 or fp8)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp8"}))
      ->needs(fit);
  command
      ->add_option("--free-bytes", arguments->free_bytes,
                   "--fit: free device memory in bytes instead of asking NVML")
      ->needs(fit);
  command
      ->add_option("--reserve-gib", arguments->reserve_gib,
                   "--fit: GiB kept for the CUDA context and workspaces (default 1)")
      ->check(CLI::Range(0.0, 1024.0))
      ->needs(fit);
  command->callback([arguments, &exit_code] { exit_code = run_doctor(*arguments); });
});

}  // namespace
