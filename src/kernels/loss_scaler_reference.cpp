// CPU twin of the loss scaler (the oracle for the GPU tests) plus dtype helpers and validation.
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "gpuopt/kernels/loss_scaler.hpp"

namespace gpuopt::kernels {

std::size_t dtype_size(GradientDtype dtype) { return dtype == GradientDtype::kFloat32 ? 4 : 2; }

std::string_view dtype_name(GradientDtype dtype) {
  switch (dtype) {
    case GradientDtype::kFloat16:
      return "fp16";
    case GradientDtype::kBFloat16:
      return "bf16";
    case GradientDtype::kFloat32:
      return "fp32";
  }
  return "unknown";
}

Status validate(const LossScalerOptions& options) {
  if (!(options.init_scale > 0) || !std::isfinite(options.init_scale)) {
    return invalid_argument("LossScalerOptions.init_scale must be a positive finite float, got " +
                            std::to_string(options.init_scale));
  }
  if (!(options.growth_factor > 1.0) || !std::isfinite(options.growth_factor)) {
    return invalid_argument("LossScalerOptions.growth_factor must be finite and > 1, got " +
                            std::to_string(options.growth_factor));
  }
  if (!(options.backoff_factor > 0.0 && options.backoff_factor < 1.0)) {
    return invalid_argument("LossScalerOptions.backoff_factor must be in (0, 1), got " +
                            std::to_string(options.backoff_factor));
  }
  if (options.growth_interval < 1) {
    return invalid_argument("LossScalerOptions.growth_interval must be >= 1, got " +
                            std::to_string(options.growth_interval));
  }
  if (options.hysteresis < 1) {
    return invalid_argument("LossScalerOptions.hysteresis must be >= 1, got " +
                            std::to_string(options.hysteresis));
  }
  if (options.history_capacity < 1) {
    return invalid_argument("LossScalerOptions.history_capacity must be >= 1, got " +
                            std::to_string(options.history_capacity));
  }
  return ok_status();
}

float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t result;
  if (exponent == 0x1f) {
    result = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    result = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    result = sign;
  } else {
    // Subnormal half: normalise; every half is exact in float.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    result = sign | (static_cast<std::uint32_t>(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(result);
}

std::uint16_t float_to_half_rn(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7fff;
  // 65520 (half-way between 65504 and 65536) and above round to infinity (ties to even: 65504 odd).
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude >= 0x38800000u) {  // >= 2^-14: a normal half; round at bit 13, ties to even
    const std::uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return sign | static_cast<std::uint16_t>((rounded - 0x38000000u) >> 13);
  }
  if (magnitude <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie to 0)
  // Subnormal half: units of 2^-24.
  const std::uint32_t exponent = magnitude >> 23;
  const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;  // 14..24
  std::uint32_t result = mantissa >> shift;
  const std::uint32_t remainder = mantissa & ((1u << shift) - 1);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
  return sign | static_cast<std::uint16_t>(result);
}

float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bfloat16_rn(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float inverse_scale(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

namespace {

float load_as_float(const GradientTensor& tensor, std::size_t i) {
  switch (tensor.dtype) {
    case GradientDtype::kFloat16:
      return half_to_float(static_cast<const std::uint16_t*>(tensor.data)[i]);
    case GradientDtype::kBFloat16:
      return bfloat16_to_float(static_cast<const std::uint16_t*>(tensor.data)[i]);
    case GradientDtype::kFloat32:
      return static_cast<const float*>(tensor.data)[i];
  }
  return 0;
}

// float -> dtype -> float: the value a tensor of `dtype` holds after storing `value`.
float round_to_dtype(GradientDtype dtype, float value) {
  switch (dtype) {
    case GradientDtype::kFloat16:
      return half_to_float(float_to_half_rn(value));
    case GradientDtype::kBFloat16:
      return bfloat16_to_float(float_to_bfloat16_rn(value));
    case GradientDtype::kFloat32:
      return value;
  }
  return value;
}

void store_from_float(const GradientTensor& tensor, std::size_t i, float value) {
  switch (tensor.dtype) {
    case GradientDtype::kFloat16:
      static_cast<std::uint16_t*>(tensor.data)[i] = float_to_half_rn(value);
      break;
    case GradientDtype::kBFloat16:
      static_cast<std::uint16_t*>(tensor.data)[i] = float_to_bfloat16_rn(value);
      break;
    case GradientDtype::kFloat32:
      static_cast<float*>(tensor.data)[i] = value;
      break;
  }
}

}  // namespace

bool unscale_reference(std::span<const GradientTensor> gradients, float inv_scale) {
  bool found_inf = false;
  for (const GradientTensor& tensor : gradients) {
    for (std::size_t i = 0; i < tensor.count; ++i) {
      const float value = load_as_float(tensor, i);
      if (!std::isfinite(value)) found_inf = true;
      // torch keeps x when inv == 1; elsewhere the product is rounded once, to the gradient dtype.
      if (inv_scale == 1.0f) continue;
      const float product = value * inv_scale;
      switch (tensor.dtype) {
        case GradientDtype::kFloat16:
          static_cast<std::uint16_t*>(tensor.data)[i] = float_to_half_rn(product);
          break;
        case GradientDtype::kBFloat16:
          static_cast<std::uint16_t*>(tensor.data)[i] = float_to_bfloat16_rn(product);
          break;
        case GradientDtype::kFloat32:
          static_cast<float*>(tensor.data)[i] = product;
          break;
      }
    }
  }
  return found_inf;
}

ScalerState initial_state(const LossScalerOptions& options) {
  ScalerState state;
  state.scale = options.init_scale;
  state.growth_tracker = 0;
  state.hysteresis_tracker = options.hysteresis;
  return state;
}

StepRecord update_reference(ScalerState& state, bool found_inf, const LossScalerOptions& options) {
  if (found_inf) {
    state.growth_tracker = 0;
    if (state.hysteresis_tracker > 1) {
      --state.hysteresis_tracker;  // tolerated: the step is skipped, the scale kept
    } else {
      // float * double rounded to float, as torch's kernel (no floor: it may reach 0).
      state.scale = static_cast<float>(static_cast<double>(state.scale) * options.backoff_factor);
    }
  } else {
    state.hysteresis_tracker = options.hysteresis;
    const std::int32_t successful = state.growth_tracker + 1;
    if (successful == options.growth_interval) {
      const float grown =
          static_cast<float>(static_cast<double>(state.scale) * options.growth_factor);
      if (std::isfinite(grown)) state.scale = grown;
      state.growth_tracker = 0;
    } else {
      state.growth_tracker = successful;
    }
  }
  return StepRecord{state.scale, state.growth_tracker, state.hysteresis_tracker, found_inf ? 1 : 0};
}

void sgd_step_if_finite_reference(std::span<float* const> params,
                                  std::span<const GradientTensor> gradients, float learning_rate,
                                  bool found_inf) {
  if (found_inf) return;
  for (std::size_t t = 0; t < gradients.size() && t < params.size(); ++t) {
    for (std::size_t i = 0; i < gradients[t].count; ++i) {
      params[t][i] = std::fma(-learning_rate, load_as_float(gradients[t], i), params[t][i]);
    }
  }
}

UnscaleNormResult unscale_norm_reference(std::span<const GradientTensor> gradients,
                                         float inv_scale) {
  UnscaleNormResult result;
  for (const GradientTensor& tensor : gradients) {
    for (std::size_t i = 0; i < tensor.count; ++i) {
      const float value = load_as_float(tensor, i);
      if (!std::isfinite(value)) result.found_inf = true;
      const float unscaled =
          inv_scale == 1.0f ? value : round_to_dtype(tensor.dtype, value * inv_scale);
      result.sum_squares += static_cast<double>(unscaled) * static_cast<double>(unscaled);
    }
  }
  return result;
}

float clip_coefficient_reference(float total_norm, float max_norm) {
  // torch: max_norm / (total_norm + 1e-6) is reciprocal(total_norm + 1e-6) * max_norm in fp32.
  const float denominator = total_norm + 1e-6f;
  const float coefficient = (1.0f / denominator) * max_norm;
  return coefficient > 1.0f ? 1.0f : coefficient;  // a NaN coefficient stays NaN, as clamp
}

void scale_twice_reference(std::span<const GradientTensor> gradients, float first, float second) {
  if (first == 1.0f && second == 1.0f) return;
  for (const GradientTensor& tensor : gradients) {
    for (std::size_t i = 0; i < tensor.count; ++i) {
      float value = load_as_float(tensor, i);
      if (first != 1.0f) value = round_to_dtype(tensor.dtype, value * first);
      if (second != 1.0f) value = value * second;
      store_from_float(tensor, i, value);
    }
  }
}

Status validate(const TensorListOptions& options) {
  if (options.chunk_bytes < 1024 || options.chunk_bytes % 16 != 0 ||
      options.chunk_bytes > (std::size_t{1} << 30)) {
    return invalid_argument(
        "TensorListOptions.chunk_bytes must be a multiple of 16 in [1024, 2^30], got " +
        std::to_string(options.chunk_bytes));
  }
  if (options.max_blocks < 0) {
    return invalid_argument("TensorListOptions.max_blocks must be >= 0, got " +
                            std::to_string(options.max_blocks));
  }
  if (options.max_table_slots < 1) {
    return invalid_argument("TensorListOptions.max_table_slots must be >= 1, got " +
                            std::to_string(options.max_table_slots));
  }
  return ok_status();
}

}  // namespace gpuopt::kernels
