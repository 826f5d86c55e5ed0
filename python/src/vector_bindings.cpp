// gpuopt.vector's native half: Store and Collection over raw arrays. Argument checks that need
// Python (dtype conversion, torch streams, metadata dicts) live in python/gpuopt/vector.py; what
// arrives here is already float32/uint64 and C-contiguous, and only shapes are checked again.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpuopt/vector/filter.hpp"
#include "gpuopt/vector/gpu_search.hpp"
#include "gpuopt/vector/store.hpp"
#include "interrupt.hpp"

namespace nb = nanobind;

namespace gpuopt::python {
namespace {

using HostVectors = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using HostIds = nb::ndarray<const std::uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// One store, shared by its Python Store and Collection objects. The store allows one writer and
// its queries train indexes and check checksums lazily, so calls into it take turns on `mutex`
// (taken with the GIL released, so other Python threads keep running).
struct StoreHandle {
  std::unique_ptr<vector::Store> store;
  std::mutex mutex;
};

class StoreLock {
 public:
  explicit StoreLock(StoreHandle& handle) : lock_(handle.mutex) {
    if (!handle.store) {
      throw StatusError(failed_precondition("the vector store is closed"));
    }
  }

 private:
  std::lock_guard<std::mutex> lock_;
};

std::vector<vector::Metadata> parse_metadata_rows(
    const std::optional<std::vector<std::string>>& rows, std::size_t expected) {
  std::vector<vector::Metadata> parsed;
  if (!rows) return parsed;
  if (rows->size() != expected) {
    throw StatusError(invalid_argument("metadata has " + std::to_string(rows->size()) +
                                       " entries for " + std::to_string(expected) + " vectors"));
  }
  parsed.reserve(rows->size());
  for (std::size_t row = 0; row < rows->size(); ++row) {
    auto metadata = vector::parse_metadata((*rows)[row]);
    if (!metadata.ok()) {
      throw StatusError(metadata.status().with_context("metadata[" + std::to_string(row) + "]"));
    }
    parsed.push_back(std::move(metadata).value());
  }
  return parsed;
}

nb::dict report_dict(const vector::QueryReport& report) {
  nb::dict result;
  result["engine"] = std::string(vector::query_engine_name(report.engine));
  result["fallback_reason"] = report.fallback_reason;
  result["gpu_fused"] = report.gpu_fused;
  result["gpu_small_batch"] = report.gpu_small_batch;
  result["gpu_fallback_queries"] = report.gpu_fallback_queries;
  result["gpu_rows_uploaded"] = report.gpu_rows_uploaded;
  result["gpu_upload_seconds"] = report.gpu_upload_seconds;
  result["ivf_built"] = report.ivf_built;
  result["ivf_retrained"] = report.ivf_retrained;
  result["ivf_build_seconds"] = report.ivf_build_seconds;
  result["ivf_rows_assigned"] = report.ivf_rows_assigned;
  return result;
}

nb::dict ivf_dict(const vector::IvfIndexStats& ivf) {
  nb::dict result;
  result["present"] = ivf.present;
  result["file"] = ivf.file;
  result["error"] = ivf.error;
  result["generation"] = ivf.generation;
  result["nlist"] = ivf.nlist;
  result["train_engine"] = ivf.train_engine;
  result["train_seconds"] = ivf.train_seconds;
  result["trained_rows"] = ivf.trained_rows;
  result["rows_since_training"] = ivf.rows_since_training;
  result["growth"] = ivf.growth;
  result["trained_mean_distance"] = ivf.trained_mean_distance;
  result["added_mean_distance"] = ivf.added_mean_distance;
  result["distance_ratio"] = ivf.distance_ratio;
  result["retrain_recommended"] = ivf.retrain_recommended;
  result["trainings"] = ivf.trainings;
  result["rebuilds_by_id"] = ivf.rebuilds_by_id;
  result["save_error"] = ivf.save_error;
  return result;
}

nb::dict residency_dict(const vector::GpuResidency& residency) {
  nb::dict result;
  result["resident"] = residency.exact;
  result["device"] = residency.device;
  result["rows"] = residency.rows;
  result["device_bytes"] = residency.device_bytes;
  result["ivf_resident"] = residency.ivf;
  result["ivf_device"] = residency.ivf_device;
  result["ivf_rows"] = residency.ivf_rows;
  return result;
}

// The engine settings every query binding takes.
vector::QueryOptions query_options(std::size_t k, const std::string& index, std::size_t nprobe,
                                   std::size_t nlist, const std::string& where, int threads,
                                   const std::string& engine, int device,
                                   std::size_t memory_budget) {
  if (k == 0) throw StatusError(invalid_argument("k must be at least 1"));
  if (device < 0) {
    throw StatusError(invalid_argument("device " + std::to_string(device) + " is negative"));
  }
  vector::QueryOptions options;
  options.k = k;
  options.index = value_or_throw(vector::parse_index_kind(index));
  options.nprobe = nprobe;
  options.ivf.nlist = nlist;
  options.ivf.device = device;
  options.where_json = where;
  options.threads = threads;
  options.engine = value_or_throw(vector::parse_query_engine(engine));
  options.gpu.device = device;
  options.gpu.memory_budget_bytes = memory_budget;
  return options;
}

// A DLPack view of a tensor nanobind imported (shape/strides copied into `shape`/`strides`).
vector::DLTensor dlpack_view(const nb::ndarray<>& tensor, std::vector<std::int64_t>& shape,
                             std::vector<std::int64_t>& strides) {
  shape.assign(tensor.shape_ptr(), tensor.shape_ptr() + tensor.ndim());
  strides.clear();
  if (tensor.stride_ptr() != nullptr) {
    strides.assign(tensor.stride_ptr(), tensor.stride_ptr() + tensor.ndim());
  }
  vector::DLTensor view{};
  view.data = const_cast<void*>(static_cast<const void*>(tensor.data()));  // offset applied
  view.device = {static_cast<std::int32_t>(tensor.device_type()),
                 static_cast<std::int32_t>(tensor.device_id())};
  view.ndim = static_cast<std::int32_t>(tensor.ndim());
  view.dtype = {tensor.dtype().code, tensor.dtype().bits, tensor.dtype().lanes};
  view.shape = shape.data();
  view.strides = strides.empty() ? nullptr : strides.data();
  view.byte_offset = 0;
  return view;
}

class PyCollection {
 public:
  PyCollection(std::shared_ptr<StoreHandle> handle, vector::Collection* collection)
      : handle_(std::move(handle)),
        collection_(collection),
        name_(collection->name()),
        dim_(collection->dim()),
        metric_(collection->metric()) {}

  const std::string& name() const { return name_; }
  std::size_t dim() const { return dim_; }
  std::string metric() const { return std::string(vector::metric_name(metric_)); }

  std::size_t size() {
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    return collection_->size();
  }

  void add(HostIds ids, HostVectors vectors, std::optional<std::vector<std::string>> metadata,
           bool replace) {
    check_rows(ids.shape(0), vectors.shape(0), vectors.shape(1));
    auto rows = parse_metadata_rows(metadata, ids.shape(0));
    std::span<const std::uint64_t> id_span(ids.data(), ids.shape(0));
    // Ctrl-C cancels the write before its commit: the batch is then not written at all.
    run_interruptible([&](const CancelToken* cancel) {
      StoreLock lock(*handle_);
      throw_if_error(replace ? collection_->upsert(id_span, vectors.data(), rows, cancel)
                             : collection_->add(id_span, vectors.data(), rows, cancel));
    });
  }

  // Any DLPack tensor (nanobind imported it through __dlpack__); CUDA memory goes through the
  // store's device-pointer ingest on `stream`.
  void add_dlpack(HostIds ids, nb::ndarray<> tensor, std::uintptr_t stream,
                  std::optional<std::vector<std::string>> metadata, bool replace) {
    auto rows = parse_metadata_rows(metadata, ids.shape(0));
    std::vector<std::int64_t> shape, strides;
    const vector::DLTensor view = dlpack_view(tensor, shape, strides);
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    throw_if_error(collection_->add_dlpack({ids.data(), ids.shape(0)}, view,
                                           reinterpret_cast<void*>(stream), rows, replace));
  }

  // Ctrl-C cancels it before its commit: nothing is deleted then.
  std::size_t remove(HostIds ids) {
    return run_interruptible([&](const CancelToken* cancel) {
      StoreLock lock(*handle_);
      return value_or_throw(collection_->remove({ids.data(), ids.shape(0)}, cancel));
    });
  }

  nb::tuple get(std::uint64_t id) {
    vector::Record record;
    {
      nb::gil_scoped_release release;
      StoreLock lock(*handle_);
      record = value_or_throw(collection_->get(id));
    }
    auto* values = new std::vector<float>(std::move(record.vector));
    nb::capsule owner(values, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    nb::ndarray<nb::numpy, float, nb::ndim<1>> array(values->data(), {values->size()}, owner);
    return nb::make_tuple(array, vector::metadata_to_json(record.metadata));
  }

  std::uint64_t next_free_id() {
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    return value_or_throw(collection_->next_free_id());
  }

  // (ids, distances, report): host queries on options.engine.
  nb::tuple query(HostVectors queries, std::size_t k, const std::string& index, std::size_t nprobe,
                  std::size_t nlist, const std::string& where, int threads,
                  const std::string& engine, int device, std::size_t memory_budget) {
    if (queries.shape(1) != dim_) {
      throw StatusError(invalid_argument("queries have dimension " +
                                         std::to_string(queries.shape(1)) + ", collection \"" +
                                         name_ + "\" has " + std::to_string(dim_)));
    }
    const vector::QueryOptions options =
        query_options(k, index, nprobe, nlist, where, threads, engine, device, memory_budget);
    const std::size_t count = queries.shape(0);
    // CPU scans of more than a few million multiply-adds, and CPU IVF queries on collections where
    // training the index (which the first one may do) takes that, run interruptibly; smaller ones
    // stay on this thread (sparing them the start of a worker thread), and so does every query
    // that may reach the GPU engine, whose CUDA state (current device, per-thread default stream)
    // belongs to the calling thread.
#if GPUOPT_CUDA
    const bool host_only = options.engine == vector::QueryEngine::kCpu;
#else
    const bool host_only = true;
#endif
    std::size_t rows = 0;
    {
      nb::gil_scoped_release release;
      StoreLock lock(*handle_);
      rows = collection_->size();
    }
    const double scan = double(rows) * double(dim_) * (index == "ivf" ? 1.0 : double(count));
    const bool interruptible = host_only && scan >= double(1 << 22);
    auto* ids = new std::vector<std::int64_t>(count * k, -1);
    auto* distances = new std::vector<float>(count * k, std::numeric_limits<float>::infinity());
    nb::capsule ids_owner(
        ids, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
    nb::capsule distances_owner(
        distances, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    vector::QueryReport report;
    auto search = [&](const CancelToken* cancel) {
      vector::QueryOptions cancellable = options;
      cancellable.cancel = cancel;
      StoreLock lock(*handle_);
      return value_or_throw(collection_->query(queries.data(), count, cancellable, &report));
    };
    vector::SearchResults results;
    if (interruptible) {
      results = run_interruptible(search);
    } else {
      nb::gil_scoped_release release;
      results = search(nullptr);
    }
    {
      nb::gil_scoped_release release;
      for (std::size_t q = 0; q < results.size() && q < count; ++q) {
        for (std::size_t i = 0; i < results[q].size() && i < k; ++i) {
          (*ids)[q * k + i] = static_cast<std::int64_t>(results[q][i].id);
          (*distances)[q * k + i] = results[q][i].distance;
        }
      }
    }
    nb::ndarray<nb::numpy, std::int64_t, nb::ndim<2>> id_array(ids->data(), {count, k}, ids_owner);
    nb::ndarray<nb::numpy, float, nb::ndim<2>> distance_array(distances->data(), {count, k},
                                                              distances_owner);
    return nb::make_tuple(id_array, distance_array, report_dict(report));
  }

  // Device queries (a CUDA DLPack tensor [q, dim] float32) answered on the GPU into the caller's
  // device arrays `ids` (int64 [q, k], -1 where no row) and `distances` (float32 [q, k], FLT_MAX
  // where no row), both given as device addresses, on `stream`. Returns the report.
  nb::dict query_device(nb::ndarray<> queries, std::uintptr_t ids, std::uintptr_t distances,
                        std::uintptr_t stream, std::size_t k, const std::string& where, int device,
                        std::size_t memory_budget) {
    vector::QueryOptions options =
        query_options(k, "exact", 0, 0, where, 0, "gpu", device, memory_budget);
    if (ids == 0 || distances == 0) {
      throw StatusError(invalid_argument("query_device: null result array"));
    }
    std::vector<std::int64_t> shape, strides;
    const vector::DLTensor view = dlpack_view(queries, shape, strides);
    vector::GpuDeviceResults results;
    // int64 -1 and uint64 ~0 have the same bits: the ids land as Python expects them.
    results.ids = reinterpret_cast<std::uint64_t*>(ids);
    results.distances = reinterpret_cast<float*>(distances);
    vector::QueryReport report;
    {
      nb::gil_scoped_release release;
      StoreLock lock(*handle_);
      throw_if_error(collection_->query_device(view, options, results,
                                               reinterpret_cast<void*>(stream), &report));
    }
    return report_dict(report);
  }

  double build_ivf(std::size_t nlist, int iterations, std::uint64_t seed, int threads,
                   const std::string& engine, int device) {
    if (iterations < 1) {
      throw StatusError(
          invalid_argument("iterations " + std::to_string(iterations) + " must be at least 1"));
    }
    if (device < 0) {
      throw StatusError(invalid_argument("device " + std::to_string(device) + " is negative"));
    }
    vector::IvfParams params;
    params.nlist = nlist;
    params.iterations = iterations;
    params.seed = seed;
    params.engine = value_or_throw(vector::parse_query_engine(engine));
    params.device = device;
    // Ctrl-C stops the training; the saved index stays the previous one.
    return run_interruptible([&](const CancelToken* cancel) {
      vector::IvfParams cancellable = params;
      cancellable.cancel = cancel;
      StoreLock lock(*handle_);
      return value_or_throw(collection_->build_ivf(cancellable, threads));
    });
  }

  // (segments_before, segments_after, rows_dropped). Ctrl-C stops it before its commit: the old
  // layout stays.
  nb::tuple compact(std::size_t target_rows) {
    const vector::CompactReport report = run_interruptible([&](const CancelToken* cancel) {
      vector::CompactOptions options;
      options.target_rows = target_rows;
      options.cancel = cancel;
      StoreLock lock(*handle_);
      return value_or_throw(collection_->compact(options));
    });
    return nb::make_tuple(report.segments_before, report.segments_after, report.rows_dropped);
  }

  void release_gpu() {
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    collection_->release_gpu();
  }

  nb::dict gpu_residency() {
    vector::GpuResidency residency;
    {
      nb::gil_scoped_release release;
      StoreLock lock(*handle_);
      residency = collection_->gpu_residency();
    }
    return residency_dict(residency);
  }

  void verify() {
    run_interruptible([&](const CancelToken* cancel) {
      StoreLock lock(*handle_);
      throw_if_error(collection_->verify(cancel));
    });
  }

  nb::dict stats() {
    vector::CollectionStats stats;
    vector::GpuResidency residency;
    {
      nb::gil_scoped_release release;
      StoreLock lock(*handle_);
      stats = collection_->stats();
      residency = collection_->gpu_residency();
    }
    nb::dict result;
    result["name"] = stats.name;
    result["dim"] = stats.dim;
    result["metric"] = std::string(vector::metric_name(stats.metric));
    result["live"] = stats.live;
    result["deleted"] = stats.deleted;
    result["segment_bytes"] = stats.segment_bytes;
    nb::list segments;
    for (const auto& segment : stats.segments) {
      nb::dict entry;
      entry["sequence"] = segment.sequence;
      entry["file"] = segment.file;
      entry["rows"] = segment.rows;
      entry["bytes"] = segment.bytes;
      entry["verified"] = segment.verified;
      segments.append(entry);
    }
    result["segments"] = segments;
    result["ivf"] = ivf_dict(stats.ivf);
    result["gpu"] = residency_dict(residency);
    return result;
  }

 private:
  void check_rows(std::size_t id_count, std::size_t rows, std::size_t columns) const {
    if (columns != dim_) {
      throw StatusError(invalid_argument("vectors have dimension " + std::to_string(columns) +
                                         ", collection \"" + name_ + "\" has " +
                                         std::to_string(dim_)));
    }
    if (rows != id_count) {
      throw StatusError(invalid_argument(std::to_string(rows) + " vectors for " +
                                         std::to_string(id_count) + " ids"));
    }
  }

  std::shared_ptr<StoreHandle> handle_;
  vector::Collection* collection_;  // owned by handle_->store
  std::string name_;
  std::size_t dim_;
  vector::Metric metric_;
};

class PyStore {
 public:
  static PyStore open(const std::string& directory, bool create, bool verify_on_first_use) {
    vector::OpenOptions options;
    options.create = create;
    options.verify_on_first_use = verify_on_first_use;
    auto handle = std::make_shared<StoreHandle>();
    {
      nb::gil_scoped_release release;
      handle->store = value_or_throw(vector::Store::open(directory, options));
    }
    return PyStore(std::move(handle));
  }

  PyCollection create_collection(const std::string& name, std::size_t dim,
                                 const std::string& metric) {
    vector::CollectionConfig config;
    config.dim = dim;
    config.metric = value_or_throw(vector::parse_metric(metric));
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    return PyCollection(handle_, value_or_throw(handle_->store->create_collection(name, config)));
  }

  PyCollection collection(const std::string& name) {
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    return PyCollection(handle_, value_or_throw(handle_->store->collection(name)));
  }

  std::vector<std::string> collection_names() {
    nb::gil_scoped_release release;
    StoreLock lock(*handle_);
    return handle_->store->collection_names();
  }

  std::string directory() {
    StoreLock lock(*handle_);
    return handle_->store->directory().string();
  }

  // Closes the catalogue and unmaps the segments; every Collection of this store then raises.
  void close() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(handle_->mutex);
    handle_->store.reset();
  }

  bool closed() const { return handle_->store == nullptr; }

 private:
  explicit PyStore(std::shared_ptr<StoreHandle> handle) : handle_(std::move(handle)) {}
  std::shared_ptr<StoreHandle> handle_;
};

}  // namespace

void bind_vector(nb::module_& module) {
  nb::class_<PyCollection>(module, "VectorCollection",
                           "A collection of fixed-dimension float32 vectors keyed by 64-bit ids "
                           "(native half of gpuopt.vector.Collection).")
      .def_prop_ro("name", &PyCollection::name, "The collection's name.")
      .def_prop_ro("dim", &PyCollection::dim, "Dimension of every vector.")
      .def_prop_ro("metric", &PyCollection::metric, "\"l2\", \"ip\" or \"cosine\".")
      .def("size", &PyCollection::size, "Live rows.")
      .def("add", &PyCollection::add, nb::arg("ids"), nb::arg("vectors"),
           nb::arg("metadata").none(), nb::arg("replace"),
           "Commits host rows [n, dim] float32 under `ids` (metadata: one JSON object text per "
           "row, or None); replace=True upserts. Durable when it returns.")
      .def("add_dlpack", &PyCollection::add_dlpack, nb::arg("ids"), nb::arg("tensor").noconvert(),
           nb::arg("stream"), nb::arg("metadata").none(), nb::arg("replace"),
           "Commits a DLPack tensor [n, dim] float32 (CPU or CUDA, compact row-major); CUDA "
           "memory is read on `stream` (a cudaStream_t as an integer).")
      .def("remove", &PyCollection::remove, nb::arg("ids"),
           "Deletes the ids that exist; returns how many did.")
      .def("get", &PyCollection::get, nb::arg("id"),
           "(vector, metadata JSON text) of one id; NotFoundError when absent.")
      .def("next_free_id", &PyCollection::next_free_id,
           "One past the largest id below 2**63 (0 when empty).")
      .def("query", &PyCollection::query, nb::arg("queries"), nb::arg("k"), nb::arg("index"),
           nb::arg("nprobe"), nb::arg("nlist"), nb::arg("where"), nb::arg("threads"),
           nb::arg("engine"), nb::arg("device"), nb::arg("memory_budget"),
           "(ids int64 [q, k], distances float32 [q, k], report dict), closest first; -1 and inf "
           "pad rows with fewer than k hits. engine: \"cpu\", \"gpu\" or \"auto\".")
      .def("query_device", &PyCollection::query_device, nb::arg("queries").noconvert(),
           nb::arg("ids"), nb::arg("distances"), nb::arg("stream"), nb::arg("k"), nb::arg("where"),
           nb::arg("device"), nb::arg("memory_budget"),
           "Exact GPU search of CUDA queries [q, dim] float32 into device arrays at addresses "
           "`ids` (int64 [q, k], -1 = none) and `distances` (float32 [q, k], FLT_MAX = none) on "
           "`stream` (a cudaStream_t as an integer); returns the report dict.")
      .def("build_ivf", &PyCollection::build_ivf, nb::arg("nlist"), nb::arg("iterations"),
           nb::arg("seed"), nb::arg("threads"), nb::arg("engine"), nb::arg("device"),
           "Trains the IVF index now (k-means on `engine`), saves it; returns seconds.")
      .def("compact", &PyCollection::compact, nb::arg("target_rows"),
           "Merges small segments and drops deleted rows; (segments_before, segments_after, "
           "rows_dropped). target_rows 0 = the default size.")
      .def("release_gpu", &PyCollection::release_gpu,
           "Frees the GPU copies of the rows and IVF lists (the next GPU query makes them again).")
      .def("gpu_residency", &PyCollection::gpu_residency,
           "Which GPU copies are resident, on which device, rows and bytes, as a dict.")
      .def("verify", &PyCollection::verify, "Checks every segment's CRC32C.")
      .def("stats", &PyCollection::stats,
           "Rows, deletions, segments, the IVF index state and the GPU copies as a dict.");

  nb::class_<PyStore>(module, "VectorStore",
                      "An embedded vector store directory (native half of gpuopt.vector.Store).")
      .def_static("open", &PyStore::open, nb::arg("directory"), nb::arg("create"),
                  nb::arg("verify_on_first_use"), "Opens (or with create=True creates) a store.")
      .def("create_collection", &PyStore::create_collection, nb::arg("name"), nb::arg("dim"),
           nb::arg("metric"), "Creates a collection; AlreadyExistsError when it exists.")
      .def("collection", &PyStore::collection, nb::arg("name"),
           "An existing collection; NotFoundError when absent.")
      .def("collection_names", &PyStore::collection_names, "Names of every collection.")
      .def("directory", &PyStore::directory, "The store's directory.")
      .def("close", &PyStore::close, "Closes the store; its collections then raise.")
      .def_prop_ro("closed", &PyStore::closed, "True after close().");
}

}  // namespace gpuopt::python
