// The pipeline scenario runner: a dispatcher releases camera frames at their frame rate, workers
// push each frame through upload → preprocess → detector → segmenter → decode on their stream.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/pipeline.hpp"
#include "gpuopt/pipeline/preprocess.hpp"
#include "gpuopt/platform/nvml.hpp"
#include "gpuopt/runtime/stream.hpp"

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
constexpr int kFramesPerCamera = 4;  // pre-rendered frames per camera, reused in rotation
constexpr int kStages = 5;
constexpr const char* kStageNames[kStages] = {"upload", "preprocess", "detector", "segmenter",
                                              "decode"};

struct Ticket {
  std::uint64_t sequence;
  Clock::time_point arrival;
};

class TicketQueue {
 public:
  void push(Ticket ticket) {
    {
      std::lock_guard lock(mutex_);
      tickets_.push_back(ticket);
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
  bool pop(Ticket& ticket) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !tickets_.empty(); });
    if (tickets_.empty()) return false;
    ticket = tickets_.front();
    tickets_.pop_front();
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Ticket> tickets_;
  bool closed_ = false;
};

// Frames rendered once: pinned in optimized mode (the loader decodes into pinned staging), pageable
// in baseline mode (what a plain numpy/PIL pipeline hands to .cuda()).
class FrameBank {
 public:
  ~FrameBank() {
    for (std::uint8_t* frame : frames_) {
      if (pinned_) {
        GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(frame));
      } else {
        delete[] frame;
      }
    }
  }
  Status create(const PipelineOptions& options, bool pinned) {
    pinned_ = pinned;
    bytes_ = static_cast<std::size_t>(options.width) * options.height * 3;
    for (int camera = 0; camera < options.cameras; ++camera) {
      for (int k = 0; k < kFramesPerCamera; ++k) {
        std::uint8_t* frame = nullptr;
        if (pinned) {
          GPUOPT_CUDA_TRY(
              cudaHostAlloc(reinterpret_cast<void**>(&frame), bytes_, cudaHostAllocDefault));
        } else {
          frame = new std::uint8_t[bytes_];
        }
        frames_.push_back(frame);
        synthesize_frame(camera, static_cast<std::uint64_t>(k), options.width, options.height,
                         frame);
      }
    }
    return ok_status();
  }
  const std::uint8_t* frame(int camera, std::uint64_t index) const {
    return frames_[static_cast<std::size_t>(camera) * kFramesPerCamera + index % kFramesPerCamera];
  }
  std::size_t bytes() const { return bytes_; }

 private:
  bool pinned_ = false;
  std::size_t bytes_ = 0;
  std::vector<std::uint8_t*> frames_;
};

class Worker {
 public:
  ~Worker() {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(rgb_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(input_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(result_device_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(result_host_));
  }

  Status create(const runtime::Device& device, const PipelineOptions& options, int priority) {
    options_ = options;
    GPUOPT_ASSIGN_OR_RETURN(stream_, runtime::Stream::create(device, priority));
    for (auto& event : events_) {
      GPUOPT_ASSIGN_OR_RETURN(event, runtime::Event::create(true));
    }
    const int s = options.network_size;
    TensorShape input{1, s, s, 3};
    GPUOPT_ASSIGN_OR_RETURN(detector_,
                            ConvNet::create("detector", input, detector_layers(), options.seed));
    GPUOPT_ASSIGN_OR_RETURN(
        segmenter_, ConvNet::create("segmenter", input, segmenter_layers(), options.seed + 1));
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&rgb_),
                               static_cast<std::size_t>(options.width) * options.height * 3));
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&input_), input.elements() * 2));
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&result_device_),
                               detail::kResultWords * sizeof(std::uint32_t)));
    GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&result_host_),
                                  detail::kResultWords * sizeof(std::uint32_t),
                                  cudaHostAllocDefault));
    return ok_status();
  }

  // One frame, start to finish; returns when its result is on the host.
  Status process(const std::uint8_t* frame, std::size_t bytes, bool sync_each_stage,
                 std::vector<std::uint32_t>& result, double stage_ms[kStages]) {
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    auto mark = [&](int index) -> Status {
      GPUOPT_RETURN_IF_ERROR(events_[index].record(stream_));
      // Baseline: what framework code does when each model's output is read back (.cpu(), .item()).
      if (sync_each_stage && index > 0) GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
      return ok_status();
    };
    GPUOPT_RETURN_IF_ERROR(mark(0));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(rgb_, frame, bytes, cudaMemcpyHostToDevice, stream));
    GPUOPT_RETURN_IF_ERROR(mark(1));
    PreprocessParams params;
    params.source_width = options_.width;
    params.source_height = options_.height;
    params.output_size = options_.network_size;
    GPUOPT_RETURN_IF_ERROR(preprocess(rgb_, input_, params, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark(2));
    GPUOPT_ASSIGN_OR_RETURN(const std::uint16_t* detections,
                            detector_->run(input_, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark(3));
    GPUOPT_ASSIGN_OR_RETURN(const std::uint16_t* segments,
                            segmenter_->run(input_, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark(4));
    const TensorShape det = detector_->output_shape();
    const TensorShape seg = segmenter_->output_shape();
    // Objectness logit > 2.2 (probability > 0.9) counts as a detection.
    GPUOPT_RETURN_IF_ERROR(detail::decode_results(detections, det.h * det.w, 3, det.c / 3, 2.2f,
                                                  segments, static_cast<std::size_t>(seg.h) * seg.w,
                                                  result_device_, stream_.handle()));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(result_host_, result_device_,
                                    detail::kResultWords * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, stream));
    GPUOPT_RETURN_IF_ERROR(events_[5].record(stream_));
    GPUOPT_RETURN_IF_ERROR(events_[5].synchronize());
    result.assign(result_host_, result_host_ + detail::kResultWords);
    for (int i = 0; i < kStages; ++i) {
      GPUOPT_ASSIGN_OR_RETURN(float ms, runtime::Event::elapsed_ms(events_[i], events_[i + 1]));
      stage_ms[i] = ms;
    }
    return ok_status();
  }

 private:
  PipelineOptions options_;
  runtime::Stream stream_;
  runtime::Event events_[kStages + 1];
  std::unique_ptr<ConvNet> detector_, segmenter_;
  std::uint8_t* rgb_ = nullptr;
  std::uint16_t* input_ = nullptr;
  std::uint32_t* result_device_ = nullptr;
  std::uint32_t* result_host_ = nullptr;
};

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double position = q * static_cast<double>(values.size() - 1);
  auto lower = static_cast<std::size_t>(position);
  std::size_t upper = std::min(lower + 1, values.size() - 1);
  return values[lower] + (values[upper] - values[lower]) * (position - static_cast<double>(lower));
}

}  // namespace

StatusOr<PipelineResult> run_pipeline(const PipelineOptions& options) {
  GPUOPT_RETURN_IF_ERROR(check_pipeline_options(options));
  GPUOPT_ASSIGN_OR_RETURN(runtime::Device device, runtime::Device::open(0));
  const bool optimized = options.mode == PipelineMode::kOptimized;

  FrameBank bank;
  GPUOPT_RETURN_IF_ERROR(bank.create(options, /*pinned=*/optimized));
  const int worker_count = optimized ? options.workers : 1;
  const int priority = optimized ? device.properties().greatest_priority : 0;
  std::vector<std::unique_ptr<Worker> > workers;
  for (int i = 0; i < worker_count; ++i) {
    auto worker = std::make_unique<Worker>();
    GPUOPT_RETURN_IF_ERROR(worker->create(device, options, priority));
    workers.push_back(std::move(worker));
  }

  const auto total = static_cast<std::uint64_t>(std::llround(options.seconds * options.fps)) *
                     static_cast<std::uint64_t>(options.cameras);
  std::vector<std::vector<std::uint32_t> > results(total);
  std::vector<double> latency_ms(total, 0);
  std::vector<std::array<double, kStages> > stage_ms(total);
  TicketQueue queue;
  std::mutex error_mutex;
  Status first_error;
  std::atomic<bool> failed{false};
  Clock::time_point last_done = Clock::now();
  std::mutex done_mutex;

  // NVML GPU-Util over the same window, so the report can set it beside the pipeline's figures.
  std::atomic<bool> sampling{true};
  std::vector<double> util_samples;
  std::string util_note;
  std::thread sampler;
  auto nvml = platform::Nvml::instance();
  if (nvml.ok()) {
    auto handle = (*nvml)->device_by_index(0);
    if (handle.ok()) {
      sampler = std::thread([&, handle = *handle, nvml = *nvml] {
        while (sampling.load()) {
          auto util = nvml->utilization(handle);
          if (util.ok()) util_samples.push_back(util->gpu_percent);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
    } else {
      util_note = handle.status().message();
    }
  } else {
    util_note = nvml.status().message();
  }

  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (auto& worker : workers) {
    threads.emplace_back([&, w = worker.get()] {
      if (Status s = device.make_current(); !s.ok()) {
        std::lock_guard lock(error_mutex);
        if (first_error.ok()) first_error = s;
        failed = true;
        return;
      }
      Ticket ticket{};
      while (queue.pop(ticket)) {
        if (failed.load()) continue;
        const int camera = static_cast<int>(ticket.sequence % options.cameras);
        const std::uint64_t index = ticket.sequence / options.cameras;
        double ms[kStages];
        Status s = w->process(bank.frame(camera, index), bank.bytes(), !optimized,
                              results[ticket.sequence], ms);
        if (!s.ok()) {
          std::lock_guard lock(error_mutex);
          if (first_error.ok()) first_error = s;
          failed = true;
          continue;
        }
        auto done = Clock::now();
        latency_ms[ticket.sequence] =
            std::chrono::duration<double, std::milli>(done - ticket.arrival).count();
        std::copy(ms, ms + kStages, stage_ms[ticket.sequence].begin());
        std::lock_guard lock(done_mutex);
        last_done = std::max(last_done, done);
      }
    });
  }
  // Dispatcher: frames arrive round-robin over cameras at cameras × fps.
  const double interval_s = 1.0 / (options.fps * options.cameras);
  for (std::uint64_t sequence = 0; sequence < total && !failed.load(); ++sequence) {
    auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           interval_s * static_cast<double>(sequence)));
    std::this_thread::sleep_until(due);
    queue.push({sequence, std::max(due, Clock::now())});
  }
  queue.close();
  for (auto& thread : threads) thread.join();
  sampling = false;
  if (sampler.joinable()) sampler.join();
  if (!first_error.ok())
    return first_error.with_context(fmt::format("pipeline ({})", mode_name(options.mode)));

  PipelineResult result;
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
  for (int i = 0; i < kStages; ++i) {
    double stage_sum = 0;
    for (const auto& frame : stage_ms) stage_sum += frame[i];
    result.stages.push_back({kStageNames[i], total ? stage_sum / static_cast<double>(total) : 0});
  }
  if (!util_samples.empty()) {
    double util_sum = 0;
    for (double v : util_samples) util_sum += v;
    result.gpu_util_percent = util_sum / static_cast<double>(util_samples.size());
  } else if (util_note.empty()) {
    util_note = "no NVML utilization samples";
  }
  result.gpu_util_note = util_note;
  result.checksum = checksum_results(results);
  for (const auto& frame : results)
    result.frames_with_detections += frame.empty() ? 0 : (frame[0] > 0);
  return result;
}
#endif

}  // namespace gpuopt::pipeline
