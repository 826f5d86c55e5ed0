// `gpuopt bench gemm`: times the W4A16 GEMM and cuBLAS fp16/bf16 on the same shapes in one run,
// weights rotated over enough buffers that L2 cannot serve them; medians of per-launch events.
#include "gpuopt/bench/gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "stream_read.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::bench::gemm {
namespace {

using kernels::ActivationType;

constexpr double kTargetDecode = 3.3;  // M <= 16, Llama-3-70B MLP shapes
constexpr double kTargetM64 = 1.8;
constexpr int kGroupSize = 128;
// Twice the H200's 60 MB L2 (and more than any current GPU's): rotating over this many bytes of
// weights means each launch reads its weights from HBM.
constexpr double kRotationBytes = 192e6;
const std::vector<int> kBatchSizes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
// The largest M a list may ask for: prefill sizes (a 4096-token prompt) beside decode.
constexpr int kMaxBatchSize = 8192;
// Launches per sample of the back-to-back ("sequence") times.
constexpr int kSequence = 10;

// The M values timed: the options' list, or all of kBatchSizes.
[[maybe_unused]] const std::vector<int>& batch_sizes(const GemmBenchOptions& options) {
  return options.batch_sizes.empty() ? kBatchSizes : options.batch_sizes;
}

struct Shape {
  int k, n;
  const char* what;
  bool targeted;  // the done criteria are checked on these
};

std::string shape_key(const Shape& shape) { return fmt::format("k{}_n{}", shape.k, shape.n); }
std::string shape_description(const Shape& shape) {
  return fmt::format("{}: K={} N={} group {} symmetric int4 vs cuBLAS fp16/bf16", shape.what,
                     shape.k, shape.n, kGroupSize);
}

#if GPUOPT_CUDA

using runtime::DeviceBuffer;

// At least 256 bytes, so that a zero-byte workspace is still a valid pointer.
StatusOr<DeviceBuffer> allocate(std::size_t bytes) {
  return DeviceBuffer::allocate(std::max<std::size_t>(bytes, 256));
}

struct Events {
  std::vector<cudaEvent_t> events;
  ~Events() {
    for (cudaEvent_t event : events) GPUOPT_CUDA_TRY_NO_THROW(cudaEventDestroy(event));
  }
};

// One timed arm of a comparison: a launch over its `rotations` copies.
struct Arm {
  std::function<Status(int)> launch;
  int rotations;
};

// The arms' samples interleaved: sample i of arm 0, sample i of arm 1, ..., then sample i + 1, so
// every arm sees the same clocks and heat (timed one block after another, the arm after a long
// compute-bound burst ran throttled: the same cuBLAS call 15 % slower at M=256, H200 2026-11-30,
// docs/PERFORMANCE.md). Each arm is warmed up first.
StatusOr<std::vector<Summary>> time_arms(const std::vector<Arm>& arms, int warmup, int samples,
                                         cudaStream_t stream, int batch = 1) {
  const std::size_t count = arms.size();
  std::vector<int> next(count);
  for (std::size_t a = 0; a < count; ++a) {
    next[a] = std::max(warmup, arms[a].rotations);
    for (int i = 0; i < next[a]; ++i) GPUOPT_RETURN_IF_ERROR(arms[a].launch(i % arms[a].rotations));
  }
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  Events events;
  events.events.resize(2 * count * samples, nullptr);
  for (auto& event : events.events) GPUOPT_CUDA_TRY(cudaEventCreate(&event));
  // Everything is queued before the first sync so launches run back to back.
  for (int i = 0; i < samples; ++i) {
    for (std::size_t a = 0; a < count; ++a) {
      const std::size_t e = 2 * (i * count + a);
      GPUOPT_CUDA_TRY(cudaEventRecord(events.events[e], stream));
      for (int b = 0; b < batch; ++b) {
        GPUOPT_RETURN_IF_ERROR(arms[a].launch(next[a]++ % arms[a].rotations));
      }
      GPUOPT_CUDA_TRY(cudaEventRecord(events.events[e + 1], stream));
    }
  }
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<Summary> summaries;
  for (std::size_t a = 0; a < count; ++a) {
    std::vector<double> times(samples);
    for (int i = 0; i < samples; ++i) {
      const std::size_t e = 2 * (i * count + a);
      float ms = 0;
      GPUOPT_CUDA_TRY(cudaEventElapsedTime(&ms, events.events[e], events.events[e + 1]));
      times[i] = ms * 1000.0 / batch;
    }
    summaries.push_back(summarize(times));
  }
  return summaries;
}

// Microseconds of `samples` launches (after `warmup`, and at least one per rotation: each
// rotation may own a cuBLAS handle whose first call picks its algorithm on the host), launch i
// using rotation i % count. With batch > 1 a sample is `batch` launches back to back between its
// two events, divided by `batch`: the per-GEMM time of a sequence (as in a decode step), where
// launch gaps overlap (nvbench's "batch" time; batch 1 is its "cold" time, without the cache
// flush).
StatusOr<Summary> time_us(const std::function<Status(int)>& launch, int rotations, int warmup,
                          int samples, cudaStream_t stream, int batch = 1) {
  GPUOPT_ASSIGN_OR_RETURN(std::vector<Summary> one,
                          time_arms({Arm{launch, rotations}}, warmup, samples, stream, batch));
  return one.front();
}

// Random weights straight in the kernel layout (repacking 200M nibbles on the host is slow and the
// kernel's speed does not depend on the values). Symmetric, group 128: the common GPTQ export.
kernels::W4A16Weights random_weights(int k, int n, ActivationType type, std::uint64_t seed) {
  kernels::W4A16Weights w;
  w.k = k;
  w.n = n;
  w.group_size = kGroupSize;
  w.type = type;
  w.has_zeros = false;
  std::mt19937_64 random(seed);
  w.tiles.resize(static_cast<std::size_t>(k) * n / 8);
  for (std::size_t i = 0; i < w.tiles.size(); i += 2) {
    const std::uint64_t bits = random();
    w.tiles[i] = static_cast<std::uint32_t>(bits);
    if (i + 1 < w.tiles.size()) w.tiles[i + 1] = static_cast<std::uint32_t>(bits >> 32);
  }
  w.scales.resize(static_cast<std::size_t>(w.groups()) * n);
  for (auto& s : w.scales) {
    const float value = (0.5f + (random() % 1024) / 1024.0f) / 64.0f;
    s = type == ActivationType::kFloat16 ? kernels::float_to_fp16_bits(value)
                                         : kernels::float_to_bf16_bits(value);
  }
  return w;
}

Status fill_random_halves(void* device, std::size_t bytes, std::uint64_t seed,
                          cudaStream_t stream) {
  // A 4 MiB random block repeated: values in [-1, 1), finite as fp16 and as bf16.
  std::vector<std::uint16_t> block(2u << 20);
  std::mt19937_64 random(seed);
  for (auto& h : block) {
    h = kernels::float_to_fp16_bits(static_cast<float>(random() % 2048) / 1024.0f - 1.0f);
  }
  const std::size_t block_bytes = block.size() * 2;
  for (std::size_t offset = 0; offset < bytes; offset += block_bytes) {
    GPUOPT_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(device) + offset, block.data(),
                                    std::min(block_bytes, bytes - offset), cudaMemcpyHostToDevice,
                                    stream));
  }
  GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  return ok_status();
}

struct Stream {
  cudaStream_t stream = nullptr;
  ~Stream() {
    if (stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
  }
};

class ShapeTestcase : public Testcase {
 public:
  ShapeTestcase(Shape shape, const GemmBenchOptions& options)
      : shape_(shape), quick_(options.quick), options_(options) {}
  std::string key() const override { return shape_key(shape_); }
  std::string description() const override { return shape_description(shape_); }
  Status filter(const BenchContext&) const override { return cuda_device_count().status(); }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    const BenchOptions& options = context.options();
    GPUOPT_CUDA_TRY(cudaSetDevice(options.device));
    const int samples = options.samples > 0 ? options.samples : (quick_ ? 20 : 50);
    const int warmup = options.warmup > 0 ? options.warmup : 5;
    const int k = shape_.k;
    const int n = shape_.n;
    const std::vector<int>& sizes = batch_sizes(options_);
    const int max_m = *std::max_element(sizes.begin(), sizes.end());
    kernels::W4A16Options gemm_options = options_.gemm;
    gemm_options.sm_count = 0;
    const TimingOrder order = options_.timing;
    Stream owned;
    GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&owned.stream, cudaStreamNonBlocking));
    cudaStream_t stream = owned.stream;
    // GemmBenchOptions::partition_sms: the partition's stream in place of the whole GPU's (no
    // fallback: without green contexts the testcase fails, saying why).
    std::unique_ptr<runtime::PartitionPlan> partition;
    int partition_sms = 0;
    if (const int wanted = options_.partition_sms; wanted > 0) {
      GPUOPT_ASSIGN_OR_RETURN(const runtime::Device device, runtime::Device::open(options.device));
      GPUOPT_ASSIGN_OR_RETURN(
          partition, runtime::PartitionPlan::create(
                         device, {{"gemm", wanted, runtime::Priority::kNormal, 1}}, false));
      GPUOPT_ASSIGN_OR_RETURN(const runtime::Workload* workload, partition->workload("gemm"));
      stream = static_cast<cudaStream_t>(workload->stream(0));
      partition_sms = workload->sm_count();
      gemm_options.sm_count = options_.planned_sms >= 0 ? options_.planned_sms : partition_sms;
    }

    // Quantized weights, fp16 and bf16 flavours, rotated.
    std::vector<kernels::W4A16DeviceWeights> weights[2];
    const kernels::W4A16Weights host[2] = {random_weights(k, n, ActivationType::kFloat16, 1),
                                           random_weights(k, n, ActivationType::kBFloat16, 1)};
    std::size_t compressed = 0;
    int rotations = 0;
    for (int t = 0; t < 2; ++t) {
      GPUOPT_ASSIGN_OR_RETURN(auto first, kernels::W4A16DeviceWeights::upload(host[t], stream));
      compressed = first.compressed_bytes();
      rotations = std::clamp(static_cast<int>(std::ceil(kRotationBytes / compressed)), 2, 32);
      weights[t].push_back(std::move(first));
      for (int r = 1; r < rotations; ++r) {
        GPUOPT_ASSIGN_OR_RETURN(auto copy, kernels::W4A16DeviceWeights::upload(host[t], stream));
        weights[t].push_back(std::move(copy));
      }
    }
    // Dense [N][K] weights for cuBLAS, rotated too (shared by fp16 and bf16: only bits differ).
    const std::size_t dense_bytes = static_cast<std::size_t>(n) * k * 2;
    const int dense_rotations =
        std::clamp(static_cast<int>(std::ceil(kRotationBytes / dense_bytes)), 2, 32);
    std::vector<DeviceBuffer> dense(dense_rotations);
    for (int r = 0; r < dense_rotations; ++r) {
      GPUOPT_ASSIGN_OR_RETURN(dense[r], allocate(dense_bytes));
      GPUOPT_RETURN_IF_ERROR(fill_random_halves(dense[r].data(), dense_bytes, 7 + r, stream));
    }
    GPUOPT_ASSIGN_OR_RETURN(const DeviceBuffer x,
                            allocate(static_cast<std::size_t>(max_m) * k * 2));
    GPUOPT_ASSIGN_OR_RETURN(const DeviceBuffer y,
                            allocate(static_cast<std::size_t>(max_m) * n * 2));
    GPUOPT_RETURN_IF_ERROR(
        fill_random_halves(x.data(), static_cast<std::size_t>(max_m) * k * 2, 3, stream));

    // The memory anchor: a plain streaming read of the int4 tiles (no math), rotated the same way;
    // scaled to all the compressed bytes, it is the time a kernel that only moved them would take.
    GPUOPT_ASSIGN_OR_RETURN(const DeviceBuffer sink, allocate(sizeof(unsigned)));
    const std::size_t tile_bytes = static_cast<std::size_t>(k) * n / 2;
    // warps_per_sm 0: full occupancy (the anchor); 16: the direct kernel's occupancy, what a kernel
    // whose registers allow no more warps could read (H200: 32.0 against 30.1 us on 8192 x
    // 28672; docs/PERFORMANCE.md).
    const auto time_read = [&](int warps_per_sm) {
      return time_us(
          [&](int r) {
            return launch_stream_read(weights[0][r].tiles, tile_bytes, sink.data_as<unsigned>(),
                                      stream, warps_per_sm);
          },
          rotations, warmup, samples, stream);
    };
    constexpr int kDirectWarpsPerSm = 16;
    GPUOPT_ASSIGN_OR_RETURN(const Summary read, time_read(0));
    const double read_us = read.median;
    const double read_equivalent_us = read_us * static_cast<double>(compressed) / tile_bytes;
    GPUOPT_ASSIGN_OR_RETURN(const Summary read16, time_read(kDirectWarpsPerSm));

    kernels::CublasGemm cublas;
    TestcaseResult result;
    result.table.columns = {"M",
                            "gpuopt fp16 us",
                            "cuBLAS fp16 us",
                            "speedup",
                            "gpuopt bf16 us",
                            "cuBLAS bf16 us",
                            "speedup bf16",
                            "GB/s",
                            "of read",
                            "int4 kernel us",
                            "dequant+cuBLAS us",
                            "seq us",
                            "seq cuBLAS us",
                            "seq speedup",
                            "config"};
    nlohmann::json rows = nlohmann::json::array();
    double min_speedup = 1e30;
    int step = 0;
    for (int m : sizes) {
      context.progress(static_cast<double>(step++) / sizes.size());
      nlohmann::json row;
      row["m"] = m;
      double gpuopt_us[2] = {0, 0}, cublas_us[2] = {0, 0};
      double gpuopt_spread = 0, cublas_spread = 0;  // (p90 - p10) / median, fp16
      std::string config;
      // One W4A16Gemm per weight copy, each with its own workspace (the cuBLAS path keeps its
      // dense copy there), launched over the rotation.
      struct Gemms {
        std::vector<std::unique_ptr<kernels::W4A16Gemm>> gemms;
        std::vector<DeviceBuffer> workspaces;
      };
      auto make_gemms = [&](const kernels::W4A16Options& here, int t, Gemms& out) -> Status {
        out.workspaces = std::vector<DeviceBuffer>(rotations);
        for (int r = 0; r < rotations; ++r) {
          auto gemm = std::make_unique<kernels::W4A16Gemm>(here);
          kernels::W4A16Gemm::Arguments arguments{m, x.data(), y.data(), &weights[t][r]};
          GPUOPT_ASSIGN_OR_RETURN(std::size_t bytes, gemm->workspace_size(arguments));
          GPUOPT_ASSIGN_OR_RETURN(out.workspaces[r], allocate(bytes));
          GPUOPT_RETURN_IF_ERROR(gemm->initialize(arguments, out.workspaces[r].data(), stream));
          out.gemms.push_back(std::move(gemm));
        }
        return ok_status();
      };
      auto ours_arm = [&](const Gemms& g) {
        return Arm{[&g, stream](int r) { return g.gemms[r]->run(stream); }, rotations};
      };
      auto reference_arm = [&](int t) {
        const ActivationType type = t == 0 ? ActivationType::kFloat16 : ActivationType::kBFloat16;
        return Arm{[&, type](int r) {
                     return cublas.run(type, m, n, k, x.data(), dense[r].data(), y.data(), stream);
                   },
                   dense_rotations};
      };
      // {reference, gpuopt} per launch (batch 1) or back to back (kSequence), in the chosen order.
      auto time_pair = [&](const Arm& reference, const Arm& ours,
                           int batch) -> StatusOr<std::pair<Summary, Summary>> {
        if (order == TimingOrder::kInterleaved) {
          GPUOPT_ASSIGN_OR_RETURN(auto both,
                                  time_arms({reference, ours}, warmup, samples, stream, batch));
          return std::pair{both[0], both[1]};
        }
        const bool ours_first = order == TimingOrder::kGpuoptFirst;
        GPUOPT_ASSIGN_OR_RETURN(
            const Summary first,
            time_us((ours_first ? ours : reference).launch,
                    (ours_first ? ours : reference).rotations, warmup, samples, stream, batch));
        GPUOPT_ASSIGN_OR_RETURN(
            const Summary second,
            time_us((ours_first ? reference : ours).launch,
                    (ours_first ? reference : ours).rotations, warmup, samples, stream, batch));
        return ours_first ? std::pair{second, first} : std::pair{first, second};
      };
      Summary gpuopt_sequence, cublas_sequence;  // fp16, back to back
      bool default_is_cublas = false;
      for (int t = 0; t < 2; ++t) {
        Gemms ours;
        GPUOPT_RETURN_IF_ERROR(make_gemms(gemm_options, t, ours));
        const Arm reference = reference_arm(t);
        const Arm gpuopt = ours_arm(ours);
        GPUOPT_ASSIGN_OR_RETURN(const auto times, time_pair(reference, gpuopt, 1));
        cublas_us[t] = times.first.median;
        gpuopt_us[t] = times.second.median;
        if (t == 0) {
          config = ours.gemms[0]->config().describe();
          default_is_cublas = ours.gemms[0]->config().path == kernels::W4A16Path::kDequantCublas;
          cublas_spread = times.first.relative_spread();
          gpuopt_spread = times.second.relative_spread();
          GPUOPT_ASSIGN_OR_RETURN(const auto sequences, time_pair(reference, gpuopt, kSequence));
          cublas_sequence = sequences.first;
          gpuopt_sequence = sequences.second;
        }
      }
      // The path not taken, fp16, from M = 16 (where the two come close): the int4 kernel when
      // the default handed over to cuBLAS, else the dequantise + cuBLAS path.
      std::optional<double> kernel_us, fallback_us;
      (default_is_cublas ? fallback_us : kernel_us) = gpuopt_us[0];
      if (m >= 16 && !gemm_options.deterministic &&
          gemm_options.force_path == kernels::W4A16ForcePath::kAuto) {
        kernels::W4A16Options other = gemm_options;
        if (default_is_cublas) {
          other.fallback_min_m = 0;
        } else {
          other.force_path = kernels::W4A16ForcePath::kDequantCublas;
        }
        Gemms path;
        GPUOPT_RETURN_IF_ERROR(make_gemms(other, 0, path));
        const Arm arm = ours_arm(path);
        GPUOPT_ASSIGN_OR_RETURN(const Summary theirs,
                                time_us(arm.launch, arm.rotations, warmup, samples, stream));
        (default_is_cublas ? kernel_us : fallback_us) = theirs.median;
      }
      const double moved =
          static_cast<double>(compressed) + 2.0 * m * k + 2.0 * m * n;  // bytes read + written
      const double bandwidth_gbps = moved / (gpuopt_us[0] * 1e-6) / 1e9;
      const double speedup = cublas_us[0] / gpuopt_us[0];
      const double speedup_bf16 = cublas_us[1] / gpuopt_us[1];
      min_speedup = std::min(min_speedup, speedup);
      row["gpuopt_fp16_us"] = gpuopt_us[0];
      row["gpuopt_bf16_us"] = gpuopt_us[1];
      row["cublas_fp16_us"] = cublas_us[0];
      row["gpuopt_fp16_spread"] = gpuopt_spread;
      row["cublas_fp16_spread"] = cublas_spread;
      row["cublas_bf16_us"] = cublas_us[1];
      // Back to back (kSequence launches per sample), fp16.
      const double speedup_sequence = cublas_sequence.median / gpuopt_sequence.median;
      row["gpuopt_fp16_sequence_us"] = gpuopt_sequence.median;
      row["gpuopt_fp16_sequence_spread"] = gpuopt_sequence.relative_spread();
      row["cublas_fp16_sequence_us"] = cublas_sequence.median;
      row["cublas_fp16_sequence_spread"] = cublas_sequence.relative_spread();
      row["speedup_sequence_vs_cublas_fp16"] = speedup_sequence;
      row["speedup_vs_cublas_fp16"] = speedup;
      row["speedup_bf16_vs_cublas_bf16"] = speedup_bf16;
      row["bandwidth_gbps"] = bandwidth_gbps;
      row["fraction_of_stream_read"] = read_equivalent_us / gpuopt_us[0];
      row["dequant_cublas_us"] = fallback_us ? nlohmann::json(*fallback_us) : nlohmann::json();
      row["int4_kernel_us"] = kernel_us ? nlohmann::json(*kernel_us) : nlohmann::json();
      row["path"] = default_is_cublas ? "dequant+cublas" : "int4";
      row["config"] = config;
      rows.push_back(row);
      result.table.rows.push_back(
          {std::to_string(m), fmt::format("{:.1f}", gpuopt_us[0]),
           fmt::format("{:.1f}", cublas_us[0]), fmt::format("{:.2f}x", speedup),
           fmt::format("{:.1f}", gpuopt_us[1]), fmt::format("{:.1f}", cublas_us[1]),
           fmt::format("{:.2f}x", speedup_bf16), fmt::format("{:.0f}", bandwidth_gbps),
           fmt::format("{:.0f}%", 100.0 * read_equivalent_us / gpuopt_us[0]),
           kernel_us ? fmt::format("{:.1f}", *kernel_us) : "-",
           fallback_us ? fmt::format("{:.1f}", *fallback_us) : "-",
           fmt::format("{:.1f}", gpuopt_sequence.median),
           fmt::format("{:.1f}", cublas_sequence.median), fmt::format("{:.2f}x", speedup_sequence),
           config});
    }
    context.progress(1.0);
    result.data["k"] = k;
    result.data["n"] = n;
    result.data["group_size"] = kGroupSize;
    result.data["compressed_weight_bytes"] = compressed;
    result.data["weight_rotations"] = rotations;
    result.data["cublas_rotations"] = dense_rotations;
    result.data["samples"] = samples;
    result.data["stream_read_us"] = read_us;
    result.data["stream_read_spread"] = read.relative_spread();
    result.data["stream_read_gbps"] = tile_bytes / (read_us * 1e-6) / 1e9;
    result.data["stream_read_16_warps_us"] = read16.median;
    result.data["stream_read_16_warps_spread"] = read16.relative_spread();
    result.data["rows"] = rows;
    result.data["min_speedup_vs_cublas_fp16"] = min_speedup;
    if (partition != nullptr) {
      result.data["partition_sms"] = partition_sms;
      result.data["planned_sms"] = gemm_options.sm_count;
      result.notes.push_back(
          fmt::format("on a green-context partition of {} SMs ({}); gpuopt planned for {}",
                      partition_sms, partition->describe(),
                      gemm_options.sm_count > 0 ? fmt::format("{} SMs", gemm_options.sm_count)
                                                : std::string("the whole GPU")));
    }
    result.data["targeted"] = shape_.targeted;
    if (shape_.targeted) {
      bool met = min_speedup >= 1.0;
      for (const auto& row : rows) {
        const int m = row["m"].get<int>();
        const double s = row["speedup_vs_cublas_fp16"].get<double>();
        if ((m <= 16 && s < kTargetDecode) || (m == 64 && s < kTargetM64)) met = false;
      }
      result.data["targets_met"] = met;
      const std::string targets = fmt::format(
          "M<=16 >= {}x, M=64 >= {}x, no M below 1x cuBLAS fp16", kTargetDecode, kTargetM64);
      result.notes.push_back(fmt::format("targets ({}): {}", targets, met ? "met" : "NOT met"));
      // gpuopt's own goal for the kernel, not a property of the machine: never above info.
      result.checks.push_back(bench::development_target("speedup_targets", met, targets));
    }
    result.notes.push_back(fmt::format(
        "memory anchor: a plain streaming read of the {:.1f} MB of int4 tiles takes {:.1f} us "
        "({:.0f} GB/s), {:.1f} us with {} warps per SM (the direct kernel's occupancy); 'of read' "
        "= the full read's time scaled to the compressed bytes / gpuopt fp16",
        tile_bytes / 1e6, read_us, tile_bytes / (read_us * 1e-6) / 1e9, read16.median,
        kDirectWarpsPerSm));
    result.notes.push_back(fmt::format(
        "GB/s counts the compressed bytes moved (int4 weights, fp16 scales, x, y); medians of {} "
        "launches; weights rotated over {} copies, cuBLAS over {}; 'seq' = fp16 per GEMM of {} "
        "launches back to back between two events (medians of {} such sequences); cuBLAS and "
        "gpuopt timed {}",
        samples, rotations, dense_rotations, kSequence, samples,
        order == TimingOrder::kInterleaved      ? "sample by sample, interleaved"
        : order == TimingOrder::kReferenceFirst ? "one after the other, cuBLAS first"
                                                : "one after the other, gpuopt first"));
    return result;
  }

 private:
  Shape shape_;
  bool quick_;
  GemmBenchOptions options_;
};

#else

class NotBuiltShape : public Testcase {
 public:
  explicit NotBuiltShape(Shape shape) : shape_(shape) {}
  std::string key() const override { return shape_key(shape_); }
  std::string description() const override { return shape_description(shape_); }
  Status filter(const BenchContext&) const override {
    return unimplemented("gpuopt was built without CUDA");
  }
  StatusOr<TestcaseResult> run(BenchContext&) override {
    return unimplemented("gpuopt was built without CUDA");
  }

 private:
  Shape shape_;
};

#endif  // GPUOPT_CUDA

}  // namespace

std::string_view timing_order_name(TimingOrder order) {
  switch (order) {
    case TimingOrder::kReferenceFirst:
      return "reference-first";
    case TimingOrder::kGpuoptFirst:
      return "gpuopt-first";
    case TimingOrder::kInterleaved:
      break;
  }
  return "interleaved";
}

StatusOr<TimingOrder> parse_timing_order(std::string_view name) {
  for (const TimingOrder order :
       {TimingOrder::kInterleaved, TimingOrder::kReferenceFirst, TimingOrder::kGpuoptFirst}) {
    if (timing_order_name(order) == name) return order;
  }
  return invalid_argument(fmt::format(
      "unknown timing order '{}' (one of: interleaved, reference-first, gpuopt-first)", name));
}

const std::vector<int>& default_batch_sizes() { return kBatchSizes; }

Status check_options(const GemmBenchOptions& options) {
  for (const int m : options.batch_sizes) {
    if (m < 1 || m > kMaxBatchSize) {
      return invalid_argument(fmt::format("batch size M={} is outside 1..{}", m, kMaxBatchSize));
    }
  }
  if (options.partition_sms < 0) {
    return invalid_argument(fmt::format("partition SMs {}: must be 0 (the whole GPU) or positive",
                                        options.partition_sms));
  }
  if (options.planned_sms < -1) {
    return invalid_argument(
        fmt::format("planned SMs {}: must be 0 (the whole GPU) or positive", options.planned_sms));
  }
  if (options.planned_sms >= 0 && options.partition_sms == 0) {
    return invalid_argument("planned SMs are given without a partition (partition_sms)");
  }
  return kernels::check_w4a16_options(options.gemm);
}

Suite make_suite(const GemmBenchOptions& options) {
  Suite suite("gemm");
  std::vector<Shape> shapes = {
      {8192, 28672, "Llama-3-70B gate/up", true},
      {28672, 8192, "Llama-3-70B down", true},
      {4096, 14336, "Llama-3-8B gate/up", false},
      {4096, 4096, "Llama-3-8B q/o", false},
  };
  if (!options.quick) {
    shapes.push_back({14336, 4096, "Llama-3-8B down", false});
    shapes.push_back({8192, 8192, "Llama-3-70B q/o", false});
    shapes.push_back({3584, 18944, "Qwen2-7B gate/up", false});
    shapes.push_back({18944, 3584, "Qwen2-7B down", false});
  }
#if GPUOPT_CUDA
  for (const Shape& shape : shapes) suite.add(std::make_unique<ShapeTestcase>(shape, options));
#else
  // A build without CUDA lists the same testcases (for --list and --only) and waives them.
  for (const Shape& shape : shapes) suite.add(std::make_unique<NotBuiltShape>(shape));
#endif
  return suite;
}

// A failed testcase is an error (2); missed development targets are info and exit 0, as in the
// audit (bench::verdict_exit_code).
int exit_code_for(const std::vector<TestcaseResult>& results) {
  return bench::verdict_exit_code(results);
}

}  // namespace gpuopt::bench::gemm
