// CPU twin of the preprocessing kernel and the parameter checks shared by both.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "gpuopt/pipeline/preprocess.hpp"

namespace gpuopt::pipeline {

Status check_preprocess_params(const PreprocessParams& p) {
  auto in_range = [](int value) { return value > 0 && value <= 8192; };
  if (!in_range(p.source_width)) {
    return invalid_argument(
        fmt::format("preprocess: source_width {} not in 1..8192", p.source_width));
  }
  if (!in_range(p.source_height)) {
    return invalid_argument(
        fmt::format("preprocess: source_height {} not in 1..8192", p.source_height));
  }
  if (!in_range(p.output_size)) {
    return invalid_argument(
        fmt::format("preprocess: output_size {} not in 1..8192", p.output_size));
  }
  for (int c = 0; c < 3; ++c) {
    if (!(std::fabs(p.std[c]) > 0) || !std::isfinite(p.std[c]) || !std::isfinite(p.mean[c])) {
      return invalid_argument(
          fmt::format("preprocess: channel {} has mean {} std {}", c, p.mean[c], p.std[c]));
    }
  }
  return ok_status();
}

std::vector<float> preprocess_reference(const std::uint8_t* rgb, const PreprocessParams& p) {
  const int s = p.output_size;
  std::vector<float> out(static_cast<std::size_t>(3) * s * s);
  const float scale_x = static_cast<float>(p.source_width) / s;
  const float scale_y = static_cast<float>(p.source_height) / s;
  for (int y = 0; y < s; ++y) {
    // Half-pixel centres, clamped at the edges (OpenCV INTER_LINEAR).
    float fy = std::max((y + 0.5f) * scale_y - 0.5f, 0.0f);
    int y0 = std::min(static_cast<int>(fy), p.source_height - 1);
    int y1 = std::min(y0 + 1, p.source_height - 1);
    float wy = fy - y0;
    for (int x = 0; x < s; ++x) {
      float fx = std::max((x + 0.5f) * scale_x - 0.5f, 0.0f);
      int x0 = std::min(static_cast<int>(fx), p.source_width - 1);
      int x1 = std::min(x0 + 1, p.source_width - 1);
      float wx = fx - x0;
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int yy, int xx) {
          return static_cast<float>(
              rgb[(static_cast<std::size_t>(yy) * p.source_width + xx) * 3 + c]);
        };
        float top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * wx;
        float bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * wx;
        float value = top + (bottom - top) * wy;
        out[(static_cast<std::size_t>(y) * s + x) * 3 + c] =
            (value / 255.0f - p.mean[c]) / p.std[c];
      }
    }
  }
  return out;
}

}  // namespace gpuopt::pipeline
