// The pipeline scenario runner's orchestrator: a dispatcher releases camera frames at their frame
// rate, vision workers (pipeline_vision_worker.cpp) push each frame through upload → preprocess →
// detector → segmenter → decode, frames with detections go on to the case engine
// (pipeline_case_engine.cpp: LLM instruction + embedding, retrieval of past cases), and a writer
// thread stores the results.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "gpuopt/pipeline/pipeline.hpp"
#include "gpuopt/platform/nvml.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/trace/chrome_trace.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/tracer.hpp"
#include "pipeline_workers.hpp"
#include "pipeline_writer.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

#include "decode.hpp"
#include "gpuopt/core/cuda_check.hpp"
#endif

namespace gpuopt::pipeline {

#if !GPUOPT_CUDA
StatusOr<PipelineResult> run_pipeline(const PipelineOptions& options) {
  GPUOPT_RETURN_IF_ERROR(check_pipeline_options(options));
  return unimplemented("pipeline: gpuopt was built without CUDA; the pipeline needs a GPU");
}
#else
namespace {

using Clock = std::chrono::steady_clock;
using runner::CaseEngine;
using runner::CaseOutcome;
using runner::FrameBank;
using runner::LlmRequest;
using runner::StageLog;
using runner::VisionWorker;

struct Ticket {
  std::uint64_t sequence;
  Clock::time_point arrival;
};

// A closable FIFO shared by producer and consumer threads.
template <typename T>
class WorkQueue {
 public:
  void push(T item) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
  }
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }
  // Waits for at least one item; then takes up to `max_items` of those waiting. Empty = closed.
  std::vector<T> pop_up_to(std::size_t max_items) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !items_.empty(); });
    std::vector<T> taken;
    while (!items_.empty() && taken.size() < max_items) {
      taken.push_back(std::move(items_.front()));
      items_.pop_front();
    }
    return taken;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
  bool closed_ = false;
};

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double position = q * static_cast<double>(values.size() - 1);
  auto lower = static_cast<std::size_t>(position);
  std::size_t upper = std::min(lower + 1, values.size() - 1);
  return values[lower] + (values[upper] - values[lower]) * (position - static_cast<double>(lower));
}

std::uint64_t realtime_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

// Records the first error of any thread and tells every thread to stop.
struct ErrorLatch {
  std::mutex mutex;
  Status first;
  std::atomic<bool> failed{false};
  void set(const Status& status) {
    std::lock_guard lock(mutex);
    if (first.ok()) first = status;
    failed = true;
  }
};

}  // namespace

StatusOr<PipelineResult> run_pipeline(const PipelineOptions& options) {
  GPUOPT_RETURN_IF_ERROR(check_pipeline_options(options));
  GPUOPT_ASSIGN_OR_RETURN(runtime::Device device, runtime::Device::open(0));
  const bool optimized = options.mode == PipelineMode::kOptimized;

  FrameBank bank;
  GPUOPT_RETURN_IF_ERROR(bank.create(options, /*pinned=*/optimized));
  const int worker_count = optimized ? options.workers : 1;
  // Vision gates every frame, so its streams get the highest priority; the batched LLM stream runs
  // at the default priority and fills the gaps between vision kernels.
  const int vision_priority = optimized ? device.properties().greatest_priority : 0;
  std::vector<std::unique_ptr<VisionWorker> > workers;
  std::string graphs_note;
  bool all_graphed = optimized && options.graphs;
  for (int i = 0; i < worker_count; ++i) {
    auto worker = std::make_unique<VisionWorker>();
    GPUOPT_RETURN_IF_ERROR(
        worker->create(device, options, vision_priority, optimized && options.graphs));
    if (optimized && options.graphs && !worker->graphed()) {
      all_graphed = false;
      if (graphs_note.empty())
        graphs_note = "capture failed, ran uncaptured: " + worker->graph_note();
    }
    workers.push_back(std::move(worker));
  }
  if (!optimized) graphs_note = "baseline runs every stage directly";
  if (optimized && !options.graphs) graphs_note = "graphs off (--no-graphs)";
  std::unique_ptr<CaseEngine> engine;
  if (options.llm) {
    engine = std::make_unique<CaseEngine>();
    GPUOPT_RETURN_IF_ERROR(engine->create(device, options, 0, /*pinned=*/optimized)
                               .with_context("pipeline: LLM + retrieval set-up"));
  }

  // The writer's folder: the caller's, or a temporary one removed at the end.
  const bool temporary_output = options.output_dir.empty();
  const std::filesystem::path output_dir =
      temporary_output ? std::filesystem::temp_directory_path() /
                             fmt::format("gpuopt-pipeline-{}-{}-{}", ::getpid(),
                                         mode_name(options.mode), options.cameras)
                       : std::filesystem::path(options.output_dir);
  const TensorShape det_shape = workers.front()->detector_shape();
  detail::DetectorLayout layout;
  layout.grid_h = det_shape.h;
  layout.grid_w = det_shape.w;
  layout.anchors = 3;
  layout.per_anchor = det_shape.c / 3;
  layout.network_size = options.network_size;
  detail::ResultWriter writer;
  GPUOPT_RETURN_IF_ERROR(writer.start(output_dir, layout, options.width, options.height));

  const auto total = static_cast<std::uint64_t>(std::llround(options.seconds * options.fps)) *
                     static_cast<std::uint64_t>(options.cameras);
  std::vector<FrameRecord> records(total);
  std::vector<std::vector<std::uint16_t> > overlay_detector(total);
  std::vector<Clock::time_point> arrivals(total);
  std::vector<double> latency_ms(total, 0);
  WorkQueue<Ticket> queue;
  WorkQueue<LlmRequest> llm_queue;
  ErrorLatch errors;
  Clock::time_point last_done = Clock::now();
  std::mutex done_mutex;
  std::atomic<std::uint64_t> llm_batches{0};

  // NVML GPU-Util over the same window, so the report can set it beside the tracer's busy time.
  std::atomic<bool> sampling{true};
  std::vector<trace::UtilizationSample> util_samples;
  std::string util_note;
  std::thread sampler;
  auto nvml = platform::Nvml::instance();
  if (nvml.ok()) {
    auto handle = (*nvml)->device_by_index(0);
    if (handle.ok()) {
      sampler = std::thread([&, handle = *handle, nvml = *nvml] {
        while (sampling.load()) {
          auto util = nvml->utilization(handle);
          if (util.ok()) {
            util_samples.push_back({realtime_ns(), static_cast<std::uint32_t>(device.ordinal()),
                                    static_cast<unsigned>(util->gpu_percent)});
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
    } else {
      util_note = handle.status().message();
    }
  } else {
    util_note = nvml.status().message();
  }

  // Kernel and copy activity only: API records would multiply the tracer's overhead.
  trace::TracerOptions tracer_options;
  tracer_options.runtime_api = false;
  tracer_options.nvtx = false;
  tracer_options.synchronization = false;
  trace::Tracer tracer(tracer_options);
  std::string trace_note;
  if (options.trace_busy || !options.trace_path.empty()) {
    if (Status started = tracer.start(); !started.ok()) trace_note = started.to_string();
  } else {
    trace_note = "tracing off";
  }

  // A frame is done when its results are complete on the host; the writer stores it afterwards.
  auto finish = [&](std::uint64_t sequence) {
    auto done = Clock::now();
    latency_ms[sequence] =
        std::chrono::duration<double, std::milli>(done - arrivals[sequence]).count();
    records[sequence].latency_ms = latency_ms[sequence];
    detail::WriterItem item;
    item.record = records[sequence];
    item.detector = std::move(overlay_detector[sequence]);
    item.frame = bank.frame(records[sequence].camera, records[sequence].index);
    writer.push(std::move(item));
    std::lock_guard lock(done_mutex);
    last_done = std::max(last_done, done);
  };
  // The vision part of a frame; returns the LLM request when the frame has detections.
  auto vision = [&](VisionWorker& worker, const Ticket& ticket, StageLog& log,
                    std::optional<LlmRequest>& request) -> Status {
    FrameRecord& record = records[ticket.sequence];
    record.sequence = ticket.sequence;
    record.camera = static_cast<int>(ticket.sequence % options.cameras);
    record.index = ticket.sequence / options.cameras;
    arrivals[ticket.sequence] = ticket.arrival;
    const bool overlay = options.overlay_every > 0 && ticket.sequence % options.overlay_every == 0;
    GPUOPT_RETURN_IF_ERROR(
        worker.process(bank.frame(record.camera, record.index), bank.bytes(), !optimized,
                       record.vision, overlay ? &overlay_detector[ticket.sequence] : nullptr, log));
    request.reset();
    if (engine && record.vision[0] > 0) {
      GPUOPT_ASSIGN_OR_RETURN(auto prompt,
                              derive_prompt(record.camera, record.vision, engine->vocab()));
      record.prompt.assign(prompt.begin(), prompt.end());
      request = LlmRequest{ticket.sequence, prompt};
    }
    return ok_status();
  };
  auto store_outcome = [&](std::uint64_t sequence, CaseOutcome& outcome) {
    records[sequence].tokens = std::move(outcome.tokens);
    records[sequence].retrieved = std::move(outcome.retrieved);
    records[sequence].retrieved_distances = std::move(outcome.distances);
  };

  std::vector<StageLog> logs(workers.size() + 1);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers.size(); ++w) {
    threads.emplace_back([&, w] {
      if (Status s = device.make_current(); !s.ok()) return errors.set(s);
      for (;;) {
        auto tickets = queue.pop_up_to(1);
        if (tickets.empty()) return;
        if (errors.failed.load()) continue;
        std::optional<LlmRequest> request;
        Status s = vision(*workers[w], tickets[0], logs[w], request);
        if (s.ok() && request && optimized) {
          llm_queue.push(*request);  // the LLM worker finishes this frame
          continue;
        }
        if (s.ok() && request) {
          // Baseline: the same worker decodes the request alone, right away.
          CaseOutcome outcome;
          s = engine->run_one_through_json(*request, outcome, logs[w]);
          if (s.ok()) store_outcome(request->sequence, outcome);
          ++llm_batches;
        }
        if (!s.ok()) {
          errors.set(s);
          continue;
        }
        finish(tickets[0].sequence);
      }
    });
  }
  std::thread llm_thread;
  if (optimized && engine) {
    llm_thread = std::thread([&] {
      if (Status s = device.make_current(); !s.ok()) return errors.set(s);
      for (;;) {
        auto requests = llm_queue.pop_up_to(static_cast<std::size_t>(options.llm_max_batch));
        if (requests.empty()) return;
        if (errors.failed.load()) continue;
        std::vector<CaseOutcome> outcomes;
        if (Status s = engine->run_batch(requests, outcomes, logs.back()); !s.ok()) {
          errors.set(s);
          continue;
        }
        ++llm_batches;
        for (std::size_t i = 0; i < requests.size(); ++i) {
          store_outcome(requests[i].sequence, outcomes[i]);
          finish(requests[i].sequence);
        }
      }
    });
  }
  // Dispatcher: frames arrive round-robin over cameras at cameras × fps.
  const double interval_s = 1.0 / (options.fps * options.cameras);
  for (std::uint64_t sequence = 0; sequence < total && !errors.failed.load(); ++sequence) {
    auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           interval_s * static_cast<double>(sequence)));
    std::this_thread::sleep_until(due);
    queue.push({sequence, std::max(due, Clock::now())});
  }
  queue.close();
  for (auto& thread : threads) thread.join();
  llm_queue.close();
  if (llm_thread.joinable()) llm_thread.join();

  PipelineResult result;
  {
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      result.device_memory_used_mib = static_cast<double>(total_bytes - free_bytes) / (1 << 20);
    } else {
      (void)cudaGetLastError();
    }
  }
  std::optional<trace::TraceData> trace_data;
  if (tracer.active()) {
    auto stopped = tracer.stop();
    if (stopped.ok()) {
      trace_data = std::move(*stopped);
    } else {
      trace_note = stopped.status().to_string();
    }
  }
  sampling = false;
  if (sampler.joinable()) sampler.join();
  Status written = writer.finish();
  if (!errors.first.ok())
    return errors.first.with_context(fmt::format("pipeline ({})", mode_name(options.mode)));
  GPUOPT_RETURN_IF_ERROR(written);

  result.mode = options.mode;
  result.cameras = options.cameras;
  result.frames = total;
  result.wall_s = std::chrono::duration<double>(last_done - start).count();
  result.throughput_fps = result.wall_s > 0 ? static_cast<double>(total) / result.wall_s : 0;
  result.offered_fps = options.fps * options.cameras;
  result.latency_p50_ms = percentile(latency_ms, 0.5);
  result.latency_p99_ms = percentile(latency_ms, 0.99);
  double sum = 0;
  for (double v : latency_ms) sum += v;
  result.latency_mean_ms = total ? sum / static_cast<double>(total) : 0;
  StageLog merged;
  for (const auto& log : logs) merged.merge(log);
  for (const auto& name : merged.order) {
    const auto& [ms, calls] = merged.sums.at(name);
    result.stages.push_back({name, calls ? ms / static_cast<double>(calls) : 0, calls});
  }
  if (!util_samples.empty()) {
    double util_sum = 0;
    for (const auto& sample : util_samples) util_sum += sample.gpu_percent;
    result.gpu_util_percent = util_sum / static_cast<double>(util_samples.size());
  } else if (util_note.empty()) {
    util_note = "no NVML utilization samples";
  }
  result.gpu_util_note = util_note;
  if (trace_data) {
    trace::SummaryOptions summary_options;
    summary_options.nvml_samples = util_samples;
    const trace::TraceSummary summary = trace::summarize(*trace_data, summary_options);
    result.traced_kernels = summary.kernels;
    for (const auto& d : summary.devices) {
      if (d.device_id != static_cast<std::uint32_t>(device.ordinal())) continue;
      result.gpu_busy_percent = d.kernel_busy_percent;
      result.gpu_busy_percent_of_active = d.kernel_busy_percent_of_active;
      if (summary.window_ns > 0) {
        result.gpu_any_engine_busy_percent = 100.0 * static_cast<double>(d.any_engine_busy_ns) /
                                             static_cast<double>(summary.window_ns);
      }
    }
    if (summary.dropped_records > 0) {
      trace_note =
          fmt::format("{} records dropped: busy time is a lower bound", summary.dropped_records);
    }
    if (!options.trace_path.empty()) {
      if (Status s = trace::write_chrome_trace(*trace_data, options.trace_path); s.ok()) {
        result.trace_file = options.trace_path;
      } else {
        trace_note = s.to_string();
      }
    }
  }
  result.trace_note = trace_note;
  std::vector<std::vector<std::uint32_t> > words;
  words.reserve(records.size());
  for (const auto& record : records) {
    words.push_back(checksum_words(record));
    result.frames_with_detections += record.vision[0] > 0;
  }
  result.checksum = checksum_results(words);
  result.llm_model = options.llm ? options.llm_model : "off";
  result.llm_batches = llm_batches.load();
  for (const auto& record : records) result.llm_requests += record.prompt.empty() ? 0 : 1;
  result.archive_cases = options.llm ? options.archive_cases : 0;
  result.cases_added = engine ? engine->cases_added() : 0;
  result.graphs_used = all_graphed;
  result.graphs_note = graphs_note;
  result.records_written = writer.records_written();
  result.overlays_written = writer.overlays_written();
  if (temporary_output) {
    std::error_code ignored;
    std::filesystem::remove_all(output_dir, ignored);
  } else {
    result.output_dir = output_dir.string();
  }
  return result;
}
#endif

}  // namespace gpuopt::pipeline
