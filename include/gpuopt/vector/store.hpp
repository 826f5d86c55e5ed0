// The embedded vector store: collections of fixed-dimension fp32 vectors keyed by 64-bit ids, with
// metadata, persisted as mmap'd checksummed segment files plus a SQLite catalogue (WAL mode).
//
// Durability: a write returns OK only after its segment file and directory are fsync'd and the
// SQLite transaction naming it has committed with synchronous=FULL, so it survives kill -9 (and
// power loss as far as SQLite and the filesystem promise). Segment headers and sizes are checked
// at open; data checksums (CRC32C) are checked on first use or by verify(). A mismatch is reported
// as DATA_LOSS naming the file, never read as data.
//
// Concurrency: one writer and any number of readers, in this process or others. The first write
// through a Store takes the store's writer lock (flock on `writer.lock`, held until the Store is
// destroyed); a write while another process holds it waits up to OpenOptions::writer_wait_ms and
// then fails with UNAVAILABLE naming that process. Readers take no lock: before each read
// (query, get, size, stats, rows, verify) a collection asks SQLite whether another connection
// committed (PRAGMA data_version) and, if so, maps the new segments and reloads the tombstones
// from one read transaction. A segment becomes visible only once the transaction naming it has
// committed, after its file was fsync'd, so a reader never sees a torn segment or a row the writer
// has not acknowledged. A Store and its collections are not thread-safe: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector {

struct CollectionConfig {
  std::size_t dim = 0;
  Metric metric = Metric::kL2;
};

struct Record {
  std::uint64_t id = 0;
  std::vector<float> vector;
  Metadata metadata;
};

struct SegmentStats {
  std::uint64_t sequence = 0;
  std::string file;
  std::size_t rows = 0;
  std::uint64_t bytes = 0;
  bool verified = false;
};

// The state of a collection's saved IVF index (CollectionStats::ivf, Collection::ivf_stats).
struct IvfIndexStats {
  bool present = false;  // an index is saved in the store
  std::string file;      // its file, inside the store's segments/ directory
  std::string error;     // the saved index failed validation (DATA_LOSS text); empty when fine
  std::uint64_t generation = 0;
  std::size_t nlist = 0;
  std::string train_engine;  // "cpu" or "gpu"
  double train_seconds = 0;
  std::uint64_t trained_rows = 0;         // rows when k-means ran
  std::uint64_t rows_since_training = 0;  // rows assigned to the lists since
  double growth = 0;                      // rows_since_training / trained_rows
  double trained_mean_distance = 0;       // mean squared L2 distance to the centroid at training
  double added_mean_distance = 0;         // the same over the rows added since (0 when none)
  double distance_ratio = 0;              // added / trained mean distance (0 when none added)
  bool retrain_recommended = false;       // past IvfParams' drift thresholds
  std::size_t trainings = 0;              // k-means runs by this Collection object
  // Loads by this Collection object that found the saved lists' positions moved by a compaction
  // (one that did not save the index again) and rebuilt them by id in memory.
  std::size_t rebuilds_by_id = 0;
  // Why lists rebuilt by id, or rows assigned since the last save, could not be saved by this
  // Collection object (they stay in memory and answer queries); empty when nothing failed. A
  // read-only store does not try.
  std::string save_error;
};

struct CollectionStats {
  std::string name;
  std::size_t dim = 0;
  Metric metric = Metric::kL2;
  std::size_t live = 0;     // rows that queries can return
  std::size_t deleted = 0;  // rows superseded by upsert or delete, still in segments
  std::vector<SegmentStats> segments;
  std::uint64_t segment_bytes = 0;
  IvfIndexStats ivf;  // with the default IvfParams thresholds
};

// A view of the collection's rows for engines that scan them directly (the GPU search).
struct RowSpan {
  const float* vectors = nullptr;      // [rows, dim], mmap'd
  const float* norms = nullptr;        // [rows] squared L2 norms
  const std::uint64_t* ids = nullptr;  // [rows]
  std::size_t rows = 0;
};

// Collection::compact: which segments are rewritten.
struct CompactOptions {
  // Runs of consecutive segments smaller than this are merged into segments of up to this many
  // live rows, and segments with deleted rows are rewritten without them. 0: 64 MiB of vectors
  // (at least 4096 rows).
  std::size_t target_rows = 0;
  // Polled between segments read and written: once set, compact returns CANCELLED before its
  // transaction commits, removes the files it wrote, and the old layout stays. Null = not
  // cancellable. The caller keeps it alive.
  const CancelToken* cancel = nullptr;
  // After the commit, rebuild the saved IVF index's lists for the new layout and save them (see
  // CompactReport::ivf_resaved). false leaves that to the next load, which rebuilds them in
  // memory and saves them from a query of a writable store: for a `reindex` that follows anyway.
  bool resave_ivf = true;
};

struct CompactReport {
  std::size_t segments_before = 0;
  std::size_t segments_after = 0;
  std::size_t rows_dropped = 0;  // deleted rows no longer kept
  // The collection's saved IVF index names rows by position, which the compaction renumbered:
  // its lists were rebuilt by id for the new layout and saved again (ivf_resaved), or why not
  // (ivf_error; the compaction stands and the next load rebuilds the lists in memory instead).
  // Both stay unset when no rows moved, no index is saved or CompactOptions::resave_ivf is off.
  bool ivf_resaved = false;
  std::string ivf_error;
  // Wall time of that step after the commit (reading the saved file, placing the rows by id,
  // writing and publishing the new file); 0 when resave_ivf is off or it was cancelled.
  double ivf_resave_seconds = 0;
};

// The GPU engine's resident copies of a collection (Collection::gpu_residency).
struct GpuResidency {
  bool exact = false;            // the exact search's copy of the rows is on a device
  int device = -1;               // its device (-1 when none)
  std::size_t rows = 0;          // rows it holds
  std::size_t device_bytes = 0;  // device memory its buffers take (capacity, not only rows)
  bool ivf = false;              // the IVF lists' copy is on a device
  int ivf_device = -1;
  std::size_t ivf_rows = 0;
};

class Store;
struct DLTensor;          // gpu_search.hpp
struct GpuDeviceResults;  // gpu_search.hpp

class Collection {
 public:
  ~Collection();
  Collection(const Collection&) = delete;
  Collection& operator=(const Collection&) = delete;

  const std::string& name() const;
  std::size_t dim() const;
  Metric metric() const;
  std::size_t size() const;  // live rows

  // vectors: [ids.size(), dim] row-major. metadata: empty, or one entry per id.
  // add() fails with ALREADY_EXISTS when an id is present; upsert() replaces it.
  // `cancel` (may be null) is polled between chunks of rows until the commit starts: once set, the
  // call returns CANCELLED and nothing of the batch is committed (its transaction is rolled back
  // and its segment file removed). A batch is all or nothing, cancelled or not.
  Status add(std::span<const std::uint64_t> ids, const float* vectors,
             std::span<const Metadata> metadata = {}, const CancelToken* cancel = nullptr);
  Status upsert(std::span<const std::uint64_t> ids, const float* vectors,
                std::span<const Metadata> metadata = {}, const CancelToken* cancel = nullptr);
  // Zero-copy ingest from GPU memory: `device_vectors` [ids.size(), dim] fp32 on the current
  // device, read in order on `stream` (a cudaStream_t; null = cudaStreamPerThread, so the caller
  // must have synchronized its producer). One DMA into a pinned staging buffer reused across
  // calls, then the same commit as add(): no serialisation, no pageable bounce.
  // UNIMPLEMENTED in a build without CUDA.
  Status add_device(std::span<const std::uint64_t> ids, const float* device_vectors, void* stream,
                    std::span<const Metadata> metadata = {}, bool replace = false);
  // A DLPack tensor [ids.size(), dim] float32, compact row-major: CPU / CUDA-pinned memory is
  // committed straight from its pointer; CUDA / managed memory goes through add_device (the
  // tensor's device must be the current one). Device tensors are UNIMPLEMENTED without CUDA.
  Status add_dlpack(std::span<const std::uint64_t> ids, const DLTensor& tensor, void* stream,
                    std::span<const Metadata> metadata = {}, bool replace = false);
  // Deletes the ids that exist; returns how many did. `cancel` (may be null) is polled every 4096
  // ids and before the commit: once set, CANCELLED and nothing is deleted.
  StatusOr<std::size_t> remove(std::span<const std::uint64_t> ids,
                               const CancelToken* cancel = nullptr);
  // NOT_FOUND when the id is absent.
  StatusOr<Record> get(std::uint64_t id) const;
  // One past the largest id below 2^63 in the collection (0 when empty): where imports continue.
  StatusOr<std::uint64_t> next_free_id() const;

  // queries: host [query_count, dim]. Exact or IVF-Flat. The IVF index is saved in the store: the
  // first IVF query loads it (or, when none is saved, trains one with options.ivf and saves it);
  // rows written since it was saved are assigned to their nearest list first. A saved index that
  // fails validation makes IVF queries fail with DATA_LOSS naming its file (build_ivf replaces it).
  // options.engine picks the engine: the CPU, the GPU exact search, or the GPU where it can answer
  // and the CPU otherwise; `report` (may be null) says which answered and why. Either way the hits
  // carry the rows' ids, and deleted or filtered-out rows never come back.
  // The GPU engine keeps a copy of the rows on options.gpu.device from its first query on: later
  // queries copy only the rows written since; deletes and filters travel as a per-query bitset.
  StatusOr<SearchResults> query(const float* queries, std::size_t query_count,
                                const QueryOptions& options, QueryReport* report = nullptr);
  // The exact GPU search with the queries and the results in device memory: `queries` is a
  // DLPack tensor [n, dim] float32, compact row-major, on CUDA device options.gpu.device; `results`
  // are arrays on that device (GpuDeviceResults: distances, ids, positions, [n, k]; FLT_MAX / ~0
  // where fewer than k rows are allowed). Same resident copy, deletes and `where` filter as
  // query() with kGpu; the work is queued on `stream` (a cudaStream_t; null = the copy's own
  // stream). It waits only where query() with kGpu copies rows (the first call, new segments) and,
  // unless results.unresolved is given, for the near-tie flags (GpuDataset::search_device).
  // options.engine is not consulted (this is the GPU engine); options.index must be kExact
  // (UNIMPLEMENTED for kIvf: its lists take host queries). `report` (may be null): engine kGpu and
  // the rows this call copied.
  Status query_device(const DLTensor& queries, const QueryOptions& options,
                      const GpuDeviceResults& results, void* stream, QueryReport* report = nullptr);
  // Frees the GPU engine's copies of the rows and of the IVF lists (the next GPU query makes
  // them again).
  void release_gpu();
  // Merges small segments and drops deleted rows, as crash-safe as a write: the new segments are
  // written and fsync'd, one transaction swaps them into the catalogue (ids follow their rows),
  // and only then are the old files removed; a crash leaves either the old or the new layout,
  // and at most unreferenced files. Readers in other processes move to the new layout at their
  // next read. Live rows, ids and metadata are unchanged; row order (and with it any position)
  // is not. A saved IVF index is then rebuilt by id for the new layout, without retraining, and
  // saved again, best effort (CompactReport::ivf_resaved). Takes the writer lock.
  StatusOr<CompactReport> compact(const CompactOptions& options = {});
  // Which GPU copies are resident now, where, and their size.
  GpuResidency gpu_residency() const;
  // (Re)trains the IVF index now (k-means on params.engine), assigns every row and saves it in
  // the store (atomically replacing the previous one); returns the training time in seconds.
  // Cancelled (params.cancel): CANCELLED, and the previous index, loaded and saved, is kept.
  StatusOr<double> build_ivf(const IvfParams& params, int threads = 0);
  // The saved IVF index's state and drift, judged by `thresholds` (loads it; catches up writes).
  // present = false when none is saved; DATA_LOSS naming the file when it fails validation.
  StatusOr<IvfIndexStats> ivf_stats(const IvfParams& thresholds = {});

  // Checks every segment's CRC32C now, and that the catalogue's ids and tombstones agree with the
  // segments (every id names an existing, live row; the live count matches). `cancel` (may be
  // null) is polled between segments and every 4096 ids: CANCELLED once it is set.
  Status verify(const CancelToken* cancel = nullptr);
  CollectionStats stats() const;
  // Rows segment by segment, with the deleted ones still in; `live_mask` gets bit i set when row i
  // (counted across segments) is live and matches `where_json` (empty = no filter).
  StatusOr<std::vector<RowSpan>> rows(const std::string& where_json,
                                      std::vector<std::uint64_t>* live_mask);

 private:
  friend class Store;
  struct State;
  explicit Collection(std::unique_ptr<State> state);
  static StatusOr<Record> get_in_transaction(State& s, std::uint64_t id);
  // rows() without the refresh, for a caller that has just refreshed.
  StatusOr<std::vector<RowSpan>> current_rows(const std::string& where_json,
                                              std::vector<std::uint64_t>* live_mask);
  Status write_batch(std::span<const std::uint64_t> ids, const float* vectors,
                     std::span<const Metadata> metadata, bool replace,
                     const CancelToken* cancel = nullptr);
  StatusOr<SearchResults> query_cpu(const float* queries, std::size_t query_count,
                                    const QueryOptions& options, const std::vector<RowSpan>& spans,
                                    const std::vector<std::uint64_t>* allow);
  StatusOr<SearchResults> query_ivf(const float* queries, std::size_t query_count,
                                    const QueryOptions& options,
                                    const std::vector<std::uint64_t>* allow, QueryReport& report);
  StatusOr<SearchResults> query_gpu(const float* queries, std::size_t query_count,
                                    const QueryOptions& options, const std::vector<RowSpan>& spans,
                                    const std::vector<std::uint64_t>* allow, QueryReport& report);
  std::unique_ptr<State> state_;
  // Pinned host staging for add_device (cudaFreeHost deleter), grown on demand.
  std::shared_ptr<void> device_staging_;
  std::size_t device_staging_bytes_ = 0;
};

struct OpenOptions {
  bool create = false;  // create the directory and catalogue when missing
  // Check each segment's data checksum the first time a query scans it.
  bool verify_on_first_use = true;
  // Open for reading only: no lock is taken, no store file is written (SQLite may add its -wal and
  // -shm files where it can, as any SQLite reader does), and every write fails with
  // FAILED_PRECONDITION. A store whose directory or catalogue this process
  // cannot write (another user's store, a read-only mount) is opened this way without asking;
  // Store::read_only() says so and writes name the reason.
  bool read_only = false;
  // How long a write waits for the writer lock while another process holds it; 0 fails at once.
  int writer_wait_ms = 0;
  // After a write leaves a collection with more segments than this, it is compacted
  // (Collection::compact with default options); 0 never. Each segment costs a file and a memory
  // map, and the kernel's map count (about 65k) bounds how many a process can open.
  std::size_t compact_above_segments = 1024;
};

class Store {
 public:
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static StatusOr<std::unique_ptr<Store>> open(const std::filesystem::path& directory,
                                               const OpenOptions& options = {});

  StatusOr<Collection*> create_collection(const std::string& name, const CollectionConfig& config);
  // NOT_FOUND when absent.
  StatusOr<Collection*> collection(const std::string& name);
  std::vector<std::string> collection_names() const;
  const std::filesystem::path& directory() const;
  // Takes the writer lock now (a write takes it on first use): for a process that means to be the
  // store's writer, such as `gpuopt vector serve`. UNAVAILABLE naming the holder's pid when another
  // process holds it past writer_wait_ms; FAILED_PRECONDITION when the store is read-only.
  Status lock_for_writing();
  bool read_only() const;

 private:
  struct State;
  explicit Store(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The collection the CLI uses when none is named.
inline constexpr const char* kDefaultCollection = "default";

}  // namespace gpuopt::vector
