// NUMA helpers without a GPU: bus id forms, CPU lists, a recorded two-node topology with a GPU on
// node 1, the sysfs fallback on a fake tree, and node-bound buffers on this machine.
#include "gpuopt/platform/numa.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace gpuopt::platform {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("gpuopt_numa_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Numa, ParsesBusIdForms) {
  EXPECT_EQ(*parse_pci_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(*parse_pci_bus_id("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(*parse_pci_bus_id("1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(*parse_pci_bus_id(" 0001:c1:1f.7\n"), "0001:c1:1f.7");
  EXPECT_FALSE(parse_pci_bus_id("").ok());
  EXPECT_FALSE(parse_pci_bus_id("0000:1b:00").ok());
  EXPECT_FALSE(parse_pci_bus_id("0000:1g:00.0").ok());
  EXPECT_FALSE(parse_pci_bus_id("0000:1b:20.0").ok());  // device > 31
  EXPECT_FALSE(parse_pci_bus_id("0000:1b:00.8").ok());  // function > 7
  auto bad = parse_pci_bus_id("gpu0");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gpu0"), std::string::npos);
}

TEST(Numa, ParsesCpuLists) {
  EXPECT_EQ(*parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(parse_cpu_list("").value().empty());
  EXPECT_FALSE(parse_cpu_list("3-1").ok());
  EXPECT_FALSE(parse_cpu_list("a").ok());
  EXPECT_FALSE(parse_cpu_list("1,,2").ok());
}

// Two packages, one NUMA node each, a GPU behind a host bridge on package 1.
constexpr const char* kTwoNodeXml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13" local_memory="2147483648"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[40-4f]">
        <object type="PCIDev" gp_index="21" pci_busid="0000:41:00.0" pci_type="0302 [10de:2335] [10de:18be] a1"/>
      </object>
    </object>
  </object>
</topology>
)";

TEST(Numa, RecordedTopologyPlacesGpuOnItsNode) {
  fs::path dir = fresh_dir("topology");
  fs::path xml = dir / "two_node.xml";
  std::ofstream(xml) << kTwoNodeXml;
  auto topology = NumaTopology::from_xml(xml.string());
  ASSERT_TRUE(topology.ok()) << topology.status().to_string();
  ASSERT_EQ(topology->nodes().size(), 2u);
  EXPECT_EQ(topology->nodes()[0].os_index, 0);
  EXPECT_EQ(topology->nodes()[1].os_index, 1);
  EXPECT_EQ(topology->nodes()[1].cpus, "2-3");
  ASSERT_TRUE(topology->nodes()[1].memory_bytes.has_value());
  EXPECT_EQ(*topology->nodes()[1].memory_bytes, 2147483648ull);

  // CUDA's upper-case form must find the same device.
  auto gpu = topology->pci_locality("00000000:41:00.0");
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_EQ(gpu->source, "hwloc");
  EXPECT_EQ(gpu->bus_id, "0000:41:00.0");
  EXPECT_EQ(gpu->numa_nodes, std::vector<int>{1});
  EXPECT_EQ(gpu->local_cpus, "2-3");

  auto absent = topology->pci_locality("0000:42:00.0");
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(NumaTopology::from_xml((dir / "missing.xml").string()).status().code(),
            StatusCode::kNotFound);
}

TEST(Numa, SysfsFallbackReadsNodeAndCpus) {
  fs::path root = fresh_dir("sysfs");
  fs::path device = root / "sys/bus/pci/devices/0000:1b:00.0";
  fs::create_directories(device);
  std::ofstream(device / "numa_node") << "1\n";
  std::ofstream(device / "local_cpulist") << "24-47,72-95\n";
  fs::path unknown = root / "sys/bus/pci/devices/0000:1c:00.0";
  fs::create_directories(unknown);
  std::ofstream(unknown / "numa_node") << "-1\n";

  auto locality = read_sysfs_pci_locality(root.string(), "0000:1b:00.0");
  ASSERT_TRUE(locality.ok()) << locality.status().to_string();
  EXPECT_EQ(locality->numa_nodes, std::vector<int>{1});
  EXPECT_EQ(locality->local_cpus, "24-47,72-95");
  EXPECT_EQ(locality->source, "sysfs");
  auto no_node = read_sysfs_pci_locality(root.string(), "0000:1c:00.0");
  ASSERT_TRUE(no_node.ok());
  EXPECT_TRUE(no_node->numa_nodes.empty());
  EXPECT_EQ(read_sysfs_pci_locality(root.string(), "0000:1d:00.0").status().code(),
            StatusCode::kNotFound);
}

TEST(Numa, ThisMachineHasAtLeastOneNode) {
  auto topology = NumaTopology::discover();
  ASSERT_TRUE(topology.ok()) << topology.status().to_string();
  ASSERT_FALSE(topology->nodes().empty());
  EXPECT_FALSE(NumaTopology::hwloc_version().empty());
}

TEST(Numa, NodeBoundBufferHoldsDataOnItsNode) {
  auto topology = NumaTopology::discover();
  ASSERT_TRUE(topology.ok());
  int node = topology->nodes().front().os_index;
  const std::size_t bytes = 3 * 4096 + 123;  // not a whole number of pages
  auto buffer = NodeBoundHostBuffer::allocate(bytes, node);
  if (!buffer.ok() && buffer.status().code() == StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "mbind not permitted here: " << buffer.status().to_string();
  }
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  EXPECT_EQ(buffer->size(), bytes);
  EXPECT_EQ(buffer->requested_node(), node);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer->data()) % 4096, 0u);
  // Fresh random bytes written and read back through a moved-to owner.
  std::vector<unsigned char> expected(bytes);
  std::mt19937 random(std::random_device{}());
  for (auto& b : expected) b = static_cast<unsigned char>(random());
  std::memcpy(buffer->data(), expected.data(), bytes);
  NodeBoundHostBuffer moved = std::move(buffer).value();
  EXPECT_EQ(std::memcmp(moved.data(), expected.data(), bytes), 0);
  if (auto resident = moved.resident_node(bytes - 1)) EXPECT_EQ(*resident, node);
  EXPECT_FALSE(moved.resident_node(bytes).has_value());
}

TEST(Numa, RejectsBadRequests) {
  EXPECT_EQ(NodeBoundHostBuffer::allocate(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NodeBoundHostBuffer::allocate(4096, 100000).status().code(),
            StatusCode::kInvalidArgument);
  // A node that does not exist: the kernel refuses the binding, and we say so.
  auto missing = NodeBoundHostBuffer::allocate(4096, 1000);
  EXPECT_FALSE(missing.ok());
  auto unbound = NodeBoundHostBuffer::allocate(4096, -1);
  ASSERT_TRUE(unbound.ok());
  EXPECT_EQ(unbound->requested_node(), -1);
}

}  // namespace
}  // namespace gpuopt::platform
