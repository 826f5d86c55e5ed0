// Shared by the vector store tests: a temporary directory removed with everything in it, seeded
// normal random vectors, and consecutive ids.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

namespace gpuopt::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "gpuopt-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<float> random_vectors(std::size_t rows, std::size_t dim, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(rows * dim);
  for (auto& x : v) x = normal(rng);
  return v;
}

inline std::vector<std::uint64_t> id_range(std::uint64_t first, std::size_t count) {
  std::vector<std::uint64_t> ids(count);
  for (std::size_t i = 0; i < count; ++i) ids[i] = first + i;
  return ids;
}

}  // namespace gpuopt::testing
