"""gpuopt.quant: 4-bit GPTQ/AWQ checkpoint layers as W4A16 torch modules.

>>> import torch, gpuopt.quant as q
>>> layer = q.load_layer("/models/llama-gptq", "model.layers.0.mlp.down_proj")
>>> linear = q.W4A16Linear(layer).cuda()
>>> y = linear(torch.randn(4, layer.k, dtype=torch.float16, device="cuda"))

``load_layer`` reads one layer's tensors (qweight, scales, qzeros, g_idx) from a safetensors file or
a checkpoint directory (``model.safetensors.index.json`` shards, or one ``model.safetensors``) and
repacks them into the W4A16 kernel layout on the CPU; it needs neither torch nor a GPU, and
``QuantizedLayer.reference`` runs the kernel's CPU twin. ``W4A16Linear`` keeps that layout in torch
buffers. Eager calls run the layer's cached plan directly on the current torch stream (the
custom op's Python dispatch would cost more than the kernel at M=1); under ``torch.compile`` it
calls the ``torch.ops.gpuopt.w4a16_gemm`` custom op, which has a fake (meta) implementation, so
Dynamo traces it. CUDA graphs capture either (warm up once outside capture: the first call per
input row count plans the kernel).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import _native
from .errors import InvalidArgumentError, NotFoundError

__all__ = ["QuantizedLayer", "load_layer", "W4A16Linear", "w4a16_gemm"]  # noqa: F822 (__getattr__)

_CONFIG_FILES = ("quantize_config.json", "quant_config.json", "config.json")


@dataclass(frozen=True)
class QuantizedLayer:
    """One W4A16 layer in the kernel layout (host numpy arrays): y[M, N] = x[M, K] @ W."""

    k: int
    n: int
    group_size: int
    dtype: str  # "float16" or "bfloat16": the activation type the scales were rounded to
    has_zeros: bool
    tiles: np.ndarray  # uint32, K*N/8 words
    scales: np.ndarray  # uint16 bits of `dtype`, [groups * N] in the kernel's order
    zeros: np.ndarray  # uint8, empty when symmetric
    perm: np.ndarray  # int32 [K] act-order permutation, empty = identity

    def reference(self, x: Any) -> np.ndarray:
        """The GEMM's CPU twin: x [M, K] (real numbers, rounded to `dtype`) -> float32 [M, N]."""
        array = np.asarray(x, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != self.k:
            raise InvalidArgumentError(f"x: expected [M, {self.k}], got shape {array.shape}")
        bits = _to_bits(np.ascontiguousarray(array), self.dtype).reshape(-1)
        y = _native.require().quant_reference(
            self.k,
            self.n,
            self.group_size,
            self.dtype,
            self.has_zeros,
            self.tiles,
            self.scales,
            self.zeros,
            self.perm,
            bits,
            array.shape[0],
        )
        return y.reshape(array.shape[0], self.n)


def _to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> fp16 or bf16 bit patterns (uint16), round to nearest even."""
    if dtype == "float16":
        return x.astype(np.float16).view(np.uint16)
    words = x.view(np.uint32).astype(np.uint64)
    rounded = (words + 0x7FFF + ((words >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _find_config(directory: str) -> str:
    for name in _CONFIG_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                return handle.read()
    raise NotFoundError(f"no {', '.join(_CONFIG_FILES)} in {directory}; pass config=")


def _shard_for(directory: str, layer: str) -> str:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            weight_map = json.load(handle).get("weight_map", {})
        shard = weight_map.get(f"{layer}.qweight")
        if shard is None:
            raise NotFoundError(f"{index} has no tensor {layer}.qweight")
        return os.path.join(directory, shard)
    single = os.path.join(directory, "model.safetensors")
    if os.path.isfile(single):
        return single
    raise NotFoundError(
        f"{directory} has neither model.safetensors.index.json nor model.safetensors"
    )


def load_layer(
    path: str | os.PathLike[str],
    layer: str,
    *,
    config: Mapping[str, Any] | str | None = None,
    dtype: str = "float16",
) -> QuantizedLayer:
    """Reads layer `layer` (the prefix of ``LAYER.qweight``) of a GPTQ or AWQ checkpoint.

    Args:
        path: a .safetensors file, or a checkpoint directory (sharded with
            model.safetensors.index.json, or one model.safetensors).
        config: the quantization config as a dict or JSON text; None = quantize_config.json,
            quant_config.json or config.json ("quantization_config") beside the weights.
        dtype: activation type, "float16" or "bfloat16".

    Raises NotFoundError for a missing file or tensor, InvalidArgumentError for shapes, formats
    or configs the kernel cannot take (the message names the tensor and the mismatch).
    """
    if dtype not in ("float16", "bfloat16"):
        raise InvalidArgumentError(f"dtype: {dtype!r}; expected 'float16' or 'bfloat16'")
    path = os.fspath(path)
    if os.path.isdir(path):
        directory, file = path, _shard_for(path, layer)
    elif os.path.isfile(path):
        directory, file = os.path.dirname(os.path.abspath(path)), path
    else:
        raise NotFoundError(f"{path}: no such file or directory")
    if config is None:
        config_text = _find_config(directory)
    elif isinstance(config, str):
        config_text = config
    else:
        config_text = json.dumps(dict(config))
    fields = _native.require().quant_load_layer(file, layer, config_text, dtype)
    return QuantizedLayer(**fields)


# ---- torch ----

_op_lock = threading.Lock()
_op_registered = False
# (device, M, dtype, K, N, group size, zeros?, weight pointers) -> (plan, workspace tensor). A plan
# is a function of exactly these, so an entry stays right even if a freed layer's memory is reused.
_plans: dict[tuple, tuple[Any, Any]] = {}


def _clear_plans() -> None:
    """Drops the cached plans (and their workspaces) before the interpreter tears modules down."""
    _plans.clear()


atexit.register(_clear_plans)
_raw_stream: Any = None


def _current_stream(device: Any) -> int:
    """The caller's current torch stream on `device` as an integer cudaStream_t.

    torch's raw-stream getter (what Triton's launcher uses) returns the handle without building a
    torch.cuda.Stream object; the public path is the fallback when a torch build lacks it.
    """
    global _raw_stream
    import torch

    if _raw_stream is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else (
            lambda index: torch.cuda.current_stream(index).cuda_stream
        )
    index = device.index
    return _raw_stream(torch.cuda.current_device() if index is None else index)


def _dtype_name(tensor: Any) -> str:
    import torch

    names = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if tensor.dtype not in names:
        raise InvalidArgumentError(
            f"x: dtype {tensor.dtype}; expected torch.float16 or torch.bfloat16"
        )
    return names[tensor.dtype]


def _plan(
    x: Any,
    y: Any,
    tiles: Any,
    scales: Any,
    zeros: Any,
    perm: Any,
    k: int,
    n: int,
    group_size: int,
    has_zeros: bool,
) -> Any:
    import torch

    dtype = _dtype_name(x)
    key = (
        x.device.index or 0,
        x.shape[0],
        dtype,
        k,
        n,
        group_size,
        has_zeros,
        tiles.data_ptr(),
        scales.data_ptr(),
        zeros.data_ptr(),
        perm.data_ptr(),
    )
    entry = _plans.get(key)
    if entry is None:
        native = _native.require()
        plan = native.W4A16Plan(
            x.shape[0],
            k,
            n,
            group_size,
            dtype,
            has_zeros,
            tiles.data_ptr(),
            scales.data_ptr(),
            zeros.data_ptr() if has_zeros else 0,
            perm.data_ptr() if perm.numel() else 0,
        )
        stream = _current_stream(x.device)
        workspace = torch.empty(
            max(1, plan.workspace_size(x.data_ptr(), y.data_ptr())),
            dtype=torch.uint8,
            device=x.device,
        )
        plan.initialize(x.data_ptr(), y.data_ptr(), workspace.data_ptr(), stream)
        entry = _plans[key] = (plan, workspace)
    return entry[0]


def _register_op() -> None:
    """Defines torch.ops.gpuopt.w4a16_gemm and its fake implementation (once)."""
    global _op_registered
    with _op_lock:
        if _op_registered:
            return
        import torch

        def w4a16_gemm_impl(x, tiles, scales, zeros, perm, k, n, group_size, has_zeros):
            y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
            if x.shape[0] == 0:
                return y
            plan = _plan(x, y, tiles, scales, zeros, perm, k, n, group_size, has_zeros)
            plan.run(x.data_ptr(), y.data_ptr(), _current_stream(x.device))
            return y

        # torch infers the op's schema from the annotations; this module's annotations are strings
        # (from __future__ import annotations) that name torch, which is imported only here, so
        # the real types are given directly.
        tensor = torch.Tensor
        w4a16_gemm_impl.__annotations__ = {
            "x": tensor, "tiles": tensor, "scales": tensor, "zeros": tensor, "perm": tensor,
            "k": int, "n": int, "group_size": int, "has_zeros": bool, "return": tensor,
        }
        w4a16_gemm_op = torch.library.custom_op("gpuopt::w4a16_gemm", mutates_args=())(
            w4a16_gemm_impl
        )

        @w4a16_gemm_op.register_fake
        def _(x, tiles, scales, zeros, perm, k, n, group_size, has_zeros):
            return x.new_empty((x.shape[0], n))

        _op_registered = True


def w4a16_gemm(x: Any, layer: Any) -> Any:
    """y[M, N] = x[M, K] @ W on x's current torch stream (x: fp16/bf16 CUDA, contiguous)."""
    import torch

    _register_op()
    return torch.ops.gpuopt.w4a16_gemm(
        x,
        layer.tiles,
        layer.scales,
        layer.zeros,
        layer.perm,
        layer.in_features,
        layer.out_features,
        layer.group_size,
        layer.has_zeros,
    )


def _make_linear_class() -> type:
    import torch

    _register_op()
    # True while torch.compile (Dynamo) traces: the custom op is what it can see through.
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (
        lambda: False
    )

    class W4A16LinearModule(torch.nn.Module):
        """y = x @ W (+ bias), W 4-bit in the W4A16 kernel layout (see gpuopt.quant.W4A16Linear)."""

        def __init__(self, layer: QuantizedLayer, bias: Any = None, device: Any = None) -> None:
            super().__init__()
            if not isinstance(layer, QuantizedLayer):
                raise InvalidArgumentError(
                    f"layer: expected QuantizedLayer, got {type(layer).__name__}"
                )
            self.in_features = layer.k
            self.out_features = layer.n
            self.group_size = layer.group_size
            self.has_zeros = layer.has_zeros
            self.dtype_name = layer.dtype
            self._torch_dtype = getattr(torch, layer.dtype)
            self._eager_plans: dict[int, tuple[int, Any]] = {}

            def as_tensor(array: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(np.ascontiguousarray(array)).to(device)

            self.register_buffer("tiles", as_tensor(layer.tiles.view(np.int32)))
            self.register_buffer("scales", as_tensor(layer.scales.view(np.int16)))
            self.register_buffer("zeros", as_tensor(layer.zeros))
            self.register_buffer("perm", as_tensor(layer.perm))
            if bias is not None:
                bias = torch.as_tensor(bias)
                if bias.shape != (layer.n,):
                    raise InvalidArgumentError(
                        f"bias: shape {tuple(bias.shape)}, expected ({layer.n},)"
                    )
                self.register_buffer(
                    "bias", bias.to(device=device, dtype=getattr(torch, layer.dtype))
                )
            else:
                self.bias = None

        def extra_repr(self) -> str:
            return (
                f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, dtype={self.dtype_name}, "
                f"bias={self.bias is not None}"
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not x.is_cuda:
                raise InvalidArgumentError(f"x: on {x.device}; W4A16Linear runs on CUDA tensors")
            if x.dtype != self._torch_dtype:
                _dtype_name(x)  # names an unsupported dtype
                raise InvalidArgumentError(
                    f"x: dtype {x.dtype}, this layer was loaded for {self.dtype_name}"
                )
            if x.shape[-1] != self.in_features:
                raise InvalidArgumentError(
                    f"x: shape {tuple(x.shape)}, expected [..., {self.in_features}]"
                )
            if self.tiles.device != x.device:
                raise InvalidArgumentError(
                    f"x: on {x.device}, the layer's weights on {self.tiles.device}"
                )
            if not x.is_contiguous():
                raise InvalidArgumentError(f"x: strides {tuple(x.stride())} are not contiguous")
            leading = x.shape[:-1]
            x2d = x.reshape(-1, self.in_features)
            if not is_compiling():
                y = self._run_eager(x2d)
            else:
                y = self._run_op(x2d)
            y = y.reshape(*leading, self.out_features)
            return y + self.bias if self.bias is not None else y

        def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            # .to(), .cuda(), .half(), ... give the buffers new storage: plan again on next use.
            self._eager_plans.clear()
            return super()._apply(fn, *args, **kwargs)

        def _run_eager(self, x2d: torch.Tensor) -> torch.Tensor:
            # The plan of this layer for this M, called directly: the custom op's Python dispatch
            # costs tens of microseconds per call, longer than the kernel at M=1 on most shapes.
            m = x2d.shape[0]
            y = torch.empty((m, self.out_features), dtype=x2d.dtype, device=x2d.device)
            if m == 0:
                return y
            tiles = self.tiles.data_ptr()
            entry = self._eager_plans.get(m)
            if entry is None or entry[0] != tiles:
                plan = _plan(
                    x2d, y, self.tiles, self.scales, self.zeros, self.perm, self.in_features,
                    self.out_features, self.group_size, self.has_zeros,
                )
                entry = self._eager_plans[m] = (tiles, plan)
            entry[1].run(x2d.data_ptr(), y.data_ptr(), _current_stream(x2d.device))
            return y

        def _run_op(self, x2d: torch.Tensor) -> torch.Tensor:
            # The op itself, not w4a16_gemm(): nothing here that torch.compile cannot trace.
            return torch.ops.gpuopt.w4a16_gemm(
                x2d,
                self.tiles,
                self.scales,
                self.zeros,
                self.perm,
                self.in_features,
                self.out_features,
                self.group_size,
                self.has_zeros,
            )

    W4A16LinearModule.__name__ = "W4A16Linear"
    W4A16LinearModule.__qualname__ = "W4A16Linear"
    W4A16LinearModule.__module__ = __name__
    return W4A16LinearModule


_linear_class: type | None = None


def __getattr__(name: str) -> Any:
    """``W4A16Linear`` is built on first access, so importing gpuopt.quant never imports torch.

    W4A16Linear(layer: QuantizedLayer, bias: torch.Tensor | None = None, device=None) is a
    ``torch.nn.Module``: y = x @ W (+ bias) for x fp16/bf16 CUDA [..., in_features].
    """
    global _linear_class
    if name == "W4A16Linear":
        if _linear_class is None:
            _linear_class = _make_linear_class()
        return _linear_class
    raise AttributeError(f"module 'gpuopt.quant' has no attribute {name!r}")
