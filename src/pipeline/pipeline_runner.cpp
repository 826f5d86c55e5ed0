// The pipeline scenario runner: a dispatcher releases camera frames at their frame rate, vision
// workers push each frame through upload → preprocess → detector → segmenter → decode, frames with
// detections go on to the LLM (instruction + embedding) and retrieval of past cases, and a writer
// thread stores the results.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/pipeline/pipeline.hpp"
#include "gpuopt/pipeline/preprocess.hpp"
#include "gpuopt/platform/nvml.hpp"
#include "gpuopt/runtime/graph.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/trace/chrome_trace.hpp"
#include "gpuopt/trace/summary.hpp"
#include "gpuopt/trace/tracer.hpp"
#include "gpuopt/vector/gpu_search.hpp"
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
constexpr int kFramesPerCamera = 4;  // pre-rendered frames per camera, reused in rotation
static_assert(detail::kResultWords == kVisionWords);

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

// Per-stage GPU time sums of one thread, merged at the end.
struct StageLog {
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, std::uint64_t> > sums;
  void add(const std::string& name, double ms, std::uint64_t calls = 1) {
    auto [it, inserted] = sums.try_emplace(name, 0.0, 0);
    if (inserted) order.push_back(name);
    it->second.first += ms;
    it->second.second += calls;
  }
  void merge(const StageLog& other) {
    for (const auto& name : other.order) {
      const auto& [ms, calls] = other.sums.at(name);
      add(name, ms, calls);
    }
  }
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

// Upload → preprocess → detector → segmenter → decode for one frame at a time on its own stream.
class VisionWorker {
 public:
  ~VisionWorker() {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(rgb_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(input_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(result_device_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(result_host_));
  }

  // `use_graph`: capture the four vision stages after a warm-up pass; on failure run them
  // directly and keep the reason in graph_note().
  Status create(const runtime::Device& device, const PipelineOptions& options, int priority,
                bool use_graph) {
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
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    GPUOPT_CUDA_TRY(cudaMemsetAsync(
        rgb_, 0, static_cast<std::size_t>(options.width) * options.height * 3, stream));
    // Warm-up (cuDNN's first calls load kernels; capture needs them loaded), both modes alike.
    GPUOPT_RETURN_IF_ERROR(vision_stages(stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
    if (use_graph) {
      auto graph = runtime::StageGraph::capture(
          stream_.handle(), [this](runtime::StreamHandle s) { return vision_stages(s); });
      if (graph.ok()) {
        graph_ = std::move(*graph);
        graphed_ = true;
      } else {
        graph_note_ = graph.status().to_string();
        // A failed capture can leave an error behind; clear it before running uncaptured.
        (void)cudaGetLastError();
      }
    }
    return ok_status();
  }

  bool graphed() const { return graphed_; }
  const std::string& graph_note() const { return graph_note_; }
  TensorShape detector_shape() const { return detector_->output_shape(); }

  // One frame, start to finish; returns when its result (and, if asked, a copy of the detector
  // output for an overlay) is on the host.
  Status process(const std::uint8_t* frame, std::size_t bytes, bool sync_each_stage,
                 std::array<std::uint32_t, kVisionWords>& result,
                 std::vector<std::uint16_t>* detector_copy, StageLog& log) {
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    int marks = 0;
    const char* names[6];
    auto mark = [&](const char* name) -> Status {
      GPUOPT_RETURN_IF_ERROR(events_[marks].record(stream_));
      if (marks > 0) names[marks - 1] = name;
      ++marks;
      // Baseline: what framework code does when each model's output is read back (.cpu(), .item()).
      if (sync_each_stage && marks > 1) GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
      return ok_status();
    };
    GPUOPT_RETURN_IF_ERROR(mark(nullptr));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(rgb_, frame, bytes, cudaMemcpyHostToDevice, stream));
    GPUOPT_RETURN_IF_ERROR(mark("upload"));
    if (graphed_) {
      GPUOPT_RETURN_IF_ERROR(graph_.replay(stream_.handle()));
      GPUOPT_RETURN_IF_ERROR(mark("vision (graph)"));
    } else {
      GPUOPT_RETURN_IF_ERROR(preprocess_stage(stream_.handle()));
      GPUOPT_RETURN_IF_ERROR(mark("preprocess"));
      GPUOPT_ASSIGN_OR_RETURN(detections_, detector_->run(input_, stream_.handle()));
      GPUOPT_RETURN_IF_ERROR(mark("detector"));
      GPUOPT_ASSIGN_OR_RETURN(segments_, segmenter_->run(input_, stream_.handle()));
      GPUOPT_RETURN_IF_ERROR(mark("segmenter"));
      GPUOPT_RETURN_IF_ERROR(decode_stage(stream_.handle()));
      GPUOPT_RETURN_IF_ERROR(mark("decode"));
    }
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(result_host_, result_device_,
                                    detail::kResultWords * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, stream));
    if (detector_copy != nullptr) {
      detector_copy->resize(detector_->output_shape().elements());
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(detector_copy->data(), detections_,
                                      detector_copy->size() * sizeof(std::uint16_t),
                                      cudaMemcpyDeviceToHost, stream));
    }
    GPUOPT_RETURN_IF_ERROR(mark("result copy"));
    GPUOPT_RETURN_IF_ERROR(events_[marks - 1].synchronize());
    std::copy(result_host_, result_host_ + detail::kResultWords, result.begin());
    for (int i = 0; i + 1 < marks; ++i) {
      GPUOPT_ASSIGN_OR_RETURN(float ms, runtime::Event::elapsed_ms(events_[i], events_[i + 1]));
      log.add(names[i], ms);
    }
    return ok_status();
  }

 private:
  Status preprocess_stage(runtime::StreamHandle stream) {
    PreprocessParams params;
    params.source_width = options_.width;
    params.source_height = options_.height;
    params.output_size = options_.network_size;
    return preprocess(rgb_, input_, params, stream);
  }
  Status decode_stage(runtime::StreamHandle stream) {
    const TensorShape det = detector_->output_shape();
    const TensorShape seg = segmenter_->output_shape();
    // Objectness logit > 2.2 (probability > 0.9) counts as a detection.
    return detail::decode_results(detections_, det.h * det.w, 3, det.c / 3, 2.2f, segments_,
                                  static_cast<std::size_t>(seg.h) * seg.w, result_device_, stream);
  }
  // Everything after the upload; the networks' output buffers are fixed, so a graph of this
  // sequence replays correctly for every frame.
  Status vision_stages(runtime::StreamHandle stream) {
    GPUOPT_RETURN_IF_ERROR(preprocess_stage(stream));
    GPUOPT_ASSIGN_OR_RETURN(detections_, detector_->run(input_, stream));
    GPUOPT_ASSIGN_OR_RETURN(segments_, segmenter_->run(input_, stream));
    return decode_stage(stream);
  }

  PipelineOptions options_;
  runtime::Stream stream_;
  runtime::Event events_[7];
  std::unique_ptr<ConvNet> detector_, segmenter_;
  const std::uint16_t* detections_ = nullptr;
  const std::uint16_t* segments_ = nullptr;
  std::uint8_t* rgb_ = nullptr;
  std::uint16_t* input_ = nullptr;
  std::uint32_t* result_device_ = nullptr;
  std::uint32_t* result_host_ = nullptr;
  runtime::StageGraph graph_;
  bool graphed_ = false;
  std::string graph_note_;
};

struct LlmRequest {
  std::uint64_t sequence = 0;
  std::array<std::int32_t, kPromptTokens> prompt{};
};

struct CaseOutcome {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint64_t> retrieved;
  std::vector<float> distances;
};

// LLM instruction + embedding, retrieval from the seeded archive, and the new case added to the
// case store. Retrieval reads only the archive (fixed before the run), so every frame's result is
// independent of the order in which frames finish; new cases go to a separate store.
class CaseEngine {
 public:
  ~CaseEngine() {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(d_prompts_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(d_tokens_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFree(d_embeddings_));
    if (pinned_) {
      GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_prompts_));
      GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_tokens_));
      GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_embeddings_));
    } else {
      delete[] h_prompts_;
      delete[] h_tokens_;
      delete[] h_embeddings_;
    }
  }

  Status create(const runtime::Device& device, const PipelineOptions& options, int priority,
                bool pinned) {
    options_ = options;
    pinned_ = pinned;
    LlmConfig config = options.llm_model == "tiny" ? tiny_llm() : llama_1b_shaped();
    // The same config (and so the same kernels) in both modes; the baseline decodes batch 1.
    config.max_batch = options.llm_max_batch;
    config.seed = options.seed;
    GPUOPT_ASSIGN_OR_RETURN(llm_, LlmDecoder::create(config));
    embed_dim_ = config.embed_dim;
    vocab_ = config.vocab;
    GPUOPT_ASSIGN_OR_RETURN(stream_, runtime::Stream::create(device, priority));
    for (auto& event : events_) {
      GPUOPT_ASSIGN_OR_RETURN(event, runtime::Event::create(true));
    }
    const std::size_t batch = static_cast<std::size_t>(config.max_batch);
    const std::size_t prompt_words = batch * kPromptTokens;
    const std::size_t token_words = batch * static_cast<std::size_t>(options.new_tokens);
    const std::size_t embed_words = batch * static_cast<std::size_t>(embed_dim_);
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d_prompts_), prompt_words * 4));
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d_tokens_), token_words * 4));
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d_embeddings_), embed_words * 4));
    if (pinned) {
      GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_prompts_), prompt_words * 4, 0));
      GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_tokens_), token_words * 4, 0));
      GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_embeddings_), embed_words * 4, 0));
    } else {
      h_prompts_ = new std::int32_t[prompt_words];
      h_tokens_ = new std::int32_t[token_words];
      h_embeddings_ = new float[embed_words];
    }
    // The archive of past cases, seeded identically in both modes.
    const auto dim = static_cast<std::size_t>(embed_dim_);
    GPUOPT_ASSIGN_OR_RETURN(
        archive_, vector::GpuDataset::create(dim, vector::Metric::kL2, options.archive_cases));
    std::vector<float> past = seeded_past_cases(options.archive_cases, embed_dim_, options.seed);
    GPUOPT_RETURN_IF_ERROR(
        archive_->append_host(past.data(), options.archive_cases, stream_.handle()));
    GPUOPT_ASSIGN_OR_RETURN(cases_, vector::GpuDataset::create(dim, vector::Metric::kL2, 4096));
    // Warm-up: first decodes and the first search initialise kernels and cuBLAS, in both modes.
    std::vector<LlmRequest> warm(batch);
    for (auto& request : warm) request.prompt.fill(1);
    GPUOPT_RETURN_IF_ERROR(decode(warm.data(), 1));
    if (batch > 1) GPUOPT_RETURN_IF_ERROR(decode(warm.data(), static_cast<int>(batch)));
    GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
    vector::GpuSearchOptions search;
    search.k = static_cast<std::size_t>(options.retrieve_k);
    GPUOPT_RETURN_IF_ERROR(archive_->search(past.data(), 1, search, stream_.handle()).status());
    return ok_status();
  }

  int vocab() const { return vocab_; }
  std::size_t cases_added() const { return cases_->rows(); }

  // The seed users' path: one request decoded alone, its embedding brought to the host and
  // serialised to JSON for the store, parsed there, added and queried through the host entry
  // points.
  Status run_one_through_json(const LlmRequest& request, CaseOutcome& out, StageLog& log) {
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    GPUOPT_RETURN_IF_ERROR(events_[0].record(stream_));
    GPUOPT_RETURN_IF_ERROR(decode(&request, 1));
    GPUOPT_RETURN_IF_ERROR(events_[1].record(stream_));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_tokens_, d_tokens_, options_.new_tokens * 4,
                                    cudaMemcpyDeviceToHost, stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_embeddings_, d_embeddings_, embed_dim_ * 4,
                                    cudaMemcpyDeviceToHost, stream));
    GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
    const std::string text = embedding_to_json_text({h_embeddings_, std::size_t(embed_dim_)});
    GPUOPT_ASSIGN_OR_RETURN(std::vector<float> embedding, embedding_from_json_text(text));
    GPUOPT_RETURN_IF_ERROR(events_[2].record(stream_));
    vector::GpuSearchOptions search;
    search.k = static_cast<std::size_t>(options_.retrieve_k);
    GPUOPT_ASSIGN_OR_RETURN(auto hits,
                            archive_->search(embedding.data(), 1, search, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(events_[3].record(stream_));
    GPUOPT_RETURN_IF_ERROR(cases_->append_host(embedding.data(), 1, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(events_[4].record(stream_));
    GPUOPT_RETURN_IF_ERROR(events_[4].synchronize());
    out.tokens.assign(h_tokens_, h_tokens_ + options_.new_tokens);
    out.retrieved = std::move(hits.positions);
    out.distances = std::move(hits.distances);
    return log_times(log, 1);
  }

  // gpuopt's path: the waiting requests decoded together on this engine's stream, the embeddings
  // appended to the case store device-to-device, the queries searched as one batch.
  Status run_batch(const std::vector<LlmRequest>& requests, std::vector<CaseOutcome>& out,
                   StageLog& log) {
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    const int batch = static_cast<int>(requests.size());
    GPUOPT_RETURN_IF_ERROR(events_[0].record(stream_));
    GPUOPT_RETURN_IF_ERROR(decode(requests.data(), batch));
    GPUOPT_RETURN_IF_ERROR(events_[1].record(stream_));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_tokens_, d_tokens_,
                                    static_cast<std::size_t>(batch) * options_.new_tokens * 4,
                                    cudaMemcpyDeviceToHost, stream));
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_embeddings_, d_embeddings_,
                                    static_cast<std::size_t>(batch) * embed_dim_ * 4,
                                    cudaMemcpyDeviceToHost, stream));
    GPUOPT_RETURN_IF_ERROR(events_[2].record(stream_));
    // The queries must be on the host before search() reads them.
    GPUOPT_RETURN_IF_ERROR(events_[2].synchronize());
    vector::GpuSearchOptions search;
    search.k = static_cast<std::size_t>(options_.retrieve_k);
    GPUOPT_ASSIGN_OR_RETURN(
        auto hits, archive_->search(h_embeddings_, requests.size(), search, stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(events_[3].record(stream_));
    // Zero-copy ingest: the embeddings go from the decoder's buffer into the store on the device.
    GPUOPT_RETURN_IF_ERROR(cases_->append_device(d_embeddings_, requests.size(), stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(events_[4].record(stream_));
    GPUOPT_RETURN_IF_ERROR(events_[4].synchronize());
    out.resize(requests.size());
    const std::size_t k = search.k;
    for (int i = 0; i < batch; ++i) {
      out[i].tokens.assign(h_tokens_ + i * options_.new_tokens,
                           h_tokens_ + (i + 1) * options_.new_tokens);
      out[i].retrieved.assign(hits.positions.begin() + i * k, hits.positions.begin() + (i + 1) * k);
      out[i].distances.assign(hits.distances.begin() + i * k, hits.distances.begin() + (i + 1) * k);
    }
    return log_times(log, static_cast<std::uint64_t>(batch));
  }

 private:
  Status decode(const LlmRequest* requests, int batch) {
    auto stream = static_cast<cudaStream_t>(stream_.handle());
    for (int i = 0; i < batch; ++i) {
      std::copy(requests[i].prompt.begin(), requests[i].prompt.end(),
                h_prompts_ + i * kPromptTokens);
    }
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(d_prompts_, h_prompts_,
                                    static_cast<std::size_t>(batch) * kPromptTokens * 4,
                                    cudaMemcpyHostToDevice, stream));
    return llm_->generate(d_prompts_, batch, kPromptTokens, options_.new_tokens, d_tokens_,
                          d_embeddings_, stream_.handle());
  }
  Status log_times(StageLog& log, std::uint64_t requests) {
    GPUOPT_ASSIGN_OR_RETURN(float llm_ms, runtime::Event::elapsed_ms(events_[0], events_[1]));
    GPUOPT_ASSIGN_OR_RETURN(float search_ms, runtime::Event::elapsed_ms(events_[2], events_[3]));
    GPUOPT_ASSIGN_OR_RETURN(float ingest_ms, runtime::Event::elapsed_ms(events_[3], events_[4]));
    log.add("llm (per call)", llm_ms);
    // Batch time shared over its requests: the mean is the GPU time per request.
    log.add("llm (per request)", llm_ms, requests);
    log.add("retrieval", search_ms);
    log.add("ingest", ingest_ms);
    llm_requests_ += requests;
    return ok_status();
  }

  PipelineOptions options_;
  bool pinned_ = false;
  std::unique_ptr<LlmDecoder> llm_;
  int embed_dim_ = 0, vocab_ = 0;
  runtime::Stream stream_;
  runtime::Event events_[5];
  std::int32_t* d_prompts_ = nullptr;
  std::int32_t* d_tokens_ = nullptr;
  float* d_embeddings_ = nullptr;
  std::int32_t* h_prompts_ = nullptr;
  std::int32_t* h_tokens_ = nullptr;
  float* h_embeddings_ = nullptr;
  std::unique_ptr<vector::GpuDataset> archive_, cases_;
  std::uint64_t llm_requests_ = 0;
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
