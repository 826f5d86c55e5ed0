"""Loads the extension module `gpuopt._gpuopt`, or records why it could not be loaded.

A wheel built with CUDA links the CUDA runtime and cuBLAS. Where the system loader cannot find
them but PyTorch's `nvidia-*` wheels provide them, those are preloaded and the import is retried.
When the extension still cannot load, `gpuopt` imports anyway and every call that needs it raises
GpuUnavailableError naming the missing library.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import sys
from types import ModuleType

from .errors import GpuUnavailableError

__all__ = ["native", "load_error"]


def _nvidia_library_dirs() -> list[str]:
    """lib/ folders of installed nvidia-* wheels (cuda_runtime, cublas, ...), if any."""
    dirs = []
    for entry in sys.path:
        root = os.path.join(entry, "nvidia")
        if os.path.isdir(root):
            dirs.extend(sorted(glob.glob(os.path.join(root, "*", "lib"))))
            dirs.extend(sorted(glob.glob(os.path.join(root, "cu*", "lib"))))
    return dirs


def _preload_cuda_libraries(missing: str) -> bool:
    """Preloads CUDA libraries matching the missing soname from nvidia-* wheels; True if any."""
    loaded = False
    # Load the runtime first: cuBLAS depends on it.
    for pattern in ("libcudart.so.*", "libcublasLt.so.*", "libcublas.so.*", "libcupti.so.*"):
        for directory in _nvidia_library_dirs():
            for path in sorted(glob.glob(os.path.join(directory, pattern))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    loaded = True
                except OSError:
                    pass
    return loaded


def _load() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module("gpuopt._gpuopt"), ""
    except ImportError as first:
        message = str(first)
        if "libcu" in message and _preload_cuda_libraries(message):
            try:
                return importlib.import_module("gpuopt._gpuopt"), ""
            except ImportError as second:
                message = str(second)
        return None, message


native, load_error = _load()


def require() -> ModuleType:
    """The extension module; GpuUnavailableError naming the reason when it could not load."""
    if native is None:
        raise GpuUnavailableError(
            "the gpuopt native library could not be loaded: "
            f"{load_error} (a wheel built with CUDA needs the CUDA 13 runtime and cuBLAS: "
            "install them, or import torch first when its nvidia-* wheels provide them)"
        )
    return native
