// Result decode kernels of the pipeline (internal): detections above an objectness threshold and
// the segmenter's per-class pixel histogram, written into a small device result record.
#pragma once

#include <cstdint>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::pipeline::detail {

inline constexpr int kSegmentClasses = 8;
// Per frame: [0] detections, [1..8] pixels per segment class.
inline constexpr int kResultWords = 1 + kSegmentClasses;

// detector: [cells, anchors * per_anchor] fp16; objectness is element 4 of each anchor block.
// segmenter: [pixels, kSegmentClasses] fp16. `result` (kResultWords uint32) is zeroed first.
Status decode_results(const std::uint16_t* detector, int cells, int anchors, int per_anchor,
                      float objectness_logit_threshold, const std::uint16_t* segmenter,
                      std::size_t pixels, std::uint32_t* result, runtime::StreamHandle stream);

}  // namespace gpuopt::pipeline::detail
