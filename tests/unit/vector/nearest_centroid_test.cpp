// The k-means assignment kernel (nearest_centroids: a blocked GEMM with the dispatched x86 tile,
// and its portable twin) against brute-force distances in double precision, and kmeans_cpu against
// a naive Lloyd step written here. Shapes straddle the register tile (12 x 32, 6 x 16, 6 x 8), the
// 96-row task, the 256-wide dimension block and the 512-centroid block, and the 16-row cut-over to
// exact_scan.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpuopt/core/cancel.hpp"
#include "vector/search_kernels.hpp"

namespace gpuopt::vector::detail {
namespace {

using NearestFunction = void (*)(const float*, std::size_t, const float*, const float*, std::size_t,
                                 std::size_t, std::uint32_t*, float*, int, const CancelToken*);

const std::pair<NearestFunction, const char*> kKernels[] = {
    {nearest_centroids, "nearest_centroids"},
    {nearest_centroids_portable, "nearest_centroids_portable"}};

std::vector<float> random_floats(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> out(count);
  for (float& x : out) x = value(rng);
  return out;
}

double squared_distance(const float* a, const float* b, std::size_t dim) {
  double sum = 0;
  for (std::size_t t = 0; t < dim; ++t) {
    double d = double(a[t]) - double(b[t]);
    sum += d * d;
  }
  return sum;
}

double squared_norm(const float* a, std::size_t dim) {
  double sum = 0;
  for (std::size_t t = 0; t < dim; ++t) sum += double(a[t]) * double(a[t]);
  return sum;
}

// Each row's chosen centroid must be nearest up to float rounding: |q|^2 + |c|^2 - 2<q, c> in
// float is within (dim + 2) * eps * (|q|^2 + |c|^2 + 2 sum|q_t c_t|) <= 2 (dim + 2) eps (|q|^2 +
// |c|^2) of the exact distance, so the chosen distance exceeds the true minimum by at most twice
// that. The reported distance must be the chosen centroid's within the same bound.
void expect_nearest(NearestFunction kernel, const char* name, std::size_t count, std::size_t nlist,
                    std::size_t dim, int threads, std::mt19937& rng) {
  std::vector<float> rows = random_floats(count * dim, rng);
  std::vector<float> centroids = random_floats(nlist * dim, rng);
  std::vector<float> norms(nlist);
  squared_norms(centroids.data(), nlist, dim, norms.data());
  std::vector<std::uint32_t> lists(count, 0xFFFFFFFFu);
  std::vector<float> distances(count, std::numeric_limits<float>::quiet_NaN());
  kernel(rows.data(), count, centroids.data(), norms.data(), nlist, dim, lists.data(),
         distances.data(), threads, nullptr);
  double max_centroid_norm = 0;
  for (std::size_t c = 0; c < nlist; ++c) {
    max_centroid_norm = std::max(max_centroid_norm, squared_norm(&centroids[c * dim], dim));
  }
  for (std::size_t i = 0; i < count; ++i) {
    const float* row = &rows[i * dim];
    ASSERT_LT(lists[i], nlist) << name << ": row " << i;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < nlist; ++c) {
      best = std::min(best, squared_distance(row, &centroids[c * dim], dim));
    }
    const double chosen = squared_distance(row, &centroids[lists[i] * dim], dim);
    const double error =
        2.0 * double(dim + 2) * FLT_EPSILON * (squared_norm(row, dim) + max_centroid_norm) + 1e-6;
    ASSERT_LE(chosen, best + 2 * error)
        << name << ": row " << i << " of " << count << " x " << nlist << " centroids, dim " << dim
        << " chose list " << lists[i];
    ASSERT_NEAR(distances[i], chosen, error) << name << ": row " << i << ", dim " << dim;
  }
}

TEST(NearestCentroids, MatchBruteForceDistancesAcrossTileEdges) {
  std::mt19937 rng(20261204);
  struct Shape {
    std::size_t count, nlist, dim;
  };
  const Shape shapes[] = {{1, 1, 1},      {15, 7, 5},    {16, 1, 3},     {17, 33, 17},
                          {95, 31, 8},    {96, 32, 16},  {97, 65, 33},   {200, 17, 255},
                          {130, 40, 256}, {101, 9, 257}, {193, 513, 20}, {250, 600, 784},
                          {40, 1030, 64}};
  for (const auto& [kernel, name] : kKernels) {
    for (const Shape& shape : shapes) {
      for (int threads : {1, 2}) {
        expect_nearest(kernel, name, shape.count, shape.nlist, shape.dim, threads, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Rows near one centroid each (its index is known) find exactly that centroid, and a centroid
// duplicated at a higher index never wins the tie.
TEST(NearestCentroids, FindTheCentroidEachRowWasDrawnAroundAndBreakTiesLow) {
  std::mt19937 rng(11);
  const std::size_t nlist = 70, dim = 300, count = 500;
  std::vector<float> centroids = random_floats(nlist * dim, rng);
  // Centroid 69 duplicates centroid 3, 68 duplicates 40.
  std::copy_n(&centroids[3 * dim], dim, &centroids[69 * dim]);
  std::copy_n(&centroids[40 * dim], dim, &centroids[68 * dim]);
  std::vector<float> norms(nlist);
  squared_norms(centroids.data(), nlist, dim, norms.data());
  std::vector<float> rows(count * dim);
  std::vector<std::uint32_t> expected(count);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t c = static_cast<std::uint32_t>(rng() % nlist);
    if (c == 69) c = 3;
    if (c == 68) c = 40;
    expected[i] = c;
    for (std::size_t t = 0; t < dim; ++t) rows[i * dim + t] = centroids[c * dim + t] + noise(rng);
  }
  // An exact copy of a duplicated centroid: the distance is 0 (or rounds to it) at both indices.
  std::copy_n(&centroids[3 * dim], dim, &rows[0]);
  expected[0] = 3;
  for (const auto& [kernel, name] : kKernels) {
    for (std::size_t n : {count, std::size_t{5}}) {
      std::vector<std::uint32_t> lists(n, 0xFFFFFFFFu);
      kernel(rows.data(), n, centroids.data(), norms.data(), nlist, dim, lists.data(), nullptr, 2,
             nullptr);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(lists[i], expected[i]) << name << ": row " << i << " of " << n;
      }
    }
  }
}

TEST(NearestCentroids, ReturnsEarlyOnceCancelled) {
  std::mt19937 rng(5);
  const std::size_t count = 1000, nlist = 64, dim = 32;
  std::vector<float> rows = random_floats(count * dim, rng);
  std::vector<float> centroids = random_floats(nlist * dim, rng);
  std::vector<float> norms(nlist);
  squared_norms(centroids.data(), nlist, dim, norms.data());
  CancelToken token;
  token.cancel();
  std::vector<std::uint32_t> lists(count, 0xFFFFFFFFu);
  nearest_centroids(rows.data(), count, centroids.data(), norms.data(), nlist, dim, lists.data(),
                    nullptr, 2, &token);
  for (std::uint32_t list : lists) ASSERT_EQ(list, 0xFFFFFFFFu);
}

// Lloyd's k-means as its definition reads: seeds are the first nlist rows; each iteration assigns
// every row to its nearest centroid by double-precision distance (ties low) and moves each
// centroid to the mean of its rows, summed in double in row order as kmeans_cpu does.
std::vector<float> naive_kmeans(const std::vector<float>& rows, std::size_t count, std::size_t dim,
                                std::size_t nlist, int iterations) {
  std::vector<float> centroids(rows.begin(), rows.begin() + nlist * dim);
  for (int iteration = 0; iteration < iterations; ++iteration) {
    std::vector<double> sums(nlist * dim, 0.0);
    std::vector<std::size_t> counts(nlist, 0);
    for (std::size_t i = 0; i < count; ++i) {
      std::size_t best = 0;
      double best_distance = std::numeric_limits<double>::infinity();
      for (std::size_t c = 0; c < nlist; ++c) {
        double d = squared_distance(&rows[i * dim], &centroids[c * dim], dim);
        if (d < best_distance) {
          best_distance = d;
          best = c;
        }
      }
      for (std::size_t t = 0; t < dim; ++t) sums[best * dim + t] += rows[i * dim + t];
      ++counts[best];
    }
    for (std::size_t c = 0; c < nlist; ++c) {
      if (counts[c] == 0) continue;  // the fixture has no empty list (every seed is a row)
      for (std::size_t t = 0; t < dim; ++t) {
        centroids[c * dim + t] = static_cast<float>(sums[c * dim + t] / double(counts[c]));
      }
    }
  }
  return centroids;
}

// Clustered data (a clear nearest centroid for every row), so float and double assignments agree
// and the centroids must match the naive ones exactly. 3000 x 200 takes the parallel update.
TEST(NearestCentroids, KmeansMatchesANaiveLloydStep) {
  std::mt19937 rng(99);
  const std::size_t dim = 200, count = 3000, centres = 24, nlist = 24;
  std::vector<float> centre_points = random_floats(centres * dim, rng);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> rows(count * dim);
  // The first nlist rows (the seeds) come one from each centre.
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t centre = i < nlist ? i : rng() % centres;
    for (std::size_t t = 0; t < dim; ++t) {
      rows[i * dim + t] = centre_points[centre * dim + t] * 4.0f + noise(rng);
    }
  }
  for (int iterations : {1, 3}) {
    std::vector<float> expected = naive_kmeans(rows, count, dim, nlist, iterations);
    for (int threads : {1, 2}) {
      std::vector<float> got = kmeans_cpu(rows.data(), count, dim, nlist, iterations, threads);
      ASSERT_EQ(got.size(), expected.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], expected[i]) << "centroid " << i / dim << ", coordinate " << i % dim
                                       << " after " << iterations << " iterations";
      }
      EXPECT_NEAR(
          kmeans_inertia(rows.data(), count, dim, got.data(), nlist, threads),
          [&] {
            double total = 0;
            for (std::size_t i = 0; i < count; ++i) {
              double best = std::numeric_limits<double>::infinity();
              for (std::size_t c = 0; c < nlist; ++c) {
                best = std::min(best, squared_distance(&rows[i * dim], &got[c * dim], dim));
              }
              total += best;
            }
            return total;
          }(),
          1e-6 * count);
    }
  }
}

}  // namespace
}  // namespace gpuopt::vector::detail
