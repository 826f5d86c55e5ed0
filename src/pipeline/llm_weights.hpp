// LLM stage: the seeded weight hash shared by the device generator and the CPU twin, so both see
// bit-identical int4 tiles, fp16 scales, embeddings and projection without copying weights back.
#pragma once

#include <cstdint>
#include <vector>

#include "gpuopt/pipeline/llm.hpp"

#if defined(__CUDACC__)
#define GPUOPT_LLM_HD __host__ __device__
#else
#define GPUOPT_LLM_HD
#endif

namespace gpuopt::pipeline {

inline constexpr int kLlmGroupSize = 128;

struct LlmMatrixShape {
  const char* name;
  int k, n;
  int count;  // matrices of this shape (one per layer, or 1 for lm_head)
};
// qkv_proj, o_proj, gate_up_proj, down_proj (per layer), lm_head, in that order.
std::vector<LlmMatrixShape> llm_matrix_shapes(const LlmConfig& config);

// Hash streams: one per tensor (and per part of a tensor), so tensors are independent.
enum class LlmMatrixKind : std::uint32_t { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };
GPUOPT_LLM_HD inline std::uint32_t llm_matrix_id(int layer, LlmMatrixKind kind) {
  return static_cast<std::uint32_t>(layer) * 8u + static_cast<std::uint32_t>(kind);
}
inline constexpr std::uint32_t kLlmLmHeadId = 0x100000u;
inline constexpr std::uint32_t kLlmTokenTableId = 0x100001u;
inline constexpr std::uint32_t kLlmProjectionId = 0x100002u;

GPUOPT_LLM_HD inline std::uint64_t llm_mix64(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
GPUOPT_LLM_HD inline std::uint32_t llm_hash32(std::uint64_t seed, std::uint32_t stream,
                                              std::uint64_t index) {
  return static_cast<std::uint32_t>(
      llm_mix64(llm_mix64(seed ^ (std::uint64_t{stream} << 32)) + index) >> 32);
}

// Tile word `index` of matrix `id`: eight random nibbles, symmetric int4 (zero 8). Nibble 0
// (q = -8) becomes 8 (q = 0), so q is -7..7 with 0 twice as likely: mean exactly 0. A mean of
// -0.5 would turn any common offset of the activations into an offset ~sqrt(K)/8 times larger at
// the output, and through the layers every hidden state would collapse onto one direction.
GPUOPT_LLM_HD inline std::uint32_t llm_tile_word(std::uint64_t seed, std::uint32_t id,
                                                 std::uint64_t index) {
  const std::uint32_t w = llm_hash32(seed, id * 2u, index);
  std::uint32_t any = w | (w >> 1);
  any |= any >> 2;  // bit 4j: OR of nibble j's four bits
  return w | ((~any & 0x11111111u) << 3);
}
// Scale `index` of matrix `id` as fp16 bits: m·2^exponent with m uniform in 32..63, so the value
// is exact in fp16 and host and device agree bit for bit without any float rounding.
GPUOPT_LLM_HD inline std::uint16_t llm_scale_bits(std::uint64_t seed, std::uint32_t id,
                                                  std::uint64_t index, int exponent) {
  const std::uint32_t m = 32u + (llm_hash32(seed, id * 2u + 1u, index) & 31u);
  // m·2^e = (m/32)·2^(e+5): biased exponent e+5+15, mantissa (m-32) in its top 5 bits.
  return static_cast<std::uint16_t>(((exponent + 20) << 10) | ((m - 32u) << 5));
}
// Scale exponent for a K-row matrix: the int4 values above have mean square 280/16 = 17.5, so
// scale ≈ 1/sqrt(17.5·K) keeps each output's variance near its input's (mean m is 47.5).
int llm_scale_exponent(int k);

// Token embedding element: (h mod 2048 − 1024)/1024 in [−1, 1), exact in fp16.
GPUOPT_LLM_HD inline float llm_token_embedding(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(static_cast<int>(llm_hash32(seed, kLlmTokenTableId, index) & 2047u) -
                            1024) *
         (1.0f / 1024.0f);
}
// Projection element [hidden][embed_dim]: uniform in [−1, 1) (exact), times `scale` once.
GPUOPT_LLM_HD inline float llm_projection(std::uint64_t seed, std::uint64_t index, float scale) {
  const float u =
      static_cast<float>(llm_hash32(seed, kLlmProjectionId, index) >> 8) * (1.0f / 8388608.0f) -
      1.0f;
  return u * scale;
}
float llm_projection_scale(int hidden);  // sqrt(3 / hidden): unit-variance outputs

}  // namespace gpuopt::pipeline
