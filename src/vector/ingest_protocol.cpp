// The ingest protocol's binary encoding: little-endian fields written and read one at a time with
// bounds checks, so a malformed body is an error naming the field, never an out-of-bounds read.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "gpuopt/vector/ingest.hpp"

namespace gpuopt::vector {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the ingest protocol is little-endian and so is every supported host");

constexpr std::size_t kMaxCollectionName = 64;
constexpr std::size_t kShmNameLength = 15 + 32;  // prefix + 128-bit hex
constexpr std::size_t kMaxDim = 65536;

class Writer {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, std::size_t size) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
  }
  std::vector<std::uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<std::uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> body) : body_(body) {}
  // Reads a field or fails naming it and where the body ended.
  template <typename T>
  Status get(T& value, const char* field) {
    if (body_.size() - offset_ < sizeof(T)) return truncated(field, sizeof(T));
    std::memcpy(&value, body_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return ok_status();
  }
  Status get_bytes(void* out, std::size_t size, const char* field) {
    if (body_.size() - offset_ < size) return truncated(field, size);
    if (size > 0) std::memcpy(out, body_.data() + offset_, size);
    offset_ += size;
    return ok_status();
  }
  std::size_t offset() const { return offset_; }
  std::size_t remaining() const { return body_.size() - offset_; }

 private:
  Status truncated(const char* field, std::size_t need) const {
    return invalid_argument(
        fmt::format("truncated message: {} needs {} bytes at offset {}, the "
                    "body has {} bytes",
                    field, need, offset_, body_.size()));
  }
  std::span<const std::uint8_t> body_;
  std::size_t offset_ = 0;
};

std::uint16_t engine_code(QueryEngine engine) {
  switch (engine) {
    case QueryEngine::kCpu:
      return 0;
    case QueryEngine::kGpu:
      return 1;
    case QueryEngine::kAuto:
      return 2;
  }
  return 0;
}

// The query message's tail, after the collection name: settings, filter and query vectors.
Status parse_query(Reader& r, IngestRequest& request) {
  if (request.payload != IngestPayload::kNone) {
    return invalid_argument("query carries its vectors inline: payload must be none");
  }
  if (request.dim == 0 || request.dim > kMaxDim) {
    return invalid_argument(fmt::format("dim {} (1..{})", request.dim, kMaxDim));
  }
  if (request.rows == 0) return invalid_argument("query: rows (the number of queries) is 0");
  std::uint16_t engine = 0, index = 0;
  std::uint32_t where_length = 0;
  GPUOPT_RETURN_IF_ERROR(r.get(request.k, "k"));
  if (request.k == 0 || request.k > kIngestMaxK) {
    return invalid_argument(fmt::format("k {} (1..{})", request.k, kIngestMaxK));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(engine, "engine"));
  if (engine > 2) return invalid_argument(fmt::format("unknown engine {} (0..2)", engine));
  request.engine = engine == 0   ? QueryEngine::kCpu
                   : engine == 1 ? QueryEngine::kGpu
                                 : QueryEngine::kAuto;
  GPUOPT_RETURN_IF_ERROR(r.get(index, "index"));
  if (index > 1) return invalid_argument(fmt::format("unknown index {} (0..1)", index));
  request.index = index == 0 ? IndexKind::kExact : IndexKind::kIvf;
  GPUOPT_RETURN_IF_ERROR(r.get(request.nprobe, "nprobe"));
  if (request.nprobe == 0) return invalid_argument("nprobe is 0");
  GPUOPT_RETURN_IF_ERROR(r.get(where_length, "where length"));
  if (where_length > kIngestMaxWhere) {
    return invalid_argument(
        fmt::format("where filter of {} bytes (at most {})", where_length, kIngestMaxWhere));
  }
  request.where_json.resize(where_length);
  GPUOPT_RETURN_IF_ERROR(r.get_bytes(request.where_json.data(), where_length, "where"));
  // The queries fill the rest exactly; by division, so a huge `rows` cannot overflow.
  const std::size_t row_bytes = std::size_t{request.dim} * sizeof(float);
  if (r.remaining() % row_bytes != 0 || r.remaining() / row_bytes != request.rows) {
    return invalid_argument(
        fmt::format("wrong size: {} queries of dimension {} but {} bytes follow offset {}",
                    request.rows, request.dim, r.remaining(), r.offset()));
  }
  // The reply must fit in a frame too.
  if (request.rows > max_queries_per_reply(request.k)) {
    return invalid_argument(
        fmt::format("{} queries x k {} would not fit in one reply frame", request.rows, request.k));
  }
  request.queries.resize(request.rows * request.dim);
  return r.get_bytes(request.queries.data(), r.remaining(), "queries");
}

}  // namespace

std::size_t max_queries_per_reply(std::size_t k) {
  // 12 bytes per hit and 4 per query, below the frame limit with room for the reply's header.
  return (kIngestMaxBody - 8192) / (12 * std::max<std::size_t>(k, 1) + 4);
}

bool is_ingest_shm_name(std::string_view name) {
  std::string_view prefix(kIngestShmPrefix);
  if (name.size() != kShmNameLength || name.substr(0, prefix.size()) != prefix) return false;
  for (char c : name.substr(prefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::vector<std::uint8_t> encode_request(const IngestRequest& request) {
  Writer w;
  w.put(kIngestRequestMagic);
  w.put(kIngestVersion);
  w.put(static_cast<std::uint16_t>(request.op));
  w.put(static_cast<std::uint16_t>(request.payload));
  w.put(static_cast<std::uint16_t>(request.collection.size()));
  w.put(request.dim);
  w.put(request.rows);
  w.put(request.request_id);
  w.put_bytes(request.collection.data(), request.collection.size());
  if (request.payload == IngestPayload::kShm) {
    w.put(static_cast<std::uint16_t>(request.shm_name.size()));
    w.put_bytes(request.shm_name.data(), request.shm_name.size());
  } else if (request.payload == IngestPayload::kCudaIpc) {
    w.put(request.cuda_device);
    w.put_bytes(request.cuda_handle.data(), request.cuda_handle.size());
    w.put(request.cuda_offset);
  }
  if (request.op == IngestOp::kQuery) {
    w.put(request.k);
    w.put(static_cast<std::uint16_t>(engine_code(request.engine)));
    w.put(static_cast<std::uint16_t>(request.index == IndexKind::kIvf ? 1 : 0));
    w.put(request.nprobe);
    w.put(static_cast<std::uint32_t>(request.where_json.size()));
    w.put_bytes(request.where_json.data(), request.where_json.size());
    w.put_bytes(request.queries.data(), request.queries.size() * sizeof(float));
    return w.take();
  }
  w.put_bytes(request.ids.data(), request.ids.size() * sizeof(std::uint64_t));
  return w.take();
}

StatusOr<IngestRequest> parse_request(std::span<const std::uint8_t> body) {
  Reader r(body);
  IngestRequest request;
  std::uint32_t magic = 0;
  std::uint16_t version = 0, op = 0, payload = 0, collection_length = 0;
  GPUOPT_RETURN_IF_ERROR(r.get(magic, "magic"));
  if (magic != kIngestRequestMagic) {
    return invalid_argument(fmt::format("bad magic 0x{:08x} (expected 0x{:08x}, \"GVIQ\")", magic,
                                        kIngestRequestMagic));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(version, "version"));
  if (version != kIngestVersion) {
    return invalid_argument(
        fmt::format("protocol version {} (this server speaks {})", version, kIngestVersion));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(op, "op"));
  if (op < 1 || op > 4) return invalid_argument(fmt::format("unknown op {} (1..4)", op));
  request.op = static_cast<IngestOp>(op);
  GPUOPT_RETURN_IF_ERROR(r.get(payload, "payload"));
  if (payload > 3) return invalid_argument(fmt::format("unknown payload kind {} (0..3)", payload));
  request.payload = static_cast<IngestPayload>(payload);
  GPUOPT_RETURN_IF_ERROR(r.get(collection_length, "collection length"));
  if (collection_length == 0 || collection_length > kMaxCollectionName) {
    return invalid_argument(
        fmt::format("collection name length {} (1..{})", collection_length, kMaxCollectionName));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(request.dim, "dim"));
  GPUOPT_RETURN_IF_ERROR(r.get(request.rows, "rows"));
  GPUOPT_RETURN_IF_ERROR(r.get(request.request_id, "request id"));
  request.collection.resize(collection_length);
  GPUOPT_RETURN_IF_ERROR(r.get_bytes(request.collection.data(), collection_length, "collection"));
  if (request.op == IngestOp::kQuery) {
    GPUOPT_RETURN_IF_ERROR(parse_query(r, request));
    return request;
  }
  const bool writes = request.op != IngestOp::kCount;
  if (writes) {
    if (request.payload == IngestPayload::kNone) {
      return invalid_argument("add/upsert without a payload (memfd, shm or CUDA IPC)");
    }
    if (request.dim == 0 || request.dim > kMaxDim) {
      return invalid_argument(fmt::format("dim {} (1..{})", request.dim, kMaxDim));
    }
    if (request.rows == 0) return invalid_argument("rows is 0");
  } else if (request.payload != IngestPayload::kNone || request.rows != 0) {
    return invalid_argument("count takes no payload and no rows");
  }
  if (request.payload == IngestPayload::kShm) {
    std::uint16_t name_length = 0;
    GPUOPT_RETURN_IF_ERROR(r.get(name_length, "shm name length"));
    if (name_length != kShmNameLength) {
      return invalid_argument(
          fmt::format("shm name length {} (expected {})", name_length, kShmNameLength));
    }
    request.shm_name.resize(name_length);
    GPUOPT_RETURN_IF_ERROR(r.get_bytes(request.shm_name.data(), name_length, "shm name"));
    if (!is_ingest_shm_name(request.shm_name)) {
      return invalid_argument(
          fmt::format("shm name must be {} + 32 lowercase hex digits", kIngestShmPrefix));
    }
  } else if (request.payload == IngestPayload::kCudaIpc) {
    GPUOPT_RETURN_IF_ERROR(r.get(request.cuda_device, "CUDA device"));
    if (request.cuda_device < 0) {
      return invalid_argument(fmt::format("CUDA device {}", request.cuda_device));
    }
    GPUOPT_RETURN_IF_ERROR(
        r.get_bytes(request.cuda_handle.data(), request.cuda_handle.size(), "CUDA IPC handle"));
    GPUOPT_RETURN_IF_ERROR(r.get(request.cuda_offset, "CUDA offset"));
  }
  // The ids must fill the rest of the body exactly; checked by division so a huge `rows` cannot
  // overflow the size computation.
  if (r.remaining() % sizeof(std::uint64_t) != 0 ||
      r.remaining() / sizeof(std::uint64_t) != request.rows) {
    return invalid_argument(
        fmt::format("wrong size: rows is {} but {} bytes of ids follow offset "
                    "{} (expected rows x 8)",
                    request.rows, r.remaining(), r.offset()));
  }
  request.ids.resize(request.rows);
  GPUOPT_RETURN_IF_ERROR(
      r.get_bytes(request.ids.data(), request.rows * sizeof(std::uint64_t), "ids"));
  return request;
}

std::vector<std::uint8_t> encode_reply(const IngestReply& reply) {
  Writer w;
  w.put(kIngestReplyMagic);
  w.put(kIngestVersion);
  w.put(static_cast<std::uint16_t>(reply.code));
  w.put(reply.request_id);
  w.put(reply.total);
  std::size_t length = std::min<std::size_t>(reply.message.size(), 4096);
  w.put(static_cast<std::uint32_t>(length));
  w.put_bytes(reply.message.data(), length);
  if (reply.has_results) {
    w.put(static_cast<std::uint32_t>(reply.results.size()));
    w.put(static_cast<std::uint32_t>(reply.engine == QueryEngine::kGpu ? 1 : 0));
    for (const auto& hits : reply.results) {
      w.put(static_cast<std::uint32_t>(hits.size()));
      for (const auto& hit : hits) {
        w.put(hit.id);
        w.put(hit.distance);
      }
    }
  }
  return w.take();
}

StatusOr<IngestReply> parse_reply(std::span<const std::uint8_t> body) {
  Reader r(body);
  IngestReply reply;
  std::uint32_t magic = 0, length = 0;
  std::uint16_t version = 0, code = 0;
  GPUOPT_RETURN_IF_ERROR(r.get(magic, "reply magic"));
  if (magic != kIngestReplyMagic) {
    return invalid_argument(fmt::format("reply: bad magic 0x{:08x}", magic));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(version, "reply version"));
  if (version != kIngestVersion) {
    return invalid_argument(fmt::format("reply: protocol version {}", version));
  }
  GPUOPT_RETURN_IF_ERROR(r.get(code, "reply status"));
  if (code > static_cast<std::uint16_t>(StatusCode::kDataLoss)) {
    return invalid_argument(fmt::format("reply: unknown status code {}", code));
  }
  reply.code = static_cast<StatusCode>(code);
  GPUOPT_RETURN_IF_ERROR(r.get(reply.request_id, "reply request id"));
  GPUOPT_RETURN_IF_ERROR(r.get(reply.total, "reply total"));
  GPUOPT_RETURN_IF_ERROR(r.get(length, "reply message length"));
  if (length > 4096 || length > r.remaining()) {
    return invalid_argument(fmt::format(
        "reply: message length {} (at most 4096) with {} bytes left", length, r.remaining()));
  }
  reply.message.resize(length);
  GPUOPT_RETURN_IF_ERROR(r.get_bytes(reply.message.data(), length, "reply message"));
  if (r.remaining() == 0) return reply;
  // A query's results.
  std::uint32_t queries = 0, engine = 0;
  GPUOPT_RETURN_IF_ERROR(r.get(queries, "reply query count"));
  GPUOPT_RETURN_IF_ERROR(r.get(engine, "reply engine"));
  if (engine > 1) return invalid_argument(fmt::format("reply: engine {} (0..1)", engine));
  // Each query takes at least its 4-byte hit count: refuse a count the body cannot hold before
  // allocating for it.
  if (queries > r.remaining() / 4) {
    return invalid_argument(fmt::format("reply: {} queries in {} bytes", queries, r.remaining()));
  }
  reply.has_results = true;
  reply.engine = engine == 1 ? QueryEngine::kGpu : QueryEngine::kCpu;
  reply.results.resize(queries);
  for (auto& hits : reply.results) {
    std::uint32_t count = 0;
    GPUOPT_RETURN_IF_ERROR(r.get(count, "reply hit count"));
    if (count > r.remaining() / 12) {
      return invalid_argument(fmt::format("reply: {} hits in {} bytes", count, r.remaining()));
    }
    hits.resize(count);
    for (auto& hit : hits) {
      GPUOPT_RETURN_IF_ERROR(r.get(hit.id, "reply hit id"));
      GPUOPT_RETURN_IF_ERROR(r.get(hit.distance, "reply hit distance"));
    }
  }
  if (r.remaining() != 0) {
    return invalid_argument(fmt::format("reply: {} bytes after the results", r.remaining()));
  }
  return reply;
}

}  // namespace gpuopt::vector
