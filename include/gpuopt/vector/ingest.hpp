// Cross-process zero-copy ingest into a vector store: a binary, length-prefixed protocol over a
// Unix stream socket whose vectors travel through a sealed memfd passed with the frame, named
// POSIX shared memory or a CUDA IPC handle.
//
// Frame: u32 little-endian body length, then the body. Request body (little-endian, packed):
//   u32 magic "GVIQ" | u16 version | u16 op (1 add, 2 upsert, 3 count, 4 query) | u16 payload
//   (0 none, 1 shm, 2 CUDA IPC, 3 memfd) | u16 collection length | u32 dim | u64 rows | u64
//   request id |
//   collection bytes | payload descriptor | rows x u64 ids
//   A query (payload none, rows = number of queries) ends instead with: u32 k | u16 engine
//   (0 cpu, 1 gpu, 2 auto) | u16 index (0 exact, 1 ivf) | u32 nprobe | u32 where length |
//   where JSON | rows x dim fp32 queries.
//   shm descriptor:      u16 name length | name ("/gpuopt-ingest-" + 32 hex digits)
//   CUDA IPC descriptor: i32 device | 64-byte cudaIpcMemHandle_t | u64 byte offset
//   memfd descriptor:    none; the frame carries one file descriptor (SCM_RIGHTS, on its first
//                        bytes): a memfd sealed with F_SEAL_SHRINK and F_SEAL_GROW
// Either object holds [rows, dim] fp32 row-major from offset 0. A memfd is checked (seals, size
// >= rows*dim*4) and mapped: it cannot shrink, so reading it cannot fault, and the vectors go
// from the mapping straight into the segment file; it has no name, so a sender killed at any
// point leaves nothing behind. A named shm object is opened read-only and checked (owner =
// server user, mode exactly 0600, size) and then read with pread into the server's memory (one
// copy): its owner could shrink it at any time, which would fault a mapping. No JSON anywhere.
// Reply body: u32 magic "GVIR" | u16 version | u16 status code | u64 request id | u64 total live
// rows in the collection | u32 message length | message (at most 4096 bytes) | results. A
// success reply is sent only after the batch's SQLite transaction has committed, so an
// acknowledged total survives kill -9. Results, only in the reply to a successful query:
//   u32 query count | u32 engine that answered (0 cpu, 1 gpu) | per query: u32 hit count, then
//   hit count x (u64 id | f32 distance), closest first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {

inline constexpr std::uint32_t kIngestRequestMagic = 0x51495647;  // "GVIQ"
inline constexpr std::uint32_t kIngestReplyMagic = 0x52495647;    // "GVIR"
inline constexpr std::uint16_t kIngestVersion = 1;
// Largest frame body either side accepts: 8M ids plus headers.
inline constexpr std::size_t kIngestMaxBody = (std::size_t{64} << 20) + 4096;
inline constexpr const char* kIngestShmPrefix = "/gpuopt-ingest-";

enum class IngestOp : std::uint16_t { kAdd = 1, kUpsert = 2, kCount = 3, kQuery = 4 };
// Largest k a query message may ask for.
inline constexpr std::uint32_t kIngestMaxK = 4096;
// Longest `where` filter a query message may carry.
inline constexpr std::size_t kIngestMaxWhere = 65536;
enum class IngestPayload : std::uint16_t { kNone = 0, kShm = 1, kCudaIpc = 2, kMemfd = 3 };

struct IngestRequest {
  IngestOp op = IngestOp::kAdd;
  IngestPayload payload = IngestPayload::kNone;
  std::string collection;
  std::uint32_t dim = 0;
  std::uint64_t rows = 0;
  std::uint64_t request_id = 0;
  std::string shm_name;  // kShm
  // kMemfd: the descriptor sent with the frame (not part of the body). The client's own; on the
  // server, the one received, owned by the connection for the request's lifetime.
  int memfd = -1;
  std::int32_t cuda_device = 0;                   // kCudaIpc
  std::array<std::uint8_t, 64> cuda_handle = {};  // kCudaIpc: cudaIpcMemHandle_t bytes
  std::uint64_t cuda_offset = 0;                  // kCudaIpc: bytes from the allocation start
  std::vector<std::uint64_t> ids;                 // [rows]; empty for a query
  // kQuery: what to ask; the queries are `rows` vectors of dimension `dim`.
  std::uint32_t k = 0;
  QueryEngine engine = QueryEngine::kCpu;
  IndexKind index = IndexKind::kExact;
  std::uint32_t nprobe = 0;
  std::string where_json;
  std::vector<float> queries;  // [rows, dim]
};

struct IngestReply {
  StatusCode code = StatusCode::kOk;
  std::uint64_t request_id = 0;
  std::uint64_t total = 0;  // live rows after the request (acknowledged when code is kOk)
  std::string message;      // what was wrong, when code is not kOk
  // The answer to a query: has_results is set and results[q] holds query q's hits.
  bool has_results = false;
  QueryEngine engine = QueryEngine::kCpu;  // the engine that answered
  SearchResults results;
};

// Body encoders/decoders (no length prefix). The parsers take untrusted bytes and return
// INVALID_ARGUMENT naming the field and offset that was wrong; they never read past `body`.
std::vector<std::uint8_t> encode_request(const IngestRequest& request);
StatusOr<IngestRequest> parse_request(std::span<const std::uint8_t> body);
std::vector<std::uint8_t> encode_reply(const IngestReply& reply);
StatusOr<IngestReply> parse_reply(std::span<const std::uint8_t> body);
// How many queries of top-k one message may carry so that the reply fits in a frame.
std::size_t max_queries_per_reply(std::size_t k);
// True when `name` is "/gpuopt-ingest-" followed by exactly 32 lowercase hex digits.
bool is_ingest_shm_name(std::string_view name);

struct IngestServerOptions {
  // Seconds a connection may stall mid-frame (or idle) before the server drops it.
  int receive_timeout_s = 30;
  // Connections served at once (each has a thread). One more is sent a RESOURCE_EXHAUSTED reply
  // saying so and closed, so a process that opens thousands cannot exhaust the server's threads.
  int max_connections = 256;
  // Called after each committed batch (under the server's write lock), e.g. to log it.
  std::function<void(const IngestRequest&, std::uint64_t total)> on_commit;
  // Called for each rejected request with the reply that was sent.
  std::function<void(const IngestReply&)> on_error;
  // Settings for queries beyond what a query message carries (GPU device and precision, IVF
  // training, threads); the message's k, engine, index, nprobe and filter replace those fields.
  QueryOptions query;
  // Called after each answered query (under the server's store lock).
  std::function<void(const IngestRequest&, const QueryReport&)> on_query;
};

// Serves one store: writes and queries. One thread per connection; requests take turns on the
// store (one lock), so every client shares the server's one view of each collection, including
// the GPU engine's device copy of its rows. The socket file is created with mode 0600 and only
// peers with the server's uid (or root) are served. A server on a read-only store answers
// queries and counts and refuses writes.
class IngestServer {
 public:
  ~IngestServer();
  IngestServer(const IngestServer&) = delete;
  IngestServer& operator=(const IngestServer&) = delete;

  // Binds and listens on `socket_path`. A socket file left by a server that is gone is replaced;
  // one a live server is listening on is ALREADY_EXISTS.
  static StatusOr<std::unique_ptr<IngestServer>> start(Store* store,
                                                       const std::filesystem::path& socket_path,
                                                       IngestServerOptions options = {});
  // Accepts and serves until request_stop(); joins the connection threads before returning.
  Status serve();
  // Async-signal-safe: wakes serve() so it returns.
  void request_stop();
  const std::filesystem::path& socket_path() const;

  // Handles one decoded request against the store (what serve() does per frame); public so tests
  // and the fuzzer can drive it without a socket.
  IngestReply handle(const IngestRequest& request);

 private:
  struct State;
  explicit IngestServer(std::unique_ptr<State> state);
  void serve_connection(int fd);
  std::unique_ptr<State> state_;
};

// A shared-memory buffer a client fills with [rows, dim] fp32 vectors and sends without another
// copy: an anonymous memfd sealed against shrinking and growing, passed to the server with each
// request. It has no name in /dev/shm, so nothing outlives the processes that hold it, even
// after SIGKILL.
class ShmBuffer {
 public:
  ~ShmBuffer();
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  static StatusOr<std::unique_ptr<ShmBuffer>> create(std::size_t rows, std::size_t dim);
  float* vectors() { return data_; }
  std::size_t rows() const { return rows_; }
  std::size_t dim() const { return dim_; }
  // The memfd (owned by the buffer).
  int fd() const { return fd_; }

 private:
  ShmBuffer() = default;
  int fd_ = -1;
  float* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t rows_ = 0;
  std::size_t dim_ = 0;
};

class IngestClient {
 public:
  ~IngestClient();
  IngestClient(const IngestClient&) = delete;
  IngestClient& operator=(const IngestClient&) = delete;

  static StatusOr<std::unique_ptr<IngestClient>> connect(const std::filesystem::path& socket_path,
                                                         int timeout_s = 60);

  // Sends the first ids.size() rows of `buffer`; returns the collection's acknowledged total.
  // A server-side rejection comes back as a Status with the server's code and message.
  StatusOr<std::uint64_t> add(const std::string& collection, std::span<const std::uint64_t> ids,
                              const ShmBuffer& buffer, bool upsert = false);
  // Convenience: copies host vectors [ids.size(), dim] into a reused shm buffer and sends it.
  StatusOr<std::uint64_t> add(const std::string& collection, std::span<const std::uint64_t> ids,
                              const float* vectors, std::size_t dim, bool upsert = false);
  // Rows from GPU memory in this process, shared through a CUDA IPC handle (UNIMPLEMENTED without
  // CUDA). `device_vectors` must point into a cudaMalloc allocation.
  StatusOr<std::uint64_t> add_device(const std::string& collection,
                                     std::span<const std::uint64_t> ids,
                                     const float* device_vectors, std::size_t dim,
                                     bool upsert = false);
  StatusOr<std::uint64_t> count(const std::string& collection);
  // k nearest neighbours of each of `query_count` host vectors [query_count, dim] in the
  // server's collection. Uses options.k, engine, index, nprobe and where_json (the server's own
  // settings stand for the rest). `report` (may be null) gets the engine that answered.
  StatusOr<SearchResults> query(const std::string& collection, const float* queries,
                                std::size_t query_count, std::size_t dim,
                                const QueryOptions& options, QueryReport* report = nullptr);

  // Sends raw request bytes (already framed or not) and reads one reply: for tests of the
  // server's handling of malformed input. `pass_fd` (>= 0, framed only) travels with the frame.
  // A server that refused the connection and closed it is answered by its refusal, not by the
  // send's error.
  StatusOr<IngestReply> send_raw(std::span<const std::uint8_t> bytes, bool add_length_prefix,
                                 int pass_fd = -1);

 private:
  IngestClient() = default;
  StatusOr<IngestReply> exchange(const IngestRequest& request);
  StatusOr<std::uint64_t> round_trip(const IngestRequest& request);
  int fd_ = -1;
  std::uint64_t next_request_id_ = 1;
  std::unique_ptr<ShmBuffer> scratch_;
};

}  // namespace gpuopt::vector
