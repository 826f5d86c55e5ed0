// Dynamic loss scaler for mixed-precision training over raw device buffers: a fused multi-tensor
// unscale + overflow check, a device-side scale update (PyTorch GradScaler semantics, optional
// hysteresis), an optimizer step that skips itself on overflow, and the CPU twin of all three.
// TensorListScaler runs the same unscale, and the unscale + global L2 norm + clip factor, over a
// tensor list given afresh with every call (what torch's GradScaler needs: gradients move).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

// cudaStream_t is `CUstream_st*`; declared here so this header compiles without CUDA.
struct CUstream_st;

namespace gpuopt::kernels {

enum class GradientDtype : std::uint8_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

std::size_t dtype_size(GradientDtype dtype);
std::string_view dtype_name(GradientDtype dtype);

// One gradient tensor: `count` contiguous elements of `dtype` at `data` (device memory for
// LossScaler, host memory for the CPU twin). `data` must be aligned to the element size.
struct GradientTensor {
  void* data = nullptr;
  std::size_t count = 0;
  GradientDtype dtype = GradientDtype::kFloat16;
};

struct LossScalerOptions {
  float init_scale = 65536.0f;  // 2^16, as torch.amp.GradScaler
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // consecutive finite steps before the scale grows
  // 1 = PyTorch GradScaler (back off on every overflow). N > 1 = tolerate N-1 consecutive
  // overflows (steps still skipped) and back off on the Nth and every later one of that run; a
  // finite step re-arms it (DeepSpeed's consecutive_hysteresis, Megatron's "hysteresis").
  int hysteresis = 1;
  int history_capacity = 1024;  // steps kept in the device ring buffer of StepRecord
};

// INVALID_ARGUMENT naming the bad field.
Status validate(const LossScalerOptions& options);

// The state machine. The scale update follows torch's _amp_update_scale_ CUDA kernel exactly:
// float scale times double factor, rounded to float; growth is dropped when it would reach inf.
struct ScalerState {
  float scale = 65536.0f;
  std::int32_t growth_tracker = 0;      // consecutive finite steps since the last growth/overflow
  std::int32_t hysteresis_tracker = 1;  // overflows still tolerated before backing off (>= 1)
};

// One step as recorded by update(): the state after the step and whether it overflowed
// (found_inf != 0 means the optimizer step was skipped).
struct StepRecord {
  float scale = 0;
  std::int32_t growth_tracker = 0;
  std::int32_t hysteresis_tracker = 0;
  std::int32_t found_inf = 0;
  friend bool operator==(const StepRecord&, const StepRecord&) = default;
};

struct LossScalerStatistics {
  std::uint64_t steps = 0;
  std::uint64_t overflows = 0;  // = skipped optimizer steps
  ScalerState state;
  std::vector<StepRecord> history;  // the last min(steps, history_capacity) steps, oldest first
};

// ---- CPU twin (the oracle; host pointers) ----

// Bit conversions the twin uses; match CUDA's __half2float/__float2half_rn/__float2bfloat16_rn
// for every non-NaN input (NaN becomes the canonical 0x7fff with the sign dropped).
float half_to_float(std::uint16_t bits);
std::uint16_t float_to_half_rn(float value);
float bfloat16_to_float(std::uint16_t bits);
std::uint16_t float_to_bfloat16_rn(float value);

// As GradScaler.unscale_: inv = float(1 / double(scale)).
float inverse_scale(float scale);
// As torch._amp_foreach_non_finite_check_and_unscale_: every element x becomes
// dtype(float(x) * inv) (x unchanged when inv == 1); returns true when any input is inf or NaN.
bool unscale_reference(std::span<const GradientTensor> gradients, float inv_scale);
// One update of the state machine; returns the record that update() stores on the device.
StepRecord update_reference(ScalerState& state, bool found_inf, const LossScalerOptions& options);
// params[i] = fma(-lr, float(grad[i]), params[i]) unless found_inf.
void sgd_step_if_finite_reference(std::span<float* const> params,
                                  std::span<const GradientTensor> gradients, float learning_rate,
                                  bool found_inf);
ScalerState initial_state(const LossScalerOptions& options);

// ---- GPU ----

// Owns the device state of one scaler bound to a fixed list of gradient buffers. Each training
// step, all on one stream and with no host synchronisation:
//   unscale(s)            zero found_inf, then one fused kernel over every gradient
//   sgd_step_if_finite(s) (or the caller's own kernel reading device_found_inf())
//   update(s)             the scale/tracker update and one history record, on the device
// Only create(), bind_parameters() and fetch_statistics() synchronise.
class LossScaler {
 public:
  // Validates the tensors and options, allocates the device state and uploads the chunk table.
  static StatusOr<std::unique_ptr<LossScaler>> create(std::span<const GradientTensor> gradients,
                                                      const LossScalerOptions& options = {});
  ~LossScaler();
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  Status unscale(CUstream_st* stream);
  Status update(CUstream_st* stream);
  // fp32 master parameters, one per gradient tensor with the same element count.
  Status bind_parameters(std::span<float* const> params);
  Status sgd_step_if_finite(float learning_rate, CUstream_st* stream);

  // Device scalars a caller's kernels may read: found_inf (float, 0 or 1, valid from unscale()
  // until the next unscale()) and the current scale (float, to multiply the loss by).
  const float* device_found_inf() const;
  const float* device_scale() const;

  // Copies the state and history to the host and waits for `stream`: call it only when needed.
  StatusOr<LossScalerStatistics> fetch_statistics(CUstream_st* stream) const;

  std::size_t chunk_count() const { return chunk_count_; }
  int grid_blocks() const { return grid_blocks_; }

 private:
  LossScaler() = default;
  LossScalerOptions options_;
  std::vector<GradientTensor> gradients_;
  runtime::DeviceBuffer device_state_;   // DeviceScalerState followed by the history ring
  runtime::DeviceBuffer device_chunks_;  // ChunkDescriptor[chunk_count_]
  runtime::DeviceBuffer device_params_;  // float*[gradients_.size()]
  std::size_t chunk_count_ = 0;
  int grid_blocks_ = 0;
  bool parameters_bound_ = false;
};

// ---- Tensor lists given per call (gpuopt.amp.GradScaler) ----

// CPU twin of one TensorListScaler::unscale_norm() pass: found_inf over the inputs and the sum of
// squares of the unscaled values y = dtype(float(x) * inv) (y = x when inv == 1), accumulated in
// double; the tensors are not written.
struct UnscaleNormResult {
  bool found_inf = false;
  double sum_squares = 0;
};
UnscaleNormResult unscale_norm_reference(std::span<const GradientTensor> gradients,
                                         float inv_scale);
// torch.nn.utils.clip_grad_norm_'s factor, in its fp32 operations:
// clamp(fl(fl(1 / fl(total_norm + 1e-6f)) * max_norm), max = 1) (NaN stays NaN).
float clip_coefficient_reference(float total_norm, float max_norm);
// Every element x becomes dtype(float(dtype(float(x) * first)) * second), the two roundings of
// unscale_ followed by clip_grad_norm_'s multiply; nothing is written when both factors are 1.
void scale_twice_reference(std::span<const GradientTensor> gradients, float first, float second);

struct TensorListOptions {
  std::size_t chunk_bytes = 64 * 1024;  // work of one block step; a multiple of 16, >= 1024
  int max_blocks = 0;                   // 0 = every SM at full occupancy
  int max_table_slots = 64;             // device tables kept in flight before a call waits
};

// INVALID_ARGUMENT naming the bad field.
Status validate(const TensorListOptions& options);

// Device scalars written by TensorListScaler::unscale_norm (caller-owned device floats).
struct NormOutputs {
  float* total_norm = nullptr;        // required: L2 norm of the unscaled gradients
  float* clip_coefficient = nullptr;  // required: clip_coefficient_reference(norm, max_norm)
  // Optional: *scale / clip_coefficient, the grad_scale of an optimizer that divides every
  // gradient by it (torch's fused Adam/AdamW/SGD), so the clip needs no pass of its own.
  float* combined_scale = nullptr;
};

// Multi-tensor kernels over a list of gradient tensors that may change from call to call. The
// list travels as a small device table (one entry per tensor, uploaded from pinned memory on the
// caller's stream, reused without a copy while the list is unchanged); each block finds its chunk
// by a binary search over the table. No call synchronises with the device, except when more than
// max_table_slots tables are still in use by queued work (then it waits for the oldest).
// `scale` is a device float (the loss scale; gradients are multiplied by float(1 / double(scale))
// as torch does); null means 1 (check only). found_inf is a device float the kernels set to 1 when
// any input element is inf or NaN; the caller zeroes it (as torch's GradScaler does).
class TensorListScaler {
 public:
  // For CUDA device `device`; allocates nothing yet.
  static StatusOr<std::unique_ptr<TensorListScaler>> create(int device,
                                                            const TensorListOptions& options = {});
  ~TensorListScaler();
  TensorListScaler(const TensorListScaler&) = delete;
  TensorListScaler& operator=(const TensorListScaler&) = delete;

  // One launch: found_inf |= any non-finite input; x = dtype(float(x) * inv) unless inv == 1.
  Status unscale(std::span<const GradientTensor> gradients, const float* scale, float* found_inf,
                 CUstream_st* stream);
  // Two launches, the gradients read once and not written: found_inf as unscale(), per-block
  // partial sums of squares of the unscaled values, then one block reducing them into `outputs`.
  Status unscale_norm(std::span<const GradientTensor> gradients, const float* scale,
                      float* found_inf, float max_norm, const NormOutputs& outputs,
                      CUstream_st* stream);
  // One launch: x = dtype(float(dtype(float(x) * inv)) * (*second)), as scale_twice_reference;
  // `second` is a device float (e.g. the clip coefficient), null for 1.
  Status scale_twice(std::span<const GradientTensor> gradients, const float* scale,
                     const float* second, CUstream_st* stream);

  // Introspection for tests: tables allocated, and host-to-device table copies made so far.
  std::size_t table_slots() const;
  std::uint64_t table_uploads() const;
  int grid_blocks() const;

 private:
  struct Impl;
  explicit TensorListScaler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuopt::kernels
