"""gpuopt.runtime: priority streams and green-context SM partitions, as streams PyTorch can use.

>>> import torch, gpuopt.runtime as rt
>>> with rt.PartitionPlan([rt.WorkloadSpec("critical", min_sms=16, priority="critical"),
...                        rt.WorkloadSpec("background")]) as plan:
...     with torch.cuda.stream(plan.torch_stream("critical")):
...         ...  # kernels here run on the critical partition's SMs only

Streams are cudaStream_t values as integers; ``torch_stream()`` wraps one in
``torch.cuda.ExternalStream``. The pool or plan that made a stream owns it: keep it alive while the
stream is in use. While a plan is alive on a device, StreamPool on that device raises
FailedPreconditionError (all work takes its streams from the plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _native
from .errors import InvalidArgumentError, NotFoundError

__all__ = [
    "PRIORITIES",
    "device_properties",
    "stream_sm_count",
    "StreamPool",
    "WorkloadSpec",
    "Workload",
    "PartitionPlan",
]

#: Named stream priority levels, highest first.
PRIORITIES = ("critical", "high", "normal", "background")


def _external_stream(handle: int, device: int) -> Any:
    import torch

    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))


def device_properties(device: int = 0) -> dict[str, Any]:
    """Name, SM count, compute capability, memory, priority range and driver/runtime versions.

    Raises GpuUnavailableError without a usable GPU (or in a build without CUDA).
    """
    return _native.require().device_properties(device)


def stream_sm_count(stream: Any) -> int:
    """SMs that work on `stream` may use: its green context's SM count when it belongs to one,
    else its device's. `stream` is a torch stream or a cudaStream_t integer."""
    return _native.require().stream_sm_count(int(getattr(stream, "cuda_stream", stream)))


class StreamPool:
    """Non-blocking streams at four named priorities (critical, high, normal, background), handed
    out round-robin. Create once at start-up; the pool owns its streams."""

    def __init__(self, device: int = 0, streams_per_level: int = 2) -> None:
        """Creates `streams_per_level` streams per level on CUDA device `device`."""
        self._native = _native.require().StreamPool(device, streams_per_level)
        self._device = device

    def next(self, priority: str = "normal") -> int:
        """The next stream of a level as a cudaStream_t integer."""
        return self._native.next(priority)

    def torch_stream(self, priority: str = "normal") -> Any:
        """The next stream of a level as a ``torch.cuda.ExternalStream``."""
        return _external_stream(self.next(priority), self._device)

    def priority_value(self, priority: str) -> int:
        """The CUDA priority number the level maps to on this device."""
        return self._native.priority_value(priority)

    @property
    def streams_per_level(self) -> int:
        """Streams per priority level."""
        return self._native.streams_per_level


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload to place: its SMs (min_sms, rounded up by the driver; 0 = what the others leave,
    at most one such), its stream priority and how many streams it gets."""

    name: str
    min_sms: int = 0
    priority: str = "normal"
    streams: int = 1


@dataclass(frozen=True)
class Workload:
    """A placed workload: its SMs (the whole device in fallback mode) and its streams."""

    name: str
    sm_count: int
    priority: int
    streams: tuple[int, ...] = field(default_factory=tuple)


class PartitionPlan:
    """Green-context SM partitions, one per workload, each with its own streams. Falls back to
    priority streams (``isolated`` False, ``fallback_reason`` says why) when the driver has no
    green contexts, unless allow_fallback=False. A context manager; close() destroys the streams."""

    def __init__(
        self, workloads: list[WorkloadSpec], device: int = 0, *, allow_fallback: bool = True
    ) -> None:
        """Validates the specs (unique names, at most one rest, SMs asked <= the device's)."""
        specs = []
        for spec in workloads:
            if not isinstance(spec, WorkloadSpec):
                raise InvalidArgumentError(
                    f"workloads: expected WorkloadSpec, got {type(spec).__name__}"
                )
            specs.append((spec.name, spec.min_sms, spec.priority, spec.streams))
        self._native = _native.require().PartitionPlan(device, specs, allow_fallback)
        self._device = device

    @property
    def isolated(self) -> bool:
        """True when the workloads run on disjoint SM sets (green contexts)."""
        return self._native.isolated

    @property
    def fallback_reason(self) -> str:
        """Empty when isolated; else why green contexts were not used."""
        return self._native.fallback_reason

    def describe(self) -> str:
        """E.g. "critical: 16 SMs, 1 stream; background: 116 SMs, 1 stream (green contexts)"."""
        return self._native.describe()

    def workloads(self) -> list[Workload]:
        """Every placed workload."""
        return [
            Workload(w["name"], w["sm_count"], w["priority"], tuple(w["streams"]))
            for w in self._native.workloads()
        ]

    def workload(self, name: str) -> Workload:
        """The workload `name`; NotFoundError naming the known ones."""
        placed = self.workloads()
        for workload in placed:
            if workload.name == name:
                return workload
        raise NotFoundError(f"no workload {name!r} in the plan (have {[w.name for w in placed]})")

    def torch_stream(self, name: str, index: int = 0) -> Any:
        """Stream `index` of workload `name` as a ``torch.cuda.ExternalStream``."""
        streams = self.workload(name).streams
        if not 0 <= index < len(streams):
            raise InvalidArgumentError(
                f"workload {name!r} has {len(streams)} streams, not index {index}"
            )
        return _external_stream(streams[index], self._device)

    def close(self) -> None:
        """Destroys the partitions and their streams (after the work queued on them is done)."""
        self._native.close()

    def __enter__(self) -> "PartitionPlan":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
