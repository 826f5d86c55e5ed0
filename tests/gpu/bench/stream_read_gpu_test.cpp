// The memory anchors of `bench gemm` (stream_read.cu) on a real GPU: the plain read must load every
// 16-byte word of the buffer, at full occupancy and limited to a few warps per SM. The kernel folds
// each thread's words with XOR and stores the fold only if it equals a marker value, so a buffer
// of zeros with the marker in one word shows whether that word was read (by whichever thread).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bench/pcie_device.hpp"
#include "bench/stream_read.hpp"
#include "common/test_support.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime.h>
#endif

namespace gpuopt::bench {
namespace {

#if GPUOPT_CUDA
TEST(StreamReadGpu, EveryWordIsReadAtAnyOccupancy) {
  GPUOPT_REQUIRE_GPU();
  // 4 MB + 3 words: a partial last round of the unrolled loop.
  const std::size_t words = (std::size_t{4} << 20) / 16 + 3;
  // Freed on every exit, a failed ASSERT included.
  auto data_memory = runtime::DeviceBuffer::allocate(words * 16);
  ASSERT_TRUE(data_memory.ok()) << data_memory.status().to_string();
  auto sink_memory = runtime::DeviceBuffer::allocate(sizeof(unsigned));
  ASSERT_TRUE(sink_memory.ok()) << sink_memory.status().to_string();
  void* const data = data_memory->data();
  unsigned* const sink = static_cast<unsigned*>(sink_memory->data());
  const std::uint32_t marker[4] = {kStreamReadMarker, 0, 0, 0};
  for (const int warps_per_sm : {0, 16, 8}) {
    for (const std::size_t word : {std::size_t{0}, words / 2 + 1, words - 1}) {
      SCOPED_TRACE("warps per SM " + std::to_string(warps_per_sm) + ", word " +
                   std::to_string(word));
      ASSERT_EQ(cudaMemset(data, 0, words * 16), cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(static_cast<char*>(data) + word * 16, marker, 16, cudaMemcpyHostToDevice),
          cudaSuccess);
      ASSERT_EQ(cudaMemset(sink, 0, sizeof(unsigned)), cudaSuccess);
      const Status launched = launch_stream_read(data, words * 16, sink, nullptr, warps_per_sm);
      ASSERT_TRUE(launched.ok()) << launched.to_string();
      unsigned seen = 0;
      ASSERT_EQ(cudaMemcpy(&seen, sink, sizeof(seen), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(seen, kStreamReadMarker) << "the word with the marker was not read";
    }
  }
  // No marker anywhere: nothing is stored (the fold of zeros is zero).
  ASSERT_EQ(cudaMemset(data, 0, words * 16), cudaSuccess);
  ASSERT_EQ(cudaMemset(sink, 0, sizeof(unsigned)), cudaSuccess);
  ASSERT_TRUE(launch_stream_read(data, words * 16, sink, nullptr, 16).ok());
  unsigned seen = 1;
  ASSERT_EQ(cudaMemcpy(&seen, sink, sizeof(seen), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(seen, 0u);
}
#endif

}  // namespace
}  // namespace gpuopt::bench
