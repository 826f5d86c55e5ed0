"""gpuopt.data: batches prefetched to the GPU ahead of a PyTorch training loop.

>>> loader = torch.utils.data.DataLoader(dataset, batch_size=32, num_workers=8)
>>> for images, labels in gpuopt.data.prefetch(loader):     # CUDA tensors, ready on the
...     loss = model(images).loss(labels)                    # current stream (no host sync)

``prefetch(iterable)`` wraps any iterable of CPU batches (torch tensors, numpy arrays, or tuples,
lists and dicts of them; other leaves pass through unchanged) and yields the same structure on the
GPU. A background thread pulls batches, copies them through a pinned staging pool (parallel host
copies without the GIL) and queues the host-to-device copies on a dedicated copy stream; the
consumer's current stream waits on the batch's event. How far it runs ahead is set by the C++
loader's depth controller (the consumer's wait grows it, the memory budget caps it).

``RecordFile`` and ``JpegFolder`` are native sources: the C++ loader reads fixed-size records
(pread or cuFile) or decodes JPEGs (libjpeg-turbo) on its own threads, without the GIL, and yields
CUDA tensors that share the loader's device buffers until freed.

With ``device="cpu"`` (the default where CUDA is not available) the same API prefetches on a
plain thread: nothing is pinned or copied, and the batches are yielded as they came.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from . import _arrays, _native
from .errors import GpuUnavailableError, InvalidArgumentError, ResourceExhaustedError

__all__ = ["prefetch", "Prefetcher", "RecordFile", "JpegFolder"]

_END = object()
_DEFAULT_CPU_BUDGET = 2 << 30
_MAX_DEFAULT_GPU_BUDGET = 8 << 30
_JOIN_TIMEOUT_S = 2.0
_POLL_S = 0.25
_SHM_PATH = "/dev/shm"
_SHM_SHARE = 0.5  # of the free /dev/shm space that extra outstanding batches may take


class _Failure:
    """An exception raised by the source, carried to the consumer."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Staged:
    """A prefetched batch waiting in the queue."""

    __slots__ = ("value", "token", "tensors", "pinned_sources", "nbytes")

    def __init__(self, value: Any, token: int | None, tensors: list, pinned: list, nbytes: int):
        self.value = value
        self.token = token
        self.tensors = tensors
        self.pinned_sources = pinned
        self.nbytes = nbytes


def _torch():
    import torch

    return torch


def _cuda_available() -> bool:
    if _native.native is None or not _native.native.built_with_cuda:
        return False
    try:
        return bool(_torch().cuda.is_available())
    except ImportError:
        return False


def _resolve_device(device: Any) -> tuple[str, int]:
    """("cpu", 0) or ("cuda", ordinal) from None, "cpu", "cuda", "cuda:N", an int or a
    torch.device; None means CUDA when available, else the CPU."""
    if device is None:
        return ("cuda", _torch().cuda.current_device()) if _cuda_available() else ("cpu", 0)
    if isinstance(device, int):
        device = f"cuda:{device}"
    text = str(device)
    if text == "cpu":
        return "cpu", 0
    if text == "cuda" or text.startswith("cuda:"):
        if not _cuda_available():
            why = (
                "the native library did not load"
                if _native.native is None
                else "gpuopt was built without CUDA"
                if not _native.native.built_with_cuda
                else "torch sees no CUDA device"
            )
            raise GpuUnavailableError(f"device {text!r}: {why} (use device='cpu')")
        if text == "cuda":
            return "cuda", _torch().cuda.current_device()
        try:
            return "cuda", int(text.split(":", 1)[1])
        except ValueError:
            pass
    raise InvalidArgumentError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _nbytes(value: Any) -> int:
    """Bytes of the tensors and arrays in a (nested) batch."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if _arrays.is_torch(value):
        return int(value.numel() * value.element_size())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    if isinstance(value, Mapping):
        return sum(_nbytes(item) for item in value.values())
    return 0


def _rebuild(template: Any, items: list) -> Any:
    """A container of the template's type holding `items` (namedtuples and dict subclasses too)."""
    if isinstance(template, tuple):
        return type(template)(*items) if hasattr(template, "_fields") else type(template)(items)
    return type(template)(items) if type(template) is not list else items


def _shared_stager(device: int, pinned_budget: int, chunk_bytes: int, copy_threads: int):
    """One staging engine (copy stream + pinned pool + copy threads) per device and settings,
    kept for the process: torch's allocator ties the tensors it stages to the copy stream."""
    key = (device, pinned_budget, chunk_bytes, copy_threads)
    with _stagers_lock:
        stager = _stagers.get(key)
        if stager is None:
            stager = _native.require().Stager(device, pinned_budget, chunk_bytes, copy_threads)
            _stagers[key] = stager
        return stager


def _loader_ahead_option(value: Any) -> Any:
    """"auto" (or True), False, or an int >= 1 (the most batches the DataLoader may request)."""
    if value is True or value == "auto":
        return "auto"
    if value is False:
        return False
    if isinstance(value, int) and value >= 1:
        return value
    raise InvalidArgumentError(
        f"prefetch: loader_ahead {value!r}: expected 'auto', False or an int >= 1 (the most "
        f"batches torch's DataLoader may request ahead)"
    )


def _shm_free_bytes(path: str) -> int | None:
    """Free bytes of the file system that holds the DataLoader workers' shared memory."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


class _LoaderAhead:
    """Lets torch's multi-process DataLoader iterator request more batches ahead than its
    ``prefetch_factor x num_workers`` while the depth controller grows the prefetch depth.

    The DataLoader yields batches in order and sends one new index task per batch it yields, so
    at most ``prefetch_factor x num_workers`` batches are requested (sent to a worker, not yet
    yielded). When one batch stalls, the producer thread waits in ``next()`` for it, nothing new
    is requested, and the other workers go idle after their few tasks: a deeper prefetch queue
    cannot fill, since nothing arrives to fill it. Widening the iterator's window (its
    ``_prefetch_factor``, and ``_try_put_index()``, which torch calls once per yielded batch)
    keeps the workers busy during a stall; torch keeps the wider window by itself afterwards.

    These are torch's private attributes: used only after a capability check, only from the
    producer thread (the one that calls ``next()`` on the iterator, which is not thread-safe),
    only on the pass's own iterator (never the DataLoader object), and the window only widens.
    """

    _FIELDS = (
        ("_prefetch_factor", int),
        ("_num_workers", int),
        ("_tasks_outstanding", int),
        ("_send_idx", int),
        ("_rcvd_idx", int),
        ("_shutdown", bool),
    )

    def __init__(self, iterator: Any, option: Any, budget: int, shm_path: str = _SHM_PATH):
        self.option = option
        self.budget = budget
        self.shm_path = shm_path
        self.iterator: Any = None
        self.reason = self._check(iterator)
        self.active = self.reason == ""
        self.workers = 0
        self.base = 0
        self.cap = 0
        self.original_factor = 0
        self.set_factor = 0
        self.extra_tasks = 0
        self.limit = ""
        if self.active:
            self.iterator = iterator
            self.workers = iterator._num_workers
            self.original_factor = iterator._prefetch_factor
            self.base = self.original_factor * self.workers
            self.cap = self.base
            self.reason = (
                f"torch DataLoader iterator with {self.workers} workers, prefetch_factor "
                f"{self.original_factor}"
            )

    def _check(self, iterator: Any) -> str:
        """Why the iterator cannot be widened, or "" when it can."""
        if self.option is False:
            return "disabled (loader_ahead=False)"
        module = sys.modules.get("torch.utils.data.dataloader")
        name = type(iterator).__name__
        base = getattr(module, "_BaseDataLoaderIter", None) if module is not None else None
        if base is None or not isinstance(iterator, base):
            return f"the source's iterator ({name}) is not a torch DataLoader's"
        single = getattr(module, "_SingleProcessDataLoaderIter", None)
        if single is not None and isinstance(iterator, single):
            return "a DataLoader with num_workers=0 has no worker processes to run ahead"
        multi = getattr(module, "_MultiProcessingDataLoaderIter", None)
        if multi is None or not isinstance(iterator, multi):
            return f"this DataLoader's iterator ({name}) is not torch's multi-process one"
        wrong = [
            field
            for field, kind in self._FIELDS
            if type(getattr(iterator, field, None)) is not kind
        ]
        if not callable(getattr(iterator, "_try_put_index", None)):
            wrong.append("_try_put_index()")
        if wrong:
            version = getattr(sys.modules.get("torch"), "__version__", "?")
            return (
                f"this torch ({version}) DataLoader iterator lacks the expected {', '.join(wrong)}:"
                f" left as it is"
            )
        kinds = getattr(module, "_DatasetKind", None)
        if kinds is None or getattr(iterator, "_dataset_kind", None) != getattr(kinds, "Map", 0):
            return (
                "an iterable-style dataset: a task sent ahead may go to a worker whose iterator "
                "has ended, and the order of the workers' batches could change"
            )
        if iterator._num_workers < 1 or iterator._prefetch_factor < 1:
            return "the iterator has no workers or no prefetch_factor"
        if iterator._shutdown:
            return "the iterator has already shut its workers down"
        return ""

    def target(self, depth: int, largest_batch: int) -> tuple[int, str]:
        """The outstanding-batch cap wanted for `depth`, within the limits, and what bounds it."""
        # One batch in progress per worker and three depths' worth behind the in-order head: when
        # the head stalls, the other workers fill them, so the queue refills at once when it
        # clears and the workers are still ahead while it drains. Below three depths the ramp is
        # slower (docs/data-loader.md). Depth 2 is where the adaptive depth starts: until it
        # grew (the consumer waited), the loader's own window stands.
        want = self.base if depth <= 2 else max(self.base, 3 * depth + self.workers)
        bound = f"3 x depth {depth} + {self.workers} workers"
        if isinstance(self.option, int) and self.option < want:
            want, bound = self.option, f"loader_ahead={self.option}"
        if largest_batch > 0:
            # The requested batches sit beside the prefetched queue and the two batches in use.
            memory = self.budget // largest_batch - depth - 2
            if memory < want:
                want, bound = memory, f"memory_budget {self.budget} B"
            free = _shm_free_bytes(self.shm_path)
            if free is not None:
                # Worker batches travel through shared memory: the batches requested beyond the
                # present window may take a share of its free space, never all of it.
                window = self.iterator._send_idx - self.iterator._rcvd_idx
                shm = window + int(free * _SHM_SHARE) // largest_batch
                if shm < want:
                    want, bound = shm, f"{self.shm_path} free {free} B"
        return want, bound

    def advance(self, depth: int, largest_batch: int) -> str | None:
        """On the producer thread, before next(): widens the window when the depth calls for it
        and sends index tasks until it is full; the reason when the cap grew."""
        iterator = self.iterator
        if not self.active or iterator is None or iterator._shutdown:
            return None
        grown = None
        if largest_batch > 0:
            want, bound = self.target(depth, largest_batch)
            if want > self.cap:
                grown = (
                    f"grow: {want} batches requested ahead ({bound}; the loader's own {self.base})"
                )
                self.cap = want
                factor = max(iterator._prefetch_factor, math.ceil(want / self.workers))
                # torch's _try_put_index() asserts _tasks_outstanding < factor x workers; the
                # tasks in flight never exceed the window, so the cap fits under it.
                iterator._prefetch_factor = factor
                self.set_factor = factor
        try:
            while (
                iterator._send_idx - iterator._rcvd_idx < self.cap
                and iterator._tasks_outstanding < iterator._prefetch_factor * self.workers
            ):
                sent = iterator._send_idx
                iterator._try_put_index()
                if iterator._send_idx == sent:  # the sampler is done, or no worker takes more
                    break
                self.extra_tasks += 1
        except Exception as error:  # torch changed underneath: stop touching it
            self.active = False
            self.reason = f"stopped: _try_put_index() raised {type(error).__name__}: {error}"
            self.iterator = None
        return grown

    def finish(self) -> None:
        """On the producer thread at the end of the pass: gives a persistent-workers iterator its
        own prefetch_factor back for its next epoch (unless someone else changed it since)."""
        iterator, self.iterator = self.iterator, None
        if iterator is None or not self.set_factor:
            return
        if iterator._prefetch_factor == self.set_factor:
            iterator._prefetch_factor = self.original_factor


_stagers: dict[tuple, Any] = {}
_stagers_lock = threading.Lock()
_live_passes: "weakref.WeakSet[_Pass]" = weakref.WeakSet()


class _Pass:
    """One pass over the source: the producer thread, the queue and the statistics. Only this
    object is shared with the thread, so the consumer's iterator can be garbage collected."""

    def __init__(self, owner: "Prefetcher", iterator: Iterator) -> None:
        self.iterator: Iterator | None = iterator
        self.kind = owner._kind
        self.device = owner._device
        self.non_blocking = owner._non_blocking
        self.fixed_depth = owner._depth
        self.max_depth = owner._max_depth
        self.window = owner._window_batches
        self.budget = owner._memory_budget
        self.stager = owner._stager
        self.copy_stream = owner._copy_stream
        self.cv = threading.Condition()
        self.queue: collections.deque = collections.deque()
        self.queued_bytes = 0
        self.stopping = False
        self.finished = False  # the producer thread has left its loop
        self.controller = None
        self.largest_batch = 0
        self.timeline: list[dict[str, Any]] = []
        self.max_depth_reached = 0
        # Statistics (under cv).
        self.produced = 0
        self.busy_s = 0.0
        self.consumed = 0
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.wait_s = 0.0
        self.window_start = 0.0
        self.window_wait_s = 0.0
        self.window_batches = 0
        self.pending_sources: collections.deque = collections.deque()
        self.ahead = _LoaderAhead(iterator, owner._loader_ahead, self.budget)
        self.ahead_timeline: list[dict[str, Any]] = []
        if self.ahead.active:
            self.ahead_timeline.append(
                {"time_s": 0.0, "batch": 0, "cap": self.ahead.cap,
                 "reason": f"initial: the loader's prefetch_factor {self.ahead.original_factor} x "
                 f"{self.ahead.workers} workers"}
            )
        self.thread = threading.Thread(
            target=self._run, name="gpuopt.data.prefetch", daemon=True
        )
        _live_passes.add(self)
        self.thread.start()

    # ---- producer ------------------------------------------------------------------------------
    def _depth_now(self) -> int:
        if self.controller is None:
            return 1 if self.fixed_depth is None else self.fixed_depth
        depth = self.controller.depth
        if self.largest_batch:
            depth = min(depth, max(1, self.budget // self.largest_batch - 2))
        return max(1, depth)

    def _make_controller(self, batch_bytes: int) -> None:
        native = _native.native
        if native is None:
            return
        bound = native.depth_upper_bound(batch_bytes, self.budget, None, 0.0, 2, self.max_depth)
        if bound == 0:
            raise ResourceExhaustedError(
                f"gpuopt.data.prefetch: memory_budget {self.budget} B holds no prefetched batch of "
                f"{batch_bytes} B beyond the 2 in use (raise memory_budget)"
            )
        adaptive = self.fixed_depth is None
        initial = 2 if adaptive else self.fixed_depth
        self.controller = native.DepthController(
            adaptive, initial, 1, self.max_depth, self.window, bound
        )
        self.timeline.append(
            {
                "time_s": 0.0,
                "batch": 0,
                "depth": self.controller.depth,
                "reason": f"initial ({'adaptive' if adaptive else 'fixed'}; upper bound {bound} "
                f"from the memory budget)",
            }
        )
        self.max_depth_reached = self.controller.depth

    def _run(self) -> None:
        iterator = self.iterator
        try:
            if self.kind == "cuda":
                _torch().cuda.set_device(self.device)
            while True:
                with self.cv:
                    while not self.stopping and len(self.queue) >= self._depth_now():
                        self.cv.wait()
                    if self.stopping:
                        return
                    depth, largest = self._depth_now(), self.largest_batch
                if self.ahead.active:
                    self._run_ahead(depth, largest)
                began = time.perf_counter()
                try:
                    item = next(iterator)
                except StopIteration:
                    self._put(_END, 0.0)
                    return
                staged = self._stage(item)
                self._put(staged, time.perf_counter() - began)
        except BaseException as error:  # the source's own exception, re-raised by the consumer
            self._put(_Failure(error), 0.0)
        finally:
            self.ahead.finish()
            # Dropping the source iterator here ends it (a DataLoader shuts its workers down).
            self.iterator = None
            del iterator
            with self.cv:
                self.finished = True
                self.cv.notify_all()

    def _run_ahead(self, depth: int, largest: int) -> None:
        """Lets the DataLoader request more batches when the depth grew (producer thread)."""
        reason = self.ahead.advance(depth, largest)
        if reason is not None:
            with self.cv:
                now = time.perf_counter()
                self.ahead_timeline.append(
                    {"time_s": now - (self.started_at or now), "batch": self.consumed,
                     "cap": self.ahead.cap, "reason": reason}
                )

    def _put(self, entry: Any, busy_s: float) -> None:
        with self.cv:
            if self.stopping:
                self._discard(entry)
                return
            if isinstance(entry, _Staged):
                self.produced += 1
                self.busy_s += busy_s
                self.queued_bytes += entry.nbytes
                if entry.nbytes > self.largest_batch:
                    self.largest_batch = entry.nbytes
            self.queue.append(entry)
            self.cv.notify_all()

    def _discard(self, entry: Any) -> None:
        if isinstance(entry, _Staged) and entry.token is not None:
            self.stager.discard(entry.token)

    def _stage(self, item: Any) -> _Staged:
        nbytes = _nbytes(item)
        if self.controller is None and nbytes > 0:
            with self.cv:
                self._make_controller(nbytes)
        if self.kind == "cpu":
            return _Staged(item, None, [], [], nbytes)
        torch = _torch()
        copies: list[tuple[int, int, int, bool]] = []
        tensors: list = []
        pinned: list = []
        keep: list = []
        with torch.cuda.stream(self.copy_stream):
            value = self._to_device(item, copies, tensors, pinned, keep, "batch")
        token = self.stager.stage(copies) if copies else None
        del keep  # pageable sources were copied into pinned memory by stage()
        return _Staged(value, token, tensors, pinned, nbytes)

    def _to_device(self, value, copies, tensors, pinned, keep, where: str) -> Any:
        torch = _torch()
        if _arrays.is_torch(value):
            if value.device.type != "cpu":
                return value  # already on a device: passed through
            source = value.detach()
            if not source.is_contiguous():
                source = source.contiguous()
            if source.is_conj():
                source = source.resolve_conj()
            if source.is_neg():
                source = source.resolve_neg()
            destination = torch.empty(source.shape, dtype=source.dtype, device=self.device)
            is_pinned = bool(source.is_pinned())
            copies.append(
                (source.data_ptr(), destination.data_ptr(), source.numel() * source.element_size(),
                 is_pinned)
            )
            (pinned if is_pinned else keep).append(source)
            tensors.append(destination)
            return destination
        if isinstance(value, np.ndarray):
            dtype = _torch_dtype(value.dtype)
            if dtype is None:
                return value  # strings, objects, datetimes: not tensor data
            source = np.ascontiguousarray(value)
            destination = torch.empty(source.shape, dtype=dtype, device=self.device)
            copies.append((source.ctypes.data, destination.data_ptr(), source.nbytes, False))
            keep.append(source)
            tensors.append(destination)
            return destination
        if isinstance(value, (tuple, list)):
            items = [
                self._to_device(item, copies, tensors, pinned, keep, f"{where}[{i}]")
                for i, item in enumerate(value)
            ]
            return _rebuild(value, items)
        if isinstance(value, Mapping):
            items = {
                key: self._to_device(item, copies, tensors, pinned, keep, f"{where}[{key!r}]")
                for key, item in value.items()
            }
            try:
                return type(value)(items)
            except Exception:
                return items
        return value

    # ---- consumer ------------------------------------------------------------------------------
    def take(self) -> Any:
        """The next entry (a _Staged, _END or a _Failure); blocks, counting the wait."""
        with self.cv:
            now = time.perf_counter()
            if self.started_at is None:
                self.started_at = now
                self.window_start = now
            began = now
            while not self.queue:
                if self.finished:  # stopped, or ended without a sentinel
                    return _END
                self.cv.wait(_POLL_S)
            entry = self.queue.popleft()
            now = time.perf_counter()
            waited = now - began
            self.wait_s += waited
            self.window_wait_s += waited
            if isinstance(entry, _Staged):
                self.queued_bytes -= entry.nbytes
                self.consumed += 1
                self.window_batches += 1
                if self.controller is not None and self.window_batches >= self.window:
                    self._observe(now)
            else:
                self.ended_at = now
            self.cv.notify_all()
            return entry

    def _observe(self, now: float) -> None:
        capacity = None
        # The producer's capacity is what reaching the next batch in order has cost: with a
        # DataLoader whose window loader_ahead widens as the depth grows, a stalled batch counts
        # in it, yet a deeper queue (a wider window) is exactly what keeps the other workers busy
        # through the stall. The hold then stays off: depth is bounded by memory and max_depth.
        if self.busy_s > 0 and self.produced > 0 and not self.ahead.active:
            capacity = self.produced / self.busy_s
        decision = self.controller.observe(
            now - self.window_start,
            self.window_wait_s,
            self.window_batches,
            capacity,
            False,
            now - (self.started_at or now),
            self.consumed,
        )
        if decision is not None:
            depth, reason = decision
            self.timeline.append(
                {"time_s": now - (self.started_at or now), "batch": self.consumed,
                 "depth": depth, "reason": reason}
            )
            self.max_depth_reached = max(self.max_depth_reached, depth)
        self.window_start = now
        self.window_wait_s = 0.0
        self.window_batches = 0

    def hand_out(self, entry: _Staged) -> Any:
        """The batch, ready on the consumer's current stream."""
        if entry.token is not None:
            torch = _torch()
            stream = torch.cuda.current_stream(self.device)
            self.stager.wait(entry.token, stream.cuda_stream, not self.non_blocking)
            for tensor in entry.tensors:
                # The caching allocator reuses the memory only after the consumer's stream has
                # passed the point where the tensor was freed.
                tensor.record_stream(stream)
            if entry.pinned_sources:
                self.pending_sources.append((entry.token, entry.pinned_sources))
            while self.pending_sources and self.stager.done(self.pending_sources[0][0]):
                self.pending_sources.popleft()
        return entry.value

    def stop(self, join_timeout: float) -> None:
        """Stops the producer, drops the queued batches and waits (bounded) for the thread."""
        with self.cv:
            self.stopping = True
            if self.ended_at is None and self.started_at is not None:
                self.ended_at = time.perf_counter()
            queued = list(self.queue)
            self.queue.clear()
            self.queued_bytes = 0
            self.cv.notify_all()
        for entry in queued:
            self._discard(entry)
        if threading.current_thread() is not self.thread:
            self.thread.join(join_timeout)
        if self.pending_sources and self.stager is not None:
            if all(self.stager.done(token) for token, _ in self.pending_sources):
                self.pending_sources.clear()

    def stats(self) -> dict[str, Any]:
        with self.cv:
            end = self.ended_at if self.ended_at is not None else time.perf_counter()
            wall = end - self.started_at if self.started_at is not None else 0.0
            result = {
                "device": self.kind if self.kind == "cpu" else f"cuda:{self.device}",
                "wall_s": wall,
                "consumer_wait_s": self.wait_s,
                "wait_fraction": self.wait_s / wall if wall > 0 else 0.0,
                "batches": self.consumed,
                "depth": self._depth_now(),
                "max_depth_reached": self.max_depth_reached,
                "depth_upper_bound": self.controller.upper_bound if self.controller else None,
                "depth_timeline": list(self.timeline),
                "memory_budget_bytes": self.budget,
                "largest_batch_bytes": self.largest_batch,
                "producer_capacity_batches_per_s": (
                    self.produced / self.busy_s if self.busy_s > 0 else None
                ),
            }
            ahead = self.ahead
            result["loader_ahead"] = {"active": ahead.active, "reason": ahead.reason}
            if ahead.base:
                result["loader_ahead"].update(
                    base=ahead.base,
                    cap=ahead.cap,
                    extra_tasks=ahead.extra_tasks,
                    timeline=list(self.ahead_timeline),
                )
        if self.stager is not None:
            result["staging"] = self.stager.stats()
        return result


def _torch_dtype(dtype: np.dtype):
    """torch's dtype for a numeric numpy dtype, None for data that is not numbers."""
    if dtype.kind not in "biufc":
        return None
    torch = _torch()
    name = {"b": "bool"}.get(dtype.kind, dtype.name)
    result = getattr(torch, name, None)
    if result is None:
        raise InvalidArgumentError(f"numpy dtype {dtype} has no torch equivalent")
    return result


class Prefetcher:
    """What ``prefetch()`` returns: an iterable with ``len()`` (when the source has one) that makes
    one pass over the source per ``iter()``. Each pass runs its own producer thread, stopped at
    the end, on ``break`` (when the iterator is garbage collected), on an exception in the loop
    body, on ``close()`` and at interpreter exit."""

    def __init__(
        self,
        iterable: Iterable,
        device: Any = None,
        *,
        depth: int | None = None,
        memory_budget: int | None = None,
        non_blocking: bool = True,
        max_depth: int = 64,
        window_batches: int = 8,
        pinned_budget: int = 64 << 20,
        chunk_bytes: int = 8 << 20,
        copy_threads: int = 4,
        loader_ahead: Any = "auto",
    ) -> None:
        if not isinstance(iterable, Iterable):
            raise InvalidArgumentError(
                f"prefetch: expected an iterable, got {type(iterable).__name__}"
            )
        if depth is not None and (not isinstance(depth, int) or depth < 1):
            raise InvalidArgumentError(f"prefetch: depth {depth!r} must be None or an int >= 1")
        if max_depth < 1 or window_batches < 1:
            raise InvalidArgumentError("prefetch: max_depth and window_batches must be >= 1")
        if memory_budget is not None and memory_budget <= 0:
            raise InvalidArgumentError(f"prefetch: memory_budget {memory_budget} must be > 0")
        self._source = iterable
        self._loader_ahead = _loader_ahead_option(loader_ahead)
        self._kind, self._device = _resolve_device(device)
        self._depth = depth
        self._max_depth = max(max_depth, depth or 1)
        self._window_batches = window_batches
        self._non_blocking = non_blocking
        self._stager = None
        self._copy_stream = None
        if self._kind == "cuda":
            torch = _torch()
            self._stager = _shared_stager(self._device, pinned_budget, chunk_bytes, copy_threads)
            self._copy_stream = torch.cuda.ExternalStream(
                self._stager.stream, device=torch.device("cuda", self._device)
            )
            if memory_budget is None:
                free, _ = torch.cuda.mem_get_info(self._device)
                memory_budget = min(_MAX_DEFAULT_GPU_BUDGET, free // 2)
        elif memory_budget is None:
            memory_budget = _DEFAULT_CPU_BUDGET
        self._memory_budget = int(memory_budget)
        self._last: _Pass | None = None

    def __len__(self) -> int:
        """The source's len(); TypeError when it has none (as for an iterable-style dataset)."""
        try:
            return len(self._source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"prefetch: the source ({type(self._source).__name__}) has no len()"
            ) from None

    def __iter__(self) -> "_PrefetchIterator":
        if self._last is not None:
            # One pass at a time. The bounded join lets the old producer leave the source's
            # iterator first: a DataLoader with persistent workers hands the same one out again.
            self._last.stop(_JOIN_TIMEOUT_S)
        state = _Pass(self, iter(self._source))
        self._last = state
        return _PrefetchIterator(state)

    def stats(self) -> dict[str, Any]:
        """The last pass: wall_s, consumer_wait_s, wait_fraction, batches, depth and its timeline,
        memory budget, producer capacity, loader_ahead (active and why, the DataLoader's own
        window as base, the cap of batches requested ahead and its timeline, extra_tasks sent)
        and (GPU) the staging engine's copy figures."""
        return self._last.stats() if self._last is not None else {}

    def close(self) -> None:
        """Stops the running pass, if any."""
        if self._last is not None:
            self._last.stop(_JOIN_TIMEOUT_S)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _PrefetchIterator:
    """One pass; stops its producer when exhausted, closed or garbage collected."""

    def __init__(self, state: _Pass) -> None:
        self._state: _Pass | None = state

    def __iter__(self) -> "_PrefetchIterator":
        return self

    def __next__(self) -> Any:
        state = self._state
        if state is None:
            raise StopIteration
        try:
            entry = state.take()
        except BaseException:  # KeyboardInterrupt while waiting: stop the producer, re-raise
            self.close()
            raise
        if entry is _END:
            self.close()
            raise StopIteration
        if isinstance(entry, _Failure):
            self.close()
            error = entry.error
            note = "(raised by the source iterable in gpuopt.data.prefetch's producer thread)"
            if note not in getattr(error, "__notes__", ()):
                error.add_note(note)
            raise error
        try:
            return state.hand_out(entry)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stops the producer thread and drops the prefetched batches."""
        state, self._state = self._state, None
        if state is not None:
            state.stop(_JOIN_TIMEOUT_S)

    def __del__(self) -> None:
        state, self._state = getattr(self, "_state", None), None
        if state is not None:
            state.stop(0.0)  # the thread sees `stopping` and exits after its current item


def prefetch(
    iterable: Iterable,
    device: Any = None,
    *,
    depth: int | None = None,
    memory_budget: int | None = None,
    non_blocking: bool = True,
    loader_ahead: Any = "auto",
    **options: Any,
) -> Prefetcher:
    """Yields the batches of `iterable` on `device`, prepared ahead on a background thread.

    Batches are torch tensors, numpy arrays, or nested tuples/lists/dicts of them (other leaves,
    and tensors already on a GPU, pass through unchanged; numpy arrays become torch tensors on
    the GPU). ``device``: "cuda", "cuda:N", "cpu", or None for CUDA when available. ``depth``:
    None for the adaptive depth (starts at 2, grows while the consumer waits), or a fixed number
    of batches. ``memory_budget``: bytes the prefetched batches may occupy (device memory; host
    memory on the CPU path); default half the free device memory, at most 8 GiB (2 GiB on the
    CPU). ``non_blocking=False`` makes each handed-out batch complete on the host too.

    ``loader_ahead`` (keyword; "auto" by default): over torch's ``DataLoader`` with worker
    processes and a map-style dataset, the DataLoader yields batches in order and requests only
    ``prefetch_factor x num_workers`` ahead, so a batch that stalls idles the other workers and
    nothing arrives for a deeper queue. With "auto", once the adaptive depth has grown past 2 the
    pass's DataLoader iterator (never the DataLoader object) may request up to
    ``3 x depth + num_workers`` batches ahead, never fewer than its own window, within the
    memory budget (beside the prefetched batches), the batches it adds taking at most half the
    free space of /dev/shm (where worker batches travel); order and contents stay the same. An
    int caps the batches requested ahead; False leaves the DataLoader as it is.
    ``stats()["loader_ahead"]`` says whether it applied (and why not), and the cap over time.

    Advanced ``options``: max_depth, window_batches, pinned_budget, chunk_bytes, copy_threads.
    """
    return Prefetcher(
        iterable,
        device,
        depth=depth,
        memory_budget=memory_budget,
        non_blocking=non_blocking,
        loader_ahead=loader_ahead,
        **options,
    )


# ---- native sources ------------------------------------------------------------------------------
class _NativeSource:
    """A C++ Loader over a native dataset; one pass per ``iter()``."""

    def __init__(
        self,
        kind: str,
        path: str,
        *,
        record_bytes: int,
        io: str,
        height: int,
        width: int,
        shape: tuple[int, ...],
        dtype: str,
        batch_size: int,
        workers: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        device: Any,
        depth: int | None,
        memory_budget: int | None,
        pinned_budget: int,
        on_error: str,
        return_indices: bool,
    ) -> None:
        if on_error not in ("stop", "skip"):
            raise InvalidArgumentError(f"on_error {on_error!r}: expected 'stop' or 'skip'")
        if batch_size < 1 or workers < 1:
            raise InvalidArgumentError("batch_size and workers must be >= 1")
        if depth is not None and depth < 1:
            raise InvalidArgumentError(f"depth {depth!r} must be None or >= 1")
        self._kind, self._device = _resolve_device(device)
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = itertools.count()
        self._return_indices = return_indices
        self._native = _native.require().NativeLoader(
            kind, str(path), record_bytes, io, height, width, list(shape), dtype, batch_size,
            workers, shuffle, seed, drop_last, self._kind == "cuda", self._device,
            depth or 2, depth is None, max(64, depth or 1), pinned_budget, memory_budget or 0,
            on_error == "stop",
        )
        self._pass = 0

    def __len__(self) -> int:
        """Batches per pass (a final partial batch counts unless drop_last)."""
        return self._native.batches_per_epoch

    @property
    def dataset_size(self) -> int:
        """Samples in the source."""
        return self._native.dataset_size

    def describe(self) -> str:
        """What the source reads and how."""
        return self._native.describe()

    def __iter__(self) -> "_NativeIterator":
        epoch = next(self._epoch)
        # A new permutation per pass when shuffling, reproducible from (seed, pass number).
        seed = (self._seed + epoch * 0x9E3779B97F4A7C15) % 2**64 if self._shuffle else self._seed
        self._native.start(seed)
        self._pass += 1
        return _NativeIterator(self, self._pass)

    def stats(self) -> dict[str, Any]:
        """The C++ loader's statistics of the current or last pass (LoaderStats as JSON)."""
        return json.loads(self._native.stats_json())

    def close(self) -> None:
        """Stops the running pass; tensors already handed out stay valid until freed."""
        self._native.stop()


class _NativeIterator:
    def __init__(self, source: _NativeSource, number: int) -> None:
        self._source: _NativeSource | None = source
        self._number = number

    def __iter__(self) -> "_NativeIterator":
        return self

    def __next__(self) -> Any:
        source = self._source
        if source is None or source._pass != self._number:
            raise StopIteration  # closed, or a newer pass replaced this one
        stream = 0
        if source._kind == "cuda":
            stream = _torch().cuda.current_stream(source._device).cuda_stream
        try:
            result = source._native.next(stream)
        except BaseException:
            self.close()
            raise
        if result is None:
            self._source = None
            raise StopIteration
        data, indices = result
        return (data, indices) if source._return_indices else data

    def close(self) -> None:
        source, self._source = self._source, None
        if source is not None and source._pass == self._number:
            source._native.stop()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class RecordFile(_NativeSource):
    """Fixed-size records of one file, read by the C++ loader's threads (pread into pinned
    staging then a copy, or cuFile straight into device memory) and yielded as batches of shape
    ``[n, *shape]``: CUDA tensors on a GPU (zero-copy views of the loader's buffers, each given
    back when torch frees it), numpy arrays on the CPU path.

    ``io``: "auto" (cuFile when usable, else pread), "pread" or "cufile". ``on_error``: "stop"
    raises DataLossError naming the record; "skip" drops bad records from their batch.
    """

    def __init__(
        self,
        path: str,
        record_bytes: int,
        *,
        batch_size: int,
        shape: tuple[int, ...] | None = None,
        dtype: str = "uint8",
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        workers: int = 4,
        io: str = "auto",
        device: Any = None,
        depth: int | None = None,
        memory_budget: int | None = None,
        pinned_budget: int = 256 << 20,
        on_error: str = "stop",
        return_indices: bool = False,
    ) -> None:
        if record_bytes < 1:
            raise InvalidArgumentError(f"record_bytes {record_bytes} must be >= 1")
        super().__init__(
            "record", path, record_bytes=record_bytes, io=io, height=0, width=0,
            shape=tuple(shape) if shape is not None else (record_bytes,), dtype=dtype,
            batch_size=batch_size, workers=workers, shuffle=shuffle, seed=seed,
            drop_last=drop_last, device=device, depth=depth, memory_budget=memory_budget,
            pinned_budget=pinned_budget, on_error=on_error, return_indices=return_indices,
        )


class JpegFolder(_NativeSource):
    """Every ``*.jpg``/``*.jpeg`` of a folder (sorted by name), decoded by libjpeg-turbo on the C++
    loader's threads and resized to ``height x width``: batches of uint8 ``[n, height, width, 3]``
    (RGB), CUDA tensors on a GPU, numpy arrays on the CPU path."""

    def __init__(
        self,
        folder: str,
        *,
        batch_size: int,
        height: int = 224,
        width: int = 224,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        workers: int = 4,
        device: Any = None,
        depth: int | None = None,
        memory_budget: int | None = None,
        pinned_budget: int = 256 << 20,
        on_error: str = "stop",
        return_indices: bool = False,
    ) -> None:
        if height < 1 or width < 1:
            raise InvalidArgumentError(f"height {height} and width {width} must be >= 1")
        super().__init__(
            "jpeg", folder, record_bytes=0, io="pread", height=height, width=width,
            shape=(height, width, 3), dtype="uint8", batch_size=batch_size, workers=workers,
            shuffle=shuffle, seed=seed, drop_last=drop_last, device=device, depth=depth,
            memory_budget=memory_budget, pinned_budget=pinned_budget, on_error=on_error,
            return_indices=return_indices,
        )


@atexit.register
def _stop_everything() -> None:
    """At interpreter exit: stop every running pass (bounded join), then the staging engines."""
    for state in list(_live_passes):
        try:
            state.stop(0.5)
        except Exception:
            pass
    with _stagers_lock:
        stagers = list(_stagers.values())
        _stagers.clear()
    for stager in stagers:
        try:
            stager.close()
        except Exception:
            pass
