// W4A16 host side: shape rules, the kernel tile layout (repack and its inverse) and the CPU twin.
#include <fmt/format.h>

#include <cstring>

#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::kernels {

std::string_view activation_type_name(ActivationType type) {
  return type == ActivationType::kFloat16 ? "fp16" : "bf16";
}

namespace {
// The swapped kernel's copy pipeline (W4A16Config::pipeline) as the config column shows it.
const char* pipeline_name(W4A16Pipeline pipeline) {
  return pipeline == W4A16Pipeline::kBulkK128 ? " bulk k128" : "";
}
}  // namespace

std::string W4A16Config::describe() const {
  if (path == W4A16Path::kDequantCublas) return "dequant+cublas";
  if (kernel == W4A16Kernel::kDirect || kernel == W4A16Kernel::kWgmma) return note;
  return fmt::format("mma{} m{}xn{} {}thr {}st{} grid{} ({}/SM){}", swapped ? "(w.x)" : "", block_m,
                     block_n, threads, stages, pipeline_name(pipeline), blocks, blocks_per_sm,
                     splits > 0 ? fmt::format(" deterministic {} splits", splits) : "");
}

Status check_w4a16_shape(int k, int n, int group_size) {
  if (k <= 0 || n <= 0) return invalid_argument(fmt::format("bad shape K={} N={}", k, n));
  if (n % kTileN != 0) {
    return invalid_argument(fmt::format("N={} is not a multiple of {}", n, kTileN));
  }
  if (k % kStageK != 0) {
    return invalid_argument(fmt::format("K={} is not a multiple of {}", k, kStageK));
  }
  if (group_size <= 0 || group_size % kTileK != 0) {
    return invalid_argument(
        fmt::format("group_size={} is not a positive multiple of {}", group_size, kTileK));
  }
  if (k % group_size != 0) {
    return invalid_argument(fmt::format("K={} is not a multiple of group_size={}", k, group_size));
  }
  return ok_status();
}

namespace {

// Position inside a strip (dk in [0,16), dn in [0,64)) of nibble p of word `word` of a tile.
void tile_coordinates(int word, int p, int& dk, int& dn) {
  const int lane = word / 4;
  const int i = word % 4;
  const int g = lane / 4;
  const int c = lane % 4;
  const int pair = p % 4;
  const int j = 2 * i + pair / 2;
  dk = 2 * c + 8 * (pair % 2) + p / 4;
  dn = 8 * j + g;
}

// Index into [G][N/64][8 (g)][8 (j)] for column n of group `group`.
std::size_t group_index(int n_total, int group, int n) {
  const int strip = n / kTileN;
  const int within = n % kTileN;
  const int j = within / 8;
  const int g = within % 8;
  return (static_cast<std::size_t>(group) * (n_total / kTileN) + strip) * kTileN + g * 8 + j;
}

float type_to_float(ActivationType type, std::uint16_t bits) {
  return type == ActivationType::kFloat16 ? fp16_bits_to_float(bits) : bf16_bits_to_float(bits);
}

std::uint16_t float_to_type(ActivationType type, float value) {
  return type == ActivationType::kFloat16 ? float_to_fp16_bits(value) : float_to_bf16_bits(value);
}

}  // namespace

StatusOr<W4A16Weights> repack_for_kernel(const UnpackedLayer& layer, ActivationType type) {
  GPUOPT_RETURN_IF_ERROR(check_w4a16_shape(layer.k, layer.n, layer.group_size));
  const int k = layer.k;
  const int n = layer.n;
  const std::size_t kn = static_cast<std::size_t>(k) * n;
  if (layer.q.size() != kn || layer.scales.size() != static_cast<std::size_t>(layer.groups()) * n ||
      (layer.has_zeros && layer.zeros.size() != layer.scales.size())) {
    return invalid_argument("repack_for_kernel: unpacked layer tensors do not match K, N, groups");
  }
  W4A16Weights out;
  out.k = k;
  out.n = n;
  out.group_size = layer.group_size;
  out.type = type;
  out.has_zeros = layer.has_zeros;
  out.perm = layer.perm;
  out.tiles.assign(kn / 8, 0);
  const int k_tiles = k / kTileK;
  for (int strip = 0; strip < n / kTileN; ++strip) {
    for (int t = 0; t < k_tiles; ++t) {
      std::uint32_t* tile = &out.tiles[(static_cast<std::size_t>(strip) * k_tiles + t) * 128];
      for (int word = 0; word < 128; ++word) {
        std::uint32_t value = 0;
        for (int p = 0; p < 8; ++p) {
          int dk, dn;
          tile_coordinates(word, p, dk, dn);
          const std::uint32_t q =
              layer.q[static_cast<std::size_t>(t * kTileK + dk) * n + strip * kTileN + dn];
          value |= (q & 0xfu) << (4 * p);
        }
        tile[word] = value;
      }
    }
  }
  const int groups = layer.groups();
  out.scales.resize(static_cast<std::size_t>(groups) * n);
  if (out.has_zeros) out.zeros.resize(out.scales.size());
  for (int group = 0; group < groups; ++group) {
    for (int col = 0; col < n; ++col) {
      const std::size_t from = static_cast<std::size_t>(group) * n + col;
      const std::size_t to = group_index(n, group, col);
      out.scales[to] = float_to_type(type, layer.scales[from]);
      if (out.has_zeros) out.zeros[to] = layer.zeros[from];
    }
  }
  return out;
}

UnpackedLayer unpack_kernel_layout(const W4A16Weights& weights) {
  UnpackedLayer out;
  out.k = weights.k;
  out.n = weights.n;
  out.group_size = weights.group_size;
  out.has_zeros = weights.has_zeros;
  out.perm = weights.perm;
  const int n = weights.n;
  out.q.resize(static_cast<std::size_t>(weights.k) * n);
  const int k_tiles = weights.k / kTileK;
  for (int strip = 0; strip < n / kTileN; ++strip) {
    for (int t = 0; t < k_tiles; ++t) {
      const std::uint32_t* tile =
          &weights.tiles[(static_cast<std::size_t>(strip) * k_tiles + t) * 128];
      for (int word = 0; word < 128; ++word) {
        for (int p = 0; p < 8; ++p) {
          int dk, dn;
          tile_coordinates(word, p, dk, dn);
          out.q[static_cast<std::size_t>(t * kTileK + dk) * n + strip * kTileN + dn] =
              static_cast<std::uint8_t>((tile[word] >> (4 * p)) & 0xfu);
        }
      }
    }
  }
  const int groups = weights.groups();
  out.scales.resize(static_cast<std::size_t>(groups) * n);
  out.zeros.assign(out.scales.size(), 8);
  for (int group = 0; group < groups; ++group) {
    for (int col = 0; col < n; ++col) {
      const std::size_t to = static_cast<std::size_t>(group) * n + col;
      const std::size_t from = group_index(n, group, col);
      out.scales[to] = type_to_float(weights.type, weights.scales[from]);
      if (weights.has_zeros) out.zeros[to] = weights.zeros[from];
    }
  }
  return out;
}

std::vector<float> w4a16_reference(const W4A16Weights& weights, const std::uint16_t* x, int m) {
  // Dequantise from the tile layout itself, so a repacking bug shows against the naive oracle.
  const UnpackedLayer layer = unpack_kernel_layout(weights);
  const int k = weights.k;
  const int n = weights.n;
  std::vector<float> w(static_cast<std::size_t>(k) * n);
  for (int i = 0; i < k; ++i) {
    const int g = i / layer.group_size;
    for (int col = 0; col < n; ++col) {
      const std::size_t gi = static_cast<std::size_t>(g) * n + col;
      w[static_cast<std::size_t>(i) * n + col] =
          (static_cast<float>(layer.q[static_cast<std::size_t>(i) * n + col]) -
           static_cast<float>(layer.zeros[gi])) *
          layer.scales[gi];
    }
  }
  std::vector<float> y(static_cast<std::size_t>(m) * n, 0.0f);
  std::vector<float> row_x(k);
  for (int row = 0; row < m; ++row) {
    for (int i = 0; i < k; ++i) {
      const int source = layer.perm.empty() ? i : layer.perm[i];
      row_x[i] = type_to_float(weights.type, x[static_cast<std::size_t>(row) * k + source]);
    }
    float* out = &y[static_cast<std::size_t>(row) * n];
    for (int i = 0; i < k; ++i) {
      const float xv = row_x[i];
      const float* wr = &w[static_cast<std::size_t>(i) * n];
      for (int col = 0; col < n; ++col) out[col] += xv * wr[col];
    }
  }
  return y;
}

}  // namespace gpuopt::kernels
