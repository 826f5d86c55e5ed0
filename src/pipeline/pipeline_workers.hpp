// The pipeline runner's parts (internal; CUDA builds only): the frames, the vision worker
// (pipeline_vision_worker.cpp) and the case engine (pipeline_case_engine.cpp) that the orchestrator
// (pipeline_runner.cpp) drives from its threads.
#pragma once

#if GPUOPT_CUDA
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/pipeline/convnet.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "gpuopt/pipeline/pipeline.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/graph.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/vector/gpu_search.hpp"

namespace gpuopt::pipeline::runner {

inline constexpr int kFramesPerCamera = 4;  // pre-rendered frames per camera, reused in rotation

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
  ~FrameBank();
  Status create(const PipelineOptions& options, bool pinned);
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
  ~VisionWorker();

  // `use_graph`: capture the four vision stages after a warm-up pass; on failure run them
  // directly and keep the reason in graph_note().
  Status create(const runtime::Device& device, const PipelineOptions& options, int priority,
                bool use_graph);

  bool graphed() const { return graphed_; }
  const std::string& graph_note() const { return graph_note_; }
  TensorShape detector_shape() const { return detector_->output_shape(); }

  // One frame, start to finish; returns when its result (and, if asked, a copy of the detector
  // output for an overlay) is on the host.
  Status process(const std::uint8_t* frame, std::size_t bytes, bool sync_each_stage,
                 std::array<std::uint32_t, kVisionWords>& result,
                 std::vector<std::uint16_t>* detector_copy, StageLog& log);

 private:
  Status preprocess_stage(runtime::StreamHandle stream);
  Status decode_stage(runtime::StreamHandle stream);
  // Everything after the upload; the networks' output buffers are fixed, so a graph of this
  // sequence replays correctly for every frame.
  Status vision_stages(runtime::StreamHandle stream);

  PipelineOptions options_;
  runtime::Stream stream_;
  runtime::Event events_[7];
  std::unique_ptr<ConvNet> detector_, segmenter_;
  const std::uint16_t* detections_ = nullptr;
  const std::uint16_t* segments_ = nullptr;
  runtime::DeviceBuffer rgb_;            // [height, width, 3] uint8
  runtime::DeviceBuffer input_;          // [1, size, size, 3] fp16
  runtime::DeviceBuffer result_device_;  // [kResultWords] uint32
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
  ~CaseEngine();

  Status create(const runtime::Device& device, const PipelineOptions& options, int priority,
                bool pinned);

  int vocab() const { return vocab_; }
  std::size_t cases_added() const { return cases_->rows(); }

  // The seed users' path: one request decoded alone, its embedding brought to the host and
  // serialised to JSON for the store, parsed there, added and queried through the host entry
  // points.
  Status run_one_through_json(const LlmRequest& request, CaseOutcome& out, StageLog& log);

  // gpuopt's path: the waiting requests decoded together on this engine's stream, the embeddings
  // appended to the case store device-to-device, the queries searched as one batch.
  Status run_batch(const std::vector<LlmRequest>& requests, std::vector<CaseOutcome>& out,
                   StageLog& log);

 private:
  Status decode(const LlmRequest* requests, int batch);
  Status log_times(StageLog& log, std::uint64_t requests);

  PipelineOptions options_;
  bool pinned_ = false;
  std::unique_ptr<LlmDecoder> llm_;
  int embed_dim_ = 0, vocab_ = 0;
  runtime::Stream stream_;
  runtime::Event events_[5];
  runtime::DeviceBuffer d_prompts_;     // [max_batch, kPromptTokens] int32
  runtime::DeviceBuffer d_tokens_;      // [max_batch, new_tokens] int32
  runtime::DeviceBuffer d_embeddings_;  // [max_batch, embed_dim] fp32
  std::int32_t* h_prompts_ = nullptr;
  std::int32_t* h_tokens_ = nullptr;
  float* h_embeddings_ = nullptr;
  std::unique_ptr<vector::GpuDataset> archive_, cases_;
  std::uint64_t llm_requests_ = 0;
};

}  // namespace gpuopt::pipeline::runner
#endif  // GPUOPT_CUDA
