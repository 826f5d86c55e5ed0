// LLM stage: the prefill's host planning (llm_prefill.hpp).
#include <algorithm>
#include <string>

#include "pipeline/llm_gemv.hpp"
#include "pipeline/llm_prefill.hpp"

namespace gpuopt::pipeline::llm_detail {

PrefillGemm prefill_gemm_for(int prompt_len) {
  return prompt_len <= kGemvMaxRows ? PrefillGemm::kDecodeGemm : PrefillGemm::kW4A16;
}

std::vector<RowSlice> prefill_row_slices(int rows, int slice_rows) {
  std::vector<RowSlice> slices;
  if (rows <= 0 || slice_rows <= 0) return slices;
  for (int first = 0; first < rows; first += slice_rows) {
    slices.push_back({first, std::min(slice_rows, rows - first)});
  }
  return slices;
}

Status check_prefill_gemm_rows(int rows) {
  if (rows >= kGemvMaxRows && rows % kGemvMaxRows == 0) return ok_status();
  return invalid_argument("LlmDecoderOptions::prefill_gemm_rows=" + std::to_string(rows) +
                          ": must be a positive multiple of 16");
}

kernels::W4A16Options prefill_w4a16_options(int sm_count) {
  kernels::W4A16Options options;
  // The int4 tiles only: no dense fp16 copy for cuBLAS at any M. Deterministic mode never takes
  // that path either; 0 says so where the mode is read alone.
  options.fallback_min_m = 0;
  options.force_path = kernels::W4A16ForcePath::kAuto;
  options.deterministic = true;
  options.sm_count = sm_count;
  return options;
}

}  // namespace gpuopt::pipeline::llm_detail
