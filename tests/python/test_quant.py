"""gpuopt.quant: checkpoints written from numpy load into the kernel layout, whose CPU twin equals
the float64 product; loader errors name the problem; the torch module on the GPU equals the twin,
under torch.compile and CUDA graph replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gpuopt
import gpuopt.quant as quant
from conftest import requires_gpu
from quant_fixtures import write_checkpoint, write_safetensors

LAYER = "model.layers.0.mlp.up_proj"


def check_twin(layer, weight, rng, m=5, dtype="float16"):
    x = rng.standard_normal((m, layer.k)).astype(np.float32)
    x_rounded = x.astype(np.float16).astype(np.float64) if dtype == "float16" else None
    got = layer.reference(x)
    assert got.shape == (m, layer.n) and got.dtype == np.float32
    if x_rounded is not None:
        want = x_rounded @ weight
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, atol=2e-3 * scale, rtol=0)


@pytest.mark.parametrize("fmt, act_order", [("gptq", False), ("gptq", True), ("awq", False)])
def test_checkpoint_layer_twin_matches_float64(tmp_path, rng, fmt, act_order):
    weights = write_checkpoint(tmp_path, rng, fmt=fmt, act_order=act_order)
    layer = quant.load_layer(tmp_path, LAYER)
    assert (layer.k, layer.n, layer.group_size, layer.dtype) == (256, 128, 64, "float16")
    assert layer.has_zeros
    assert layer.tiles.dtype == np.uint32 and layer.tiles.size == 256 * 128 // 8
    assert layer.perm.size == (256 if act_order else 0)
    check_twin(layer, weights[LAYER], rng)


def test_sharded_directory_and_single_file(tmp_path, rng):
    layers = [f"model.layers.{i}.self_attn.o_proj" for i in range(3)]
    weights = write_checkpoint(tmp_path, rng, layers=layers, shards=2)
    for name in layers:
        check_twin(quant.load_layer(tmp_path, name), weights[name], rng)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    check_twin(quant.load_layer(shard, layers[1]), weights[layers[1]], rng)


def test_bfloat16_layer(tmp_path, rng):
    weights = write_checkpoint(tmp_path, rng)
    layer = quant.load_layer(tmp_path, LAYER, dtype="bfloat16")
    assert layer.dtype == "bfloat16"
    x = rng.standard_normal((3, layer.k)).astype(np.float32)
    want = x.astype(np.float64) @ weights[LAYER]
    # bf16 rounds x and the scales to 8 bits of mantissa.
    np.testing.assert_allclose(layer.reference(x), want, atol=2e-2 * np.abs(want).max(), rtol=0)


def test_loader_errors_name_the_problem(tmp_path, rng):
    write_checkpoint(tmp_path, rng)
    with pytest.raises(gpuopt.NotFoundError, match="model.layers.9"):
        quant.load_layer(tmp_path, "model.layers.9.mlp.up_proj")
    with pytest.raises(FileNotFoundError):
        quant.load_layer(tmp_path / "missing.safetensors", LAYER)
    with pytest.raises(ValueError, match="8-bit"):
        quant.load_layer(tmp_path, LAYER, config={"bits": 8, "group_size": 64})
    with pytest.raises(ValueError, match="dtype"):
        quant.load_layer(tmp_path, LAYER, dtype="float32")
    bad = tmp_path / "bad"
    bad.mkdir()
    write_safetensors(
        bad / "model.safetensors",
        {
            "l.qweight": np.zeros((32, 100), dtype=np.int32),  # N = 100: not a multiple of 64
            "l.qzeros": np.zeros((4, 13), dtype=np.int32),
            "l.scales": np.ones((4, 100), dtype=np.float16),
        },
    )
    (bad / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 64}))
    with pytest.raises(gpuopt.InvalidArgumentError):
        quant.load_layer(bad, "l")
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(gpuopt.Error):
        quant.load_layer(bad, "l")


def test_reference_checks_x(tmp_path, rng):
    write_checkpoint(tmp_path, rng)
    layer = quant.load_layer(tmp_path, LAYER)
    with pytest.raises(ValueError, match=r"\[M, 256\]"):
        layer.reference(np.zeros((2, 100)))


# ---- GPU (torch) ----


@requires_gpu
@pytest.mark.parametrize("m", [1, 16, 100])
def test_w4a16_linear_matches_the_twin(tmp_path, rng, m):
    import torch

    write_checkpoint(tmp_path, rng, k=512, n=256, group_size=128)
    layer = quant.load_layer(tmp_path, LAYER)
    linear = quant.W4A16Linear(layer, device="cuda")
    assert isinstance(linear, torch.nn.Module)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    torch_x = torch.from_numpy(x).to("cuda", torch.float16)
    y = linear(torch_x)
    assert y.dtype == torch.float16 and y.shape == (m, 256) and y.is_cuda
    want = layer.reference(x)
    np.testing.assert_allclose(
        y.float().cpu().numpy(), want, atol=2e-2 * np.abs(want).max(), rtol=1e-2
    )
    y3 = linear(torch_x.reshape(1, m, 512))
    assert y3.shape == (1, m, 256)
    torch.testing.assert_close(y3.reshape(m, 256), y)


@requires_gpu
def test_w4a16_linear_graph_replay_equals_eager_and_compiles(tmp_path, rng):
    import torch

    write_checkpoint(tmp_path, rng, k=512, n=256, group_size=128)
    linear = quant.W4A16Linear(quant.load_layer(tmp_path, LAYER), device="cuda")
    x = torch.randn(8, 512, dtype=torch.float16, device="cuda")
    eager = linear(x)  # warm-up plans the kernel for M = 8
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    with torch.cuda.graph(graph):
        static_y = linear(static_x)
    new_x = torch.randn_like(x)
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_y, linear(new_x))
    compiled = torch.compile(linear, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager)


@requires_gpu
def test_w4a16_linear_eager_call_equals_the_op_and_follows_moved_weights(tmp_path, rng):
    import torch

    write_checkpoint(tmp_path, rng, k=512, n=256, group_size=128)
    linear = quant.W4A16Linear(quant.load_layer(tmp_path, LAYER), device="cuda")
    x = torch.randn(3, 512, dtype=torch.float16, device="cuda")
    eager = linear(x)  # the layer's own plan, called directly
    # The custom op; the default mode's split-K sums may differ in the last bit between calls.
    torch.testing.assert_close(quant.w4a16_gemm(x, linear), eager, rtol=1e-3, atol=1e-3)
    linear.cpu()
    linear.cuda()  # new buffers: the cached plan must not keep the old pointers
    torch.testing.assert_close(linear(x), eager, rtol=1e-3, atol=1e-3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # runs on the caller's current stream
        on_side = linear(x)
    side.synchronize()
    # The default mode's split-K sums may differ in the last bit between calls.
    torch.testing.assert_close(on_side, eager, rtol=1e-3, atol=1e-3)


@requires_gpu
def test_w4a16_linear_rejects_bad_inputs(tmp_path, rng):
    import torch

    write_checkpoint(tmp_path, rng)
    linear = quant.W4A16Linear(quant.load_layer(tmp_path, LAYER), device="cuda")
    with pytest.raises(ValueError, match="CUDA"):
        linear(torch.zeros(2, 256, dtype=torch.float16))
    with pytest.raises(ValueError, match="dtype"):
        linear(torch.zeros(2, 256, device="cuda"))
    with pytest.raises(ValueError, match="shape"):
        linear(torch.zeros(2, 100, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="contiguous"):
        linear(torch.zeros(256, 2, dtype=torch.float16, device="cuda").t())


@requires_gpu
def test_w4a16_op_passes_torch_opcheck(tmp_path, rng):
    import torch

    write_checkpoint(tmp_path, rng, k=512, n=256, group_size=128)
    linear = quant.W4A16Linear(quant.load_layer(tmp_path, LAYER), device="cuda")
    x = torch.randn(4, 512, dtype=torch.float16, device="cuda")
    args = (x, linear.tiles, linear.scales, linear.zeros, linear.perm, 512, 256, 128, True)
    # Schema, fake (meta) implementation and dispatch agree; no autograd (inference op).
    torch.library.opcheck(
        torch.ops.gpuopt.w4a16_gemm.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )
