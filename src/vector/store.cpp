// The vector store: SQLite catalogue (collections, segments, ids + metadata, tombstones) in WAL
// mode with synchronous=FULL, segment files opened by mmap, and exact / IVF-Flat search over them.
#include "gpuopt/vector/store.hpp"

#include <fmt/format.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
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

}  // namespace

struct Collection::State {
  sqlite3* db = nullptr;  // owned by the Store
  fs::path segment_directory;
  bool verify_on_first_use = true;
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
    detail::IvfTrainEngine engine = detail::IvfTrainEngine::kCpu;
    std::uint32_t iterations = 0;
    double train_seconds = 0;
    double trained_mean_distance = 0;
    double added_distance_sum = 0;
  };
  std::optional<Ivf> ivf;
  std::size_t ivf_trainings = 0;
  Status save_ivf();
  StatusOr<std::size_t> catch_up_ivf(int threads);
  Status load_ivf();
  IvfIndexStats describe_ivf(const IvfParams& thresholds) const;
  // The GPU copy of the IVF lists, valid for `ivf_gpu_generation` with `ivf_gpu_rows` rows.
  std::unique_ptr<detail::GpuIvfLists> ivf_gpu;
  std::uint64_t ivf_gpu_generation = 0;
  std::size_t ivf_gpu_rows = 0;
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
  std::optional<std::size_t> segment_index(std::uint64_t sequence) const {
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (segments[i]->info().sequence == sequence) return i;
    }
    return std::nullopt;
  }
  Status add_segment(const detail::SegmentInfo& info) {
    GPUOPT_ASSIGN_OR_RETURN(auto segment,
                            detail::Segment::open(segment_directory / info.file, info));
    segment_first_position.push_back(total_rows);
    total_rows += info.rows;
    segments.push_back(std::move(segment));
    return ok_status();
  }
  void invalidate() { metadata_by_position.reset(); }
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
};

Collection::Collection(std::unique_ptr<State> state) : state_(std::move(state)) {}
Collection::~Collection() = default;

const std::string& Collection::name() const { return state_->name; }
std::size_t Collection::dim() const { return state_->config.dim; }
Metric Collection::metric() const { return state_->config.metric; }
std::size_t Collection::size() const { return state_->total_rows - state_->dead_count; }

Status Collection::add(std::span<const std::uint64_t> ids, const float* vectors,
                       std::span<const Metadata> metadata) {
  return write_batch(ids, vectors, metadata, /*replace=*/false);
}

Status Collection::upsert(std::span<const std::uint64_t> ids, const float* vectors,
                          std::span<const Metadata> metadata) {
  return write_batch(ids, vectors, metadata, /*replace=*/true);
}

Status Collection::write_batch(std::span<const std::uint64_t> ids, const float* vectors,
                               std::span<const Metadata> metadata, bool replace) {
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
  sqlite3* db = s.db;
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
  // Re-read the sequence inside the transaction: another writer may have committed since open.
  Statement sequence(db, "SELECT next_segment FROM collections WHERE name = ?");
  if (!sequence.ok()) return fail(sqlite_error(db, "prepare"));
  sequence.bind(1, s.name);
  if (sequence.step() != SQLITE_ROW) {
    return fail(not_found(fmt::format("collection \"{}\" vanished from the catalogue", s.name)));
  }
  std::uint64_t seq = static_cast<std::uint64_t>(sequence.integer(0));
  if (seq != s.next_sequence) {
    return fail(failed_precondition(
        fmt::format("collection \"{}\" was changed by another writer; reopen the store", s.name)));
  }
  // Ids already present: an error for add, tombstones for upsert.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> superseded;  // (sequence, row)
  Statement lookup(db, "SELECT segment, row FROM items WHERE collection = ? AND id = ?");
  if (!lookup.ok()) return fail(sqlite_error(db, "prepare"));
  for (auto id : ids) {
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
  std::string file = fmt::format("{}-{:08d}.seg", s.name, seq);
  segment_path = s.segment_directory / file;
  file_written = true;
  auto written = detail::write_segment(segment_path, seq, dim, vectors, ids.data(), rows);
  if (!written.ok()) return fail(written.status());
  const detail::SegmentInfo& info = *written;

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
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail(sqlite_error(db, "commit"));
  }
  // Committed: acknowledged from here on. Mirror it in memory.
  s.next_sequence = seq + 1;
  s.invalidate();
  for (const auto& [old_sequence, old_row] : superseded) {
    if (auto index = s.segment_index(old_sequence)) {
      s.mark_dead(s.segment_first_position[*index] + old_row);
    }
  }
  return s.add_segment(info);
}

StatusOr<std::size_t> Collection::remove(std::span<const std::uint64_t> ids) {
  State& s = *state_;
  sqlite3* db = s.db;
  GPUOPT_RETURN_IF_ERROR(exec(db, "BEGIN IMMEDIATE"));
  auto fail = [&](Status status) {
    Status rollback = exec(db, "ROLLBACK");
    (void)rollback;
    return status;
  };
  Statement lookup(db, "SELECT segment, row FROM items WHERE collection = ? AND id = ?");
  Statement erase(db, "DELETE FROM items WHERE collection = ? AND id = ?");
  Statement insert_dead(db, "INSERT OR IGNORE INTO dead(collection, segment, row) VALUES(?,?,?)");
  if (!lookup.ok() || !erase.ok() || !insert_dead.ok()) return fail(sqlite_error(db, "prepare"));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> removed;
  for (auto id : ids) {
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
  const State& s = *state_;
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
          if (!index) continue;
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

// Publishes s.ivf as a new file: written and fsync'd under a fresh name, named in the catalogue
// in one transaction, then the previous file is removed.
Status Collection::State::save_ivf() {
  State& s = *this;
  auto& ivf = *s.ivf;
  const detail::IvfFlat& index = ivf.index;
  GPUOPT_ASSIGN_OR_RETURN(auto current, ivf_catalogue_entry(s.db, s.name));
  const std::uint64_t base_generation = current ? current->generation : 0;
  detail::IvfFileContents contents;
  contents.dim = index.dim();
  contents.metric = index.metric();
  contents.nlist = index.nlist();
  contents.generation = std::max(base_generation, ivf.generation) + 1;
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
  ivf.file = info.file;
  ivf.generation = info.generation;
  ivf.saved_rows = contents.covered_rows;
  return ok_status();
}

// Appends rows [index.rows(), total_rows) to their nearest lists; re-saves once they are many.
StatusOr<std::size_t> Collection::State::catch_up_ivf(int threads) {
  State& s = *this;
  auto& ivf = *s.ivf;
  std::size_t assigned = 0;
  const std::size_t dim = s.config.dim;
  while (ivf.index.rows() < s.total_rows) {
    const std::uint64_t position = ivf.index.rows();
    auto [segment, row] = s.locate(position);
    const auto& seg = *s.segments[segment];
    const std::size_t count = seg.info().rows - row;
    const float* vectors = seg.vectors() + row * dim;
    std::vector<std::uint32_t> lists(count);
    std::vector<float> distances(count);
    ivf.index.nearest(vectors, count, lists.data(), distances.data(), threads);
    for (std::size_t i = 0; i < count; ++i) {
      ivf.index.append(lists[i], vectors + i * dim, seg.norms()[row + i], position + i);
      ivf.added_distance_sum += distances[i];
    }
    assigned += count;
  }
  if (assigned > 0 && double(ivf.index.rows() - ivf.saved_rows) >=
                          std::max(1.0, kIvfResaveFraction * double(ivf.saved_rows))) {
    GPUOPT_RETURN_IF_ERROR(s.save_ivf());
  }
  return assigned;
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
  const fs::path path = s.segment_directory / entry->file;
  if (entry->file.find('/') != std::string::npos) {
    return data_loss(
        fmt::format("IVF index {}: the catalogue names a file outside segments/", path.string()));
  }
  GPUOPT_ASSIGN_OR_RETURN(detail::IvfFileContents contents,
                          detail::read_ivf_file(path, *entry, s.config.dim, s.config.metric));
  auto loss = [&](const std::string& what) {
    return data_loss(fmt::format(
        "IVF index {}: {} (`gpuopt vector reindex` rebuilds it; exact queries are unaffected)",
        path.string(), what));
  };
  if (contents.covered_rows > s.total_rows || contents.trained_rows > contents.covered_rows) {
    return loss(fmt::format("covers {} rows (trained on {}), the collection has {}",
                            contents.covered_rows, contents.trained_rows, s.total_rows));
  }
  Ivf ivf;
  ivf.index =
      detail::IvfFlat::with_centroids(std::move(contents.centroids), s.config.dim, s.config.metric);
  for (std::size_t l = 0; l < contents.nlist; ++l) {
    ivf.index.reserve(static_cast<std::uint32_t>(l),
                      contents.list_offsets[l + 1] - contents.list_offsets[l]);
    for (std::uint64_t i = contents.list_offsets[l]; i < contents.list_offsets[l + 1]; ++i) {
      const std::uint64_t position = contents.positions[i];
      auto [segment, row] = s.locate(position);
      const auto& seg = *s.segments[segment];
      if (seg.ids()[row] != contents.ids[i]) {
        return loss(
            fmt::format("row {} holds id {}, the index says id {} (it belongs to other data)",
                        position, seg.ids()[row], contents.ids[i]));
      }
      ivf.index.append(static_cast<std::uint32_t>(l), seg.vectors() + row * s.config.dim,
                       seg.norms()[row], position);
    }
  }
  ivf.file = entry->file;
  ivf.generation = contents.generation;
  ivf.trained_rows = contents.trained_rows;
  ivf.saved_rows = contents.covered_rows;
  ivf.engine = contents.engine;
  ivf.iterations = contents.iterations;
  ivf.train_seconds = contents.train_seconds;
  ivf.trained_mean_distance = contents.trained_mean_distance;
  ivf.added_distance_sum = contents.added_distance_sum;
  ivf.index.set_train_seconds(contents.train_seconds);
  s.ivf = std::move(ivf);
  s.ivf_gpu.reset();
  return ok_status();
}

StatusOr<double> Collection::build_ivf(const IvfParams& params, int threads) {
  State& s = *state_;
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
      GPUOPT_ASSIGN_OR_RETURN(centroids,
                              kmeans->train(sample.data(), sample_rows, nlist, params.iterations));
      for (std::size_t i = 0; i < spans.size(); ++i) {
        const std::size_t at = s.segment_first_position[i];
        GPUOPT_RETURN_IF_ERROR(kmeans->assign(centroids.data(), nlist, spans[i].vectors,
                                              spans[i].rows, lists.data() + at,
                                              distances.data() + at));
      }
      return ok_status();
    }();
    if (gpu.ok()) {
      engine = detail::IvfTrainEngine::kGpu;
    } else if (params.engine == QueryEngine::kGpu) {
      return gpu.with_context("IVF: GPU k-means");
    } else {
      centroids.clear();
    }
  }
  if (engine == detail::IvfTrainEngine::kCpu) {
    centroids =
        detail::kmeans_cpu(sample.data(), sample_rows, dim, nlist, params.iterations, threads);
  }
  State::Ivf ivf;
  ivf.index = detail::IvfFlat::with_centroids(std::move(centroids), dim, s.config.metric);
  if (engine == detail::IvfTrainEngine::kCpu) {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const std::size_t at = s.segment_first_position[i];
      ivf.index.nearest(spans[i].vectors, spans[i].rows, lists.data() + at, distances.data() + at,
                        threads);
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
  if (!s.ivf) return stats;
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
  if (!s.ivf) {
    GPUOPT_ASSIGN_OR_RETURN(report.ivf_build_seconds, build_ivf(options.ivf, options.threads));
    report.ivf_built = true;
  } else {
    GPUOPT_ASSIGN_OR_RETURN(report.ivf_rows_assigned, s.catch_up_ivf(options.threads));
    if (options.ivf.auto_retrain && s.describe_ivf(options.ivf).retrain_recommended) {
      IvfParams params = options.ivf;
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
  auto found =
      index.search(queries, query_count, options.k, options.nprobe, allow, options.threads);
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
    GPUOPT_ASSIGN_OR_RETURN(spans, rows("", nullptr));
  } else {
    s.mask_rows = ~std::uint64_t{0};  // invalid until rebuilt
    GPUOPT_ASSIGN_OR_RETURN(spans, rows(options.where_json, &s.mask_cache));
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
                         allow, options.threads);
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

Status Collection::verify() {
  for (auto& segment : state_->segments) GPUOPT_RETURN_IF_ERROR(segment->verify());
  return ok_status();
}

CollectionStats Collection::stats() const {
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
  }
  return stats;
}

struct Store::State {
  fs::path directory;
  OpenOptions options;
  sqlite3* db = nullptr;
  std::vector<std::unique_ptr<Collection>> collections;
  ~State() {
    collections.clear();
    if (db != nullptr) sqlite3_close(db);
  }

  Status load_collection(const std::string& name, std::size_t dim, Metric metric,
                         std::uint64_t next_sequence) {
    auto state = std::make_unique<Collection::State>();
    state->db = db;
    state->segment_directory = directory / kSegmentDirectory;
    state->verify_on_first_use = options.verify_on_first_use;
    state->name = name;
    state->config = {dim, metric};
    state->next_sequence = next_sequence;
    Statement segments(db,
                       "SELECT sequence, file, rows, bytes, crc FROM segments WHERE "
                       "collection = ? ORDER BY sequence");
    if (!segments.ok()) return sqlite_error(db, "prepare");
    segments.bind(1, name);
    int rc;
    while ((rc = segments.step()) == SQLITE_ROW) {
      detail::SegmentInfo info;
      info.sequence = static_cast<std::uint64_t>(segments.integer(0));
      info.file = segments.text(1);
      info.rows = static_cast<std::size_t>(segments.integer(2));
      info.dim = dim;
      info.bytes = static_cast<std::uint64_t>(segments.integer(3));
      info.data_crc = static_cast<std::uint32_t>(segments.integer(4));
      if (info.file.find('/') != std::string::npos) {
        return data_loss(fmt::format("{}: catalogue names segment file \"{}\" outside segments/",
                                     (directory / kCatalogueFile).string(), info.file));
      }
      GPUOPT_RETURN_IF_ERROR(state->add_segment(info));
    }
    if (rc != SQLITE_DONE) return sqlite_error(db, "read segments");
    Statement dead(db, "SELECT segment, row FROM dead WHERE collection = ?");
    if (!dead.ok()) return sqlite_error(db, "prepare");
    dead.bind(1, name);
    while ((rc = dead.step()) == SQLITE_ROW) {
      auto index = state->segment_index(static_cast<std::uint64_t>(dead.integer(0)));
      if (index) state->mark_dead(state->segment_first_position[*index] + dead.integer(1));
    }
    if (rc != SQLITE_DONE) return sqlite_error(db, "read tombstones");
    collections.push_back(std::unique_ptr<Collection>(new Collection(std::move(state))));
    return ok_status();
  }
};

Store::Store(std::unique_ptr<State> state) : state_(std::move(state)) {}
Store::~Store() = default;

StatusOr<std::unique_ptr<Store>> Store::open(const fs::path& directory,
                                             const OpenOptions& options) {
  std::error_code error;
  fs::path catalogue = directory / kCatalogueFile;
  if (!fs::exists(catalogue, error)) {
    if (!options.create) {
      return not_found(fmt::format("{}: no vector store here ({} is missing)", directory.string(),
                                   kCatalogueFile));
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
  int flags =
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX | (options.create ? SQLITE_OPEN_CREATE : 0);
  if (sqlite3_open_v2(catalogue.c_str(), &state->db, flags, nullptr) != SQLITE_OK) {
    return sqlite_error(state->db, fmt::format("{}: cannot open", catalogue.string()));
  }
  sqlite3* db = state->db;
  sqlite3_busy_timeout(db, 5000);
  auto context = catalogue.string();
  GPUOPT_RETURN_IF_ERROR(exec(db, "PRAGMA journal_mode=WAL").with_context(context));
  GPUOPT_RETURN_IF_ERROR(exec(db, "PRAGMA synchronous=FULL").with_context(context));
  GPUOPT_RETURN_IF_ERROR(exec(db,
                              "CREATE TABLE IF NOT EXISTS collections(name TEXT PRIMARY KEY, "
                              "dim INTEGER NOT NULL, metric TEXT NOT NULL, next_segment INTEGER "
                              "NOT NULL);"
                              "CREATE TABLE IF NOT EXISTS segments(collection TEXT, sequence "
                              "INTEGER, file TEXT NOT NULL, rows INTEGER NOT NULL, bytes INTEGER "
                              "NOT NULL, crc INTEGER NOT NULL, PRIMARY KEY(collection, sequence));"
                              "CREATE TABLE IF NOT EXISTS items(collection TEXT, id INTEGER, "
                              "segment INTEGER NOT NULL, row INTEGER NOT NULL, meta TEXT, PRIMARY "
                              "KEY(collection, id)) WITHOUT ROWID;"
                              "CREATE TABLE IF NOT EXISTS dead(collection TEXT, segment INTEGER, "
                              "row INTEGER, PRIMARY KEY(collection, segment, row)) WITHOUT ROWID;")
                             .with_context(context));
  fs::create_directories(directory / kSegmentDirectory, error);
  Statement list(db, "SELECT name, dim, metric, next_segment FROM collections ORDER BY name");
  if (!list.ok()) return sqlite_error(db, context);
  int rc;
  while ((rc = list.step()) == SQLITE_ROW) {
    auto metric = parse_metric(list.text(2));
    if (!metric.ok()) return data_loss(fmt::format("{}: {}", context, metric.status().message()));
    std::int64_t dim = list.integer(1);
    if (dim <= 0) return data_loss(fmt::format("{}: collection dimension {}", context, dim));
    GPUOPT_RETURN_IF_ERROR(state->load_collection(list.text(0), static_cast<std::size_t>(dim),
                                                  *metric,
                                                  static_cast<std::uint64_t>(list.integer(3))));
  }
  if (rc != SQLITE_DONE) return sqlite_error(db, context);
  return std::unique_ptr<Store>(new Store(std::move(state)));
}

StatusOr<Collection*> Store::create_collection(const std::string& name,
                                               const CollectionConfig& config) {
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
          std::string::npos) {
    return invalid_argument(
        fmt::format("collection name \"{}\": use 1-64 letters, digits, '_' or '-'", name));
  }
  if (config.dim == 0 || config.dim > 65536) {
    return invalid_argument(fmt::format("collection dimension {}: must be 1..65536", config.dim));
  }
  if (collection(name).ok()) {
    return Status(StatusCode::kAlreadyExists,
                  fmt::format("collection \"{}\" already exists", name));
  }
  sqlite3* db = state_->db;
  Statement insert(db, "INSERT INTO collections(name, dim, metric, next_segment) VALUES(?,?,?,0)");
  if (!insert.ok()) return sqlite_error(db, "prepare");
  insert.bind(1, name)
      .bind(2, static_cast<std::int64_t>(config.dim))
      .bind(3, std::string(metric_name(config.metric)));
  if (insert.step() != SQLITE_DONE) return sqlite_error(db, "create collection");
  GPUOPT_RETURN_IF_ERROR(state_->load_collection(name, config.dim, config.metric, 0));
  return state_->collections.back().get();
}

StatusOr<Collection*> Store::collection(const std::string& name) {
  for (auto& c : state_->collections) {
    if (c->name() == name) return c.get();
  }
  return not_found(fmt::format("{}: no collection \"{}\"", state_->directory.string(), name));
}

std::vector<std::string> Store::collection_names() const {
  std::vector<std::string> names;
  for (const auto& c : state_->collections) names.push_back(c->name());
  return names;
}

const fs::path& Store::directory() const { return state_->directory; }

}  // namespace gpuopt::vector
