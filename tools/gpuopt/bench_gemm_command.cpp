// `gpuopt bench gemm [--quick] [--json] [--only KEYS] [--list] [options]`: the W4A16 GEMM against
// cuBLAS on LLM layer shapes. The options below map onto bench::gemm::GemmBenchOptions and
// kernels::W4A16Options (docs/w4a16-gemm.md, "How to reproduce"); without them the run is the
// default plan of every M.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/gemm.hpp"

namespace gpuopt::cli {
namespace {

struct GemmBenchArgs {
  int samples = 0;
  int device = 0;
  BenchCommandArgs common;
  bench::gemm::GemmBenchOptions gemm;
  // Text options parsed in run_bench_gemm (each names the bad value).
  std::string force_path = "auto";
  std::string timing = "interleaved";
  std::string pipeline = "auto";
  std::string direct_fragment_partials = "auto";
  std::string direct_tiles8 = "auto";
  std::string wgmma_stream_k = "auto";
  int wgmma_variant = -1;
  bool direct_streamed_x = false;
  bool wgmma_atomic_fixup = false;
};

// "auto" (the planner's choice), "on" or "off".
StatusOr<std::optional<bool>> parse_switch(const char* flag, const std::string& text) {
  if (text == "auto") return std::optional<bool>();
  if (text == "on") return std::optional<bool>(true);
  if (text == "off") return std::optional<bool>(false);
  return invalid_argument(std::string(flag) + " '" + text + "': one of auto, on, off");
}

Status fill_options(GemmBenchArgs& args) {
  kernels::W4A16Options& gemm = args.gemm.gemm;
  kernels::W4A16Tuning& tuning = gemm.tuning;
  GPUOPT_ASSIGN_OR_RETURN(gemm.force_path, kernels::parse_w4a16_force_path(args.force_path));
  GPUOPT_ASSIGN_OR_RETURN(args.gemm.timing, bench::gemm::parse_timing_order(args.timing));
  if (args.pipeline != "auto") {
    GPUOPT_ASSIGN_OR_RETURN(tuning.pipeline, kernels::parse_w4a16_pipeline(args.pipeline));
  }
  GPUOPT_ASSIGN_OR_RETURN(
      tuning.direct_fragment_partials,
      parse_switch("--direct-fragment-partials", args.direct_fragment_partials));
  GPUOPT_ASSIGN_OR_RETURN(tuning.direct_tiles8,
                          parse_switch("--direct-tiles8", args.direct_tiles8));
  GPUOPT_ASSIGN_OR_RETURN(tuning.wgmma_stream_k,
                          parse_switch("--wgmma-stream-k", args.wgmma_stream_k));
  if (args.wgmma_variant != -1) tuning.wgmma_variant = args.wgmma_variant;
  tuning.direct_resident_x = !args.direct_streamed_x;
  tuning.wgmma_shared_fixup = !args.wgmma_atomic_fixup;
  return bench::gemm::check_options(args.gemm);
}

int run_bench_gemm(GemmBenchArgs& args) {
  if (const Status status = fill_options(args); !status.ok()) {
    print_error("bench gemm", status);
    return kExitErrors;
  }
  bench::BenchOptions options;
  options.quick = args.gemm.quick;
  options.samples = args.samples;
  options.device = args.device;
  const BenchFamily family{"gemm", [&args] { return bench::gemm::make_suite(args.gemm); }, nullptr,
                           bench::gemm::exit_code_for};
  return run_bench_command(family, options, args.common);
}

GPUOPT_REGISTER_COMMAND("bench", 70, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<GemmBenchArgs>();
  CLI::App* command = parent.add_subcommand(
      "gemm",
      "W4A16 int4 GEMM vs cuBLAS fp16/bf16 on Llama/Qwen layer shapes, M = 1..256 by default");
  command->add_flag("--quick", args->gemm.quick, "the four targeted shapes, fewer samples");
  command
      ->add_option("--samples", args->samples, "timed launches per figure (default 50, quick 20)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device", args->device, "CUDA device ordinal");
  add_bench_flags(*command, args->common, "k8192_n28672");
  command
      ->add_option("--m", args->gemm.batch_sizes,
                   "M values to time, e.g. 1,16,64 (default "
                   "1,2,4,8,16,32,64,128,256; each 1..8192)")
      ->delimiter(',');
  command->add_option("--timing", args->timing,
                      "interleaved (default), reference-first or gpuopt-first: how cuBLAS and "
                      "gpuopt samples are ordered");
  command->add_option("--sms", args->gemm.partition_sms,
                      "time everything on a green-context partition of this many SMs, gpuopt "
                      "planned for it");
  command->add_option("--plan-sms", args->gemm.planned_sms,
                      "with --sms: the SMs gpuopt is planned for instead (0 = the whole GPU)");
  // W4A16Options.
  command->add_option("--force-path", args->force_path,
                      "auto (default), tensor-core, dequant-cublas, x-rows, swapped, direct or "
                      "wgmma");
  command->add_flag("--deterministic", args->gemm.gemm.deterministic,
                    "W4A16Options::deterministic: run-to-run identical bits, no cuBLAS takeover");
  command->add_option("--fallback-min-m", args->gemm.gemm.fallback_min_m,
                      "M from which dequantise + cuBLAS runs on a dense fp16 copy of the "
                      "weight (N x K x 2 bytes): 0 = never (default), -1 = the measured takeover");
  // W4A16Tuning: overrides of the kernels' own plans, for A/B runs.
  command->add_option("--pipeline", args->pipeline,
                      "swapped kernel's copy pipeline: auto (default), cp-async or bulk-k128");
  command->add_option(
      "--direct-fragment-partials", args->direct_fragment_partials,
      "direct kernel's partials in the fragment layout: auto (from M = 3), on, off");
  command->add_option("--direct-tiles8", args->direct_tiles8,
                      "direct kernel's 8-tile stages at 9-16 rows: auto (K x N >= 2^27), on "
                      "(wherever they apply), off");
  command->add_flag("--direct-streamed-x", args->direct_streamed_x,
                    "direct kernel: x through the warps' rings instead of resident");
  command->add_option("--direct-slices", args->gemm.gemm.tuning.direct_slices,
                      "direct kernel, resident x: k-slices (0 = the cost model's choice)");
  command->add_option("--direct-slice-blocks", args->gemm.gemm.tuning.direct_slice_blocks,
                      "direct kernel, resident x: at most this many blocks per slice (0 = SMs / "
                      "slices)");
  command->add_option("--direct-blocks-per-sm", args->gemm.gemm.tuning.direct_blocks_per_sm,
                      "direct kernel, streamed x: blocks per SM (0 = the occupancy)");
  command->add_option("--wgmma-variant", args->wgmma_variant,
                      "wgmma kernel's template instance: 7 (32 tokens), 8 (64), 9 (128) "
                      "(default: by M)");
  command->add_option("--wgmma-splits", args->gemm.gemm.tuning.wgmma_splits,
                      "wgmma kernel's k-splits per output tile (0 = the wave-fill choice)");
  command->add_option("--wgmma-stream-k", args->wgmma_stream_k,
                      "wgmma kernel's stream-K schedule: auto (default), on, off");
  command->add_option("--wgmma-stream-k-blocks", args->gemm.gemm.tuning.wgmma_stream_k_blocks,
                      "wgmma kernel, stream-K: the grid (0 = one wave)");
  command->add_flag("--wgmma-atomic-fixup", args->wgmma_atomic_fixup,
                    "wgmma kernel: k-splits add atomically instead of the shared fix-up");
  command->callback([args, &exit_code] { exit_code = run_bench_gemm(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
