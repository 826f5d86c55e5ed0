// Times Collection::compact of a store with a saved IVF index, with and without the re-save of
// the index for the new layout (CompactOptions::resave_ivf), on fresh copies of one store.
//
//   vector_compact_bench DIR [ROWS [SEGMENTS [REPEATS]]]
//
// DIR/base is built once (ROWS x 128 random rows in SEGMENTS segments, CPU k-means with nlist
// 448, every tenth id deleted) and reused by later runs; each measurement copies it to DIR/work,
// opens it and compacts it with default options. The two kinds alternate REPEATS times; prints
// each run and the median (min-max) of the compaction and of its re-save
// (CompactReport::ivf_resave_seconds).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gpuopt/vector/store.hpp"

namespace {

namespace fs = std::filesystem;
namespace vec = gpuopt::vector;

constexpr std::size_t kDim = 128;

int fail(const gpuopt::Status& status) {
  std::fprintf(stderr, "vector_compact_bench: %s\n", status.to_string().c_str());
  return 1;
}

gpuopt::Status build_base(const fs::path& dir, std::size_t rows, std::size_t segments) {
  auto store = vec::Store::open(dir, {.create = true, .compact_above_segments = 0});
  if (!store.ok()) return store.status();
  auto c = (*store)->create_collection("c", {kDim, vec::Metric::kL2});
  if (!c.ok()) return c.status();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const std::size_t per_segment = rows / segments;
  for (std::size_t s = 0; s < segments; ++s) {
    std::vector<std::uint64_t> ids(per_segment);
    std::vector<float> vectors(per_segment * kDim);
    for (std::size_t i = 0; i < per_segment; ++i) ids[i] = s * per_segment + i;
    for (auto& x : vectors) x = normal(rng);
    if (auto added = (*c)->add(ids, vectors.data()); !added.ok()) return added;
  }
  vec::IvfParams params;
  params.nlist = 448;
  params.engine = vec::QueryEngine::kCpu;
  if (auto built = (*c)->build_ivf(params); !built.ok()) return built.status();
  std::vector<std::uint64_t> deleted;
  for (std::uint64_t id = 0; id < per_segment * segments; id += 10) deleted.push_back(id);
  auto removed = (*c)->remove(deleted);
  return removed.ok() ? gpuopt::ok_status() : removed.status();
}

struct Run {
  double compact = 0;
  double resave = 0;
};

std::string summary(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return fmt::format("{:.3f} s ({:.3f}-{:.3f})", values[values.size() / 2], values.front(),
                     values.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: vector_compact_bench DIR [ROWS [SEGMENTS [REPEATS]]]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  const std::size_t rows = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 200000;
  const std::size_t segments = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 10;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  if (rows == 0 || segments == 0 || rows < segments * 448 || repeats <= 0) {
    std::fprintf(stderr, "vector_compact_bench: need ROWS >= SEGMENTS x 448 and REPEATS > 0\n");
    return 2;
  }
  const fs::path base = dir / "base";
  const fs::path work = dir / "work";
  if (!fs::exists(base)) {
    if (auto built = build_base(base, rows, segments); !built.ok()) return fail(built);
  }
  std::vector<Run> with_resave;
  std::vector<Run> without;
  for (int r = 0; r < repeats; ++r) {
    for (bool resave : {true, false}) {
      std::error_code error;
      fs::remove_all(work, error);
      fs::copy(base, work, fs::copy_options::recursive, error);
      if (error) return fail(gpuopt::internal_error("copy the store: " + error.message()));
      auto store = vec::Store::open(work);
      if (!store.ok()) return fail(store.status());
      auto c = (*store)->collection("c");
      if (!c.ok()) return fail(c.status());
      const auto start = std::chrono::steady_clock::now();
      auto report = (*c)->compact({.resave_ivf = resave});
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!report.ok()) return fail(report.status());
      if (resave && !report->ivf_resaved) {
        return fail(gpuopt::internal_error("the IVF index was not re-saved: " + report->ivf_error));
      }
      (resave ? with_resave : without).push_back({seconds, report->ivf_resave_seconds});
      std::printf("%s: compaction %.3f s, re-save %.3f s, %zu -> %zu segments, %zu rows dropped\n",
                  resave ? "re-save" : "no re-save", seconds, report->ivf_resave_seconds,
                  report->segments_before, report->segments_after, report->rows_dropped);
    }
  }
  fs::remove_all(work);
  auto column = [](const std::vector<Run>& runs, double Run::*field) {
    std::vector<double> values;
    for (const auto& run : runs) values.push_back(run.*field);
    return values;
  };
  std::printf("compaction with re-save:    %s, of which the re-save %s\n",
              summary(column(with_resave, &Run::compact)).c_str(),
              summary(column(with_resave, &Run::resave)).c_str());
  std::printf("compaction without re-save: %s\n", summary(column(without, &Run::compact)).c_str());
  return 0;
}
