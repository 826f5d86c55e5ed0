// `gpuopt pipeline`: the multi-camera scenario in baseline and optimized modes, side by side.
#include <fmt/format.h>

#include <filesystem>
#include <iterator>
#include <memory>

#include "command_registry.hpp"
#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/pipeline/pipeline.hpp"
#include "output_options.hpp"

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
  OutputOptions output;  // -o/--output, --json
  std::string llm = "llama-3.2-1b-shaped";
  bool no_llm = false;
  int llm_batch = 16;
  int new_tokens = 16;
  std::size_t archive = 100'000;
  int overlay_every = 100;
  std::string out_dir;
  bool no_graphs = false;
  bool no_busy = false;
  std::string trace;
};

// One trace file per run: FILE itself for a single run, FILE with "-<mode>-<N>cam" before its
// extension when several runs share the command.
std::string trace_path_for(const std::string& path, bool several, pipeline::PipelineMode mode,
                           int cameras) {
  if (path.empty() || !several) return path;
  std::filesystem::path p(path);
  std::string stem = p.stem().string(), extension = p.extension().string();
  return (p.parent_path() /
          fmt::format("{}-{}-{}cam{}", stem, pipeline::mode_name(mode), cameras, extension))
      .string();
}

nlohmann::json scenario_json(const pipeline::PipelineOptions& o) {
  pipeline::TensorShape input{1, o.network_size, o.network_size, 3};
  const pipeline::LlmConfig llm =
      o.llm_model == "tiny" ? pipeline::tiny_llm() : pipeline::llama_1b_shaped();
  nlohmann::json llm_json = nullptr;
  if (o.llm) {
    llm_json = {
        {"model", llm.name},
        {"shape", fmt::format("hidden {}, {} layers, {} heads ({} KV), FFN {}, vocab {}",
                              llm.hidden, llm.layers, llm.heads, llm.kv_heads, llm.ffn, llm.vocab)},
        {"weight_bytes_w4a16", pipeline::llm_weight_bytes(llm)},
        {"prompt_tokens", pipeline::kPromptTokens},
        {"new_tokens", o.new_tokens},
        {"decode_step_gflops_batch1",
         pipeline::llm_decode_step_flops(llm, 1, pipeline::kPromptTokens + o.new_tokens) / 1e9},
        {"embed_dim", llm.embed_dim},
        {"archive_cases", o.archive_cases},
        {"retrieve_k", o.retrieve_k},
        {"retrieval",
         "exact L2 over the seeded archive only (so results do not depend on frame order); "
         "each new case is added to a separate case store"}};
  }
  nlohmann::json stages = {"upload", "preprocess", "detector", "segmenter", "decode"};
  if (o.llm) {
    for (const char* stage : {"llm_instruction", "embedding", "retrieval", "ingest", "writer"})
      stages.push_back(stage);
  }
  return {{"stages", stages},
          {"llm", llm_json},
          {"weights", "seeded random weights with the real layer shapes (no downloads here)"},
          {"frame", fmt::format("{}x{} RGB8", o.width, o.height)},
          {"detector_gflops_per_frame",
           pipeline::network_flops(input, pipeline::detector_layers()) / 1e9},
          {"segmenter_gflops_per_frame",
           pipeline::network_flops(input, pipeline::segmenter_layers()) / 1e9},
          {"baseline",
           "one worker, pageable frames, a host synchronisation after every stage; each LLM "
           "request decoded alone (batch 1) in that worker; embeddings copied to the host, "
           "serialised to JSON, parsed, then added and queried through the store's host path"},
          {"optimized",
           fmt::format("{} vision workers on highest-priority streams, pinned frames, one "
                       "synchronisation per frame{}; a dedicated LLM worker on its own stream "
                       "batching waiting requests (up to {}); zero-copy device ingest",
                       o.workers, o.graphs ? ", CUDA graphs for the vision stages" : "",
                       o.llm_max_batch)},
          {"overlay_every", o.overlay_every}};
}

int run(const PipelineCommandOptions& command) {
  pipeline::PipelineOptions base;
  base.cameras = command.cameras;
  base.fps = command.fps;
  base.seconds = command.quick ? 2.0 : command.seconds;
  base.workers = command.workers;
  base.llm = !command.no_llm;
  base.llm_model = command.llm;
  base.llm_max_batch = command.llm_batch;
  base.new_tokens = command.new_tokens;
  base.archive_cases = command.archive;
  base.overlay_every = command.overlay_every;
  base.graphs = !command.no_graphs;
  base.trace_busy = !command.no_busy;
  std::vector<pipeline::PipelineMode> modes;
  if (command.mode == "baseline" || command.mode == "both")
    modes.push_back(pipeline::PipelineMode::kBaseline);
  if (command.mode == "optimized" || command.mode == "both")
    modes.push_back(pipeline::PipelineMode::kOptimized);
  if (modes.empty()) {
    fmt::print(stderr, "gpuopt pipeline: --mode must be baseline, optimized or both, not '{}'\n",
               command.mode);
    return kExitErrors;
  }
  if (Status valid = pipeline::check_pipeline_options(base); !valid.ok()) {
    print_error("pipeline", valid);
    return kExitErrors;
  }
  if (!output_usable("pipeline", command.output)) return kExitErrors;
  const bool json = command.output.json;
  std::string text;  // the main output, to stdout or --output
  auto out = std::back_inserter(text);
  nlohmann::json output = {{"schema_version", 1}, {"scenario", scenario_json(base)}};
  if (auto devices = cuda_device_count(); !devices.ok()) {
    const std::string skipped = fmt::format(
        "{}; skipped every stage (upload, preprocess, detector, segmenter, decode{}) in both "
        "modes: "
        "they run on the GPU and there is no CPU fallback",
        devices.status().message(), base.llm ? ", LLM, embedding, retrieval, writer" : "");
    output["skipped"] = skipped;
    if (json) {
      fmt::format_to(out, "{}\n", output.dump(2));
    } else {
      fmt::format_to(out, "gpuopt pipeline: skipped: {}\n", skipped);
    }
    return write_output("pipeline", command.output, text) ? kExitOk : kExitToolFailed;
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
      const bool several = camera_counts.size() * modes.size() > 1;
      options.trace_path = trace_path_for(command.trace, several, mode, cameras);
      if (!command.out_dir.empty()) {
        options.output_dir = (std::filesystem::path(command.out_dir) /
                              fmt::format("{}-{}cam", pipeline::mode_name(mode), cameras))
                                 .string();
      }
      fmt::print(stderr, "gpuopt pipeline: {} cameras, {} mode ...\n", cameras,
                 pipeline::mode_name(mode));
      auto result = pipeline::run_pipeline(options);
      if (!result.ok()) {
        print_error("pipeline", result.status());
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
           {"optimized_gpu_busy_percent", o.gpu_busy_percent_of_active
                                              ? nlohmann::json(*o.gpu_busy_percent_of_active)
                                              : nlohmann::json(nullptr)},
           {"baseline_gpu_busy_percent", b.gpu_busy_percent_of_active
                                             ? nlohmann::json(*b.gpu_busy_percent_of_active)
                                             : nlohmann::json(nullptr)},
           {"same_results", b.checksum == o.checksum}});
    }
  }
  output["runs"] = runs;
  output["comparisons"] = comparisons;
  bool all_same = true;
  for (const auto& c : comparisons) all_same = all_same && c["same_results"].get<bool>();
  if (json) {
    fmt::format_to(out, "{}\n", output.dump(2));
  } else {
    bench::Table table{{"mode", "cameras", "frames", "offered fps", "fps", "p50 ms", "p99 ms",
                        "busy % (CUPTI)", "GPU-Util %", "LLM req/batches", "checksum"},
                       {}};
    for (const auto& r : runs) {
      table.rows.push_back(
          {r["mode"], fmt::format("{}", r["cameras"].get<int>()),
           fmt::format("{}", r["frames"].get<std::uint64_t>()),
           fmt::format("{:.0f}", r["offered_fps"].get<double>()),
           fmt::format("{:.1f}", r["throughput_fps"].get<double>()),
           fmt::format("{:.1f}", r["latency_p50_ms"].get<double>()),
           fmt::format("{:.1f}", r["latency_p99_ms"].get<double>()),
           r["gpu_busy_percent_of_active"].is_null()
               ? "—"
               : fmt::format("{:.0f}", r["gpu_busy_percent_of_active"].get<double>()),
           r["gpu_util_percent"].is_null()
               ? "—"
               : fmt::format("{:.0f}", r["gpu_util_percent"].get<double>()),
           fmt::format("{}/{}", r["llm_requests"].get<std::uint64_t>(),
                       r["llm_batches"].get<std::uint64_t>()),
           r["checksum"]});
    }
    fmt::format_to(
        out,
        "gpuopt pipeline (upload, preprocess, detector, segmenter, decode{}; seeded random "
        "weights with real layer shapes, no downloads)\n{}",
        base.llm ? fmt::format(", then for frames with detections {} instruction, embedding, "
                               "retrieval over {} past cases, writer",
                               base.llm_model, base.archive_cases)
                 : std::string(", LLM stages off"),
        bench::render_table(table));
    for (const auto& r : runs) {
      std::string stages;
      for (const auto& stage : r["stages"])
        stages += fmt::format(" {} {:.2f}", stage["stage"].get<std::string>(),
                              stage["mean_ms"].get<double>());
      fmt::format_to(out, "  {} {} cameras: GPU ms per call:{}; memory {} MiB; graphs: {}{}{}\n",
                     r["mode"].get<std::string>(), r["cameras"].get<int>(), stages,
                     r["device_memory_used_mib"].is_null()
                         ? std::string("?")
                         : fmt::format("{:.0f}", r["device_memory_used_mib"].get<double>()),
                     r["graphs_used"].get<bool>() ? "yes" : r["graphs_note"].get<std::string>(),
                     r["trace_note"].get<std::string>().empty()
                         ? ""
                         : "; trace: " + r["trace_note"].get<std::string>(),
                     r["trace_file"].get<std::string>().empty()
                         ? ""
                         : "; trace written to " + r["trace_file"].get<std::string>());
    }
    for (const auto& c : comparisons) {
      fmt::format_to(
          out,
          "  {} cameras: optimized {:.2f}x throughput, p99 {:.2f}x of baseline, same results: {}\n",
          c["cameras"].get<int>(), c["throughput_speedup"].get<double>(),
          c["p99_latency_ratio"].get<double>(), c["same_results"].get<bool>() ? "yes" : "NO");
    }
  }
  if (!write_output("pipeline", command.output, text)) return kExitToolFailed;
  return all_same ? kExitOk : kExitErrors;
}

GPUOPT_REGISTER_COMMAND("", 90, [](CLI::App& parent, int& exit_code) {
  auto options = std::make_shared<PipelineCommandOptions>();
  CLI::App* command = parent.add_subcommand(
      "pipeline",
      "Multi-camera detection, segmentation, LLM and retrieval scenario, baseline vs optimized");
  command->add_option("--mode", options->mode, "baseline, optimized or both")
      ->capture_default_str();
  command->add_option("--streams,--cameras", options->cameras, "Camera streams")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  command->add_option("--fps", options->fps, "Frames per second per camera")->capture_default_str();
  command->add_option("--seconds", options->seconds, "Seconds of frames")->capture_default_str();
  command->add_option("--workers", options->workers, "Optimized mode: worker streams")
      ->capture_default_str();
  command->add_option("--sweep", options->sweep, "Camera counts to sweep, e.g. --sweep 1 5 10 20");
  command->add_option("--llm", options->llm, "LLM shape: llama-3.2-1b-shaped or tiny")
      ->capture_default_str();
  command->add_flag("--no-llm", options->no_llm, "Vision stages only (no LLM/retrieval)");
  command
      ->add_option("--llm-batch", options->llm_batch,
                   "Optimized mode: most LLM requests decoded together")
      ->capture_default_str();
  command->add_option("--new-tokens", options->new_tokens, "Instruction tokens per request")
      ->capture_default_str();
  command->add_option("--archive", options->archive, "Seeded past cases in the store")
      ->capture_default_str();
  command
      ->add_option("--overlay-every", options->overlay_every,
                   "An overlay JPEG for every Nth frame (0 = none)")
      ->capture_default_str();
  add_out_dir_flag(*command, options->out_dir,
                   "Keep the writer's output (frames.jsonl + overlays) under DIR/<mode>-<N>cam",
                   {"--out"});
  command->add_flag("--no-graphs", options->no_graphs, "Optimized mode: no CUDA graphs");
  command->add_flag("--no-busy", options->no_busy, "No CUPTI tracer (no GPU busy time)");
  command->add_option("--trace", options->trace,
                      "Write the Perfetto trace (Chrome JSON) of each run to FILE");
  command->add_flag("--quick", options->quick, "2 seconds of frames (for audit)");
  add_output_flags(*command, options->output);
  command->callback([options, &exit_code] { exit_code = run(*options); });
});

}  // namespace
}  // namespace gpuopt::cli
