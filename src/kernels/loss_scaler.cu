// LossScaler: the host side of the device loss scaler (allocation, chunk table, launches, stats).
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"
#include "kernels/loss_scaler_device.cuh"

namespace gpuopt::kernels {

using detail::ChunkDescriptor;
using detail::DeviceScalerState;

StatusOr<std::unique_ptr<LossScaler>> LossScaler::create(std::span<const GradientTensor> gradients,
                                                         const LossScalerOptions& options) {
  GPUOPT_RETURN_IF_ERROR(validate(options));
  GPUOPT_ASSIGN_OR_RETURN(std::vector<ChunkDescriptor> chunks,
                          detail::build_chunk_table(gradients));
  for (std::size_t t = 0; t < gradients.size(); ++t) {
    if (gradients[t].count == 0) continue;
    cudaPointerAttributes attributes{};
    GPUOPT_CUDA_TRY(cudaPointerGetAttributes(&attributes, gradients[t].data));
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      return invalid_argument("gradient tensor " + std::to_string(t) +
                              ": data is not device or managed memory");
    }
  }
  std::unique_ptr<LossScaler> scaler(new LossScaler());
  scaler->options_ = options;
  scaler->gradients_.assign(gradients.begin(), gradients.end());
  scaler->chunk_count_ = chunks.size();
  GPUOPT_CUDA_TRY(detail::unscale_grid_blocks(chunks.size(), &scaler->grid_blocks_));

  const std::size_t state_bytes = detail::device_state_bytes(options.history_capacity);
  GPUOPT_ASSIGN_OR_RETURN(scaler->device_state_, runtime::DeviceBuffer::allocate(state_bytes));
  std::vector<unsigned char> initial(state_bytes, 0);
  DeviceScalerState state{};
  const ScalerState start = initial_state(options);
  state.scale = start.scale;
  state.growth_tracker = start.growth_tracker;
  state.hysteresis_tracker = start.hysteresis_tracker;
  std::memcpy(initial.data(), &state, sizeof(state));
  // Setup, not a training step: a synchronous upload is fine here.
  GPUOPT_CUDA_TRY(cudaMemcpy(scaler->device_state_.data(), initial.data(), state_bytes,
                             cudaMemcpyHostToDevice));
  if (!chunks.empty()) {
    GPUOPT_ASSIGN_OR_RETURN(scaler->device_chunks_, runtime::DeviceBuffer::allocate(
                                                        chunks.size() * sizeof(ChunkDescriptor)));
    GPUOPT_CUDA_TRY(cudaMemcpy(scaler->device_chunks_.data(), chunks.data(),
                               chunks.size() * sizeof(ChunkDescriptor), cudaMemcpyHostToDevice));
  }
  return std::move(scaler);
}

LossScaler::~LossScaler() = default;

Status LossScaler::unscale(CUstream_st* stream) {
  auto* state = device_state_.data_as<DeviceScalerState>();
  if (chunk_count_ == 0) {
    // Nothing to check: found_inf is still reset so the step hook sees this step's answer.
    GPUOPT_CUDA_TRY(cudaMemsetAsync(&state->found_inf, 0, sizeof(float), stream));
    return ok_status();
  }
  GPUOPT_CUDA_TRY(detail::launch_unscale(device_chunks_.data_as<const ChunkDescriptor>(),
                                         chunk_count_, state, grid_blocks_, stream));
  return ok_status();
}

Status LossScaler::update(CUstream_st* stream) {
  GPUOPT_CUDA_TRY(
      detail::launch_update(device_state_.data_as<DeviceScalerState>(), options_, stream));
  return ok_status();
}

Status LossScaler::bind_parameters(std::span<float* const> params) {
  if (params.size() != gradients_.size()) {
    return invalid_argument("bind_parameters: " + std::to_string(params.size()) +
                            " parameter tensors for " + std::to_string(gradients_.size()) +
                            " gradient tensors");
  }
  for (std::size_t t = 0; t < params.size(); ++t) {
    if (gradients_[t].count != 0 && params[t] == nullptr) {
      return invalid_argument("bind_parameters: parameter tensor " + std::to_string(t) +
                              " is null");
    }
  }
  if (device_params_.empty() && !params.empty()) {
    GPUOPT_ASSIGN_OR_RETURN(device_params_,
                            runtime::DeviceBuffer::allocate(params.size() * sizeof(float*)));
  }
  if (!params.empty()) {
    GPUOPT_CUDA_TRY(cudaMemcpy(device_params_.data(), params.data(), params.size() * sizeof(float*),
                               cudaMemcpyHostToDevice));
  }
  parameters_bound_ = true;
  return ok_status();
}

Status LossScaler::sgd_step_if_finite(float learning_rate, CUstream_st* stream) {
  if (!parameters_bound_) {
    return failed_precondition("sgd_step_if_finite: call bind_parameters() first");
  }
  if (chunk_count_ == 0) return ok_status();
  detail::k_sgd_step_if_finite<<<grid_blocks_, detail::kThreadsPerBlock, 0, stream>>>(
      device_chunks_.data_as<const ChunkDescriptor>(), static_cast<unsigned>(chunk_count_),
      device_params_.data_as<float* const>(), device_state_.data_as<const DeviceScalerState>(),
      learning_rate);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

const float* LossScaler::device_found_inf() const {
  return &device_state_.data_as<const DeviceScalerState>()->found_inf;
}

const float* LossScaler::device_scale() const {
  return &device_state_.data_as<const DeviceScalerState>()->scale;
}

StatusOr<LossScalerStatistics> LossScaler::fetch_statistics(CUstream_st* stream) const {
  const std::size_t state_bytes = detail::device_state_bytes(options_.history_capacity);
  std::vector<unsigned char> host(state_bytes);
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(host.data(), device_state_.data(), state_bytes,
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  DeviceScalerState state;
  std::memcpy(&state, host.data(), sizeof(state));
  LossScalerStatistics statistics;
  statistics.steps = state.steps;
  statistics.overflows = state.overflows;
  statistics.state.scale = state.scale;
  statistics.state.growth_tracker = state.growth_tracker;
  statistics.state.hysteresis_tracker = state.hysteresis_tracker;
  const auto capacity = static_cast<std::uint64_t>(options_.history_capacity);
  const std::uint64_t kept = state.steps < capacity ? state.steps : capacity;
  const auto* ring = reinterpret_cast<const StepRecord*>(host.data() + sizeof(DeviceScalerState));
  for (std::uint64_t k = state.steps - kept; k < state.steps; ++k) {
    statistics.history.push_back(ring[k % capacity]);
  }
  return statistics;
}

}  // namespace gpuopt::kernels
