"""gpuopt.vector: an embedded, durable vector store with exact and IVF search and metadata filters.

>>> import numpy as np, gpuopt.vector
>>> with gpuopt.vector.open("/tmp/store", create=True) as store:
...     docs = store.get_or_create_collection("docs", dim=4, metric="cosine")
...     ids = docs.add(np.eye(4, dtype=np.float32), metadata=[{"lang": "en"}] * 4)
...     hit_ids, distances = docs.query(np.eye(4)[:1], k=2, where={"lang": "en"})

Vectors are float32 rows keyed by 64-bit ids; metadata values are strings or numbers. ``where``
filters use the CLI's ``--where`` language (Chroma's subset: ``$eq $ne $gt $gte $lt $lte $in $nin
$and $or``). An ``add`` returns only after its rows are on disk (segment file fsync'd and the SQLite
transaction committed), so it survives a killed process. Arrays: numpy (any real dtype, converted
to float32), lists, torch CPU and CUDA tensors (float32, contiguous; CUDA rows are read on the
tensor's current torch stream through the store's device-pointer ingest), and other DLPack objects.
Query results come back in the caller's framework and device. Calls release the GIL; a store's
calls take turns, so threads may share it safely.

Ctrl-C (KeyboardInterrupt, or any exception a signal handler raises) stops a long ``add``,
``upsert``, CPU ``query``, ``reindex``, ``compact``, ``delete`` or ``verify`` on the main thread
at the store's next check between chunks of its work, and the exception propagates as usual: a
cancelled ``add``/``upsert`` writes nothing of its batch (batches are all or nothing), a cancelled
``reindex`` keeps the previous index, a cancelled ``compact`` keeps the previous segments, a
cancelled ``delete`` deletes nothing, and a query changes nothing. If the call finished just
before it saw the signal, its effect is whole and the exception is raised all the same.

Engines: ``query(..., engine="auto")`` (the default) answers on the GPU when gpuopt was built with
CUDA and a device answers, else on the CPU; ``engine="gpu"`` raises GpuUnavailableError naming
why instead of falling back; ``engine="cpu"`` never touches a GPU. The first GPU query copies the
collection's rows to the device and keeps them there (later queries copy only rows written
since; ``release_gpu()`` or closing the store frees them), so host and CUDA queries alike pay the
copy once. ``query(..., report=True)`` and ``last_query_report`` say which engine answered and why.
CUDA tensor queries on the GPU engine stay on the device: ids and distances come back as CUDA
tensors written on the caller's stream. The IVF index is saved in the store: ``reindex()`` trains
and saves it, later IVF queries (also after reopening) load it, and ``info()["ivf"]`` shows it.
"""

from __future__ import annotations

import json
import math
import os
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from . import _arrays, _native
from .errors import (
    AlreadyExistsError,
    Error,
    GpuUnavailableError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)

__all__ = ["Store", "Collection", "open", "METRICS", "INDEXES", "ENGINES", "GPU_MAX_K"]

#: Distance metrics: squared L2, negative inner product, 1 - cosine similarity (smaller = closer).
METRICS = ("l2", "ip", "cosine")
#: Search indexes: brute force, or IVF-Flat (saved in the store: trained once, by reindex() or the
#: first IVF query, and loaded on open).
INDEXES = ("exact", "ivf")
#: Query engines: the GPU where it can answer else the CPU, the GPU only, the CPU only.
ENGINES = ("auto", "gpu", "cpu")
#: The largest k the GPU engine answers ("auto" answers larger k on the CPU).
GPU_MAX_K = 128

Metadata = Mapping[str, "str | int | float"]
# Queries per native call (see Collection.query).
_QUERY_CHUNK = 2048


def built_with_cuda() -> bool:
    """True when the extension was built with CUDA (GPU calls can then work where a GPU is)."""
    return bool(getattr(_native.require(), "built_with_cuda", False))


def _empty_report(engine: str) -> dict[str, Any]:
    return {
        "engine": engine,
        "fallback_reason": "",
        "gpu_fused": False,
        "gpu_small_batch": False,
        "gpu_fallback_queries": 0,
        "gpu_rows_uploaded": 0,
        "gpu_upload_seconds": 0.0,
        "ivf_built": False,
        "ivf_retrained": False,
        "ivf_build_seconds": 0.0,
        "ivf_rows_assigned": 0,
    }


def _merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report for a query answered in chunks: counts and seconds add up; the engine is the
    GPU only when every chunk's was."""
    merged = dict(reports[0])
    for other in reports[1:]:
        for key in ("gpu_fallback_queries", "gpu_rows_uploaded", "ivf_rows_assigned"):
            merged[key] += other[key]
        for key in ("gpu_upload_seconds", "ivf_build_seconds"):
            merged[key] += other[key]
        for key in ("gpu_fused", "gpu_small_batch", "ivf_built", "ivf_retrained"):
            merged[key] = merged[key] or other[key]
        if other["engine"] != merged["engine"]:
            merged["engine"] = "cpu" if "cpu" in (other["engine"], merged["engine"]) else "gpu"
        merged["fallback_reason"] = merged["fallback_reason"] or other["fallback_reason"]
    return merged


def _metadata_rows(metadata: Sequence[Metadata] | None, count: int) -> list[str] | None:
    """One JSON object text per row, after checking every key and value."""
    if metadata is None:
        return None
    if isinstance(metadata, Mapping) or not isinstance(metadata, Sequence):
        raise InvalidArgumentError("metadata: expected a list with one dict per vector")
    if len(metadata) != count:
        raise InvalidArgumentError(f"metadata: {len(metadata)} entries for {count} vectors")
    rows = []
    for row, entry in enumerate(metadata):
        if entry is None:
            rows.append("{}")
            continue
        if not isinstance(entry, Mapping):
            raise InvalidArgumentError(
                f"metadata[{row}]: expected a dict, got {type(entry).__name__}"
            )
        for key, value in entry.items():
            if not isinstance(key, str):
                raise InvalidArgumentError(f"metadata[{row}]: key {key!r} is not a string")
            if isinstance(value, bool) or not isinstance(
                value, (str, int, float, np.integer, np.floating)
            ):
                raise InvalidArgumentError(
                    f"metadata[{row}].{key}: {type(value).__name__} value; "
                    "only str, int and float are stored"
                )
            if isinstance(value, (float, np.floating)) and not math.isfinite(value):
                raise InvalidArgumentError(f"metadata[{row}].{key}: {value} is not a finite number")
        rows.append(
            json.dumps(
                {k: (v.item() if isinstance(v, np.generic) else v) for k, v in entry.items()}
            )
        )
    return rows


def _where_text(where: Mapping[str, Any] | str | None) -> str:
    if where is None:
        return ""
    if isinstance(where, str):
        return where
    if isinstance(where, Mapping):
        try:
            return json.dumps(where, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"where: {error}") from None
    raise InvalidArgumentError(f"where: expected a dict or JSON text, got {type(where).__name__}")


class Collection:
    """A collection of fixed-dimension float32 vectors with ids and metadata (from a Store)."""

    def __init__(self, native: Any, store: "Store") -> None:
        """Use Store.collection() / create_collection(); not constructed directly."""
        self._native = native
        self._store = store
        self._last = threading.local()  # last_query_report, one per thread

    def __repr__(self) -> str:
        return f"Collection(name={self.name!r}, dim={self.dim}, metric={self.metric!r})"

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._native.name

    @property
    def dim(self) -> int:
        """Dimension of every vector."""
        return self._native.dim

    @property
    def metric(self) -> str:
        """ "l2", "ip" or "cosine"."""
        return self._native.metric

    @property
    def count(self) -> int:
        """Live vectors (those queries can return)."""
        return self._native.size()

    def __len__(self) -> int:
        """Live vectors, as ``count``."""
        return self.count

    def add(
        self,
        vectors: Any,
        ids: Any = None,
        metadata: Sequence[Metadata] | None = None,
        *,
        stream: Any = None,
    ) -> np.ndarray:
        """Adds vectors [n, dim]; returns their ids (int64). Durable when it returns.

        Args:
            vectors: numpy/list (converted to float32), or a float32 contiguous torch tensor (CPU
                or CUDA) or other DLPack object; CUDA rows are read on `stream`.
            ids: n distinct integers in [0, 2**63); None = consecutive from next_free_id().
            metadata: None, or one dict per vector of str -> str | int | float.
            stream: for CUDA tensors, a torch stream or cudaStream_t integer; None = the tensor's
                current torch stream.

        Raises:
            AlreadyExistsError: an id is present already (use upsert()); nothing is written.
            InvalidArgumentError: wrong dtype, shape, device, strides, ids or metadata.
        """
        return self._write(vectors, ids, metadata, stream, replace=False)

    def upsert(
        self,
        vectors: Any,
        ids: Any,
        metadata: Sequence[Metadata] | None = None,
        *,
        stream: Any = None,
    ) -> np.ndarray:
        """As add(), but ids that exist are replaced (vector and metadata)."""
        if ids is None:
            raise InvalidArgumentError("upsert: ids are required")
        return self._write(vectors, ids, metadata, stream, replace=True)

    def _write(
        self, vectors: Any, ids: Any, metadata: Any, stream: Any, replace: bool
    ) -> np.ndarray:
        device_path = not isinstance(vectors, np.ndarray) and (
            _arrays.is_torch(vectors)
            or (hasattr(vectors, "__dlpack__") and not isinstance(vectors, (list, tuple)))
        )
        if device_path:
            shape = tuple(getattr(vectors, "shape", ()))
            if len(shape) != 2:
                raise InvalidArgumentError(
                    f"vectors: expected a 2-D [rows, dim] tensor, got shape {shape}"
                )
            rows = int(shape[0])
            if int(shape[1]) != self.dim:
                raise InvalidArgumentError(
                    f"vectors: shape {shape} has dimension {shape[1]}, "
                    f"collection {self.name!r} has {self.dim}"
                )
        else:
            host = _arrays.host_matrix(vectors, "vectors", self.dim)
            rows = host.shape[0]
        if ids is None:
            start = self._native.next_free_id()
            id_array = np.arange(start, start + rows, dtype=np.uint64)
        else:
            id_array = _arrays.host_ids(ids, rows)
        rows_json = _metadata_rows(metadata, rows)
        if not device_path:
            self._native.add(id_array, host, rows_json, replace)
        elif _arrays.is_torch(vectors):
            self._add_torch(vectors, id_array, rows_json, stream, replace)
        else:
            handle = int(getattr(stream, "cuda_stream", stream) or 0)
            self._native.add_dlpack(id_array, vectors, handle, rows_json, replace)
        return id_array.astype(np.int64)

    def _add_torch(
        self, tensor: Any, ids: np.ndarray, rows_json: Any, stream: Any, replace: bool
    ) -> None:
        import torch

        if tensor.dtype != torch.float32:
            raise InvalidArgumentError(f"vectors: dtype {tensor.dtype}, expected torch.float32")
        if not tensor.is_contiguous():
            raise InvalidArgumentError(
                f"vectors: strides {tuple(tensor.stride())} are not compact row-major; "
                "call .contiguous()"
            )
        tensor = tensor.detach()
        if tensor.is_cuda:
            handle = _arrays.torch_stream_handle(tensor, stream)
            with torch.cuda.device(tensor.device):
                self._native.add_dlpack(ids, tensor, handle, rows_json, replace)
        else:
            # A CPU float32 contiguous tensor is viewed as numpy (no copy): the host write path,
            # which Ctrl-C can cancel.
            self._native.add(ids, tensor.numpy(), rows_json, replace)

    def query(
        self,
        queries: Any,
        k: int = 10,
        where: Mapping[str, Any] | str | None = None,
        index: str = "exact",
        *,
        engine: str = "auto",
        nprobe: int = 8,
        nlist: int = 0,
        threads: int = 0,
        device: int | None = None,
        gpu_memory_budget: int = 0,
        stream: Any = None,
        report: bool = False,
    ) -> tuple[Any, Any] | tuple[Any, Any, dict[str, Any]]:
        """The k nearest live vectors of each query: ``(ids, distances)``, each [q, k], closest
        first; rows with fewer than k matches are padded with id -1 and distance inf.

        Args:
            queries: [q, dim] numpy/list, or a torch tensor (CPU or CUDA; results come back as
                torch tensors on the same device).
            k: neighbours per query (>= 1; the GPU answers k <= 128).
            where: a filter dict (or its JSON text), e.g. ``{"year": {"$gte": 2000}}``.
            index: "exact" (brute force) or "ivf" (IVF-Flat: the index saved in the store, trained
                and saved by the first IVF query when none is; see reindex()).
            engine: "auto" (the default: the GPU when it can answer, else the CPU, with the reason
                in the report), "gpu" (GpuUnavailableError naming why when no GPU can answer) or
                "cpu". The first GPU query copies the collection's rows to the device and the
                copy stays there (later queries copy only rows written since) until
                release_gpu() or the store closes.
            nprobe: IVF lists scanned per query. nlist: IVF lists when the first IVF query
                trains the index (0 = about 4*sqrt(rows)).
            threads: CPU threads (0 = all).
            device: the CUDA device of the GPU copy; None = the queries' device for CUDA
                tensors, else 0.
            gpu_memory_budget: bytes the GPU copy may take (0 = no cap). Past it "gpu" raises
                ResourceExhaustedError and "auto" answers on the CPU.
            stream: for CUDA tensor queries, a torch stream or cudaStream_t integer; None = torch's
                current stream on the queries' device.
            report: True returns ``(ids, distances, report)``; the report is also kept in
                ``last_query_report`` (per thread).

        CUDA tensor queries on the GPU engine (exact index) are read from device memory and the
        results are written into new CUDA tensors on the stream, with no host copy of either; the
        call waits for a [q] flag array only (near-ties the fused kernel hands to the exact
        cuBLAS path). Other dtypes are converted to float32 on the device. IVF, or the CPU,
        answer CUDA queries through a host copy (the report's ``queries_on_device`` is False).

        Distances: squared L2, negative inner product, or 1 - cosine (per the metric).
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidArgumentError(f"k: expected an integer >= 1, got {k!r}")
        if index not in INDEXES:
            raise InvalidArgumentError(f"index: {index!r}; expected one of {INDEXES}")
        if engine not in ENGINES:
            raise InvalidArgumentError(f"engine: {engine!r}; expected one of {ENGINES}")
        if device is not None and (
            isinstance(device, bool) or not isinstance(device, (int, np.integer)) or device < 0
        ):
            raise InvalidArgumentError(f"device: expected an integer >= 0 or None, got {device!r}")
        for name, value in (("nprobe", nprobe), ("nlist", nlist), ("threads", threads)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidArgumentError(f"{name}: expected an integer >= 0, got {value!r}")
        if (
            isinstance(gpu_memory_budget, bool)
            or not isinstance(gpu_memory_budget, (int, np.integer))
            or gpu_memory_budget < 0
        ):
            raise InvalidArgumentError(
                f"gpu_memory_budget: expected bytes >= 0, got {gpu_memory_budget!r}"
            )
        where_text = _where_text(where)
        budget = int(gpu_memory_budget)
        fallback = ""
        if _arrays.is_cuda_torch(queries):
            if engine != "cpu" and index == "exact" and k <= GPU_MAX_K:
                try:
                    return self._finish(
                        *self._query_cuda(queries, int(k), where_text, device, budget, stream),
                        report,
                    )
                except InvalidArgumentError:
                    raise
                except Error as error:
                    # As the C++ kAuto: any GPU failure answers on the CPU, with the reason.
                    if engine == "gpu":
                        raise type(error)(f"query(engine='gpu'): {error}") from None
                    fallback = str(error)
        ids, distances, how = self._query_host(
            queries, int(k), where_text, index, engine, int(nprobe), int(nlist), int(threads),
            device, budget,
        )
        if fallback and how["engine"] == "cpu" and not how["fallback_reason"]:
            how["fallback_reason"] = fallback
        return self._finish(ids, distances, how, report)

    def _finish(self, ids: Any, distances: Any, how: dict[str, Any], report: bool) -> Any:
        self._last.report = how
        return (ids, distances, how) if report else (ids, distances)

    def _query_host(
        self,
        queries: Any,
        k: int,
        where_text: str,
        index: str,
        engine: str,
        nprobe: int,
        nlist: int,
        threads: int,
        device: int | None,
        budget: int,
    ) -> tuple[Any, Any, dict[str, Any]]:
        torch_device = None
        if _arrays.is_torch(queries):
            torch_device = queries.device
            if device is None and queries.is_cuda:
                device = queries.device.index or 0
            queries = queries.detach().to("cpu")
        host = _arrays.host_matrix(queries, "queries", self.dim)
        # Ctrl-C cancels a long native call itself (see the module docstring). Batches for the GPU
        # still go in chunks, which bounds the device memory one call takes; the CPU engine scans
        # the whole batch in one call (queries are independent, so the results are the same).
        chunk = max(1, host.shape[0]) if engine == "cpu" else _QUERY_CHUNK
        parts = []
        for start in range(0, max(1, host.shape[0]), chunk):
            try:
                parts.append(
                    self._native.query(
                        host[start : start + chunk], k, index, nprobe, nlist, where_text,
                        threads, engine, 0 if device is None else int(device), budget,
                    )
                )
            except (GpuUnavailableError, ResourceExhaustedError) as error:
                if engine != "gpu":
                    raise
                raise type(error)(f"query(engine='gpu'): {error}") from None
        if len(parts) == 1:
            ids, distances, how = parts[0]
        else:
            ids = np.concatenate([p[0] for p in parts])
            distances = np.concatenate([p[1] for p in parts])
            how = _merge_reports([p[2] for p in parts])
        how["requested_engine"] = engine
        how["queries_on_device"] = False
        if torch_device is not None:
            import torch

            return (
                torch.from_numpy(ids).to(torch_device),
                torch.from_numpy(distances).to(torch_device),
                how,
            )
        return ids, distances, how

    def _query_cuda(
        self, queries: Any, k: int, where_text: str, device: int | None, budget: int, stream: Any
    ) -> tuple[Any, Any, dict[str, Any]]:
        """Device queries in, device results out, on one CUDA stream (see query())."""
        import torch

        if not built_with_cuda():
            raise GpuUnavailableError("gpuopt was built without CUDA")
        if queries.dim() != 2 or queries.shape[1] != self.dim:
            raise InvalidArgumentError(
                f"queries: shape {tuple(queries.shape)}; expected [q, {self.dim}]"
            )
        if queries.dtype == torch.bool or queries.dtype.is_complex:
            raise InvalidArgumentError(f"queries: dtype {queries.dtype} is not a real number type")
        gpu = queries.device.index or 0
        if device is not None and int(device) != gpu:
            raise InvalidArgumentError(
                f"device: {device}, but the queries are on cuda:{gpu}; "
                "the GPU copy answers queries on its own device"
            )
        if k > GPU_MAX_K:
            raise InvalidArgumentError(f"k {k} is above the GPU engine's largest, {GPU_MAX_K}")
        if stream is None and gpu == torch.cuda.current_device():
            # The common call: the caller's current stream on the current device; no context
            # switches around the call (each costs microseconds at batch 1).
            use = torch.cuda.current_stream(gpu)
            answered = self._query_device_on(queries, k, where_text, gpu, budget, use)
        else:
            with torch.cuda.device(gpu):
                if stream is None:
                    use = torch.cuda.current_stream(gpu)
                elif isinstance(stream, torch.cuda.Stream):
                    use = stream
                else:
                    use = torch.cuda.ExternalStream(int(getattr(stream, "cuda_stream", stream)))
                with torch.cuda.stream(use):
                    answered = self._query_device_on(queries, k, where_text, gpu, budget, use)
        ids, distances, reports = answered
        how = _merge_reports(reports) if reports else _empty_report("gpu")
        how["requested_engine"] = "gpu"
        how["queries_on_device"] = True
        return ids, distances, how

    def _query_device_on(
        self, queries: Any, k: int, where_text: str, gpu: int, budget: int, use: Any
    ) -> tuple[Any, Any, list[dict[str, Any]]]:
        """The device query on stream `use` (the current stream of `gpu` or made current)."""
        import torch

        if queries.dtype != torch.float32 or not queries.is_contiguous():
            queries = queries.to(torch.float32).contiguous()
        queries = queries.detach()
        count = queries.shape[0]
        ids = torch.empty((count, k), dtype=torch.int64, device=queries.device)
        distances = torch.empty((count, k), dtype=torch.float32, device=queries.device)
        stream_handle = int(use.cuda_stream)
        reports = []
        if 0 < count <= _QUERY_CHUNK:
            # One chunk: the tensors themselves, no views.
            reports.append(
                self._native.query_device(
                    queries, ids.data_ptr(), distances.data_ptr(), stream_handle, k, where_text,
                    gpu, budget,
                )
            )
        elif count > _QUERY_CHUNK:
            for start in range(0, count, _QUERY_CHUNK):
                end = min(count, start + _QUERY_CHUNK)
                reports.append(
                    self._native.query_device(
                        queries[start:end], ids[start:end].data_ptr(),
                        distances[start:end].data_ptr(), stream_handle, k, where_text, gpu,
                        budget,
                    )
                )
        # The engine marks "no row" with FLT_MAX; the API's padding is inf.
        distances.masked_fill_(ids < 0, math.inf)
        return ids, distances, reports

    @property
    def last_query_report(self) -> dict[str, Any] | None:
        """How this thread's latest query() of this Collection object answered, or None before one:
        ``engine`` ("cpu" or "gpu"), ``requested_engine``, ``fallback_reason`` (why "auto"
        answered on the CPU), ``queries_on_device``, ``gpu_fused``, ``gpu_small_batch``,
        ``gpu_fallback_queries``, ``gpu_rows_uploaded``, ``gpu_upload_seconds``, ``ivf_built``,
        ``ivf_retrained``, ``ivf_build_seconds``, ``ivf_rows_assigned``."""
        return getattr(self._last, "report", None)

    def delete(self, ids: Any) -> int:
        """Deletes the ids that exist; returns how many did. Durable when it returns."""
        return self._native.remove(_arrays.host_ids(ids, None))

    def get(self, id: int) -> tuple[np.ndarray, dict[str, str | float]]:
        """(vector, metadata) of one id. Raises NotFoundError when absent."""
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)) or id < 0:
            raise InvalidArgumentError(f"id: expected an integer >= 0, got {id!r}")
        vector, metadata = self._native.get(int(id))
        return vector, json.loads(metadata)

    def next_free_id(self) -> int:
        """One past the largest id below 2**63 (0 when empty): where add(ids=None) starts."""
        return self._native.next_free_id()

    def reindex(
        self,
        nlist: int = 0,
        *,
        engine: str = "auto",
        iterations: int = 10,
        seed: int = 1234,
        threads: int = 0,
        device: int = 0,
    ) -> float:
        """(Re)trains the IVF index now and saves it in the store (atomically replacing the saved
        one); returns the training seconds. Later IVF queries, in this and other processes and
        after a reopen, use it without retraining; rows added later are assigned to its lists.

        Args:
            nlist: lists (0 = about 4*sqrt(rows), a power of two).
            engine: where k-means runs: "auto" (the GPU when one answers), "gpu" or "cpu".
            iterations, seed: k-means iterations and sampling seed. threads: CPU threads (0 = all).
            device: the CUDA device for "gpu"/"auto".

        ``info()["ivf"]`` reports the saved index and its drift (``retrain_recommended``).
        """
        if engine not in ENGINES:
            raise InvalidArgumentError(f"engine: {engine!r}; expected one of {ENGINES}")
        for name, value in (("nlist", nlist), ("threads", threads), ("device", device)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidArgumentError(f"{name}: expected an integer >= 0, got {value!r}")
        if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)):
            raise InvalidArgumentError(f"iterations: expected an integer >= 1, got {iterations!r}")
        try:
            return self._native.build_ivf(
                int(nlist), int(iterations), int(seed), int(threads), engine, int(device)
            )
        except GpuUnavailableError as error:
            if engine != "gpu":
                raise
            raise GpuUnavailableError(f"reindex(engine='gpu'): {error}") from None

    def build_ivf(
        self,
        nlist: int = 0,
        *,
        iterations: int = 10,
        seed: int = 1234,
        threads: int = 0,
        engine: str = "auto",
        device: int = 0,
    ) -> float:
        """The same as reindex()."""
        return self.reindex(
            nlist, engine=engine, iterations=iterations, seed=seed, threads=threads, device=device
        )

    def compact(self, target_rows: int = 0) -> dict[str, int]:
        """Merges small segments and drops deleted rows, as crash-safe as a write; returns
        ``segments_before``, ``segments_after`` and ``rows_dropped``. Live rows, ids and metadata
        are unchanged. Ctrl-C stops it before its commit, keeping the previous segments.

        Args:
            target_rows: merged segments hold up to this many live rows (0 = 64 MiB of vectors).
        """
        valid = isinstance(target_rows, (int, np.integer)) and not isinstance(target_rows, bool)
        if not valid or target_rows < 0:
            raise InvalidArgumentError(
                f"target_rows: expected an integer >= 0, got {target_rows!r}"
            )
        before, after, dropped = self._native.compact(int(target_rows))
        return {"segments_before": before, "segments_after": after, "rows_dropped": dropped}

    def release_gpu(self) -> None:
        """Frees the GPU copies of the rows and of the IVF lists (the next GPU query makes them
        again). Closing the store frees them too."""
        self._native.release_gpu()

    def verify(self) -> None:
        """Checks every segment's CRC32C; DataLossError naming the file on a mismatch."""
        self._native.verify()

    def info(self) -> dict[str, Any]:
        """The collection's state, as `gpuopt vector info`: name, dim, metric, live, deleted,
        segment_bytes, segments; ``ivf``: the saved IVF index (present, file, error, generation,
        nlist, train_engine, train_seconds, trained_rows, rows_since_training, growth,
        distance_ratio, retrain_recommended, trainings = k-means runs by this Store object,
        rebuilds_by_id = loads that rebuilt lists a compaction moved, save_error);
        ``gpu``: the resident GPU copies (resident, device, rows, device_bytes, ivf_resident,
        ivf_device, ivf_rows)."""
        return self._native.stats()


class Store:
    """A vector store directory (SQLite catalogue + segment files). A context manager."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = False,
        verify_on_first_use: bool = True,
    ) -> None:
        """Opens the store at `path`; create=True makes it when missing.

        Raises NotFoundError when it is missing (and not created), DataLossError when a segment is
        truncated or its header is corrupt.
        """
        native = _native.require()
        self._native = native.VectorStore.open(os.fspath(path), create, verify_on_first_use)
        self._path = os.fspath(path)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"collections={self.collection_names()}"
        return f"Store({self._path!r}, {state})"

    @property
    def path(self) -> str:
        """The store's directory."""
        return self._path

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._native.closed

    def create_collection(
        self, name: str = "default", *, dim: int, metric: str = "l2"
    ) -> Collection:
        """Creates a collection of `dim`-dimensional vectors; AlreadyExistsError when it exists."""
        if metric not in METRICS:
            raise InvalidArgumentError(f"metric: {metric!r}; expected one of {METRICS}")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise InvalidArgumentError(f"dim: expected an integer >= 1, got {dim!r}")
        return Collection(self._native.create_collection(name, int(dim), metric), self)

    def collection(self, name: str = "default") -> Collection:
        """An existing collection; NotFoundError naming it when absent."""
        return Collection(self._native.collection(name), self)

    def get_or_create_collection(
        self, name: str = "default", *, dim: int, metric: str = "l2"
    ) -> Collection:
        """The collection `name`, created when missing; InvalidArgumentError when it exists with
        another dim or metric."""
        try:
            found = self.collection(name)
        except NotFoundError:
            try:
                return self.create_collection(name, dim=dim, metric=metric)
            except AlreadyExistsError:  # created meanwhile by another thread
                found = self.collection(name)
        if found.dim != dim or found.metric != metric:
            raise InvalidArgumentError(
                f"collection {name!r} exists with dim {found.dim}, metric {found.metric!r}; "
                f"asked for dim {dim}, metric {metric!r}"
            )
        return found

    def collection_names(self) -> list[str]:
        """Names of every collection."""
        return self._native.collection_names()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.collection_names()

    def close(self) -> None:
        """Closes the store; its collections raise FailedPreconditionError afterwards."""
        self._native.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open(
    path: str | os.PathLike[str], *, create: bool = False, verify_on_first_use: bool = True
) -> Store:
    """Opens (create=True: creates when missing) the store at `path`; see Store."""
    return Store(path, create=create, verify_on_first_use=verify_on_first_use)
