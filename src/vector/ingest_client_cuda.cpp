// IngestClient::add_device: sends device vectors as a CUDA IPC handle
// (ingest_client_unavailable.cpp: without CUDA).
#include <cuda_runtime.h>

#include <cstring>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/ingest.hpp"

namespace gpuopt::vector {

StatusOr<std::uint64_t> IngestClient::add_device(const std::string& collection,
                                                 std::span<const std::uint64_t> ids,
                                                 const float* device_vectors, std::size_t dim,
                                                 bool upsert) {
  if (ids.empty()) return invalid_argument("add_device: no ids");
  cudaPointerAttributes attributes{};
  GPUOPT_CUDA_TRY(cudaPointerGetAttributes(&attributes, device_vectors));
  if (attributes.type != cudaMemoryTypeDevice) {
    return invalid_argument("add_device: the pointer is not cudaMalloc'd device memory");
  }
  // Handles name whole allocations; send the offset of our pointer inside its allocation.
  void* base = nullptr;
  std::size_t size = 0;
  using MemGetAddressRange = int (*)(unsigned long long*, std::size_t*, unsigned long long);
  auto range = reinterpret_cast<MemGetAddressRange>(driver_entry_point("cuMemGetAddressRange"));
  if (range == nullptr) return unavailable("the driver lacks cuMemGetAddressRange");
  unsigned long long range_base = 0;
  GPUOPT_CU_TRY(range(&range_base, &size, reinterpret_cast<unsigned long long>(device_vectors)));
  base = reinterpret_cast<void*>(range_base);
  cudaIpcMemHandle_t handle;
  GPUOPT_CUDA_TRY(cudaIpcGetMemHandle(&handle, base));
  IngestRequest request;
  request.op = upsert ? IngestOp::kUpsert : IngestOp::kAdd;
  request.payload = IngestPayload::kCudaIpc;
  request.collection = collection;
  request.dim = static_cast<std::uint32_t>(dim);
  request.rows = ids.size();
  request.request_id = next_request_id_++;
  request.cuda_device = attributes.device;
  static_assert(sizeof(handle) == sizeof(request.cuda_handle));
  std::memcpy(request.cuda_handle.data(), &handle, sizeof(handle));
  request.cuda_offset = reinterpret_cast<std::uint64_t>(device_vectors) - range_base;
  request.ids.assign(ids.begin(), ids.end());
  return round_trip(request);
}

}  // namespace gpuopt::vector
