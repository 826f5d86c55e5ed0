"""Array intake shared by the modules: numpy, torch (CPU and CUDA) and other DLPack producers.

Host arrays (numpy, lists) are converted as numpy would; torch tensors and other DLPack objects
are taken as they are, so a CUDA tensor is never copied to the host behind the caller's back, and
a wrong dtype, shape, device or stride is an InvalidArgumentError naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["is_torch", "is_cuda_torch", "host_matrix", "host_ids", "torch_stream_handle"]


def is_torch(value: Any) -> bool:
    """True for a torch.Tensor (checked without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__")


def is_cuda_torch(value: Any) -> bool:
    """True for a torch.Tensor on a CUDA device."""
    return is_torch(value) and getattr(value, "is_cuda", False)


def host_matrix(value: Any, what: str, columns: int | None = None) -> np.ndarray:
    """A C-contiguous float32 [rows, columns] numpy array from numpy, lists or CPU tensors."""
    if is_torch(value):
        if value.is_cuda:
            raise InvalidArgumentError(f"{what}: a CUDA tensor is not accepted here")
        value = value.detach().numpy()
    elif not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        try:
            value = np.from_dlpack(value)
        except Exception as error:  # e.g. device memory numpy cannot read
            raise InvalidArgumentError(f"{what}: cannot read it on the host ({error})") from None
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"{what}: dtype {array.dtype} is not a real number type")
    if array.ndim != 2:
        raise InvalidArgumentError(
            f"{what}: expected a 2-D [rows, dim] array, got shape {array.shape}"
        )
    if columns is not None and array.shape[1] != columns:
        raise InvalidArgumentError(
            f"{what}: shape {tuple(array.shape)} has dimension {array.shape[1]}, expected {columns}"
        )
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        raise InvalidArgumentError(f"{what}: contains NaN or infinity")
    return np.ascontiguousarray(array, dtype=np.float32)


def host_ids(value: Any, count: int | None, what: str = "ids") -> np.ndarray:
    """A C-contiguous uint64 vector of ids in [0, 2**63) from integers, lists, arrays or tensors."""
    if is_torch(value):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise InvalidArgumentError(f"{what}: expected a 1-D sequence, got shape {array.shape}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: dtype {array.dtype} is not an integer type")
    if count is not None and array.shape[0] != count:
        raise InvalidArgumentError(f"{what}: {array.shape[0]} ids for {count} vectors")
    if array.size and (array.min() < 0 or (array.dtype.kind == "u" and array.max() >= 2**63)):
        raise InvalidArgumentError(f"{what}: ids must be in [0, 2**63)")
    return np.ascontiguousarray(array, dtype=np.uint64)


def torch_stream_handle(tensor: Any, stream: Any) -> int:
    """The cudaStream_t (an integer) to use for `tensor`: `stream` when given (an int or a torch
    stream), else torch's current stream on the tensor's device."""
    if stream is not None:
        return int(getattr(stream, "cuda_stream", stream))
    import torch

    return int(torch.cuda.current_stream(tensor.device).cuda_stream)
