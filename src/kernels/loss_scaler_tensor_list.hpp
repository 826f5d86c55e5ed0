// Host planning of TensorListScaler: the per-call device table (one entry per non-empty tensor,
// with the prefix sum of chunk counts the kernels binary-search). Host-compilable, so the unit
// tests reach it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"

#if defined(__CUDACC__)
#define GPUOPT_TENSOR_LIST_HOST_DEVICE __host__ __device__
#else
#define GPUOPT_TENSOR_LIST_HOST_DEVICE
#endif

namespace gpuopt::kernels::detail {

// One tensor of the list as the kernels see it; copied raw to the device.
struct TensorEntry {
  char* data;
  std::uint64_t count;        // elements
  std::uint64_t first_chunk;  // chunks of the entries before this one
  std::uint32_t dtype;        // GradientDtype
  std::uint32_t chunk_elements;
  friend bool operator==(const TensorEntry&, const TensorEntry&) = default;
};
static_assert(sizeof(TensorEntry) == 32, "TensorEntry is copied raw between host and device");

struct TensorTable {
  std::vector<TensorEntry> entries;
  std::uint64_t chunk_count = 0;
};

// Validates every tensor (known dtype, non-null data, element alignment; an empty tensor is left
// out) and numbers its chunks of chunk_bytes / element size elements. Names the bad tensor.
inline StatusOr<TensorTable> build_tensor_table(std::span<const GradientTensor> gradients,
                                                std::size_t chunk_bytes) {
  TensorTable table;
  table.entries.reserve(gradients.size());
  for (std::size_t t = 0; t < gradients.size(); ++t) {
    const GradientTensor& tensor = gradients[t];
    const std::string where = "gradient tensor " + std::to_string(t);
    if (static_cast<unsigned>(tensor.dtype) > static_cast<unsigned>(GradientDtype::kFloat32)) {
      return invalid_argument(where + ": unknown dtype " +
                              std::to_string(static_cast<unsigned>(tensor.dtype)));
    }
    if (tensor.count == 0) continue;
    if (tensor.data == nullptr) {
      return invalid_argument(where + ": null data with " + std::to_string(tensor.count) +
                              " elements");
    }
    const std::size_t element = dtype_size(tensor.dtype);
    if (reinterpret_cast<std::uintptr_t>(tensor.data) % element != 0) {
      return invalid_argument(where + ": data not aligned to its " +
                              std::string(dtype_name(tensor.dtype)) + " element size");
    }
    TensorEntry entry{};
    entry.data = static_cast<char*>(tensor.data);
    entry.count = tensor.count;
    entry.first_chunk = table.chunk_count;
    entry.dtype = static_cast<std::uint32_t>(tensor.dtype);
    entry.chunk_elements = static_cast<std::uint32_t>(chunk_bytes / element);
    table.chunk_count += (tensor.count + entry.chunk_elements - 1) / entry.chunk_elements;
    table.entries.push_back(entry);
  }
  return table;
}

// The entry holding chunk `chunk` (the last entry whose first_chunk <= chunk), as the kernels
// find it; `chunk` must be below the table's chunk_count.
GPUOPT_TENSOR_LIST_HOST_DEVICE inline std::size_t entry_of_chunk(const TensorEntry* entries,
                                                                 std::size_t count,
                                                                 std::uint64_t chunk) {
  std::size_t low = 0, high = count;
  while (high - low > 1) {
    const std::size_t middle = (low + high) / 2;
    if (entries[middle].first_chunk <= chunk) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

}  // namespace gpuopt::kernels::detail
