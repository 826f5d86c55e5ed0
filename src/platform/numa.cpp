// NUMA nodes and PCI locality through hwloc (sysfs as the fallback), and node-bound host buffers.
#include "gpuopt/platform/numa.hpp"

#include <fmt/format.h>
#include <hwloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "gpuopt/core/cuda_check.hpp"
#include "sysfs_text.hpp"

namespace gpuopt::platform {

namespace fs = std::filesystem;

namespace {

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

std::string trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  std::size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

std::optional<std::string> read_text(const fs::path& path) {
  auto text = detail::read_text(path);
  if (!text) return std::nullopt;
  return trim(std::move(*text));
}

std::string bitmap_list(hwloc_const_bitmap_t bitmap) {
  if (bitmap == nullptr) return {};
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, bitmap) < 0 || text == nullptr) return {};
  std::string out(text);
  std::free(text);
  return out;
}

}  // namespace

StatusOr<std::string> parse_pci_bus_id(std::string_view bus_id) {
  std::string text = trim(std::string(bus_id));
  // Split "domain:bus:device.function" (domain optional) and check each part is hexadecimal.
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string::npos ? colon : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  auto bad = [&] {
    return invalid_argument(
        fmt::format("PCI bus id '{}' is not of the form [domain:]bus:dev.fn", std::string(bus_id)));
  };
  if (parts.size() == 2) parts.insert(parts.begin(), "0");
  if (parts.size() != 3) return bad();
  std::string& domain = parts[0];
  std::string& bus = parts[1];
  std::string& device_function = parts[2];
  std::size_t dot = device_function.find('.');
  if (dot == std::string::npos) return bad();
  std::string device = device_function.substr(0, dot);
  std::string function = device_function.substr(dot + 1);
  for (const std::string* part : {&domain, &bus, &device, &function}) {
    if (part->empty() || part->size() > 8 || !std::all_of(part->begin(), part->end(), is_hex)) {
      return bad();
    }
  }
  unsigned long domain_value = std::stoul(domain, nullptr, 16);
  unsigned long bus_value = std::stoul(bus, nullptr, 16);
  unsigned long device_value = std::stoul(device, nullptr, 16);
  unsigned long function_value = std::stoul(function, nullptr, 16);
  if (domain_value > 0xffff || bus_value > 0xff || device_value > 0x1f || function_value > 7) {
    return bad();
  }
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain_value, bus_value, device_value,
                     function_value);
}

StatusOr<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  std::string all = trim(std::string(text));
  if (all.empty()) return cpus;
  std::size_t start = 0;
  while (start <= all.size()) {
    std::size_t comma = all.find(',', start);
    if (comma == std::string::npos) comma = all.size();
    std::string item = trim(all.substr(start, comma - start));
    start = comma + 1;
    auto parse_int = [](std::string_view s) -> std::optional<int> {
      int value = 0;
      auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
      if (error != std::errc() || end != s.data() + s.size() || value < 0) return std::nullopt;
      return value;
    };
    std::size_t dash = item.find('-');
    std::optional<int> first = parse_int(std::string_view(item).substr(0, dash));
    std::optional<int> last =
        dash == std::string::npos ? first : parse_int(std::string_view(item).substr(dash + 1));
    if (!first || !last || *last < *first || *last - *first > 65536) {
      return invalid_argument(fmt::format("CPU list '{}': bad item '{}'", all, item));
    }
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
    if (comma == all.size()) break;
  }
  return cpus;
}

StatusOr<PciLocality> read_sysfs_pci_locality(const std::string& root, const std::string& bdf) {
  fs::path device = fs::path(root) / "sys/bus/pci/devices" / bdf;
  std::error_code error;
  if (!fs::exists(device, error)) {
    return not_found(fmt::format("no PCI device {} under {}", bdf, device.parent_path().string()));
  }
  PciLocality locality;
  locality.bus_id = bdf;
  locality.source = "sysfs";
  if (auto node = read_text(device / "numa_node")) {
    int value = -1;
    auto [end, parse_error] = std::from_chars(node->data(), node->data() + node->size(), value);
    if (parse_error == std::errc() && value >= 0) locality.numa_nodes.push_back(value);
  }
  if (auto cpus = read_text(device / "local_cpulist")) locality.local_cpus = *cpus;
  return locality;
}

// ---------------------------------------------------------------------------------------------
// NumaTopology

struct NumaTopology::Impl {
  hwloc_topology_t topology = nullptr;
  std::vector<NumaNode> nodes;
  std::string sysfs_root = "/";
  ~Impl() {
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

namespace {

// Loads with I/O objects kept, from this machine or an XML file; fills the node list.
Status load_topology(hwloc_topology_t* out, const std::string* xml) {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) {
    return internal_error(fmt::format("hwloc_topology_init failed: {}", std::strerror(errno)));
  }
  // PCI devices and bridges are dropped by default; keep the ones that matter for locality.
  hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xml != nullptr && hwloc_topology_set_xml(topology, xml->c_str()) != 0) {
    int saved = errno;
    hwloc_topology_destroy(topology);
    return invalid_argument(
        fmt::format("hwloc cannot read topology XML {}: {}", *xml, std::strerror(saved)));
  }
  if (hwloc_topology_load(topology) != 0) {
    int saved = errno;
    hwloc_topology_destroy(topology);
    return internal_error(fmt::format("hwloc_topology_load failed: {}", std::strerror(saved)));
  }
  *out = topology;
  return ok_status();
}

}  // namespace

NumaTopology::NumaTopology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  int count = hwloc_get_nbobjs_by_type(impl_->topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < count; ++i) {
    hwloc_obj_t object = hwloc_get_obj_by_type(impl_->topology, HWLOC_OBJ_NUMANODE, i);
    if (object == nullptr) continue;
    NumaNode node;
    node.os_index = static_cast<int>(object->os_index);
    if (object->attr != nullptr && object->attr->numanode.local_memory > 0) {
      node.memory_bytes = object->attr->numanode.local_memory;
    }
    node.cpus = bitmap_list(object->cpuset);
    impl_->nodes.push_back(std::move(node));
  }
  std::sort(impl_->nodes.begin(), impl_->nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
}

NumaTopology::NumaTopology(NumaTopology&& other) noexcept = default;
NumaTopology& NumaTopology::operator=(NumaTopology&& other) noexcept = default;
NumaTopology::~NumaTopology() = default;

StatusOr<NumaTopology> NumaTopology::discover() {
  auto impl = std::make_unique<Impl>();
  GPUOPT_RETURN_IF_ERROR(load_topology(&impl->topology, nullptr));
  return NumaTopology(std::move(impl));
}

StatusOr<NumaTopology> NumaTopology::from_xml(const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return not_found(fmt::format("topology XML {} not found", path));
  auto impl = std::make_unique<Impl>();
  GPUOPT_RETURN_IF_ERROR(load_topology(&impl->topology, &path));
  // A recorded topology must not be mixed with this machine's sysfs.
  impl->sysfs_root.clear();
  return NumaTopology(std::move(impl));
}

const std::vector<NumaNode>& NumaTopology::nodes() const { return impl_->nodes; }

std::string NumaTopology::hwloc_version() {
  unsigned version = hwloc_get_api_version();
  return fmt::format("{}.{}.{}", version >> 16, (version >> 8) & 0xff, version & 0xff);
}

StatusOr<PciLocality> NumaTopology::pci_locality(std::string_view bus_id) const {
  GPUOPT_ASSIGN_OR_RETURN(std::string bdf, parse_pci_bus_id(bus_id));
  hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(impl_->topology, bdf.c_str());
  if (device == nullptr) {
    // hwloc built without its PCI plugin (or the plugin not shipped): ask sysfs directly.
    if (impl_->sysfs_root.empty()) {
      return not_found(fmt::format("PCI device {} is not in the topology", bdf));
    }
    return read_sysfs_pci_locality(impl_->sysfs_root, bdf);
  }
  PciLocality locality;
  locality.bus_id = bdf;
  locality.source = "hwloc";
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(impl_->topology, device);
  if (ancestor == nullptr) return locality;
  locality.local_cpus = bitmap_list(ancestor->cpuset);
  hwloc_obj_t root = hwloc_get_root_obj(impl_->topology);
  // Attached to the whole machine on a multi-node system means the platform did not say.
  bool whole_machine = ancestor == root && impl_->nodes.size() > 1;
  if (!whole_machine && ancestor->nodeset != nullptr) {
    for (const NumaNode& node : impl_->nodes) {
      if (hwloc_bitmap_isset(ancestor->nodeset, static_cast<unsigned>(node.os_index))) {
        locality.numa_nodes.push_back(node.os_index);
      }
    }
  }
  return locality;
}

// ---------------------------------------------------------------------------------------------
// NodeBoundHostBuffer

namespace {

constexpr int kMpolBind = 2;           // MPOL_BIND from <linux/mempolicy.h>
constexpr unsigned kMpolMfStrict = 1;  // MPOL_MF_STRICT
constexpr unsigned kMpolMfMove = 2;    // MPOL_MF_MOVE
constexpr int kMaxNodes = 1024;        // nodemask bits we pass to mbind

std::size_t page_size() {
  long size = sysconf(_SC_PAGESIZE);
  return size > 0 ? static_cast<std::size_t>(size) : 4096;
}

}  // namespace

StatusOr<NodeBoundHostBuffer> NodeBoundHostBuffer::allocate(std::size_t bytes, int numa_node) {
  if (bytes == 0) return invalid_argument("NodeBoundHostBuffer: zero bytes requested");
  if (numa_node >= kMaxNodes) {
    return invalid_argument(fmt::format("NUMA node {} is beyond {}", numa_node, kMaxNodes - 1));
  }
  const std::size_t page = page_size();
  const std::size_t mapped = (bytes + page - 1) / page * page;
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return resource_exhausted(
        fmt::format("mmap of {} bytes failed: {}", mapped, std::strerror(errno)));
  }
  NodeBoundHostBuffer buffer(data, bytes, mapped, numa_node);
  if (numa_node >= 0) {
    unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
    mask[numa_node / (8 * sizeof(unsigned long))] |= 1ul
                                                     << (numa_node % (8 * sizeof(unsigned long)));
    // The kernel counts maxnode one past the last bit it reads (numactl passes the same).
    long result = syscall(SYS_mbind, data, mapped, kMpolBind, mask,
                          static_cast<unsigned long>(kMaxNodes + 1), kMpolMfStrict | kMpolMfMove);
    if (result != 0) {
      return failed_precondition(fmt::format("mbind of {} bytes to NUMA node {} refused: {}",
                                             mapped, numa_node, std::strerror(errno)));
    }
  }
  // Touch every page now so placement (and page-fault cost) happens outside any timed region.
  auto* bytes_ptr = static_cast<volatile unsigned char*>(data);
  for (std::size_t offset = 0; offset < mapped; offset += page) bytes_ptr[offset] = 0;
  return buffer;
}

NodeBoundHostBuffer::NodeBoundHostBuffer(NodeBoundHostBuffer&& other) noexcept
    : data_(other.data_),
      bytes_(other.bytes_),
      mapped_(other.mapped_),
      node_(other.node_),
      pinned_(other.pinned_) {
  other.data_ = nullptr;
  other.pinned_ = false;
}

NodeBoundHostBuffer& NodeBoundHostBuffer::operator=(NodeBoundHostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    mapped_ = other.mapped_;
    node_ = other.node_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.pinned_ = false;
  }
  return *this;
}

NodeBoundHostBuffer::~NodeBoundHostBuffer() { release(); }

void NodeBoundHostBuffer::release() {
  if (data_ == nullptr) return;
#if GPUOPT_CUDA
  if (pinned_) GPUOPT_CUDA_TRY_NO_THROW(cudaHostUnregister(data_));
#endif
  munmap(data_, mapped_);
  data_ = nullptr;
  pinned_ = false;
}

std::optional<int> NodeBoundHostBuffer::resident_node(std::size_t offset) const {
  if (data_ == nullptr || offset >= bytes_) return std::nullopt;
  void* page = static_cast<char*>(data_) + offset / page_size() * page_size();
  int status = -1;
  // nodes == nullptr asks move_pages where each page is instead of moving it.
  long result = syscall(SYS_move_pages, 0, 1ul, &page, nullptr, &status, 0);
  if (result != 0 || status < 0) return std::nullopt;
  return status;
}

Status NodeBoundHostBuffer::pin() {
  if (data_ == nullptr) return failed_precondition("pin() of an empty NodeBoundHostBuffer");
  if (pinned_) return ok_status();
#if GPUOPT_CUDA
  GPUOPT_CUDA_TRY(
      cudaHostRegister(data_, mapped_, cudaHostRegisterPortable | cudaHostRegisterMapped));
  pinned_ = true;
  return ok_status();
#else
  return unimplemented("pinning host memory needs a build with CUDA");
#endif
}

}  // namespace gpuopt::platform
