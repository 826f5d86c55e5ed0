// `gpuopt vector serve|send` and `vector query --socket`: the cross-process server for a store
// (ingest and queries), a client that sends a vector file to it through shared memory, and one
// that sends it queries (binary protocol, see gpuopt/vector/ingest.hpp).
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "gpuopt/vector/store.hpp"
#include "gpuopt/vector/vector_file.hpp"
#include "numeric_checks.hpp"
#include "output_options.hpp"
#include "vector_socket_query.hpp"

namespace gpuopt::cli {
namespace {

using nlohmann::json;
namespace vec = gpuopt::vector;

struct ServeArgs {
  std::string directory;
  std::string socket;
  std::string file;
  std::string collection = vec::kDefaultCollection;
  std::size_t batch = 10000;
  std::size_t limit = 0;
  long long start_id = -1;
  bool upsert = false;
  OutputOptions out;  // --json; -o/--output (send: its summary)
  int timeout_s = 30;
  int max_connections = 256;
  bool read_only = false;
  int gpu_device = 0;
};

int fail(const ServeArgs& args, const Status& status) {
  if (args.out.json) {
    json error = {
        {"schema_version", 1},
        {"error", {{"code", status_code_name(status.code())}, {"message", status.message()}}}};
    write_output("vector", args.out, error.dump() + "\n");
  }
  print_error("vector", status);
  return kExitErrors;
}

// The server the signal handler stops (request_stop only writes to a pipe: async-signal-safe).
std::atomic<vec::IngestServer*> g_server{nullptr};

void stop_on_signal(int) {
  if (auto* server = g_server.load()) server->request_stop();
}

// Prints one line per event, flushed, so a caller reading the pipe sees each commit as it lands.
void emit(bool as_json, const json& event, const std::string& text) {
  if (as_json) {
    std::printf("%s\n", event.dump().c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  std::fflush(stdout);
}

int run_serve(const ServeArgs& args) {
  vec::OpenOptions open_options;
  open_options.read_only = args.read_only;
  auto store = vec::Store::open(args.directory, open_options);
  if (!store.ok()) return fail(args, store.status());
  // The server is the store's writer: take the lock now, so a second writer (another serve, an
  // import) is refused by name instead of the two taking turns batch by batch.
  if (!(*store)->read_only()) {
    Status locked = (*store)->lock_for_writing();
    if (!locked.ok()) return fail(args, locked);
  }
  std::atomic<std::uint64_t> batches{0}, rows{0}, rejected{0}, queries{0};
  vec::IngestServerOptions options;
  options.receive_timeout_s = args.timeout_s;
  options.max_connections = args.max_connections;
  options.query.gpu.device = args.gpu_device;
  options.on_query = [&](const vec::IngestRequest& request, const vec::QueryReport&) {
    queries += request.rows;
  };
  options.on_commit = [&](const vec::IngestRequest& request, std::uint64_t total) {
    ++batches;
    rows += request.rows;
    emit(
        args.out.json,
        {{"event", "committed"},
         {"collection", request.collection},
         {"rows", request.rows},
         {"total", total},
         {"payload", request.payload == vec::IngestPayload::kCudaIpc ? "cuda_ipc"
                     : request.payload == vec::IngestPayload::kShm   ? "shm"
                                                                     : "memfd"}},
        fmt::format("committed {} rows into {} total {}", request.rows, request.collection, total));
  };
  options.on_error = [&](const vec::IngestReply& reply) {
    ++rejected;
    emit(args.out.json,
         {{"event", "rejected"},
          {"request_id", reply.request_id},
          {"code", status_code_name(reply.code)},
          {"message", reply.message}},
         fmt::format("rejected request {}: {}: {}", reply.request_id, status_code_name(reply.code),
                     reply.message));
  };
  auto server = vec::IngestServer::start(store->get(), args.socket, options);
  if (!server.ok()) return fail(args, server.status());
  g_server = server->get();
  struct sigaction action {};
  action.sa_handler = stop_on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  json collections = json::array();
  for (const auto& name : (*store)->collection_names()) {
    auto collection = (*store)->collection(name);
    if (collection.ok()) {
      collections.push_back(
          {{"name", name}, {"dim", (*collection)->dim()}, {"count", (*collection)->size()}});
    }
  }
  emit(args.out.json,
       {{"schema_version", 1},
        {"event", "listening"},
        {"directory", args.directory},
        {"socket", args.socket},
        {"read_only", (*store)->read_only()},
        {"collections", collections}},
       fmt::format("serving {} on {}{} (Ctrl-C stops)", args.directory, args.socket,
                   (*store)->read_only() ? ", read-only: queries and counts only" : ""));
  Status served = (*server)->serve();
  g_server = nullptr;
  server->reset();
  if (!served.ok()) return fail(args, served);
  emit(args.out.json,
       {{"event", "stopped"},
        {"batches", batches.load()},
        {"rows", rows.load()},
        {"queries", queries.load()},
        {"rejected", rejected.load()}},
       fmt::format("stopped: {} batches, {} rows committed, {} queries answered, {} requests "
                   "rejected",
                   batches.load(), rows.load(), queries.load(), rejected.load()));
  return kExitOk;
}

// Sends a vector file in batches; each printed total was acknowledged after the server's commit.
int run_send(const ServeArgs& args) {
  auto file = vec::read_vector_file(args.file, args.limit);
  if (!file.ok()) return fail(args, file.status());
  auto client = vec::IngestClient::connect(args.socket, args.timeout_s);
  if (!client.ok()) return fail(args, client.status());
  std::uint64_t next_id;
  if (args.start_id >= 0) {
    next_id = static_cast<std::uint64_t>(args.start_id);
  } else {
    auto count = (*client)->count(args.collection);
    if (!count.ok()) return fail(args, count.status());
    next_id = *count;
  }
  const std::size_t batch = std::max<std::size_t>(1, args.batch);
  auto buffer =
      vec::ShmBuffer::create(std::min(batch, std::max<std::size_t>(1, file->rows)), file->dim);
  if (!buffer.ok()) return fail(args, buffer.status());
  std::vector<std::uint64_t> ids;
  std::uint64_t total = 0;
  auto start = std::chrono::steady_clock::now();
  for (std::size_t begin = 0; begin < file->rows; begin += batch) {
    std::size_t rows = std::min(batch, file->rows - begin);
    ids.resize(rows);
    for (std::size_t i = 0; i < rows; ++i) ids[i] = next_id + begin + i;
    std::copy_n(file->values.data() + begin * file->dim, rows * file->dim, (*buffer)->vectors());
    auto acknowledged = (*client)->add(args.collection, ids, **buffer, args.upsert);
    if (!acknowledged.ok()) return fail(args, acknowledged.status().with_context(args.file));
    total = *acknowledged;
    emit(args.out.json, {{"committed", begin + rows}, {"total", total}},
         fmt::format("committed {} total {}", begin + rows, total));
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rate = seconds > 0 ? double(file->rows) / seconds : 0;
  // The summary is the command's result: stdout, or --output (the per-batch lines stay on stdout).
  const json summary = {{"schema_version", 1}, {"file", args.file},  {"sent", file->rows},
                        {"total", total},      {"seconds", seconds}, {"vectors_per_s", rate}};
  const std::string text =
      args.out.json
          ? summary.dump() + "\n"
          : fmt::format("sent {} vectors from {} in {:.3f} s ({:.0f} vectors/s), total {}\n",
                        file->rows, args.file, seconds, rate, total);
  return write_output("vector", args.out, text) ? kExitOk : kExitToolFailed;
}

}  // namespace

int run_socket_query(const SocketQueryArgs& args) {
  ServeArgs for_errors;
  for_errors.out = args.out;
  auto engine = vec::parse_query_engine(args.engine);
  if (!engine.ok()) return fail(for_errors, engine.status());
  auto index = vec::parse_index_kind(args.index);
  if (!index.ok()) return fail(for_errors, index.status());
  auto file = vec::read_vector_file(args.file, args.limit);
  if (!file.ok()) return fail(for_errors, file.status());
  auto client = vec::IngestClient::connect(args.socket);
  if (!client.ok()) return fail(for_errors, client.status());
  vec::QueryOptions options;
  options.k = args.k;
  options.index = *index;
  options.nprobe = args.nprobe;
  options.where_json = args.where;
  options.engine = *engine;
  vec::QueryReport report;
  StatusOr<vec::SearchResults> results = vec::SearchResults{};
  std::vector<double> times;
  for (int r = 0; r < std::max(1, args.repeat); ++r) {
    auto start = std::chrono::steady_clock::now();
    results = (*client)->query(args.collection, file->values.data(), file->rows, file->dim, options,
                               &report);
    if (!results.ok()) return fail(for_errors, results.status().with_context(args.socket));
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const double query_seconds = times[times.size() / 2];
  const double qps = query_seconds > 0 ? double(file->rows) / query_seconds : 0;
  const std::string answered(vec::query_engine_name(report.engine));
  if (args.out.json) {
    json hits = json::array();
    for (const auto& per_query : *results) {
      json row = json::array();
      for (const auto& hit : per_query) row.push_back({{"id", hit.id}, {"distance", hit.distance}});
      hits.push_back(std::move(row));
    }
    json out = {{"schema_version", 1},   {"socket", args.socket},
                {"engine", answered},    {"index", args.index},
                {"k", args.k},           {"nprobe", args.nprobe},
                {"queries", file->rows}, {"query_seconds", query_seconds},
                {"queries_per_s", qps},  {"results", std::move(hits)}};
    return write_output("vector", args.out, out.dump() + "\n") ? kExitOk : kExitToolFailed;
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
  text += fmt::format(
      "{} queries, k={}, index {}, answered by {} on the server at {}: {:.3f} s ({:.0f} "
      "queries/s, round trips included)\n",
      file->rows, args.k, args.index, answered, args.socket, query_seconds, qps);
  return write_output("vector", args.out, text) ? kExitOk : kExitToolFailed;
}

namespace {

// Runs after vector_command.cpp (order 70) has added the `vector` group.
GPUOPT_REGISTER_COMMAND("", 71, [](CLI::App& parent, int& exit_code) {
  CLI::App* vector = parent.get_subcommand("vector");
  {
    auto args = std::make_shared<ServeArgs>();
    CLI::App* command = vector->add_subcommand(
        "serve",
        "Serve a store over a Unix socket: vectors from other processes (shm or CUDA IPC) and "
        "queries (`vector query --socket`)");
    command->add_option("DIR", args->directory, "store directory")->required();
    command->add_option("--socket", args->socket, "Unix socket path (created with mode 0600)")
        ->required();
    command
        ->add_option("--timeout", args->timeout_s,
                     "seconds a client may stall mid-message (default 30)")
        ->check(whole_number_at_least(1));
    command
        ->add_option("--max-connections", args->max_connections,
                     "clients served at once; one more is told so and closed (default 256)")
        ->check(whole_number_at_least(1));
    command->add_flag("--json", args->out.json, "one JSON object per event on stdout");
    command->add_flag("--read-only", args->read_only,
                      "answer queries and counts only; take no writer lock");
    command
        ->add_option("--gpu-device", args->gpu_device,
                     "device of queries with --engine gpu/auto (default 0)")
        ->check(whole_number_at_least(0));
    command->callback([args, &exit_code] { exit_code = run_serve(*args); });
  }
  {
    auto args = std::make_shared<ServeArgs>();
    CLI::App* command = vector->add_subcommand(
        "send", "Send a vector file to `gpuopt vector serve`; prints each acknowledged total");
    command->add_option("FILE", args->file, "vector file (fvecs, npy or IDX)")->required();
    command->add_option("--socket", args->socket, "the server's socket")->required();
    command->add_option("--collection", args->collection, "collection name (default: default)");
    command->add_option("--batch", args->batch, "vectors per commit (default 10000)")
        ->check(whole_number_at_least(1));
    command->add_option("--limit", args->limit, "send at most this many vectors")
        ->check(whole_number_at_least(0));
    command
        ->add_option("--start-id", args->start_id,
                     "id of the first vector (default: the collection's count)")
        ->check(whole_number_at_least(0));
    command->add_flag("--upsert", args->upsert, "replace ids that exist instead of failing");
    command->add_option("--timeout", args->timeout_s, "seconds to wait for each reply (default 30)")
        ->check(whole_number_at_least(1));
    OutputFlags flags;
    flags.json_help =
        "JSON instead of text: a line per batch on stdout, then the summary (to stdout, or to "
        "--output)";
    add_output_flags(*command, args->out, flags);
    command->callback([args, &exit_code] {
      exit_code = output_usable("vector", args->out) ? run_send(*args) : kExitErrors;
    });
  }
});

}  // namespace
}  // namespace gpuopt::cli
