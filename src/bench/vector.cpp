// `gpuopt bench vector` testcases: ingest, cold open, exact (CPU), IVF nprobe sweep (CPU) and exact
// (GPU) on one data set and one store, every answer scored against float64 ground truth.
#include "gpuopt/bench/vector.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpuopt::bench::vector_bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string fixed(double value, int digits) { return fmt::format("{:.{}f}", value, digits); }

// Writes a 2-D little-endian .npy (descr '<f4', '<f8' or '<i8') for bench/vector/engines.py.
Status write_npy_typed(const fs::path& path, const char* descr, const void* data,
                       std::size_t element_bytes, std::size_t rows, std::size_t cols) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}, {}), }}",
                                   descr, rows, cols);
  // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return invalid_argument(fmt::format("bench vector: cannot write {}", path.string()));
  const std::uint16_t length = static_cast<std::uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&length), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data),
            static_cast<std::streamsize>(rows * cols * element_bytes));
  if (!out) return data_loss(fmt::format("bench vector: short write to {}", path.string()));
  return ok_status();
}

struct IngestFigures {
  double seconds = 0;
  std::size_t rows = 0;
  std::size_t batches = 0;
  std::uint64_t segment_bytes = 0;
};

// What every testcase shares: the data, its ground truth and one store, made on first use so any
// single testcase can run alone.
class Fixture {
 public:
  Fixture(BenchOptions bench, VectorBenchOptions options)
      : bench_(std::move(bench)), options_(std::move(options)) {}
  ~Fixture() {
    collection_ = nullptr;
    store_.reset();
    std::error_code ignored;
    if (!remove_root_.empty()) fs::remove_all(remove_root_, ignored);
  }

  const VectorBenchOptions& options() const { return options_; }
  bool quick() const { return bench_.quick; }
  int threads() const { return options_.threads; }
  int device() const { return bench_.device; }
  const Dataset& data() const { return *data_; }
  const GroundTruth& truth() const { return truth_; }
  double truth_seconds() const { return truth_seconds_; }
  const IngestFigures& ingest() const { return ingest_; }
  const fs::path& directory() const { return dir_; }
  vector::Collection& collection() { return *collection_; }

  Status prepare_data() {
    if (data_) return ok_status();
    GPUOPT_ASSIGN_OR_RETURN(Dataset data, load_dataset(options_, bench_.quick));
    data_ = std::move(data);
    auto start = Clock::now();
    truth_ =
        brute_force_truth(data_->base.data(), data_->base_rows, data_->dim, data_->queries.data(),
                          data_->query_rows, options_.k, options_.threads);
    truth_seconds_ = seconds_since(start);
    if (!options_.export_dir.empty()) GPUOPT_RETURN_IF_ERROR(export_files());
    return ok_status();
  }

  // Creates the store and adds the base rows (ids = row numbers) in committed batches.
  Status prepare_store() {
    GPUOPT_RETURN_IF_ERROR(prepare_data());
    if (collection_ != nullptr) return ok_status();
    if (options_.work_dir.empty()) {
      std::string pattern = (fs::temp_directory_path() / "gpuopt-bench-vector-XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) {
        return unavailable(fmt::format("bench vector: cannot create a directory like {}: {}",
                                       pattern, std::strerror(errno)));
      }
      remove_root_ = pattern;
    } else {
      remove_root_ = fs::path(options_.work_dir) / fmt::format("bench-vector-{}", getpid());
    }
    dir_ = remove_root_ / "store";
    vector::OpenOptions open;
    open.create = true;
    GPUOPT_ASSIGN_OR_RETURN(store_, vector::Store::open(dir_, open));
    GPUOPT_ASSIGN_OR_RETURN(
        collection_,
        store_->create_collection(vector::kDefaultCollection, {data_->dim, vector::Metric::kL2}));
    const std::size_t batch = 10000;
    std::vector<std::uint64_t> ids(batch);
    auto start = Clock::now();
    for (std::size_t first = 0; first < data_->base_rows; first += batch) {
      std::size_t rows = std::min(batch, data_->base_rows - first);
      ids.resize(rows);
      std::iota(ids.begin(), ids.end(), first);
      GPUOPT_RETURN_IF_ERROR(collection_->add(ids, data_->base.data() + first * data_->dim));
      ++ingest_.batches;
    }
    ingest_.seconds = seconds_since(start);
    ingest_.rows = data_->base_rows;
    ingest_.segment_bytes = collection_->stats().segment_bytes;
    return ok_status();
  }

  // Closes and reopens the store (cold-open); the IVF index, kept in memory, goes with it.
  Status reopen(double* open_seconds) {
    collection_ = nullptr;
    store_.reset();
    auto start = Clock::now();
    GPUOPT_ASSIGN_OR_RETURN(store_, vector::Store::open(dir_));
    GPUOPT_ASSIGN_OR_RETURN(collection_, store_->collection(vector::kDefaultCollection));
    *open_seconds = seconds_since(start);
    return ok_status();
  }

 private:
  Status export_files() {
    std::error_code error;
    fs::create_directories(options_.export_dir, error);
    if (error) {
      return invalid_argument(
          fmt::format("bench vector: cannot create {}: {}", options_.export_dir, error.message()));
    }
    const fs::path out(options_.export_dir);
    const Dataset& d = *data_;
    std::vector<std::int64_t> ids(truth_.ids.begin(), truth_.ids.end());
    GPUOPT_RETURN_IF_ERROR(
        write_npy_typed(out / "base.npy", "<f4", d.base.data(), 4, d.base_rows, d.dim));
    GPUOPT_RETURN_IF_ERROR(
        write_npy_typed(out / "queries.npy", "<f4", d.queries.data(), 4, d.query_rows, d.dim));
    GPUOPT_RETURN_IF_ERROR(
        write_npy_typed(out / "truth_ids.npy", "<i8", ids.data(), 8, d.query_rows, truth_.k));
    return write_npy_typed(out / "truth_distances.npy", "<f8", truth_.distances.data(), 8,
                           d.query_rows, truth_.k);
  }

  BenchOptions bench_;
  VectorBenchOptions options_;
  std::optional<Dataset> data_;
  GroundTruth truth_;
  double truth_seconds_ = 0;
  fs::path dir_;
  fs::path remove_root_;  // the directory this bench made for its store
  std::unique_ptr<vector::Store> store_;
  vector::Collection* collection_ = nullptr;
  IngestFigures ingest_;
};

// One search engine call over `count` queries starting at `first`; returns ids per query.
using SearchFn = std::function<StatusOr<FoundIds>(std::size_t first, std::size_t count)>;

struct BatchFigures {
  std::size_t batch = 0;
  double qps = 0;
  double seconds = 0;
  FoundIds found;  // every query's answer, for recall
};

// All queries in batches of `batch` (after one warm-up batch); median of `repeats` passes.
StatusOr<BatchFigures> time_batches(const SearchFn& search, std::size_t queries, std::size_t batch,
                                    int repeats) {
  BatchFigures figures;
  figures.batch = std::min(batch, queries);
  GPUOPT_RETURN_IF_ERROR(search(0, figures.batch).status());
  std::vector<double> passes;
  for (int r = 0; r < repeats; ++r) {
    FoundIds found;
    found.reserve(queries);
    auto start = Clock::now();
    for (std::size_t first = 0; first < queries; first += figures.batch) {
      GPUOPT_ASSIGN_OR_RETURN(FoundIds part,
                              search(first, std::min(figures.batch, queries - first)));
      for (auto& ids : part) found.push_back(std::move(ids));
    }
    passes.push_back(seconds_since(start));
    figures.found = std::move(found);
  }
  figures.seconds = summarize(passes).median;
  figures.qps = figures.seconds > 0 ? static_cast<double>(queries) / figures.seconds : 0;
  return figures;
}

struct SingleFigures {
  std::size_t queries = 0;
  double qps = 0, p50_ms = 0, p99_ms = 0;
};

// The first `count` queries `batch` at a time (batch 1 by default): per-call latency percentiles.
StatusOr<SingleFigures> time_singles(const SearchFn& search, std::size_t count,
                                     std::size_t batch = 1) {
  SingleFigures figures;
  figures.queries = count;
  if (count < batch || batch == 0) return figures;
  GPUOPT_RETURN_IF_ERROR(search(0, batch).status());  // warm-up
  std::vector<double> latencies_ms;
  double total = 0;
  for (std::size_t q = 0; q + batch <= count; q += batch) {
    auto start = Clock::now();
    GPUOPT_RETURN_IF_ERROR(search(q, batch).status());
    double seconds = seconds_since(start);
    total += seconds;
    latencies_ms.push_back(seconds * 1e3);
  }
  Summary summary = summarize(latencies_ms);
  figures.p50_ms = summary.median;
  figures.p99_ms = summary.p99;
  figures.qps = total > 0 ? static_cast<double>(latencies_ms.size() * batch) / total : 0;
  return figures;
}

std::size_t single_count(const Fixture& fixture) {
  std::size_t wanted = fixture.options().single_queries;
  if (wanted == 0) wanted = fixture.quick() ? 100 : 200;
  return std::min(wanted, fixture.data().query_rows);
}

int batch_repeats(const Fixture& fixture) { return fixture.quick() ? 1 : 3; }

SearchFn store_search(Fixture& fixture, vector::QueryOptions options) {
  return [&fixture, options](std::size_t first, std::size_t count) -> StatusOr<FoundIds> {
    const Dataset& d = fixture.data();
    GPUOPT_ASSIGN_OR_RETURN(
        auto results, fixture.collection().query(d.queries.data() + first * d.dim, count, options));
    return ids_of(results);
  };
}

struct Recall {
  double ids = 0, distance = 0;
};
Recall score(const Fixture& fixture, const FoundIds& found) {
  const Dataset& d = fixture.data();
  return {recall_id_overlap(found, fixture.truth()),
          recall_distance_rule(found, fixture.truth(), d.base.data(), d.base_rows, d.dim,
                               d.queries.data())};
}

nlohmann::json dataset_json(const Fixture& fixture) {
  const Dataset& d = fixture.data();
  return {{"name", d.name},
          {"base_rows", d.base_rows},
          {"query_rows", d.query_rows},
          {"dim", d.dim},
          {"k", fixture.options().k},
          {"metric", "l2"},
          {"truth_seconds", fixture.truth_seconds()}};
}

class VectorTestcase : public Testcase {
 public:
  explicit VectorTestcase(std::shared_ptr<Fixture> fixture) : fixture_(std::move(fixture)) {}

 protected:
  std::shared_ptr<Fixture> fixture_;
};

class IngestTestcase final : public VectorTestcase {
 public:
  using VectorTestcase::VectorTestcase;
  std::string key() const override { return "ingest"; }
  std::string description() const override {
    return "Adds the base vectors to a new store in committed batches of 10000 (fsync + SQLite)";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_RETURN_IF_ERROR(fixture_->prepare_store());
    const auto& ingest = fixture_->ingest();
    const Dataset& d = fixture_->data();
    double rate = ingest.seconds > 0 ? static_cast<double>(ingest.rows) / ingest.seconds : 0;
    double mib = static_cast<double>(ingest.rows * d.dim * sizeof(float)) / (1 << 20);
    TestcaseResult result;
    result.data = {{"dataset", dataset_json(*fixture_)},
                   {"rows", ingest.rows},
                   {"batches", ingest.batches},
                   {"ingest_s", ingest.seconds},
                   {"vectors_per_s", rate},
                   {"ingest_mib_per_s", ingest.seconds > 0 ? mib / ingest.seconds : 0},
                   {"segment_bytes", ingest.segment_bytes},
                   {"peak_rss_mib", peak_rss_mib()}};
    result.table.columns = {"rows", "batches", "seconds", "vectors/s", "MiB/s", "on disk"};
    result.table.rows.push_back({std::to_string(ingest.rows), std::to_string(ingest.batches),
                                 fixed(ingest.seconds, 3), fixed(rate, 0),
                                 fixed(ingest.seconds > 0 ? mib / ingest.seconds : 0, 1),
                                 format_bytes(ingest.segment_bytes)});
    result.notes.push_back(fmt::format("data: {} ({} x {}), {} queries, ground truth in {:.2f} s",
                                       d.name, d.base_rows, d.dim, d.query_rows,
                                       fixture_->truth_seconds()));
    return result;
  }
};

class ColdOpenTestcase final : public VectorTestcase {
 public:
  using VectorTestcase::VectorTestcase;
  std::string key() const override { return "cold-open"; }
  std::string description() const override {
    return "Store::open of the ingested store (page cache warm) and its first query";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_RETURN_IF_ERROR(fixture_->prepare_store());
    const int attempts = 5;
    std::vector<double> open_ms, first_query_ms;
    vector::QueryOptions options;
    options.k = fixture_->options().k;
    options.threads = fixture_->threads();
    const Dataset& d = fixture_->data();
    for (int i = 0; i < attempts; ++i) {
      double open_seconds = 0;
      GPUOPT_RETURN_IF_ERROR(fixture_->reopen(&open_seconds));
      open_ms.push_back(open_seconds * 1e3);
      // The first query of an opened store also checks each segment's CRC32C once.
      auto start = Clock::now();
      GPUOPT_RETURN_IF_ERROR(fixture_->collection().query(d.queries.data(), 1, options).status());
      first_query_ms.push_back(seconds_since(start) * 1e3);
      context.progress(double(i + 1) / attempts);
    }
    Summary open = summarize(open_ms), first = summarize(first_query_ms);
    TestcaseResult result;
    result.data = {{"rows", d.base_rows},         {"attempts", attempts},
                   {"open_ms", open.min},         {"open_median_ms", open.median},
                   {"first_query_ms", first.min}, {"first_query_median_ms", first.median},
                   {"open_ms_all", open_ms},      {"peak_rss_mib", peak_rss_mib()}};
    result.table.columns = {"", "best ms", "median ms"};
    result.table.rows.push_back({"open", fixed(open.min, 2), fixed(open.median, 2)});
    result.table.rows.push_back(
        {"first query (verifies CRCs)", fixed(first.min, 2), fixed(first.median, 2)});
    result.notes.push_back(
        "same process, page cache warm: open maps segments and reads the catalogue only");
    return result;
  }
};

nlohmann::json batch_row(const BatchFigures& figures) {
  return {{"batch", figures.batch}, {"qps", figures.qps}, {"p50_ms", nullptr}, {"p99_ms", nullptr}};
}
nlohmann::json single_row(const SingleFigures& figures) {
  return {
      {"batch", 1}, {"qps", figures.qps}, {"p50_ms", figures.p50_ms}, {"p99_ms", figures.p99_ms}};
}

class ExactCpuTestcase final : public VectorTestcase {
 public:
  using VectorTestcase::VectorTestcase;
  std::string key() const override { return "exact-cpu"; }
  std::string description() const override {
    return "Exact search on the CPU (SIMD tiles + fused top-k): recall, QPS at batch 1 and 1000";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_RETURN_IF_ERROR(fixture_->prepare_store());
    vector::QueryOptions options;
    options.k = fixture_->options().k;
    options.threads = fixture_->threads();
    SearchFn search = store_search(*fixture_, options);
    const Dataset& d = fixture_->data();
    GPUOPT_ASSIGN_OR_RETURN(BatchFigures batch,
                            time_batches(search, d.query_rows, 1000, batch_repeats(*fixture_)));
    context.progress(0.5);
    GPUOPT_ASSIGN_OR_RETURN(SingleFigures single, time_singles(search, single_count(*fixture_)));
    Recall recall = score(*fixture_, batch.found);
    TestcaseResult result;
    // Exact search must find the true neighbours; a tie at the k-th distance may swap ids, so the
    // criterion is the distance rule.
    bool exact = recall.distance >= 1.0;
    result.data = {{"dataset", dataset_json(*fixture_)},
                   {"threads", fixture_->threads()},
                   {"id_recall", recall.ids},
                   {"distance_recall", recall.distance},
                   {"criteria_met", exact},
                   {"rows", {single_row(single), batch_row(batch)}},
                   {"peak_rss_mib", peak_rss_mib()}};
    result.table.columns = {"batch", "QPS", "p50 ms", "p99 ms"};
    result.table.rows.push_back(
        {"1", fixed(single.qps, 0), fixed(single.p50_ms, 3), fixed(single.p99_ms, 3)});
    result.table.rows.push_back({std::to_string(batch.batch), fixed(batch.qps, 0), "", ""});
    result.notes.push_back(fmt::format("recall@{}: {:.4f} by id overlap, {:.4f} by distance rule{}",
                                       options.k, recall.ids, recall.distance,
                                       exact ? "" : " -- exact search missed true neighbours"));
    return result;
  }
};

class IvfCpuTestcase final : public VectorTestcase {
 public:
  using VectorTestcase::VectorTestcase;
  std::string key() const override { return "ivf-cpu"; }
  std::string description() const override {
    return "IVF-Flat on the CPU: k-means build, then a QPS-recall sweep over nprobe";
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_RETURN_IF_ERROR(fixture_->prepare_store());
    const auto& opts = fixture_->options();
    vector::IvfParams params;
    // Quick runs use 256 lists: k-means costs grow with nlist squared and audit waits for them.
    params.nlist = opts.nlist != 0 ? opts.nlist : (fixture_->quick() ? 256 : 0);
    params.engine = vector::QueryEngine::kCpu;  // this testcase measures the CPU IVF end to end
    auto start = Clock::now();
    GPUOPT_ASSIGN_OR_RETURN(double train_seconds,
                            fixture_->collection().build_ivf(params, opts.threads));
    double build_seconds = seconds_since(start);
    std::size_t nlist = params.nlist;
    if (nlist == 0) {
      // The store's default (search_kernels.cpp): about 4*sqrt(rows), a power of two.
      nlist = 1;
      while (nlist * nlist < 16 * fixture_->data().base_rows) nlist *= 2;
    }
    std::vector<std::size_t> nprobes = opts.nprobes;
    if (nprobes.empty()) {
      nprobes = fixture_->quick() ? std::vector<std::size_t>{1, 4, 16, 64}
                                  : std::vector<std::size_t>{1, 2, 4, 8, 16, 32, 64, 128};
    }
    // nprobe above nlist probes every list, the same as nprobe = nlist: measure that once.
    std::erase_if(nprobes, [nlist](std::size_t nprobe) { return nprobe > nlist; });
    if (nprobes.empty()) nprobes.push_back(nlist);
    const Dataset& d = fixture_->data();
    nlohmann::json rows = nlohmann::json::array();
    TestcaseResult result;
    result.table.columns = {"nprobe",  "recall ids", "recall dist", "QPS b=1000",
                            "QPS b=1", "p50 ms",     "p99 ms"};
    double best_recall = 0;
    std::optional<std::size_t> first_at_target;
    for (std::size_t i = 0; i < nprobes.size(); ++i) {
      vector::QueryOptions options;
      options.k = opts.k;
      options.index = vector::IndexKind::kIvf;
      options.nprobe = nprobes[i];
      options.threads = opts.threads;
      SearchFn search = store_search(*fixture_, options);
      GPUOPT_ASSIGN_OR_RETURN(BatchFigures batch,
                              time_batches(search, d.query_rows, 1000, batch_repeats(*fixture_)));
      GPUOPT_ASSIGN_OR_RETURN(SingleFigures single, time_singles(search, single_count(*fixture_)));
      Recall recall = score(*fixture_, batch.found);
      best_recall = std::max(best_recall, recall.distance);
      if (!first_at_target && recall.distance >= 0.95) first_at_target = nprobes[i];
      rows.push_back({{"nprobe", nprobes[i]},
                      {"id_recall", recall.ids},
                      {"distance_recall", recall.distance},
                      {"batch_qps", batch.qps},
                      {"batch1_qps", single.qps},
                      {"p50_ms", single.p50_ms},
                      {"p99_ms", single.p99_ms}});
      result.table.rows.push_back({std::to_string(nprobes[i]), fixed(recall.ids, 4),
                                   fixed(recall.distance, 4), fixed(batch.qps, 0),
                                   fixed(single.qps, 0), fixed(single.p50_ms, 3),
                                   fixed(single.p99_ms, 3)});
      context.progress(double(i + 1) / nprobes.size());
    }
    result.data = {{"dataset", dataset_json(*fixture_)},
                   {"threads", opts.threads},
                   {"nlist", nlist},
                   {"build_s", build_seconds},
                   {"train_s", train_seconds},
                   {"batch", std::min<std::size_t>(1000, d.query_rows)},
                   {"best_distance_recall", best_recall},
                   {"criteria_met", best_recall >= 0.95},
                   {"sweep", rows},
                   {"peak_rss_mib", peak_rss_mib()}};
    result.notes.push_back(fmt::format("nlist {}, build {:.3f} s (k-means {:.3f} s)", nlist,
                                       build_seconds, train_seconds));
    result.notes.push_back(
        first_at_target
            ? fmt::format("recall@{} >= 0.95 from nprobe {}", opts.k, *first_at_target)
            : fmt::format("recall@{} stays below 0.95 (best {:.4f})", opts.k, best_recall));
    return result;
  }
};

class ExactGpuTestcase final : public VectorTestcase {
 public:
  using VectorTestcase::VectorTestcase;
  std::string key() const override { return "exact-gpu"; }
  std::string description() const override {
    return "Exact search on the GPU through the store (fused tensor-core pass, or cuBLAS tiles), "
           "fp32 and TF32+re-rank";
  }
  Status filter(const BenchContext& context) const override {
    auto devices = cuda_device_count();
    if (!devices.ok()) return devices.status();
    if (*devices <= context.options().device) {
      return unavailable(
          fmt::format("no CUDA device {} ({} present)", context.options().device, *devices));
    }
    return ok_status();
  }
  StatusOr<TestcaseResult> run(BenchContext& context) override {
    GPUOPT_RETURN_IF_ERROR(fixture_->prepare_store());
    const Dataset& d = fixture_->data();
    vector::Collection& collection = fixture_->collection();
    vector::QueryOptions gpu;
    gpu.k = fixture_->options().k;
    gpu.engine = vector::QueryEngine::kGpu;
    gpu.gpu.device = fixture_->device();
    // The collection keeps its rows on the device from its first GPU query on; a fresh copy is
    // timed here: the copy plus a one-query search, which waits for it.
    collection.release_gpu();
    std::optional<double> free_before_mib = device_free_mib();
    auto upload_start = Clock::now();
    GPUOPT_RETURN_IF_ERROR(collection.query(d.queries.data(), 1, gpu).status());
    double upload_seconds = seconds_since(upload_start);
    std::optional<double> free_after_mib = device_free_mib();
    TestcaseResult result;
    result.table.columns = {"precision", "recall ids", "recall dist", "QPS b=1000",
                            "QPS b=1",   "p50 ms",     "p99 ms"};
    nlohmann::json rows = nlohmann::json::array();
    bool exact_ok = true;
    const std::pair<vector::GpuPrecision, const char*> precisions[] = {
        {vector::GpuPrecision::kFp32, "fp32"}, {vector::GpuPrecision::kTf32Rerank, "tf32"}};
    for (const auto& [precision, name] : precisions) {
      vector::QueryOptions options = gpu;
      options.gpu.precision = precision;
      SearchFn search = store_search(*fixture_, options);
      GPUOPT_ASSIGN_OR_RETURN(BatchFigures batch,
                              time_batches(search, d.query_rows, 1000, batch_repeats(*fixture_)));
      GPUOPT_ASSIGN_OR_RETURN(SingleFigures single, time_singles(search, single_count(*fixture_)));
      // Small batches (the small-batch path answers up to 16 queries): per-call percentiles.
      nlohmann::json small_batches = nlohmann::json::array();
      for (std::size_t size : {std::size_t{4}, std::size_t{16}}) {
        GPUOPT_ASSIGN_OR_RETURN(SingleFigures small,
                                time_singles(search, single_count(*fixture_), size));
        if (small.qps == 0) continue;
        small_batches.push_back({{"batch", size},
                                 {"qps", small.qps},
                                 {"p50_ms", small.p50_ms},
                                 {"p99_ms", small.p99_ms}});
      }
      Recall recall = score(*fixture_, batch.found);
      if (precision == vector::GpuPrecision::kFp32 && recall.distance < 1.0) exact_ok = false;
      rows.push_back({{"precision", name},
                      {"id_recall", recall.ids},
                      {"distance_recall", recall.distance},
                      {"batch_qps", batch.qps},
                      {"batch1_qps", single.qps},
                      {"p50_ms", single.p50_ms},
                      {"p99_ms", single.p99_ms},
                      {"small_batches", small_batches}});
      result.table.rows.push_back({name, fixed(recall.ids, 4), fixed(recall.distance, 4),
                                   fixed(batch.qps, 0), fixed(single.qps, 0),
                                   fixed(single.p50_ms, 3), fixed(single.p99_ms, 3)});
    }
    std::optional<double> used_mib;
    if (free_before_mib && free_after_mib) used_mib = *free_before_mib - *free_after_mib;
    result.data = {{"dataset", dataset_json(*fixture_)},
                   {"upload_s", upload_seconds},
                   {"gpu_memory_mib", used_mib ? nlohmann::json(*used_mib) : nlohmann::json()},
                   {"criteria_met", exact_ok},
                   {"precisions", rows},
                   {"peak_rss_mib", peak_rss_mib()}};
    result.notes.push_back(fmt::format("upload {:.3f} s; device memory taken {}", upload_seconds,
                                       used_mib ? fmt::format("{:.1f} MiB", *used_mib) : "n/a"));
    if (!exact_ok) result.notes.push_back("fp32 GPU search missed true neighbours");
    return result;
  }

 private:
  std::optional<double> device_free_mib() const {
#if GPUOPT_CUDA
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(fixture_->device()) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return static_cast<double>(free_bytes) / (1 << 20);
#else
    return std::nullopt;
#endif
  }
};

}  // namespace

std::vector<std::string> testcase_keys() {
  return {"ingest", "cold-open", "exact-cpu", "ivf-cpu", "exact-gpu"};
}

Suite make_suite(const BenchOptions& bench, const VectorBenchOptions& options) {
  auto fixture = std::make_shared<Fixture>(bench, options);
  Suite suite("vector");
  suite.add(std::make_unique<IngestTestcase>(fixture));
  suite.add(std::make_unique<ColdOpenTestcase>(fixture));
  suite.add(std::make_unique<ExactCpuTestcase>(fixture));
  suite.add(std::make_unique<IvfCpuTestcase>(fixture));
  suite.add(std::make_unique<ExactGpuTestcase>(fixture));
  return suite;
}

int exit_code_for(const std::vector<TestcaseResult>& results) {
  int code = 0;
  for (const auto& result : results) {
    if (result.outcome == Outcome::kFailed) return 2;
    if (result.outcome == Outcome::kPassed && result.data.is_object() &&
        result.data.value("criteria_met", true) == false) {
      code = 1;
    }
  }
  return code;
}

}  // namespace gpuopt::bench::vector_bench
