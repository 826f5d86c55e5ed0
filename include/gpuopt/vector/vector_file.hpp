// Readers for the vector file formats the CLI imports and queries: fvecs (ann-benchmarks/TEXMEX),
// NumPy .npy (2-D, float32/float64/uint8, C order) and IDX (MNIST/Fashion-MNIST, optionally
// gzip'd). Every reader checks sizes before it reads and names the file and problem on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::vector {

struct VectorFile {
  std::size_t rows = 0;
  std::size_t dim = 0;
  std::vector<float> values;  // [rows, dim] row-major
  std::string format;         // "fvecs", "npy", "idx"
};

// Picks the format from the extension (.fvecs, .npy, .idx*, *-ubyte[.gz]) or the first bytes.
StatusOr<VectorFile> read_vector_file(const std::filesystem::path& path,
                                      std::size_t max_rows = 0 /* 0 = all */);

// Parsers over bytes already in memory (gzip already undone); `name` is used in messages.
StatusOr<VectorFile> parse_fvecs(std::span<const std::uint8_t> bytes, const std::string& name,
                                 std::size_t max_rows = 0);
StatusOr<VectorFile> parse_npy(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows = 0);
StatusOr<VectorFile> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows = 0);

// Writers used by tests and benchmarks.
Status write_fvecs(const std::filesystem::path& path, const float* values, std::size_t rows,
                   std::size_t dim);
Status write_npy(const std::filesystem::path& path, const float* values, std::size_t rows,
                 std::size_t dim);

}  // namespace gpuopt::vector
