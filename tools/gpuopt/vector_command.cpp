// `gpuopt vector create|import|query|info|reindex`: the embedded vector store from the command
// line.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"
#include "numeric_checks.hpp"
#include "output_options.hpp"
#include "progress_line.hpp"
#include "vector_socket_query.hpp"

namespace gpuopt::cli {
namespace {

using nlohmann::json;
namespace vec = gpuopt::vector;

struct VectorArgs {
  std::string directory;
  std::string file;
  std::string collection = vec::kDefaultCollection;
  OutputOptions out;  // -o/--output, --json
  // create
  std::size_t dim = 0;
  std::string metric = "l2";
  // import
  std::size_t batch = 10000;
  std::size_t limit = 0;
  long long start_id = -1;
  std::string metadata;
  // query
  std::size_t k = 10;
  std::string index = "exact";
  std::size_t nprobe = 8;
  std::size_t nlist = 0;
  std::string where;
  int threads = 0;
  bool show_all = false;
  std::string engine = "cpu";
  std::string precision = "fp32";
  int repeat = 1;
  bool auto_retrain = false;
  std::string socket;  // ask `gpuopt vector serve` there instead of opening DIR
  // info
  bool verify = false;
  // reindex
  int iterations = 10;
};

// The process's anonymous resident memory (RssAnon of /proc/self/status: heap, buffers, no file
// pages) in bytes, or nullopt where the kernel does not report it.
std::optional<std::uint64_t> resident_anonymous_bytes() {
  std::FILE* status = std::fopen("/proc/self/status", "re");
  if (status == nullptr) return std::nullopt;
  std::optional<std::uint64_t> bytes;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "RssAnon: %llu kB", &kb) == 1) {
      bytes = static_cast<std::uint64_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(status);
  return bytes;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// With --json the error is the command's JSON output, so it goes where the result would have gone
// (stdout or --output); the message goes to stderr either way.
int fail(const VectorArgs& args, const Status& status) {
  if (args.out.json) {
    json error = {
        {"schema_version", 1},
        {"error", {{"code", status_code_name(status.code())}, {"message", status.message()}}}};
    write_output("vector", args.out, error.dump(2) + "\n");
  }
  print_error("vector", status);
  return kExitErrors;
}

// Writes the command's result (text or JSON) to stdout or --output.
int finish(const VectorArgs& args, const std::string& contents) {
  return write_output("vector", args.out, contents) ? kExitOk : kExitToolFailed;
}

StatusOr<vec::Collection*> open_collection(const VectorArgs& args,
                                           std::unique_ptr<vec::Store>& store) {
  GPUOPT_ASSIGN_OR_RETURN(store, vec::Store::open(args.directory));
  return store->collection(args.collection);
}

int run_create(const VectorArgs& args) {
  auto metric = vec::parse_metric(args.metric);
  if (!metric.ok()) return fail(args, metric.status());
  auto store = vec::Store::open(args.directory, {.create = true});
  if (!store.ok()) return fail(args, store.status());
  auto collection = (*store)->create_collection(args.collection, {args.dim, *metric});
  if (!collection.ok()) return fail(args, collection.status());
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"directory", args.directory},
                {"collection", args.collection},
                {"dim", args.dim},
                {"metric", args.metric}};
    return finish(args, out.dump(2) + "\n");
  }
  return finish(args, fmt::format("created {} (collection {}, dimension {}, metric {})\n",
                                  args.directory, args.collection, args.dim, args.metric));
}

// Streams the file in batches of --batch rows (memory stays at one batch, whatever the file's
// size), commits each batch and prints the store's total after each commit, flushed, so a caller
// that kills the import knows what was acknowledged. On a terminal a progress line on stderr
// replaces those lines; --metadata gives each row a JSON object, checked in full before the first
// commit.
int run_import(const VectorArgs& args) {
  std::unique_ptr<vec::Store> store;
  auto collection = open_collection(args, store);
  if (!collection.ok()) return fail(args, collection.status());
  auto reader = vec::VectorReader::open(args.file, {.drop_cache_behind = true});
  if (!reader.ok()) return fail(args, reader.status());
  vec::VectorReader& input = **reader;
  if (input.dim() != (*collection)->dim()) {
    return fail(args, invalid_argument(fmt::format(
                          "{}: vectors have dimension {}, collection \"{}\" has {}", args.file,
                          input.dim(), args.collection, (*collection)->dim())));
  }
  const std::size_t limit = args.limit == 0 ? std::numeric_limits<std::size_t>::max() : args.limit;
  std::optional<std::size_t> to_import;
  if (input.rows()) to_import = std::min(*input.rows(), limit);
  std::unique_ptr<vec::MetadataLineReader> metadata_reader;
  std::size_t metadata_lines = 0;
  if (!args.metadata.empty()) {
    // Every line is checked before anything is committed: a bad line fails the whole import.
    auto lines = vec::count_metadata_lines(args.metadata);
    if (!lines.ok()) return fail(args, lines.status());
    metadata_lines = *lines;
    if (input.rows() && metadata_lines != *input.rows()) {
      return fail(args, invalid_argument(fmt::format(
                            "{} has {} lines, {} has {} rows: give one JSON object per row, in "
                            "row order",
                            args.metadata, metadata_lines, args.file, *input.rows())));
    }
    auto opened = vec::MetadataLineReader::open(args.metadata);
    if (!opened.ok()) return fail(args, opened.status());
    metadata_reader = std::move(*opened);
  }
  std::uint64_t next_id;
  if (args.start_id >= 0) {
    next_id = static_cast<std::uint64_t>(args.start_id);
  } else {
    auto free_id = (*collection)->next_free_id();
    if (!free_id.ok()) return fail(args, free_id.status());
    next_id = *free_id;
  }
  const std::size_t batch = std::max<std::size_t>(1, args.batch);
  ProgressLine progress(!args.out.json, "importing", "rows");
  // Errors clear the progress line first, so the message starts on a line of its own.
  auto fail_import = [&](const Status& status) {
    progress.finish();
    return fail(args, status);
  };
  // The per-commit lines are for programs; a person at a terminal gets the progress line instead.
  const bool commit_lines = !(progress.active() && ::isatty(STDOUT_FILENO) == 1);
  std::vector<float> vectors;  // [batch, dim]
  std::vector<std::uint64_t> ids;
  std::vector<vec::Metadata> metadata;
  std::size_t imported = 0;
  double read_seconds = 0;
  // Sampled after each committed batch, where a batch's buffers are all alive: the peak of what
  // the import itself holds (were the input read whole, it would show here).
  std::optional<std::uint64_t> peak_anonymous_bytes;
  auto ingest_start = std::chrono::steady_clock::now();
  while (imported < limit) {
    const std::size_t want = std::min(batch, limit - imported);
    if (vectors.size() < want * input.dim()) vectors.resize(want * input.dim());
    auto read_start = std::chrono::steady_clock::now();
    auto rows = input.read(vectors.data(), want);
    if (!rows.ok()) return fail_import(rows.status());
    read_seconds += seconds_since(read_start);
    if (*rows == 0) break;
    if (metadata_reader) {
      metadata.clear();
      auto got = metadata_reader->read(*rows, &metadata);
      if (!got.ok()) return fail_import(got.status());
      if (*got != *rows) {
        return fail_import(invalid_argument(
            fmt::format("{} has {} lines, fewer than the rows of {}: give one JSON object "
                        "per row, in row order",
                        args.metadata, metadata_lines, args.file)));
      }
    }
    ids.resize(*rows);
    for (std::size_t i = 0; i < *rows; ++i) ids[i] = next_id + imported + i;
    Status status = (*collection)->add(ids, vectors.data(), metadata);
    if (!status.ok()) return fail_import(status.with_context(args.file));
    imported += *rows;
    if (auto anonymous = resident_anonymous_bytes()) {
      peak_anonymous_bytes = std::max(peak_anonymous_bytes.value_or(0), *anonymous);
    }
    if (commit_lines) {
      if (args.out.json) {
        std::printf(
            "%s\n",
            json({{"committed", imported}, {"total", (*collection)->size()}}).dump().c_str());
      } else {
        std::printf("committed %zu total %zu\n", imported, (*collection)->size());
      }
      std::fflush(stdout);
    }
    progress.update(
        imported, to_import,
        input.bytes_total() > 0 ? double(input.bytes_read()) / double(input.bytes_total()) : 0.0);
    if (*rows < want) break;
  }
  progress.finish();
  // A file whose length was unknown up front (gzip'd fvecs) is matched to its metadata here.
  if (metadata_reader && imported < limit && metadata_lines != imported) {
    return fail(args, invalid_argument(fmt::format(
                          "{} has {} lines, {} had {} rows (all imported): give one JSON object "
                          "per row, in row order",
                          args.metadata, metadata_lines, args.file, imported)));
  }
  double ingest_seconds = seconds_since(ingest_start);
  double rate = ingest_seconds > 0 ? double(imported) / ingest_seconds : 0;
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const std::uint64_t peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  const std::string format =
      fmt::format("{}, {}", std::string(input.format()), std::string(input.element_type()));
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"file", args.file},
                {"format", std::string(input.format())},
                {"element_type", std::string(input.element_type())},
                {"metadata", args.metadata.empty() ? json(nullptr) : json(args.metadata)},
                {"imported", imported},
                {"total", (*collection)->size()},
                {"batch", batch},
                {"read_seconds", read_seconds},
                {"ingest_seconds", ingest_seconds},
                {"ingest_vectors_per_s", rate},
                {"peak_rss_bytes", peak_rss_bytes},
                {"peak_anonymous_bytes",
                 peak_anonymous_bytes ? json(*peak_anonymous_bytes) : json(nullptr)}};
    return finish(args, out.dump() + "\n");
  }
  return finish(
      args, fmt::format("imported {} vectors from {} ({}{}) in {:.3f} s ({:.0f} "
                        "vectors/s, read {:.3f} s, peak RSS {:.0f} MiB)\n",
                        imported, args.file, format, args.metadata.empty() ? "" : ", with metadata",
                        ingest_seconds, rate, read_seconds, double(peak_rss_bytes) / (1 << 20)));
}

// What an IVF query did to the saved index, for people (stderr keeps stdout the results).
void print_ivf_note(const VectorArgs& args, vec::Collection& collection,
                    const vec::QueryReport& report) {
  if (args.index != "ivf") return;
  if (report.ivf_built || report.ivf_retrained) {
    auto stats = collection.ivf_stats();
    std::fprintf(
        stderr,
        "gpuopt vector: %s the IVF index (%zu lists, k-means on the %s, %.2f s) "
        "and saved it in the store\n",
        report.ivf_built ? "no IVF index was saved: built" : "drift past the threshold: retrained",
        stats.ok() ? stats->nlist : 0, stats.ok() ? stats->train_engine.c_str() : "?",
        report.ivf_build_seconds);
  } else if (args.nlist != 0) {
    auto stats = collection.ivf_stats();
    if (stats.ok() && stats->nlist != args.nlist) {
      std::fprintf(stderr,
                   "gpuopt vector: the saved IVF index has %zu lists; --nlist %zu applies when "
                   "one is built (`gpuopt vector reindex --nlist %zu` rebuilds it)\n",
                   stats->nlist, args.nlist, args.nlist);
    }
  }
}

// Exact search on the GPU through Collection::query: the first (untimed) search copies the
// collection's rows to the device (timed separately), then `--repeat` searches give the median.
int run_query_gpu(const VectorArgs& args, vec::Collection& collection, const vec::VectorFile& file,
                  vec::QueryOptions options, double open_seconds) {
  if (args.precision == "tf32") {
    options.gpu.precision = vec::GpuPrecision::kTf32Rerank;
  } else if (args.precision != "fp32") {
    return fail(args, invalid_argument(
                          fmt::format("--precision {}: expected fp32 or tf32", args.precision)));
  }
  options.engine = vec::QueryEngine::kGpu;
  StatusOr<vec::SearchResults> results = vec::SearchResults{};
  vec::QueryReport report;
  double upload_seconds = 0;
  std::vector<double> times;
  // One untimed warm-up (the copy to the device, cuBLAS heuristics, scratch), then the timed runs.
  for (int r = 0; r <= std::max(1, args.repeat); ++r) {
    auto start = std::chrono::steady_clock::now();
    results = collection.query(file.values.data(), file.rows, options, &report);
    if (!results.ok()) return fail(args, results.status());
    if (r == 0) {
      upload_seconds = report.gpu_upload_seconds;
      if (!args.out.json) print_ivf_note(args, collection, report);
    }
    if (r > 0) times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  double query_seconds = times[times.size() / 2];
  json hits = json::array();
  std::string text;
  for (std::size_t q = 0; q < file.rows; ++q) {
    json row = json::array();
    std::string line = fmt::format("query {}:", q);
    for (const auto& hit : (*results)[q]) {
      row.push_back({{"id", hit.id}, {"distance", hit.distance}});
      line += fmt::format(" {}:{:.4g}", hit.id, hit.distance);
    }
    hits.push_back(std::move(row));
    if (q < 5 || args.show_all) text += line + "\n";
  }
  double qps = query_seconds > 0 ? double(file.rows) / query_seconds : 0;
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"engine", "gpu"},
                {"index", args.index},
                {"nprobe", args.nprobe},
                {"precision", args.precision},
                {"k", args.k},
                {"queries", file.rows},
                {"rows", collection.size()},
                {"open_seconds", open_seconds},
                {"upload_seconds", upload_seconds},
                {"query_seconds", query_seconds},
                {"query_seconds_all", times},
                {"queries_per_s", qps},
                {"results", std::move(hits)}};
    return finish(args, out.dump() + "\n");
  }
  return finish(args, fmt::format("{}{} queries, k={}, GPU {} ({}): {:.3f} ms median of {} "
                                  "({:.0f} queries/s), upload {:.2f} s, open {:.1f} ms\n",
                                  text, file.rows, args.k,
                                  args.index == "ivf" ? fmt::format("IVF nprobe {}", args.nprobe)
                                                      : std::string("exact"),
                                  args.precision, query_seconds * 1e3, times.size(), qps,
                                  upload_seconds, open_seconds * 1e3));
}

int run_query(const VectorArgs& args) {
  if (!args.socket.empty()) {
    // One positional fills DIR first: with --socket it is the query file.
    if (!args.file.empty() || args.precision != "fp32" || args.threads != 0) {
      return fail(args, invalid_argument("query --socket PATH FILE: give no DIR, --precision or "
                                         "--threads (the server's store and settings answer)"));
    }
    if (args.directory.empty()) return fail(args, invalid_argument("query: FILE is required"));
    return run_socket_query({args.socket, args.directory, args.collection, args.k, args.index,
                             args.nprobe, args.where, args.engine, args.limit, args.repeat,
                             args.show_all, args.out});
  }
  if (args.directory.empty() || args.file.empty()) {
    return fail(args, invalid_argument("query needs DIR and FILE (or FILE --socket PATH)"));
  }
  if (args.engine == "cpu" && args.precision != "fp32") {
    // The CPU engine computes in fp32 only: taking another precision silently would report
    // figures for a mode that did not run.
    return fail(args, invalid_argument(fmt::format(
                          "--precision {} needs --engine gpu; the CPU engine computes in fp32",
                          args.precision)));
  }
  auto open_start = std::chrono::steady_clock::now();
  std::unique_ptr<vec::Store> store;
  auto collection = open_collection(args, store);
  if (!collection.ok()) return fail(args, collection.status());
  double open_seconds = seconds_since(open_start);
  auto index = vec::parse_index_kind(args.index);
  if (!index.ok()) return fail(args, index.status());
  auto file = vec::read_vector_file(args.file, args.limit);
  if (!file.ok()) return fail(args, file.status());
  if (file->dim != (*collection)->dim()) {
    return fail(args, invalid_argument(fmt::format(
                          "{}: queries have dimension {}, collection \"{}\" has {}", args.file,
                          file->dim, args.collection, (*collection)->dim())));
  }
  vec::QueryOptions options;
  options.k = args.k;
  options.index = *index;
  options.nprobe = args.nprobe;
  options.ivf.nlist = args.nlist;
  options.where_json = args.where;
  options.threads = args.threads;
  options.ivf.auto_retrain = args.auto_retrain;
  if (args.engine == "gpu") return run_query_gpu(args, **collection, *file, options, open_seconds);
  if (args.engine != "cpu") {
    return fail(args,
                invalid_argument(fmt::format("--engine {}: expected cpu or gpu", args.engine)));
  }
  // The IVF index is the store's: the first query loads it (or builds and saves one when none is
  // saved, which is timed apart as build_seconds).
  double build_seconds = 0;
  bool built = false;
  StatusOr<vec::SearchResults> results = vec::SearchResults{};
  std::vector<double> times;
  for (int r = 0; r < std::max(1, args.repeat); ++r) {
    auto start = std::chrono::steady_clock::now();
    vec::QueryReport report;
    results = (*collection)->query(file->values.data(), file->rows, options, &report);
    if (!results.ok()) return fail(args, results.status().with_context(args.directory));
    double seconds = seconds_since(start);
    if (report.ivf_built || report.ivf_retrained) {
      built = true;
      build_seconds = report.ivf_build_seconds;
      seconds -= report.ivf_build_seconds;
    }
    if (r == 0 && !args.out.json) print_ivf_note(args, **collection, report);
    times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  double query_seconds = times[times.size() / 2];
  double qps = query_seconds > 0 ? double(file->rows) / query_seconds : 0;
  if (args.out.json) {
    json hits = json::array();
    for (const auto& per_query : *results) {
      json row = json::array();
      for (const auto& hit : per_query) row.push_back({{"id", hit.id}, {"distance", hit.distance}});
      hits.push_back(std::move(row));
    }
    json out = {{"schema_version", 1},
                {"index", args.index},
                {"k", args.k},
                {"nprobe", args.nprobe},
                {"queries", file->rows},
                {"open_seconds", open_seconds},
                {"build_seconds", build_seconds},
                {"index_built", built},
                {"query_seconds", query_seconds},
                {"queries_per_s", qps},
                {"results", std::move(hits)}};
    return finish(args, out.dump() + "\n");
  }
  std::string text;
  std::size_t shown = args.show_all ? results->size() : std::min<std::size_t>(results->size(), 5);
  for (std::size_t q = 0; q < shown; ++q) {
    text += fmt::format("query {}:", q);
    for (const auto& hit : (*results)[q]) text += fmt::format(" {}:{:.4g}", hit.id, hit.distance);
    text += "\n";
  }
  if (shown < results->size()) {
    text += fmt::format("... {} more queries (--all shows them)\n", results->size() - shown);
  }
  text += fmt::format("{} queries, k={}, index {}: {:.3f} s ({:.0f} queries/s), open {:.1f} ms{}\n",
                      file->rows, args.k, args.index, query_seconds, qps, open_seconds * 1e3,
                      built ? fmt::format(", IVF build {:.2f} s", build_seconds) : "");
  return finish(args, text);
}

int run_info(const VectorArgs& args) {
  auto start = std::chrono::steady_clock::now();
  auto store = vec::Store::open(args.directory);
  if (!store.ok()) return fail(args, store.status());
  double open_seconds = seconds_since(start);
  json collections = json::array();
  std::string text;
  for (const auto& name : (*store)->collection_names()) {
    auto collection = (*store)->collection(name);
    if (!collection.ok()) return fail(args, collection.status());
    if (args.verify) {
      Status verified = (*collection)->verify();
      if (!verified.ok()) return fail(args, verified);
    }
    auto stats = (*collection)->stats();
    json segments = json::array();
    for (const auto& segment : stats.segments) {
      segments.push_back({{"sequence", segment.sequence},
                          {"file", segment.file},
                          {"rows", segment.rows},
                          {"bytes", segment.bytes},
                          {"verified", segment.verified}});
    }
    const auto& ivf = stats.ivf;
    json ivf_json = nullptr;
    if (ivf.present) {
      ivf_json = {{"file", ivf.file},
                  {"error", ivf.error.empty() ? json(nullptr) : json(ivf.error)},
                  {"generation", ivf.generation},
                  {"nlist", ivf.nlist},
                  {"train_engine", ivf.train_engine},
                  {"train_seconds", ivf.train_seconds},
                  {"trained_rows", ivf.trained_rows},
                  {"rows_since_training", ivf.rows_since_training},
                  {"growth", ivf.growth},
                  {"trained_mean_distance", ivf.trained_mean_distance},
                  {"added_mean_distance", ivf.added_mean_distance},
                  {"distance_ratio", ivf.distance_ratio},
                  {"retrain_recommended", ivf.retrain_recommended}};
    }
    collections.push_back({{"name", stats.name},
                           {"dim", stats.dim},
                           {"metric", vec::metric_name(stats.metric)},
                           {"count", stats.live},
                           {"deleted", stats.deleted},
                           {"segment_count", stats.segments.size()},
                           {"segment_bytes", stats.segment_bytes},
                           {"segments", std::move(segments)},
                           {"ivf", std::move(ivf_json)}});
    text += fmt::format(
        "collection {}: {} vectors, dimension {}, metric {}, {} deleted, {} "
        "segments, {:.1f} MiB{}\n",
        stats.name, stats.live, stats.dim, vec::metric_name(stats.metric), stats.deleted,
        stats.segments.size(), double(stats.segment_bytes) / (1 << 20),
        args.verify ? ", checksums verified" : "");
    if (!ivf.present) {
      text += "  IVF index: none saved (the first `query --index ivf` or `reindex` builds one)\n";
    } else if (!ivf.error.empty()) {
      text += fmt::format("  IVF index: unusable: {}\n", ivf.error);
    } else {
      text += fmt::format(
          "  IVF index: {} lists, trained on {} rows ({}, {:.2f} s), {} rows added since "
          "(growth {:.2f}, distance ratio {:.2f}){}\n",
          ivf.nlist, ivf.trained_rows, ivf.train_engine, ivf.train_seconds, ivf.rows_since_training,
          ivf.growth, ivf.distance_ratio,
          ivf.retrain_recommended ? ", retrain recommended (`gpuopt vector reindex`)" : "");
    }
  }
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"directory", args.directory},
                {"open_seconds", open_seconds},
                {"verified", args.verify},
                {"collections", std::move(collections)}};
    return finish(args, out.dump(2) + "\n");
  }
  return finish(
      args, fmt::format("{} (opened in {:.2f} ms)\n{}", args.directory, open_seconds * 1e3, text));
}

int run_reindex(const VectorArgs& args) {
  std::unique_ptr<vec::Store> store;
  auto collection = open_collection(args, store);
  if (!collection.ok()) return fail(args, collection.status());
  vec::IvfParams params;
  params.nlist = args.nlist;
  params.iterations = args.iterations;
  if (args.engine == "cpu") {
    params.engine = vec::QueryEngine::kCpu;
  } else if (args.engine == "gpu") {
    params.engine = vec::QueryEngine::kGpu;
  } else if (args.engine != "auto") {
    return fail(
        args, invalid_argument(fmt::format("--engine {}: expected cpu, gpu or auto", args.engine)));
  }
  auto start = std::chrono::steady_clock::now();
  auto trained = (*collection)->build_ivf(params, args.threads);
  if (!trained.ok()) return fail(args, trained.status().with_context(args.directory));
  double seconds = seconds_since(start);
  auto stats = (*collection)->ivf_stats();
  if (!stats.ok()) return fail(args, stats.status());
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"collection", args.collection},
                {"nlist", stats->nlist},
                {"rows", stats->trained_rows},
                {"train_engine", stats->train_engine},
                {"build_seconds", *trained},
                {"seconds", seconds},
                {"file", stats->file},
                {"generation", stats->generation}};
    return finish(args, out.dump() + "\n");
  }
  return finish(args, fmt::format("IVF index of \"{}\": {} lists over {} rows, k-means on the {}, "
                                  "built in {:.2f} s, saved as {}\n",
                                  args.collection, stats->nlist, stats->trained_rows,
                                  stats->train_engine, *trained, stats->file));
}

GPUOPT_REGISTER_COMMAND("", 70, [](CLI::App& parent, int& exit_code) {
  CLI::App* vector = parent.add_subcommand("vector",
                                           "Embedded vector store: create, import, "
                                           "query, info, reindex");
  vector->require_subcommand(1);
  auto common = [](CLI::App* command, std::shared_ptr<VectorArgs> args) {
    command->add_option("DIR", args->directory, "store directory")->required();
    command->add_option("--collection", args->collection, "collection name (default: default)");
    add_output_flags(*command, args->out);
  };
  // -o/--output is checked before the command touches the store.
  auto run = [&exit_code](std::shared_ptr<VectorArgs> args, int (*command)(const VectorArgs&)) {
    exit_code = output_usable("vector", args->out) ? command(*args) : kExitErrors;
  };
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand("create", "Create a store and a collection");
    common(command, args);
    command->add_option("--dim", args->dim, "vector dimension")
        ->required()
        ->check(whole_number_at_least(1));
    command->add_option("--metric", args->metric, "l2, ip or cosine (default l2)");
    command->callback([args, run] { run(args, run_create); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand(
        "import",
        "Import vectors from fvecs, bvecs, ivecs, npy (float32/float16/float64/uint8) or IDX "
        "(gzip ok), streamed in batches; prints each committed total");
    common(command, args);
    command->add_option("FILE", args->file, "vector file")->required();
    command->add_option("--batch", args->batch, "vectors per commit (default 10000)")
        ->check(whole_number_at_least(1));
    command->add_option("--limit", args->limit, "import at most this many vectors")
        ->check(whole_number_at_least(0));
    command
        ->add_option("--start-id", args->start_id,
                     "id of the first vector (default: one past the largest id)")
        ->check(whole_number_at_least(0));
    command->add_option("--metadata", args->metadata,
                        "JSON Lines file: one flat JSON object per row, in row order, stored as "
                        "the rows' metadata (for query --where)");
    command->callback([args, run] { run(args, run_import); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command =
        vector->add_subcommand("query", "k nearest neighbours of each query vector");
    common(command, args);
    command->add_option("FILE", args->file, "query vectors (fvecs, npy or IDX)")->required();
    command->add_option("--k", args->k, "neighbours per query (default 10)")
        ->check(whole_number_at_least(1));
    command->add_option("--index", args->index, "exact or ivf (default exact)");
    command->add_option("--nprobe", args->nprobe, "IVF lists probed per query (default 8)")
        ->check(whole_number_at_least(1));
    command->add_option("--nlist", args->nlist, "IVF lists (default about 4*sqrt(rows))")
        ->check(whole_number_at_least(0));
    command->add_option("--where", args->where, "Chroma-style metadata filter (JSON)");
    command->add_option("--limit", args->limit, "use at most this many queries")
        ->check(whole_number_at_least(0));
    command->add_option("--threads", args->threads, "CPU threads (default all)")
        ->check(whole_number_at_least(0));
    command->add_flag("--all", args->show_all, "print every query's results (text mode)");
    command->add_option("--engine", args->engine, "cpu or gpu (default cpu)");
    command->add_option("--precision", args->precision,
                        "GPU: fp32 (exact) or tf32 (tensor cores + exact re-rank)");
    command->add_option("--repeat", args->repeat, "run the search N times, report the median")
        ->check(whole_number_at_least(1));
    command->add_flag("--auto-retrain", args->auto_retrain,
                      "IVF: retrain the saved index first when info recommends it");
    // `query FILE --socket PATH` asks a running `gpuopt vector serve`: DIR is then left out, and
    // run_query takes the one positional as FILE.
    command->get_option("DIR")->required(false);
    command->get_option("FILE")->required(false);
    command->add_option("--socket", args->socket,
                        "ask the `gpuopt vector serve` listening here instead of opening DIR");
    command->callback([args, run] { run(args, run_query); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand("info", "Collections, counts, segments and sizes");
    common(command, args);
    command->add_flag("--verify", args->verify, "check every segment's checksum");
    command->callback([args, run] { run(args, run_info); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    args->engine = "auto";
    CLI::App* command = vector->add_subcommand(
        "reindex", "(Re)train the IVF index (k-means) and save it in the store");
    common(command, args);
    command->add_option("--nlist", args->nlist, "IVF lists (default about 4*sqrt(rows))")
        ->check(whole_number_at_least(0));
    command->add_option("--iterations", args->iterations, "k-means iterations (default 10)")
        ->check(whole_number_at_least(1));
    command->add_option("--engine", args->engine,
                        "where k-means runs: cpu, gpu or auto (default: the GPU when present)");
    command->add_option("--threads", args->threads, "CPU threads (default all)")
        ->check(whole_number_at_least(0));
    command->callback([args, run] { run(args, run_reindex); });
  }
});

}  // namespace
}  // namespace gpuopt::cli
