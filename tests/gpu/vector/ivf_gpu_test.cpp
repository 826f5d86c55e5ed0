// IVF on the GPU against its CPU twins: k-means quality (inertia, not identical centroids), the
// assignment step, IVF search over the same lists and nprobe (same ids up to ties, every metric,
// allow masks), and Collection::query with the saved index on both engines with deletes, filters
// and rows written after the first GPU query.
#include "vector/ivf_gpu.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <set>

#include "common/test_support.hpp"
#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/store.hpp"
#include "vector/search_kernels.hpp"

#if GPUOPT_CUDA
namespace gpuopt::vector {
namespace {

using gpuopt::testing::id_range;
using gpuopt::testing::TempDir;

// `clusters` Gaussian blobs (unit spread, centres spread by 8) in `dim` dimensions.
std::vector<float> clustered(std::size_t rows, std::size_t dim, std::size_t clusters,
                             std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres(clusters * dim);
  for (auto& v : centres) v = 8.0f * normal(rng);
  std::uniform_int_distribution<std::size_t> pick(0, clusters - 1);
  std::vector<float> data(rows * dim);
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t c = pick(rng);
    for (std::size_t t = 0; t < dim; ++t) data[r * dim + t] = centres[c * dim + t] + normal(rng);
  }
  return data;
}

std::vector<float> norms_of(const std::vector<float>& data, std::size_t dim) {
  std::vector<float> norms(data.size() / dim);
  detail::squared_norms(data.data(), norms.size(), dim, norms.data());
  return norms;
}

TEST(GpuKmeans, InertiaMatchesTheCpuKmeans) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t rows = 20000, dim = 64, nlist = 64;
  auto data = clustered(rows, dim, 48, 11);
  auto norms = norms_of(data, dim);
  detail::RowBlock block{data.data(), norms.data(), rows, 0, nullptr};
  IvfParams params;
  params.nlist = nlist;
  auto sample = detail::ivf_training_sample({&block, 1}, dim, nlist, params);
  const std::size_t count = sample.size() / dim;
  auto cpu = detail::kmeans_cpu(sample.data(), count, dim, nlist, params.iterations, 0);
  auto kmeans = detail::GpuKmeans::create(dim, 0);
  ASSERT_TRUE(kmeans.ok()) << kmeans.status().to_string();
  auto gpu = (*kmeans)->train(sample.data(), count, nlist, params.iterations);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  ASSERT_EQ(gpu->size(), nlist * dim);
  const double cpu_inertia = detail::kmeans_inertia(data.data(), rows, dim, cpu.data(), nlist, 0);
  const double gpu_inertia = detail::kmeans_inertia(data.data(), rows, dim, gpu->data(), nlist, 0);
  // TF32 distances may pick a different centroid for near-ties, and the runs may settle in
  // different local minima: the GPU's objective is no more than 2% worse than the CPU's.
  EXPECT_LE(gpu_inertia / cpu_inertia, 1.02) << "cpu " << cpu_inertia << " gpu " << gpu_inertia;

  // The fp32 assignment: each row's chosen centroid is (up to rounding) its nearest one.
  std::vector<std::uint32_t> lists(rows);
  std::vector<float> distances(rows);
  ASSERT_TRUE((*kmeans)
                  ->assign(gpu->data(), nlist, data.data(), rows, lists.data(), distances.data())
                  .ok());
  auto index = detail::IvfFlat::with_centroids(*gpu, dim, Metric::kL2);
  std::vector<std::uint32_t> cpu_lists(rows);
  std::vector<float> cpu_distances(rows);
  index.nearest(data.data(), rows, cpu_lists.data(), cpu_distances.data(), 0);
  std::size_t differ = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    ASSERT_LT(lists[r], nlist);
    EXPECT_NEAR(distances[r], cpu_distances[r], 1e-3f * std::max(1.0f, cpu_distances[r]));
    differ += lists[r] != cpu_lists[r];
  }
  EXPECT_LE(differ, rows / 1000) << "assignments that differ from the CPU's (ties only)";
}

// Rank by rank the distances agree; ids agree wherever the distance is not tied within rounding.
// `slack`: the absolute rounding of a distance computed as |q|^2 + |x|^2 - 2 q.x in fp32 (a few
// ulps of the largest squared norm), which a relative tolerance misses near zero.
void expect_same_hits(const detail::GpuIvfLists::Result& gpu, const std::vector<detail::TopK>& cpu,
                      std::size_t k, float slack = 0.0f) {
  for (std::size_t q = 0; q < cpu.size(); ++q) {
    const auto& items = cpu[q].items();
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t slot = q * k + i;
      if (i >= items.size()) {
        EXPECT_EQ(gpu.positions[slot], ~std::uint64_t{0}) << "query " << q << " rank " << i;
        continue;
      }
      const float tolerance = 1e-4f * std::max(1.0f, std::fabs(items[i].distance)) + slack;
      ASSERT_NEAR(gpu.distances[slot], items[i].distance, tolerance)
          << "query " << q << " rank " << i;
      // The last rank may tie with the (k+1)-th row, which neither list shows.
      bool tied = i + 1 == k ||
                  (i > 0 && std::fabs(items[i].distance - items[i - 1].distance) <= tolerance) ||
                  (i + 1 < items.size() &&
                   std::fabs(items[i + 1].distance - items[i].distance) <= tolerance);
      if (!tied) {
        EXPECT_EQ(gpu.positions[slot], items[i].position) << "query " << q << " rank " << i;
      }
    }
  }
}

class GpuIvfSearch : public ::testing::TestWithParam<std::tuple<Metric, std::size_t>> {};

TEST_P(GpuIvfSearch, EqualsTheCpuIvfOverTheSameLists) {
  GPUOPT_REQUIRE_GPU();
  auto [metric, dim] = GetParam();
  const std::size_t rows = 12000, queries = 300, k = 10, nlist = 64, nprobe = 6;
  auto data = clustered(rows, dim, 40, 21);
  auto norms = norms_of(data, dim);
  const float slack = 8.0f * FLT_EPSILON * *std::max_element(norms.begin(), norms.end());
  std::vector<detail::RowBlock> blocks = {
      {data.data(), norms.data(), 5000, 0, nullptr},
      {data.data() + 5000 * dim, norms.data() + 5000, rows - 5000, 5000, nullptr}};
  IvfParams params;
  params.nlist = nlist;
  auto index = detail::IvfFlat::build(blocks, dim, metric, params, 0);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  auto gpu = detail::GpuIvfLists::create(*index, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_EQ((*gpu)->rows(), rows);
  auto query_rows = clustered(queries, dim, 40, 21);  // same centres, fresh points
  for (bool masked : {false, true}) {
    std::vector<std::uint64_t> mask((rows + 63) / 64, ~std::uint64_t{0});
    if (masked) {
      std::mt19937_64 rng(5);
      for (auto& word : mask) word &= rng() | rng();  // about a quarter of the rows cleared
      mask.back() &= (std::uint64_t{1} << (rows % 64)) - 1;
    }
    const detail::AllowMask* allow = masked ? &mask : nullptr;
    auto cpu = index->search(query_rows.data(), queries, k, nprobe, allow, 0);
    auto found = (*gpu)->search(query_rows.data(), queries, k, nprobe,
                                masked ? mask.data() : nullptr, masked ? mask.size() : 0);
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    expect_same_hits(*found, cpu, k, slack);
    if (masked) {
      for (auto position : found->positions) {
        if (position == ~std::uint64_t{0}) continue;
        EXPECT_TRUE((mask[position / 64] >> (position % 64)) & 1u) << position;
      }
    }
  }
  // k above the probed rows: the rest is empty, as on the CPU.
  auto few = index->search(query_rows.data(), 2, 128, 1, nullptr, 0);
  auto few_gpu = (*gpu)->search(query_rows.data(), 2, 128, 1, nullptr, 0);
  ASSERT_TRUE(few_gpu.ok());
  expect_same_hits(*few_gpu, few, 128, slack);
}

INSTANTIATE_TEST_SUITE_P(Metrics, GpuIvfSearch,
                         ::testing::Values(std::make_tuple(Metric::kL2, std::size_t{32}),
                                           std::make_tuple(Metric::kInnerProduct, std::size_t{96}),
                                           std::make_tuple(Metric::kCosine, std::size_t{784})));

// An index whose lists the test lays out: row r (position r) goes to list assignment[r], whatever
// its nearest centroid. With every list probed, IVF search is brute force over the allowed rows.
detail::IvfFlat hand_made_index(const std::vector<float>& data, std::size_t dim, Metric metric,
                                const std::vector<std::uint32_t>& assignment, std::size_t nlist,
                                std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<float> centroids(nlist * dim);
  for (auto& v : centroids) v = normal(rng);
  auto index = detail::IvfFlat::with_centroids(std::move(centroids), dim, metric);
  auto norms = norms_of(data, dim);
  for (std::size_t r = 0; r < assignment.size(); ++r) {
    index.append(assignment[r], data.data() + r * dim, norms[r], r);
  }
  return index;
}

// List sizes with the edges the scan cuts at: a list longer than 8 chunks of 128 rows (split into
// row chunks), empty lists, lists shorter than one 32-row step, and lists of odd lengths.
std::vector<std::uint32_t> uneven_assignment(std::size_t nlist, std::uint64_t seed) {
  std::vector<std::size_t> sizes(nlist);
  std::mt19937_64 rng(seed);
  for (std::size_t l = 0; l < nlist; ++l) sizes[l] = rng() % 150;
  sizes[0] = 2500;
  sizes[1] = sizes[2] = sizes[nlist - 1] = 0;
  sizes[3] = 1;
  sizes[4] = 33;
  std::vector<std::uint32_t> assignment;
  for (std::size_t l = 0; l < nlist; ++l) assignment.insert(assignment.end(), sizes[l], l);
  std::shuffle(assignment.begin(), assignment.end(), rng);
  return assignment;
}

class GpuIvfEdges : public ::testing::TestWithParam<std::tuple<Metric, std::size_t>> {};

TEST_P(GpuIvfEdges, EveryListProbedEqualsBruteForce) {
  GPUOPT_REQUIRE_GPU();
  auto [metric, dim] = GetParam();
  const std::size_t nlist = 24;
  auto assignment = uneven_assignment(nlist, 3);
  const std::size_t rows = assignment.size();
  auto data = clustered(rows, dim, 12, 41);
  auto norms = norms_of(data, dim);
  const float slack = 8.0f * FLT_EPSILON * *std::max_element(norms.begin(), norms.end());
  auto index = hand_made_index(data, dim, metric, assignment, nlist, 42);
  auto gpu = detail::GpuIvfLists::create(index, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  detail::RowBlock all{data.data(), norms.data(), rows, 0, nullptr};
  auto queries = clustered(1000, dim, 12, 41);
  std::vector<std::uint64_t> mask((rows + 63) / 64, ~std::uint64_t{0});
  std::mt19937_64 rng(9);
  for (auto& word : mask) word &= rng() | rng();
  if (rows % 64 != 0) mask.back() &= (std::uint64_t{1} << (rows % 64)) - 1;
  for (std::size_t batch : {std::size_t{1}, std::size_t{1000}}) {
    for (std::size_t k : {std::size_t{1}, std::size_t{10}, std::size_t{128}}) {
      // nprobe = nlist, and one above the list count (clamped to it); 21 lists hold rows.
      for (std::size_t nprobe : {nlist, std::size_t{500}}) {
        for (bool masked : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "batch " << batch << " k " << k << " nprobe "
                                            << nprobe << " masked " << masked);
          const detail::AllowMask* allow = masked ? &mask : nullptr;
          auto brute =
              detail::exact_scan({&all, 1}, dim, metric, queries.data(), batch, k, allow, 0);
          auto found = (*gpu)->search(queries.data(), batch, k, nprobe,
                                      masked ? mask.data() : nullptr, masked ? mask.size() : 0);
          ASSERT_TRUE(found.ok()) << found.status().to_string();
          expect_same_hits(*found, brute, k, slack);
          for (std::size_t q = 0; q < batch; ++q) {
            std::set<std::uint64_t> seen;
            for (std::size_t i = 0; i < k; ++i) {
              auto position = found->positions[q * k + i];
              if (position == ~std::uint64_t{0}) continue;
              EXPECT_TRUE(seen.insert(position).second) << "query " << q << " repeats " << position;
              if (masked) EXPECT_TRUE((mask[position / 64] >> (position % 64)) & 1u) << position;
            }
          }
        }
      }
    }
  }
}

TEST_P(GpuIvfEdges, SomeListsProbedEqualsTheCpuIvf) {
  GPUOPT_REQUIRE_GPU();
  auto [metric, dim] = GetParam();
  const std::size_t nlist = 24;
  auto assignment = uneven_assignment(nlist, 5);
  const std::size_t rows = assignment.size();
  auto data = clustered(rows, dim, 12, 51);
  auto norms = norms_of(data, dim);
  const float slack = 8.0f * FLT_EPSILON * *std::max_element(norms.begin(), norms.end());
  auto index = hand_made_index(data, dim, metric, assignment, nlist, 52);
  auto gpu = detail::GpuIvfLists::create(index, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  // Queries near the centroids, so that the probes differ between queries and the busiest lists
  // are shared by more queries than one tile holds.
  std::vector<float> queries(1000 * dim);
  std::mt19937_64 rng(53);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto& centroids = index.centroids();
  for (std::size_t q = 0; q < 1000; ++q) {
    const std::size_t c = q % 5 == 0 ? 0 : rng() % nlist;
    for (std::size_t t = 0; t < dim; ++t) {
      queries[q * dim + t] = centroids[c * dim + t] + normal(rng);
    }
  }
  for (std::size_t batch : {std::size_t{1}, std::size_t{1000}}) {
    for (std::size_t nprobe : {std::size_t{1}, std::size_t{3}}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " nprobe " << nprobe);
      auto cpu = index.search(queries.data(), batch, 10, nprobe, nullptr, 0);
      auto found = (*gpu)->search(queries.data(), batch, 10, nprobe, nullptr, 0);
      ASSERT_TRUE(found.ok()) << found.status().to_string();
      expect_same_hits(*found, cpu, 10, slack);
    }
  }
}

// dim 37 takes the scalar row loads, 64 and 784 the 16-byte ones; 784 holds 8 queries a tile.
INSTANTIATE_TEST_SUITE_P(Shapes, GpuIvfEdges,
                         ::testing::Values(std::make_tuple(Metric::kL2, std::size_t{37}),
                                           std::make_tuple(Metric::kCosine, std::size_t{64}),
                                           std::make_tuple(Metric::kInnerProduct,
                                                           std::size_t{784})));

// Equal distances are ordered by position: among identical rows the lowest allowed positions come
// back, whichever list and row chunk holds them.
TEST(GpuIvfTies, EqualDistancesKeepTheLowestPositions) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t dim = 16, nlist = 4, rows = 3000;
  std::vector<float> data(rows * dim);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t t = 0; t < dim; ++t) data[r * dim + t] = float(t % 3);  // all rows alike
  }
  // Lists 0 and 2 take alternate runs of rows, from the end first, so that neither list order
  // nor chunk order follows position order; lists 1 and 3 stay empty.
  std::vector<std::uint32_t> assignment(rows);
  for (std::size_t r = 0; r < rows; ++r) assignment[r] = (r / 7) % 2 == 0 ? 0 : 2;
  auto norms = norms_of(data, dim);
  auto index =
      detail::IvfFlat::with_centroids(std::vector<float>(nlist * dim, 0.0f), dim, Metric::kL2);
  for (std::size_t i = rows; i-- > 0;) {
    index.append(assignment[i], data.data() + i * dim, norms[i], i);
  }
  auto gpu = detail::GpuIvfLists::create(index, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  std::vector<float> query(dim, 0.5f);
  std::vector<std::uint64_t> mask((rows + 63) / 64, ~std::uint64_t{0});
  for (std::size_t r = 0; r < 40; r += 3) mask[r / 64] &= ~(std::uint64_t{1} << (r % 64));
  for (bool masked : {false, true}) {
    const std::size_t k = 20;
    auto found = (*gpu)->search(query.data(), 1, k, nlist, masked ? mask.data() : nullptr,
                                masked ? mask.size() : 0);
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    std::vector<std::uint64_t> expected;
    for (std::uint64_t r = 0; expected.size() < k; ++r) {
      if (!masked || ((mask[r / 64] >> (r % 64)) & 1u)) expected.push_back(r);
    }
    const float distance = detail::direct_distance(Metric::kL2, query.data(), data.data(), dim);
    for (std::size_t i = 0; i < k; ++i) {
      EXPECT_EQ(found->positions[i], expected[i]) << "rank " << i << " masked " << masked;
      EXPECT_NEAR(found->distances[i], distance, 1e-4f * distance);
    }
  }
}

TEST(GpuIvfCollection, SavedIndexAnswersAlikeOnBothEngines) {
  GPUOPT_REQUIRE_GPU();
  const std::size_t dim = 48, rows = 6000;
  TempDir dir("gpuopt-gpu-ivf");
  OpenOptions open;
  open.create = true;
  auto store = Store::open(dir.path(), open);
  ASSERT_TRUE(store.ok());
  auto collection = (*store)->create_collection("c", {dim, Metric::kL2});
  ASSERT_TRUE(collection.ok());
  Collection& c = **collection;
  auto data = clustered(rows, dim, 30, 31);
  std::vector<Metadata> metadata(rows);
  for (std::size_t i = 0; i < rows; ++i) metadata[i]["even"] = double(i % 2 == 0);
  ASSERT_TRUE(c.add(id_range(0, rows), data.data(), metadata).ok());
  IvfParams params;
  params.nlist = 48;
  params.engine = QueryEngine::kGpu;
  auto built = c.build_ivf(params);
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  EXPECT_EQ(c.ivf_stats()->train_engine, "gpu");
  ASSERT_TRUE(c.remove(id_range(0, 500)).ok());
  auto queries = clustered(100, dim, 30, 31);
  QueryOptions options;
  options.k = 10;
  options.index = IndexKind::kIvf;
  options.nprobe = 8;
  options.where_json = R"({"even": 1})";
  auto compare = [&](const char* when) {
    QueryReport gpu_report, cpu_report;
    options.engine = QueryEngine::kGpu;
    auto gpu = c.query(queries.data(), 100, options, &gpu_report);
    ASSERT_TRUE(gpu.ok()) << when << ": " << gpu.status().to_string();
    EXPECT_EQ(gpu_report.engine, QueryEngine::kGpu);
    options.engine = QueryEngine::kCpu;
    auto cpu = c.query(queries.data(), 100, options, &cpu_report);
    ASSERT_TRUE(cpu.ok());
    for (std::size_t q = 0; q < 100; ++q) {
      ASSERT_EQ((*gpu)[q].size(), (*cpu)[q].size()) << when << " query " << q;
      for (std::size_t i = 0; i < (*gpu)[q].size(); ++i) {
        const auto& g = (*gpu)[q][i];
        const auto& h = (*cpu)[q][i];
        EXPECT_NEAR(g.distance, h.distance, 1e-4f * std::max(1.0f, h.distance)) << when;
        EXPECT_GE(g.id, 500u) << when << ": a deleted row came back";
        EXPECT_EQ(g.id % 2, 0u) << when << ": a filtered-out row came back";
      }
    }
  };
  compare("after build");
  // Rows written after the first GPU query join the lists on both engines.
  auto more = clustered(1000, dim, 30, 32);
  std::vector<Metadata> more_metadata(1000);
  for (auto& m : more_metadata) m["even"] = 1.0;
  ASSERT_TRUE(c.add(id_range(100000, 1000), more.data(), more_metadata).ok());
  compare("after an add");
}

}  // namespace
}  // namespace gpuopt::vector
#endif  // GPUOPT_CUDA
