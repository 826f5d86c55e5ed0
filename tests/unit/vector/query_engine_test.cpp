// Collection::query's engine dispatch on a machine without a GPU: the CPU engine answers as before
// (against brute force), `auto` falls back to it with the reason, `gpu` fails with a clear error,
// and deleted or filtered-out rows never come back from any of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/vector_fixtures.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"
#include "vector/search_kernels.hpp"

namespace gpuopt::vector {
namespace {

using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

bool gpu_present() { return cuda_device_count().ok(); }

// A collection of three segments, ids 500.., with rows upserted, deleted and tagged for a filter.
struct Fixture {
  static constexpr std::size_t kDim = 24;
  static constexpr std::size_t kRows = 900;
  TempDir dir{"gpuopt-query-engine"};
  std::unique_ptr<Store> store;
  Collection* collection = nullptr;
  std::map<std::uint64_t, std::vector<float>> live;  // id -> vector, after every write
  std::map<std::uint64_t, bool> even;                // id -> metadata "even" flag
  std::set<std::uint64_t> deleted;

  void build() {
    auto opened = Store::open(dir.path(), {.create = true});
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    store = std::move(*opened);
    auto created = store->create_collection("c", {kDim, Metric::kL2});
    ASSERT_TRUE(created.ok());
    collection = *created;
    const auto base = random_vectors(kRows, kDim, 21);
    const auto ids = id_range(500, kRows);
    std::vector<Metadata> metadata(kRows);
    for (std::size_t i = 0; i < kRows; ++i) metadata[i]["even"] = double(ids[i] % 2 == 0);
    for (std::size_t first = 0; first < kRows; first += 300) {
      ASSERT_TRUE(collection
                      ->add(std::span(ids).subspan(first, 300), &base[first * kDim],
                            std::span(metadata).subspan(first, 300))
                      .ok());
    }
    for (std::size_t i = 0; i < kRows; ++i) {
      live[ids[i]].assign(&base[i * kDim], &base[(i + 1) * kDim]);
      even[ids[i]] = ids[i] % 2 == 0;
    }
    // Upsert 40 ids (their old rows become dead) and delete 60 more.
    const auto replacement = random_vectors(40, kDim, 22);
    const auto replaced = id_range(600, 40);
    std::vector<Metadata> replaced_meta(40);
    for (std::size_t i = 0; i < 40; ++i) replaced_meta[i]["even"] = double(replaced[i] % 2 == 0);
    ASSERT_TRUE(collection->upsert(replaced, replacement.data(), replaced_meta).ok());
    for (std::size_t i = 0; i < 40; ++i) {
      live[replaced[i]].assign(&replacement[i * kDim], &replacement[(i + 1) * kDim]);
    }
    const auto removed = id_range(700, 60);
    ASSERT_TRUE(collection->remove(removed).ok());
    for (auto id : removed) {
      live.erase(id);
      deleted.insert(id);
    }
  }

  // Brute-force distances of the k closest live rows passing `only_even`.
  std::vector<float> truth(const float* query, std::size_t k, bool only_even) const {
    std::vector<float> d;
    for (const auto& [id, v] : live) {
      if (only_even && !even.at(id)) continue;
      d.push_back(detail::direct_distance(Metric::kL2, query, v.data(), kDim));
    }
    std::sort(d.begin(), d.end());
    d.resize(std::min(d.size(), k));
    return d;
  }
};

void expect_exact(const Fixture& f, const SearchResults& results, const float* queries,
                  std::size_t k, bool only_even) {
  for (std::size_t q = 0; q < results.size(); ++q) {
    const float* query = queries + q * Fixture::kDim;
    auto truth = f.truth(query, k, only_even);
    ASSERT_EQ(results[q].size(), truth.size()) << "query " << q;
    for (std::size_t i = 0; i < truth.size(); ++i) {
      const auto id = results[q][i].id;
      ASSERT_FALSE(f.deleted.count(id)) << "deleted id " << id << " returned";
      ASSERT_TRUE(f.live.count(id)) << "unknown id " << id;
      if (only_even) EXPECT_TRUE(f.even.at(id)) << "filtered-out id " << id;
      const float actual =
          detail::direct_distance(Metric::kL2, query, f.live.at(id).data(), Fixture::kDim);
      EXPECT_NEAR(actual, truth[i], 1e-4f * std::max(1.0f, truth[i])) << "q " << q << " rank " << i;
    }
  }
}

bool same_hits(const SearchResults& a, const SearchResults& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t q = 0; q < a.size(); ++q) {
    if (a[q].size() != b[q].size()) return false;
    for (std::size_t i = 0; i < a[q].size(); ++i) {
      if (a[q][i].id != b[q][i].id || a[q][i].distance != b[q][i].distance) return false;
    }
  }
  return true;
}

TEST(QueryEngine, CpuEngineIsTheDefaultAndAnswersExactly) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.build());
  const auto queries = random_vectors(25, Fixture::kDim, 23);
  for (const char* where : {"", R"({"even": 1})"}) {
    QueryOptions options;
    options.k = 12;
    options.where_json = where;
    QueryReport report;
    report.fallback_reason = "stale";
    auto results = f.collection->query(queries.data(), 25, options, &report);
    ASSERT_TRUE(results.ok()) << results.status().to_string();
    EXPECT_EQ(report.engine, QueryEngine::kCpu);
    EXPECT_TRUE(report.fallback_reason.empty());
    EXPECT_EQ(report.gpu_rows_uploaded, 0u);
    expect_exact(f, *results, queries.data(), 12, *where != '\0');
    // Without a report the answer is the same.
    auto again = f.collection->query(queries.data(), 25, options);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(same_hits(*results, *again));
  }
}

TEST(QueryEngine, AutoFallsBackToTheCpuWithTheReason) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: tests/gpu/vector covers auto on a GPU";
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.build());
  const auto queries = random_vectors(10, Fixture::kDim, 24);
  QueryOptions options;
  options.k = 7;
  options.where_json = R"({"even": 0})";
  auto cpu = f.collection->query(queries.data(), 10, options);
  ASSERT_TRUE(cpu.ok());
  options.engine = QueryEngine::kAuto;
  QueryReport report;
  auto automatic = f.collection->query(queries.data(), 10, options, &report);
  ASSERT_TRUE(automatic.ok()) << automatic.status().to_string();
  EXPECT_EQ(report.engine, QueryEngine::kCpu);
  EXPECT_FALSE(report.fallback_reason.empty());
  EXPECT_TRUE(same_hits(*cpu, *automatic));
  for (const auto& hits : *automatic) {
    for (const auto& hit : hits) EXPECT_FALSE(f.even.at(hit.id));
  }
  // IVF: the GPU answers where there is one, else auto falls back to the CPU and says why.
  options.index = IndexKind::kIvf;
  options.ivf.nlist = 4;
  auto ivf = f.collection->query(queries.data(), 10, options, &report);
  ASSERT_TRUE(ivf.ok()) << ivf.status().to_string();
  if (!gpu_present()) {
    EXPECT_EQ(report.engine, QueryEngine::kCpu);
    EXPECT_FALSE(report.fallback_reason.empty());
  }
  for (const auto& hits : *ivf) {
    for (const auto& hit : hits) EXPECT_FALSE(f.even.at(hit.id));
  }
}

TEST(QueryEngine, GpuEngineReportsWhyItCannotAnswer) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.build());
  const auto queries = random_vectors(3, Fixture::kDim, 25);
  QueryOptions options;
  options.engine = QueryEngine::kGpu;
  options.index = IndexKind::kIvf;
  auto ivf = f.collection->query(queries.data(), 3, options);
  EXPECT_EQ(ivf.ok(), gpu_present()) << ivf.status().to_string();
  options.index = IndexKind::kExact;
  options.k = kGpuMaxK + 1;
  auto large_k = f.collection->query(queries.data(), 3, options);
  EXPECT_EQ(large_k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(large_k.status().message().find("129"), std::string::npos);
  if (!gpu_present()) {
    options.k = 5;
    auto no_gpu = f.collection->query(queries.data(), 3, options);
    ASSERT_FALSE(no_gpu.ok());
    EXPECT_TRUE(no_gpu.status().code() == StatusCode::kUnimplemented ||
                no_gpu.status().code() == StatusCode::kUnavailable)
        << no_gpu.status().to_string();
  }
}

TEST(QueryEngine, ParsesEngineNames) {
  for (auto engine : {QueryEngine::kCpu, QueryEngine::kGpu, QueryEngine::kAuto}) {
    auto parsed = parse_query_engine(query_engine_name(engine));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, engine);
  }
  EXPECT_EQ(parse_query_engine("tpu").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpuopt::vector
