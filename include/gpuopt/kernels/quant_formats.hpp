// 4-bit weight formats as checkpoints store them (GPTQ v1/v2, AWQ) and their logical unpacked form.
// Checkpoint tensors are unpacked once at load; the kernel layout is built from the unpacked form
// (w4a16.hpp), so every format reaches the GPU through the same code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::kernels {

// IEEE half and bfloat16 bit patterns <-> float, round to nearest even (host code, no CUDA types).
float fp16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16_bits(float value);
float bf16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float value);

enum class QuantFormat { kGptq, kAwq };
// GPTQ v1 checkpoints store zero-1 in qzeros (the historical off-by-one); v2 stores the zero
// itself.
enum class GptqZeros { kV1MinusOne, kV2 };

std::string_view quant_format_name(QuantFormat format);
StatusOr<QuantFormat> parse_quant_format(std::string_view text);

// One quantized linear layer exactly as the checkpoint tensors hold it (int32 words, fp16 scales).
// GPTQ: qweight [K/8, N] (8 consecutive k per word, k%8 at bits 4*(k%8)), qzeros [G, N/8]
//       (8 consecutive n per word), scales [G, N], optional g_idx [K].
// AWQ:  qweight [K, N/8] and qzeros [G, N/8], both packing 8 columns per word in the order
//       0,2,4,6,1,3,5,7 (nibble p holds column kAwqOrder[p]); scales [G, N]; no g_idx.
// An empty qzeros means symmetric (zero = 8).
struct CheckpointLayer {
  QuantFormat format = QuantFormat::kGptq;
  GptqZeros gptq_zeros = GptqZeros::kV1MinusOne;
  int k = 0;
  int n = 0;
  int group_size = 128;  // -1 = one group over all of K (per-channel)
  std::vector<std::int32_t> qweight;
  std::vector<std::int32_t> qzeros;
  std::vector<std::uint16_t> scales;  // fp16 bits
  std::vector<std::int32_t> g_idx;    // empty = groups in k order
};

inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The logical layer: w[k][n] = (q[k][n] - zero[g][n]) * scale[g][n], g = k / group_size, with rows
// already sorted by group. For act-order checkpoints `perm` says which input column feeds row i:
// y = x[:, perm] @ w. group_size is always a real size here (per-channel becomes K).
struct UnpackedLayer {
  int k = 0;
  int n = 0;
  int group_size = 0;
  bool has_zeros = true;            // false: symmetric, every zero is 8
  std::vector<std::uint8_t> q;      // [K][N], 0..15
  std::vector<std::uint8_t> zeros;  // [G][N], 0..15
  std::vector<float> scales;        // [G][N], the fp16 checkpoint values
  std::vector<std::int32_t> perm;   // [K] or empty (identity)
  int groups() const { return group_size > 0 ? k / group_size : 0; }
};

// Checks shapes and ranges, undoes the format's packing and the act-order permutation. Errors name
// the tensor and the mismatch (e.g. "qweight has 100 words, expected K/8*N = 128").
StatusOr<UnpackedLayer> unpack_checkpoint_layer(const CheckpointLayer& layer);

// The inverse, for tests and fixtures: packs an unpacked layer (perm must be empty unless the
// format is GPTQ, where it becomes g_idx with rows returned to checkpoint order).
StatusOr<CheckpointLayer> pack_checkpoint_layer(const UnpackedLayer& layer, QuantFormat format,
                                                GptqZeros gptq_zeros);

// A random layer for tests, fixtures and benchmarks: q and zeros uniform in 0..15, scales in
// [0.5, 2] / 64 (fp16-exact), a random act-order permutation when `act_order`.
UnpackedLayer random_unpacked_layer(int k, int n, int group_size, bool has_zeros, bool act_order,
                                    std::uint64_t seed);

// float64 y[M][N] = x[M][K] @ dequant(layer), x given as float: the naive oracle for tests.
std::vector<double> naive_reference(const UnpackedLayer& layer, const std::vector<float>& x, int m);

}  // namespace gpuopt::kernels
