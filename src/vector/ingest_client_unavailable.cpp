// IngestClient::add_device in a build without CUDA: UNIMPLEMENTED.
#include "gpuopt/vector/ingest.hpp"

namespace gpuopt::vector {

StatusOr<std::uint64_t> IngestClient::add_device(const std::string&, std::span<const std::uint64_t>,
                                                 const float*, std::size_t, bool) {
  return unimplemented("IngestClient::add_device: gpuopt was built without CUDA");
}

}  // namespace gpuopt::vector
