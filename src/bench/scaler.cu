// `gpuopt bench scaler` testcases on the GPU. They launch the loss scaler's device code from
// kernels/loss_scaler_device.cuh directly (the same kernels LossScaler runs), so the bench module
// needs no link dependency on gpuopt_kernels.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpuopt/bench/scaler.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "kernels/loss_scaler_device.cuh"

namespace gpuopt::bench::scaler {
namespace {

using kernels::GradientDtype;
using kernels::GradientTensor;
using kernels::LossScalerOptions;
using kernels::StepRecord;
using kernels::detail::ChunkDescriptor;
using kernels::detail::DeviceScalerState;

// Owns what one testcase allocates; frees it on every path out.
struct DeviceResources {
  std::vector<runtime::DeviceBuffer> buffers;  // freed last, after the stream is gone
  std::vector<cudaEvent_t> events;
  cudaStream_t stream = nullptr;
  ~DeviceResources() {
    for (cudaEvent_t event : events) GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(event));
    if (stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
  }
  Status allocate(void** pointer, std::size_t bytes) {
    GPUOPT_ASSIGN_OR_RETURN(runtime::DeviceBuffer buffer, runtime::DeviceBuffer::allocate(bytes));
    *pointer = buffer.data();
    buffers.push_back(std::move(buffer));
    return ok_status();
  }
  Status event(cudaEvent_t* out) {
    GPUOPT_CUDA_TRY(cudaEventCreate(out));
    events.push_back(*out);
    return ok_status();
  }
};

Status require_gpu() {
  auto count = cuda_device_count();
  if (!count.ok()) return count.status();
  return ok_status();
}

// The device state with the scale at `scale`, as LossScaler::create writes it.
Status upload_state(DeviceScalerState* state, const LossScalerOptions& options, float scale) {
  std::vector<unsigned char> bytes(kernels::detail::device_state_bytes(options.history_capacity),
                                   0);
  DeviceScalerState initial{};
  initial.scale = scale;
  initial.hysteresis_tracker = options.hysteresis;
  std::memcpy(bytes.data(), &initial, sizeof(initial));
  GPUOPT_CUDA_TRY(cudaMemcpy(state, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return ok_status();
}

class UnscaleTestcase : public Testcase {
 public:
  std::string key() const override { return "unscale_fp16"; }
  std::string description() const override {
    return "fused unscale + inf/NaN check over 1 GiB of fp16 gradients in 200 tensors vs a "
           "device-to-device copy of the same bytes";
  }
  Status filter(const BenchContext&) const override { return require_gpu(); }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    const BenchOptions& options = context.options();
    const int samples = options.samples > 0 ? options.samples : (options.quick ? 10 : 40);
    const int warmup = options.warmup > 0 ? options.warmup : 3;
    GPUOPT_CUDA_TRY(cudaSetDevice(options.device));

    const std::vector<std::size_t> sizes = gradient_sizes(kGradientBytes, kTensorCount, 2);
    // Each tensor starts on a 256-byte boundary, as a caching allocator hands them out.
    std::vector<std::size_t> offsets;
    std::size_t arena_bytes = 0;
    for (std::size_t count : sizes) {
      offsets.push_back(arena_bytes);
      arena_bytes += (count * 2 + 255) / 256 * 256;
    }
    DeviceResources resources;
    void* arena = nullptr;
    void* copy_destination = nullptr;
    GPUOPT_RETURN_IF_ERROR(resources.allocate(&arena, arena_bytes));
    GPUOPT_RETURN_IF_ERROR(resources.allocate(&copy_destination, kGradientBytes));
    GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&resources.stream, cudaStreamNonBlocking));
    cudaStream_t stream = resources.stream;
    // 0x3c3c halves (1.06): finite, so the kernel scales and writes every element.
    GPUOPT_CUDA_TRY(cudaMemsetAsync(arena, 0x3c, arena_bytes, stream));
    GPUOPT_CUDA_TRY(cudaMemsetAsync(copy_destination, 0, kGradientBytes, stream));

    std::vector<GradientTensor> tensors;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      tensors.push_back(
          {static_cast<char*>(arena) + offsets[t], sizes[t], GradientDtype::kFloat16});
    }
    GPUOPT_ASSIGN_OR_RETURN(std::vector<ChunkDescriptor> chunks,
                            kernels::detail::build_chunk_table(tensors));
    void* device_chunks = nullptr;
    GPUOPT_RETURN_IF_ERROR(
        resources.allocate(&device_chunks, chunks.size() * sizeof(ChunkDescriptor)));
    GPUOPT_CUDA_TRY(cudaMemcpy(device_chunks, chunks.data(),
                               chunks.size() * sizeof(ChunkDescriptor), cudaMemcpyHostToDevice));
    LossScalerOptions scaler_options;
    void* state_memory = nullptr;
    GPUOPT_RETURN_IF_ERROR(resources.allocate(
        &state_memory, kernels::detail::device_state_bytes(scaler_options.history_capacity)));
    auto* state = static_cast<DeviceScalerState*>(state_memory);
    GPUOPT_RETURN_IF_ERROR(upload_state(state, scaler_options, scaler_options.init_scale));
    int blocks = 0;
    GPUOPT_CUDA_TRY(kernels::detail::unscale_grid_blocks(chunks.size(), &blocks));

    cudaEvent_t start, middle, stop;
    GPUOPT_RETURN_IF_ERROR(resources.event(&start));
    GPUOPT_RETURN_IF_ERROR(resources.event(&middle));
    GPUOPT_RETURN_IF_ERROR(resources.event(&stop));
    std::vector<double> unscale_ms, copy_ms;
    // Alternate the two in every sample so clocks and temperature treat them alike.
    for (int i = 0; i < warmup + samples; ++i) {
      GPUOPT_CUDA_TRY(cudaEventRecord(start, stream));
      GPUOPT_CUDA_TRY(
          kernels::detail::launch_unscale(static_cast<const ChunkDescriptor*>(device_chunks),
                                          chunks.size(), state, blocks, stream));
      GPUOPT_CUDA_TRY(cudaEventRecord(middle, stream));
      GPUOPT_CUDA_TRY(cudaMemcpyAsync(copy_destination, arena, kGradientBytes,
                                      cudaMemcpyDeviceToDevice, stream));
      GPUOPT_CUDA_TRY(cudaEventRecord(stop, stream));
      GPUOPT_CUDA_TRY(cudaEventSynchronize(stop));
      float first = 0, second = 0;
      GPUOPT_CUDA_TRY(cudaEventElapsedTime(&first, start, middle));
      GPUOPT_CUDA_TRY(cudaEventElapsedTime(&second, middle, stop));
      if (i >= warmup) {
        unscale_ms.push_back(first);
        copy_ms.push_back(second);
      }
      context.progress(static_cast<double>(i + 1) / (warmup + samples));
    }
    float found_inf = -1;
    GPUOPT_CUDA_TRY(
        cudaMemcpy(&found_inf, &state->found_inf, sizeof(float), cudaMemcpyDeviceToHost));
    if (found_inf != 0.0f) return internal_error("found_inf set on finite gradients");

    const Summary unscale = summarize(unscale_ms);
    const Summary copy = summarize(copy_ms);
    // Both read and write every byte once: GB/s counts both directions (1e9 bytes per second).
    const double moved = 2.0 * static_cast<double>(kGradientBytes);
    const double unscale_gbps = moved / (unscale.median * 1e6);
    const double copy_gbps = moved / (copy.median * 1e6);
    const double ratio = unscale_gbps / copy_gbps;

    TestcaseResult result;
    result.table.columns = {"operation", "median ms", "GB/s (read+write)", "spread"};
    auto row = [](const char* name, const Summary& s, double gbps) {
      char ms[32], rate[32], spread[32];
      std::snprintf(ms, sizeof(ms), "%.3f", s.median);
      std::snprintf(rate, sizeof(rate), "%.0f", gbps);
      std::snprintf(spread, sizeof(spread), "%.1f%%", 100.0 * s.relative_spread());
      return std::vector<std::string>{name, ms, rate, spread};
    };
    result.table.rows.push_back(row("fused unscale (200 fp16 tensors)", unscale, unscale_gbps));
    result.table.rows.push_back(row("cudaMemcpyAsync D2D (same bytes)", copy, copy_gbps));
    char note[160];
    std::snprintf(note, sizeof(note),
                  "fused unscale at %.1f%% of D2D copy bandwidth (target %.0f%%)", 100.0 * ratio,
                  100.0 * kTargetRatio);
    result.notes.push_back(note);
    result.data["bytes"] = kGradientBytes;
    result.data["tensors"] = sizes.size();
    result.data["tensor_elements"] = sizes;
    result.data["chunks"] = chunks.size();
    result.data["grid_blocks"] = blocks;
    result.data["samples"] = samples;
    result.data["unscale_ms"] = to_json(unscale);
    result.data["copy_ms"] = to_json(copy);
    result.data["unscale_bandwidth_gbps"] = unscale_gbps;
    result.data["copy_bandwidth_gbps"] = copy_gbps;
    result.data["ratio"] = ratio;
    result.data["target_ratio"] = kTargetRatio;
    result.data["meets_target"] = ratio >= kTargetRatio;
    return result;
  }
};

// Fills fp16 gradients for one scripted step (host side); only whether a value is inf/NaN
// changes the sequence, the rest keeps the data realistic.
void fill_step(char letter, std::size_t step, std::vector<std::vector<__half>>& tensors) {
  std::uint32_t lcg = 12345u + static_cast<std::uint32_t>(step) * 7919u;
  for (auto& tensor : tensors) {
    for (__half& value : tensor) {
      lcg = lcg * 1664525u + 1013904223u;
      const float uniform = static_cast<float>(lcg >> 8) / 16777216.0f * 2.0f - 1.0f;
      value =
          letter == 'T'
              ? __ushort_as_half(static_cast<unsigned short>((lcg >> 30) & 1u ? 0x0001 : 0x8001))
              : __float2half_rn(uniform * 1000.0f);
    }
  }
  auto& target = tensors[step % tensors.size()];
  const std::size_t at = (step * 37) % target.size();
  if (letter == 'H') target[at] = __ushort_as_half(0x7bff);
  if (letter == 'I') target[at] = __ushort_as_half(step % 2 ? 0xfc00 : 0x7c00);
  if (letter == 'N') target[at] = __ushort_as_half(0x7e00);
}

class SequenceTestcase : public Testcase {
 public:
  std::string key() const override { return "sequence"; }
  std::string description() const override {
    return "the scripted GradScaler sequence (finite, inf, NaN, huge, tiny) run on the device";
  }
  Status filter(const BenchContext&) const override { return require_gpu(); }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_CUDA_TRY(cudaSetDevice(context.options().device));
    std::vector<std::vector<__half>> host = {std::vector<__half>(1000), std::vector<__half>(333),
                                             std::vector<__half>(7)};
    DeviceResources resources;
    GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&resources.stream, cudaStreamNonBlocking));
    std::vector<GradientTensor> tensors;
    for (auto& h : host) {
      void* device = nullptr;
      GPUOPT_RETURN_IF_ERROR(resources.allocate(&device, h.size() * sizeof(__half)));
      tensors.push_back({device, h.size(), GradientDtype::kFloat16});
    }
    GPUOPT_ASSIGN_OR_RETURN(std::vector<ChunkDescriptor> chunks,
                            kernels::detail::build_chunk_table(tensors));
    void* device_chunks = nullptr;
    GPUOPT_RETURN_IF_ERROR(
        resources.allocate(&device_chunks, chunks.size() * sizeof(ChunkDescriptor)));
    GPUOPT_CUDA_TRY(cudaMemcpy(device_chunks, chunks.data(),
                               chunks.size() * sizeof(ChunkDescriptor), cudaMemcpyHostToDevice));
    LossScalerOptions options;
    options.growth_interval = kScriptGrowthInterval;
    void* state_memory = nullptr;
    GPUOPT_RETURN_IF_ERROR(resources.allocate(
        &state_memory, kernels::detail::device_state_bytes(options.history_capacity)));
    auto* state = static_cast<DeviceScalerState*>(state_memory);
    GPUOPT_RETURN_IF_ERROR(upload_state(state, options, options.init_scale));
    int blocks = 0;
    GPUOPT_CUDA_TRY(kernels::detail::unscale_grid_blocks(chunks.size(), &blocks));

    for (std::size_t step = 0; step < kScript.size(); ++step) {
      fill_step(kScript[step], step, host);
      for (std::size_t t = 0; t < host.size(); ++t) {
        GPUOPT_CUDA_TRY(cudaMemcpyAsync(tensors[t].data, host[t].data(),
                                        host[t].size() * sizeof(__half), cudaMemcpyHostToDevice,
                                        resources.stream));
      }
      GPUOPT_CUDA_TRY(
          kernels::detail::launch_unscale(static_cast<const ChunkDescriptor*>(device_chunks),
                                          chunks.size(), state, blocks, resources.stream));
      GPUOPT_CUDA_TRY(kernels::detail::launch_update(state, options, resources.stream));
      // The host buffers are refilled next step: wait (this is a check, not the training path).
      GPUOPT_CUDA_TRY(cudaStreamSynchronize(resources.stream));
    }
    std::vector<unsigned char> bytes(kernels::detail::device_state_bytes(options.history_capacity));
    GPUOPT_CUDA_TRY(cudaMemcpy(bytes.data(), state, bytes.size(), cudaMemcpyDeviceToHost));
    const auto* history =
        reinterpret_cast<const StepRecord*>(bytes.data() + sizeof(DeviceScalerState));

    TestcaseResult result;
    result.table.columns = {"step", "gradients", "scale after", "growth tracker", "skipped"};
    std::vector<double> scales;
    std::vector<int> trackers, skipped;
    for (std::size_t step = 0; step < kScript.size(); ++step) {
      const StepRecord& record = history[step];
      scales.push_back(record.scale);
      trackers.push_back(record.growth_tracker);
      skipped.push_back(record.found_inf);
      result.table.rows.push_back(
          {std::to_string(step + 1), std::string(1, kScript[step]), std::to_string(record.scale),
           std::to_string(record.growth_tracker), record.found_inf ? "yes" : "no"});
    }
    result.data["script"] = std::string(kScript);
    result.data["init_scale"] = options.init_scale;
    result.data["growth_factor"] = options.growth_factor;
    result.data["backoff_factor"] = options.backoff_factor;
    result.data["growth_interval"] = options.growth_interval;
    result.data["scales"] = scales;
    result.data["growth_trackers"] = trackers;
    result.data["skipped"] = skipped;
    return result;
  }
};

}  // namespace

std::unique_ptr<Testcase> make_unscale_testcase() { return std::make_unique<UnscaleTestcase>(); }
std::unique_ptr<Testcase> make_sequence_testcase() { return std::make_unique<SequenceTestcase>(); }

}  // namespace gpuopt::bench::scaler
