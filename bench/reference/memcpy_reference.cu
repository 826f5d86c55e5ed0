// Reference for `gpuopt bench pcie`: the plainest way to time host<->device copies (pinned
// cudaMallocHost memory, one cudaMemcpyAsync between two events, median of samples). It shares no
// code with gpuopt on purpose, so a bug in gpuopt's timing cannot hide in both.
//   memcpy_reference [--sizes 268435456,1073741824] [--samples 20] > reference.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                    \
  do {                                                                 \
    cudaError_t error_ = (call);                                       \
    if (error_ != cudaSuccess) {                                       \
      std::fprintf(stderr, "memcpy_reference: %s failed: %s\n", #call, \
                   cudaGetErrorString(error_));                        \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

static double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {256ull << 20, 1ull << 30};
  int samples = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--samples") == 0) {
      samples = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      std::string list = argv[i + 1];
      size_t start = 0;
      while (start < list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        sizes.push_back(std::strtoull(list.substr(start, comma - start).c_str(), nullptr, 10));
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: memcpy_reference [--sizes BYTES,...] [--samples N]\n");
      return 2;
    }
  }
  if (samples < 1 || sizes.empty()) return 2;
  size_t largest = *std::max_element(sizes.begin(), sizes.end());
  void* host = nullptr;
  void* device = nullptr;
  CHECK(cudaMallocHost(&host, largest));
  CHECK(cudaMalloc(&device, largest));
  std::memset(host, 1, largest);
  CHECK(cudaMemset(device, 2, largest));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  cudaDeviceProp properties;
  CHECK(cudaGetDeviceProperties(&properties, 0));

  std::printf("{\n  \"program\": \"memcpy_reference\",\n  \"device\": \"%s\",\n", properties.name);
  std::printf("  \"method\": \"cudaMallocHost + one cudaMemcpyAsync between two events\",\n");
  std::printf("  \"samples\": %d,\n  \"results\": [\n", samples);
  bool first = true;
  for (int direction = 0; direction < 2; ++direction) {
    for (size_t bytes : sizes) {
      std::vector<double> gbps;
      for (int i = -2; i < samples; ++i) {  // two warm-up copies
        CHECK(cudaEventRecord(start, stream));
        if (direction == 0) {
          CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
        } else {
          CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
        }
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (i >= 0) gbps.push_back(bytes / (ms * 1e-3) / 1e9);
      }
      std::printf(
          "%s    {\"direction\": \"%s\", \"bytes\": %zu, \"median_gbps\": %.4f, "
          "\"min_gbps\": %.4f, \"max_gbps\": %.4f}",
          first ? "" : ",\n", direction == 0 ? "host_to_device" : "device_to_host", bytes,
          median(gbps), *std::min_element(gbps.begin(), gbps.end()),
          *std::max_element(gbps.begin(), gbps.end()));
      first = false;
    }
  }
  std::printf("\n  ]\n}\n");
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(device));
  CHECK(cudaFreeHost(host));
  return 0;
}
