// Uses the installed gpuopt: creates a vector store in a temporary directory, adds vectors, and
// checks that an exact query returns the nearest ones found by brute force here. Exit 0 on success.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpuopt/vector/store.hpp"
#include "gpuopt/version.hpp"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "gpuopt_consumer: FAIL: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main() {
  if (std::string(gpuopt::build_info::kVersion) != PACKAGE_VERSION) {
    return fail(std::string("gpuopt/version.hpp says ") + gpuopt::build_info::kVersion +
                ", the package " + PACKAGE_VERSION);
  }
  std::string pattern =
      (std::filesystem::temp_directory_path() / "gpuopt-consumer-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return fail("cannot create a temporary directory");
  const std::filesystem::path directory = pattern;
  struct Cleanup {
    std::filesystem::path path;
    ~Cleanup() { std::filesystem::remove_all(path); }
  } cleanup{directory};

  gpuopt::vector::OpenOptions open_options;
  open_options.create = true;
  auto store = gpuopt::vector::Store::open(directory / "store", open_options);
  if (!store.ok()) return fail(store.status().to_string());
  const std::size_t dim = 16, rows = 200, k = 5;
  auto collection = (*store)->create_collection("points", {dim, gpuopt::vector::Metric::kL2});
  if (!collection.ok()) return fail(collection.status().to_string());

  std::mt19937 rng(11);
  std::normal_distribution<float> value;
  std::vector<float> vectors(rows * dim);
  for (float& x : vectors) x = value(rng);
  std::vector<std::uint64_t> ids(rows);
  std::iota(ids.begin(), ids.end(), 1000);
  if (auto status = (*collection)->add(ids, vectors.data()); !status.ok()) {
    return fail(status.to_string());
  }
  std::vector<float> query(dim);
  for (float& x : query) x = value(rng);
  gpuopt::vector::QueryOptions query_options;
  query_options.k = k;
  auto results = (*collection)->query(query.data(), 1, query_options);
  if (!results.ok()) return fail(results.status().to_string());

  // Brute force in double precision. A hit must be at the i-th smallest distance (up to float
  // rounding, so that two points at the same distance may come in either order).
  std::vector<double> distance_of(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    double distance = 0;
    for (std::size_t t = 0; t < dim; ++t) {
      double d = double(query[t]) - double(vectors[r * dim + t]);
      distance += d * d;
    }
    distance_of[r] = distance;
  }
  std::vector<double> sorted = distance_of;
  std::sort(sorted.begin(), sorted.end());
  const auto& hits = (*results)[0];
  if (hits.size() != k) return fail("expected " + std::to_string(k) + " hits");
  for (std::size_t i = 0; i < k; ++i) {
    if (hits[i].id < ids.front() || hits[i].id > ids.back()) {
      return fail("hit " + std::to_string(i) + " has unknown id " + std::to_string(hits[i].id));
    }
    double distance = distance_of[hits[i].id - ids.front()];
    if (std::abs(distance - sorted[i]) > 1e-4 * (1.0 + sorted[i])) {
      return fail("hit " + std::to_string(i) + " (id " + std::to_string(hits[i].id) +
                  ") is at distance " + std::to_string(distance) + ", brute force's " +
                  std::to_string(i) + "th nearest at " + std::to_string(sorted[i]));
    }
  }
  std::printf("gpuopt_consumer: gpuopt %s, %zu nearest of %zu found as brute force does\n",
              gpuopt::build_info::kVersion, k, rows);
  return 0;
}
