"""gpuopt.amp: a drop-in for ``torch.amp.GradScaler("cuda")`` with gpuopt's fused kernels.

>>> from gpuopt.amp import GradScaler        # instead of: from torch.amp import GradScaler
>>> scaler = GradScaler("cuda")
>>> scaler.scale(loss).backward()
>>> norm = scaler.unscale_and_clip_(optimizer, max_norm=1.0)   # or scaler.unscale_(optimizer)
>>> scaler.step(optimizer)
>>> scaler.update()

``GradScaler`` keeps torch's public API, state machine and ``state_dict`` keys (it derives from
``torch.amp.GradScaler``, so ``isinstance`` checks in training frameworks still hold), and
replaces the work on the gradients:

* ``unscale_`` is one launch over all of an optimizer's CUDA gradients (gpuopt's
  ``TensorListScaler``), unscaling and checking for inf/NaN, queued on the current torch stream
  with no host synchronisation;
* ``unscale_and_clip_(optimizer, max_norm)`` replaces ``unscale_`` followed by
  ``torch.nn.utils.clip_grad_norm_``: one read of the gradients computes found-inf and the global
  L2 norm of the unscaled values, a one-block kernel turns it into torch's clip factor on the
  device, and the factor is applied either by a second multiply pass or, with an optimizer that
  takes ``grad_scale`` (torch's fused Adam/AdamW/SGD), through ``grad_scale = scale / factor``
  with no pass of its own. It returns the total norm as a device tensor, as clip_grad_norm_ does.

Host synchronisations are torch's: none for an optimizer that takes ``found_inf`` (its kernel
skips itself on the device), one ``found_inf`` read per step for any other optimizer, to decide
whether to call its ``step`` at all. The scale update is torch's own ``_amp_update_scale_``.
See docs/amp.md.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections import abc, defaultdict
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from . import _native
from .errors import InvalidArgumentError

__all__ = ["GradScaler", "OptState"]

# dtype codes of the native tensor list (GradientDtype).
_DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _GradientList:
    """An optimizer's gradients, grouped for the kernels: the device, the native list (dense
    fp16/bf16/fp32 tensors as pointers, counts and dtype codes) and the rest (torch's op)."""

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.pointers: list[int] = []
        self.counts: list[int] = []
        self.dtypes: list[int] = []
        self.native_tensors: list[torch.Tensor] = []
        self.other: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)

    @property
    def empty(self) -> bool:
        return self.device is None


@functools.lru_cache(maxsize=64)
def _signature_takes_grad_scaler(step: Any) -> bool:
    return "grad_scaler" in inspect.signature(step).parameters


def _takes_grad_scaler(step: Any) -> bool:
    """Whether an optimizer's step() takes ``grad_scaler`` (as torch's GradScaler.step asks).
    inspect.signature costs tens of microseconds per call, so the answer is cached per function
    (the bound method's __func__; a step that is not a plain method is inspected every time)."""
    function = getattr(step, "__func__", None)
    if function is None:
        return "grad_scaler" in inspect.signature(step).parameters
    return _signature_takes_grad_scaler(function)


def _is_dense(tensor: torch.Tensor) -> bool:
    """True when the tensor's elements fill one block of memory, in any order (the kernels
    treat a gradient as its numel() elements from data_ptr())."""
    if tensor.is_contiguous():
        return True
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return True
    return tensor.dim() == 5 and tensor.is_contiguous(memory_format=torch.channels_last_3d)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` with gpuopt's fused unscale and unscale-and-clip.

    Constructor arguments, methods and ``state_dict`` keys are torch's; see the module
    docstring for what differs underneath, and :meth:`unscale_and_clip_` for what is added.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
        # torch's own attributes are kept (frameworks read _scale, _enabled, ...); these are
        # gpuopt's: one native scaler per CUDA device index, made on first use.
        # OptState is torch's own enum, so code that inspects the stages keeps working.
        if self._enabled:
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._native_scalers: dict[int, Any] = {}
        self._native_warning_given = False

    # ---- the state torch keeps ----

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[torch.Tensor, torch.Tensor]:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        assert self._scale is not None, f"Attempted {funcname} but _scale is None.  " + fix
        assert self._growth_tracker is not None, (
            f"Attempted {funcname} but _growth_tracker is None.  " + fix
        )
        return (self._scale, self._growth_tracker)

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        assert self._growth_tracker is None, "_growth_tracker initialized before _scale"
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full(
            (), self._init_growth_tracker, dtype=torch.int32, device=dev
        )

    def scale(self, outputs: Any) -> Any:
        """outputs * scale, for a tensor or (nested) iterables of tensors, as torch."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            assert self._scale is not None
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)

        cache: dict[torch.device, torch.Tensor] = {}

        def apply_scale(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(value.device)
                assert self._scale is not None
                if value.device not in cache:
                    cache[value.device] = self._scale.to(device=value.device, non_blocking=True)
                return value * cache[value.device]
            if isinstance(value, abc.Iterable):
                iterable = map(apply_scale, value)
                if isinstance(value, (list, tuple)):
                    return type(value)(iterable)
                return iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # ---- the gradients ----

    def _collect(self, optimizer: torch.optim.Optimizer, allow_fp16: bool) -> _GradientList:
        """The optimizer's gradients, checked: fp16 refused as torch does (unless allow_fp16),
        sparse and multi-device gradients refused with the parameter named.

        Runs once per unscale on every gradient, so each tensor attribute is read once (a torch
        attribute read costs a C++ call) and the parameter's name is formatted only for an error.
        """
        fast = self._collect_uniform(optimizer, allow_fp16)
        if fast is not None:
            return fast
        gradients = _GradientList()
        native = self._native_usable()
        float16, bfloat16, strided = torch.float16, torch.bfloat16, torch.strided
        codes = _DTYPE_CODES
        pointers, counts, dtypes = gradients.pointers, gradients.counts, gradients.dtypes
        native_tensors, other = gradients.native_tensors, gradients.other
        device: torch.device | None = None
        on_cuda = False
        for group_index, group in enumerate(optimizer.param_groups):
            for param_index, param in enumerate(group["params"]):
                grad = param.grad
                if grad is None:
                    continue
                dtype = grad.dtype
                if dtype is float16 and not allow_fp16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                grad_device = grad.device
                if dtype is bfloat16 and grad_device.type == "cuda":
                    # torch's CUDA unscale has no bf16 kernel (NotImplementedError): refuse as it
                    # does, so a loop behaves the same with either scaler.
                    raise NotImplementedError(
                        "Attempting to unscale BFloat16 gradients on CUDA: torch.amp.GradScaler "
                        "does not implement it either; keep AMP gradients in float32"
                    )
                if grad.layout is not strided:
                    where = f"param_groups[{group_index}]['params'][{param_index}]"
                    raise InvalidArgumentError(
                        f"{where}: gradient with layout {grad.layout}; gpuopt.amp.GradScaler "
                        "takes dense gradients only (torch.amp.GradScaler handles sparse ones)"
                    )
                if device is None:
                    device = grad_device
                    on_cuda = device.type == "cuda"
                elif grad_device != device:
                    where = f"param_groups[{group_index}]['params'][{param_index}]"
                    names = ", ".join(sorted(str(d) for d in (device, grad_device)))
                    raise InvalidArgumentError(
                        f"{where}: the optimizer's gradients are on several devices ({names}); "
                        "gpuopt.amp.GradScaler takes one device per optimizer"
                    )
                code = codes.get(dtype)
                if native and on_cuda and code is not None and _is_dense(grad):
                    pointers.append(grad.data_ptr())
                    counts.append(grad.numel())
                    dtypes.append(code)
                    native_tensors.append(grad)
                else:
                    other[dtype].append(grad)
        gradients.device = device
        return gradients

    def _collect_uniform(
        self, optimizer: torch.optim.Optimizer, allow_fp16: bool
    ) -> _GradientList | None:
        """The common case in one pass per attribute: every gradient a contiguous strided tensor
        of one dtype the kernels take, on one CUDA device. None for anything else, which
        _collect's per-tensor walk then sorts out (and names in its errors)."""
        if not self._native_usable():
            return None
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        grads = [g for g in grads if g is not None]
        if not grads:
            return None
        dtypes = {g.dtype for g in grads}
        if len(dtypes) != 1:
            return None
        dtype = next(iter(dtypes))
        code = _DTYPE_CODES.get(dtype)
        if code is None or dtype is torch.bfloat16 or (dtype is torch.float16 and not allow_fp16):
            return None
        if {g.layout for g in grads} != {torch.strided}:
            return None
        devices = {g.get_device() for g in grads}
        if len(devices) != 1 or next(iter(devices)) < 0:
            return None
        if not all(g.is_contiguous() for g in grads):
            return None
        gradients = _GradientList()
        gradients.device = grads[0].device
        gradients.pointers = [g.data_ptr() for g in grads]
        gradients.counts = [g.numel() for g in grads]
        gradients.dtypes = [code] * len(grads)
        gradients.native_tensors = grads
        return gradients

    def _native_usable(self) -> bool:
        if _native.native is not None and getattr(_native.native, "built_with_cuda", False):
            return True
        if not self._native_warning_given and self._device == "cuda":
            warnings.warn(
                "gpuopt.amp.GradScaler: the gpuopt native library has no CUDA "
                f"({_native.load_error or 'built without CUDA'}); torch's kernels are used",
                stacklevel=3,
            )
            self._native_warning_given = True
        return False

    def _native_for(self, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        scaler = self._native_scalers.get(index)
        if scaler is None:
            scaler = _native.require().TensorListScaler(index)
            self._native_scalers[index] = scaler
        return scaler

    def _unscale_list(
        self,
        gradients: _GradientList,
        scale: torch.Tensor | None,
        found_inf: torch.Tensor,
    ) -> None:
        """found_inf |= any inf/NaN; gradients *= 1/scale (scale None: check only)."""
        if gradients.pointers:
            device = gradients.device
            assert device is not None
            self._native_for(device).unscale(
                gradients.pointers,
                gradients.counts,
                gradients.dtypes,
                scale.data_ptr() if scale is not None else 0,
                found_inf.data_ptr(),
                torch.cuda.current_stream(device).cuda_stream,
            )
        if gradients.other:
            if scale is not None:
                inv_scale = scale.double().reciprocal().float()
            else:
                inv_scale = torch.full((), 1.0, dtype=torch.float32, device=found_inf.device)
            for grads in gradients.other.values():
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        assert self._scale is not None
        return self._scale if self._scale.device == device else self._scale.to(device)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides the optimizer's gradients by the scale in place (one fused launch) and records
        found_inf for step(); RuntimeError when called twice in one iteration, as torch."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        self._check_stage_for_unscale(optimizer_state, "unscale_()")
        gradients = self._collect(optimizer, allow_fp16=False)
        per_device: dict[torch.device, torch.Tensor] = {}
        if not gradients.empty:
            assert gradients.device is not None
            found_inf = torch.full((), 0.0, dtype=torch.float32, device=gradients.device)
            with torch.no_grad():
                self._unscale_list(gradients, self._scale_on(gradients.device), found_inf)
            per_device[gradients.device] = found_inf
        optimizer_state["found_inf_per_device"] = per_device
        optimizer_state["stage"] = OptState.UNSCALED

    @staticmethod
    def _check_stage_for_unscale(optimizer_state: dict[str, Any], what: str) -> None:
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                f"{what} has already been called on this optimizer since the last update()."
            )
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError(f"{what} is being called after step().")

    def unscale_and_clip_(
        self,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        *,
        defer_to_optimizer: bool | None = None,
    ) -> torch.Tensor:
        """``unscale_(optimizer)`` then ``clip_grad_norm_(grads, max_norm, norm_type)`` in one read
        of the gradients; returns the total norm of the unscaled gradients as a device tensor.

        The norm, found_inf and the clip factor min(1, max_norm / (norm + 1e-6)) are computed on
        the device. ``defer_to_optimizer`` (default: True when the optimizer takes ``grad_scale``,
        i.e. torch's fused optimizers) leaves the gradients as they are and hands the optimizer
        ``grad_scale = scale / factor``, so its step unscales and clips as it reads them; the
        ``.grad`` tensors then still hold scaled values until step(). Otherwise a second launch
        multiplies each gradient by 1/scale and then by the factor, rounding as torch's pair.
        norm_type other than 2, non-dense gradients and CPU gradients take torch's pair.
        Disabled, it is clip_grad_norm_ alone.
        """
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not self._enabled:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        self._check_scale_growth_tracker("unscale_and_clip_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        self._check_stage_for_unscale(optimizer_state, "unscale_and_clip_()")
        fused = getattr(optimizer, "_step_supports_amp_scaling", False) and (
            not _takes_grad_scaler(optimizer.step)
        )
        defer = fused if defer_to_optimizer is None else bool(defer_to_optimizer)
        if defer and not fused:
            raise InvalidArgumentError(
                "unscale_and_clip_: defer_to_optimizer=True needs an optimizer that takes "
                "grad_scale and found_inf (torch's fused=True Adam, AdamW, SGD, Adagrad)"
            )
        gradients = self._collect(optimizer, allow_fp16=False)
        fallback = (
            float(norm_type) != 2.0
            or gradients.empty
            or bool(gradients.other)
            or not isinstance(max_norm, (int, float))
            or math.isnan(float(max_norm))
        )
        if fallback:
            self.unscale_(optimizer)
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)

        device = gradients.device
        assert device is not None
        scale = self._scale_on(device)
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=device)
        total_norm = torch.empty((), dtype=torch.float32, device=device)
        clip = torch.empty((), dtype=torch.float32, device=device)
        combined = torch.empty((), dtype=torch.float32, device=device) if defer else None
        native = self._native_for(device)
        stream = torch.cuda.current_stream(device).cuda_stream
        native.unscale_norm(
            gradients.pointers,
            gradients.counts,
            gradients.dtypes,
            scale.data_ptr(),
            found_inf.data_ptr(),
            float(max_norm),
            total_norm.data_ptr(),
            clip.data_ptr(),
            combined.data_ptr() if combined is not None else 0,
            stream,
        )
        if defer:
            optimizer_state["grad_scale"] = combined
        else:
            native.scale_twice(
                gradients.pointers,
                gradients.counts,
                gradients.dtypes,
                scale.data_ptr(),
                clip.data_ptr(),
                stream,
            )
        optimizer_state["found_inf_per_device"] = {device: found_inf}
        optimizer_state["stage"] = OptState.UNSCALED
        return total_norm

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[Any, torch.Tensor]:
        """found_inf without unscaling (the fused optimizer unscales as it steps)."""
        _scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        gradients = self._collect(optimizer, allow_fp16=True)
        per_device: dict[torch.device, torch.Tensor] = {}
        if not gradients.empty:
            assert gradients.device is not None
            found_inf = torch.full((), 0.0, dtype=torch.float32, device=gradients.device)
            with torch.no_grad():
                self._unscale_list(gradients, None, found_inf)
            per_device[gradients.device] = found_inf
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = per_device
        return per_device

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[Any, torch.Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        # The one host read of a non-fused step: whether to call optimizer.step() at all.
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """optimizer.step() unless this iteration's gradients held inf/NaN, as torch: a fused
        optimizer gets grad_scale and found_inf (no host sync), any other is skipped after one
        read of found_inf."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")

        if getattr(optimizer, "_step_supports_amp_scaling", False):
            kwargs_ = kwargs
            has_grad_scaler_kwarg = _takes_grad_scaler(optimizer.step)
            if has_grad_scaler_kwarg:
                warnings.warn(
                    "GradScaler is going to stop passing itself as a keyword argument to the "
                    "passed optimizer. In the near future GradScaler registers `grad_scale: "
                    "Tensor` and `found_inf: Tensor` to the passed optimizer and let the "
                    "optimizer use them directly.",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs_.update({"grad_scaler": self})
            else:
                if optimizer_state["stage"] is OptState.READY:
                    self._check_inf_per_device(optimizer)
                scaler = self._get_scale_async()
                assert scaler is not None
                found_infs = [
                    t.to(scaler.device, non_blocking=True)
                    for t in optimizer_state["found_inf_per_device"].values()
                ]
                assert len(found_infs) > 0, "No inf checks were recorded for this optimizer."
                found_inf = found_infs[0] if len(found_infs) == 1 else sum(found_infs)
                deferred = optimizer_state.get("grad_scale")
                if optimizer_state["stage"] is OptState.UNSCALED:
                    # Unscaled already; unless unscale_and_clip_ left it to the optimizer.
                    grad_scale = (
                        deferred
                        if deferred is not None
                        else (getattr(optimizer, "grad_scale", None))
                    )
                else:
                    user_scale = getattr(optimizer, "grad_scale", None)
                    grad_scale = scaler if user_scale is None else scaler * user_scale
                optimizer.grad_scale = grad_scale
                optimizer.found_inf = found_inf
            retval = optimizer.step(*args, **kwargs_)
            optimizer_state["stage"] = OptState.STEPPED
            if not has_grad_scaler_kwarg:
                del optimizer.grad_scale
                del optimizer.found_inf
            return retval

        if optimizer_state.get("grad_scale") is not None:
            raise RuntimeError(
                "unscale_and_clip_ left the clip to an optimizer that takes grad_scale, "
                "but this optimizer does not"
            )
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        assert len(optimizer_state["found_inf_per_device"]) > 0, (
            "No inf checks were recorded for this optimizer."
        )
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """The scale and growth tracker for the next iteration, on the device (torch's
        _amp_update_scale_ over the sum of every optimizer's found_inf); or new_scale."""
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            assert self._scale is not None
            if isinstance(new_scale, float):
                self._scale.fill_(new_scale)
            else:
                reason = (
                    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                    "torch.FloatTensor with requires_grad=False."
                )
                assert new_scale.device.type == self._device, reason
                assert new_scale.numel() == 1, reason
                assert new_scale.requires_grad is False, reason
                self._scale.copy_(new_scale)
        else:
            found_infs = [
                found_inf.to(device=_scale.device, non_blocking=True)
                for state in self._per_optimizer_states.values()
                for found_inf in state["found_inf_per_device"].values()
            ]
            assert len(found_infs) > 0, "No inf checks were recorded prior to update."
            found_inf_combined = found_infs[0]
            for other in found_infs[1:]:
                found_inf_combined += other
            torch._amp_update_scale_(
                _scale,
                _growth_tracker,
                found_inf_combined,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # ---- pickling: the native scalers stay behind ----

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_native_scalers"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._native_scalers = {}
