// libFuzzer target: the vector file readers (fvecs, bvecs, ivecs, npy, IDX) on arbitrary bytes.
// The first byte picks the format and the chunk size; the rest is the file. A reader that opens
// must never hand out more rows than its input can hold, nor values that are not finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "gpuopt/vector/vector_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuopt::vector;
  if (size < 1) return 0;
  static const VectorFormat kFormats[] = {VectorFormat::kDetect, VectorFormat::kFvecs,
                                          VectorFormat::kBvecs,  VectorFormat::kIvecs,
                                          VectorFormat::kNpy,    VectorFormat::kIdx};
  const VectorFormat format = kFormats[data[0] % 6];
  const std::size_t chunk = 1 + (data[0] >> 3);
  std::span<const std::uint8_t> bytes(data + 1, size - 1);
  auto reader = VectorReader::open_bytes(
      bytes, "fuzz.bin", {.format = format, .staging_bytes = std::size_t{1} + data[0]});
  if (!reader.ok()) return 0;
  const std::size_t dim = (*reader)->dim();
  if (dim == 0 || dim > 65536) std::abort();
  std::vector<float> out(chunk * dim);
  std::size_t total = 0;
  bool failed = false;
  while (true) {
    auto got = (*reader)->read(out.data(), chunk);
    if (!got.ok()) {
      failed = true;  // rows converted before the bad one in that call still count in rows_read
      break;
    }
    if (*got > chunk) std::abort();
    for (std::size_t i = 0; i < *got * dim; ++i) {
      if (!std::isfinite(out[i])) std::abort();
    }
    total += *got;
    // Every row takes at least one byte of input.
    if (total > bytes.size()) std::abort();
    if (*got == 0) break;
  }
  if (!failed && total != (*reader)->rows_read()) std::abort();
  if (total > (*reader)->rows_read()) std::abort();
  return 0;
}
