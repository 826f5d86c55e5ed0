// The ingest client: owns sealed memfd buffers, sends binary requests over the Unix socket (the
// buffer's descriptor with each write) and waits for the server's post-commit acknowledgement.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "gpuopt/vector/ingest.hpp"
#include "ingest_io.hpp"

namespace gpuopt::vector {

using detail::errno_error;

ShmBuffer::~ShmBuffer() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::create(std::size_t rows, std::size_t dim) {
  if (rows == 0 || dim == 0) return invalid_argument("shm buffer: rows and dim must be positive");
  if (rows > std::numeric_limits<std::size_t>::max() / dim / sizeof(float)) {
    return invalid_argument(fmt::format("shm buffer: {} x {} floats overflow", rows, dim));
  }
  auto buffer = std::unique_ptr<ShmBuffer>(new ShmBuffer());
  buffer->rows_ = rows;
  buffer->dim_ = dim;
  buffer->bytes_ = rows * dim * sizeof(float);
  // An anonymous memfd: no name anyone could open or that a killed process could leave behind.
  buffer->fd_ = memfd_create("gpuopt-ingest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (buffer->fd_ < 0) return errno_error("shm buffer: memfd_create");
  // Sealed at its size: the server maps it and relies on it never shrinking under the mapping.
  if (ftruncate(buffer->fd_, static_cast<off_t>(buffer->bytes_)) != 0) {
    return errno_error(fmt::format("shm buffer: ftruncate to {} bytes", buffer->bytes_));
  }
  if (fcntl(buffer->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return errno_error("shm buffer: F_ADD_SEALS");
  }
  void* data = mmap(nullptr, buffer->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, buffer->fd_, 0);
  if (data == MAP_FAILED) return errno_error("shm buffer: mmap");
  buffer->data_ = static_cast<float*>(data);
  return buffer;
}

IngestClient::~IngestClient() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<IngestClient>> IngestClient::connect(
    const std::filesystem::path& socket_path, int timeout_s) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return invalid_argument(
        fmt::format("socket path \"{}\": must be 1..{} bytes", path, sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  auto client = std::unique_ptr<IngestClient>(new IngestClient());
  client->fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (client->fd_ < 0) return errno_error("socket");
  if (::connect(client->fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return errno_error(fmt::format("connect {}", path));
  }
  GPUOPT_RETURN_IF_ERROR(detail::set_timeouts(client->fd_, timeout_s));
  return client;
}

StatusOr<IngestReply> IngestClient::send_raw(std::span<const std::uint8_t> bytes,
                                             bool add_length_prefix, int pass_fd) {
  Status sent =
      add_length_prefix ? detail::send_frame(fd_, bytes, pass_fd) : detail::send_all(fd_, bytes);
  if (!sent.ok()) {
    // A server that refuses a peer (wrong uid) sends its reason and closes before reading: the
    // send then fails (EPIPE), but the reason is waiting to be read and says more.
    pollfd readable{fd_, POLLIN, 0};
    if (::poll(&readable, 1, 0) == 1 && (readable.revents & POLLIN) != 0) {
      std::vector<std::uint8_t> body;
      if (detail::receive_frame(fd_, kIngestMaxBody, &body).ok()) {
        auto reply = parse_reply(body);
        if (reply.ok()) return reply;
      }
    }
    return sent;
  }
  std::vector<std::uint8_t> body;
  GPUOPT_RETURN_IF_ERROR(detail::receive_frame(fd_, kIngestMaxBody, &body).with_context("reply"));
  return parse_reply(body);
}

StatusOr<IngestReply> IngestClient::exchange(const IngestRequest& request) {
  GPUOPT_ASSIGN_OR_RETURN(IngestReply reply,
                          send_raw(encode_request(request), true,
                                   request.payload == IngestPayload::kMemfd ? request.memfd : -1));
  if (reply.code != StatusCode::kOk) {
    // A request the server could not parse is answered with request id 0.
    return Status(reply.code, fmt::format("vector server: {}", reply.message));
  }
  if (reply.request_id != request.request_id) {
    return internal_error(fmt::format("reply to request {} while waiting for {}", reply.request_id,
                                      request.request_id));
  }
  return reply;
}

StatusOr<std::uint64_t> IngestClient::round_trip(const IngestRequest& request) {
  GPUOPT_ASSIGN_OR_RETURN(IngestReply reply, exchange(request));
  return reply.total;
}

StatusOr<SearchResults> IngestClient::query(const std::string& collection, const float* queries,
                                            std::size_t query_count, std::size_t dim,
                                            const QueryOptions& options, QueryReport* report) {
  if (query_count == 0) return SearchResults{};
  if (queries == nullptr) return invalid_argument("query: queries is null");
  if (dim == 0 || dim > 65536)
    return invalid_argument(fmt::format("query: dim {} (1..65536)", dim));
  if (options.k == 0 || options.k > kIngestMaxK) {
    return invalid_argument(fmt::format("query: k {} (1..{})", options.k, kIngestMaxK));
  }
  if (options.nprobe == 0 || options.nprobe > std::numeric_limits<std::uint32_t>::max()) {
    return invalid_argument(fmt::format("query: nprobe {}", options.nprobe));
  }
  if (options.where_json.size() > kIngestMaxWhere) {
    return invalid_argument(fmt::format("query: where filter of {} bytes (at most {})",
                                        options.where_json.size(), kIngestMaxWhere));
  }
  // Each message's queries and its reply must fit in a frame: send in chunks that do.
  const std::size_t per_frame = std::max<std::size_t>(
      1, std::min((kIngestMaxBody - 65536 - kIngestMaxWhere) / (dim * sizeof(float)),
                  max_queries_per_reply(options.k)));
  SearchResults results;
  results.reserve(query_count);
  for (std::size_t begin = 0; begin < query_count; begin += per_frame) {
    const std::size_t rows = std::min(per_frame, query_count - begin);
    IngestRequest request;
    request.op = IngestOp::kQuery;
    request.collection = collection;
    request.dim = static_cast<std::uint32_t>(dim);
    request.rows = rows;
    request.request_id = next_request_id_++;
    request.k = static_cast<std::uint32_t>(options.k);
    request.engine = options.engine;
    request.index = options.index;
    request.nprobe = static_cast<std::uint32_t>(options.nprobe);
    request.where_json = options.where_json;
    request.queries.assign(queries + begin * dim, queries + (begin + rows) * dim);
    GPUOPT_ASSIGN_OR_RETURN(IngestReply reply, exchange(request));
    if (!reply.has_results || reply.results.size() != rows) {
      return internal_error(
          fmt::format("vector server: {} results for {} queries", reply.results.size(), rows));
    }
    if (report != nullptr) report->engine = reply.engine;
    for (auto& hits : reply.results) results.push_back(std::move(hits));
  }
  return results;
}

StatusOr<std::uint64_t> IngestClient::add(const std::string& collection,
                                          std::span<const std::uint64_t> ids,
                                          const ShmBuffer& buffer, bool upsert) {
  if (ids.size() > buffer.rows()) {
    return invalid_argument(
        fmt::format("{} ids for a shm buffer of {} rows", ids.size(), buffer.rows()));
  }
  IngestRequest request;
  request.op = upsert ? IngestOp::kUpsert : IngestOp::kAdd;
  request.payload = IngestPayload::kMemfd;
  request.collection = collection;
  request.dim = static_cast<std::uint32_t>(buffer.dim());
  request.rows = ids.size();
  request.request_id = next_request_id_++;
  request.memfd = buffer.fd();
  request.ids.assign(ids.begin(), ids.end());
  return round_trip(request);
}

StatusOr<std::uint64_t> IngestClient::add(const std::string& collection,
                                          std::span<const std::uint64_t> ids, const float* vectors,
                                          std::size_t dim, bool upsert) {
  if (ids.empty()) return invalid_argument("add: no ids");
  if (vectors == nullptr) return invalid_argument("add: vectors is null");
  if (scratch_ == nullptr || scratch_->rows() < ids.size() || scratch_->dim() != dim) {
    scratch_.reset();
    GPUOPT_ASSIGN_OR_RETURN(scratch_, ShmBuffer::create(ids.size(), dim));
  }
  std::memcpy(scratch_->vectors(), vectors, ids.size() * dim * sizeof(float));
  return add(collection, ids, *scratch_, upsert);
}

StatusOr<std::uint64_t> IngestClient::count(const std::string& collection) {
  IngestRequest request;
  request.op = IngestOp::kCount;
  request.collection = collection;
  request.request_id = next_request_id_++;
  return round_trip(request);
}

}  // namespace gpuopt::vector
