// Same-run anchor: times the IST-DASLab Marlin W4A16 kernel (fp16 x int4, group 128) against
// cuBLAS fp16 in one process, with the method of `gpuopt bench gemm` (src/bench/gemm.cpp): one
// pair of CUDA events per launch, every sample queued back to back before one sync, weights
// rotated over ceil(192e6 / weight bytes) buffers (2..32) so the 60 MB L2 cannot serve them,
// warm-up of max(warmup, rotations) launches, median/min/max of 20 samples.
//
// No Marlin code is kept in this repository: the kernel file comes from a Marlin checkout at build
// time (scripts/anchors/build-marlin-anchor.sh), named by -DMARLIN_KERNEL_CU="\"/path/...cu\"".
// It needs CUDA headers only and provides
//   int marlin_cuda(A, B, C, s, m, n, k, workspace, groupsize, dev, stream, thread_k, thread_n,
//                   sms, max_par)
// with A [M][K] fp16, B int4 in Marlin's tile layout (K*N/2 bytes), C [M][N] fp16, s [K/group][N]
// fp16 (symmetric: w = (q - 8) * s), workspace N/128*max_par ints, zero before the first call
// (the kernel leaves its locks at zero). Returns 0, 1 (shape not divisible by the tile), 2 (no
// kernel instance for the tile / group size).
//
// Output, one line per (shape, M):
//   marlin K N M median_us min_us max_us cublas_median_us speedup marlin_spread cublas_spread
// speedup = cuBLAS fp16 median / Marlin median; spread = (p90 - p10) / median. Lines starting
// with '#' are context. Exit codes: 0 ok, 1 a CUDA / cuBLAS / Marlin / check failure, 2 no
// usable GPU, 3 bad arguments.
#ifndef MARLIN_KERNEL_CU
#error "compile with -DMARLIN_KERNEL_CU=\"/path/to/marlin/marlin_cuda_kernel.cu\""
#endif
#include MARLIN_KERNEL_CU

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace anchor {

constexpr double kRotationBytes = 192e6;  // as src/bench/gemm.cpp: twice the H200's L2
constexpr int kGroup = 128;
constexpr int kMaxPar = 16;  // Marlin's default; the workspace is sized N / 128 * kMaxPar

// A failed CUDA/cuBLAS/Marlin call: carried up to main(), which prints it and returns 1 (this
// driver's functions and launch lambdas have no error channel of their own).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define ANCHOR_CUDA(call)                                                                       \
  do {                                                                                          \
    const cudaError_t anchor_status_ = (call);                                                  \
    if (anchor_status_ != cudaSuccess) {                                                        \
      throw Failure(std::string(#call) + " failed at " + __FILE__ + ":" +                       \
                    std::to_string(__LINE__) + ": " + cudaGetErrorName(anchor_status_) + " (" + \
                    cudaGetErrorString(anchor_status_) + ")");                                  \
    }                                                                                           \
  } while (0)

#define ANCHOR_CUBLAS(call)                                                                        \
  do {                                                                                             \
    const cublasStatus_t anchor_status_ = (call);                                                  \
    if (anchor_status_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      throw Failure(std::string(#call) + " failed at " + __FILE__ + ":" +                          \
                    std::to_string(__LINE__) + ": " + cublasGetStatusName(anchor_status_) + " (" + \
                    cublasGetStatusString(anchor_status_) + ")");                                  \
    }                                                                                              \
  } while (0)

struct Options {
  std::vector<int> ms = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<std::pair<int, int>> shapes = {
      {8192, 28672}, {28672, 8192}, {4096, 14336}, {4096, 4096}};  // (K, N)
  int samples = 20;
  int warmup = 5;
  int device = 0;
  double hold_us = 0;  // >0: a spin kernel ahead of the samples so they queue before running
  bool check = true;
};

struct Summary {
  double median = 0, min = 0, max = 0, p10 = 0, p90 = 0;
  double spread() const { return median != 0 ? (p90 - p10) / median : 0; }
};

// Linear interpolation between closest ranks (numpy's default), as src/bench/testcase.cpp.
double quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto lower = static_cast<std::size_t>(std::floor(position));
  const auto upper = static_cast<std::size_t>(std::ceil(position));
  const double weight = position - static_cast<double>(lower);
  return sorted[lower] * (1 - weight) + sorted[upper] * weight;
}

Summary summarize(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  Summary s;
  s.min = times.front();
  s.max = times.back();
  s.median = quantile(times, 0.5);
  s.p10 = quantile(times, 0.1);
  s.p90 = quantile(times, 0.9);
  return s;
}

// Busy-waits `ns` nanoseconds of GPU time (only with --hold-us).
__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// time_us of src/bench/gemm.cpp: warm-up of max(warmup, rotations) launches, sync, then
// `samples` launches each between two events, all queued before one sync; launch i uses rotation
// i % rotations.
template <typename Launch>
Summary time_us(const Launch& launch, int rotations, const Options& options, cudaStream_t stream) {
  const int warmup = std::max(options.warmup, rotations);
  for (int i = 0; i < warmup; ++i) launch(i % rotations);
  ANCHOR_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(2 * options.samples);
  for (auto& event : events) ANCHOR_CUDA(cudaEventCreate(&event));
  cudaEvent_t held = nullptr;
  if (options.hold_us > 0) {
    ANCHOR_CUDA(cudaEventCreate(&held));
    hold_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(options.hold_us * 1e3));
    ANCHOR_CUDA(cudaGetLastError());
    ANCHOR_CUDA(cudaEventRecord(held, stream));
  }
  for (int i = 0; i < options.samples; ++i) {
    ANCHOR_CUDA(cudaEventRecord(events[2 * i], stream));
    launch((warmup + i) % rotations);
    ANCHOR_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  if (held != nullptr) {
    const cudaError_t state = cudaEventQuery(held);
    if (state == cudaSuccess) {
      std::printf("# warning: --hold-us %.0f ended before all samples were queued\n",
                  options.hold_us);
    } else if (state != cudaErrorNotReady) {
      ANCHOR_CUDA(state);
    }
  }
  ANCHOR_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> times(options.samples);
  for (int i = 0; i < options.samples; ++i) {
    float ms = 0;
    ANCHOR_CUDA(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    times[i] = ms * 1000.0;
  }
  for (auto& event : events) ANCHOR_CUDA(cudaEventDestroy(event));
  if (held != nullptr) ANCHOR_CUDA(cudaEventDestroy(held));
  return summarize(std::move(times));
}

std::uint16_t half_bits(float value) {
  const __half h = __float2half_rn(value);
  std::uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

float half_value(std::uint16_t bits) {
  __half h;
  std::memcpy(&h, &bits, sizeof bits);
  return __half2float(h);
}

// A 4 MiB random block repeated over the buffer (as fill_random_halves in gemm.cpp).
void fill_repeated(void* device, std::size_t bytes, const std::vector<std::uint8_t>& block,
                   cudaStream_t stream) {
  for (std::size_t offset = 0; offset < bytes; offset += block.size()) {
    ANCHOR_CUDA(cudaMemcpyAsync(static_cast<char*>(device) + offset, block.data(),
                                std::min(block.size(), bytes - offset), cudaMemcpyHostToDevice,
                                stream));
  }
  ANCHOR_CUDA(cudaStreamSynchronize(stream));
}

std::vector<std::uint8_t> random_halves_block(std::uint64_t seed) {  // values in [-1, 1)
  std::vector<std::uint8_t> block(4u << 20);
  std::mt19937_64 random(seed);
  for (std::size_t i = 0; i < block.size(); i += 2) {
    const std::uint16_t h = half_bits(static_cast<float>(random() % 2048) / 1024.0f - 1.0f);
    std::memcpy(&block[i], &h, 2);
  }
  return block;
}

std::vector<std::uint8_t> random_bytes_block(std::uint64_t seed) {  // any int4 nibbles
  std::vector<std::uint8_t> block(4u << 20);
  std::mt19937_64 random(seed);
  for (std::size_t i = 0; i < block.size(); i += 8) {
    const std::uint64_t bits = random();
    std::memcpy(&block[i], &bits, 8);
  }
  return block;
}

void* device_alloc(std::size_t bytes) {
  void* pointer = nullptr;
  ANCHOR_CUDA(cudaMalloc(&pointer, std::max<std::size_t>(bytes, 256)));
  return pointer;
}

const char* marlin_error(int code) {
  switch (code) {
    case 1:
      return "problem shape not divisible by Marlin's thread tile";
    case 2:
      return "no Marlin kernel instance for this tile / group size";
    default:
      return "unknown Marlin error";
  }
}

bool parse_ints(const char* text, std::vector<int>& out) {
  out.clear();
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long value = std::strtol(p, &end, 10);
    if (end == p || value < 1 || value > (1 << 20)) return false;
    out.push_back(static_cast<int>(value));
    if (*end == '\0') break;
    if (*end != ',') return false;
    p = end + 1;
  }
  return !out.empty();
}

void usage() {
  std::fprintf(stderr,
               "usage: marlin_bench [--m 1,2,...] [--shape K,N]... [--samples 20] [--warmup 5]\n"
               "                    [--device 0] [--hold-us 0] [--no-check]\n");
}

int run(int argc, char** argv) {
  Options options;
  bool shapes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    std::vector<int> ints;
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    } else if (arg == "--no-check") {
      options.check = false;
    } else if (value == nullptr) {
      usage();
      return 3;
    } else if (arg == "--m" && parse_ints(value, ints)) {
      options.ms = ints;
      ++i;
    } else if (arg == "--shape" && parse_ints(value, ints) && ints.size() == 2) {
      if (!shapes_given) options.shapes.clear();
      shapes_given = true;
      options.shapes.emplace_back(ints[0], ints[1]);
      ++i;
    } else if (arg == "--samples" && parse_ints(value, ints) && ints.size() == 1) {
      options.samples = ints[0];
      ++i;
    } else if (arg == "--warmup" && parse_ints(value, ints) && ints.size() == 1) {
      options.warmup = ints[0];
      ++i;
    } else if (arg == "--device") {
      options.device = std::atoi(value);
      ++i;
    } else if (arg == "--hold-us") {
      options.hold_us = std::atof(value);
      ++i;
    } else {
      std::fprintf(stderr, "marlin_bench: bad argument '%s'\n", arg.c_str());
      usage();
      return 3;
    }
  }

  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "marlin_bench: no usable CUDA GPU (%s: %s); nothing was timed\n",
                 found != cudaSuccess ? cudaGetErrorName(found) : "cudaSuccess",
                 found != cudaSuccess ? cudaGetErrorString(found) : "0 devices");
    return 2;
  }
  if (options.device < 0 || options.device >= devices) {
    std::fprintf(stderr, "marlin_bench: device %d not present (%d found)\n", options.device,
                 devices);
    return 2;
  }
  ANCHOR_CUDA(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  ANCHOR_CUDA(cudaGetDeviceProperties(&prop, options.device));
  if (prop.major < 8) {
    std::fprintf(stderr, "marlin_bench: %s is sm_%d%d; Marlin needs sm_80 or newer\n", prop.name,
                 prop.major, prop.minor);
    return 2;
  }
  int sms = 0;
  ANCHOR_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device));
  int runtime = 0, driver = 0;
  ANCHOR_CUDA(cudaRuntimeGetVersion(&runtime));
  ANCHOR_CUDA(cudaDriverGetVersion(&driver));
  std::printf("# device %d: %s (sm_%d%d, %d SMs, L2 %.0f MB), runtime %d, driver %d\n",
              options.device, prop.name, prop.major, prop.minor, sms, prop.l2CacheSize / 1e6,
              runtime, driver);
  std::printf(
      "# method: events per launch, samples queued back to back, %d samples, warm-up "
      "max(%d, rotations), rotation over ceil(%.0f MB / bytes) copies (2..32), "
      "hold %.0f us; group %d, thread tiles auto, max_par %d\n",
      options.samples, options.warmup, kRotationBytes / 1e6, options.hold_us, kGroup, kMaxPar);
  std::printf(
      "# columns: marlin K N M median_us min_us max_us cublas_median_us speedup "
      "marlin_spread cublas_spread\n");
  std::fflush(stdout);

  cudaStream_t stream = nullptr;
  ANCHOR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas = nullptr;
  ANCHOR_CUBLAS(cublasCreate(&cublas));
  const int max_m = *std::max_element(options.ms.begin(), options.ms.end());
  int failures = 0;

  for (const auto& shape : options.shapes) {
    const int k = shape.first, n = shape.second;
    if (k % kGroup != 0) {
      std::printf("# skip K=%d N=%d: K not a multiple of the group size %d\n", k, n, kGroup);
      ++failures;
      continue;
    }
    const std::size_t b_bytes = static_cast<std::size_t>(k) * n / 2;
    const std::size_t s_bytes = static_cast<std::size_t>(k / kGroup) * n * 2;
    const std::size_t compressed = b_bytes + s_bytes;
    const int rotations =
        std::clamp(static_cast<int>(std::ceil(kRotationBytes / compressed)), 2, 32);
    const std::size_t dense_bytes = static_cast<std::size_t>(n) * k * 2;
    const int dense_rotations =
        std::clamp(static_cast<int>(std::ceil(kRotationBytes / dense_bytes)), 2, 32);
    std::printf("# shape K=%d N=%d: Marlin %.1f MB x %d rotations, cuBLAS %.1f MB x %d\n", k, n,
                compressed / 1e6, rotations, dense_bytes / 1e6, dense_rotations);
    std::fflush(stdout);

    // Per rotation: Marlin's packed weights, scales (all 0.01: outputs stay finite) and a zeroed
    // workspace of N / 128 * max_par ints.
    const std::vector<std::uint8_t> weight_block = random_bytes_block(11);
    std::vector<std::uint8_t> scale_block(4u << 20);
    const std::uint16_t scale_bits = half_bits(0.01f);
    for (std::size_t i = 0; i < scale_block.size(); i += 2)
      std::memcpy(&scale_block[i], &scale_bits, 2);
    const std::size_t workspace_bytes = static_cast<std::size_t>(n / 128) * kMaxPar * sizeof(int);
    std::vector<void*> b(rotations), s(rotations), workspace(rotations);
    for (int r = 0; r < rotations; ++r) {
      b[r] = device_alloc(b_bytes);
      s[r] = device_alloc(s_bytes);
      workspace[r] = device_alloc(workspace_bytes);
      fill_repeated(s[r], s_bytes, scale_block, stream);
      ANCHOR_CUDA(cudaMemsetAsync(workspace[r], 0, workspace_bytes, stream));
    }
    std::vector<void*> dense(dense_rotations);
    for (int r = 0; r < dense_rotations; ++r) {
      dense[r] = device_alloc(dense_bytes);
      fill_repeated(dense[r], dense_bytes, random_halves_block(7 + r), stream);
    }
    void* x = device_alloc(static_cast<std::size_t>(max_m) * k * 2);
    void* y = device_alloc(static_cast<std::size_t>(max_m) * n * 2);
    fill_repeated(x, static_cast<std::size_t>(max_m) * k * 2, random_halves_block(3), stream);

    auto marlin = [&](int m, int r) {
      const int code = marlin_cuda(x, b[r], y, s[r], m, n, k, workspace[r], kGroup, options.device,
                                   stream, -1, -1, sms, kMaxPar);
      if (code != 0) {
        throw Failure("marlin_cuda(M=" + std::to_string(m) + ", N=" + std::to_string(n) +
                      ", K=" + std::to_string(k) + ") returned " + std::to_string(code) + ": " +
                      marlin_error(code));
      }
      ANCHOR_CUDA(cudaGetLastError());
    };
    // As kernels::CublasGemm::run: y[M][N] = x[M][K] . w^T, w [N][K] row-major, i.e. column-major
    // y^T (N x M) = op_T(w) (N x K) * x^T (K x M); fp16 in/out, fp32 compute, default algorithm.
    auto cublas_fp16 = [&](int m, int r) {
      const float alpha = 1.0f, beta = 0.0f;
      ANCHOR_CUBLAS(cublasSetStream(cublas, stream));
      ANCHOR_CUBLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dense[r],
                                 CUDA_R_16F, k, x, CUDA_R_16F, k, &beta, y, CUDA_R_16F, n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };

    // Invocation check, independent of Marlin's nibble permutation: every nibble 9 and every
    // scale 0.01 make each weight (9 - 8) * 0.01, so y[m][j] = 0.01 * sum_k x[m][k] for all j.
    std::vector<std::uint16_t> host_x;
    if (options.check) {
      host_x.resize(static_cast<std::size_t>(max_m) * k);
      ANCHOR_CUDA(cudaMemcpy(host_x.data(), x, host_x.size() * 2, cudaMemcpyDeviceToHost));
      ANCHOR_CUDA(cudaMemsetAsync(b[0], 0x99, b_bytes, stream));
    }
    bool shape_ok = true;
    for (int m : options.ms) {
      if (!options.check) break;
      marlin(m, 0);
      std::vector<std::uint16_t> out(static_cast<std::size_t>(m) * n);
      ANCHOR_CUDA(cudaMemcpyAsync(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost, stream));
      ANCHOR_CUDA(cudaStreamSynchronize(stream));
      double worst = 0;
      for (int row = 0; row < m; ++row) {
        double sum = 0, magnitude = 0;
        for (int c = 0; c < k; ++c) {
          const double v = half_value(host_x[static_cast<std::size_t>(row) * k + c]);
          sum += v;
          magnitude += std::fabs(v);
        }
        const double expected = 0.01 * sum;
        const double scale = 0.01 * magnitude / std::sqrt(static_cast<double>(k)) + 1e-3;
        for (int j = 0; j < n; ++j) {
          const double got = half_value(out[static_cast<std::size_t>(row) * n + j]);
          const double error = std::isfinite(got) ? std::fabs(got - expected) / scale : INFINITY;
          worst = std::max(worst, error);
        }
      }
      // fp16 output of a value ~0.01 * sqrt(K): rounding is far below 0.05 of that scale.
      if (!(worst < 0.05)) {
        std::printf("# CHECK FAILED K=%d N=%d M=%d: max error %.3g of 0.01*|x|/sqrt(K)\n", k, n, m,
                    worst);
        shape_ok = false;
      }
    }
    if (options.check) {
      std::printf("# check K=%d N=%d (all M): %s\n", k, n, shape_ok ? "ok" : "FAILED");
      if (!shape_ok) ++failures;
    }
    for (int r = 0; r < rotations; ++r) fill_repeated(b[r], b_bytes, weight_block, stream);

    for (int m : options.ms) {
      const Summary ours = time_us([&](int r) { marlin(m, r); }, rotations, options, stream);
      const Summary theirs =
          time_us([&](int r) { cublas_fp16(m, r); }, dense_rotations, options, stream);
      std::vector<std::uint16_t> out(static_cast<std::size_t>(m) * n);
      marlin(m, 0);
      ANCHOR_CUDA(cudaMemcpyAsync(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost, stream));
      ANCHOR_CUDA(cudaStreamSynchronize(stream));
      const bool finite = std::all_of(out.begin(), out.end(),
                                      [](std::uint16_t h) { return std::isfinite(half_value(h)); });
      std::printf("marlin %d %d %d %.2f %.2f %.2f %.2f %.3f %.3f %.3f%s\n", k, n, m, ours.median,
                  ours.min, ours.max, theirs.median, theirs.median / ours.median, ours.spread(),
                  theirs.spread(), finite ? "" : " NONFINITE");
      std::fflush(stdout);
      if (!finite) ++failures;
    }

    for (int r = 0; r < rotations; ++r) {
      ANCHOR_CUDA(cudaFree(b[r]));
      ANCHOR_CUDA(cudaFree(s[r]));
      ANCHOR_CUDA(cudaFree(workspace[r]));
    }
    for (void* d : dense) ANCHOR_CUDA(cudaFree(d));
    ANCHOR_CUDA(cudaFree(x));
    ANCHOR_CUDA(cudaFree(y));
  }
  ANCHOR_CUBLAS(cublasDestroy(cublas));
  ANCHOR_CUDA(cudaStreamDestroy(stream));
  return failures == 0 ? 0 : 1;
}

}  // namespace anchor

int main(int argc, char** argv) {
  try {
    return anchor::run(argc, argv);
  } catch (const anchor::Failure& failure) {
    std::fprintf(stderr, "marlin_bench: %s\n", failure.what());
    return 1;
  }
}
