// CPU twin of the loss scaler against PyTorch GradScaler's documented algorithm, hand-derived.
#include "gpuopt/kernels/loss_scaler.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace gpuopt::kernels {
namespace {

// Gradient contents of one scripted step, fp16 as a real AMP model produces them.
enum class Grad { kFinite, kInf, kNan, kHuge, kTiny };

// Runs one training step through the twin: unscale, step-if-finite, update.
struct TwinStep {
  float scale_used;
  bool skipped;
  StepRecord record;
};

TwinStep run_step(ScalerState& state, Grad grad, const LossScalerOptions& options) {
  std::vector<std::uint16_t> values = {0x3c00, 0xbc00, 0x1234, 0x0001};  // 1, -1, ~7.6e-4, 2^-24
  switch (grad) {
    case Grad::kFinite:
      break;
    case Grad::kInf:
      values[2] = 0xfc00;  // -inf
      break;
    case Grad::kNan:
      values[1] = 0x7e00;
      break;
    case Grad::kHuge:
      values[0] = 0x7bff;  // 65504, the largest finite half: not an overflow
      break;
    case Grad::kTiny:
      values = {0x0001, 0x8001, 0x0000, 0x8000};
      break;
  }
  GradientTensor tensor{values.data(), values.size(), GradientDtype::kFloat16};
  const float scale_used = state.scale;
  const bool found_inf = unscale_reference({&tensor, 1}, inverse_scale(state.scale));
  std::vector<float> param = {1, 1, 1, 1};
  float* params[] = {param.data()};
  sgd_step_if_finite_reference(params, {&tensor, 1}, 0.5f, found_inf);
  const bool stepped = param != std::vector<float>{1, 1, 1, 1} || grad == Grad::kTiny;
  TwinStep step{scale_used, found_inf, update_reference(state, found_inf, options)};
  EXPECT_EQ(stepped, !found_inf);
  return step;
}

struct Expected {
  Grad grad;
  float scale;  // after update
  int growth_tracker;
  bool skipped;
  int hysteresis_tracker = 1;
};

void expect_sequence(const LossScalerOptions& options, const std::vector<Expected>& expected) {
  ScalerState state = initial_state(options);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    const TwinStep step = run_step(state, expected[k].grad, options);
    EXPECT_EQ(step.skipped, expected[k].skipped);
    EXPECT_EQ(step.record.found_inf, expected[k].skipped ? 1 : 0);
    EXPECT_EQ(step.record.scale, expected[k].scale);
    EXPECT_EQ(step.record.growth_tracker, expected[k].growth_tracker);
    EXPECT_EQ(step.record.hysteresis_tracker, expected[k].hysteresis_tracker);
    EXPECT_EQ(state.scale, expected[k].scale);
  }
}

// torch.amp.GradScaler (init 2^16, growth 2, backoff 0.5) with growth_interval 3: an inf/NaN step
// is skipped, halves the scale and zeroes the tracker; the 3rd consecutive finite step doubles it.
TEST(LossScalerReference, MatchesGradScalerScriptedSequence) {
  LossScalerOptions options;
  options.growth_interval = 3;
  using G = Grad;
  expect_sequence(options, {
                               {G::kFinite, 65536, 1, false},
                               {G::kFinite, 65536, 2, false},
                               {G::kFinite, 131072, 0, false},
                               {G::kInf, 65536, 0, true},
                               {G::kFinite, 65536, 1, false},
                               {G::kHuge, 65536, 2, false},
                               {G::kNan, 32768, 0, true},
                               {G::kTiny, 32768, 1, false},
                               {G::kFinite, 32768, 2, false},
                               {G::kFinite, 65536, 0, false},
                               {G::kInf, 32768, 0, true},
                               {G::kInf, 16384, 0, true},
                               {G::kNan, 8192, 0, true},
                               {G::kFinite, 8192, 1, false},
                               {G::kNan, 4096, 0, true},
                               {G::kFinite, 4096, 1, false},
                               {G::kFinite, 4096, 2, false},
                               {G::kTiny, 8192, 0, false},
                           });
}

// With the defaults (interval 2000) nothing grows for 1999 finite steps; the 2000th doubles.
TEST(LossScalerReference, DefaultsGrowAfter2000FiniteSteps) {
  const LossScalerOptions options;
  EXPECT_EQ(options.init_scale, 65536.0f);
  EXPECT_EQ(options.growth_factor, 2.0);
  EXPECT_EQ(options.backoff_factor, 0.5);
  EXPECT_EQ(options.growth_interval, 2000);
  ScalerState state = initial_state(options);
  for (int k = 1; k < 2000; ++k) {
    const StepRecord record = update_reference(state, false, options);
    ASSERT_EQ(record.scale, 65536.0f);
    ASSERT_EQ(record.growth_tracker, k);
  }
  const StepRecord record = update_reference(state, false, options);
  EXPECT_EQ(record.scale, 131072.0f);
  EXPECT_EQ(record.growth_tracker, 0);
  EXPECT_EQ(update_reference(state, true, options).scale, 65536.0f);
}

// Hysteresis 2 (interval 3): the first overflow of a run is tolerated (skipped, scale kept, growth
// tracker reset), the second and later back off; a finite step re-arms it.
TEST(LossScalerReference, HysteresisBacksOffOnSecondConsecutiveOverflow) {
  LossScalerOptions options;
  options.growth_interval = 3;
  options.hysteresis = 2;
  using G = Grad;
  expect_sequence(options, {
                               {G::kInf, 65536, 0, true, 1},
                               {G::kFinite, 65536, 1, false, 2},
                               {G::kInf, 65536, 0, true, 1},
                               {G::kInf, 32768, 0, true, 1},
                               {G::kNan, 16384, 0, true, 1},
                               {G::kFinite, 16384, 1, false, 2},
                               {G::kHuge, 16384, 2, false, 2},
                               {G::kFinite, 32768, 0, false, 2},
                               {G::kNan, 32768, 0, true, 1},
                               {G::kTiny, 32768, 1, false, 2},
                           });
}

TEST(LossScalerReference, HysteresisThreeToleratesTwo) {
  LossScalerOptions options;
  options.growth_interval = 2;
  options.hysteresis = 3;
  using G = Grad;
  expect_sequence(options, {
                               {G::kFinite, 65536, 1, false, 3},
                               {G::kInf, 65536, 0, true, 2},
                               {G::kNan, 65536, 0, true, 1},
                               {G::kInf, 32768, 0, true, 1},
                               {G::kFinite, 32768, 1, false, 3},
                               {G::kFinite, 65536, 0, false, 3},
                               {G::kInf, 65536, 0, true, 2},
                               {G::kFinite, 65536, 1, false, 3},
                           });
}

// torch drops a growth that would overflow fp32 but still resets the tracker; backoff has no
// floor, so 2^-149 * 0.5 rounds (ties to even) to 0.
TEST(LossScalerReference, ScaleLimitsFollowTorch) {
  LossScalerOptions options;
  options.growth_interval = 1;
  options.init_scale = 0x1p127f;
  ScalerState state = initial_state(options);
  StepRecord record = update_reference(state, false, options);
  EXPECT_EQ(record.scale, 0x1p127f);
  EXPECT_EQ(record.growth_tracker, 0);

  options.init_scale = 0x1p-148f;
  state = initial_state(options);
  EXPECT_EQ(update_reference(state, true, options).scale, 0x1p-149f);
  EXPECT_EQ(update_reference(state, true, options).scale, 0.0f);

  // Non-power-of-two factor: float(65536 * 0.3 in double) = 19660.80078125.
  options.init_scale = 65536.0f;
  options.backoff_factor = 0.3;
  state = initial_state(options);
  EXPECT_EQ(update_reference(state, true, options).scale, 19660.80078125f);
}

TEST(LossScalerReference, InverseScaleIsFp64ReciprocalRoundedToFp32) {
  EXPECT_EQ(inverse_scale(65536.0f), 0x1p-16f);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(inverse_scale(3.0f)), 0x3eaaaaabu);
  EXPECT_EQ(inverse_scale(1.0f), 1.0f);
}

// Hand-computed unscaled values: one rounding, to nearest even, in the gradient's dtype.
TEST(LossScalerReference, UnscaleRoundsOnceToNearestEven) {
  std::vector<std::uint16_t> halves = {0x3c00, 0x0001, 0x0003, 0x7bff, 0xc000};
  GradientTensor half_tensor{halves.data(), halves.size(), GradientDtype::kFloat16};
  EXPECT_FALSE(unscale_reference({&half_tensor, 1}, inverse_scale(2.0f)));
  EXPECT_EQ(halves[0], 0x3800);  // 1 / 2 = 0.5
  EXPECT_EQ(halves[1], 0x0000);  // 2^-25 is a tie between 0 and 2^-24: even is 0
  EXPECT_EQ(halves[2], 0x0002);  // 1.5 * 2^-24 ties to 2 * 2^-24
  EXPECT_EQ(halves[3], 0x77ff);  // 32752
  EXPECT_EQ(halves[4], 0xbc00);  // -2 / 2 = -1

  // Scale 0.5 (inv 2): 65504 * 2 overflows to inf after the check, which looks at the input.
  std::vector<std::uint16_t> huge = {0x7bff};
  GradientTensor huge_tensor{huge.data(), huge.size(), GradientDtype::kFloat16};
  EXPECT_FALSE(unscale_reference({&huge_tensor, 1}, inverse_scale(0.5f)));
  EXPECT_EQ(huge[0], 0x7c00);

  std::vector<std::uint16_t> brains = {0x3f80, 0x0001};  // 1.0, smallest subnormal bf16
  GradientTensor bf16_tensor{brains.data(), brains.size(), GradientDtype::kBFloat16};
  EXPECT_FALSE(unscale_reference({&bf16_tensor, 1}, inverse_scale(3.0f)));
  EXPECT_EQ(brains[0], 0x3eab);  // 0x3eaaaaab rounds up
  EXPECT_EQ(brains[1], 0x0000);  // 2^-133 / 3 < half of 2^-133: rounds to 0

  std::vector<float> floats = {3.0f, 1.0f};
  GradientTensor float_tensor{floats.data(), floats.size(), GradientDtype::kFloat32};
  EXPECT_FALSE(unscale_reference({&float_tensor, 1}, inverse_scale(3.0f)));
  EXPECT_EQ(floats[0], 1.0f);  // 3 * 0x3eaaaaab = 1 + 2^-25, below half an ulp
  EXPECT_EQ(std::bit_cast<std::uint32_t>(floats[1]), 0x3eaaaaabu);
}

TEST(LossScalerReference, FoundInfForInfAndNanInAnyDtype) {
  std::vector<std::uint16_t> bf = {0x3f80, 0x7f80};  // inf
  GradientTensor a{bf.data(), bf.size(), GradientDtype::kBFloat16};
  EXPECT_TRUE(unscale_reference({&a, 1}, 0.5f));
  std::vector<float> f = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  GradientTensor b{f.data(), f.size(), GradientDtype::kFloat32};
  EXPECT_TRUE(unscale_reference({&b, 1}, 0.5f));
  EXPECT_EQ(f[0], 0.5f);
  std::vector<std::uint16_t> h = {0x7c01};  // a signalling-NaN pattern
  GradientTensor c{h.data(), h.size(), GradientDtype::kFloat16};
  EXPECT_TRUE(unscale_reference({&c, 1}, 1.0f));
  EXPECT_EQ(h[0], 0x7c01);  // inv == 1: left untouched, as torch
}

TEST(LossScalerReference, HalfConversionMatchesCompilerFloat16) {
#if defined(__FLT16_MAX__)
  std::mt19937 random(12345);
  for (int i = 0; i < 2'000'000; ++i) {
    // Random exponents across the whole half range and beyond, random mantissas.
    const std::uint32_t bits = random();
    const float value =
        std::bit_cast<float>((bits & 0x807fffffu) | ((96u + (bits >> 24) % 50u) << 23));
    const _Float16 expected = static_cast<_Float16>(value);
    ASSERT_EQ(float_to_half_rn(value), std::bit_cast<std::uint16_t>(expected)) << value;
  }
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float mine = half_to_float(static_cast<std::uint16_t>(h));
    const float theirs = static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(h)));
    if (std::isnan(theirs)) {
      ASSERT_TRUE(std::isnan(mine));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(mine), std::bit_cast<std::uint32_t>(theirs)) << h;
    }
  }
#else
  GTEST_SKIP() << "compiler has no _Float16 to compare against";
#endif
}

TEST(LossScalerReference, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16_rn(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even down
  EXPECT_EQ(float_to_bfloat16_rn(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, even up
  EXPECT_EQ(float_to_bfloat16_rn(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bfloat16_rn(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // max float → inf
  EXPECT_EQ(float_to_bfloat16_rn(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(LossScalerReference, ValidateNamesTheBadField) {
  LossScalerOptions options;
  EXPECT_TRUE(validate(options).ok());
  options.hysteresis = 0;
  Status status = validate(options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("hysteresis"), std::string::npos);
  options = {};
  options.backoff_factor = 1.5;
  EXPECT_NE(validate(options).message().find("backoff_factor"), std::string::npos);
  options = {};
  options.init_scale = std::numeric_limits<float>::infinity();
  EXPECT_NE(validate(options).message().find("init_scale"), std::string::npos);
}

TEST(LossScalerReference, CreateRejectsBadOptionsBeforeTouchingTheGpu) {
  LossScalerOptions options;
  options.growth_interval = 0;
  auto scaler = LossScaler::create({}, options);
  ASSERT_FALSE(scaler.ok());
  EXPECT_EQ(scaler.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::kernels
