"""gpuopt for Python: the embedded vector store, W4A16 layers, SM partitions and doctor.

Modules:
    gpuopt.vector   open or create a vector store; add, query, delete with metadata filters.
    gpuopt.quant    GPTQ/AWQ checkpoints as ``W4A16Linear`` torch modules (needs torch and a GPU).
    gpuopt.runtime  priority stream pool and green-context SM partitions as torch streams.
    gpuopt.bench    run a ``gpuopt bench`` suite and get its JSON as a dict.
    gpuopt.data     prefetch batches to the GPU; record-file and JPEG-folder sources.
    gpuopt.errors   the exception classes (also exported here).

``gpuopt.doctor()`` returns what ``gpuopt doctor --json`` prints. The package imports on machines
without CUDA or a GPU; calls that need one raise ``GpuUnavailableError`` saying why.
"""

from __future__ import annotations

from . import errors
from ._doctor import doctor
from ._native import native as _native_module
from .errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    GpuUnavailableError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnimplementedError,
    UnknownError,
)

__all__ = [
    "__version__",
    "built_with_cuda",
    "doctor",
    "errors",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "Error",
    "FailedPreconditionError",
    "GpuUnavailableError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnimplementedError",
    "UnknownError",
]

try:
    from importlib.metadata import version as _version

    __version__: str = _version("gpuopt")
except Exception:  # not installed as a distribution (e.g. a source tree on sys.path)
    __version__ = "0+unknown"

#: True when the native library was built with CUDA (GPU calls can work where a GPU exists).
built_with_cuda: bool = bool(_native_module is not None and _native_module.built_with_cuda)


def __getattr__(name: str):
    """Imports the submodules lazily, so ``import gpuopt`` never imports torch."""
    if name in ("vector", "runtime", "quant", "bench", "data"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gpuopt' has no attribute {name!r}")
