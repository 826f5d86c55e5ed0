// The vector server: accepts Unix-socket connections, decodes binary requests, maps the client's
// sealed memfd (or reads its named shm, or opens its CUDA IPC handle) and commits the rows,
// replying only after commit, and answers queries from its one view of each collection.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/regular_file.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "ingest_io.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime.h>
#endif

namespace gpuopt::vector {

namespace fs = std::filesystem;

namespace {

using detail::errno_error;

// Closes the descriptors a frame brought along, whatever path the request takes.
struct ReceivedFds {
  std::vector<int> fds;
  ~ReceivedFds() { close_all(); }
  void close_all() {
    for (int fd : fds) ::close(fd);
    fds.clear();
  }
};

// A read-only mapping of a client's memfd. Only a memfd sealed against shrinking is mapped: a
// file that can shrink under a mapping turns the next read of the lost pages into SIGBUS, which
// would kill the server for every client.
class SealedMapping {
 public:
  ~SealedMapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  static StatusOr<std::unique_ptr<SealedMapping>> open(int fd, std::size_t needed) {
    if (fd < 0) return invalid_argument("memfd payload: the request carried no file descriptor");
    GPUOPT_RETURN_IF_ERROR(require_regular_descriptor(fd, "memfd payload"));
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
      return invalid_argument(fmt::format(
          "memfd payload: the descriptor is not a sealable memfd ({})", std::strerror(errno)));
    }
    constexpr int kRequired = F_SEAL_SHRINK | F_SEAL_GROW;
    if ((seals & kRequired) != kRequired) {
      return invalid_argument(
          fmt::format("memfd payload: seals 0x{:x} lack F_SEAL_SHRINK and F_SEAL_GROW (a "
                      "buffer that can change size under the server's mapping is refused)",
                      seals));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) return errno_error("memfd payload: fstat");
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < needed) {
      return invalid_argument(fmt::format("memfd payload too small: {} bytes, rows x dim x 4 = {}",
                                          st.st_size, needed));
    }
    auto mapping = std::unique_ptr<SealedMapping>(new SealedMapping());
    void* data = mmap(nullptr, needed, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) return errno_error("memfd payload: mmap");
    mapping->data_ = data;
    mapping->bytes_ = needed;
    return mapping;
  }
  const float* vectors() const { return static_cast<const float*>(data_); }

 private:
  SealedMapping() = default;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A client's named shm object, checked and then read (not mapped): its owner can shrink it at
// any moment, and pread of a shrunk object is a short read, where a mapping would fault.
StatusOr<std::vector<float>> read_named_shm(const std::string& name, std::size_t needed) {
  // The client names the object: O_NONBLOCK so that a FIFO (or socket) it put there fails or
  // is refused here instead of blocking the server while it holds the write lock.
  int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, 0);
  if (fd < 0) {
    if (errno == ENXIO) {
      return invalid_argument(fmt::format("shm {} is not a regular shared-memory object", name));
    }
    return errno_error(fmt::format("shm {}", name));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  GPUOPT_RETURN_IF_ERROR(require_regular_descriptor(fd, "shm " + name));
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno_error(fmt::format("shm {}: fstat", name));
  if (st.st_uid != geteuid()) {
    return permission_denied(fmt::format("shm {} is owned by uid {}, the server runs as uid {}",
                                         name, st.st_uid, geteuid()));
  }
  if ((st.st_mode & 07777) != 0600) {
    return permission_denied(
        fmt::format("shm {} has mode {:04o}; only 0600 is accepted", name, st.st_mode & 07777));
  }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < needed) {
    return invalid_argument(fmt::format("shm too small: {} is {} bytes, rows x dim x 4 = {}", name,
                                        st.st_size, needed));
  }
  std::vector<float> vectors(needed / sizeof(float));
  auto* out = reinterpret_cast<char*>(vectors.data());
  std::size_t got = 0;
  while (got < needed) {
    ssize_t n = ::pread(fd, out + got, needed - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(fmt::format("shm {}: read", name));
    }
    if (n == 0) {
      return invalid_argument(fmt::format(
          "shm {} shrank while the server read it: {} of {} bytes were there", name, got, needed));
    }
    got += static_cast<std::size_t>(n);
  }
  return vectors;
}

#if GPUOPT_CUDA
// cuMemGetAddressRange through the runtime's driver entry point (libcuda is never linked).
using MemGetAddressRange = int (*)(unsigned long long* base, std::size_t* size,
                                   unsigned long long pointer);
#endif

}  // namespace

struct IngestServer::State {
  Store* store = nullptr;
  fs::path socket_path;
  IngestServerOptions options;
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  // Requests take turns on the store: a Store is used by one thread at a time, and its writes
  // have one writer anyway.
  std::mutex store_mutex;
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
    int fd = -1;
  };
  std::mutex connections_mutex;
  std::list<Connection> connections;
#if GPUOPT_CUDA
  cudaStream_t stream = nullptr;
#endif
  ~State() {
    if (listen_fd >= 0) {
      ::close(listen_fd);
      std::error_code ignored;
      fs::remove(socket_path, ignored);
    }
    for (int fd : stop_pipe) {
      if (fd >= 0) ::close(fd);
    }
#if GPUOPT_CUDA
    if (stream != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream));
#endif
  }
  void reap(bool all) {
    std::lock_guard lock(connections_mutex);
    for (auto it = connections.begin(); it != connections.end();) {
      if (all && !it->done) ::shutdown(it->fd, SHUT_RDWR);
      if (all || it->done) {
        if (it->thread.joinable()) it->thread.join();
        ::close(it->fd);  // closed here, after the join, so shutdown() never hits a reused fd
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }
};

IngestServer::IngestServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

IngestServer::~IngestServer() {
  request_stop();
  state_->reap(/*all=*/true);
}

const fs::path& IngestServer::socket_path() const { return state_->socket_path; }

StatusOr<std::unique_ptr<IngestServer>> IngestServer::start(Store* store,
                                                            const fs::path& socket_path,
                                                            IngestServerOptions options) {
  if (store == nullptr) return invalid_argument("ingest server: store is null");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return invalid_argument(
        fmt::format("socket path \"{}\": must be 1..{} bytes", path, sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(StatusCode::kAlreadyExists,
                    fmt::format("{} exists and is not a socket; not replacing it", path));
    }
    // A live server answers a connect; only a socket left by one that is gone is replaced.
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return errno_error("socket");
    const bool live =
        ::connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
    ::close(probe);
    if (live) {
      return Status(StatusCode::kAlreadyExists,
                    fmt::format("{}: another server is listening on this socket", path));
    }
    ::unlink(path.c_str());  // a stale socket from a killed server
  }
  auto state = std::make_unique<State>();
  state->store = store;
  state->socket_path = socket_path;
  state->options = std::move(options);
  if (pipe2(state->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return errno_error("pipe2");
  state->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (state->listen_fd < 0) return errno_error("socket");
  // The socket file is 0600 from the start: umask for bind (the window chmod alone would leave).
  mode_t previous = umask(0177);
  int bound = ::bind(state->listen_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  int bind_errno = errno;
  umask(previous);
  if (bound != 0) {
    errno = bind_errno;
    Status status = errno_error(fmt::format("bind {}", path));
    ::close(state->listen_fd);
    state->listen_fd = -1;  // not ours to remove
    return status;
  }
  if (::chmod(path.c_str(), 0600) != 0) return errno_error(fmt::format("chmod {}", path));
  if (::listen(state->listen_fd, 64) != 0) return errno_error(fmt::format("listen {}", path));
  return std::unique_ptr<IngestServer>(new IngestServer(std::move(state)));
}

void IngestServer::request_stop() {
  char byte = 1;
  ssize_t ignored = ::write(state_->stop_pipe[1], &byte, 1);
  (void)ignored;
}

Status IngestServer::serve() {
  State& s = *state_;
  Status result;
  for (;;) {
    pollfd fds[2] = {{s.listen_fd, POLLIN, 0}, {s.stop_pipe[0], POLLIN, 0}};
    int ready = ::poll(fds, 2, 1000);
    if (ready < 0) {
      if (errno == EINTR) continue;
      result = errno_error("poll");
      break;
    }
    if (fds[1].revents != 0) break;
    s.reap(/*all=*/false);
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      result = errno_error("accept");
      break;
    }
    // A refusal is sent before the close, and the client reads it even when its own send failed
    // because of the close.
    auto refuse = [&](StatusCode code, std::string message) {
      IngestReply reply;
      reply.code = code;
      reply.message = std::move(message);
      if (s.options.on_error) s.options.on_error(reply);
      Status timeouts = detail::set_timeouts(fd, 1);  // a refused peer cannot hold the loop
      (void)timeouts;
      Status ignored = detail::send_frame(fd, encode_reply(reply));
      (void)ignored;
      ::close(fd);
    };
    ucred peer{};
    socklen_t length = sizeof(peer);
    const bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0;
    if (!known || (peer.uid != geteuid() && peer.uid != 0)) {
      refuse(StatusCode::kPermissionDenied,
             known ? fmt::format("uid {} may not use this server: it serves only its own uid {} "
                                 "and root (SO_PEERCRED check)",
                                 peer.uid, geteuid())
                   : fmt::format("the peer's uid is unknown (SO_PEERCRED: {}); refused",
                                 std::strerror(errno)));
      continue;
    }
    s.reap(/*all=*/false);
    std::unique_lock lock(s.connections_mutex);
    if (s.connections.size() >= static_cast<std::size_t>(std::max(1, s.options.max_connections))) {
      const std::size_t open = s.connections.size();
      lock.unlock();
      refuse(StatusCode::kResourceExhausted,
             fmt::format("the server has {} connections open, its limit (max_connections): close "
                         "one or try again later",
                         open));
      continue;
    }
    Status timeouts = detail::set_timeouts(fd, s.options.receive_timeout_s);
    (void)timeouts;  // without timeouts a stalled peer only holds its own thread
    auto& connection = s.connections.emplace_back();
    connection.fd = fd;
    connection.thread = std::thread([this, &connection] {
      serve_connection(connection.fd);
      connection.done = true;
    });
  }
  s.reap(/*all=*/true);
  return result;
}

void IngestServer::serve_connection(int fd) {
  std::vector<std::uint8_t> body;
  ReceivedFds received_fds;
  for (;;) {
    // A large frame's buffer is not kept while the connection idles.
    if (body.capacity() > (std::size_t{1} << 20)) std::vector<std::uint8_t>().swap(body);
    received_fds.close_all();
    Status received = detail::receive_frame(fd, kIngestMaxBody, &body, &received_fds.fds);
    if (!received.ok()) {
      // A clean close between frames is the normal end; anything else gets a reply if the peer
      // is still there to read it, and the connection is closed (framing is lost).
      if (received.code() != StatusCode::kNotFound) {
        IngestReply reply;
        reply.code = received.code();
        reply.message = received.message();
        if (state_->options.on_error) state_->options.on_error(reply);
        Status ignored = detail::send_frame(fd, encode_reply(reply));
        (void)ignored;
      }
      break;
    }
    IngestReply reply;
    auto request = parse_request(body);
    if (!request.ok()) {
      reply.code = request.status().code();
      reply.message = request.status().message();
      // Echo the request id when the header got that far (bytes 24..32).
      if (body.size() >= 32) std::memcpy(&reply.request_id, body.data() + 24, 8);
      if (state_->options.on_error) state_->options.on_error(reply);
    } else if (request->payload == IngestPayload::kMemfd && received_fds.fds.size() != 1) {
      reply.request_id = request->request_id;
      reply.code = StatusCode::kInvalidArgument;
      reply.message =
          fmt::format("memfd payload: the frame carried {} file descriptors (exactly 1 expected)",
                      received_fds.fds.size());
      if (state_->options.on_error) state_->options.on_error(reply);
    } else if (request->payload != IngestPayload::kMemfd && !received_fds.fds.empty()) {
      reply.request_id = request->request_id;
      reply.code = StatusCode::kInvalidArgument;
      reply.message =
          fmt::format("the frame carried {} file descriptors but its payload takes none",
                      received_fds.fds.size());
      if (state_->options.on_error) state_->options.on_error(reply);
    } else {
      if (request->payload == IngestPayload::kMemfd) request->memfd = received_fds.fds[0];
      reply = handle(*request);
    }
    received_fds.close_all();  // not held while the connection waits for its next frame
    if (!detail::send_frame(fd, encode_reply(reply)).ok()) break;
  }
}

IngestReply IngestServer::handle(const IngestRequest& request) {
  State& s = *state_;
  IngestReply reply;
  reply.request_id = request.request_id;
  std::lock_guard lock(s.store_mutex);
  auto reject = [&](const Status& status) {
    reply.code = status.code();
    reply.message = status.message();
    if (s.options.on_error) s.options.on_error(reply);
    return reply;
  };
  auto found = s.store->collection(request.collection);
  if (!found.ok()) return reject(found.status());
  Collection& collection = **found;
  reply.total = collection.size();
  if (request.op == IngestOp::kCount) return reply;
  if (request.op == IngestOp::kQuery) {
    if (request.dim != collection.dim()) {
      return reject(invalid_argument(
          fmt::format("dim mismatch: the queries have dimension {}, collection \"{}\" has {}",
                      request.dim, collection.name(), collection.dim())));
    }
    if (request.queries.size() != request.rows * request.dim) {
      return reject(
          invalid_argument(fmt::format("wrong size: {} floats for {} queries of dimension {}",
                                       request.queries.size(), request.rows, request.dim)));
    }
    QueryOptions options = s.options.query;
    options.k = request.k;
    options.engine = request.engine;
    options.index = request.index;
    options.nprobe = request.nprobe;
    options.where_json = request.where_json;
    QueryReport report;
    auto found = collection.query(request.queries.data(), request.rows, options, &report);
    if (!found.ok()) return reject(found.status());
    reply.has_results = true;
    reply.engine = report.engine;
    reply.results = std::move(*found);
    reply.total = collection.size();
    if (s.options.on_query) s.options.on_query(request, report);
    return reply;
  }
  if (request.dim != collection.dim()) {
    return reject(
        invalid_argument(fmt::format("dim mismatch: the request has dimension {}, "
                                     "collection \"{}\" has {}",
                                     request.dim, collection.name(), collection.dim())));
  }
  if (request.ids.size() != request.rows) {
    return reject(invalid_argument(
        fmt::format("wrong size: {} ids for {} rows", request.ids.size(), request.rows)));
  }
  const bool replace = request.op == IngestOp::kUpsert;
  const std::uint64_t needed = request.rows * request.dim * sizeof(float);
  Status written;
  if (request.payload == IngestPayload::kMemfd) {
    auto mapping = SealedMapping::open(request.memfd, needed);
    if (!mapping.ok()) return reject(mapping.status());
    written = replace ? collection.upsert(request.ids, (*mapping)->vectors())
                      : collection.add(request.ids, (*mapping)->vectors());
  } else if (request.payload == IngestPayload::kShm) {
    auto vectors = read_named_shm(request.shm_name, needed);
    if (!vectors.ok()) return reject(vectors.status());
    written = replace ? collection.upsert(request.ids, vectors->data())
                      : collection.add(request.ids, vectors->data());
  } else if (request.payload == IngestPayload::kCudaIpc) {
#if GPUOPT_CUDA
    written = [&]() -> Status {
      GPUOPT_CUDA_TRY(cudaSetDevice(request.cuda_device));
      if (s.stream == nullptr) {
        GPUOPT_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
      }
      cudaIpcMemHandle_t handle;
      static_assert(sizeof(handle) == sizeof(request.cuda_handle));
      std::memcpy(&handle, request.cuda_handle.data(), sizeof(handle));
      void* base = nullptr;
      GPUOPT_CUDA_TRY(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
      struct Closer {
        void* p;
        ~Closer() { GPUOPT_CUDA_TRY_NO_THROW(cudaIpcCloseMemHandle(p)); }
      } closer{base};
      // The allocation's extent, so a handle to a smaller buffer is refused, not overread.
      auto range = reinterpret_cast<MemGetAddressRange>(driver_entry_point("cuMemGetAddressRange"));
      if (range == nullptr) return unavailable("the driver lacks cuMemGetAddressRange");
      unsigned long long range_base = 0;
      std::size_t range_size = 0;
      GPUOPT_CU_TRY(range(&range_base, &range_size, reinterpret_cast<unsigned long long>(base)));
      std::uint64_t available = range_base + range_size - reinterpret_cast<std::uint64_t>(base);
      if (request.cuda_offset > available || available - request.cuda_offset < needed) {
        return invalid_argument(fmt::format(
            "CUDA IPC buffer too small: {} bytes after offset {}, "
            "rows x dim x 4 = {}",
            available - std::min(available, request.cuda_offset), request.cuda_offset, needed));
      }
      const float* vectors =
          reinterpret_cast<const float*>(static_cast<const char*>(base) + request.cuda_offset);
      return collection.add_device(request.ids, vectors, s.stream, {}, replace);
    }();
#else
    written = unimplemented("CUDA IPC ingest: this server was built without CUDA");
#endif
  } else {
    written = invalid_argument("add/upsert without a payload");
  }
  if (!written.ok()) return reject(written);
  reply.total = collection.size();
  if (s.options.on_commit) s.options.on_commit(request, reply.total);
  return reply;
}

}  // namespace gpuopt::vector
