// `gpuopt bench gemm [--quick] [--json]`: the W4A16 GEMM against cuBLAS on LLM layer shapes.
#include <cstdio>
#include <memory>
#include <string>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/gemm.hpp"

namespace gpuopt::cli {
namespace {

struct GemmBenchArgs {
  bool json = false;
  bool quick = false;
  int samples = 0;
  int device = 0;
  std::vector<std::string> only;
};

int run_bench_gemm(const GemmBenchArgs& args) {
  bench::BenchOptions options;
  options.quick = args.quick;
  options.samples = args.samples;
  options.device = args.device;
  options.only = args.only;
  const bench::Suite suite = bench::gemm::make_suite(args.quick);
  const std::vector<bench::TestcaseResult> results = run_and_print(suite, options, args.json);
  return bench::gemm::exit_code_for(results);
}

GPUOPT_REGISTER_COMMAND("bench", 70, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<GemmBenchArgs>();
  CLI::App* command = parent.add_subcommand(
      "gemm", "W4A16 int4 GEMM vs cuBLAS fp16/bf16 on Llama/Qwen layer shapes, M = 1..256");
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
  command->add_flag("--quick", args->quick, "the four targeted shapes, fewer samples");
  command->add_option("--samples", args->samples,
                      "timed launches per figure (default 50, quick 20)");
  command->add_option("--device", args->device, "CUDA device ordinal");
  command->add_option("--only", args->only, "testcase keys to run, e.g. k8192_n28672");
  command->callback([args, &exit_code] { exit_code = run_bench_gemm(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
