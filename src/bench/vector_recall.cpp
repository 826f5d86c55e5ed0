// Data, exact ground truth and recall for `gpuopt bench vector`: the parts the unit tests pin down
// on hand-computed fixtures, kept apart from the timing code.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <queue>
#include <random>
#include <thread>
#include <unordered_set>
#include <utility>

#include "gpuopt/bench/vector.hpp"
#include "gpuopt/vector/vector_file.hpp"

namespace gpuopt::bench::vector_bench {
namespace {

namespace fs = std::filesystem;

// Squared L2 in float64; four partial sums so the loop is not one long dependency chain.
double squared_distance_f64(const float* a, const float* b, std::size_t dim) {
  double sums[4] = {0, 0, 0, 0};
  std::size_t j = 0;
  for (; j + 4 <= dim; j += 4) {
    for (std::size_t l = 0; l < 4; ++l) {
      double d = static_cast<double>(a[j + l]) - static_cast<double>(b[j + l]);
      sums[l] += d * d;
    }
  }
  for (; j < dim; ++j) {
    double d = static_cast<double>(a[j]) - static_cast<double>(b[j]);
    sums[0] += d * d;
  }
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

std::size_t default_query_rows(const VectorBenchOptions& options, bool quick) {
  if (options.queries != 0) return options.queries;
  return quick ? 200 : 1000;
}

std::size_t default_base_rows(const VectorBenchOptions& options, bool quick) {
  if (options.base_rows != 0) return options.base_rows;
  return quick ? 20000 : 0;
}

}  // namespace

Dataset synthetic_dataset(std::size_t base_rows, std::size_t query_rows, std::size_t dim,
                          std::uint64_t seed) {
  // Clustered rather than uniform: IVF on structureless data measures nothing useful.
  const std::size_t clusters = 64;
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centers(clusters * dim);
  for (float& value : centers) value = 3.0f * normal(generator);
  std::uniform_int_distribution<std::size_t> pick(0, clusters - 1);
  auto fill = [&](std::vector<float>& out, std::size_t rows) {
    out.resize(rows * dim);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* center = &centers[pick(generator) * dim];
      for (std::size_t j = 0; j < dim; ++j) out[r * dim + j] = center[j] + normal(generator);
    }
  };
  Dataset data;
  data.name = "synthetic";
  data.dim = dim;
  data.base_rows = base_rows;
  data.query_rows = query_rows;
  fill(data.base, base_rows);
  fill(data.queries, query_rows);
  return data;
}

StatusOr<Dataset> load_dataset(const VectorBenchOptions& options, bool quick) {
  const std::size_t query_rows = default_query_rows(options, quick);
  const std::size_t base_limit = default_base_rows(options, quick);
  if (options.k == 0) return invalid_argument("bench vector: --k must be at least 1");
  if (query_rows == 0) return invalid_argument("bench vector: --queries must be at least 1");

  const fs::path fashion(kFashionMnistDir);
  const fs::path fashion_train = fashion / "train-images-idx3-ubyte.gz";
  const fs::path fashion_test = fashion / "t10k-images-idx3-ubyte.gz";
  Dataset data;
  if (!options.data_path.empty()) {
    // Without a query file the last rows of the data file are the queries.
    const bool split = options.queries_path.empty();
    std::size_t read_rows = base_limit == 0 ? 0 : base_limit + (split ? query_rows : 0);
    GPUOPT_ASSIGN_OR_RETURN(auto base, vector::read_vector_file(options.data_path, read_rows));
    data.name = fs::path(options.data_path).filename().string();
    data.dim = base.dim;
    if (split) {
      if (base.rows <= query_rows) {
        return invalid_argument(
            fmt::format("bench vector: {} has {} rows, fewer than the {} "
                        "queries split from it plus one base row",
                        options.data_path, base.rows, query_rows));
      }
      data.base_rows = base.rows - query_rows;
      data.query_rows = query_rows;
      data.queries.assign(base.values.begin() + data.base_rows * base.dim, base.values.end());
      base.values.resize(data.base_rows * base.dim);
      data.base = std::move(base.values);
    } else {
      GPUOPT_ASSIGN_OR_RETURN(auto queries,
                              vector::read_vector_file(options.queries_path, query_rows));
      if (queries.dim != base.dim) {
        return invalid_argument(fmt::format("bench vector: {} has dimension {}, {} has {}",
                                            options.queries_path, queries.dim, options.data_path,
                                            base.dim));
      }
      data.base_rows = base.rows;
      data.base = std::move(base.values);
      data.query_rows = queries.rows;
      data.queries = std::move(queries.values);
    }
  } else if (!options.synthetic && fs::exists(fashion_train) && fs::exists(fashion_test)) {
    // ann-benchmarks' fashion-mnist-784-euclidean: the 60k training images are the base, the
    // test images the queries.
    GPUOPT_ASSIGN_OR_RETURN(auto base, vector::read_vector_file(fashion_train, base_limit));
    GPUOPT_ASSIGN_OR_RETURN(auto queries, vector::read_vector_file(fashion_test, query_rows));
    data.name = "fashion-mnist";
    data.dim = base.dim;
    data.base_rows = base.rows;
    data.base = std::move(base.values);
    data.query_rows = queries.rows;
    data.queries = std::move(queries.values);
  } else {
    data =
        synthetic_dataset(base_limit == 0 ? 100000 : base_limit, query_rows, options.synthetic_dim);
  }
  if (data.base_rows < options.k) {
    return invalid_argument(fmt::format("bench vector: {} has {} base rows, fewer than k = {}",
                                        data.name, data.base_rows, options.k));
  }
  return data;
}

GroundTruth brute_force_truth(const float* base, std::size_t base_rows, std::size_t dim,
                              const float* queries, std::size_t query_rows, std::size_t k,
                              int threads) {
  GroundTruth truth;
  truth.k = k;
  truth.query_rows = query_rows;
  truth.ids.assign(query_rows * k, ~std::uint64_t{0});
  truth.distances.assign(query_rows * k, INFINITY);
  const std::size_t kept = std::min(k, base_rows);
  auto work = [&](std::size_t first, std::size_t last) {
    // Max-heap on (distance, row): the top is the worst kept; ties keep the lower row.
    using Entry = std::pair<double, std::uint64_t>;
    std::priority_queue<Entry> heap;
    for (std::size_t q = first; q < last; ++q) {
      const float* query = queries + q * dim;
      for (std::size_t r = 0; r < base_rows; ++r) {
        Entry entry{squared_distance_f64(query, base + r * dim, dim), r};
        if (heap.size() < kept) {
          heap.push(entry);
        } else if (entry < heap.top()) {
          heap.pop();
          heap.push(entry);
        }
      }
      for (std::size_t i = heap.size(); i-- > 0;) {
        truth.ids[q * k + i] = heap.top().second;
        truth.distances[q * k + i] = std::sqrt(heap.top().first);
        heap.pop();
      }
    }
  };
  const std::size_t workers =
      std::max<std::size_t>(1, std::min<std::size_t>(resolve_threads(threads), query_rows));
  std::vector<std::thread> pool;
  const std::size_t per = (query_rows + workers - 1) / workers;
  for (std::size_t w = 0; w < workers; ++w) {
    std::size_t first = w * per, last = std::min(query_rows, first + per);
    if (first < last) pool.emplace_back(work, first, last);
  }
  for (auto& thread : pool) thread.join();
  return truth;
}

FoundIds ids_of(const vector::SearchResults& results) {
  FoundIds found(results.size());
  for (std::size_t q = 0; q < results.size(); ++q) {
    for (const auto& hit : results[q]) found[q].push_back(hit.id);
  }
  return found;
}

double recall_id_overlap(const FoundIds& found, const GroundTruth& truth) {
  if (truth.query_rows == 0 || truth.k == 0) return 0;
  std::size_t hits = 0;
  for (std::size_t q = 0; q < truth.query_rows && q < found.size(); ++q) {
    std::unordered_set<std::uint64_t> expected(truth.ids.begin() + q * truth.k,
                                               truth.ids.begin() + (q + 1) * truth.k);
    std::unordered_set<std::uint64_t> seen;
    for (std::size_t i = 0; i < found[q].size() && i < truth.k; ++i) {
      // A duplicate id in an answer counts once: it is one neighbour, not two.
      if (expected.count(found[q][i]) && seen.insert(found[q][i]).second) ++hits;
    }
  }
  return static_cast<double>(hits) / static_cast<double>(truth.query_rows * truth.k);
}

double recall_distance_rule(const FoundIds& found, const GroundTruth& truth, const float* base,
                            std::size_t base_rows, std::size_t dim, const float* queries,
                            double epsilon) {
  if (truth.query_rows == 0 || truth.k == 0) return 0;
  std::size_t hits = 0;
  for (std::size_t q = 0; q < truth.query_rows && q < found.size(); ++q) {
    const double threshold = truth.distances[q * truth.k + truth.k - 1] + epsilon;
    for (std::size_t i = 0; i < found[q].size() && i < truth.k; ++i) {
      std::uint64_t id = found[q][i];
      if (id >= base_rows) continue;  // not a row of the data: never a neighbour
      double distance = std::sqrt(squared_distance_f64(queries + q * dim, base + id * dim, dim));
      if (distance <= threshold) ++hits;
    }
  }
  return static_cast<double>(hits) / static_cast<double>(truth.query_rows * truth.k);
}

double peak_rss_mib() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

}  // namespace gpuopt::bench::vector_bench
