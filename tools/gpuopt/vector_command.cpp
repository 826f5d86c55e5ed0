// `gpuopt vector create|import|query|info`: the embedded vector store from the command line.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"
#include "numeric_checks.hpp"
#include "vector_socket_query.hpp"

namespace gpuopt::cli {
namespace {

using nlohmann::json;
namespace vec = gpuopt::vector;

struct VectorArgs {
  std::string directory;
  std::string file;
  std::string collection = vec::kDefaultCollection;
  bool json = false;
  // create
  std::size_t dim = 0;
  std::string metric = "l2";
  // import
  std::size_t batch = 10000;
  std::size_t limit = 0;
  long long start_id = -1;
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
  std::string socket;  // ask `gpuopt vector serve` there instead of opening DIR
  // info
  bool verify = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int fail(const VectorArgs& args, const Status& status) {
  if (args.json) {
    json error = {
        {"schema_version", 1},
        {"error", {{"code", status_code_name(status.code())}, {"message", status.message()}}}};
    std::printf("%s\n", error.dump(2).c_str());
  }
  std::fprintf(stderr, "gpuopt vector: %s\n", status.to_string().c_str());
  return kExitErrors;
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
  if (args.json) {
    json out = {{"schema_version", 1},
                {"directory", args.directory},
                {"collection", args.collection},
                {"dim", args.dim},
                {"metric", args.metric}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("created %s (collection %s, dimension %zu, metric %s)\n", args.directory.c_str(),
                args.collection.c_str(), args.dim, args.metric.c_str());
  }
  return kExitOk;
}

// Commits in batches and prints the store's total after each commit, flushed, so a caller that
// kills the import knows what was acknowledged.
int run_import(const VectorArgs& args) {
  std::unique_ptr<vec::Store> store;
  auto collection = open_collection(args, store);
  if (!collection.ok()) return fail(args, collection.status());
  auto start = std::chrono::steady_clock::now();
  auto file = vec::read_vector_file(args.file, args.limit);
  if (!file.ok()) return fail(args, file.status());
  double read_seconds = seconds_since(start);
  if (file->dim != (*collection)->dim()) {
    return fail(args, invalid_argument(fmt::format(
                          "{}: vectors have dimension {}, collection \"{}\" has {}", args.file,
                          file->dim, args.collection, (*collection)->dim())));
  }
  std::uint64_t next_id;
  if (args.start_id >= 0) {
    next_id = static_cast<std::uint64_t>(args.start_id);
  } else {
    auto free_id = (*collection)->next_free_id();
    if (!free_id.ok()) return fail(args, free_id.status());
    next_id = *free_id;
  }
  std::size_t batch = std::max<std::size_t>(1, args.batch);
  std::vector<std::uint64_t> ids;
  auto ingest_start = std::chrono::steady_clock::now();
  for (std::size_t begin = 0; begin < file->rows; begin += batch) {
    std::size_t rows = std::min(batch, file->rows - begin);
    ids.resize(rows);
    for (std::size_t i = 0; i < rows; ++i) ids[i] = next_id + begin + i;
    Status status = (*collection)->add(ids, file->values.data() + begin * file->dim);
    if (!status.ok()) return fail(args, status.with_context(args.file));
    if (args.json) {
      std::printf(
          "%s\n",
          json({{"committed", begin + rows}, {"total", (*collection)->size()}}).dump().c_str());
    } else {
      std::printf("committed %zu total %zu\n", begin + rows, (*collection)->size());
    }
    std::fflush(stdout);
  }
  double ingest_seconds = seconds_since(ingest_start);
  double rate = ingest_seconds > 0 ? double(file->rows) / ingest_seconds : 0;
  if (args.json) {
    json out = {{"schema_version", 1},
                {"file", args.file},
                {"format", file->format},
                {"imported", file->rows},
                {"total", (*collection)->size()},
                {"read_seconds", read_seconds},
                {"ingest_seconds", ingest_seconds},
                {"ingest_vectors_per_s", rate}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("imported %zu vectors from %s (%s) in %.3f s (%.0f vectors/s, read %.3f s)\n",
                file->rows, args.file.c_str(), file->format.c_str(), ingest_seconds, rate,
                read_seconds);
  }
  return kExitOk;
}

// Exact search on the GPU through Collection::query: the first (untimed) search copies the
// collection's rows to the device (timed separately), then `--repeat` searches give the median.
int run_query_gpu(const VectorArgs& args, vec::Collection& collection, const vec::VectorFile& file,
                  vec::QueryOptions options, double open_seconds) {
  if (args.index != "exact") {
    return fail(args, unimplemented("--engine gpu supports --index exact only"));
  }
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
    if (r == 0) upload_seconds = report.gpu_upload_seconds;
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
  if (args.json) {
    json out = {{"schema_version", 1},
                {"engine", "gpu"},
                {"index", "exact"},
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
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "%s%zu queries, k=%zu, GPU exact (%s): %.3f ms median of %zu (%.0f queries/s), "
        "upload %.2f s, open %.1f ms\n",
        text.c_str(), file.rows, args.k, args.precision.c_str(), query_seconds * 1e3, times.size(),
        qps, upload_seconds, open_seconds * 1e3);
  }
  return kExitOk;
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
                             args.show_all, args.json});
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
  if (args.engine == "gpu") return run_query_gpu(args, **collection, *file, options, open_seconds);
  if (args.engine != "cpu") {
    return fail(args,
                invalid_argument(fmt::format("--engine {}: expected cpu or gpu", args.engine)));
  }
  double build_seconds = 0;
  if (*index == vec::IndexKind::kIvf) {
    auto built = (*collection)->build_ivf(options.ivf, args.threads);
    if (!built.ok()) return fail(args, built.status());
    build_seconds = *built;
  }
  StatusOr<vec::SearchResults> results = vec::SearchResults{};
  std::vector<double> times;
  for (int r = 0; r < std::max(1, args.repeat); ++r) {
    auto start = std::chrono::steady_clock::now();
    results = (*collection)->query(file->values.data(), file->rows, options);
    if (!results.ok()) return fail(args, results.status().with_context(args.directory));
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  double query_seconds = times[times.size() / 2];
  double qps = query_seconds > 0 ? double(file->rows) / query_seconds : 0;
  if (args.json) {
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
                {"query_seconds", query_seconds},
                {"queries_per_s", qps},
                {"results", std::move(hits)}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::size_t shown = args.show_all ? results->size() : std::min<std::size_t>(results->size(), 5);
    for (std::size_t q = 0; q < shown; ++q) {
      std::string line = fmt::format("query {}:", q);
      for (const auto& hit : (*results)[q]) line += fmt::format(" {}:{:.4g}", hit.id, hit.distance);
      std::printf("%s\n", line.c_str());
    }
    if (shown < results->size()) {
      std::printf("... %zu more queries (--all shows them)\n", results->size() - shown);
    }
    std::printf("%zu queries, k=%zu, index %s: %.3f s (%.0f queries/s), open %.1f ms%s\n",
                file->rows, args.k, args.index.c_str(), query_seconds, qps, open_seconds * 1e3,
                *index == vec::IndexKind::kIvf
                    ? fmt::format(", IVF build {:.2f} s", build_seconds).c_str()
                    : "");
  }
  return kExitOk;
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
    collections.push_back({{"name", stats.name},
                           {"dim", stats.dim},
                           {"metric", vec::metric_name(stats.metric)},
                           {"count", stats.live},
                           {"deleted", stats.deleted},
                           {"segment_count", stats.segments.size()},
                           {"segment_bytes", stats.segment_bytes},
                           {"segments", std::move(segments)}});
    text += fmt::format(
        "collection {}: {} vectors, dimension {}, metric {}, {} deleted, {} "
        "segments, {:.1f} MiB{}\n",
        stats.name, stats.live, stats.dim, vec::metric_name(stats.metric), stats.deleted,
        stats.segments.size(), double(stats.segment_bytes) / (1 << 20),
        args.verify ? ", checksums verified" : "");
  }
  if (args.json) {
    json out = {{"schema_version", 1},
                {"directory", args.directory},
                {"open_seconds", open_seconds},
                {"verified", args.verify},
                {"collections", std::move(collections)}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("%s (opened in %.2f ms)\n%s", args.directory.c_str(), open_seconds * 1e3,
                text.c_str());
  }
  return kExitOk;
}

GPUOPT_REGISTER_COMMAND("", 70, [](CLI::App& parent, int& exit_code) {
  CLI::App* vector = parent.add_subcommand("vector",
                                           "Embedded vector store: create, import, "
                                           "query, info");
  vector->require_subcommand(1);
  auto common = [](CLI::App* command, std::shared_ptr<VectorArgs> args) {
    command->add_option("DIR", args->directory, "store directory")->required();
    command->add_option("--collection", args->collection, "collection name (default: default)");
    command->add_flag("--json", args->json, "JSON on stdout instead of text");
  };
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand("create", "Create a store and a collection");
    common(command, args);
    command->add_option("--dim", args->dim, "vector dimension")
        ->required()
        ->check(whole_number_at_least(1));
    command->add_option("--metric", args->metric, "l2, ip or cosine (default l2)");
    command->callback([args, &exit_code] { exit_code = run_create(*args); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand(
        "import", "Import vectors from fvecs, npy or IDX (gzip ok); prints each committed total");
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
    command->callback([args, &exit_code] { exit_code = run_import(*args); });
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
    // `query FILE --socket PATH` asks a running `gpuopt vector serve`: DIR is then left out, and
    // run_query takes the one positional as FILE.
    command->get_option("DIR")->required(false);
    command->get_option("FILE")->required(false);
    command->add_option("--socket", args->socket,
                        "ask the `gpuopt vector serve` listening here instead of opening DIR");
    command->callback([args, &exit_code] { exit_code = run_query(*args); });
  }
  {
    auto args = std::make_shared<VectorArgs>();
    CLI::App* command = vector->add_subcommand("info", "Collections, counts, segments and sizes");
    common(command, args);
    command->add_flag("--verify", args->verify, "check every segment's checksum");
    command->callback([args, &exit_code] { exit_code = run_info(*args); });
  }
});

}  // namespace
}  // namespace gpuopt::cli
