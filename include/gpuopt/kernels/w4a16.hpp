// W4A16 GEMM: y[M,N] = x[M,K] @ dequant(w4)[K,N], fp16 or bf16 activations, fp32 accumulation.
// The weights are repacked once into a tile layout in which each GPU thread's 16 bytes are exactly
// its tensor-core B fragments (docs/w4a16-gemm.md); the CPU twin reads the same layout.
// GPU API in the CUTLASS style: can_implement -> workspace_size -> initialize -> run(stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

struct CUstream_st;  // cudaStream_t without including CUDA headers

namespace gpuopt::kernels {

using StreamHandle = CUstream_st*;

enum class ActivationType { kFloat16, kBFloat16 };
std::string_view activation_type_name(ActivationType type);

// Tile geometry shared by the repacker, the CPU twin and the kernel.
inline constexpr int kTileN = 64;       // columns in one strip
inline constexpr int kTileK = 16;       // rows in one k16 tile
inline constexpr int kTileBytes = 512;  // 64x16 nibbles; lane l owns bytes [16l, 16l+16)
inline constexpr int kStageK = 64;      // rows per pipeline stage: K must be a multiple

// The kernel-ready layer. tiles: for strip s = n/64 and k16 tile t, 128 words at
// (s*(K/16) + t)*128; lane (g = lane/4, c = lane%4) owns words [4*lane, 4*lane+4), word i holding,
// at nibble p, q[k][n] with j = 2i + (p%4)/2, k = 16t + 2c + 8*((p%4)%2) + p/4, n = 64s + 8j + g.
// scales/zeros: [G][N/64][8 (g)][8 (j)] so one thread reads its 8 columns' values at once.
struct W4A16Weights {
  int k = 0;
  int n = 0;
  int group_size = 0;
  ActivationType type = ActivationType::kFloat16;
  bool has_zeros = false;
  std::vector<std::uint32_t> tiles;
  std::vector<std::uint16_t> scales;  // fp16 or bf16 bits, per `type`
  std::vector<std::uint8_t> zeros;    // empty when !has_zeros (symmetric: zero 8)
  std::vector<std::int32_t> perm;     // act-order: y = x[:, perm] @ w; empty = identity
  int groups() const { return group_size > 0 ? k / group_size : 0; }
};

// Why a shape cannot run, or OK. Names the dimension, e.g. "N=1000 is not a multiple of 64".
Status check_w4a16_shape(int k, int n, int group_size);

// Builds the kernel layout (scales rounded to `type`). Refuses shapes check_w4a16_shape refuses.
StatusOr<W4A16Weights> repack_for_kernel(const UnpackedLayer& layer, ActivationType type);
// Reads the tile layout back (tests use it for the round trip).
UnpackedLayer unpack_kernel_layout(const W4A16Weights& weights);

// CPU twin of the GPU kernel: dequantises from the tile layout with the type's scales and
// accumulates in float32. x: [M][K] fp16/bf16 bits in original column order; returns [M][N].
std::vector<float> w4a16_reference(const W4A16Weights& weights, const std::uint16_t* x, int m);

// ---- GPU ----

// Device copy of W4A16Weights: upload() makes one that owns its buffers; one whose pointers are
// set by hand (memory owned elsewhere) owns nothing.
class W4A16DeviceWeights {
 public:
  static StatusOr<W4A16DeviceWeights> upload(const W4A16Weights& weights, StreamHandle stream);
  W4A16DeviceWeights() = default;
  W4A16DeviceWeights(W4A16DeviceWeights&& other) noexcept;
  W4A16DeviceWeights& operator=(W4A16DeviceWeights&& other) noexcept;
  W4A16DeviceWeights(const W4A16DeviceWeights&) = delete;
  W4A16DeviceWeights& operator=(const W4A16DeviceWeights&) = delete;
  ~W4A16DeviceWeights();

  int k = 0, n = 0, group_size = 0;
  ActivationType type = ActivationType::kFloat16;
  bool has_zeros = false;
  const void* tiles = nullptr;   // device
  const void* scales = nullptr;  // device
  const void* zeros = nullptr;   // device, or null
  const void* perm = nullptr;    // device int32 [K], or null
  std::size_t compressed_bytes() const;

 private:
  // The memory behind tiles, scales, zeros and perm when upload() made it.
  std::vector<runtime::DeviceBuffer> buffers_;
};

enum class W4A16Path { kTensorCore, kDequantCublas };
// Which tensor-core kernel (W4A16Path::kTensorCore): x rows as the mma A operand, the weights as A
// with shared-memory stages (swapped), the weights streamed straight into registers (direct), or
// Hopper wgmma. docs/w4a16-gemm.md describes each.
enum class W4A16Kernel { kXRows, kSwapped, kDirect, kWgmma };

// A path forced through W4A16Options::force_path (tests and benchmarks); kAuto lets initialize()
// choose. kTensorCore: the tensor-core kernel chosen by M (no cuBLAS takeover); kXRows / kSwapped:
// the original mma.sync kernels with x rows, or the weights, as the mma A operand; kDirect / kWgmma
// fail in initialize() where they do not apply.
enum class W4A16ForcePath { kAuto, kTensorCore, kDequantCublas, kXRows, kSwapped, kDirect, kWgmma };
// "auto", "tensor-core", "dequant-cublas", "x-rows", "swapped", "direct", "wgmma".
std::string_view w4a16_force_path_name(W4A16ForcePath path);
// The inverse of w4a16_force_path_name; INVALID_ARGUMENT naming the value and the valid names.
StatusOr<W4A16ForcePath> parse_w4a16_force_path(std::string_view name);

// The swapped kernel's copy pipeline: cp.async by every thread, or Hopper bulk copies into 128-k
// stages issued by one warp, with a block barrier per stage (kBulkK128).
enum class W4A16Pipeline { kCpAsync, kBulkK128 };
// "cp-async", "bulk-k128".
std::string_view w4a16_pipeline_name(W4A16Pipeline pipeline);
StatusOr<W4A16Pipeline> parse_w4a16_pipeline(std::string_view name);

// What run() will do; chosen in initialize() from (M, N, K, SM count, occupancy).
struct W4A16Config {
  W4A16Path path = W4A16Path::kTensorCore;
  W4A16Kernel kernel = W4A16Kernel::kXRows;
  int variant = 0;       // direct/wgmma: the template instance
  std::string note;      // direct/wgmma: their own description
  int kernel_flags = 0;  // direct/wgmma: option bits their plan fixed (kept for run())
  bool swapped = false;  // weights as the mma A operand, x rows as B (small M)
  int m_tiles = 1;       // mma tiles of x rows per block (1, 2 or 4): 16 rows, 8 when swapped
  int block_m = 16;      // x rows per block
  int block_n = 256;     // columns per block tile
  int threads = 256;
  int stages = 4;
  W4A16Pipeline pipeline = W4A16Pipeline::kCpAsync;  // the swapped kernel's
  int blocks = 0;                                    // stream-K grid
  int blocks_per_sm = 0;                             // occupancy
  int tiles = 0;                                     // output tiles
  int iterations = 0;                                // k-stages in total over all tiles
  int splits = 0;  // deterministic: fixed k-splits per tile; 0 = stream-K with atomics
  std::size_t shared_bytes = 0;
  std::string describe() const;
};

// Overrides of the planner's own choices, for A/B runs and tests (`gpuopt bench gemm` maps its
// flags here). The defaults leave every choice to the planner. Each applies only where its kernel
// runs; a value out of range is INVALID_ARGUMENT in workspace_size() / initialize(), naming it.
struct W4A16Tuning {
  // The swapped kernel's copy pipeline (unset: bulk 128-k stages at M = 1 on layers of K x N >=
  // 2^27 where the device has sm_90 code, cp.async elsewhere). Bulk copies apply only with sm_90
  // code, N % 256 == 0, K % 128 == 0 and groups of a multiple of 64; elsewhere cp.async runs.
  std::optional<W4A16Pipeline> pipeline;
  // Direct kernel: the partial strips in the mma fragment layout (16-byte reductions) or the row
  // layout (4-byte reductions of the M real rows). Unset: the fragment layout from M = 3.
  std::optional<bool> direct_fragment_partials;
  // Direct kernel, 9-16 rows with resident x: stages of 8 k16 tiles where K and the groups allow
  // them. Unset: on layers of K x N >= 2^27; false: never; true: wherever they apply.
  std::optional<bool> direct_tiles8;
  // Direct kernel: x resident in shared memory (k-sliced where all of x does not fit), where one
  // block's shared memory holds a slice and the rings. false: x streams through the warps' rings.
  bool direct_resident_x = true;
  // Direct kernel, resident x: this many k-slices (0: the cost model's choice) and at most this
  // many blocks per slice (0: SMs / slices).
  int direct_slices = 0;
  int direct_slice_blocks = 0;
  // Direct kernel, streamed x: blocks per SM, at most the occupancy (0: the occupancy).
  int direct_blocks_per_sm = 0;
  // wgmma kernel: the template instance, 7 (32 tokens), 8 (64) or 9 (128) (unset: by M), and the
  // k-splits per output tile (0: the wave-fill choice; more than K / 64 is cut to K / 64). Forcing
  // the splits turns the automatic stream-K off.
  std::optional<int> wgmma_variant;
  int wgmma_splits = 0;
  // wgmma kernel: stream-K (one wave, each block an equal run of (tile, k-stage) units). Unset:
  // where the k-splits leave the wave under-filled (32- and 64-token tiles, >= 12 stages a block).
  std::optional<bool> wgmma_stream_k;
  // wgmma kernel, stream-K: the grid (0: one wave), cut to the number of units.
  int wgmma_stream_k_blocks = 0;
  // wgmma kernel: the shared fix-up of k-splits where the splits fit one wave; false: the atomic
  // partial sums.
  bool wgmma_shared_fixup = true;
};

struct W4A16Options {
  // The cuBLAS takeover, opt-in: from this M on, run cuBLAS on a dense fp16/bf16 copy of the
  // weight that initialize() writes into the workspace (N x K x 2 bytes, 3.9 times the int4
  // weights and scales at group 128: the int4 memory saving is lost for this W4A16Gemm, and
  // workspace_size() says so). 0 (the default) = never: the int4 weights stay the only copy, at
  // the int4 kernels' speed (0.63-0.88x cuBLAS fp16 at M = 256..4096 on the H200's 70B shapes,
  // docs/PERFORMANCE.md). kAutoFallback = from the M where the int4 kernels stop beating cuBLAS on
  // this GPU and layer, W4A16Gemm::auto_fallback_min_m().
  static constexpr int kAutoFallback = -1;
  int fallback_min_m = 0;
  // Forces a path for tests and benchmarks (W4A16ForcePath); kAuto = choose.
  W4A16ForcePath force_path = W4A16ForcePath::kAuto;
  // Overrides the stream-K grid (0 = occupancy x SMs). Ignored when `deterministic`.
  int force_blocks = 0;
  // The SMs the kernels are planned for: 0 = the device's; else the SM count of the green-context
  // partition whose stream will run this GEMM (runtime::Workload::sm_count(), or
  // runtime::stream_sm_count(stream) for a stream made elsewhere), so that the one-wave
  // grids (stream-K, the direct kernel's block per SM, the wgmma kernel's cooperative k-splits)
  // are one wave of that partition. More than the device has is INVALID_ARGUMENT. With
  // `deterministic`, the k-split (and so the result bits) follows this count.
  int sm_count = 0;
  // true: run() gives bitwise identical results from run to run, and each output row's values do
  // not depend on M (the same k-split and reduction order for every M; no float atomics). Every
  // output tile is cut into a fixed number of k-splits chosen from N, K and the SM count only;
  // each split writes its fp32 partial to the workspace and the last one to finish adds them in
  // split order. The dequantise + cuBLAS path is never taken (cuBLAS picks kernels by M). May be
  // slower than the default stream-K schedule, and needs splits x M x N x 4 bytes of workspace.
  bool deterministic = false;
  // Overrides of the kernels' own plans (A/B runs and tests); the defaults change nothing.
  W4A16Tuning tuning;
};

// OK, or INVALID_ARGUMENT naming the first field out of range (host-only: the device's own limits,
// such as its SM count, are checked when a plan is made).
Status check_w4a16_options(const W4A16Options& options);

class W4A16Gemm {
 public:
  struct Arguments {
    int m = 0;
    const void* x = nullptr;  // [M][K] fp16/bf16, device
    void* y = nullptr;        // [M][N] same type, device
    const W4A16DeviceWeights* weights = nullptr;
  };

  explicit W4A16Gemm(W4A16Options options = {});
  ~W4A16Gemm();
  W4A16Gemm(const W4A16Gemm&) = delete;
  W4A16Gemm& operator=(const W4A16Gemm&) = delete;

  static Status can_implement(const Arguments& arguments);
  // The M from which W4A16Options::kAutoFallback runs dequantise + cuBLAS for these weights on
  // `device`: where the int4 kernel chosen for that M was measured slower than cuBLAS fp16
  // (docs/w4a16-gemm.md, "When cuBLAS takes over"). `sm_count` as W4A16Options::sm_count (0 = the
  // device's; outside 0..the device's SMs INVALID_ARGUMENT): on a smaller partition the int4
  // kernels, bound by their work per SM, lose to cuBLAS from a smaller M. Never 0.
  static StatusOr<int> auto_fallback_min_m(const W4A16DeviceWeights& weights, int device,
                                           int sm_count = 0);
  // Bytes of device workspace run() needs (stream-K partials and counters, permuted x, or the
  // dequantised weight for the cuBLAS path).
  StatusOr<std::size_t> workspace_size(const Arguments& arguments);
  // Chooses the configuration, clears the workspace on `stream`. The workspace must stay valid.
  Status initialize(const Arguments& arguments, void* workspace, StreamHandle stream);
  // Changes x/y (same M and weights) without re-initialising.
  void update(const void* x, void* y);
  Status run(StreamHandle stream);
  const W4A16Config& config() const { return config_; }

 private:
  W4A16Options options_;
  Arguments arguments_;
  W4A16Config config_;
  void* workspace_ = nullptr;
  std::size_t plan_offsets_[4] = {};  // partials (or direct/wgmma workspace), counters, permuted
                                      // x, dense weight
  void* cublas_ = nullptr;            // cublasHandle_t for the fallback path
};

// Dense reference for the benchmark and fallback: y[M][N] = x[M][K] @ w^T with w [N][K] (the
// nn.Linear layout), cuBLAS GemmEx, fp32 compute.
class CublasGemm {
 public:
  CublasGemm() = default;
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  Status run(ActivationType type, int m, int n, int k, const void* x, const void* w_nk, void* y,
             StreamHandle stream);

 private:
  void* handle_ = nullptr;
};

}  // namespace gpuopt::kernels
