// DeviceBuffer in a build without CUDA: every allocation and copy answers UNIMPLEMENTED.
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::runtime {

StatusOr<DeviceBuffer> DeviceBuffer::allocate(std::size_t) {
  return unimplemented("DeviceBuffer::allocate: gpuopt was built without CUDA");
}
StatusOr<DeviceBuffer> DeviceBuffer::allocate_async(std::size_t, StreamHandle) {
  return unimplemented("DeviceBuffer::allocate_async: gpuopt was built without CUDA");
}
Status DeviceBuffer::zero(StreamHandle) const {
  return unimplemented("DeviceBuffer::zero: gpuopt was built without CUDA");
}
Status DeviceBuffer::copy_from_host(const void*, std::size_t, StreamHandle) const {
  return unimplemented("DeviceBuffer::copy_from_host: gpuopt was built without CUDA");
}
Status DeviceBuffer::copy_to_host(void*, std::size_t, StreamHandle) const {
  return unimplemented("DeviceBuffer::copy_to_host: gpuopt was built without CUDA");
}
void DeviceBuffer::reset() {
  data_ = nullptr;
  bytes_ = 0;
  stream_ = nullptr;
}

}  // namespace gpuopt::runtime
