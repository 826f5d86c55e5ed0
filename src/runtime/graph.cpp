// StageGraph over cudaStreamBeginCapture / cudaGraphInstantiate / cudaGraphExecUpdate.
#include "gpuopt/runtime/graph.hpp"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "gpuopt/core/cuda_check.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::runtime {

StageGraph::StageGraph(StageGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)),
      exec_(std::exchange(other.exec_, nullptr)),
      node_count_(other.node_count_),
      kernel_node_count_(other.kernel_node_count_) {}

StageGraph& StageGraph::operator=(StageGraph&& other) noexcept {
  if (this != &other) {
    StageGraph old(std::move(*this));
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
    node_count_ = other.node_count_;
    kernel_node_count_ = other.kernel_node_count_;
  }
  return *this;
}

#if GPUOPT_CUDA

namespace {

// Runs `stages` under capture and returns the graph; ends the capture on every path so the stream
// is never left capturing.
StatusOr<cudaGraph_t> capture_graph(StreamHandle stream, const StageSequence& stages) {
  if (stream == nullptr) {
    return invalid_argument("StageGraph: capture needs a non-default stream, got null");
  }
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  GPUOPT_CUDA_TRY(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeThreadLocal));
  Status enqueued = stages(stream);
  cudaGraph_t graph = nullptr;
  Status ended = GPUOPT_CUDA_STATUS(cudaStreamEndCapture(cuda_stream, &graph));
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued.with_context("StageGraph: while capturing the stage sequence");
  }
  GPUOPT_RETURN_IF_ERROR(ended);
  return graph;
}

std::vector<cudaGraphNode_t> kernel_nodes(cudaGraph_t graph, std::size_t* all_nodes) {
  std::size_t count = 0;
  std::vector<cudaGraphNode_t> kernels;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return kernels;
  std::vector<cudaGraphNode_t> nodes(count);
  if (cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return kernels;
  *all_nodes = count;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) {
      kernels.push_back(node);
    }
  }
  return kernels;
}

}  // namespace

StatusOr<StageGraph> StageGraph::capture(StreamHandle stream, const StageSequence& stages) {
  GPUOPT_ASSIGN_OR_RETURN(cudaGraph_t graph, capture_graph(stream, stages));
  StageGraph result;
  result.graph_ = graph;  // owned from here on, freed by the destructor on error paths
  cudaGraphExec_t exec = nullptr;
  GPUOPT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  result.exec_ = exec;
  result.kernel_node_count_ = kernel_nodes(graph, &result.node_count_).size();
  return result;
}

StageGraph::~StageGraph() {
  if (exec_ != nullptr)
    GPUOPT_CUDA_TRY_NO_THROW(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  if (graph_ != nullptr)
    GPUOPT_CUDA_TRY_NO_THROW(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
}

Status StageGraph::replay(StreamHandle stream) const {
  if (exec_ == nullptr) return failed_precondition("StageGraph::replay: no captured graph");
  if (stream == nullptr) return invalid_argument("StageGraph::replay: null stream");
  return GPUOPT_CUDA_STATUS(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream)));
}

Status StageGraph::update(StreamHandle stream, const StageSequence& stages) {
  if (exec_ == nullptr) return failed_precondition("StageGraph::update: no captured graph");
  GPUOPT_ASSIGN_OR_RETURN(cudaGraph_t graph, capture_graph(stream, stages));
  cudaGraphExecUpdateResultInfo info{};
  cudaError_t error = cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(exec_), graph, &info);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    cudaGraphDestroy(graph);
    return failed_precondition(fmt::format(
        "StageGraph::update: the new capture does not match the instantiated graph ({}, update "
        "result {}): capture a new StageGraph when the stage topology changes",
        cudaGetErrorName(error), static_cast<int>(info.result)));
  }
  // Keep the newest graph so later set_kernel_args finds the nodes the exec now mirrors.
  cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  graph_ = graph;
  return ok_status();
}

Status StageGraph::set_kernel_args(const void* kernel_function, void** args) {
  if (exec_ == nullptr) return failed_precondition("StageGraph::set_kernel_args: no graph");
  std::size_t all = 0;
  cudaGraphNode_t match = nullptr;
  int matches = 0;
  for (cudaGraphNode_t node : kernel_nodes(static_cast<cudaGraph_t>(graph_), &all)) {
    cudaKernelNodeParams params{};
    GPUOPT_CUDA_TRY(cudaGraphKernelNodeGetParams(node, &params));
    if (params.func == kernel_function) {
      match = node;
      ++matches;
    }
  }
  if (matches != 1) {
    return failed_precondition(fmt::format(
        "StageGraph::set_kernel_args: the kernel runs in {} nodes; exactly one is needed (use "
        "update() to change several)",
        matches));
  }
  cudaKernelNodeParams params{};
  GPUOPT_CUDA_TRY(cudaGraphKernelNodeGetParams(match, &params));
  params.kernelParams = args;
  params.extra = nullptr;
  GPUOPT_CUDA_TRY(
      cudaGraphExecKernelNodeSetParams(static_cast<cudaGraphExec_t>(exec_), match, &params));
  // The template graph keeps the new arguments too, so a later update() starts from them.
  GPUOPT_CUDA_TRY(cudaGraphKernelNodeSetParams(match, &params));
  return ok_status();
}

#else  // !GPUOPT_CUDA

StatusOr<StageGraph> StageGraph::capture(StreamHandle, const StageSequence&) {
  return unimplemented("StageGraph::capture: gpuopt was built without CUDA");
}
StageGraph::~StageGraph() = default;
Status StageGraph::replay(StreamHandle) const {
  return unimplemented("StageGraph::replay: gpuopt was built without CUDA");
}
Status StageGraph::update(StreamHandle, const StageSequence&) {
  return unimplemented("StageGraph::update: gpuopt was built without CUDA");
}
Status StageGraph::set_kernel_args(const void*, void**) {
  return unimplemented("StageGraph::set_kernel_args: gpuopt was built without CUDA");
}

#endif  // GPUOPT_CUDA

}  // namespace gpuopt::runtime
