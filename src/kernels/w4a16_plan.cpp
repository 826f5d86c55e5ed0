// W4A16 host planning that needs no device: the option names and their checks, the path and
// kernel choice by M, the cuBLAS takeover M and the grid and k-split arithmetic (w4a16_paths.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels {
namespace {

constexpr std::array<std::pair<W4A16ForcePath, std::string_view>, 7> kForcePathNames = {{
    {W4A16ForcePath::kAuto, "auto"},
    {W4A16ForcePath::kTensorCore, "tensor-core"},
    {W4A16ForcePath::kDequantCublas, "dequant-cublas"},
    {W4A16ForcePath::kXRows, "x-rows"},
    {W4A16ForcePath::kSwapped, "swapped"},
    {W4A16ForcePath::kDirect, "direct"},
    {W4A16ForcePath::kWgmma, "wgmma"},
}};

constexpr std::array<std::pair<W4A16Pipeline, std::string_view>, 2> kPipelineNames = {{
    {W4A16Pipeline::kCpAsync, "cp-async"},
    {W4A16Pipeline::kBulkK128, "bulk-k128"},
}};

template <typename Enum, std::size_t kCount>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, kCount>& names,
                         Enum value) {
  for (const auto& [known, name] : names) {
    if (known == value) return name;
  }
  return "unknown";
}

template <typename Enum, std::size_t kCount>
StatusOr<Enum> parse(const std::array<std::pair<Enum, std::string_view>, kCount>& names,
                     std::string_view what, std::string_view text) {
  std::string valid;
  for (const auto& [value, name] : names) {
    if (name == text) return value;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  return invalid_argument(fmt::format("unknown {} '{}' (one of: {})", what, text, valid));
}

template <typename Enum, std::size_t kCount>
bool known(const std::array<std::pair<Enum, std::string_view>, kCount>& names, Enum value) {
  for (const auto& entry : names) {
    if (entry.first == value) return true;
  }
  return false;
}

Status non_negative(const char* field, int value, const char* zero_means) {
  if (value >= 0) return ok_status();
  return invalid_argument(
      fmt::format("W4A16{}={}: must be 0 ({}) or positive", field, value, zero_means));
}

}  // namespace

std::string_view w4a16_force_path_name(W4A16ForcePath path) {
  return name_of(kForcePathNames, path);
}
StatusOr<W4A16ForcePath> parse_w4a16_force_path(std::string_view name) {
  return parse(kForcePathNames, "W4A16 path", name);
}
std::string_view w4a16_pipeline_name(W4A16Pipeline pipeline) {
  return name_of(kPipelineNames, pipeline);
}
StatusOr<W4A16Pipeline> parse_w4a16_pipeline(std::string_view name) {
  return parse(kPipelineNames, "W4A16 copy pipeline", name);
}

Status check_w4a16_options(const W4A16Options& options) {
  if (options.fallback_min_m < W4A16Options::kAutoFallback) {
    return invalid_argument(fmt::format(
        "W4A16Options::fallback_min_m={}: must be kAutoFallback (-1), 0 (never) or an M",
        options.fallback_min_m));
  }
  if (!known(kForcePathNames, options.force_path)) {
    return invalid_argument(fmt::format("W4A16Options::force_path={} is not a W4A16ForcePath",
                                        static_cast<int>(options.force_path)));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Options::force_blocks", options.force_blocks, "occupancy x SMs"));
  if (options.sm_count < 0) {
    return invalid_argument(
        fmt::format("W4A16Options::sm_count={}: must be 0 (the device's) or 1..the device's SMs",
                    options.sm_count));
  }
  const W4A16Tuning& tuning = options.tuning;
  if (tuning.pipeline && !known(kPipelineNames, *tuning.pipeline)) {
    return invalid_argument(fmt::format("W4A16Tuning::pipeline={} is not a W4A16Pipeline",
                                        static_cast<int>(*tuning.pipeline)));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_slices", tuning.direct_slices, "the cost model's choice"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_slice_blocks", tuning.direct_slice_blocks, "SMs / slices"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::direct_blocks_per_sm", tuning.direct_blocks_per_sm, "the occupancy"));
  if (tuning.wgmma_variant && (*tuning.wgmma_variant < 7 || *tuning.wgmma_variant > 9)) {
    return invalid_argument(
        fmt::format("W4A16Tuning::wgmma_variant={}: must be 7, 8 or 9", *tuning.wgmma_variant));
  }
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::wgmma_splits", tuning.wgmma_splits, "the wave-fill choice"));
  GPUOPT_RETURN_IF_ERROR(
      non_negative("Tuning::wgmma_stream_k_blocks", tuning.wgmma_stream_k_blocks, "one wave"));
  return ok_status();
}

namespace w4a16_detail {

std::vector<W4A16ForcePath> kernel_candidates(int k, int n, int m, const W4A16Options& options) {
  // The direct kernel up to 16 rows, the wgmma kernel above (it refuses where there is no sm_90
  // code; the original kernels run there), both measured faster than the original kernels at
  // every M on the H200; on small layers (K x N <= 2^24) the wgmma kernel from 8 rows (4096 x 4096:
  // 12.3 vs 16.0 us at M = 8, 13.6 vs 19.5 at M = 16; docs/PERFORMANCE.md). Never in deterministic
  // mode (its k-split must not depend on M) or when another path is forced.
  if (options.deterministic || options.force_path != W4A16ForcePath::kAuto) return {};
  const bool small = static_cast<long long>(k) * n <= (1ll << 24);
  if (m > 16) return {W4A16ForcePath::kWgmma};
  if (small && m >= 8) return {W4A16ForcePath::kWgmma, W4A16ForcePath::kDirect};
  return {W4A16ForcePath::kDirect};
}

int whole_gpu_takeover_m(int k, int n, bool has_wgmma) {
  // H200, 2026-12-04 (docs/PERFORMANCE.md, "W4A16 from M = 17"), the int4 kernel with its one-wave
  // k-splits against cuBLAS fp16 in the same run. The wgmma kernel's time is flat inside a token
  // tile (32, 64, 128 tokens), so it loses from the first M of the tile where cuBLAS wins:
  // - K x N >= 2^27 (8192 x 28672, 28672 x 8192) and K >= N from 2^25 (14336 x 4096, 8192 x 8192,
  //   18944 x 3584): 1.04-1.27x at M = 65..128, 0.52-0.75x at 129 -> from 129;
  // - K < N below 2^27 (4096 x 14336, 3584 x 18944) and smaller layers (4096 x 4096): at least
  //   1.28x / 1.29x / 0.99x (a tie) at M = 64, 0.93x / 0.80x / 0.87x at 65 -> from 65.
  // Without the wgmma kernel (Ampere/Ada, or no sm_90a code) M > 16 runs the x-rows kernel, slower
  // than cuBLAS from M = 32 on the H200 -> from 17.
  const long long size = static_cast<long long>(k) * n;
  if (!has_wgmma) return 17;
  return size >= (1ll << 27) || (size >= (1ll << 25) && k >= n) ? 129 : 65;
}

int partition_takeover_m(int whole, int sm_count, int device_sms) {
  // A green-context partition of sm_count SMs (W4A16Options::sm_count). cuBLAS still nearly
  // saturates HBM on half the H200 (M=1 on 8192 x 28672: 113.9 us on 72 SMs, 111.3 on 132) while
  // the int4 kernels, bound by their work per SM, slow down with the SMs (M=1: 36.4 us on 132,
  // 51.5 on 72, 196.5 on 16), so the crossover falls with the partition's share of the SMs.
  // Measured on partitions of 16 to 104 of 132 SMs (2026-11-30 19:48-19:53 UTC, the int4 kernel
  // forced against cuBLAS fp16 on the same partition; the defaults then checked on 8 to 120, 8192 x
  // 28672, 28672 x 8192, 4096 x 14336, 4096 x 4096; docs/PERFORMANCE.md):
  // - 104 SMs (share 0.79) and 88 (0.67): faster up to M=64 (1.60x / 1.23-1.40x on the 70B
  //   shapes), but on 8192 x 28672 0.84-0.99x at M=65-96 (104 SMs) and 0.76-0.96x at 65-128 (88):
  //   its 112 tiles of 128 tokens no longer fit one wave (the whole GPU: 1.03-1.14x there) ->
  //   from 65, the whole GPU's table only from 90 % of the SMs (112 of 132 would still hold the
  //   tiles);
  // - 72 (0.55): faster up to M=64 (1.18-1.21x on the 70B shapes; 4096 x 14336 0.99x at 64),
  //   0.81-0.85x at 128 -> from 65;
  // - 48 (0.36): 1.48-1.50x at M=16, 0.99-1.12x at 32 (a tie on 8192 x 28672), 0.84-0.99x at 64;
  //   32 (0.24): 1.12-1.18x at 16, 0.79-0.91x at 32 -> from 17;
  // - 16 (0.12): 1.07-1.19x at 8, 0.93-0.99x at 16 -> from 9.
  if (sm_count <= 0 || sm_count >= device_sms) return whole;
  const double share = static_cast<double>(sm_count) / device_sms;
  if (share >= 0.9) return whole;
  const int cap = share >= 0.5 ? 65 : share >= 0.2 ? 17 : 9;
  return whole < cap ? whole : cap;
}

bool takes_fallback(int m, int fallback_min_m, const W4A16Options& options) {
  if (options.force_path != W4A16ForcePath::kAuto) {
    return options.force_path == W4A16ForcePath::kDequantCublas;
  }
  if (options.deterministic) return false;  // cuBLAS chooses its kernel by M
  return fallback_min_m > 0 && m >= fallback_min_m;
}

bool swapped_for(int m, const W4A16Options& options) {
  // Deterministic runs always use the x-rows kernel, so that a row's arithmetic is the same
  // whatever M.
  if (options.deterministic || options.force_path == W4A16ForcePath::kXRows) return false;
  return options.force_path == W4A16ForcePath::kSwapped || m <= 16;
}

int initial_m_tiles(int m, bool swapped) {
  if (swapped) return m <= 8 ? 1 : m <= 16 ? 2 : 4;
  return m <= 16 ? 1 : m <= 32 ? 2 : 4;
}

int stream_k_blocks(int per_sm, int sms, int iterations, int force_blocks) {
  if (force_blocks > 0) return std::min(force_blocks, iterations);
  return std::min(per_sm * sms, std::max(1, iterations / 4));
}

int deterministic_splits(int sms, int n_tiles, int stages_per_tile) {
  return std::clamp((2 * sms + n_tiles / 2) / n_tiles, 1, std::max(1, stages_per_tile / 4));
}

namespace {

WgmmaSplits best_wave_fill(int tiles, int k_stages, int slots, int sms, int tokens) {
  int max_splits = std::max(1, std::min(8, k_stages / 4));
  if (const int long_splits = k_stages / 32;
      long_splits >= 1 && static_cast<long long>(tiles) * long_splits >= sms) {
    max_splits = std::min(max_splits, long_splits);
  }
  // 128-token tiles: a split costs a 128 KB fp32 partial tile of atomics, the counter fence and the
  // last block's read-back, so another split must raise the fill by 20 % and ties go to fewer
  // (H200, 2026-11-30 06:00 and 06:14 UTC, medians of 10 and 20: 8192x28672 M=128 1 split 128.5
  // us vs 4 170.4, M=256 1 split 253.1 vs 4 307.1 at 85 % vs 97 % fill; 28672x8192 M=256 2 splits
  // 250.3 vs 4 259.9; docs/PERFORMANCE.md).
  const bool costly_fixup = tokens >= 128;
  WgmmaSplits chosen{1, 0.0};
  for (int s = 1; s <= max_splits; ++s) {
    const long long blocks = static_cast<long long>(tiles) * s;
    const long long waves = (blocks + slots - 1) / slots;
    const double efficiency = static_cast<double>(blocks) / static_cast<double>(waves * slots);
    if (costly_fixup ? efficiency >= 1.2 * chosen.fill : efficiency >= chosen.fill - 0.01) {
      chosen.fill = std::max(chosen.fill, efficiency);
      chosen.splits = s;
    }
    if (efficiency >= 0.95) break;
  }
  return chosen;
}

}  // namespace

WgmmaSplits choose_wgmma_splits(int tiles, int k_stages, int slots, int sms, int tokens, int m) {
  const WgmmaSplits wave_fill = best_wave_fill(tiles, k_stages, slots, sms, tokens);
  if (tokens > 64 || tiles <= 0) return wave_fill;
  const int one_wave = std::min({16, slots / tiles, k_stages / 8});
  const double fill = static_cast<double>(tiles) * one_wave / slots;
  const bool short_stream_k = static_cast<long long>(tiles) * k_stages < 32LL * slots;
  if (one_wave < 2 || fill < 0.8 || !short_stream_k) return wave_fill;
  // Up to 24 rows stream-K's partial tiles are cheap, and where it would run its full wave beats
  // one a tenth idle (4096x14336 M=17 23.0 vs 23.4 us, 18944x3584 24.7 vs 25.7).
  if (m <= 24 && fill < 0.9 && wgmma_stream_k_fits(tokens, wave_fill, tiles, k_stages, slots, m)) {
    return wave_fill;
  }
  return {one_wave, fill, true};
}

bool wgmma_stream_k_fits(int tokens, const WgmmaSplits& chosen, int tiles, int k_stages, int slots,
                         int m) {
  const bool long_enough = static_cast<long long>(tiles) * k_stages >= 12LL * slots;
  if (tokens > 64) {
    return m <= 256 && chosen.fill < 0.9 && static_cast<long long>(tiles) * chosen.splits > slots &&
           long_enough;
  }
  return !chosen.one_wave && chosen.fill < 0.9 && long_enough;
}

}  // namespace w4a16_detail

}  // namespace gpuopt::kernels
