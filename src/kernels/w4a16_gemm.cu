// W4A16Gemm and W4A16DeviceWeights: the plan (which path and kernel for this M, layer and device,
// and the workspace), the act-order permute of x, and the launch of the chosen kernel: the direct
// (w4a16_sm80_direct.cu) and wgmma (w4a16_sm90_wgmma.cu) kernels, the original mma.sync kernels
// (w4a16_sm80_mma_tiled.cu) or dequantise + cuBLAS (w4a16_dequant_cublas.cu); the choices that need
// no device are in w4a16_plan.cpp. Layout and design: docs/w4a16-gemm.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "w4a16_device.cuh"
#include "w4a16_paths.hpp"

namespace gpuopt::kernels {
namespace {
using namespace w4a16_detail;  // NOLINT: the kernels below are written in its terms

// fmt's headers do not compile under nvcc here, so messages are built from pieces.
std::string piece(const char* value) { return value; }
template <typename Number>
std::string piece(Number value) {
  return std::to_string(value);
}
template <typename... Args>
std::string text(const Args&... args) {
  return (std::string() + ... + piece(args));
}

// xp[m][i] = x[m][perm[i]]: act-order checkpoints feed rows in group order.
template <typename T>
__global__ void k_permute_columns(const T* __restrict__ x, const int* __restrict__ perm,
                                  T* __restrict__ xp, int m, int k) {
  const std::size_t total = static_cast<std::size_t>(m) * k;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / k;
    const int col = static_cast<int>(i - row * k);
    xp[i] = x[row * k + perm[col]];
  }
}

struct Plan {
  W4A16Config config;
  std::size_t partial_offset = 0, counters_offset = 0, permuted_offset = 0, dense_offset = 0;
  std::size_t workspace_bytes = 0;
};

// The device's SM count, after checking W4A16Options::sm_count against it (0, or 1..that count).
StatusOr<int> device_sms_checked(int device, int sm_count) {
  int sms = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (sm_count < 0 || sm_count > sms) {
    return invalid_argument("W4A16Options::sm_count=" + std::to_string(sm_count) +
                            ": must be 0 (the device's) or 1.." + std::to_string(sms) +
                            " (this device's SMs)");
  }
  return sms;
}

StatusOr<Plan> make_plan(const W4A16Gemm::Arguments& arguments, const W4A16Options& options) {
  GPUOPT_RETURN_IF_ERROR(check_w4a16_options(options));
  const W4A16DeviceWeights& w = *arguments.weights;
  const int m = arguments.m;
  Plan plan;
  W4A16Config& config = plan.config;
  int device = 0;
  GPUOPT_CUDA_TRY(cudaGetDevice(&device));
  // The SMs to plan the grids for: the device's, or the partition's (W4A16Options::sm_count).
  GPUOPT_ASSIGN_OR_RETURN(int sms, device_sms_checked(device, options.sm_count));
  if (options.sm_count > 0) sms = options.sm_count;
  int fallback_min_m = options.fallback_min_m;
  if (fallback_min_m == W4A16Options::kAutoFallback) {
    GPUOPT_ASSIGN_OR_RETURN(fallback_min_m,
                            W4A16Gemm::auto_fallback_min_m(w, device, options.sm_count));
  }
  bool fallback = takes_fallback(m, fallback_min_m, options);
  std::size_t offset = 0;
  if (w.perm != nullptr) {
    plan.permuted_offset = offset;
    offset = align256(offset + static_cast<std::size_t>(m) * w.k * 2);
  }
  int optin = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const bool wide = w.n % (4 * kTileN) == 0;
  const bool swapped = swapped_for(m, options);
  int m_tiles = initial_m_tiles(m, swapped);
  // The deepest m-tiling whose shared memory this GPU allows (Ampere/Ada give a block 99-163 KB,
  // less than the 4-m-tile kernel wants); none fits: the cuBLAS path.
  while (m_tiles > 1 &&
         tiled_shared_bytes(w.type, swapped, m_tiles, wide) > static_cast<std::size_t>(optin)) {
    m_tiles /= 2;
  }
  if (tiled_shared_bytes(w.type, swapped, m_tiles, wide) > static_cast<std::size_t>(optin)) {
    fallback = true;
  }
  if (fallback) {
    config.path = W4A16Path::kDequantCublas;
    plan.dense_offset = offset;
    offset = align256(offset + static_cast<std::size_t>(w.n) * w.k * 2);
    plan.workspace_bytes = offset;
    return plan;
  }
  config.path = W4A16Path::kTensorCore;
  // The direct and wgmma kernels: forced, or chosen by M (kernel_candidates, w4a16_plan.cpp).
  const std::vector<W4A16ForcePath> extras =
      options.force_path == W4A16ForcePath::kDirect || options.force_path == W4A16ForcePath::kWgmma
          ? std::vector<W4A16ForcePath>{options.force_path}
          : kernel_candidates(w.k, w.n, m, options);
  for (const W4A16ForcePath extra : extras) {
    const bool direct = extra == W4A16ForcePath::kDirect;
    StatusOr<w4a16_detail::KernelPlan> kernel_plan =
        direct ? w4a16_detail::plan_direct(w, m, device, sms, options.tuning)
               : w4a16_detail::plan_wgmma(w, m, device, sms, options.tuning);
    if (!kernel_plan.ok() && options.force_path == extra) return kernel_plan.status();
    if (kernel_plan.ok()) {
      config.kernel = direct ? W4A16Kernel::kDirect : W4A16Kernel::kWgmma;
      w4a16_detail::store_plan(*kernel_plan, config);
      plan.partial_offset = offset;
      offset = align256(offset + kernel_plan->workspace_bytes);
      plan.counters_offset = offset;
      plan.workspace_bytes = offset;
      return plan;
    }
  }
  GPUOPT_ASSIGN_OR_RETURN(const int partial_slices,
                          plan_tiled(w, m, swapped, m_tiles, wide, device, sms, options, config));
  plan.partial_offset = offset;
  offset = align256(offset + static_cast<std::size_t>(partial_slices) * m * w.n * sizeof(float));
  plan.counters_offset = offset;
  offset = align256(offset + static_cast<std::size_t>(config.tiles) * sizeof(int));
  plan.workspace_bytes = offset;
  return plan;
}

}  // namespace

// ---- W4A16DeviceWeights ----

StatusOr<W4A16DeviceWeights> W4A16DeviceWeights::upload(const W4A16Weights& weights,
                                                        StreamHandle stream) {
  GPUOPT_RETURN_IF_ERROR(check_w4a16_shape(weights.k, weights.n, weights.group_size));
  W4A16DeviceWeights out;
  out.k = weights.k;
  out.n = weights.n;
  out.group_size = weights.group_size;
  out.type = weights.type;
  out.has_zeros = weights.has_zeros;
  auto copy = [&](const void* host, std::size_t bytes, const void*& device) -> Status {
    GPUOPT_ASSIGN_OR_RETURN(runtime::DeviceBuffer buffer, runtime::DeviceBuffer::allocate(bytes));
    GPUOPT_RETURN_IF_ERROR(buffer.copy_from_host(host, bytes, stream));
    device = buffer.data();
    out.buffers_.push_back(std::move(buffer));
    return ok_status();
  };
  GPUOPT_RETURN_IF_ERROR(copy(weights.tiles.data(), weights.tiles.size() * 4, out.tiles));
  GPUOPT_RETURN_IF_ERROR(copy(weights.scales.data(), weights.scales.size() * 2, out.scales));
  if (weights.has_zeros) {
    GPUOPT_RETURN_IF_ERROR(copy(weights.zeros.data(), weights.zeros.size(), out.zeros));
  }
  if (!weights.perm.empty()) {
    GPUOPT_RETURN_IF_ERROR(copy(weights.perm.data(), weights.perm.size() * 4, out.perm));
  }
  // The host vectors may go away once this returns.
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  return std::move(out);
}

W4A16DeviceWeights::W4A16DeviceWeights(W4A16DeviceWeights&& other) noexcept {
  *this = std::move(other);
}

W4A16DeviceWeights& W4A16DeviceWeights::operator=(W4A16DeviceWeights&& other) noexcept {
  if (this != &other) {
    k = other.k;
    n = other.n;
    group_size = other.group_size;
    type = other.type;
    has_zeros = other.has_zeros;
    tiles = other.tiles;
    scales = other.scales;
    zeros = other.zeros;
    perm = other.perm;
    buffers_ = std::move(other.buffers_);  // frees this one's own buffers first
    other.tiles = other.scales = other.zeros = other.perm = nullptr;
    other.buffers_.clear();
  }
  return *this;
}

W4A16DeviceWeights::~W4A16DeviceWeights() = default;

std::size_t W4A16DeviceWeights::compressed_bytes() const {
  const std::size_t groups = static_cast<std::size_t>(k / group_size);
  return static_cast<std::size_t>(k) * n / 2 + groups * n * 2 + (has_zeros ? groups * n : 0);
}

// ---- W4A16Gemm ----

W4A16Gemm::W4A16Gemm(W4A16Options options) : options_(options) {}

W4A16Gemm::~W4A16Gemm() { w4a16_detail::destroy_cublas_handle(cublas_); }

Status W4A16Gemm::can_implement(const Arguments& arguments) {
  if (arguments.weights == nullptr) return invalid_argument("W4A16Gemm: no weights given");
  const W4A16DeviceWeights& w = *arguments.weights;
  if (arguments.m <= 0) return invalid_argument(text("M=", arguments.m, " must be positive"));
  if (arguments.x == nullptr || arguments.y == nullptr) {
    return invalid_argument("W4A16Gemm: x and y must be device pointers");
  }
  if (w.tiles == nullptr || w.scales == nullptr) {
    return invalid_argument("W4A16Gemm: weights were not uploaded");
  }
  if (reinterpret_cast<std::uintptr_t>(arguments.x) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(arguments.y) % 16 != 0) {
    return invalid_argument("W4A16Gemm: x and y must be 16-byte aligned");
  }
  return check_w4a16_shape(w.k, w.n, w.group_size);
}

StatusOr<int> W4A16Gemm::auto_fallback_min_m(const W4A16DeviceWeights& weights, int device,
                                             int sm_count) {
  GPUOPT_ASSIGN_OR_RETURN(const int sms, device_sms_checked(device, sm_count));
  const StatusOr<w4a16_detail::KernelPlan> wgmma =
      w4a16_detail::plan_wgmma(weights, 32, device, sms, W4A16Tuning{});
  if (!wgmma.ok() && wgmma.status().code() != StatusCode::kFailedPrecondition) {
    return wgmma.status();
  }
  // The measured crossovers (w4a16_plan.cpp): the whole GPU's, then a partition's.
  const int whole = w4a16_detail::whole_gpu_takeover_m(weights.k, weights.n, wgmma.ok());
  return w4a16_detail::partition_takeover_m(whole, sm_count, sms);
}

StatusOr<std::size_t> W4A16Gemm::workspace_size(const Arguments& arguments) {
  GPUOPT_RETURN_IF_ERROR(can_implement(arguments));
  GPUOPT_ASSIGN_OR_RETURN(Plan plan, make_plan(arguments, options_));
  return plan.workspace_bytes;
}

Status W4A16Gemm::initialize(const Arguments& arguments, void* workspace, StreamHandle stream) {
  GPUOPT_RETURN_IF_ERROR(can_implement(arguments));
  GPUOPT_ASSIGN_OR_RETURN(Plan plan, make_plan(arguments, options_));
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return invalid_argument(
        text("W4A16Gemm needs ", plan.workspace_bytes, " bytes of workspace; none given"));
  }
  arguments_ = arguments;
  config_ = plan.config;
  workspace_ = workspace;
  if (config_.path == W4A16Path::kTensorCore) {
    // Partials and counters start at zero; the kernel leaves them zero after each run.
    unsigned char* base = static_cast<unsigned char*>(workspace);
    GPUOPT_CUDA_TRY(cudaMemsetAsync(base + plan.partial_offset, 0,
                                    plan.workspace_bytes - plan.partial_offset, stream));
  } else {
    if (cublas_ == nullptr) {
      GPUOPT_ASSIGN_OR_RETURN(cublas_, w4a16_detail::create_cublas_handle());
    }
    // The weights never change after upload, so they are dequantised once, here; run() is then
    // cuBLAS alone (plus the act-order permute). This costs a dense N x K copy in the workspace.
    GPUOPT_RETURN_IF_ERROR(w4a16_detail::dequantize_weights(
        *arguments.weights, static_cast<unsigned char*>(workspace) + plan.dense_offset, stream));
  }
  plan_offsets_[0] = plan.partial_offset;
  plan_offsets_[1] = plan.counters_offset;
  plan_offsets_[2] = plan.permuted_offset;
  plan_offsets_[3] = plan.dense_offset;
  return ok_status();
}

void W4A16Gemm::update(const void* x, void* y) {
  arguments_.x = x;
  arguments_.y = y;
}

Status W4A16Gemm::run(StreamHandle stream) {
  const W4A16DeviceWeights& w = *arguments_.weights;
  if (workspace_ == nullptr && config_.path == W4A16Path::kTensorCore) {
    return failed_precondition("W4A16Gemm::run before initialize");
  }
  unsigned char* base = static_cast<unsigned char*>(workspace_);
  const int m = arguments_.m;
  const void* x = arguments_.x;
  if (w.perm != nullptr) {
    void* permuted = base + plan_offsets_[2];
    const int blocks = static_cast<int>(
        std::min<std::size_t>(4096, (static_cast<std::size_t>(m) * w.k + 255) / 256));
    if (w.type == ActivationType::kFloat16) {
      k_permute_columns<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(x),
                                                    static_cast<const int*>(w.perm),
                                                    static_cast<__half*>(permuted), m, w.k);
    } else {
      k_permute_columns<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                    static_cast<const int*>(w.perm),
                                                    static_cast<__nv_bfloat16*>(permuted), m, w.k);
    }
    GPUOPT_CUDA_TRY_LAUNCH();
    x = permuted;
  }
  if (config_.path == W4A16Path::kDequantCublas) {
    // The dense weight was written once by initialize().
    const void* dense = base + plan_offsets_[3];
    return w4a16_detail::run_dequantized(cublas_, w, m, x, dense, arguments_.y, stream);
  }

  if (config_.kernel == W4A16Kernel::kDirect || config_.kernel == W4A16Kernel::kWgmma) {
    const w4a16_detail::KernelPlan plan = w4a16_detail::stored_plan(config_);
    void* kernel_workspace = base + plan_offsets_[0];
    return config_.kernel == W4A16Kernel::kDirect
               ? w4a16_detail::run_direct(plan, w, m, x, arguments_.y, kernel_workspace, stream)
               : w4a16_detail::run_wgmma(plan, w, m, x, arguments_.y, kernel_workspace, stream);
  }

  return run_tiled(config_, w, m, x, arguments_.y, base + plan_offsets_[0], base + plan_offsets_[1],
                   stream);
}

}  // namespace gpuopt::kernels
