"""gpuopt.amp.GradScaler on a CUDA device, side by side with torch.amp.GradScaler("cuda"): the
same scale, growth tracker, skip decisions and parameters on a scripted inf/NaN pattern (SGD and
AdamW, fused and not, state_dict round trips mid-run), unscale_and_clip_ against unscale_ +
clip_grad_norm_, the fused kernels against the CPU twin, host synchronisations, error cases."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpuopt import _native  # noqa: E402
from gpuopt.amp import GradScaler  # noqa: E402
from gpuopt.errors import InvalidArgumentError  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        _native.native is None or not _native.native.built_with_cuda,
        reason="gpuopt native library without CUDA",
    ),
]

PATTERN = ["ok", "inf", "ok", "ok", "ok", "nan", "ok", "ok", "ok", "ok", "-inf", "ok", "ok"]


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 257), torch.nn.GELU(), torch.nn.Linear(257, 33), torch.nn.LayerNorm(33)
    ).cuda()


def make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "sgd-fused":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    raise AssertionError(name)


def poison(model: torch.nn.Module, kind: str) -> None:
    grad = model[2].weight.grad
    if kind == "inf":
        grad[0, 1] = float("inf")
    elif kind == "-inf":
        grad[3, 2] = float("-inf")
    elif kind == "nan":
        grad[1, 0] = float("nan")


def training_step(model, opt, scaler, data, kind, clip):
    opt.zero_grad(set_to_none=True)
    loss = model(data).square().mean()
    scaler.scale(loss).backward()
    poison(model, kind)
    norm = None
    if clip is not None:
        if isinstance(scaler, GradScaler):
            norm = scaler.unscale_and_clip_(opt, clip)
        else:
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    skipped = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return skipped, norm


@pytest.mark.parametrize("optimizer_name", ["sgd", "sgd-fused", "adamw", "adamw-fused"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_side_by_side_with_torchs_grad_scaler(optimizer_name, clip):
    torch_model, ours_model = make_model(), make_model()
    torch_opt = make_optimizer(optimizer_name, torch_model.parameters())
    ours_opt = make_optimizer(optimizer_name, ours_model.parameters())
    kwargs = dict(init_scale=2.0**12, growth_interval=3)
    torch_scaler, ours = torch.amp.GradScaler("cuda", **kwargs), GradScaler("cuda", **kwargs)
    data = torch.randn(16, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    for step, kind in enumerate(PATTERN):
        torch_skipped, torch_norm = training_step(
            torch_model, torch_opt, torch_scaler, data, kind, clip
        )
        ours_skipped, ours_norm = training_step(ours_model, ours_opt, ours, data, kind, clip)
        assert torch_skipped == ours_skipped == (kind != "ok"), (step, kind)
        assert ours.get_scale() == torch_scaler.get_scale(), step
        assert ours._get_growth_tracker() == torch_scaler._get_growth_tracker(), step
        if clip is not None and kind == "ok":
            assert ours_norm.device.type == "cuda"
            torch.testing.assert_close(ours_norm, torch_norm, rtol=2e-6, atol=0)
        for a, b in zip(torch_model.parameters(), ours_model.parameters()):
            if clip is None:
                # unscale_ is the same fp32 multiply as torch's: bit for bit.
                assert torch.equal(a, b), (step, optimizer_name)
            else:
                # The clip factor comes from a norm summed in another order: fp32 rounding.
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if step == 6:  # state_dict round trip into fresh scalers, mid-run
            state = ours.state_dict()
            assert state == torch_scaler.state_dict()
            ours = GradScaler("cuda")
            ours.load_state_dict(state)
            torch_scaler = torch.amp.GradScaler("cuda")
            torch_scaler.load_state_dict(state)


def flat_views(total: int, offsets_and_sizes, dtype=torch.float32):
    """Gradients as views of one buffer at odd element offsets (not 16-byte aligned)."""
    flat = torch.empty(total, dtype=dtype, device="cuda")
    return flat, [flat[o : o + n] for o, n in offsets_and_sizes]


def params_with_grads(grads):
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=g.dtype, device="cuda"))
        p.grad = g
        params.append(p)
    return params


LAYOUT = [(1, 1), (3, 5), (9, 4093), (4103, 65537), (69641, 3), (69645, 300001)]


def test_unscale_matches_the_cpu_twin_on_misaligned_tensors():
    flat, grads = flat_views(370_000, LAYOUT)
    flat.copy_(torch.randn(flat.numel(), device="cuda") * 3e4)
    opt = torch.optim.SGD(params_with_grads(grads), lr=0.1)
    ours = GradScaler("cuda", init_scale=3.0 * 2**14)
    ours.scale(torch.ones((), device="cuda"))
    before = flat.cpu().numpy()
    ours.unscale_(opt)
    inv = _native.native.amp_inverse_scale(3.0 * 2**14)
    after = flat.cpu().numpy()
    for offset, n in LAYOUT:
        expected = before[offset : offset + n].copy()
        _native.native.amp_scale_twice_reference(expected, inv, 1.0)
        assert np.array_equal(after[offset : offset + n], expected)
    # The gaps between the views are not gradients: untouched.
    assert after[0] == before[0] and np.array_equal(after[4102:4103], before[4102:4103])
    found_inf = ours._per_optimizer_states[id(opt)]["found_inf_per_device"][flat.device]
    assert found_inf.item() == 0.0


@pytest.mark.parametrize("where", [0, 2, 3, 5])
def test_found_inf_in_any_tensor(where):
    flat, grads = flat_views(370_000, LAYOUT)
    flat.normal_()
    grads[where][-1] = float("nan")
    opt = torch.optim.SGD(params_with_grads(grads), lr=0.1)
    ours = GradScaler("cuda")
    ours.scale(torch.ones((), device="cuda"))
    ours.unscale_(opt)
    assert ours._per_optimizer_states[id(opt)]["found_inf_per_device"][flat.device].item() == 1.0


@pytest.mark.parametrize("defer", [False, True])
def test_unscale_and_clip_matches_torchs_pair(defer):
    flat, grads = flat_views(370_000, LAYOUT)
    flat.copy_(torch.randn(flat.numel(), device="cuda") * 4096.0)
    reference = [g.clone() for g in grads]
    opt = torch.optim.AdamW(params_with_grads(grads), lr=1e-3, fused=True)
    ours = GradScaler("cuda", init_scale=4096.0)
    ours.scale(torch.ones((), device="cuda"))
    norm = ours.unscale_and_clip_(opt, 2.0, defer_to_optimizer=defer)
    torch_scaler = torch.amp.GradScaler("cuda", init_scale=4096.0)
    torch_scaler.scale(torch.ones((), device="cuda"))
    torch_opt = torch.optim.SGD(params_with_grads(reference), lr=0.1)
    torch_scaler.unscale_(torch_opt)
    expected = torch.nn.utils.clip_grad_norm_(torch_opt.param_groups[0]["params"], 2.0)
    torch.testing.assert_close(norm, expected, rtol=2e-6, atol=0)
    if defer:
        # Gradients still scaled; the optimizer gets scale / clip factor.
        combined = ours._per_optimizer_states[id(opt)]["grad_scale"]
        clip = torch.clamp(2.0 / (norm + 1e-6), max=1.0)
        torch.testing.assert_close(combined, 4096.0 / clip, rtol=1e-6, atol=0)
    else:
        for g, r in zip(grads, reference):
            torch.testing.assert_close(g, r, rtol=2e-6, atol=1e-12)


def test_the_device_table_is_reused_while_gradients_stay():
    model = make_model()
    opt = make_optimizer("adamw-fused", model.parameters())
    ours = GradScaler("cuda")
    data = torch.randn(8, 64, device="cuda")
    for _ in range(10):
        opt.zero_grad(set_to_none=False)
        ours.scale(model(data).sum()).backward()
        ours.unscale_(opt)
        ours.step(opt)
        ours.update()
    native = next(iter(ours._native_scalers.values()))
    assert native.table_uploads == 1
    assert native.table_slots == 1


def fused_step(scaler, model, opt, data, clip):
    opt.zero_grad(set_to_none=True)
    scaler.scale(model(data).square().mean()).backward()
    if clip:
        scaler.unscale_and_clip_(opt, 1.0)
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("clip", [False, True])
def test_fused_adamw_step_makes_no_host_sync(clip):
    model = make_model()
    opt = make_optimizer("adamw-fused", model.parameters())
    ours = GradScaler("cuda")
    data = torch.randn(8, 64, device="cuda")
    fused_step(ours, model, opt, data, clip)  # warm-up: lazy state, first table
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            fused_step(ours, model, opt, data, clip)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def count_sync_warnings(scaler, model, opt, data) -> int:
    opt.zero_grad(set_to_none=True)
    scaler.scale(model(data).square().mean()).backward()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            scaler.step(opt)
            scaler.update()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def test_non_fused_step_syncs_once_as_torch():
    counts = []
    for scaler in (torch.amp.GradScaler("cuda"), GradScaler("cuda")):
        model = make_model()
        opt = make_optimizer("adamw", model.parameters())
        data = torch.randn(8, 64, device="cuda")
        count_sync_warnings(scaler, model, opt, data)
        counts.append(count_sync_warnings(scaler, model, opt, data))
    assert counts[1] == counts[0] == 1


def test_fp16_gradients_are_refused_as_torch():
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16, device="cuda"))
    param.grad = torch.ones(4, dtype=torch.float16, device="cuda")
    opt = torch.optim.SGD([param], lr=0.1)
    ours = GradScaler("cuda")
    ours.scale(torch.ones((), device="cuda"))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        ours.unscale_(opt)


def test_bf16_gradients_are_refused_as_torch_refuses_them():
    grads = [torch.randn(1000, device="cuda").to(torch.bfloat16) * 1024 for _ in range(3)]
    reference = [g.clone() for g in grads]
    ours, theirs = GradScaler("cuda", init_scale=3.0), torch.amp.GradScaler("cuda", init_scale=3.0)
    for scaler, gs in ((ours, grads), (theirs, reference)):
        scaler.scale(torch.ones((), device="cuda"))
        with pytest.raises(NotImplementedError):  # torch 2.11 has no bf16 CUDA unscale kernel
            scaler.unscale_(torch.optim.SGD(params_with_grads(gs), lr=0.1))
    for g, r in zip(grads, reference):  # neither touched the gradients
        assert torch.equal(g, r)


def test_sparse_gradients_get_a_clear_error():
    param = torch.nn.Parameter(torch.ones(4, 3, device="cuda"))
    param.grad = torch.ones(4, 3, device="cuda").to_sparse()
    opt = torch.optim.SGD([param], lr=0.1)
    ours = GradScaler("cuda")
    ours.scale(torch.ones((), device="cuda"))
    with pytest.raises(InvalidArgumentError, match="dense gradients only"):
        ours.unscale_(opt)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)
def test_gradients_on_two_devices_get_a_clear_error():
    a = torch.nn.Parameter(torch.ones(3, device="cuda:0"))
    a.grad = torch.ones(3, device="cuda:0")
    b = torch.nn.Parameter(torch.ones(3, device="cuda:1"))
    b.grad = torch.ones(3, device="cuda:1")
    ours = GradScaler("cuda")
    ours.scale(torch.ones((), device="cuda:0"))
    with pytest.raises(InvalidArgumentError, match="several devices"):
        ours.unscale_(torch.optim.SGD([a, b], lr=0.1))


def test_unscale_twice_raises():
    model = make_model()
    opt = make_optimizer("sgd", model.parameters())
    ours = GradScaler("cuda")
    ours.scale(model(torch.ones(2, 64, device="cuda")).sum()).backward()
    ours.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        ours.unscale_(opt)


def _walk_only(scaler: GradScaler, optimizer, allow_fp16: bool):
    """_collect with its one-pass shortcut turned off: the per-tensor walk alone."""
    shortcut = scaler._collect_uniform
    scaler._collect_uniform = lambda *args: None
    try:
        return scaler._collect(optimizer, allow_fp16)
    finally:
        scaler._collect_uniform = shortcut


def _lists(gradients):
    return (
        gradients.device,
        gradients.pointers,
        gradients.counts,
        gradients.dtypes,
        [id(t) for t in gradients.native_tensors],
        {k: [id(t) for t in v] for k, v in gradients.other.items()},
    )


@pytest.mark.parametrize(
    "case", ["uniform", "with-none", "fp16", "mixed-dtype", "non-contiguous", "channels-last"]
)
def test_the_one_pass_collection_equals_the_per_tensor_walk(case):
    shapes = [(8, 3, 3, 3), (8,), (5, 4), (5,)]
    dtypes = [torch.float32] * len(shapes)
    if case == "fp16":
        dtypes = [torch.float16] * len(shapes)
    elif case == "mixed-dtype":
        dtypes[2] = torch.float16
    params = [
        torch.nn.Parameter(torch.randn(shape, device="cuda", dtype=dtype))
        for shape, dtype in zip(shapes, dtypes)
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    allow_fp16 = case in ("fp16", "mixed-dtype")
    if case == "with-none":
        params[1].grad = None
    elif case == "non-contiguous":
        params[2].grad = torch.randn(4, 5, device="cuda").t()
    elif case == "channels-last":
        params[0].grad = params[0].grad.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = GradScaler()
    shortcut = scaler._collect_uniform(opt, allow_fp16)
    # The shortcut takes only the uniform cases; whatever it takes, it lists as the walk does.
    assert (shortcut is not None) == (case in ("uniform", "with-none", "fp16"))
    assert _lists(scaler._collect(opt, allow_fp16)) == _lists(_walk_only(scaler, opt, allow_fp16))
    if shortcut is not None:
        assert _lists(shortcut) == _lists(_walk_only(scaler, opt, allow_fp16))
