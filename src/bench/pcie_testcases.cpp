// The testcases of `gpuopt bench pcie` and the suite that orders them; device, link and NUMA
// placement are detected once, and every testcase is waived with that reason when there is no GPU.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "bench/pcie_device.hpp"
#include "gpuopt/bench/pcie.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/platform/numa.hpp"
#include "gpuopt/platform/pcie_link.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::bench::pcie {

namespace {

enum class Direction { kHostToDevice, kDeviceToHost };
enum class HostMemory { kPinnedLocal, kPageable, kPinnedRemote };

std::string_view direction_key(Direction d) {
  return d == Direction::kHostToDevice ? "host_to_device" : "device_to_host";
}
std::string_view memory_key(HostMemory m) {
  switch (m) {
    case HostMemory::kPinnedLocal:
      return "pinned";
    case HostMemory::kPageable:
      return "pageable";
    case HostMemory::kPinnedRemote:
      return "pinned_remote";
  }
  return "pinned";
}

// What every testcase of one run shares: detection results and the figures the verdict weighs.
struct PcieState {
  Status device_status;  // non-OK waives every testcase with its message
  int device = 0;
  int device_count = 0;
  std::string device_name;
  LinkInfo link;
  std::vector<int> numa_nodes;
  std::optional<int> gpu_node;
  std::string locality;  // "node 1 (hwloc)", "unknown (...)"
  std::vector<std::size_t> sizes;
  std::size_t comparison_bytes = 0;  // the size the verdict compares memory kinds at
  int samples = 10;
  int warmup = 2;
  // "<direction>/<memory>/<bytes>" → median GB/s, filled by the testcases as they run.
  std::map<std::string, double> figures;
  std::optional<int> remote_node() const {
    if (!gpu_node) return std::nullopt;
    for (int node : numa_nodes) {
      if (node != *gpu_node) return node;
    }
    return std::nullopt;
  }
};

std::string figure_key(Direction d, HostMemory m, std::size_t bytes) {
  return fmt::format("{}/{}/{}", direction_key(d), memory_key(m), bytes);
}

std::string gbps(double value) { return fmt::format("{:.2f}", value); }

// Back-to-back copies per sample: enough that per-copy overhead does not dominate small sizes, one
// for the largest so a sample stays short.
[[maybe_unused]] int copies_per_sample(std::size_t bytes) {
  std::size_t copies = (512ull << 20) / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(copies, 1, 16));
}

[[maybe_unused]] std::uint64_t fresh_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

[[maybe_unused]] LinkInfo detect_link(const std::string& bdf) {
  LinkInfo link;
  link.bus_id = bdf;
  auto path = platform::read_link_path("/", bdf);
  if (!path.ok() || path->empty()) {
    link.notes.push_back(fmt::format("PCIe link of {} unreadable: {}", bdf,
                                     path.ok() ? "empty path" : path.status().message()));
    return link;
  }
  const platform::LinkState& own = path->front().link;
  for (const auto& problem : path->front().problems) link.notes.push_back(problem);
  link.current_speed_gts = own.current_speed_gts;
  link.current_width = own.current_width;
  link.width = own.max_width;
  if (own.max_speed_gts) link.generation = platform::pcie_generation(*own.max_speed_gts);
  if (link.generation && link.width) {
    link.theoretical_gbps = platform::pcie_bandwidth_gbps(*link.generation, *link.width);
  }
  // The GPU's own capability is the reference; a narrower port above it is named, not assumed,
  // because virtual bridges in VMs report made-up values.
  if (path->size() > 1) {
    const platform::LinkState& up = (*path)[1].link;
    if (up.max_width && link.width && *up.max_width < *link.width) {
      link.notes.push_back(
          fmt::format("the port above ({}) has only x{} lanes", (*path)[1].bdf, *up.max_width));
    }
    if (up.max_speed_gts && own.max_speed_gts && *up.max_speed_gts < *own.max_speed_gts) {
      link.notes.push_back(fmt::format("the port above ({}) is limited to {} GT/s", (*path)[1].bdf,
                                       *up.max_speed_gts));
    }
  }
  return link;
}

std::shared_ptr<PcieState> detect(const BenchOptions& options) {
  auto state = std::make_shared<PcieState>();
  state->sizes = options.sizes.empty() ? default_sizes(options.quick) : options.sizes;
  std::sort(state->sizes.begin(), state->sizes.end());
  state->sizes.erase(std::unique(state->sizes.begin(), state->sizes.end()), state->sizes.end());
  state->samples = options.samples > 0 ? options.samples : (options.quick ? 5 : 10);
  state->warmup = options.warmup > 0 ? options.warmup : 2;
  state->comparison_bytes = state->sizes.front();
  for (std::size_t bytes : state->sizes) {
    if (bytes <= (256ull << 20)) state->comparison_bytes = bytes;
  }
  state->device = options.device;
#if GPUOPT_CUDA
  auto count = cuda_device_count();
  if (!count.ok()) {
    state->device_status = count.status();
    return state;
  }
  state->device_count = *count;
  if (options.device < 0 || options.device >= *count) {
    state->device_status = invalid_argument(fmt::format(
        "--device {} does not exist; this machine has {} GPU(s)", options.device, *count));
    return state;
  }
  if (Status s = GPUOPT_CUDA_STATUS(cudaSetDevice(options.device)); !s.ok()) {
    state->device_status = s;
    return state;
  }
  cudaDeviceProp properties{};
  if (Status s = GPUOPT_CUDA_STATUS(cudaGetDeviceProperties(&properties, options.device)); s.ok()) {
    state->device_name = properties.name;
  }
  char bus_id[32] = {};
  if (Status s = GPUOPT_CUDA_STATUS(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), options.device));
      s.ok()) {
    auto bdf = platform::parse_pci_bus_id(bus_id);
    if (bdf.ok()) {
      state->link = detect_link(*bdf);
    } else {
      state->link.notes.push_back(bdf.status().message());
    }
  } else {
    state->link.notes.push_back(s.to_string());
  }
  auto topology = platform::NumaTopology::discover();
  if (topology.ok()) {
    for (const auto& node : topology->nodes()) state->numa_nodes.push_back(node.os_index);
    auto locality = state->link.bus_id.empty()
                        ? StatusOr<platform::PciLocality>(not_found("no bus id"))
                        : topology->pci_locality(state->link.bus_id);
    if (locality.ok() && locality->numa_nodes.size() == 1) {
      state->gpu_node = locality->numa_nodes.front();
      state->locality = fmt::format("node {} ({})", *state->gpu_node, locality->source);
    } else if (state->numa_nodes.size() == 1) {
      state->gpu_node = state->numa_nodes.front();
      state->locality = fmt::format("node {} (the only node)", *state->gpu_node);
    } else {
      state->locality = locality.ok() ? "unknown (the platform does not say)"
                                      : "unknown (" + locality.status().message() + ")";
    }
  } else {
    state->locality = "unknown (" + topology.status().message() + ")";
  }
#else
  state->device_status = unimplemented("gpuopt was built without CUDA");
#endif
  return state;
}

class PcieTestcase : public Testcase {
 public:
  explicit PcieTestcase(std::shared_ptr<PcieState> state) : state_(std::move(state)) {}
  Status filter(const BenchContext&) const override {
    if (!state_->device_status.ok()) {
      return Status(state_->device_status.code(),
                    "no usable GPU: " + state_->device_status.message());
    }
    return extra_filter();
  }

 protected:
  virtual Status extra_filter() const { return ok_status(); }
  std::shared_ptr<PcieState> state_;
};

#if GPUOPT_CUDA
using detail::Lane;
using detail::PinnedMemory;
using detail::SpinTimer;
using detail::Stream;
using runtime::DeviceBuffer;

// A host buffer of one memory kind; `device_view` is the pointer kernels use (mapped kinds only).
struct HostBuffer {
  std::unique_ptr<unsigned char[]> pageable;
  std::optional<platform::NodeBoundHostBuffer> bound;
  PinnedMemory pinned;
  void* data = nullptr;
  void* device_view = nullptr;
  std::string how;
};

StatusOr<HostBuffer> make_host_buffer(HostMemory memory, std::size_t bytes,
                                      const PcieState& state) {
  HostBuffer buffer;
  if (memory == HostMemory::kPageable) {
    buffer.pageable.reset(new (std::nothrow) unsigned char[bytes]);
    if (!buffer.pageable) {
      return resource_exhausted(
          fmt::format("cannot allocate {} of pageable memory", format_bytes(bytes)));
    }
    buffer.data = buffer.pageable.get();
    std::memset(buffer.data, 0, bytes);  // touch every page before timing
    buffer.how = "pageable (new[], touched)";
    return buffer;
  }
  std::optional<int> node =
      memory == HostMemory::kPinnedRemote ? state.remote_node() : state.gpu_node;
  // Binding only matters with several nodes; one node uses the plain pinned allocator.
  if (state.numa_nodes.size() > 1 && node) {
    auto bound = platform::NodeBoundHostBuffer::allocate(bytes, *node);
    Status status = bound.ok() ? bound->pin() : bound.status();
    if (status.ok()) {
      buffer.bound.emplace(std::move(bound).value());
      buffer.data = buffer.bound->data();
      buffer.how =
          fmt::format("pinned, bound to NUMA node {} (mmap+mbind, cudaHostRegister)", *node);
    } else if (memory == HostMemory::kPinnedRemote) {
      return status.with_context(fmt::format("host memory on NUMA node {}", *node));
    }
  } else if (memory == HostMemory::kPinnedRemote) {
    return failed_precondition("no remote NUMA node");
  }
  if (buffer.data == nullptr) {
    GPUOPT_ASSIGN_OR_RETURN(buffer.pinned, detail::allocate_pinned(bytes));
    buffer.data = buffer.pinned.get();
    buffer.how = "pinned (cudaHostAlloc)";
  }
  GPUOPT_ASSIGN_OR_RETURN(buffer.device_view, detail::device_pointer_of(buffer.data));
  return buffer;
}

Status poison(void* data, bool on_device, std::size_t bytes, cudaStream_t stream) {
  if (on_device) {
    GPUOPT_CUDA_TRY(cudaMemsetAsync(data, 0xA5, bytes, stream));
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  } else {
    std::memset(data, 0xA5, bytes);
  }
  return ok_status();
}

Status fill(void* data, bool on_device, std::size_t bytes, std::uint64_t seed,
            cudaStream_t stream) {
  if (on_device) {
    GPUOPT_RETURN_IF_ERROR(detail::launch_fill_pattern(data, bytes, seed, stream));
    GPUOPT_CUDA_TRY(cudaStreamSynchronize(stream));
  } else {
    fill_pattern_reference(data, bytes, seed);
  }
  return ok_status();
}

Status mismatch_error(std::string_view what, std::size_t bytes, std::size_t mismatched) {
  return data_loss(fmt::format("{}: {} bytes of a {} copy differ from the source", what, mismatched,
                               format_bytes(bytes)));
}
#endif

// Host<->device copies of one memory kind by the copy engine or by SM kernels.
class HostDeviceCopy : public PcieTestcase {
 public:
  HostDeviceCopy(std::shared_ptr<PcieState> state, Direction direction, HostMemory memory,
                 bool sm_kernel)
      : PcieTestcase(std::move(state)), direction_(direction), memory_(memory), sm_(sm_kernel) {}

  std::string key() const override {
    std::string key = fmt::format("{}_memcpy_{}", direction_key(direction_), sm_ ? "sm" : "ce");
    if (!sm_)
      key += memory_ == HostMemory::kPinnedRemote ? "_remote_node"
                                                  : fmt::format("_{}", memory_key(memory_));
    return key;
  }
  std::string description() const override {
    std::string what = direction_ == Direction::kHostToDevice ? "host to device" : "device to host";
    std::string memory = memory_ == HostMemory::kPageable ? "pageable host memory (malloc/new)"
                         : memory_ == HostMemory::kPinnedRemote
                             ? "pinned host memory on a remote NUMA node"
                             : "pinned host memory on the GPU's NUMA node";
    return fmt::format("{} by {}, {}", what,
                       sm_ ? "an SM copy kernel reading/writing mapped memory"
                           : "the copy engine (cudaMemcpyAsync)",
                       memory);
  }

 protected:
  Status extra_filter() const override {
    if (memory_ != HostMemory::kPinnedRemote) return ok_status();
    if (state_->numa_nodes.size() < 2) {
      return failed_precondition("one NUMA node: no remote host memory to compare");
    }
    if (!state_->gpu_node) {
      return failed_precondition("the GPU's NUMA node is " + state_->locality);
    }
    return ok_status();
  }

 public:
  StatusOr<TestcaseResult> run(BenchContext& context) override {
#if GPUOPT_CUDA
    const PcieState& state = *state_;
    // The remote-node comparison needs one size only: the one the verdict compares at.
    std::vector<std::size_t> sizes = memory_ == HostMemory::kPinnedRemote
                                         ? std::vector<std::size_t>{state.comparison_bytes}
                                         : state.sizes;
    const std::size_t largest = sizes.back();
    GPUOPT_CUDA_TRY(cudaSetDevice(state.device));
    GPUOPT_ASSIGN_OR_RETURN(HostBuffer host, make_host_buffer(memory_, largest, state));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::allocate(largest));
    GPUOPT_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    GPUOPT_ASSIGN_OR_RETURN(SpinTimer timer, SpinTimer::create(state.device));
    const bool to_device = direction_ == Direction::kHostToDevice;
    const std::uint64_t seed = fresh_seed();
    // A prefix of the pattern is the pattern of the prefix, so one fill serves every size.
    if (to_device) {
      GPUOPT_RETURN_IF_ERROR(fill(host.data, false, largest, seed, stream.get()));
    } else {
      GPUOPT_RETURN_IF_ERROR(fill(device.data(), true, largest, seed, stream.get()));
    }
    const bool pageable = memory_ == HostMemory::kPageable;
    TestcaseResult result;
    result.description = description();
    result.table.columns = {"size", "median GB/s", "p10", "p90", "spread %", "link %", "verified"};
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t index = 0; index < sizes.size(); ++index) {
      const std::size_t bytes = sizes[index];
      void* dst = to_device ? device.data() : host.data;
      void* src = to_device ? host.data : device.data();
      GPUOPT_RETURN_IF_ERROR(poison(dst, to_device, bytes, stream.get()));
      Lane lane{stream.get(), dst, src, bytes, sm_};
      if (sm_) {
        lane.dst = to_device ? device.data() : host.device_view;
        lane.src = to_device ? host.device_view : device.data();
      }
      const int copies = copies_per_sample(bytes);
      std::vector<double> ms;
      if (pageable) {
        GPUOPT_ASSIGN_OR_RETURN(ms,
                                detail::time_on_host(lane, copies, state.warmup, state.samples));
      } else {
        GPUOPT_ASSIGN_OR_RETURN(auto lanes,
                                timer.time_lanes({lane}, copies, state.warmup, state.samples));
        ms = std::move(lanes.front());
      }
      std::vector<double> rates;
      for (double m : ms) rates.push_back(bandwidth_gbps(double(bytes) * copies, m));
      Summary summary = summarize(rates);
      std::size_t mismatched = 0;
      if (to_device || host.device_view != nullptr) {
        GPUOPT_ASSIGN_OR_RETURN(mismatched, detail::count_mismatches_on_device(
                                                to_device ? device.data() : host.device_view, bytes,
                                                seed, stream.get()));
      } else {
        mismatched = count_mismatches_reference(host.data, bytes, seed);
      }
      if (mismatched != 0) return mismatch_error(key(), bytes, mismatched);
      std::optional<double> efficiency =
          link_efficiency(summary.median, state.link.theoretical_gbps);
      // The verdict weighs copy-engine figures; SM copies are shown for comparison only.
      if (!sm_) state_->figures[figure_key(direction_, memory_, bytes)] = summary.median;
      result.table.rows.push_back(
          {format_bytes(bytes), gbps(summary.median), gbps(summary.p10), gbps(summary.p90),
           fmt::format("{:.1f}", summary.relative_spread() * 100),
           efficiency ? fmt::format("{:.1f}", *efficiency * 100) : "-", "yes"});
      rows.push_back(
          {{"bytes", bytes},
           {"copies_per_sample", copies},
           {"bandwidth_gbps", to_json(summary)},
           {"link_efficiency", efficiency ? nlohmann::json(*efficiency) : nlohmann::json()},
           {"verified", true},
           { "mismatched_bytes",
             0 }});
      context.progress(double(index + 1) / sizes.size());
    }
    result.data = {{"direction", direction_key(direction_)},
                   {"engine", sm_ ? "sm" : "copy_engine"},
                   {"host_memory", host.how},
                   {"timing", pageable ? "host clock from first enqueue to stream completion "
                                         "(pageable copies block the host while staging)"
                                       : "CUDA events behind a spin kernel (nvbandwidth method)"},
                   {"samples", state.samples},
                   {"warmup", state.warmup},
                   {"unit", "GB/s (1e9 bytes/s)"},
                   { "sizes",
                     rows }};
    result.notes.push_back("host memory: " + host.how);
    return result;
#else
    return unimplemented("built without CUDA");
#endif
  }

 private:
  Direction direction_;
  HostMemory memory_;
  bool sm_;
};

// Both directions at once on two streams, pinned memory on the GPU's node.
class Bidirectional : public PcieTestcase {
 public:
  using PcieTestcase::PcieTestcase;
  std::string key() const override { return "host_device_bidirectional_memcpy_ce"; }
  std::string description() const override {
    return "host to device and device to host at the same time (two streams, copy engines, "
           "pinned memory); each direction and their sum";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
#if GPUOPT_CUDA
    const PcieState& state = *state_;
    const std::size_t largest = state.sizes.back();
    GPUOPT_CUDA_TRY(cudaSetDevice(state.device));
    GPUOPT_ASSIGN_OR_RETURN(HostBuffer host_src,
                            make_host_buffer(HostMemory::kPinnedLocal, largest, state));
    GPUOPT_ASSIGN_OR_RETURN(HostBuffer host_dst,
                            make_host_buffer(HostMemory::kPinnedLocal, largest, state));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer device_src, DeviceBuffer::allocate(largest));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer device_dst, DeviceBuffer::allocate(largest));
    GPUOPT_ASSIGN_OR_RETURN(Stream up, Stream::create());
    GPUOPT_ASSIGN_OR_RETURN(Stream down, Stream::create());
    GPUOPT_ASSIGN_OR_RETURN(SpinTimer timer, SpinTimer::create(state.device));
    const std::uint64_t seed_up = fresh_seed(), seed_down = fresh_seed();
    GPUOPT_RETURN_IF_ERROR(fill(host_src.data, false, largest, seed_up, up.get()));
    GPUOPT_RETURN_IF_ERROR(fill(device_src.data(), true, largest, seed_down, down.get()));
    TestcaseResult result;
    result.table.columns = {"size", "h2d GB/s", "d2h GB/s", "sum GB/s", "sum spread %", "verified"};
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t index = 0; index < state.sizes.size(); ++index) {
      const std::size_t bytes = state.sizes[index];
      GPUOPT_RETURN_IF_ERROR(poison(device_dst.data(), true, bytes, up.get()));
      GPUOPT_RETURN_IF_ERROR(poison(host_dst.data, false, bytes, down.get()));
      const int copies = copies_per_sample(bytes);
      std::vector<Lane> lanes = {{up.get(), device_dst.data(), host_src.data, bytes, false},
                                 { down.get(),
                                   host_dst.data,
                                   device_src.data(),
                                   bytes,
                                   false }};
      GPUOPT_ASSIGN_OR_RETURN(auto ms,
                              timer.time_lanes(lanes, copies, state.warmup, state.samples));
      std::vector<double> h2d, d2h, sum;
      for (std::size_t s = 0; s < ms[0].size(); ++s) {
        h2d.push_back(bandwidth_gbps(double(bytes) * copies, ms[0][s]));
        d2h.push_back(bandwidth_gbps(double(bytes) * copies, ms[1][s]));
        sum.push_back(h2d.back() + d2h.back());
      }
      GPUOPT_ASSIGN_OR_RETURN(std::size_t bad_up, detail::count_mismatches_on_device(
                                                      device_dst.data(), bytes, seed_up, up.get()));
      if (bad_up != 0) return mismatch_error("bidirectional host to device", bytes, bad_up);
      GPUOPT_ASSIGN_OR_RETURN(
          std::size_t bad_down,
          detail::count_mismatches_on_device(host_dst.device_view, bytes, seed_down, down.get()));
      if (bad_down != 0) return mismatch_error("bidirectional device to host", bytes, bad_down);
      Summary s_h2d = summarize(h2d), s_d2h = summarize(d2h), s_sum = summarize(sum);
      result.table.rows.push_back({format_bytes(bytes), gbps(s_h2d.median), gbps(s_d2h.median),
                                   gbps(s_sum.median),
                                   fmt::format("{:.1f}", s_sum.relative_spread() * 100), "yes"});
      rows.push_back({{"bytes", bytes},
                      {"copies_per_sample", copies},
                      {"host_to_device_gbps", to_json(s_h2d)},
                      {"device_to_host_gbps", to_json(s_d2h)},
                      {"sum_gbps", to_json(s_sum)},
                      { "verified",
                        true }});
      context.progress(double(index + 1) / state.sizes.size());
    }
    result.data = {{"host_memory", host_src.how},
                   {"timing", "CUDA events behind a spin kernel on each stream"},
                   {"samples", state.samples},
                   {"unit", "GB/s (1e9 bytes/s)"},
                   { "sizes",
                     rows }};
    return result;
#else
    return unimplemented("built without CUDA");
#endif
  }
};

// Copies within the GPU's memory, by the copy engine or by SM kernels.
class DeviceToDevice : public PcieTestcase {
 public:
  DeviceToDevice(std::shared_ptr<PcieState> state, bool sm_kernel)
      : PcieTestcase(std::move(state)), sm_(sm_kernel) {}
  std::string key() const override {
    return sm_ ? "device_to_device_memcpy_sm" : "device_to_device_memcpy_ce";
  }
  std::string description() const override {
    return fmt::format(
        "device memory to device memory by {}; bandwidth counts bytes read plus "
        "bytes written (2 × size), copy_rate counts size",
        sm_ ? "an SM copy kernel" : "the copy engine");
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
#if GPUOPT_CUDA
    const PcieState& state = *state_;
    const std::size_t largest = state.sizes.back();
    GPUOPT_CUDA_TRY(cudaSetDevice(state.device));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::allocate(largest));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::allocate(largest));
    GPUOPT_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    GPUOPT_ASSIGN_OR_RETURN(SpinTimer timer, SpinTimer::create(state.device));
    const std::uint64_t seed = fresh_seed();
    GPUOPT_RETURN_IF_ERROR(fill(src.data(), true, largest, seed, stream.get()));
    TestcaseResult result;
    result.table.columns = {"size", "read+write GB/s", "copy rate GB/s", "spread %", "verified"};
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t index = 0; index < state.sizes.size(); ++index) {
      const std::size_t bytes = state.sizes[index];
      GPUOPT_RETURN_IF_ERROR(poison(dst.data(), true, bytes, stream.get()));
      const int copies = copies_per_sample(bytes);
      GPUOPT_ASSIGN_OR_RETURN(auto ms, timer.time_lanes({{ stream.get(),
                                                           dst.data(),
                                                           src.data(),
                                                           bytes,
                                                           sm_ }},
                                                        copies, state.warmup, state.samples));
      std::vector<double> moved, rate;
      for (double m : ms[0]) {
        moved.push_back(bandwidth_gbps(2.0 * bytes * copies, m));
        rate.push_back(bandwidth_gbps(double(bytes) * copies, m));
      }
      GPUOPT_ASSIGN_OR_RETURN(std::size_t bad, detail::count_mismatches_on_device(
                                                   dst.data(), bytes, seed, stream.get()));
      if (bad != 0) return mismatch_error(key(), bytes, bad);
      Summary s_moved = summarize(moved), s_rate = summarize(rate);
      result.table.rows.push_back({format_bytes(bytes), gbps(s_moved.median), gbps(s_rate.median),
                                   fmt::format("{:.1f}", s_moved.relative_spread() * 100), "yes"});
      rows.push_back({{"bytes", bytes},
                      {"copies_per_sample", copies},
                      {"bandwidth_gbps", to_json(s_moved)},
                      {"copy_rate_gbps", to_json(s_rate)},
                      { "verified",
                        true }});
      context.progress(double(index + 1) / state.sizes.size());
    }
    result.data = {
        {"engine", sm_ ? "sm" : "copy_engine"},
        {"bytes_counted", "read + written (2 x size), as nvbandwidth's device-local copy"},
        {"timing", "CUDA events behind a spin kernel"},
        {"samples", state.samples},
        {"unit", "GB/s (1e9 bytes/s)"},
        { "sizes",
          rows }};
    return result;
#else
    return unimplemented("built without CUDA");
#endif
  }

 private:
  bool sm_;
};

// Testcases that need several GPUs; waived on one.
class MultiGpu : public PcieTestcase {
 public:
  MultiGpu(std::shared_ptr<PcieState> state, std::string key, std::string description)
      : PcieTestcase(std::move(state)),
        key_(std::move(key)),
        description_(std::move(description)) {}
  std::string key() const override { return key_; }
  std::string description() const override { return description_; }

 protected:
  Status extra_filter() const override {
    if (state_->device_count < 2) {
      return failed_precondition(
          fmt::format("needs 2 or more GPUs; this machine has {}", state_->device_count));
    }
    return unimplemented("multi-GPU testcases are not implemented yet in gpuopt bench pcie");
  }

 public:
  StatusOr<TestcaseResult> run(BenchContext&) override {
    return unimplemented("multi-GPU testcases are not implemented yet");
  }

 private:
  std::string key_, description_;
};

// Small single copies: what one transfer costs from enqueue to completion.
class Latency : public PcieTestcase {
 public:
  using PcieTestcase::PcieTestcase;
  std::string key() const override { return "host_device_latency_ce"; }
  std::string description() const override {
    return "latency of single small copies (pinned memory, copy engine): GPU time between events "
           "and the host's enqueue-to-complete round trip, microseconds";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
#if GPUOPT_CUDA
    const PcieState& state = *state_;
    static constexpr std::size_t kSizes[] = {4, 64, 512, 4096};
    const int iterations = context.options().quick ? 100 : 300;
    GPUOPT_CUDA_TRY(cudaSetDevice(state.device));
    GPUOPT_ASSIGN_OR_RETURN(HostBuffer host,
                            make_host_buffer(HostMemory::kPinnedLocal, 4096, state));
    GPUOPT_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::allocate(4096));
    GPUOPT_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    TestcaseResult result;
    result.table.columns = {"size",          "direction",      "event us",
                            "round trip us", "round trip p90", "verified"};
    nlohmann::json rows = nlohmann::json::array();
    std::size_t step = 0;
    for (Direction direction : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      const bool to_device = direction == Direction::kHostToDevice;
      for (std::size_t bytes : kSizes) {
        const std::uint64_t seed = fresh_seed();
        GPUOPT_RETURN_IF_ERROR(
            fill(to_device ? host.data : device.data(), !to_device, bytes, seed, stream.get()));
        GPUOPT_RETURN_IF_ERROR(
            poison(to_device ? device.data() : host.data, to_device, bytes, stream.get()));
        Lane lane{stream.get(), to_device ? device.data() : host.data,
                  to_device ? host.data : device.data(), bytes, false};
        GPUOPT_ASSIGN_OR_RETURN(auto samples, detail::time_single_copies(lane, 20, iterations));
        GPUOPT_ASSIGN_OR_RETURN(std::size_t bad, detail::count_mismatches_on_device(
                                                     to_device ? device.data() : host.device_view,
                                                     bytes, seed, stream.get()));
        if (bad != 0) return mismatch_error(key(), bytes, bad);
        Summary event = summarize(samples.event_us), trip = summarize(samples.round_trip_us);
        result.table.rows.push_back({format_bytes(bytes), std::string(direction_key(direction)),
                                     fmt::format("{:.2f}", event.median),
                                     fmt::format("{:.2f}", trip.median),
                                     fmt::format("{:.2f}", trip.p90), "yes"});
        rows.push_back({{"bytes", bytes},
                        {"direction", direction_key(direction)},
                        {"event_latency_us", to_json(event)},
                        {"round_trip_latency_us", to_json(trip)},
                        { "verified",
                          true }});
        context.progress(double(++step) / (2 * std::size(kSizes)));
      }
    }
    result.data = {{"iterations", iterations}, {"host_memory", host.how}, { "sizes", rows }};
    return result;
#else
    return unimplemented("built without CUDA");
#endif
  }
};

// Weighs the copy-engine figures of the earlier testcases against the link, per direction.
class LinkVerdict : public PcieTestcase {
 public:
  using PcieTestcase::PcieTestcase;
  std::string key() const override { return "pcie_link_verdict"; }
  std::string description() const override {
    return "pinned host<->device bandwidth against the link's theoretical rate: healthy >= 80%, "
           "warn below, fail below 76%; explains pageable and remote-node losses";
  }
  StatusOr<TestcaseResult> run(BenchContext&) override {
    const PcieState& state = *state_;
    TestcaseResult result;
    nlohmann::json verdicts = nlohmann::json::array();
    bool any = false;
    result.table.columns = {"direction", "pinned GB/s", "link GB/s", "efficiency %", "verdict"};
    for (Direction direction : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      DirectionFigures figures;
      figures.direction = std::string(direction_key(direction));
      figures.bytes = state.comparison_bytes;
      auto find = [&](HostMemory memory) -> std::optional<double> {
        auto it = state.figures.find(figure_key(direction, memory, state.comparison_bytes));
        return it == state.figures.end() ? std::nullopt : std::optional<double>(it->second);
      };
      figures.pinned_local_gbps = find(HostMemory::kPinnedLocal);
      figures.pageable_gbps = find(HostMemory::kPageable);
      figures.pinned_remote_gbps = find(HostMemory::kPinnedRemote);
      figures.remote_node = state.remote_node();
      if (!figures.pinned_local_gbps) continue;
      any = true;
      DirectionVerdict verdict = judge_direction(figures, state.link);
      result.table.rows.push_back(
          {figures.direction, gbps(*figures.pinned_local_gbps),
           state.link.theoretical_gbps ? gbps(*state.link.theoretical_gbps) : "-",
           verdict.efficiency ? fmt::format("{:.1f}", *verdict.efficiency * 100) : "-",
           std::string(verdict_name(verdict.verdict))});
      for (const auto& line : verdict.explanations) {
        result.notes.push_back(figures.direction + ": " + line);
      }
      verdicts.push_back(to_json(verdict));
    }
    if (!any) {
      return failed_precondition(fmt::format(
          "no pinned copy-engine figure at {}: run host_to_device_memcpy_ce_pinned and/or "
          "device_to_host_memcpy_ce_pinned with that size",
          format_bytes(state.comparison_bytes)));
    }
    for (const auto& note : state.link.notes) result.notes.push_back("link: " + note);
    result.data = {{"device", state.device_name},
                   {"numa_node", state.locality},
                   {"link", to_json(state.link)},
                   {"compared_bytes", state.comparison_bytes},
                   {"healthy_at_least", kHealthyEfficiency},
                   {"fail_below", kFailEfficiency},
                   {"verdicts", verdicts}};
    return result;
  }

 protected:
  // Runs after the copy testcases (Suite calls filter just before run), so it can see their
  // figures.
  Status extra_filter() const override {
    for (Direction d : {Direction::kHostToDevice, Direction::kDeviceToHost}) {
      if (state_->figures.count(
              figure_key(d, HostMemory::kPinnedLocal, state_->comparison_bytes))) {
        return ok_status();
      }
    }
    return failed_precondition(fmt::format(
        "no pinned copy-engine figure at {}: select host_to_device_memcpy_ce_pinned and/or "
        "device_to_host_memcpy_ce_pinned too",
        format_bytes(state_->comparison_bytes)));
  }
};

}  // namespace

namespace {

Suite build_suite(const std::shared_ptr<PcieState>& state) {
  Suite suite("pcie");
  using D = Direction;
  using M = HostMemory;
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kHostToDevice, M::kPinnedLocal, false));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kDeviceToHost, M::kPinnedLocal, false));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kHostToDevice, M::kPageable, false));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kDeviceToHost, M::kPageable, false));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kHostToDevice, M::kPinnedRemote, false));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kDeviceToHost, M::kPinnedRemote, false));
  suite.add(std::make_unique<Bidirectional>(state));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kHostToDevice, M::kPinnedLocal, true));
  suite.add(std::make_unique<HostDeviceCopy>(state, D::kDeviceToHost, M::kPinnedLocal, true));
  suite.add(std::make_unique<DeviceToDevice>(state, false));
  suite.add(std::make_unique<DeviceToDevice>(state, true));
  suite.add(std::make_unique<MultiGpu>(state, "device_to_device_peer_memcpy_ce",
                                       "GPU to GPU over NVLink/PCIe by the copy engine"));
  suite.add(std::make_unique<MultiGpu>(state, "all_to_host_memcpy_ce",
                                       "every GPU to host at once by the copy engines"));
  suite.add(std::make_unique<Latency>(state));
  suite.add(std::make_unique<LinkVerdict>(state));
  return suite;
}

}  // namespace

Suite make_suite(const BenchOptions& options) { return build_suite(detect(options)); }

// Keys and descriptions do not depend on the machine, so no detection here.
Suite make_catalogue() { return build_suite(std::make_shared<PcieState>()); }

std::vector<std::string> testcase_keys() {
  std::vector<std::string> keys;
  Suite suite = make_catalogue();
  for (const auto& testcase : suite.testcases()) {
    keys.push_back(testcase->key());
  }
  return keys;
}

}  // namespace gpuopt::bench::pcie
