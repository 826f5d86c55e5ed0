"""Exceptions raised by gpuopt: one class per status code of the C++ library, all under `Error`.

Each carries the C++ message (``str(error)``) and its canonical code name (``error.code``). Where a
Python built-in fits, the class also derives from it, so ``except ValueError`` and
``except FileNotFoundError`` work as a Python user expects.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "GpuUnavailableError",
    "DataLossError",
]


class Error(Exception):
    """Base class of every gpuopt error; ``code`` is the canonical status name."""

    code: str = "UNKNOWN"


class CancelledError(Error):
    """The operation was cancelled (CANCELLED)."""

    code = "CANCELLED"


class UnknownError(Error):
    """An error without a more specific code (UNKNOWN)."""

    code = "UNKNOWN"


class InvalidArgumentError(Error, ValueError):
    """A bad argument: wrong shape, dtype, device, value or syntax (INVALID_ARGUMENT)."""

    code = "INVALID_ARGUMENT"


class DeadlineExceededError(Error, TimeoutError):
    """A deadline passed (DEADLINE_EXCEEDED)."""

    code = "DEADLINE_EXCEEDED"


class NotFoundError(Error, FileNotFoundError):
    """A file, collection, id or tensor does not exist (NOT_FOUND)."""

    code = "NOT_FOUND"


class AlreadyExistsError(Error, FileExistsError):
    """What was to be created already exists, e.g. an id given to add() (ALREADY_EXISTS)."""

    code = "ALREADY_EXISTS"


class PermissionDeniedError(Error, PermissionError):
    """The operating system or the driver refused access (PERMISSION_DENIED)."""

    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error, MemoryError):
    """Out of memory (host or device) or of another resource (RESOURCE_EXHAUSTED)."""

    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error, RuntimeError):
    """The call is not allowed in the current state, e.g. a closed store (FAILED_PRECONDITION)."""

    code = "FAILED_PRECONDITION"


class AbortedError(Error, RuntimeError):
    """The operation was aborted, e.g. by a concurrent conflict (ABORTED)."""

    code = "ABORTED"


class OutOfRangeError(Error, IndexError):
    """A value past the end of a valid range (OUT_OF_RANGE)."""

    code = "OUT_OF_RANGE"


class UnimplementedError(Error, NotImplementedError):
    """Not supported here (UNIMPLEMENTED); for missing CUDA, GpuUnavailableError is raised."""

    code = "UNIMPLEMENTED"


class InternalError(Error, RuntimeError):
    """A bug in gpuopt (INTERNAL); please report it with the message."""

    code = "INTERNAL"


class GpuUnavailableError(Error, RuntimeError):
    """No usable GPU: no driver, no device, or gpuopt built without CUDA (UNAVAILABLE).

    The message says which. Calls that need a GPU raise it; everything else keeps working.
    """

    code = "UNAVAILABLE"


class DataLossError(Error, OSError):
    """Stored data is corrupt or truncated; the message names the file (DATA_LOSS)."""

    code = "DATA_LOSS"


_BY_CODE: dict[int, type[Error]] = {
    1: CancelledError,
    2: UnknownError,
    3: InvalidArgumentError,
    4: DeadlineExceededError,
    5: NotFoundError,
    6: AlreadyExistsError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    10: AbortedError,
    11: OutOfRangeError,
    12: UnimplementedError,
    13: InternalError,
    14: GpuUnavailableError,
    15: DataLossError,
}

_NO_CUDA_MARKERS = ("without cuda", "build with cuda")


def _exception_for_status(code: int, message: str) -> Error:
    """The exception for a failed C++ Status (called by the extension's error translator).

    UNIMPLEMENTED because the build has no CUDA becomes GpuUnavailableError, since for a Python
    user both mean "this needs a GPU that gpuopt cannot use here".
    """
    cls = _BY_CODE.get(code, UnknownError)
    if cls is UnimplementedError and any(m in message.lower() for m in _NO_CUDA_MARKERS):
        cls = GpuUnavailableError
    return cls(message)
