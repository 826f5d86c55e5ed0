// step_sync: what one dependent step costs on this GPU when the steps are separate kernels (in a
// CUDA graph, with and without programmatic dependent launch) and when they are phases of one
// persistent kernel separated by a grid-wide barrier. Each step does one dependent round trip: a
// block reads the value another block wrote in the step before and writes it plus one, so the
// chain is checked at the end. A reference for the LLM decoder's step (docs/llm.md), which is a
// chain of such kernels; it shares no code with gpuopt.
//
//   step_sync [--blocks-per-sm N] [--steps N] [--repeats N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

#define CHECK(call)                                                                          \
  do {                                                                                       \
    const cudaError_t error_ = (call);                                                       \
    if (error_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "step_sync: %s failed: %s\n", #call, cudaGetErrorString(error_)); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

constexpr int kThreads = 128;

// One step as a kernel: block b reads what block b + 1 wrote into the other half last step.
__global__ void __launch_bounds__(kThreads) k_step(int* buffers, int step, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (threadIdx.x == 0) {
    const int* from = buffers + (step & 1) * blocks;
    int* to = buffers + ((step + 1) & 1) * blocks;
    to[blockIdx.x] = from[(blockIdx.x + 1) % blocks] + 1;
  }
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The same steps as phases of one kernel (launched cooperatively, so every block is resident),
// a grid-wide barrier between them: a counter and a generation word, the last block to arrive
// resets the counter and publishes the next generation.
__global__ void __launch_bounds__(kThreads)
    k_persistent(int* buffers, int steps, unsigned* counter, unsigned* generation) {
  const int blocks = static_cast<int>(gridDim.x);
  for (int step = 0; step < steps; ++step) {
    if (threadIdx.x == 0) {
      const volatile int* from = buffers + (step & 1) * blocks;
      int* to = buffers + ((step + 1) & 1) * blocks;
      to[blockIdx.x] = from[(blockIdx.x + 1) % blocks] + 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned seen = load_acquire(generation);
      __threadfence();
      if (atomicAdd(counter, 1u) == static_cast<unsigned>(blocks) - 1) {
        *counter = 0;
        store_release(generation, seen + 1);
      } else {
        while (load_acquire(generation) == seen) {
        }
      }
    }
    __syncthreads();
  }
}

// After `steps` steps from all zeros every block's value is `steps`.
int check_chain(const int* device_buffers, int blocks, int steps, const char* what) {
  std::vector<int> host(2 * static_cast<std::size_t>(blocks));
  CHECK(cudaMemcpy(host.data(), device_buffers, host.size() * sizeof(int), cudaMemcpyDeviceToHost));
  const int* last = host.data() + (steps & 1) * blocks;
  for (int b = 0; b < blocks; ++b) {
    if (last[b] != steps) {
      std::fprintf(stderr, "step_sync: %s: block %d holds %d after %d steps\n", what, b, last[b],
                   steps);
      return 1;
    }
  }
  return 0;
}

int parse(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int blocks_per_sm = parse(argc, argv, "--blocks-per-sm", 3);
  const int steps = parse(argc, argv, "--steps", 84);
  const int repeats = parse(argc, argv, "--repeats", 200);
  if (blocks_per_sm < 1 || steps < 1 || repeats < 1) {
    std::fprintf(stderr, "step_sync: --blocks-per-sm, --steps and --repeats must be >= 1\n");
    return 2;
  }
  int device = 0, sms = 0, major = 0, cooperative = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, k_persistent, kThreads, 0));
  const int blocks = std::min(blocks_per_sm, resident) * sms;
  int* buffers = nullptr;
  unsigned* barrier = nullptr;
  CHECK(cudaMalloc(&buffers, 2 * sizeof(int) * blocks));
  CHECK(cudaMalloc(&barrier, 2 * sizeof(unsigned)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::printf("step_sync: %d blocks x %d threads on %d SMs, %d steps, %d repeats\n", blocks,
              kThreads, sms, steps, repeats);

  // Steps as kernels in one graph, with and without programmatic dependent launch (sm_90).
  for (const bool programmatic : {true, false}) {
    if (programmatic && major < 9) {
      std::printf("step_sync: kernel per step, programmatic launch: skipped (sm_%d0)\n", major);
      continue;
    }
    CHECK(cudaMemsetAsync(buffers, 0, 2 * sizeof(int) * blocks, stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int step = 0; step < steps; ++step) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(blocks);
      config.blockDim = dim3(kThreads);
      config.stream = stream;
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = programmatic ? attribute : nullptr;
      config.numAttrs = programmatic ? 1 : 0;
      CHECK(cudaLaunchKernelEx(&config, k_step, buffers, step, blocks));
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, stream));  // the chain check: one replay from zeros
    CHECK(cudaStreamSynchronize(stream));
    if (check_chain(buffers, blocks, steps, "kernel per step") != 0) return 1;
    for (int w = 0; w < 3; ++w) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < repeats; ++r) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf(
        "step_sync: kernel per step in a CUDA graph, programmatic launch %s: %.3f us a step\n",
        programmatic ? "on" : "off", 1e3 * ms / (static_cast<double>(repeats) * steps));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }

  // Steps as phases of one persistent kernel.
  if (cooperative == 0) {
    std::printf("step_sync: grid barrier: skipped (no cooperative launch)\n");
  } else {
    int steps_arg = steps;
    unsigned* counter = barrier;
    unsigned* generation = barrier + 1;
    void* args[] = {&buffers, &steps_arg, &counter, &generation};
    CHECK(cudaMemsetAsync(buffers, 0, 2 * sizeof(int) * blocks, stream));
    CHECK(cudaMemsetAsync(barrier, 0, 2 * sizeof(unsigned), stream));
    CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_persistent), dim3(blocks),
                                      dim3(kThreads), args, 0, stream));
    CHECK(cudaStreamSynchronize(stream));
    if (check_chain(buffers, blocks, steps, "grid barrier") != 0) return 1;
    for (int w = 0; w < 3; ++w) {
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_persistent), dim3(blocks),
                                        dim3(kThreads), args, 0, stream));
    }
    CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < repeats; ++r) {
      CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_persistent), dim3(blocks),
                                        dim3(kThreads), args, 0, stream));
    }
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("step_sync: grid barrier in one persistent kernel: %.3f us a step\n",
                1e3 * ms / (static_cast<double>(repeats) * steps));
  }
  CHECK(cudaFree(buffers));
  CHECK(cudaFree(barrier));
  return 0;
}
