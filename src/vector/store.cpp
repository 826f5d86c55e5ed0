// The vector store: SQLite catalogue (collections, segments, ids + metadata, tombstones) in WAL
// mode with synchronous=FULL, segment files opened by mmap, and exact / IVF-Flat search over them.
#include "gpuopt/vector/store.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "gpuopt/core/regular_file.hpp"
#include "gpuopt/vector/filter.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "ivf_gpu.hpp"
#include "ivf_index.hpp"
#include "search_kernels.hpp"
#include "segment.hpp"

namespace gpuopt::vector {

namespace {

namespace fs = std::filesystem;

constexpr const char* kCatalogueFile = "store.sqlite";
constexpr const char* kSegmentDirectory = "segments";
constexpr const char* kWriterLockFile = "writer.lock";
constexpr std::size_t kMaxDim = 65536;

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &statement_, nullptr) != SQLITE_OK) statement_ = nullptr;
  }
  ~Statement() { sqlite3_finalize(statement_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return statement_ != nullptr; }
  Statement& bind(int index, std::int64_t value) {
    sqlite3_bind_int64(statement_, index, value);
    return *this;
  }
  Statement& bind(int index, const std::string& value) {
    sqlite3_bind_text(statement_, index, value.data(), static_cast<int>(value.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind_null(int index) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(statement_); }
  void reset() {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }
  std::int64_t integer(int column) const { return sqlite3_column_int64(statement_, column); }
  std::string text(int column) const {
    const unsigned char* p = sqlite3_column_text(statement_, column);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
  }
  bool is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
};

Status sqlite_error(sqlite3* db, const std::string& what) {
  int code = sqlite3_errcode(db);
  std::string message = fmt::format("{}: {} (sqlite code {})", what, sqlite3_errmsg(db), code);
  switch (code & 0xFF) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return unavailable(message);
    case SQLITE_FULL:
      return resource_exhausted(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return data_loss(message);
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
      return permission_denied(message);
    default:
      return internal_error(message);
  }
}

Status exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error != nullptr ? error : "unknown error";
    sqlite3_free(error);
    return sqlite_error(db, fmt::format("sqlite \"{}\": {}", sql, message));
  }
  return ok_status();
}

std::int64_t as_sql(std::uint64_t id) { return static_cast<std::int64_t>(id); }
std::uint64_t from_sql(std::int64_t id) { return static_cast<std::uint64_t>(id); }

bool valid_collection_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         name.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
             std::string::npos;
}

std::string segment_file_name(const std::string& collection, std::uint64_t sequence) {
  return fmt::format("{}-{:08d}.seg", collection, sequence);
}

// Rows a segment of dimension `dim` may hold before its size in bytes overflows 2^62.
std::uint64_t max_segment_rows(std::size_t dim) {
  return (std::uint64_t{1} << 62) / (std::uint64_t(dim) * sizeof(float) + 16);
}

// What the collections of one open store share: the catalogue connection, the mode and the
// writer lock.
struct Catalogue {
  sqlite3* db = nullptr;
  fs::path directory;
  bool read_only = false;
  std::string read_only_reason;  // why, for the message a refused write gives
  int writer_wait_ms = 0;
  int lock_fd = -1;  // the writer lock's descriptor while this store holds it
  sqlite3_stmt* version_statement = nullptr;

  ~Catalogue() {
    if (lock_fd >= 0) ::close(lock_fd);  // releases the flock
  }

  // How often another connection committed, as SQLite counts it (PRAGMA data_version): unchanged
  // means nothing this connection has not seen.
  // The statement is prepared once: this runs before every read.
  StatusOr<std::int64_t> data_version() {
    if (version_statement == nullptr &&
        sqlite3_prepare_v2(db, "PRAGMA data_version", -1, &version_statement, nullptr) !=
            SQLITE_OK) {
      return sqlite_error(db, "data_version");
    }
    const int rc = sqlite3_step(version_statement);
    const std::int64_t version = sqlite3_column_int64(version_statement, 0);
    sqlite3_reset(version_statement);
    if (rc != SQLITE_ROW) return sqlite_error(db, "data_version");
    return version;
  }
  // Before the connection closes.
  void finalize() {
    sqlite3_finalize(version_statement);
    version_statement = nullptr;
  }

  Status lock_for_writing() {
    if (read_only) {
      return failed_precondition(
          fmt::format("{}: the store is open read-only ({}); writes are refused",
                      directory.string(), read_only_reason));
    }
    if (lock_fd >= 0) return ok_status();
    const fs::path path = directory / kWriterLockFile;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY,
                    0644);
    if (fd < 0) {
      return permission_denied(
          fmt::format("{}: cannot open the writer lock: {}", path.string(), std::strerror(errno)));
    }
    if (Status regular = require_regular_descriptor(fd, path); !regular.ok()) {
      ::close(fd);
      return data_loss(fmt::format("writer lock {}", regular.message()));
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, writer_wait_ms));
    for (;;) {
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) break;
      const int error = errno;
      if (error == EINTR) continue;
      if (error != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
        char text[32] = {};
        ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
        ::close(fd);
        if (error != EWOULDBLOCK) {
          return unavailable(
              fmt::format("{}: flock failed: {}", path.string(), std::strerror(error)));
        }
        long holder = got > 0 ? std::strtol(text, nullptr, 10) : 0;
        return unavailable(fmt::format(
            "{}: another process ({}) is writing to this store, which takes one writer at a time "
            "(it holds {}){}",
            directory.string(), holder > 0 ? fmt::format("pid {}", holder) : "pid unknown",
            path.filename().string(),
            writer_wait_ms > 0 ? fmt::format("; waited {} ms", writer_wait_ms) : ""));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // Who holds it, for the message another writer gets; the lock itself is the flock.
    std::string pid = fmt::format("{}\n", ::getpid());
    if (::ftruncate(fd, 0) == 0) {
      ssize_t ignored = ::pwrite(fd, pid.data(), pid.size(), 0);
      (void)ignored;
    }
    lock_fd = fd;
    return ok_status();
  }
};

}  // namespace

struct Collection::State {
  sqlite3* db = nullptr;           // owned by the Store
  Catalogue* catalogue = nullptr;  // owned by the Store
  fs::path segment_directory;
  bool verify_on_first_use = true;
  std::size_t compact_above_segments = 0;  // OpenOptions::compact_above_segments
  std::string name;
  CollectionConfig config;
  std::uint64_t next_sequence = 0;
  std::vector<std::unique_ptr<detail::Segment>> segments;
  std::vector<std::uint64_t> segment_first_position;  // global position of each segment's row 0
  std::uint64_t total_rows = 0;
  std::vector<std::uint64_t> dead;  // bit per global position
  std::size_t dead_count = 0;
  // The IVF index, loaded from its file (or trained) by the first IVF query and kept across
  // writes: rows written since are appended to their nearest list before the next IVF query.
  struct Ivf {
    detail::IvfFlat index;
    std::string file;
    std::uint64_t generation = 0;
    std::uint64_t trained_rows = 0;
    std::uint64_t saved_rows = 0;  // rows the published file covers
    // The lists were rebuilt by id (a compaction moved the file's positions) and not saved since.
    bool rebuilt = false;
    // A save of these lists failed: not tried again until another index is loaded.
    std::string save_error;
    detail::IvfTrainEngine engine = detail::IvfTrainEngine::kCpu;
    std::uint32_t iterations = 0;
    double train_seconds = 0;
    double trained_mean_distance = 0;
    double added_distance_sum = 0;
  };
  std::optional<Ivf> ivf;
  std::size_t ivf_trainings = 0;
  std::size_t ivf_rebuilds = 0;  // loads that rebuilt the lists by id
  Status save_ivf();
  // Writes `contents` (all but its generation, which this picks) as the next generation of the
  // published index: a new file, named in the catalogue in one transaction; the previous file goes.
  StatusOr<detail::IvfFileInfo> publish_ivf(detail::IvfFileContents& contents,
                                            std::uint64_t loaded_generation);
  // The published index file that `entry` names, read and checked.
  StatusOr<detail::IvfFileContents> read_ivf(const detail::IvfFileInfo& entry);
  // Whether the file's positions still name its ids in the current layout.
  bool ivf_positions_hold(const detail::IvfFileContents& contents) const;
  // The list of each position of the current layout, by id: the list the file gave the row's id,
  // or its nearest centroid for an id the file does not know (their distances are added to
  // `added_distance_sum`, in position order).
  std::vector<std::uint32_t> ivf_lists_by_id(const detail::IvfFileContents& contents,
                                             const detail::IvfFlat& centroids,
                                             double& added_distance_sum) const;
  // After a compaction: rewrites the published index for the new layout straight from its file's
  // ids (the lists that a load would rebuild by id, without copying any vector) and saves it.
  // Sets report.ivf_resaved / ivf_error.
  void resave_moved_ivf(CompactReport& report);
  // Stops between segments once `cancel` is set (CANCELLED; the rows assigned so far stay).
  StatusOr<std::size_t> catch_up_ivf(int threads, const CancelToken* cancel = nullptr);
  Status load_ivf();
  IvfIndexStats describe_ivf(const IvfParams& thresholds) const;
  // The GPU copy of the IVF lists, valid for `ivf_gpu_generation` with `ivf_gpu_rows` rows.
  std::unique_ptr<detail::GpuIvfLists> ivf_gpu;
  std::uint64_t ivf_gpu_generation = 0;
  std::size_t ivf_gpu_rows = 0;
  // Change counters, bumped alike by this process's writes and by refresh() when another process
  // wrote: `generation` on any change of rows or tombstones, `layout_generation` when positions
  // were renumbered (segments went away), which invalidates anything indexed by position.
  std::uint64_t generation = 0;
  std::uint64_t layout_generation = 0;
  // PRAGMA data_version when this collection last read the catalogue (-1: never).
  std::int64_t seen_version = -1;
  // Caches dropped on every write.
  std::optional<std::vector<Metadata>> metadata_by_position;
  // The GPU engine's copy of the rows, in position order: segments [0, gpu_segments) are on
  // gpu_device. Rows are only ever appended, so a write leaves it valid; the next GPU query copies
  // the new segments.
  std::unique_ptr<GpuDataset> gpu;
  int gpu_device = -1;
  std::size_t gpu_segments = 0;
  // The allow mask (deletes + `where`) of the last query that needed one, reused while the rows,
  // the deletes and the filter stay the same: rows are only appended and deletes only add bits, so
  // (total_rows, dead_count, where) names its contents. mask_version counts rebuilds; the GPU
  // engine passes it on so the device keeps its copy too.
  std::vector<std::uint64_t> mask_cache;
  std::string mask_where;
  std::uint64_t mask_rows = ~std::uint64_t{0};
  std::size_t mask_dead = ~std::size_t{0};
  std::uint64_t mask_version = 0;

  void mark_dead(std::uint64_t position) {
    if (dead.size() <= position / 64) dead.resize(position / 64 + 1, 0);
    std::uint64_t bit = std::uint64_t{1} << (position & 63);
    if (!(dead[position / 64] & bit)) {
      dead[position / 64] |= bit;
      ++dead_count;
    }
  }
  bool is_dead(std::uint64_t position) const {
    return position / 64 < dead.size() && (dead[position / 64] >> (position & 63)) & 1;
  }
  std::optional<std::size_t> segment_index(std::uint64_t sequence) const {
    // Sequences increase with the index: binary search.
    auto it = std::lower_bound(
        segments.begin(), segments.end(), sequence,
        [](const auto& segment, std::uint64_t value) { return segment->info().sequence < value; });
    if (it == segments.end() || (*it)->info().sequence != sequence) return std::nullopt;
    return static_cast<std::size_t>(it - segments.begin());
  }
  Status add_segment(const detail::SegmentInfo& info) {
    GPUOPT_ASSIGN_OR_RETURN(auto segment,
                            detail::Segment::open(segment_directory / info.file, info));
    segment_first_position.push_back(total_rows);
    total_rows += info.rows;
    segments.push_back(std::move(segment));
    return ok_status();
  }
  void invalidate() {
    metadata_by_position.reset();
    ++generation;
  }
  // The segment row at a global position.
  std::pair<std::size_t, std::uint64_t> locate(std::uint64_t position) const {
    std::size_t index = static_cast<std::size_t>(
        std::upper_bound(segment_first_position.begin(), segment_first_position.end(), position) -
        segment_first_position.begin() - 1);
    return {index, position - segment_first_position[index]};
  }
  std::uint64_t id_at(std::uint64_t position) const {
    auto [index, row] = locate(position);
    return segments[index]->ids()[row];
  }
  // Forgets every segment and tombstone (and the GPU copy, whose positions they define).
  void clear_rows() {
    segments.clear();
    segment_first_position.clear();
    total_rows = 0;
    dead.clear();
    dead_count = 0;
    gpu.reset();
    gpu_segments = 0;
    gpu_device = -1;
    // Positions are renumbered: the in-memory IVF lists, their device copy and the cached allow
    // mask all name old positions (the saved index is re-checked against ids when loaded).
    ivf.reset();
    ivf_gpu.reset();
    ivf_gpu_rows = 0;
    mask_rows = ~std::uint64_t{0};
    invalidate();
    ++layout_generation;
  }

  // Brings this view up to what the catalogue has committed, cheaply when nothing changed: one
  // PRAGMA data_version. Called at the top of every read and inside every write transaction.
  Status refresh(bool in_transaction = false) {
    for (int attempt = 0;; ++attempt) {
      GPUOPT_ASSIGN_OR_RETURN(std::int64_t version, catalogue->data_version());
      if (version == seen_version) return ok_status();
      // One read transaction, so segments and tombstones come from the same commit.
      if (!in_transaction) GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN"));
      Status synced = sync();
      if (!in_transaction) {
        Status ended = exec(db, synced.ok() ? "COMMIT" : "ROLLBACK");
        if (synced.ok()) synced = ended;
      }
      if (synced.ok()) {
        seen_version = version;
        return synced;
      }
      // A compaction may have committed and removed a segment this read's snapshot still named:
      // if the catalogue has moved on since, read it again from the start.
      if (in_transaction || attempt >= 3) return synced;
      auto now = catalogue->data_version();
      if (!now.ok() || *now == version) return synced;
      clear_rows();
    }
  }

  // Reads the catalogue's rows for this collection and applies what is new: segments past the
  // last one mapped, tombstones not yet marked, the next sequence. Everything read is checked
  // (names, sequences, sizes, row numbers): an edited or damaged catalogue is DATA_LOSS naming
  // what is wrong, never a path outside the store or a read past a segment.
  Status sync() {
    const std::string where = fmt::format("{}: collection \"{}\"",
                                          (catalogue->directory / kCatalogueFile).string(), name);
    Statement head(db, "SELECT next_segment FROM collections WHERE name = ?");
    if (!head.ok()) return sqlite_error(db, "prepare");
    head.bind(1, name);
    int rc = head.step();
    if (rc == SQLITE_DONE) return not_found(fmt::format("{} is no longer in the catalogue", where));
    if (rc != SQLITE_ROW) return sqlite_error(db, where);
    const std::int64_t next = head.integer(0);
    if (next < 0) return data_loss(fmt::format("{}: next segment number {}", where, next));

    // Fewer rows than mapped segments, or a mapped segment gone: positions change, start over.
    std::size_t known = 0;
    {
      Statement listed(db, "SELECT sequence FROM segments WHERE collection = ? AND sequence <= ?");
      if (!listed.ok()) return sqlite_error(db, "prepare");
      const std::int64_t last =
          segments.empty() ? -1 : static_cast<std::int64_t>(segments.back()->info().sequence);
      listed.bind(1, name).bind(2, last);
      while ((rc = listed.step()) == SQLITE_ROW) {
        if (!segment_index(static_cast<std::uint64_t>(listed.integer(0)))) {
          known = ~std::size_t{0};
          break;
        }
        ++known;
      }
      if (known != ~std::size_t{0} && rc != SQLITE_DONE) return sqlite_error(db, where);
    }
    if (known != segments.size()) clear_rows();

    bool changed = false;
    Statement added(db,
                    "SELECT sequence, file, rows, bytes, crc FROM segments WHERE collection = ? "
                    "AND sequence > ? ORDER BY sequence");
    if (!added.ok()) return sqlite_error(db, "prepare");
    added.bind(1, name).bind(2, segments.empty()
                                    ? std::int64_t{-1}
                                    : static_cast<std::int64_t>(segments.back()->info().sequence));
    while ((rc = added.step()) == SQLITE_ROW) {
      const std::int64_t sequence = added.integer(0), rows = added.integer(2),
                         bytes = added.integer(3), crc = added.integer(4);
      detail::SegmentInfo info;
      info.file = added.text(1);
      if (sequence < 0 || sequence >= next) {
        return data_loss(
            fmt::format("{}: segment sequence {} is outside 0..{} (the next segment number)", where,
                        sequence, next - 1));
      }
      if (info.file != segment_file_name(name, static_cast<std::uint64_t>(sequence))) {
        return data_loss(
            fmt::format("{}: segment {} is named \"{}\", expected \"{}\"", where, sequence,
                        info.file, segment_file_name(name, static_cast<std::uint64_t>(sequence))));
      }
      if (rows <= 0 || static_cast<std::uint64_t>(rows) > max_segment_rows(config.dim) ||
          bytes < 0 || crc < 0 || crc > std::int64_t{0xFFFFFFFF}) {
        return data_loss(fmt::format("{}: segment {} has {} rows, {} bytes, CRC {}", where,
                                     info.file, rows, bytes, crc));
      }
      info.sequence = static_cast<std::uint64_t>(sequence);
      info.rows = static_cast<std::size_t>(rows);
      info.dim = config.dim;
      info.bytes = static_cast<std::uint64_t>(bytes);
      info.data_crc = static_cast<std::uint32_t>(crc);
      if (info.bytes != detail::segment_file_bytes(info.rows, info.dim)) {
        return data_loss(
            fmt::format("{}: segment {} is listed at {} bytes, {} rows of dimension {} take {}",
                        where, info.file, info.bytes, info.rows, info.dim,
                        detail::segment_file_bytes(info.rows, info.dim)));
      }
      GPUOPT_RETURN_IF_ERROR(add_segment(info));
      changed = true;
    }
    if (rc != SQLITE_DONE) return sqlite_error(db, "read segments");

    // Tombstones only accumulate (an id's row never comes back), so marking them all again is
    // enough; a forged one naming no row is refused.
    Statement tombstones(db, "SELECT segment, row FROM dead WHERE collection = ?");
    if (!tombstones.ok()) return sqlite_error(db, "prepare");
    tombstones.bind(1, name);
    const std::size_t dead_before = dead_count;
    while ((rc = tombstones.step()) == SQLITE_ROW) {
      const std::int64_t sequence = tombstones.integer(0), row = tombstones.integer(1);
      auto index = sequence >= 0 ? segment_index(static_cast<std::uint64_t>(sequence))
                                 : std::optional<std::size_t>{};
      if (!index || row < 0 || static_cast<std::uint64_t>(row) >= segments[*index]->info().rows) {
        return data_loss(fmt::format(
            "{}: a tombstone names row {} of segment {}, which the collection does not have", where,
            row, sequence));
      }
      mark_dead(segment_first_position[*index] + static_cast<std::uint64_t>(row));
    }
    if (rc != SQLITE_DONE) return sqlite_error(db, "read tombstones");
    changed = changed || dead_count != dead_before;
    next_sequence = static_cast<std::uint64_t>(next);
    if (changed) invalidate();
    return ok_status();
  }
};

Collection::Collection(std::unique_ptr<State> state) : state_(std::move(state)) {}
Collection::~Collection() = default;

const std::string& Collection::name() const { return state_->name; }
std::size_t Collection::dim() const { return state_->config.dim; }
Metric Collection::metric() const { return state_->config.metric; }
std::size_t Collection::size() const {
  // A failed refresh keeps the last view; the reads that return a Status report it.
  Status refreshed = state_->refresh();
  (void)refreshed;
  return state_->total_rows - state_->dead_count;
}

Status Collection::add(std::span<const std::uint64_t> ids, const float* vectors,
                       std::span<const Metadata> metadata, const CancelToken* cancel) {
  return write_batch(ids, vectors, metadata, /*replace=*/false, cancel);
}

Status Collection::upsert(std::span<const std::uint64_t> ids, const float* vectors,
                          std::span<const Metadata> metadata, const CancelToken* cancel) {
  return write_batch(ids, vectors, metadata, /*replace=*/true, cancel);
}

namespace {
// Rows between two polls of a CancelToken in the loops over a batch's rows.
constexpr std::size_t kCancelPollRows = 4096;
}  // namespace

Status Collection::write_batch(std::span<const std::uint64_t> ids, const float* vectors,
                               std::span<const Metadata> metadata, bool replace,
                               const CancelToken* cancel) {
  State& s = *state_;
  const std::size_t rows = ids.size();
  const std::size_t dim = s.config.dim;
  if (rows == 0) return ok_status();
  if (vectors == nullptr) return invalid_argument("add: vectors is null");
  if (!metadata.empty() && metadata.size() != rows) {
    return invalid_argument(fmt::format(
        "add: {} metadata entries for {} ids (give none or one per id)", metadata.size(), rows));
  }
  for (std::size_t i = 0; i < rows * dim; ++i) {
    if (!std::isfinite(vectors[i])) {
      return invalid_argument(fmt::format("add: vector {} (id {}) has a non-finite value at {}",
                                          i / dim, ids[i / dim], i % dim));
    }
  }
  {
    std::unordered_set<std::uint64_t> seen;
    for (auto id : ids) {
      if (!seen.insert(id).second) {
        return invalid_argument(fmt::format("add: id {} appears twice in one batch", id));
      }
    }
  }
  if (is_cancelled(cancel)) return cancelled("add");
  sqlite3* db = s.db;
  GPUOPT_RETURN_IF_ERROR(s.catalogue->lock_for_writing());
  GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN IMMEDIATE"));
  fs::path segment_path;
  bool file_written = false;
  auto fail = [&](Status status) {
    Status rollback = exec(db, "ROLLBACK");
    (void)rollback;
    if (file_written) {
      std::error_code ignored;
      fs::remove(segment_path, ignored);
    }
    return status;
  };
  // Catch up inside the transaction with whatever another writer committed before this one took
  // the lock, so the sequence and the id lookups below see the latest commit.
  if (Status refreshed = s.refresh(/*in_transaction=*/true); !refreshed.ok()) {
    return fail(refreshed);
  }
  const std::uint64_t seq = s.next_sequence;
  // Never write over a committed segment, whatever the catalogue's counter says.
  if (!s.segments.empty() && seq <= s.segments.back()->info().sequence) {
    return fail(data_loss(fmt::format(
        "collection \"{}\": the catalogue's next segment number {} is not past its last segment {}",
        s.name, seq, s.segments.back()->info().sequence)));
  }
  // Ids already present: an error for add, tombstones for upsert.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> superseded;  // (sequence, row)
  Statement lookup(db, "SELECT segment, row FROM items WHERE collection = ? AND id = ?");
  if (!lookup.ok()) return fail(sqlite_error(db, "prepare"));
  for (std::size_t i = 0; i < rows; ++i) {
    const std::uint64_t id = ids[i];
    if (i % kCancelPollRows == 0 && is_cancelled(cancel)) return fail(cancelled("add"));
    lookup.reset();
    lookup.bind(1, s.name).bind(2, as_sql(id));
    if (lookup.step() == SQLITE_ROW) {
      if (!replace) {
        return fail(Status(StatusCode::kAlreadyExists,
                           fmt::format("add: id {} already exists (use upsert)", id)));
      }
      superseded.emplace_back(lookup.integer(0), lookup.integer(1));
    }
  }
  std::string file = segment_file_name(s.name, seq);
  segment_path = s.segment_directory / file;
  file_written = true;
  auto written = detail::write_segment(segment_path, seq, dim, vectors, ids.data(), rows);
  if (!written.ok()) return fail(written.status());
  const detail::SegmentInfo& info = *written;
  if (is_cancelled(cancel)) return fail(cancelled("add"));

  Statement insert_segment(
      db, "INSERT INTO segments(collection, sequence, file, rows, bytes, crc) VALUES(?,?,?,?,?,?)");
  Statement upsert_item(
      db, "INSERT OR REPLACE INTO items(collection, id, segment, row, meta) VALUES(?,?,?,?,?)");
  Statement insert_dead(db, "INSERT OR IGNORE INTO dead(collection, segment, row) VALUES(?,?,?)");
  Statement bump(db, "UPDATE collections SET next_segment = ? WHERE name = ?");
  if (!insert_segment.ok() || !upsert_item.ok() || !insert_dead.ok() || !bump.ok()) {
    return fail(sqlite_error(db, "prepare"));
  }
  insert_segment.bind(1, s.name)
      .bind(2, static_cast<std::int64_t>(seq))
      .bind(3, file)
      .bind(4, static_cast<std::int64_t>(rows))
      .bind(5, static_cast<std::int64_t>(info.bytes))
      .bind(6, static_cast<std::int64_t>(info.data_crc));
  if (insert_segment.step() != SQLITE_DONE) return fail(sqlite_error(db, "insert segment"));
  for (std::size_t i = 0; i < rows; ++i) {
    if (i % kCancelPollRows == 0 && is_cancelled(cancel)) return fail(cancelled("add"));
    upsert_item.reset();
    upsert_item.bind(1, s.name)
        .bind(2, as_sql(ids[i]))
        .bind(3, static_cast<std::int64_t>(seq))
        .bind(4, static_cast<std::int64_t>(i));
    if (metadata.empty() || metadata[i].empty()) {
      upsert_item.bind_null(5);
    } else {
      upsert_item.bind(5, metadata_to_json(metadata[i]));
    }
    if (upsert_item.step() != SQLITE_DONE) return fail(sqlite_error(db, "insert item"));
  }
  for (const auto& [old_sequence, old_row] : superseded) {
    insert_dead.reset();
    insert_dead.bind(1, s.name)
        .bind(2, static_cast<std::int64_t>(old_sequence))
        .bind(3, static_cast<std::int64_t>(old_row));
    if (insert_dead.step() != SQLITE_DONE) return fail(sqlite_error(db, "insert tombstone"));
  }
  bump.bind(1, static_cast<std::int64_t>(seq + 1)).bind(2, s.name);
  if (bump.step() != SQLITE_DONE) return fail(sqlite_error(db, "update sequence"));
  // The last point where a cancel is honoured: past it the batch commits whole.
  if (is_cancelled(cancel)) return fail(cancelled("add"));
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail(sqlite_error(db, "commit"));
  }
  // Committed: acknowledged from here on. Mirror it in memory (this connection's own commits leave
  // data_version alone, so refresh() would not see them).
  s.next_sequence = seq + 1;
  s.invalidate();
  for (const auto& [old_sequence, old_row] : superseded) {
    if (auto index = s.segment_index(old_sequence)) {
      s.mark_dead(s.segment_first_position[*index] + old_row);
    }
  }
  Status mapped = s.add_segment(info);
  if (!mapped.ok()) {
    // The batch is committed and durable; only this process's view failed. Read it again from
    // the catalogue on the next call rather than report the batch as lost.
    s.seen_version = -1;
    s.clear_rows();
  }
  if (s.compact_above_segments > 0 && s.segments.size() > s.compact_above_segments) {
    // Best effort: the batch is acknowledged whatever this does; a failed compaction leaves the
    // old segments, and the next write tries again.
    auto compacted = compact();
    (void)compacted;
  }
  return ok_status();
}

StatusOr<CompactReport> Collection::compact(const CompactOptions& options) {
  State& s = *state_;
  sqlite3* db = s.db;
  const std::size_t dim = s.config.dim;
  const std::size_t target =
      options.target_rows > 0
          ? options.target_rows
          : std::max<std::size_t>(4096, (std::size_t{64} << 20) / (dim * sizeof(float)));
  const CancelToken* cancel = options.cancel;
  if (is_cancelled(cancel)) return cancelled("compact");
  GPUOPT_RETURN_IF_ERROR(s.catalogue->lock_for_writing());
  GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN IMMEDIATE"));
  std::vector<fs::path> written;
  auto fail = [&](Status status) {
    Status rollback = exec(db, "ROLLBACK");
    (void)rollback;
    for (const auto& path : written) {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
    return status;
  };
  if (Status refreshed = s.refresh(/*in_transaction=*/true); !refreshed.ok()) {
    return fail(refreshed);
  }
  CompactReport report;
  report.segments_before = s.segments.size();
  // Live rows per segment.
  std::vector<std::size_t> live(s.segments.size());
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const std::uint64_t first = s.segment_first_position[i];
    for (std::size_t r = 0; r < s.segments[i]->info().rows; ++r) live[i] += !s.is_dead(first + r);
  }
  // Runs of consecutive segments to rewrite as one: small ones together up to `target` live rows,
  // and any with deleted rows.
  std::vector<std::vector<std::size_t>> runs;
  std::vector<std::size_t> run;
  std::size_t run_rows = 0;
  auto close_run = [&] {
    const bool has_dead = std::any_of(run.begin(), run.end(), [&](std::size_t i) {
      return live[i] != s.segments[i]->info().rows;
    });
    if (run.size() > 1 || (run.size() == 1 && has_dead)) runs.push_back(run);
    run.clear();
    run_rows = 0;
  };
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const bool small = s.segments[i]->info().rows < target;
    const bool has_dead = live[i] != s.segments[i]->info().rows;
    if (!small && !has_dead) {
      close_run();
      continue;
    }
    if (run_rows + live[i] > target && !run.empty()) close_run();
    run.push_back(i);
    run_rows += live[i];
  }
  close_run();
  if (runs.empty()) {
    GPUOPT_RETURN_IF_ERROR(exec(db, "COMMIT"));
    report.segments_after = s.segments.size();
    return report;
  }

  Statement insert_segment(
      db, "INSERT INTO segments(collection, sequence, file, rows, bytes, crc) VALUES(?,?,?,?,?,?)");
  Statement move_item(db, "UPDATE items SET segment = ?, row = ? WHERE collection = ? AND id = ?");
  Statement drop_dead(db, "DELETE FROM dead WHERE collection = ? AND segment = ?");
  Statement drop_segment(db, "DELETE FROM segments WHERE collection = ? AND sequence = ?");
  Statement bump(db, "UPDATE collections SET next_segment = ? WHERE name = ?");
  if (!insert_segment.ok() || !move_item.ok() || !drop_dead.ok() || !drop_segment.ok() ||
      !bump.ok()) {
    return fail(sqlite_error(db, "prepare"));
  }
  std::uint64_t seq = s.next_sequence;
  std::vector<fs::path> replaced;
  std::vector<std::uint64_t> ids;
  std::vector<float> vectors;
  for (const auto& members : runs) {
    ids.clear();
    vectors.clear();
    for (std::size_t i : members) {
      if (is_cancelled(cancel)) return fail(cancelled("compact"));
      const auto& segment = *s.segments[i];
      // The rows are copied into the new segment: check them first, so damage is not sealed
      // under a fresh checksum.
      if (Status verified = s.segments[i]->verify(); !verified.ok()) return fail(verified);
      const std::uint64_t first = s.segment_first_position[i];
      for (std::size_t r = 0; r < segment.info().rows; ++r) {
        if (s.is_dead(first + r)) {
          ++report.rows_dropped;
          continue;
        }
        ids.push_back(segment.ids()[r]);
        vectors.insert(vectors.end(), segment.vectors() + r * dim,
                       segment.vectors() + (r + 1) * dim);
      }
      replaced.push_back(s.segment_directory / segment.info().file);
    }
    if (!ids.empty()) {
      const std::string file = segment_file_name(s.name, seq);
      fs::path path = s.segment_directory / file;
      written.push_back(path);
      auto info = detail::write_segment(path, seq, dim, vectors.data(), ids.data(), ids.size());
      if (!info.ok()) return fail(info.status());
      insert_segment.reset();
      insert_segment.bind(1, s.name)
          .bind(2, static_cast<std::int64_t>(seq))
          .bind(3, file)
          .bind(4, static_cast<std::int64_t>(ids.size()))
          .bind(5, static_cast<std::int64_t>(info->bytes))
          .bind(6, static_cast<std::int64_t>(info->data_crc));
      if (insert_segment.step() != SQLITE_DONE) return fail(sqlite_error(db, "insert segment"));
      for (std::size_t r = 0; r < ids.size(); ++r) {
        move_item.reset();
        move_item.bind(1, static_cast<std::int64_t>(seq))
            .bind(2, static_cast<std::int64_t>(r))
            .bind(3, s.name)
            .bind(4, as_sql(ids[r]));
        if (move_item.step() != SQLITE_DONE) return fail(sqlite_error(db, "move item"));
      }
      ++seq;
    }
    for (std::size_t i : members) {
      const auto old_sequence = static_cast<std::int64_t>(s.segments[i]->info().sequence);
      drop_dead.reset();
      drop_dead.bind(1, s.name).bind(2, old_sequence);
      drop_segment.reset();
      drop_segment.bind(1, s.name).bind(2, old_sequence);
      if (drop_dead.step() != SQLITE_DONE || drop_segment.step() != SQLITE_DONE) {
        return fail(sqlite_error(db, "drop segment"));
      }
    }
  }
  bump.bind(1, static_cast<std::int64_t>(seq)).bind(2, s.name);
  if (bump.step() != SQLITE_DONE) return fail(sqlite_error(db, "update sequence"));
  if (is_cancelled(cancel)) return fail(cancelled("compact"));
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail(sqlite_error(db, "commit"));
  }
  // Committed. The old files go only now; a reader that still maps one keeps its pages until it
  // moves on, and one whose snapshot still names one reads the catalogue again (refresh()).
  for (const auto& path : replaced) {
    std::error_code ignored;
    fs::remove(path, ignored);
  }
  // This connection's own commit leaves data_version alone: read the new layout explicitly.
  s.seen_version = -1;
  s.clear_rows();
  GPUOPT_RETURN_IF_ERROR(s.refresh());
  // And files of this collection's earlier sequences that no catalogue row names: left by a
  // compaction killed between its commit and the removals above.
  const std::string prefix = s.name + "-";
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(s.segment_directory, error)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with(prefix) || !file.ends_with(".seg")) continue;
    const std::string digits = file.substr(prefix.size(), file.size() - prefix.size() - 4);
    if (digits.size() < 8 || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const std::uint64_t sequence = std::stoull(digits);
    if (sequence < seq && segment_file_name(s.name, sequence) == file &&
        !s.segment_index(sequence)) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);
    }
  }
  report.segments_after = s.segments.size();
  if (options.resave_ivf) {
    if (is_cancelled(cancel)) {
      // Committed already: only the re-save is skipped, and the next load rebuilds in memory.
      report.ivf_error = "cancelled after the compaction committed; the IVF index was not re-saved";
    } else {
      const auto resave_start = std::chrono::steady_clock::now();
      s.resave_moved_ivf(report);
      report.ivf_resave_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - resave_start).count();
    }
  }
  return report;
}

StatusOr<std::size_t> Collection::remove(std::span<const std::uint64_t> ids,
                                         const CancelToken* cancel) {
  State& s = *state_;
  sqlite3* db = s.db;
  if (is_cancelled(cancel)) return cancelled("delete");
  GPUOPT_RETURN_IF_ERROR(s.catalogue->lock_for_writing());
  GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN IMMEDIATE"));
  auto fail = [&](Status status) {
    Status rollback = exec(db, "ROLLBACK");
    (void)rollback;
    return status;
  };
  if (Status refreshed = s.refresh(/*in_transaction=*/true); !refreshed.ok()) {
    return fail(refreshed);
  }
  Statement lookup(db, "SELECT segment, row FROM items WHERE collection = ? AND id = ?");
  Statement erase(db, "DELETE FROM items WHERE collection = ? AND id = ?");
  Statement insert_dead(db, "INSERT OR IGNORE INTO dead(collection, segment, row) VALUES(?,?,?)");
  if (!lookup.ok() || !erase.ok() || !insert_dead.ok()) return fail(sqlite_error(db, "prepare"));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> removed;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint64_t id = ids[i];
    if (i % kCancelPollRows == 0 && is_cancelled(cancel)) return fail(cancelled("delete"));
    lookup.reset();
    lookup.bind(1, s.name).bind(2, as_sql(id));
    if (lookup.step() != SQLITE_ROW) continue;
    std::uint64_t sequence = static_cast<std::uint64_t>(lookup.integer(0));
    std::uint64_t row = static_cast<std::uint64_t>(lookup.integer(1));
    erase.reset();
    erase.bind(1, s.name).bind(2, as_sql(id));
    insert_dead.reset();
    insert_dead.bind(1, s.name)
        .bind(2, static_cast<std::int64_t>(sequence))
        .bind(3, static_cast<std::int64_t>(row));
    if (erase.step() != SQLITE_DONE || insert_dead.step() != SQLITE_DONE) {
      return fail(sqlite_error(db, "delete"));
    }
    removed.emplace_back(sequence, row);
  }
  if (is_cancelled(cancel)) return fail(cancelled("delete"));
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail(sqlite_error(db, "commit"));
  }
  if (!removed.empty()) s.invalidate();
  for (const auto& [sequence, row] : removed) {
    if (auto index = s.segment_index(sequence)) {
      s.mark_dead(s.segment_first_position[*index] + row);
    }
  }
  return removed.size();
}

StatusOr<Record> Collection::get(std::uint64_t id) const {
  State& s = *state_;
  // The lookup and the refresh in one read transaction: the row the catalogue names is then
  // always one of the segments mapped, even while another process commits.
  for (int attempt = 0;; ++attempt) {
    GPUOPT_ASSIGN_OR_RETURN(std::int64_t before, s.catalogue->data_version());
    GPUOPT_RETURN_IF_ERROR(exec(s.db, "BEGIN"));
    auto found = get_in_transaction(s, id);
    Status ended = exec(s.db, found.ok() ? "COMMIT" : "ROLLBACK");
    if (found.ok()) {
      GPUOPT_RETURN_IF_ERROR(ended);
      return found;
    }
    // A compaction in another process may have removed a segment file that this transaction's
    // snapshot still named: when the catalogue has moved on since, read it again from the start.
    if (attempt >= 3 || found.status().code() == StatusCode::kNotFound) return found.status();
    auto now = s.catalogue->data_version();
    if (!now.ok() || *now == before) return found.status();
    s.clear_rows();
    s.seen_version = -1;
  }
}

StatusOr<Record> Collection::get_in_transaction(State& s, std::uint64_t id) {
  GPUOPT_RETURN_IF_ERROR(s.refresh(/*in_transaction=*/true));
  Statement lookup(s.db, "SELECT segment, row, meta FROM items WHERE collection = ? AND id = ?");
  if (!lookup.ok()) return sqlite_error(s.db, "prepare");
  lookup.bind(1, s.name).bind(2, as_sql(id));
  int rc = lookup.step();
  if (rc == SQLITE_DONE) {
    return not_found(fmt::format("id {} is not in collection \"{}\"", id, s.name));
  }
  if (rc != SQLITE_ROW) return sqlite_error(s.db, "get");
  auto index = s.segment_index(static_cast<std::uint64_t>(lookup.integer(0)));
  std::size_t row = static_cast<std::size_t>(lookup.integer(1));
  if (!index || row >= s.segments[*index]->info().rows) {
    return data_loss(
        fmt::format("id {}: the catalogue points at segment {} row {}, which this "
                    "store does not have",
                    id, lookup.integer(0), row));
  }
  const auto& segment = *s.segments[*index];
  Record record;
  record.id = id;
  const float* v = segment.vectors() + row * s.config.dim;
  record.vector.assign(v, v + s.config.dim);
  if (!lookup.is_null(2)) {
    GPUOPT_ASSIGN_OR_RETURN(record.metadata, parse_metadata(lookup.text(2)));
  }
  return record;
}

StatusOr<std::uint64_t> Collection::next_free_id() const {
  Statement max_id(state_->db, "SELECT MAX(id) FROM items WHERE collection = ? AND id >= 0");
  if (!max_id.ok()) return sqlite_error(state_->db, "prepare");
  max_id.bind(1, state_->name);
  if (max_id.step() != SQLITE_ROW) return sqlite_error(state_->db, "max id");
  return max_id.is_null(0) ? 0 : from_sql(max_id.integer(0)) + 1;
}

StatusOr<std::vector<RowSpan>> Collection::rows(const std::string& where_json,
                                                std::vector<std::uint64_t>* live_mask) {
  GPUOPT_RETURN_IF_ERROR(state_->refresh());
  return current_rows(where_json, live_mask);
}

StatusOr<std::vector<RowSpan>> Collection::current_rows(const std::string& where_json,
                                                        std::vector<std::uint64_t>* live_mask) {
  State& s = *state_;
  std::vector<RowSpan> spans;
  for (auto& segment : s.segments) {
    if (s.verify_on_first_use) GPUOPT_RETURN_IF_ERROR(segment->verify());
    spans.push_back({segment->vectors(), segment->norms(), segment->ids(), segment->info().rows});
  }
  if (live_mask != nullptr) {
    GPUOPT_ASSIGN_OR_RETURN(Filter filter, Filter::parse(where_json));
    live_mask->assign((s.total_rows + 63) / 64, ~std::uint64_t{0});
    for (std::size_t w = 0; w < s.dead.size() && w < live_mask->size(); ++w) {
      (*live_mask)[w] &= ~s.dead[w];
    }
    if (!filter.empty()) {
      if (!s.metadata_by_position) {
        std::vector<Metadata> by_position(s.total_rows);
        Statement all(s.db,
                      "SELECT segment, row, meta FROM items WHERE collection = ? AND meta "
                      "IS NOT NULL");
        if (!all.ok()) return sqlite_error(s.db, "prepare");
        all.bind(1, s.name);
        int rc;
        while ((rc = all.step()) == SQLITE_ROW) {
          auto index = s.segment_index(static_cast<std::uint64_t>(all.integer(0)));
          // Rows of segments committed after this view was read are not in it yet.
          if (!index) continue;
          if (all.integer(1) < 0 ||
              static_cast<std::uint64_t>(all.integer(1)) >= s.segments[*index]->info().rows) {
            return data_loss(
                fmt::format("collection \"{}\": the catalogue gives metadata to row {} of {}, "
                            "which has {} rows",
                            s.name, all.integer(1), s.segments[*index]->info().file,
                            s.segments[*index]->info().rows));
          }
          GPUOPT_ASSIGN_OR_RETURN(Metadata metadata, parse_metadata(all.text(2)));
          by_position[s.segment_first_position[*index] + all.integer(1)] = std::move(metadata);
        }
        if (rc != SQLITE_DONE) return sqlite_error(s.db, "read metadata");
        s.metadata_by_position = std::move(by_position);
      }
      for (std::uint64_t p = 0; p < s.total_rows; ++p) {
        if (!filter.matches((*s.metadata_by_position)[p])) {
          (*live_mask)[p / 64] &= ~(std::uint64_t{1} << (p & 63));
        }
      }
    }
    // Padding bits past the last row stay clear so nothing can select them.
    if (s.total_rows % 64 != 0 && !live_mask->empty()) {
      live_mask->back() &= (std::uint64_t{1} << (s.total_rows % 64)) - 1;
    }
  }
  return spans;
}

// ---- The persistent IVF index -------------------------------------------------------------------
// The index file (ivf_index.hpp) holds the centroids and each list's positions and ids; the
// catalogue's ivf_indexes row names the published file. Rows written after a save are not in the
// file: their segments are durable, and loading assigns them to their nearest centroid again (the
// same rule an in-process write follows), re-saving once they are a quarter of the saved rows.
// A compaction renumbers positions: it rebuilds the lists by id and saves them itself; a load
// that still finds moved positions (a compaction that could not save) rebuilds them in memory
// and its catch-up saves them.

namespace {

constexpr double kIvfResaveFraction = 0.25;

Status ensure_ivf_table(sqlite3* db) {
  return exec(db,
              "CREATE TABLE IF NOT EXISTS ivf_indexes(collection TEXT PRIMARY KEY, file TEXT NOT "
              "NULL, generation INTEGER NOT NULL, bytes INTEGER NOT NULL, crc INTEGER NOT NULL, "
              "covered_rows INTEGER NOT NULL)");
}

// The catalogue's record of the collection's published index, if any.
StatusOr<std::optional<detail::IvfFileInfo>> ivf_catalogue_entry(sqlite3* db,
                                                                 const std::string& name) {
  GPUOPT_RETURN_IF_ERROR(ensure_ivf_table(db));
  Statement select(db, "SELECT file, generation, bytes, crc FROM ivf_indexes WHERE collection = ?");
  if (!select.ok()) return sqlite_error(db, "prepare");
  select.bind(1, name);
  int rc = select.step();
  if (rc == SQLITE_DONE) return std::optional<detail::IvfFileInfo>();
  if (rc != SQLITE_ROW) return sqlite_error(db, "read the IVF index entry");
  detail::IvfFileInfo info;
  info.file = select.text(0);
  info.generation = static_cast<std::uint64_t>(select.integer(1));
  info.bytes = static_cast<std::uint64_t>(select.integer(2));
  info.data_crc = static_cast<std::uint32_t>(select.integer(3));
  return std::optional<detail::IvfFileInfo>(std::move(info));
}

const char* train_engine_name(detail::IvfTrainEngine engine) {
  return engine == detail::IvfTrainEngine::kGpu ? "gpu" : "cpu";
}

}  // namespace

// Publishes s.ivf as a new file (publish_ivf).
Status Collection::State::save_ivf() {
  State& s = *this;
  auto& ivf = *s.ivf;
  const detail::IvfFlat& index = ivf.index;
  detail::IvfFileContents contents;
  contents.dim = index.dim();
  contents.metric = index.metric();
  contents.nlist = index.nlist();
  contents.trained_rows = ivf.trained_rows;
  contents.covered_rows = index.rows();
  contents.engine = ivf.engine;
  contents.iterations = ivf.iterations;
  contents.train_seconds = ivf.train_seconds;
  contents.trained_mean_distance = ivf.trained_mean_distance;
  contents.added_distance_sum = ivf.added_distance_sum;
  contents.centroids = index.centroids();
  contents.list_offsets.assign(index.nlist() + 1, 0);
  contents.positions.reserve(index.rows());
  contents.ids.reserve(index.rows());
  for (std::size_t l = 0; l < index.nlist(); ++l) {
    for (std::uint64_t position : index.list(l).positions) {
      contents.positions.push_back(position);
      contents.ids.push_back(s.id_at(position));
    }
    contents.list_offsets[l + 1] = contents.positions.size();
  }
  GPUOPT_ASSIGN_OR_RETURN(detail::IvfFileInfo info, s.publish_ivf(contents, ivf.generation));
  ivf.file = info.file;
  ivf.generation = info.generation;
  ivf.saved_rows = contents.covered_rows;
  ivf.rebuilt = false;
  ivf.save_error.clear();
  return ok_status();
}

// Written and fsync'd under a fresh name, named in the catalogue in one transaction, then the
// previous file is removed.
StatusOr<detail::IvfFileInfo> Collection::State::publish_ivf(detail::IvfFileContents& contents,
                                                             std::uint64_t loaded_generation) {
  State& s = *this;
  if (s.catalogue->read_only) {
    return failed_precondition(
        fmt::format("{}: the store is open read-only ({}); the IVF index is not saved",
                    s.catalogue->directory.string(), s.catalogue->read_only_reason));
  }
  GPUOPT_ASSIGN_OR_RETURN(auto current, ivf_catalogue_entry(s.db, s.name));
  const std::uint64_t base_generation = current ? current->generation : 0;
  contents.generation = std::max(base_generation, loaded_generation) + 1;
  // The process id keeps two processes that save at once from writing the same name.
  const std::string file =
      fmt::format("{}-ivf-{:08d}-{}.ivf", s.name, contents.generation, ::getpid());
  const fs::path path = s.segment_directory / file;
  GPUOPT_ASSIGN_OR_RETURN(detail::IvfFileInfo info, detail::write_ivf_file(path, contents));
  sqlite3* db = s.db;
  auto discard = [&](Status status) {
    Status rollback = exec(db, "ROLLBACK");
    (void)rollback;
    std::error_code ignored;
    fs::remove(path, ignored);
    return status;
  };
  GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN IMMEDIATE"));
  Statement check(db, "SELECT generation FROM ivf_indexes WHERE collection = ?");
  if (!check.ok()) return discard(sqlite_error(db, "prepare"));
  check.bind(1, s.name);
  int rc = check.step();
  std::uint64_t now = rc == SQLITE_ROW ? static_cast<std::uint64_t>(check.integer(0)) : 0;
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return discard(sqlite_error(db, "read IVF entry"));
  if (now != base_generation) {
    return discard(failed_precondition(fmt::format(
        "collection \"{}\": another process saved an IVF index meanwhile; reopen the store",
        s.name)));
  }
  Statement publish(db,
                    "INSERT OR REPLACE INTO ivf_indexes(collection, file, generation, bytes, crc, "
                    "covered_rows) VALUES(?,?,?,?,?,?)");
  if (!publish.ok()) return discard(sqlite_error(db, "prepare"));
  publish.bind(1, s.name)
      .bind(2, info.file)
      .bind(3, static_cast<std::int64_t>(info.generation))
      .bind(4, static_cast<std::int64_t>(info.bytes))
      .bind(5, static_cast<std::int64_t>(info.data_crc))
      .bind(6, static_cast<std::int64_t>(contents.covered_rows));
  if (publish.step() != SQLITE_DONE) return discard(sqlite_error(db, "publish the IVF index"));
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return discard(sqlite_error(db, "commit"));
  }
  if (current && current->file != info.file && current->file.find('/') == std::string::npos) {
    std::error_code ignored;
    fs::remove(s.segment_directory / current->file, ignored);
  }
  return info;
}

void Collection::State::resave_moved_ivf(CompactReport& report) {
  State& s = *this;
  // clear_rows() dropped the lists in memory, and they stay unloaded: a process that never queries
  // IVF does not pay for their vectors. Only the file's ids and lists are read, and the lists that
  // load_ivf() would rebuild by id (the same ivf_lists_by_id(), in position order) are written as
  // save_ivf() would write them.
  auto fail = [&](const Status& status) { report.ivf_error = status.to_string(); };
  auto entry = ivf_catalogue_entry(s.db, s.name);
  if (!entry.ok()) return fail(entry.status());
  if (!entry->has_value()) return;  // no index
  auto read = s.read_ivf(**entry);
  if (!read.ok()) return fail(read.status());
  detail::IvfFileContents& file = *read;
  if (s.ivf_positions_hold(file)) return;  // its positions still hold
  const std::size_t nlist = file.nlist;
  double added_distance_sum = 0;
  std::vector<std::uint32_t> lists;
  {
    const detail::IvfFlat centroids =
        detail::IvfFlat::with_centroids(file.centroids, s.config.dim, s.config.metric);
    lists = s.ivf_lists_by_id(file, centroids, added_distance_sum);
  }
  detail::IvfFileContents contents;
  contents.dim = s.config.dim;
  contents.metric = s.config.metric;
  contents.nlist = nlist;
  contents.covered_rows = s.total_rows;
  contents.trained_rows = std::min<std::uint64_t>(file.trained_rows, s.total_rows);
  contents.engine = file.engine;
  contents.iterations = file.iterations;
  contents.train_seconds = file.train_seconds;
  contents.trained_mean_distance = file.trained_mean_distance;
  contents.added_distance_sum = added_distance_sum + file.added_distance_sum;
  contents.centroids = std::move(file.centroids);
  // Each list holds its rows in position order, as the appends of a rebuild leave them.
  contents.list_offsets.assign(nlist + 1, 0);
  for (std::uint32_t list : lists) ++contents.list_offsets[list + 1];
  for (std::size_t l = 0; l < nlist; ++l) contents.list_offsets[l + 1] += contents.list_offsets[l];
  contents.positions.resize(s.total_rows);
  contents.ids.resize(s.total_rows);
  std::vector<std::uint64_t> next(contents.list_offsets.begin(), contents.list_offsets.end() - 1);
  std::uint64_t position = 0;
  for (const auto& segment : s.segments) {
    const std::uint64_t* ids = segment->ids();
    for (std::size_t row = 0; row < segment->info().rows; ++row, ++position) {
      const std::uint64_t slot = next[lists[position]]++;
      contents.positions[slot] = position;
      contents.ids[slot] = ids[row];
    }
  }
  if (auto published = s.publish_ivf(contents, file.generation); !published.ok()) {
    return fail(published.status());
  }
  report.ivf_resaved = true;
}

// Appends rows [index.rows(), total_rows) to their nearest lists; re-saves once they are many,
// or when the lists were rebuilt by id (a compaction in another process, or one that did not
// re-save, moved them), so that the next load finds positions that hold. The save is best effort:
// the lists in memory answer either way, a read-only store does not try, and a failed save is
// recorded (IvfIndexStats::save_error) and not tried again for these lists.
StatusOr<std::size_t> Collection::State::catch_up_ivf(int threads, const CancelToken* cancel) {
  State& s = *this;
  auto& ivf = *s.ivf;
  std::size_t assigned = 0;
  const std::size_t dim = s.config.dim;
  while (ivf.index.rows() < s.total_rows) {
    if (is_cancelled(cancel)) return cancelled("IVF assignment");
    const std::uint64_t position = ivf.index.rows();
    auto [segment, row] = s.locate(position);
    const auto& seg = *s.segments[segment];
    const std::size_t count = seg.info().rows - row;
    const float* vectors = seg.vectors() + row * dim;
    std::vector<std::uint32_t> lists(count);
    std::vector<float> distances(count);
    ivf.index.nearest(vectors, count, lists.data(), distances.data(), threads, cancel);
    if (is_cancelled(cancel)) return cancelled("IVF assignment");
    for (std::size_t i = 0; i < count; ++i) {
      ivf.index.append(lists[i], vectors + i * dim, seg.norms()[row + i], position + i);
      ivf.added_distance_sum += distances[i];
    }
    assigned += count;
  }
  const bool grown = assigned > 0 && double(ivf.index.rows() - ivf.saved_rows) >=
                                         std::max(1.0, kIvfResaveFraction * double(ivf.saved_rows));
  if ((grown || ivf.rebuilt) && ivf.save_error.empty() && !s.catalogue->read_only) {
    if (Status saved = s.save_ivf(); !saved.ok()) ivf.save_error = saved.to_string();
  }
  return assigned;
}

StatusOr<detail::IvfFileContents> Collection::State::read_ivf(const detail::IvfFileInfo& entry) {
  State& s = *this;
  const fs::path path = s.segment_directory / entry.file;
  if (entry.file.find('/') != std::string::npos) {
    return data_loss(
        fmt::format("IVF index {}: the catalogue names a file outside segments/", path.string()));
  }
  GPUOPT_ASSIGN_OR_RETURN(detail::IvfFileContents contents,
                          detail::read_ivf_file(path, entry, s.config.dim, s.config.metric));
  if (contents.trained_rows > contents.covered_rows) {
    return data_loss(fmt::format(
        "IVF index {}: covers {} rows, trained on {} (`gpuopt vector reindex` rebuilds it; exact "
        "queries are unaffected)",
        path.string(), contents.covered_rows, contents.trained_rows));
  }
  return contents;
}

// The file names rows by position and id. Positions hold while rows are only appended; a
// compaction (here or in another process) renumbers them, and then the lists are rebuilt by id.
bool Collection::State::ivf_positions_hold(const detail::IvfFileContents& contents) const {
  const State& s = *this;
  bool positions_hold = contents.covered_rows <= s.total_rows;
  for (std::uint64_t i = 0; positions_hold && i < contents.positions.size(); ++i) {
    positions_hold =
        contents.positions[i] < s.total_rows && s.id_at(contents.positions[i]) == contents.ids[i];
  }
  return positions_hold;
}

// Each row of the current layout goes to the list the file gave its id; rows the file does not
// know (written after it was saved) to their nearest centroid. Ids the file names that are gone
// are dropped. A row rewritten by upsert keeps its id's list: IVF scans it there with its true
// distance, so only recall can suffer, until `gpuopt vector reindex`. An id the file names twice
// (a row rewritten by upsert, the old one deleted) takes the list of its highest position: the
// later write, the one that is live.
std::vector<std::uint32_t> Collection::State::ivf_lists_by_id(
    const detail::IvfFileContents& contents, const detail::IvfFlat& centroids,
    double& added_distance_sum) const {
  const State& s = *this;
  struct Placed {
    std::uint64_t position;
    std::uint32_t list;
  };
  std::unordered_map<std::uint64_t, Placed> list_of_id;
  list_of_id.reserve(contents.ids.size());
  for (std::size_t l = 0; l < contents.nlist; ++l) {
    for (std::uint64_t i = contents.list_offsets[l]; i < contents.list_offsets[l + 1]; ++i) {
      const Placed placed{contents.positions[i], static_cast<std::uint32_t>(l)};
      auto [at, inserted] = list_of_id.try_emplace(contents.ids[i], placed);
      if (!inserted && at->second.position < placed.position) at->second = placed;
    }
  }
  std::vector<std::uint32_t> lists(s.total_rows);
  const std::size_t dim = s.config.dim;
  std::uint64_t position = 0;
  for (const auto& segment : s.segments) {
    const auto& seg = *segment;
    for (std::size_t row = 0; row < seg.info().rows; ++row, ++position) {
      auto known = list_of_id.find(seg.ids()[row]);
      if (known != list_of_id.end()) {
        lists[position] = known->second.list;
      } else {
        float distance = 0;
        centroids.nearest(seg.vectors() + row * dim, 1, &lists[position], &distance, 1);
        added_distance_sum += distance;
      }
    }
  }
  return lists;
}

// Loads the published index when it is newer than the one in memory (or none is loaded).
Status Collection::State::load_ivf() {
  State& s = *this;
  GPUOPT_ASSIGN_OR_RETURN(auto entry, ivf_catalogue_entry(s.db, s.name));
  if (!entry) {
    s.ivf.reset();
    return ok_status();
  }
  if (s.ivf && s.ivf->generation == entry->generation) return ok_status();
  GPUOPT_ASSIGN_OR_RETURN(detail::IvfFileContents contents, s.read_ivf(*entry));
  const bool positions_hold = s.ivf_positions_hold(contents);
  Ivf ivf;
  ivf.index =
      detail::IvfFlat::with_centroids(std::move(contents.centroids), s.config.dim, s.config.metric);
  if (positions_hold) {
    for (std::size_t l = 0; l < contents.nlist; ++l) {
      ivf.index.reserve(static_cast<std::uint32_t>(l),
                        contents.list_offsets[l + 1] - contents.list_offsets[l]);
      for (std::uint64_t i = contents.list_offsets[l]; i < contents.list_offsets[l + 1]; ++i) {
        const std::uint64_t position = contents.positions[i];
        auto [segment, row] = s.locate(position);
        const auto& seg = *s.segments[segment];
        ivf.index.append(static_cast<std::uint32_t>(l), seg.vectors() + row * s.config.dim,
                         seg.norms()[row], position);
      }
    }
    ivf.saved_rows = contents.covered_rows;
  } else {
    const std::vector<std::uint32_t> lists =
        s.ivf_lists_by_id(contents, ivf.index, ivf.added_distance_sum);
    const std::size_t dim = s.config.dim;
    for (std::uint64_t position = 0; position < s.total_rows; ++position) {
      auto [segment, row] = s.locate(position);
      const auto& seg = *s.segments[segment];
      ivf.index.append(lists[position], seg.vectors() + row * dim, seg.norms()[row], position);
    }
    ivf.saved_rows = 0;
    ivf.rebuilt = true;  // saved by the caller's catch-up
    ++s.ivf_rebuilds;
  }
  ivf.file = entry->file;
  ivf.generation = contents.generation;
  // Deleted rows that a compaction dropped leave fewer rows than k-means saw: the drift figures
  // (rows since training, growth) and the file's check (trained <= covered) count what is left.
  ivf.trained_rows = std::min<std::uint64_t>(contents.trained_rows, ivf.index.rows());
  ivf.engine = contents.engine;
  ivf.iterations = contents.iterations;
  ivf.train_seconds = contents.train_seconds;
  ivf.trained_mean_distance = contents.trained_mean_distance;
  ivf.added_distance_sum += contents.added_distance_sum;
  ivf.index.set_train_seconds(contents.train_seconds);
  s.ivf = std::move(ivf);
  s.ivf_gpu.reset();
  return ok_status();
}

StatusOr<double> Collection::build_ivf(const IvfParams& params, int threads) {
  State& s = *state_;
  const CancelToken* cancel = params.cancel;
  // Every return before the new index replaces s.ivf keeps the old one, loaded and saved.
  if (is_cancelled(cancel)) return cancelled("IVF training");
  const auto start = std::chrono::steady_clock::now();
  GPUOPT_ASSIGN_OR_RETURN(auto spans, rows("", nullptr));
  const std::size_t dim = s.config.dim;
  const std::uint64_t total = s.total_rows;
  if (total == 0) return failed_precondition("IVF: the collection has no vectors to train on");
  const std::size_t nlist = params.nlist != 0 ? params.nlist : detail::default_nlist(total);
  if (nlist > total) {
    return invalid_argument(fmt::format("IVF: nlist {} exceeds the {} vectors", nlist, total));
  }
  if (params.iterations < 0) {
    return invalid_argument(fmt::format("IVF: {} k-means iterations", params.iterations));
  }
  std::vector<detail::RowBlock> blocks;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    blocks.push_back(
        {spans[i].vectors, spans[i].norms, spans[i].rows, s.segment_first_position[i], nullptr});
  }
  const std::vector<float> sample = detail::ivf_training_sample(blocks, dim, nlist, params);
  const std::size_t sample_rows = sample.size() / dim;
  std::vector<float> centroids;
  std::vector<std::uint32_t> lists(total);
  std::vector<float> distances(total);
  detail::IvfTrainEngine engine = detail::IvfTrainEngine::kCpu;
  if (params.engine != QueryEngine::kCpu) {
    auto gpu = [&]() -> Status {
      GPUOPT_ASSIGN_OR_RETURN(auto kmeans, detail::GpuKmeans::create(dim, params.device));
      GPUOPT_ASSIGN_OR_RETURN(
          centroids, kmeans->train(sample.data(), sample_rows, nlist, params.iterations, cancel));
      for (std::size_t i = 0; i < spans.size(); ++i) {
        if (is_cancelled(cancel)) return cancelled("IVF training");
        const std::size_t at = s.segment_first_position[i];
        GPUOPT_RETURN_IF_ERROR(kmeans->assign(centroids.data(), nlist, spans[i].vectors,
                                              spans[i].rows, lists.data() + at,
                                              distances.data() + at));
      }
      return ok_status();
    }();
    if (is_cancelled(cancel)) return cancelled("IVF training");
    if (gpu.ok()) {
      engine = detail::IvfTrainEngine::kGpu;
    } else if (params.engine == QueryEngine::kGpu) {
      return gpu.with_context("IVF: GPU k-means");
    } else {
      centroids.clear();
    }
  }
  if (engine == detail::IvfTrainEngine::kCpu) {
    centroids = detail::kmeans_cpu(sample.data(), sample_rows, dim, nlist, params.iterations,
                                   threads, cancel);
    if (is_cancelled(cancel)) return cancelled("IVF training");
  }
  State::Ivf ivf;
  ivf.index = detail::IvfFlat::with_centroids(std::move(centroids), dim, s.config.metric);
  if (engine == detail::IvfTrainEngine::kCpu) {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const std::size_t at = s.segment_first_position[i];
      ivf.index.nearest(spans[i].vectors, spans[i].rows, lists.data() + at, distances.data() + at,
                        threads, cancel);
      if (is_cancelled(cancel)) return cancelled("IVF training");
    }
  }
  {
    std::vector<std::size_t> sizes(nlist, 0);
    for (auto list : lists) {
      if (list >= nlist) {
        return internal_error(fmt::format("IVF: a row was assigned to list {} of {}", list, nlist));
      }
      ++sizes[list];
    }
    for (std::size_t l = 0; l < nlist; ++l) {
      ivf.index.reserve(static_cast<std::uint32_t>(l), sizes[l]);
    }
  }
  double distance_sum = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const std::size_t at = s.segment_first_position[i];
    for (std::size_t r = 0; r < spans[i].rows; ++r) {
      ivf.index.append(lists[at + r], spans[i].vectors + r * dim, spans[i].norms[r], at + r);
      distance_sum += distances[at + r];
    }
  }
  ivf.trained_rows = total;
  ivf.engine = engine;
  ivf.iterations = static_cast<std::uint32_t>(params.iterations);
  ivf.trained_mean_distance = distance_sum / double(total);
  ivf.train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ivf.index.set_train_seconds(ivf.train_seconds);
  // The last point where a cancel is honoured: from here the new index replaces the old one.
  if (is_cancelled(cancel)) return cancelled("IVF training");
  if (s.ivf) ivf.generation = s.ivf->generation;
  s.ivf = std::move(ivf);
  s.ivf_gpu.reset();
  ++s.ivf_trainings;
  // The index serves this process even when saving fails; the error says why it was not kept.
  GPUOPT_RETURN_IF_ERROR(s.save_ivf().with_context("IVF: saving the index"));
  return s.ivf->train_seconds;
}

IvfIndexStats Collection::State::describe_ivf(const IvfParams& thresholds) const {
  const State& s = *this;
  IvfIndexStats stats;
  stats.trainings = s.ivf_trainings;
  stats.rebuilds_by_id = s.ivf_rebuilds;
  if (!s.ivf) return stats;
  stats.save_error = s.ivf->save_error;
  const auto& ivf = *s.ivf;
  stats.present = true;
  stats.file = ivf.file;
  stats.generation = ivf.generation;
  stats.nlist = ivf.index.nlist();
  stats.train_engine = train_engine_name(ivf.engine);
  stats.train_seconds = ivf.train_seconds;
  stats.trained_rows = ivf.trained_rows;
  stats.rows_since_training = ivf.index.rows() - ivf.trained_rows;
  stats.growth =
      ivf.trained_rows > 0 ? double(stats.rows_since_training) / double(ivf.trained_rows) : 0;
  stats.trained_mean_distance = ivf.trained_mean_distance;
  if (stats.rows_since_training > 0) {
    stats.added_mean_distance = ivf.added_distance_sum / double(stats.rows_since_training);
    if (ivf.trained_mean_distance > 0) {
      stats.distance_ratio = stats.added_mean_distance / ivf.trained_mean_distance;
    }
  }
  stats.retrain_recommended = stats.growth > thresholds.retrain_growth ||
                              (stats.rows_since_training >= stats.nlist &&
                               stats.distance_ratio > thresholds.retrain_distance_ratio);
  return stats;
}

StatusOr<IvfIndexStats> Collection::ivf_stats(const IvfParams& thresholds) {
  State& s = *state_;
  GPUOPT_RETURN_IF_ERROR(s.load_ivf());
  if (s.ivf) GPUOPT_RETURN_IF_ERROR(s.catch_up_ivf(0).status());
  return s.describe_ivf(thresholds);
}

StatusOr<SearchResults> Collection::query_ivf(const float* queries, std::size_t query_count,
                                              const QueryOptions& options,
                                              const std::vector<std::uint64_t>* allow,
                                              QueryReport& report) {
  State& s = *state_;
  // A saved index that fails validation is refused (DATA_LOSS naming the file), never replaced
  // silently: build_ivf (`gpuopt vector reindex`) replaces it.
  GPUOPT_RETURN_IF_ERROR(s.load_ivf());
  IvfParams train = options.ivf;
  if (train.cancel == nullptr) train.cancel = options.cancel;
  if (!s.ivf) {
    GPUOPT_ASSIGN_OR_RETURN(report.ivf_build_seconds, build_ivf(train, options.threads));
    report.ivf_built = true;
  } else {
    GPUOPT_ASSIGN_OR_RETURN(report.ivf_rows_assigned,
                            s.catch_up_ivf(options.threads, options.cancel));
    if (options.ivf.auto_retrain && s.describe_ivf(options.ivf).retrain_recommended) {
      IvfParams params = train;
      params.nlist = params.nlist != 0 ? params.nlist : detail::default_nlist(s.total_rows);
      GPUOPT_ASSIGN_OR_RETURN(report.ivf_build_seconds, build_ivf(params, options.threads));
      report.ivf_retrained = true;
    }
  }
  const detail::IvfFlat& index = s.ivf->index;
  SearchResults results(query_count);
  if (options.engine != QueryEngine::kCpu) {
    auto gpu = [&]() -> Status {
      if (s.ivf_gpu == nullptr || s.ivf_gpu_generation != s.ivf->generation ||
          s.ivf_gpu_rows != index.rows() || s.ivf_gpu->device() != options.gpu.device) {
        s.ivf_gpu.reset();
        const auto start = std::chrono::steady_clock::now();
        GPUOPT_ASSIGN_OR_RETURN(s.ivf_gpu, detail::GpuIvfLists::create(index, options.gpu.device));
        s.ivf_gpu_generation = s.ivf->generation;
        s.ivf_gpu_rows = index.rows();
        report.gpu_rows_uploaded = index.rows();
        report.gpu_upload_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      GPUOPT_ASSIGN_OR_RETURN(auto found,
                              s.ivf_gpu->search(queries, query_count, options.k, options.nprobe,
                                                allow != nullptr ? allow->data() : nullptr,
                                                allow != nullptr ? allow->size() : 0));
      for (std::size_t q = 0; q < query_count; ++q) {
        for (std::size_t i = 0; i < options.k; ++i) {
          const std::size_t slot = q * options.k + i;
          if (found.positions[slot] == ~std::uint64_t{0}) break;
          results[q].push_back({s.id_at(found.positions[slot]), found.distances[slot]});
        }
      }
      return ok_status();
    }();
    if (gpu.ok()) {
      report.engine = QueryEngine::kGpu;
      return results;
    }
    if (options.engine == QueryEngine::kGpu) return gpu;
    report.fallback_reason = gpu.to_string();
    results.assign(query_count, {});
  }
  report.engine = QueryEngine::kCpu;
  auto found = index.search(queries, query_count, options.k, options.nprobe, allow, options.threads,
                            options.cancel);
  if (is_cancelled(options.cancel)) return cancelled("query");
  for (std::size_t q = 0; q < query_count; ++q) {
    for (const auto& item : found[q].items()) {
      results[q].push_back({s.id_at(item.position), item.distance});
    }
  }
  return results;
}

namespace {

// Why the GPU engine cannot answer these options; empty when it can try.
std::string gpu_unsupported_reason(const QueryOptions& options) {
  if (options.index != IndexKind::kExact) {
    return fmt::format("the GPU engine answers exact queries only (index {})",
                       options.index == IndexKind::kIvf ? "ivf" : "?");
  }
  if (options.k > kGpuMaxK) {
    return fmt::format("k {} is above the GPU engine's largest, {}", options.k, kGpuMaxK);
  }
  return {};
}

}  // namespace

StatusOr<SearchResults> Collection::query(const float* queries, std::size_t query_count,
                                          const QueryOptions& options, QueryReport* report) {
  State& s = *state_;
  if (is_cancelled(options.cancel)) return cancelled("query");
  GPUOPT_RETURN_IF_ERROR(s.refresh());
  if (options.k == 0) return invalid_argument("query: k must be at least 1");
  if (query_count > 0 && queries == nullptr) return invalid_argument("query: queries is null");
  QueryReport unused;
  QueryReport& how = report != nullptr ? *report : unused;
  how = QueryReport{};
  // Deletes and filters become one bitset over positions, shared by both engines, rebuilt only
  // when the rows, the deletes or the filter changed since the last query.
  const bool everything_live = s.dead_count == 0 && options.where_json.empty();
  const bool mask_current = s.mask_rows == s.total_rows && s.mask_dead == s.dead_count &&
                            s.mask_where == options.where_json;
  std::vector<RowSpan> spans;
  if (everything_live || mask_current) {
    GPUOPT_ASSIGN_OR_RETURN(spans, current_rows("", nullptr));
  } else {
    s.mask_rows = ~std::uint64_t{0};  // invalid until rebuilt
    GPUOPT_ASSIGN_OR_RETURN(spans, current_rows(options.where_json, &s.mask_cache));
    s.mask_rows = s.total_rows;
    s.mask_dead = s.dead_count;
    s.mask_where = options.where_json;
    ++s.mask_version;
  }
  const std::vector<std::uint64_t>* allow = everything_live ? nullptr : &s.mask_cache;
  if (options.index == IndexKind::kIvf) return query_ivf(queries, query_count, options, allow, how);
  if (options.engine != QueryEngine::kCpu) {
    std::string reason = gpu_unsupported_reason(options);
    if (reason.empty()) {
      auto found = query_gpu(queries, query_count, options, spans, allow, how);
      if (found.ok()) {
        how.engine = QueryEngine::kGpu;
        return found;
      }
      if (options.engine == QueryEngine::kGpu) return found.status();
      reason = found.status().to_string();
    } else if (options.engine == QueryEngine::kGpu) {
      return options.index == IndexKind::kExact ? invalid_argument(reason) : unimplemented(reason);
    }
    how = QueryReport{};
    how.fallback_reason = std::move(reason);
  }
  how.engine = QueryEngine::kCpu;
  return query_cpu(queries, query_count, options, spans, allow);
}

StatusOr<SearchResults> Collection::query_cpu(const float* queries, std::size_t query_count,
                                              const QueryOptions& options,
                                              const std::vector<RowSpan>& spans,
                                              const std::vector<std::uint64_t>* allow) {
  State& s = *state_;
  std::vector<detail::RowBlock> blocks;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    blocks.push_back(
        {spans[i].vectors, spans[i].norms, spans[i].rows, s.segment_first_position[i], nullptr});
  }
  std::vector<detail::TopK> found =
      detail::exact_scan(blocks, s.config.dim, s.config.metric, queries, query_count, options.k,
                         allow, options.threads, options.cancel);
  if (is_cancelled(options.cancel)) return cancelled("query");
  SearchResults results(query_count);
  for (std::size_t q = 0; q < query_count; ++q) {
    for (const auto& item : found[q].items()) {
      std::size_t index =
          static_cast<std::size_t>(std::upper_bound(s.segment_first_position.begin(),
                                                    s.segment_first_position.end(), item.position) -
                                   s.segment_first_position.begin() - 1);
      std::uint64_t row = item.position - s.segment_first_position[index];
      results[q].push_back({s.segments[index]->ids()[row], item.distance});
    }
  }
  return results;
}

StatusOr<SearchResults> Collection::query_gpu(const float* queries, std::size_t query_count,
                                              const QueryOptions& options,
                                              const std::vector<RowSpan>& spans,
                                              const std::vector<std::uint64_t>* allow,
                                              QueryReport& report) {
  State& s = *state_;
  const auto start = std::chrono::steady_clock::now();
  const std::size_t budget = options.gpu.memory_budget_bytes;
  const std::size_t needed = s.total_rows * GpuDataset::device_bytes_per_row(s.config.dim);
  if (budget > 0 && needed > budget) {
    return resource_exhausted(fmt::format(
        "GPU engine: the collection's {} rows x {} dimensions need {} bytes of device memory, "
        "above the budget of {} bytes (GpuQueryOptions::memory_budget_bytes)",
        s.total_rows, s.config.dim, needed, budget));
  }
  bool copied = false;
  if (s.gpu == nullptr || s.gpu_device != options.gpu.device) {
    s.gpu.reset();
    s.gpu_segments = 0;
    GPUOPT_ASSIGN_OR_RETURN(
        s.gpu, GpuDataset::create(s.config.dim, s.config.metric, s.total_rows, options.gpu.device));
    s.gpu_device = options.gpu.device;
    copied = true;
  }
  s.gpu->set_memory_budget(budget);
  if (s.gpu_segments < spans.size()) {
    copied = true;
    for (; s.gpu_segments < spans.size(); ++s.gpu_segments) {
      const RowSpan& span = spans[s.gpu_segments];
      Status appended = s.gpu->append_host(span.vectors, span.rows, nullptr, {span.ids, span.rows});
      if (!appended.ok()) {
        // A partial copy would shift every later position: start over next time.
        s.gpu.reset();
        s.gpu_segments = 0;
        return appended.with_context("GPU engine: copying the collection's rows");
      }
      report.gpu_rows_uploaded += span.rows;
    }
  }
  if (copied) {
    report.gpu_upload_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  GpuSearchOptions search;
  search.k = options.k;
  search.precision = options.gpu.precision;
  search.tile_rows = options.gpu.tile_rows;
  search.allow_mask = allow != nullptr ? allow->data() : nullptr;
  search.allow_mask_version = allow == &s.mask_cache ? s.mask_version : 0;
  search.small_batch_max_queries = options.gpu.small_batch_max_queries;
  GPUOPT_ASSIGN_OR_RETURN(GpuSearchResult found,
                          s.gpu->search(queries, query_count, search, nullptr));
  report.gpu_fused = found.fused;
  report.gpu_small_batch = found.small_batch;
  report.gpu_fallback_queries = found.fallback_queries;
  SearchResults results(query_count);
  for (std::size_t q = 0; q < query_count; ++q) {
    results[q].reserve(options.k);
    for (std::size_t i = 0; i < options.k; ++i) {
      const std::size_t slot = q * options.k + i;
      if (found.positions[slot] == ~std::uint64_t{0}) break;  // fewer allowed rows than k
      results[q].push_back({found.ids[slot], found.distances[slot]});
    }
  }
  return results;
}

void Collection::release_gpu() {
  state_->gpu.reset();
  state_->gpu_segments = 0;
  state_->gpu_device = -1;
  state_->ivf_gpu.reset();
}

GpuResidency Collection::gpu_residency() const {
  const State& s = *state_;
  GpuResidency residency;
  if (s.gpu != nullptr) {
    residency.exact = true;
    residency.device = s.gpu->device();
    residency.rows = s.gpu->rows();
    residency.device_bytes = s.gpu->device_bytes();
  }
  if (s.ivf_gpu != nullptr) {
    residency.ivf = true;
    residency.ivf_device = s.ivf_gpu->device();
    residency.ivf_rows = s.ivf_gpu->rows();
  }
  return residency;
}

Status Collection::query_device(const DLTensor& queries, const QueryOptions& options,
                                const GpuDeviceResults& results, void* stream,
                                QueryReport* report) {
  State& s = *state_;
  if (options.index != IndexKind::kExact) {
    return unimplemented(
        "query_device: device queries are answered by the exact index only (the IVF lists take "
        "host queries)");
  }
  if (std::string reason = gpu_unsupported_reason(options); !reason.empty()) {
    return invalid_argument(reason);
  }
  // A GPU query of no rows runs every step query() takes before searching: it brings the
  // resident copy up to the committed segments and the allow mask up to the deletes and `where`.
  QueryOptions prepare = options;
  prepare.engine = QueryEngine::kGpu;
  QueryReport how;
  GPUOPT_RETURN_IF_ERROR(query(nullptr, 0, prepare, &how).status());
  if (s.gpu == nullptr) return internal_error("query_device: no GPU copy after preparing one");
  const bool everything_live = s.dead_count == 0 && options.where_json.empty();
  GpuSearchOptions search;
  search.k = options.k;
  search.precision = options.gpu.precision;
  search.tile_rows = options.gpu.tile_rows;
  search.allow_mask = everything_live ? nullptr : s.mask_cache.data();
  search.allow_mask_version = everything_live ? 0 : s.mask_version;
  search.small_batch_max_queries = options.gpu.small_batch_max_queries;
  GPUOPT_RETURN_IF_ERROR(s.gpu->search_dlpack(queries, search, results, stream));
  how.engine = QueryEngine::kGpu;
  if (report != nullptr) *report = how;
  return ok_status();
}

Status Collection::verify(const CancelToken* cancel) {
  State& s = *state_;
  GPUOPT_RETURN_IF_ERROR(s.refresh());
  for (auto& segment : s.segments) {
    if (is_cancelled(cancel)) return cancelled("verify");
    GPUOPT_RETURN_IF_ERROR(segment->verify());
  }
  // Every id must name a live row of a mapped segment, and the ids must be exactly the live rows:
  // a forged tombstone (or a lost one) shows up as a count that disagrees. One read transaction.
  GPUOPT_RETURN_IF_ERROR(exec(s.db, "BEGIN"));
  auto verified = [&]() -> Status {
    GPUOPT_RETURN_IF_ERROR(s.refresh(/*in_transaction=*/true));
    Statement items(s.db, "SELECT id, segment, row FROM items WHERE collection = ?");
    if (!items.ok()) return sqlite_error(s.db, "prepare");
    items.bind(1, s.name);
    const std::string where = fmt::format(
        "{}: collection \"{}\"", (s.catalogue->directory / kCatalogueFile).string(), s.name);
    std::uint64_t count = 0;
    int rc;
    while ((rc = items.step()) == SQLITE_ROW) {
      if (count % kCancelPollRows == 0 && is_cancelled(cancel)) return cancelled("verify");
      const std::int64_t sequence = items.integer(1), row = items.integer(2);
      auto index = sequence >= 0 ? s.segment_index(static_cast<std::uint64_t>(sequence))
                                 : std::optional<std::size_t>{};
      if (!index || row < 0 || static_cast<std::uint64_t>(row) >= s.segments[*index]->info().rows) {
        return data_loss(fmt::format("{}: id {} names row {} of segment {}, which does not exist",
                                     where, items.integer(0), row, sequence));
      }
      const auto& segment = *s.segments[*index];
      if (segment.ids()[row] != from_sql(items.integer(0))) {
        return data_loss(fmt::format("{}: id {} names row {} of {}, which holds id {}", where,
                                     items.integer(0), row, segment.info().file,
                                     segment.ids()[row]));
      }
      if (s.is_dead(s.segment_first_position[*index] + static_cast<std::uint64_t>(row))) {
        return data_loss(fmt::format("{}: id {} names row {} of {}, which a tombstone deletes",
                                     where, items.integer(0), row, segment.info().file));
      }
      ++count;
    }
    if (rc != SQLITE_DONE) return sqlite_error(s.db, "read ids");
    if (count != s.total_rows - s.dead_count) {
      return data_loss(fmt::format(
          "{}: {} ids are listed but the segments hold {} live rows ({} rows, {} tombstones)",
          where, count, s.total_rows - s.dead_count, s.total_rows, s.dead_count));
    }
    return ok_status();
  }();
  Status ended = exec(s.db, "COMMIT");
  return verified.ok() ? ended : verified;
}

CollectionStats Collection::stats() const {
  Status refreshed = state_->refresh();  // a failure keeps the last view
  (void)refreshed;
  const State& s = *state_;
  CollectionStats stats;
  stats.name = s.name;
  stats.dim = s.config.dim;
  stats.metric = s.config.metric;
  stats.live = size();
  stats.deleted = s.dead_count;
  for (const auto& segment : s.segments) {
    const auto& info = segment->info();
    stats.segments.push_back(
        {info.sequence, info.file, info.rows, info.bytes, segment->verified()});
    stats.segment_bytes += info.bytes;
  }
  // stats() is const for its callers; loading the index only fills caches.
  auto ivf = const_cast<Collection*>(this)->ivf_stats();
  if (ivf.ok()) {
    stats.ivf = std::move(*ivf);
  } else {
    stats.ivf.present = true;
    stats.ivf.error = ivf.status().to_string();
    stats.ivf.trainings = s.ivf_trainings;
    stats.ivf.rebuilds_by_id = s.ivf_rebuilds;
  }
  return stats;
}

struct Store::State {
  fs::path directory;
  OpenOptions options;
  Catalogue catalogue;
  std::vector<std::unique_ptr<Collection>> collections;
  std::int64_t seen_version = -1;  // data_version when the collection list was last read
  ~State() {
    collections.clear();
    catalogue.finalize();
    if (catalogue.db != nullptr) sqlite3_close(catalogue.db);
  }

  // Validates one `collections` row and maps its segments. Runs inside a read transaction.
  Status load_collection(const std::string& name, std::int64_t dim, const std::string& metric_text,
                         std::int64_t version) {
    const std::string context = (directory / kCatalogueFile).string();
    if (!valid_collection_name(name)) {
      return data_loss(fmt::format(
          "{}: collection name \"{}\" is not 1-64 letters, digits, '_' or '-'", context, name));
    }
    if (dim <= 0 || static_cast<std::uint64_t>(dim) > kMaxDim) {
      return data_loss(fmt::format("{}: collection \"{}\" has dimension {} (1..{})", context, name,
                                   dim, kMaxDim));
    }
    auto metric = parse_metric(metric_text);
    if (!metric.ok()) {
      return data_loss(
          fmt::format("{}: collection \"{}\": {}", context, name, metric.status().message()));
    }
    auto state = std::make_unique<Collection::State>();
    state->db = catalogue.db;
    state->catalogue = &catalogue;
    state->segment_directory = directory / kSegmentDirectory;
    state->verify_on_first_use = options.verify_on_first_use;
    state->compact_above_segments = options.compact_above_segments;
    state->name = name;
    state->config = {static_cast<std::size_t>(dim), *metric};
    GPUOPT_RETURN_IF_ERROR(state->sync());
    state->seen_version = version;
    collections.push_back(std::unique_ptr<Collection>(new Collection(std::move(state))));
    return ok_status();
  }

  // Loads collections another process created since the list was last read (one pragma when
  // nothing changed). Existing collections refresh themselves when read.
  Status refresh() {
    GPUOPT_ASSIGN_OR_RETURN(std::int64_t version, catalogue.data_version());
    if (version == seen_version) return ok_status();
    sqlite3* db = catalogue.db;
    GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN"));
    Status loaded = [&]() -> Status {
      Statement list(db, "SELECT name, dim, metric FROM collections ORDER BY name");
      if (!list.ok()) return sqlite_error(db, (directory / kCatalogueFile).string());
      int rc;
      while ((rc = list.step()) == SQLITE_ROW) {
        const std::string name = list.text(0);
        bool known = false;
        for (const auto& c : collections) known = known || c->name() == name;
        if (!known) {
          GPUOPT_RETURN_IF_ERROR(load_collection(name, list.integer(1), list.text(2), version));
        }
      }
      if (rc != SQLITE_DONE) return sqlite_error(db, (directory / kCatalogueFile).string());
      return ok_status();
    }();
    Status ended = exec(db, loaded.ok() ? "COMMIT" : "ROLLBACK");
    if (!loaded.ok()) return loaded;
    GPUOPT_RETURN_IF_ERROR(ended);
    seen_version = version;
    return ok_status();
  }
};

namespace {

// A file: URI for sqlite3_open_v2 with `immutable=1`: for a store on read-only media, where SQLite
// can neither create the WAL index nor take locks, and nothing can change the files anyway.
std::string immutable_uri(const fs::path& path) {
  std::string uri = "file:";
  for (unsigned char c : fs::absolute(path).string()) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      uri += fmt::format("%{:02X}", c);
    }
  }
  return uri + "?immutable=1";
}

// Why this process cannot write the store (empty when it can): the reason a read-only open gives.
std::string write_denied_reason(const fs::path& directory, const fs::path& catalogue) {
  for (const fs::path& path : {directory, directory / kSegmentDirectory, catalogue}) {
    std::error_code ignored;
    if (!fs::exists(path, ignored)) continue;
    if (::access(path.c_str(), W_OK) != 0) {
      return fmt::format("{} is not writable: {}", path.string(), std::strerror(errno));
    }
  }
  return {};
}

constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS collections(name TEXT PRIMARY KEY, dim INTEGER NOT NULL, metric "
    "TEXT NOT NULL, next_segment INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS segments(collection TEXT, sequence INTEGER, file TEXT NOT NULL, "
    "rows INTEGER NOT NULL, bytes INTEGER NOT NULL, crc INTEGER NOT NULL, PRIMARY "
    "KEY(collection, sequence));"
    "CREATE TABLE IF NOT EXISTS items(collection TEXT, id INTEGER, segment INTEGER NOT NULL, row "
    "INTEGER NOT NULL, meta TEXT, PRIMARY KEY(collection, id)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS dead(collection TEXT, segment INTEGER, row INTEGER, PRIMARY "
    "KEY(collection, segment, row)) WITHOUT ROWID;";

}  // namespace

Store::Store(std::unique_ptr<State> state) : state_(std::move(state)) {}
Store::~Store() = default;

StatusOr<std::unique_ptr<Store>> Store::open(const fs::path& directory,
                                             const OpenOptions& options) {
  std::error_code error;
  fs::path catalogue = directory / kCatalogueFile;
  const bool existed = fs::exists(catalogue, error);
  if (!existed) {
    if (!options.create) {
      return not_found(fmt::format("{}: no vector store here ({} is missing)", directory.string(),
                                   kCatalogueFile));
    }
    if (options.read_only) {
      return invalid_argument(
          fmt::format("{}: cannot create a store with a read-only open", directory.string()));
    }
    fs::create_directories(directory / kSegmentDirectory, error);
    if (error) {
      return unavailable(
          fmt::format("{}: cannot create the store: {}", directory.string(), error.message()));
    }
  }
  // SQLite would block reading a FIFO in place of the catalogue or its journals.
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    Status special = refuse_special_file(fs::path(catalogue.string() + suffix));
    if (!special.ok()) return data_loss(fmt::format("catalogue {}", special.message()));
  }
  auto state = std::make_unique<State>();
  state->directory = directory;
  state->options = options;
  Catalogue& cat = state->catalogue;
  cat.directory = directory;
  cat.writer_wait_ms = options.writer_wait_ms;
  cat.read_only = options.read_only;
  cat.read_only_reason = options.read_only ? "OpenOptions::read_only" : "";
  if (!cat.read_only && existed) {
    std::string denied = write_denied_reason(directory, catalogue);
    if (!denied.empty()) {
      cat.read_only = true;
      cat.read_only_reason = std::move(denied);
    }
  }
  auto context = catalogue.string();
  if (cat.read_only) {
    int rc = sqlite3_open_v2(catalogue.c_str(), &cat.db,
                             SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, nullptr);
    // Without write access to the directory SQLite cannot make the WAL index it reads through:
    // such a store can only be read as immutable (it cannot change under a process that may not
    // write it... unless its owner writes; the owner's writes are then seen on the next open).
    if (rc == SQLITE_OK) {
      rc = sqlite3_exec(cat.db, "SELECT COUNT(*) FROM sqlite_master", nullptr, nullptr, nullptr);
    }
    if (rc != SQLITE_OK) {
      sqlite3_close(cat.db);
      cat.db = nullptr;
      const std::string uri = immutable_uri(catalogue);
      if (sqlite3_open_v2(uri.c_str(), &cat.db,
                          SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_URI,
                          nullptr) != SQLITE_OK) {
        return sqlite_error(cat.db, fmt::format("{}: cannot open read-only", context));
      }
    }
  } else {
    int flags =
        SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX | (options.create ? SQLITE_OPEN_CREATE : 0);
    if (sqlite3_open_v2(catalogue.c_str(), &cat.db, flags, nullptr) != SQLITE_OK) {
      return sqlite_error(cat.db, fmt::format("{}: cannot open", context));
    }
  }
  sqlite3* db = cat.db;
  sqlite3_busy_timeout(db, 5000);
  if (!cat.read_only) {
    GPUOPT_RETURN_IF_ERROR(exec(db, "PRAGMA journal_mode=WAL").with_context(context));
    GPUOPT_RETURN_IF_ERROR(exec(db, "PRAGMA synchronous=FULL").with_context(context));
  }
  // A catalogue without tables (emptied, or a 0-byte file) beside segment files has lost the
  // store's index: opening it as a new, empty store would hide those rows and let imports
  // overwrite them.
  {
    Statement tables(db,
                     "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                     "('collections', 'segments', 'items', 'dead')");
    if (!tables.ok() || tables.step() != SQLITE_ROW) return sqlite_error(db, context);
    const std::int64_t found = tables.integer(0);
    if (found != 4) {
      std::size_t files = 0;
      for (const auto& entry : fs::directory_iterator(directory / kSegmentDirectory, error)) {
        (void)entry;
        ++files;
      }
      if (found != 0 || files > 0 || (existed && cat.read_only)) {
        return data_loss(fmt::format(
            "{}: the catalogue has {} of the store's 4 tables and segments/ holds {} files; "
            "the catalogue is damaged (restore it from a copy)",
            context, found, files));
      }
      if (!cat.read_only) GPUOPT_RETURN_IF_ERROR(exec(db, kSchema).with_context(context));
    }
  }
  GPUOPT_RETURN_IF_ERROR(state->refresh().with_context(directory.string()));
  return std::unique_ptr<Store>(new Store(std::move(state)));
}

StatusOr<Collection*> Store::create_collection(const std::string& name,
                                               const CollectionConfig& config) {
  if (!valid_collection_name(name)) {
    return invalid_argument(
        fmt::format("collection name \"{}\": use 1-64 letters, digits, '_' or '-'", name));
  }
  if (config.dim == 0 || config.dim > kMaxDim) {
    return invalid_argument(
        fmt::format("collection dimension {}: must be 1..{}", config.dim, kMaxDim));
  }
  GPUOPT_RETURN_IF_ERROR(state_->catalogue.lock_for_writing());
  if (collection(name).ok()) {
    return Status(StatusCode::kAlreadyExists,
                  fmt::format("collection \"{}\" already exists", name));
  }
  sqlite3* db = state_->catalogue.db;
  GPUOPT_ASSIGN_OR_RETURN(std::int64_t version, state_->catalogue.data_version());
  Statement insert(db, "INSERT INTO collections(name, dim, metric, next_segment) VALUES(?,?,?,0)");
  if (!insert.ok()) return sqlite_error(db, "prepare");
  insert.bind(1, name)
      .bind(2, static_cast<std::int64_t>(config.dim))
      .bind(3, std::string(metric_name(config.metric)));
  if (insert.step() != SQLITE_DONE) return sqlite_error(db, "create collection");
  GPUOPT_RETURN_IF_ERROR(state_->load_collection(name, static_cast<std::int64_t>(config.dim),
                                                 std::string(metric_name(config.metric)), version));
  return state_->collections.back().get();
}

StatusOr<Collection*> Store::collection(const std::string& name) {
  GPUOPT_RETURN_IF_ERROR(state_->refresh());
  for (auto& c : state_->collections) {
    if (c->name() == name) return c.get();
  }
  return not_found(fmt::format("{}: no collection \"{}\"", state_->directory.string(), name));
}

std::vector<std::string> Store::collection_names() const {
  Status refreshed = state_->refresh();  // a failure keeps the last list
  (void)refreshed;
  std::vector<std::string> names;
  for (const auto& c : state_->collections) names.push_back(c->name());
  return names;
}

const fs::path& Store::directory() const { return state_->directory; }

Status Store::lock_for_writing() { return state_->catalogue.lock_for_writing(); }

bool Store::read_only() const { return state_->catalogue.read_only; }

}  // namespace gpuopt::vector
