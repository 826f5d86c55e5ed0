// LLM stage: the prefill's host planning (which GEMM runs a prompt's rows, how the rows are cut
// into GEMM launches, the W4A16 options), chosen without a device so CPU tests reach it.
// docs/llm.md, "Prefill".
#pragma once

#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::pipeline::llm_detail {

enum class PrefillGemm {
  // The decode GEMM (llm_gemv.hpp) on 16-row slices of the prompt rows, with its RMSNorm input,
  // residual output and SiLU pair fused: the same arithmetic per row as a decode step.
  kDecodeGemm,
  // W4A16Gemm on the same int4 tiles in deterministic mode (the mma.sync x-rows kernel, fixed
  // k-splits), with RMSNorm, residual add and SiLU as separate kernels.
  kW4A16,
};

// Chosen from the prompt length alone, never from the batch, so that a request's bits do not
// depend on the batch: prompts of up to 16 tokens take the decode GEMM (at most one launch per
// 16 rows, no more weight passes than the token-by-token steps), longer ones W4A16Gemm.
PrefillGemm prefill_gemm_for(int prompt_len);

struct RowSlice {
  int first = 0;
  int rows = 0;
};
// [0, rows) cut into slices of `slice_rows` (the last one shorter); empty when rows <= 0.
std::vector<RowSlice> prefill_row_slices(int rows, int slice_rows);

// LlmDecoderOptions::prefill_gemm_rows: OK, or INVALID_ARGUMENT naming the value.
Status check_prefill_gemm_rows(int rows);

// The W4A16 options of the prefill GEMMs: deterministic (each row's bits independent of M and of
// the other rows, no float atomics, never cuBLAS), planned for `sm_count` SMs (0: the device's).
kernels::W4A16Options prefill_w4a16_options(int sm_count);

}  // namespace gpuopt::pipeline::llm_detail
