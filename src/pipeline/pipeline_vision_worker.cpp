// The pipeline's frames and its vision worker: upload → preprocess → detector → segmenter → decode
// for one frame at a time on the worker's own stream, optionally replayed as one CUDA graph.
#include "pipeline_workers.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>

#include "decode.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/pipeline/preprocess.hpp"

namespace gpuopt::pipeline::runner {

static_assert(detail::kResultWords == kVisionWords);

FrameBank::~FrameBank() {
  for (std::uint8_t* frame : frames_) {
    if (pinned_) {
      GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(frame));
    } else {
      delete[] frame;
    }
  }
}

Status FrameBank::create(const PipelineOptions& options, bool pinned) {
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
      synthesize_frame(camera, static_cast<std::uint64_t>(k), options.width, options.height, frame);
    }
  }
  return ok_status();
}

VisionWorker::~VisionWorker() { GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(result_host_)); }

Status VisionWorker::create(const runtime::Device& device, const PipelineOptions& options,
                            int priority, bool use_graph) {
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
  GPUOPT_ASSIGN_OR_RETURN(rgb_, runtime::DeviceBuffer::allocate(
                                    static_cast<std::size_t>(options.width) * options.height * 3));
  GPUOPT_ASSIGN_OR_RETURN(input_, runtime::DeviceBuffer::allocate(input.elements() * 2));
  GPUOPT_ASSIGN_OR_RETURN(result_device_, runtime::DeviceBuffer::allocate(detail::kResultWords *
                                                                          sizeof(std::uint32_t)));
  GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&result_host_),
                                detail::kResultWords * sizeof(std::uint32_t),
                                cudaHostAllocDefault));
  GPUOPT_RETURN_IF_ERROR(rgb_.zero(stream_.handle()));
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

Status VisionWorker::process(const std::uint8_t* frame, std::size_t bytes, bool sync_each_stage,
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
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(rgb_.data(), frame, bytes, cudaMemcpyHostToDevice, stream));
  GPUOPT_RETURN_IF_ERROR(mark("upload"));
  if (graphed_) {
    GPUOPT_RETURN_IF_ERROR(graph_.replay(stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark("vision (graph)"));
  } else {
    GPUOPT_RETURN_IF_ERROR(preprocess_stage(stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark("preprocess"));
    GPUOPT_ASSIGN_OR_RETURN(detections_,
                            detector_->run(input_.data_as<std::uint16_t>(), stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark("detector"));
    GPUOPT_ASSIGN_OR_RETURN(segments_,
                            segmenter_->run(input_.data_as<std::uint16_t>(), stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark("segmenter"));
    GPUOPT_RETURN_IF_ERROR(decode_stage(stream_.handle()));
    GPUOPT_RETURN_IF_ERROR(mark("decode"));
  }
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(result_host_, result_device_.data(),
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

Status VisionWorker::preprocess_stage(runtime::StreamHandle stream) {
  PreprocessParams params;
  params.source_width = options_.width;
  params.source_height = options_.height;
  params.output_size = options_.network_size;
  return preprocess(rgb_.data_as<std::uint8_t>(), input_.data_as<std::uint16_t>(), params, stream);
}

Status VisionWorker::decode_stage(runtime::StreamHandle stream) {
  const TensorShape det = detector_->output_shape();
  const TensorShape seg = segmenter_->output_shape();
  // Objectness logit > 2.2 (probability > 0.9) counts as a detection.
  return detail::decode_results(detections_, det.h * det.w, 3, det.c / 3, 2.2f, segments_,
                                static_cast<std::size_t>(seg.h) * seg.w,
                                result_device_.data_as<std::uint32_t>(), stream);
}

Status VisionWorker::vision_stages(runtime::StreamHandle stream) {
  GPUOPT_RETURN_IF_ERROR(preprocess_stage(stream));
  GPUOPT_ASSIGN_OR_RETURN(detections_, detector_->run(input_.data_as<std::uint16_t>(), stream));
  GPUOPT_ASSIGN_OR_RETURN(segments_, segmenter_->run(input_.data_as<std::uint16_t>(), stream));
  return decode_stage(stream);
}

}  // namespace gpuopt::pipeline::runner
#endif  // GPUOPT_CUDA
