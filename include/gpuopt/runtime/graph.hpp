// CUDA Graph capture and replay of a repeated stage sequence: capture once on a non-default
// stream, replay with one launch, and change kernel parameters between replays without
// re-instantiating (cudaGraphExecUpdate of a re-capture, or one kernel node's arguments).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {

// Enqueues one pass of the stage sequence on `stream`. It must only enqueue asynchronous work
// (kernels, async copies, event records/waits) on that stream or streams forked from it.
using StageSequence = std::function<Status(StreamHandle stream)>;

class StageGraph {
 public:
  // Captures `stages` on `stream` (thread-local capture mode) and instantiates the graph.
  // INVALID_ARGUMENT for a null stream (capture needs a non-default stream).
  static StatusOr<StageGraph> capture(StreamHandle stream, const StageSequence& stages);

  StageGraph() = default;
  StageGraph(StageGraph&& other) noexcept;
  StageGraph& operator=(StageGraph&& other) noexcept;
  StageGraph(const StageGraph&) = delete;
  StageGraph& operator=(const StageGraph&) = delete;
  ~StageGraph();

  // One launch of the whole sequence on `stream`.
  Status replay(StreamHandle stream) const;

  // Re-captures `stages` (same topology, new parameters) on `stream` and updates the executable
  // graph in place. FAILED_PRECONDITION naming the reason when the topology changed.
  Status update(StreamHandle stream, const StageSequence& stages);

  // Replaces the arguments of the one kernel node running `kernel_function` (e.g.
  // affine_kernel_function()); `args` as for cudaLaunchKernel. FAILED_PRECONDITION when the
  // function runs in no node or in several.
  Status set_kernel_args(const void* kernel_function, void** args);

  std::size_t node_count() const { return node_count_; }
  std::size_t kernel_node_count() const { return kernel_node_count_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  std::size_t node_count_ = 0;
  std::size_t kernel_node_count_ = 0;
};

}  // namespace gpuopt::runtime
