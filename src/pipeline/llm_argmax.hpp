// LLM stage: the greedy choice over rows of fp16 logits, each row split over many blocks that
// meet in one 64-bit key per row; the row's last block writes the token. Host-compilable, so the
// GPU tests can drive it with planted logits. docs/llm.md, "One step".
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpuopt/core/status.hpp"

struct CUstream_st;

namespace gpuopt::pipeline::llm_detail {

inline constexpr int kArgmaxThreads = 256;
inline constexpr int kArgmaxLoadsPerThread = 2;  // independent 16-byte (8 x fp16) loads
// Logits per block: a row of V logits takes ceil(V / kArgmaxChunk) blocks.
inline constexpr int kArgmaxChunk = kArgmaxThreads * 8 * kArgmaxLoadsPerThread;

// Per-row meeting point of the row's blocks: the largest key so far and how many blocks are done.
// Zero before the first launch; every launch leaves it zero again (the row's last block resets
// it), so one captured graph can be replayed any number of times.
struct ArgmaxSlot {
  unsigned long long key;  // (order-preserving bits of the logit) << 32 | ~index; 0: none yet
  unsigned int arrived;    // blocks of the row that have merged their key
  unsigned int unused;
};

inline int argmax_blocks_per_row(int vocab) { return (vocab + kArgmaxChunk - 1) / kArgmaxChunk; }

struct ArgmaxArgs {
  const void* logits = nullptr;  // fp16 [rows][vocab]
  int rows = 0, vocab = 0;
  std::int32_t* tokens = nullptr;  // [rows][max_context]
  int max_context = 0;
  const int* position = nullptr;  // device int: the column of `tokens` to write
  float* debug = nullptr;         // optional: fp32 copy of row r at debug + r * debug_stride
  std::size_t debug_stride = 0;
  ArgmaxSlot* slots = nullptr;  // [rows], zero before the first launch (left zero)
};

// Enqueues the choice of every row: the largest logit, the lowest index among equal ones, never a
// NaN (and never -inf: a row with no logit above -inf chooses vocab - 1), written as
// tokens[r][*position] when *position < max_context. `programmatic`: launched as a programmatic
// dependent of the previous kernel (sm_90), as the decode step's other kernels.
Status launch_argmax(const ArgmaxArgs& args, bool programmatic, CUstream_st* stream);

}  // namespace gpuopt::pipeline::llm_detail
