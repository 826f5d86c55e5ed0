// `gpuopt pipeline`: the multi-camera scenario in baseline and optimized modes, side by side.
#include <fmt/format.h>

#include <memory>

#include "command_registry.hpp"
#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/pipeline.hpp"

namespace gpuopt::cli {
namespace {

struct PipelineCommandOptions {
  std::string mode = "both";
  int cameras = 10;
  double fps = 30;
  double seconds = 5;
  int workers = 4;
  std::vector<int> sweep;
  bool quick = false;
  bool json = false;
};

nlohmann::json scenario_json(const pipeline::PipelineOptions& o) {
  pipeline::TensorShape input{1, o.network_size, o.network_size, 3};
  return {{"stages", {"upload", "preprocess", "detector", "segmenter", "decode"}},
          {"not_yet_built", {"llm_instruction", "embedding", "retrieval"}},
          {"weights", "seeded random weights with the real layer shapes (no downloads here)"},
          {"frame", fmt::format("{}x{} RGB8", o.width, o.height)},
          {"detector_gflops_per_frame",
           pipeline::network_flops(input, pipeline::detector_layers()) / 1e9},
          {"segmenter_gflops_per_frame",
           pipeline::network_flops(input, pipeline::segmenter_layers()) / 1e9},
          {"baseline", "one worker, pageable frames, a host synchronisation after every stage"},
          {"optimized", fmt::format("{} workers on their own high-priority streams, pinned frames, "
                                    "one synchronisation per frame",
                                    o.workers)}};
}

int run(const PipelineCommandOptions& command) {
  pipeline::PipelineOptions base;
  base.cameras = command.cameras;
  base.fps = command.fps;
  base.seconds = command.quick ? 2.0 : command.seconds;
  base.workers = command.workers;
  std::vector<pipeline::PipelineMode> modes;
  if (command.mode == "baseline" || command.mode == "both")
    modes.push_back(pipeline::PipelineMode::kBaseline);
  if (command.mode == "optimized" || command.mode == "both")
    modes.push_back(pipeline::PipelineMode::kOptimized);
  if (modes.empty()) {
    fmt::print(stderr, "gpuopt pipeline: --mode must be baseline, optimized or both, not '{}'\n",
               command.mode);
    return kExitToolFailed;
  }
  if (Status valid = pipeline::check_pipeline_options(base); !valid.ok()) {
    fmt::print(stderr, "gpuopt pipeline: {}\n", valid.message());
    return kExitToolFailed;
  }
  nlohmann::json output = {{"schema_version", 1}, {"scenario", scenario_json(base)}};
  if (auto devices = cuda_device_count(); !devices.ok()) {
    output["skipped"] = devices.status().message();
    if (command.json) {
      fmt::print("{}\n", output.dump(2));
    } else {
      fmt::print("gpuopt pipeline: skipped: {}\n", devices.status().message());
    }
    return kExitOk;
  }
  std::vector<int> camera_counts =
      command.sweep.empty() ? std::vector<int>{command.cameras} : command.sweep;
  nlohmann::json runs = nlohmann::json::array();
  nlohmann::json comparisons = nlohmann::json::array();
  for (int cameras : camera_counts) {
    std::vector<pipeline::PipelineResult> results;
    for (auto mode : modes) {
      pipeline::PipelineOptions options = base;
      options.cameras = cameras;
      options.mode = mode;
      fmt::print(stderr, "gpuopt pipeline: {} cameras, {} mode ...\n", cameras,
                 pipeline::mode_name(mode));
      auto result = pipeline::run_pipeline(options);
      if (!result.ok()) {
        fmt::print(stderr, "gpuopt pipeline: {}\n", result.status().to_string());
        return kExitToolFailed;
      }
      runs.push_back(pipeline::to_json(*result));
      results.push_back(*result);
    }
    if (results.size() == 2) {
      const auto& b = results[0];
      const auto& o = results[1];
      comparisons.push_back(
          {{"cameras", cameras},
           {"throughput_speedup", b.throughput_fps > 0 ? o.throughput_fps / b.throughput_fps : 0},
           {"p99_latency_ratio", b.latency_p99_ms > 0 ? o.latency_p99_ms / b.latency_p99_ms : 0},
           {"same_results", b.checksum == o.checksum}});
    }
  }
  output["runs"] = runs;
  output["comparisons"] = comparisons;
  bool all_same = true;
  for (const auto& c : comparisons) all_same = all_same && c["same_results"].get<bool>();
  if (command.json) {
    fmt::print("{}\n", output.dump(2));
  } else {
    bench::Table table{{"mode", "cameras", "frames", "offered fps", "fps", "p50 ms", "p99 ms",
                        "GPU-Util %", "checksum"},
                       {}};
    for (const auto& r : runs) {
      table.rows.push_back({r["mode"], fmt::format("{}", r["cameras"].get<int>()),
                            fmt::format("{}", r["frames"].get<std::uint64_t>()),
                            fmt::format("{:.0f}", r["offered_fps"].get<double>()),
                            fmt::format("{:.1f}", r["throughput_fps"].get<double>()),
                            fmt::format("{:.1f}", r["latency_p50_ms"].get<double>()),
                            fmt::format("{:.1f}", r["latency_p99_ms"].get<double>()),
                            r["gpu_util_percent"].is_null()
                                ? "—"
                                : fmt::format("{:.0f}", r["gpu_util_percent"].get<double>()),
                            r["checksum"]});
    }
    fmt::print(
        "gpuopt pipeline (stages: upload, preprocess, detector, segmenter, decode; seeded random "
        "weights; LLM/retrieval stages not built yet)\n{}",
        bench::render_table(table));
    for (const auto& c : comparisons) {
      fmt::print(
          "  {} cameras: optimized {:.2f}x throughput, p99 {:.2f}x of baseline, same results: {}\n",
          c["cameras"].get<int>(), c["throughput_speedup"].get<double>(),
          c["p99_latency_ratio"].get<double>(), c["same_results"].get<bool>() ? "yes" : "NO");
    }
  }
  return all_same ? kExitOk : kExitErrors;
}

GPUOPT_REGISTER_COMMAND("", 90, [](CLI::App& parent, int& exit_code) {
  auto options = std::make_shared<PipelineCommandOptions>();
  CLI::App* command = parent.add_subcommand(
      "pipeline", "Multi-camera detection+segmentation scenario, baseline vs optimized");
  command->add_option("--mode", options->mode, "baseline, optimized or both")
      ->capture_default_str();
  command->add_option("--streams", options->cameras, "Camera streams")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  command->add_option("--fps", options->fps, "Frames per second per camera")->capture_default_str();
  command->add_option("--seconds", options->seconds, "Seconds of frames")->capture_default_str();
  command->add_option("--workers", options->workers, "Optimized mode: worker streams")
      ->capture_default_str();
  command->add_option("--sweep", options->sweep, "Camera counts to sweep, e.g. --sweep 1 5 10 20");
  command->add_flag("--quick", options->quick, "2 seconds of frames (for audit)");
  command->add_flag("--json", options->json, "JSON on stdout");
  command->callback([options, &exit_code] { exit_code = run(*options); });
});

}  // namespace
}  // namespace gpuopt::cli
