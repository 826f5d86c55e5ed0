// NUMA placement through hwloc: the nodes of this machine, which node and CPUs sit next to a PCI
// device, and host buffers bound to one node (optionally pinned for CUDA) to measure the
// difference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::platform {

struct NumaNode {
  int os_index = -1;
  std::optional<std::uint64_t> memory_bytes;  // local memory; absent when hwloc does not know
  std::string cpus;                           // CPUs of the node as a list, "0-15,32-47"
};

// Where a PCI device sits: the NUMA node(s) its host bridge attaches to and the CPUs next to it.
struct PciLocality {
  std::string bus_id;           // sysfs form, "0000:1b:00.0"
  std::vector<int> numa_nodes;  // OS indexes; empty when the platform does not say (numa_node -1)
  std::string local_cpus;       // "0-47"; empty when unknown
  std::string source;           // "hwloc" or "sysfs": which one answered
};

// Validating parser: "00000000:1B:00.0" (nvidia-smi), "0000:1B:00.0" (cudaDeviceGetPCIBusId) or
// "1b:00.0" → the sysfs form "0000:1b:00.0". INVALID_ARGUMENT, naming the text, for anything else.
StatusOr<std::string> parse_pci_bus_id(std::string_view bus_id);

// The sysfs answer alone (numa_node and local_cpulist under <root>/sys/bus/pci/devices/<bdf>);
// used when hwloc was built without PCI discovery. NOT_FOUND when the device directory is absent.
StatusOr<PciLocality> read_sysfs_pci_locality(const std::string& root, const std::string& bdf);

// "0-3,8,10-11" → {0,1,2,3,8,10,11}; INVALID_ARGUMENT names the bad item.
StatusOr<std::vector<int>> parse_cpu_list(std::string_view text);

// A loaded hwloc topology (with I/O devices). Move-only.
class NumaTopology {
 public:
  // This machine.
  static StatusOr<NumaTopology> discover();
  // A topology exported by `lstopo file.xml` or written by hand (tests).
  static StatusOr<NumaTopology> from_xml(const std::string& path);

  NumaTopology(NumaTopology&& other) noexcept;
  NumaTopology& operator=(NumaTopology&& other) noexcept;
  ~NumaTopology();

  // Every NUMA node, in OS index order. A machine hwloc sees as non-NUMA has one node, index 0.
  const std::vector<NumaNode>& nodes() const;

  // Locality of a PCI device by bus id (any form parse_pci_bus_id accepts). Falls back to sysfs
  // when hwloc has no object for the device; NOT_FOUND when neither knows it.
  StatusOr<PciLocality> pci_locality(std::string_view bus_id) const;

  // hwloc's library version, for reports ("2.9.0").
  static std::string hwloc_version();

 private:
  struct Impl;
  explicit NumaTopology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Anonymous host memory bound to one NUMA node (mmap + mbind MPOL_BIND), every page touched at
// allocation so it is placed now rather than at first use inside a timed copy. Move-only.
class NodeBoundHostBuffer {
 public:
  // `numa_node` < 0 allocates without a binding (the kernel's default, first-touch placement).
  // RESOURCE_EXHAUSTED when memory cannot be had; FAILED_PRECONDITION when the kernel refuses the
  // binding (no such node, or mbind forbidden in a container), with its errno text.
  static StatusOr<NodeBoundHostBuffer> allocate(std::size_t bytes, int numa_node);

  NodeBoundHostBuffer(NodeBoundHostBuffer&& other) noexcept;
  NodeBoundHostBuffer& operator=(NodeBoundHostBuffer&& other) noexcept;
  ~NodeBoundHostBuffer();

  void* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  int requested_node() const { return node_; }
  bool pinned() const { return pinned_; }

  // The node that actually holds the page at `offset` (move_pages query); nullopt when the kernel
  // will not say.
  std::optional<int> resident_node(std::size_t offset = 0) const;

  // Page-locks the buffer for CUDA (cudaHostRegister, mapped and portable) so copies use DMA
  // directly and kernels can read it through cudaHostGetDevicePointer. UNIMPLEMENTED without CUDA.
  Status pin();

 private:
  NodeBoundHostBuffer(void* data, std::size_t bytes, std::size_t mapped, int node)
      : data_(data), bytes_(bytes), mapped_(mapped), node_(node) {}
  void release();

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_ = 0;  // bytes rounded up to pages
  int node_ = -1;
  bool pinned_ = false;
};

}  // namespace gpuopt::platform
