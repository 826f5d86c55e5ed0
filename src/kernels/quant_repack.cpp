// Unpacking GPTQ/AWQ checkpoint tensors into the logical layer (and packing back, for fixtures).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "gpuopt/kernels/quant_formats.hpp"

namespace gpuopt::kernels {

float fp16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: value = mantissa * 2^-24
      float value = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -value : value;
    }
  } else if (exponent == 31) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(out);
}

std::uint16_t float_to_fp16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {                // subnormal range: multiples of 2^-24
    const float scaled = std::nearbyint(magnitude * 16777216.0f);  // default mode: ties to even
    return sign | static_cast<std::uint16_t>(scaled);
  }
  std::uint32_t mag_bits = std::bit_cast<std::uint32_t>(magnitude);
  // Round the 23-bit mantissa to 10 bits, ties to even, then rebias the exponent.
  const std::uint32_t round = 0xfffu + ((mag_bits >> 13) & 1u);
  mag_bits += round;
  const std::uint32_t exponent = (mag_bits >> 23) - 112;
  const std::uint32_t mantissa = (mag_bits >> 13) & 0x3ffu;
  return sign | static_cast<std::uint16_t>((exponent << 10) | mantissa);
}

float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

std::string_view quant_format_name(QuantFormat format) {
  return format == QuantFormat::kGptq ? "gptq" : "awq";
}

StatusOr<QuantFormat> parse_quant_format(std::string_view text) {
  if (text == "gptq" || text == "gptq_v2") return QuantFormat::kGptq;
  if (text == "awq") return QuantFormat::kAwq;
  return invalid_argument(
      fmt::format("unknown quantization format '{}' (expected gptq or awq)", std::string(text)));
}

namespace {

Status expect_size(const char* tensor, std::size_t actual, std::size_t expected,
                   const char* formula) {
  if (actual == expected) return ok_status();
  return invalid_argument(
      fmt::format("{} has {} elements, expected {} = {}", tensor, actual, expected, formula));
}

int nibble(std::int32_t word, int position) {
  return static_cast<int>((static_cast<std::uint32_t>(word) >> (4 * position)) & 0xfu);
}

}  // namespace

StatusOr<UnpackedLayer> unpack_checkpoint_layer(const CheckpointLayer& layer) {
  const int k = layer.k;
  const int n = layer.n;
  if (k <= 0 || n <= 0) return invalid_argument(fmt::format("bad layer shape K={} N={}", k, n));
  if (k % 8 != 0 || n % 8 != 0) {
    return invalid_argument(
        fmt::format("K={} and N={} must be multiples of 8 (8 nibbles a word)", k, n));
  }
  const int group_size = layer.group_size <= 0 ? k : layer.group_size;
  if (k % group_size != 0) {
    return invalid_argument(fmt::format("K={} is not a multiple of group_size={}", k, group_size));
  }
  UnpackedLayer out;
  out.k = k;
  out.n = n;
  out.group_size = group_size;
  const int groups = k / group_size;
  const std::size_t kn = static_cast<std::size_t>(k) * n;
  const std::size_t gn = static_cast<std::size_t>(groups) * n;
  GPUOPT_RETURN_IF_ERROR(expect_size("scales", layer.scales.size(), gn, "groups*N"));
  out.has_zeros = !layer.qzeros.empty();
  if (out.has_zeros) {
    GPUOPT_RETURN_IF_ERROR(expect_size("qzeros", layer.qzeros.size(), gn / 8, "groups*N/8"));
  }
  out.q.resize(kn);
  out.zeros.assign(gn, 8);
  out.scales.resize(gn);
  for (std::size_t i = 0; i < gn; ++i) out.scales[i] = fp16_bits_to_float(layer.scales[i]);

  if (layer.format == QuantFormat::kGptq) {
    GPUOPT_RETURN_IF_ERROR(expect_size("qweight", layer.qweight.size(), kn / 8, "K/8*N"));
    for (int row = 0; row < k; ++row) {
      for (int col = 0; col < n; ++col) {
        out.q[static_cast<std::size_t>(row) * n + col] =
            nibble(layer.qweight[static_cast<std::size_t>(row / 8) * n + col], row % 8);
      }
    }
    if (out.has_zeros) {
      const int offset = layer.gptq_zeros == GptqZeros::kV1MinusOne ? 1 : 0;
      for (int g = 0; g < groups; ++g) {
        for (int col = 0; col < n; ++col) {
          // v1 stores zero-1 in 4 bits: stored 15 means zero 16, which no 4-bit zero-point can be.
          const int zero =
              nibble(layer.qzeros[static_cast<std::size_t>(g) * (n / 8) + col / 8], col % 8) +
              offset;
          if (zero > 15) {
            return invalid_argument(fmt::format(
                "qzeros[{}][{}] gives zero-point 16 under the GPTQ v1 (zero-1) convention; is "
                "this a v2 checkpoint?",
                g, col / 8));
          }
          out.zeros[static_cast<std::size_t>(g) * n + col] = static_cast<std::uint8_t>(zero);
        }
      }
    }
  } else {
    if (!layer.g_idx.empty()) return invalid_argument("AWQ layers have no g_idx (act-order)");
    GPUOPT_RETURN_IF_ERROR(expect_size("qweight", layer.qweight.size(), kn / 8, "K*N/8"));
    for (int row = 0; row < k; ++row) {
      for (int word = 0; word < n / 8; ++word) {
        const std::int32_t packed = layer.qweight[static_cast<std::size_t>(row) * (n / 8) + word];
        for (int p = 0; p < 8; ++p) {
          out.q[static_cast<std::size_t>(row) * n + word * 8 + kAwqOrder[p]] = nibble(packed, p);
        }
      }
    }
    if (out.has_zeros) {
      for (int g = 0; g < groups; ++g) {
        for (int word = 0; word < n / 8; ++word) {
          const std::int32_t packed = layer.qzeros[static_cast<std::size_t>(g) * (n / 8) + word];
          for (int p = 0; p < 8; ++p) {
            out.zeros[static_cast<std::size_t>(g) * n + word * 8 + kAwqOrder[p]] =
                static_cast<std::uint8_t>(nibble(packed, p));
          }
        }
      }
    }
  }

  // Symmetric checkpoints often still store qzeros (all 8): drop them so the kernel skips them.
  if (out.has_zeros &&
      std::all_of(out.zeros.begin(), out.zeros.end(), [](std::uint8_t z) { return z == 8; })) {
    out.has_zeros = false;
  }

  if (!layer.g_idx.empty()) {
    GPUOPT_RETURN_IF_ERROR(
        expect_size("g_idx", layer.g_idx.size(), static_cast<std::size_t>(k), "K"));
    for (int row = 0; row < k; ++row) {
      if (layer.g_idx[row] < 0 || layer.g_idx[row] >= groups) {
        return invalid_argument(
            fmt::format("g_idx[{}] = {} is outside [0, {})", row, layer.g_idx[row], groups));
      }
    }
    std::vector<std::int32_t> perm(k);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int a, int b) { return layer.g_idx[a] < layer.g_idx[b]; });
    bool identity = true;
    for (int i = 0; i < k; ++i) {
      // Sorted rows must form whole groups, or one scale row would not cover a k16 tile.
      if (layer.g_idx[perm[i]] != i / group_size) {
        return invalid_argument(
            fmt::format("g_idx does not give every group exactly group_size={} rows (group {} at "
                        "sorted row {})",
                        group_size, layer.g_idx[perm[i]], i));
      }
      identity = identity && perm[i] == i;
    }
    if (!identity) {
      std::vector<std::uint8_t> sorted(kn);
      for (int i = 0; i < k; ++i) {
        std::memcpy(&sorted[static_cast<std::size_t>(i) * n],
                    &out.q[static_cast<std::size_t>(perm[i]) * n], n);
      }
      out.q = std::move(sorted);
      out.perm = std::move(perm);
    }
  }
  return out;
}

StatusOr<CheckpointLayer> pack_checkpoint_layer(const UnpackedLayer& layer, QuantFormat format,
                                                GptqZeros gptq_zeros) {
  const int k = layer.k;
  const int n = layer.n;
  if (k % 8 != 0 || n % 8 != 0 || layer.group_size <= 0 || k % layer.group_size != 0) {
    return invalid_argument("pack_checkpoint_layer: K, N must be multiples of 8 and of the group");
  }
  if (format == QuantFormat::kAwq && !layer.perm.empty()) {
    return invalid_argument("AWQ has no act-order; the layer has a permutation");
  }
  const int groups = layer.groups();
  CheckpointLayer out;
  out.format = format;
  out.gptq_zeros = gptq_zeros;
  out.k = k;
  out.n = n;
  out.group_size = layer.group_size;
  out.scales.resize(static_cast<std::size_t>(groups) * n);
  for (std::size_t i = 0; i < out.scales.size(); ++i)
    out.scales[i] = float_to_fp16_bits(layer.scales[i]);
  // Checkpoint row order: unpacked row i came from original row perm[i].
  std::vector<int> original_row(k);
  std::iota(original_row.begin(), original_row.end(), 0);
  if (!layer.perm.empty()) {
    original_row.assign(layer.perm.begin(), layer.perm.end());
    out.g_idx.resize(k);
    for (int i = 0; i < k; ++i) out.g_idx[layer.perm[i]] = i / layer.group_size;
  }
  out.qweight.assign(static_cast<std::size_t>(k) * n / 8, 0);
  for (int i = 0; i < k; ++i) {
    const int row = original_row[i];
    for (int col = 0; col < n; ++col) {
      const std::uint32_t q = layer.q[static_cast<std::size_t>(i) * n + col];
      if (format == QuantFormat::kGptq) {
        out.qweight[static_cast<std::size_t>(row / 8) * n + col] |=
            static_cast<std::int32_t>(q << (4 * (row % 8)));
      } else {
        int position = 0;
        while (kAwqOrder[position] != col % 8) ++position;
        out.qweight[static_cast<std::size_t>(row) * (n / 8) + col / 8] |=
            static_cast<std::int32_t>(q << (4 * position));
      }
    }
  }
  if (layer.has_zeros) {
    out.qzeros.assign(static_cast<std::size_t>(groups) * n / 8, 0);
    for (int g = 0; g < groups; ++g) {
      for (int col = 0; col < n; ++col) {
        int zero = layer.zeros[static_cast<std::size_t>(g) * n + col];
        int position = col % 8;
        if (format == QuantFormat::kGptq) {
          if (gptq_zeros == GptqZeros::kV1MinusOne) {
            if (zero == 0) return invalid_argument("GPTQ v1 cannot store zero-point 0 (zero-1)");
            zero -= 1;
          }
        } else {
          position = 0;
          while (kAwqOrder[position] != col % 8) ++position;
        }
        out.qzeros[static_cast<std::size_t>(g) * (n / 8) + col / 8] |=
            static_cast<std::int32_t>(static_cast<std::uint32_t>(zero) << (4 * position));
      }
    }
  }
  return out;
}

UnpackedLayer random_unpacked_layer(int k, int n, int group_size, bool has_zeros, bool act_order,
                                    std::uint64_t seed) {
  std::mt19937_64 random(seed);
  UnpackedLayer layer;
  layer.k = k;
  layer.n = n;
  layer.group_size = group_size <= 0 ? k : group_size;
  layer.has_zeros = has_zeros;
  const std::size_t gn = static_cast<std::size_t>(layer.groups()) * n;
  layer.q.resize(static_cast<std::size_t>(k) * n);
  for (auto& q : layer.q) q = static_cast<std::uint8_t>(random() & 0xfu);
  layer.zeros.assign(gn, 8);
  // Zero-points 1..15 so GPTQ v1 (zero-1) can store every one of them.
  if (has_zeros) {
    for (auto& z : layer.zeros) z = static_cast<std::uint8_t>(1 + random() % 15);
  }
  std::uniform_real_distribution<float> scale(0.5f, 2.0f);
  layer.scales.resize(gn);
  for (auto& s : layer.scales) s = fp16_bits_to_float(float_to_fp16_bits(scale(random) / 64.0f));
  if (act_order) {
    layer.perm.resize(k);
    std::iota(layer.perm.begin(), layer.perm.end(), 0);
    std::shuffle(layer.perm.begin(), layer.perm.end(), random);
    // Ascending within each group: the order unpack_checkpoint_layer gives back.
    for (int g = 0; g < layer.groups(); ++g) {
      std::sort(layer.perm.begin() + g * layer.group_size,
                layer.perm.begin() + (g + 1) * layer.group_size);
    }
  }
  return layer;
}

std::vector<double> naive_reference(const UnpackedLayer& layer, const std::vector<float>& x,
                                    int m) {
  const int k = layer.k;
  const int n = layer.n;
  std::vector<double> y(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < k; ++i) {
    const int source = layer.perm.empty() ? i : layer.perm[i];
    const int g = i / layer.group_size;
    for (int col = 0; col < n; ++col) {
      const double w = (static_cast<double>(layer.q[static_cast<std::size_t>(i) * n + col]) -
                        layer.zeros[static_cast<std::size_t>(g) * n + col]) *
                       layer.scales[static_cast<std::size_t>(g) * n + col];
      for (int row = 0; row < m; ++row) {
        y[static_cast<std::size_t>(row) * n + col] +=
            static_cast<double>(x[static_cast<std::size_t>(row) * k + source]) * w;
      }
    }
  }
  return y;
}

}  // namespace gpuopt::kernels
