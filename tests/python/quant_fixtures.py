"""GPTQ and AWQ checkpoints written from numpy with the formats' own packing rules (not
gpuopt's), and the float64 product they stand for: the oracle of the quant tests."""

from __future__ import annotations

import json
import struct

import numpy as np

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def write_safetensors(path, tensors: dict[str, np.ndarray], metadata=None) -> None:
    dtypes = {np.dtype(np.int32): "I32", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": dtypes[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def random_layer(rng, k, n, group_size, act_order=False):
    """q [K, N] and zeros [G, N] in 1..15, fp16 scales, and per-row groups (g_idx)."""
    groups = k // group_size
    q = rng.integers(0, 16, size=(k, n))
    zeros = rng.integers(1, 16, size=(groups, n))
    scales = (rng.uniform(0.5, 2.0, size=(groups, n)) / 64).astype(np.float16)
    g_idx = np.repeat(np.arange(groups), group_size)
    if act_order:
        g_idx = rng.permutation(g_idx)
    return q, zeros, scales, g_idx.astype(np.int32)


def dequantized(q, zeros, scales, g_idx):
    """W [K, N] in float64: (q - zero[g]) * scale[g] with g = g_idx[k]."""
    return (q - zeros[g_idx]) * scales.astype(np.float64)[g_idx]


def pack_gptq(q, zeros, scales, g_idx, act_order):
    k, n = q.shape
    qweight = np.zeros((k // 8, n), dtype=np.uint32)
    for i in range(8):
        qweight |= q[i::8].astype(np.uint32) << (4 * i)
    stored = (zeros - 1).astype(np.uint32)  # GPTQ v1 stores zero - 1
    qzeros = np.zeros((zeros.shape[0], n // 8), dtype=np.uint32)
    for i in range(8):
        qzeros |= stored[:, i::8] << (4 * i)
    tensors = {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales}
    if act_order:
        tensors["g_idx"] = g_idx
    return tensors


def pack_awq(q, zeros, scales):
    k, n = q.shape
    qweight = np.zeros((k, n // 8), dtype=np.uint32)
    qzeros = np.zeros((zeros.shape[0], n // 8), dtype=np.uint32)
    for p, column in enumerate(AWQ_ORDER):
        qweight |= q[:, column::8].astype(np.uint32) << (4 * p)
        qzeros |= zeros[:, column::8].astype(np.uint32) << (4 * p)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales}


def write_checkpoint(
    directory,
    rng,
    fmt="gptq",
    k=256,
    n=128,
    group_size=64,
    act_order=False,
    layers=("model.layers.0.mlp.up_proj",),
    shards=1,
):
    """Writes the layers (sharded when shards > 1) and the config; returns {layer: float64 W}."""
    weights, files = {}, [dict() for _ in range(shards)]
    for index, layer in enumerate(layers):
        q, zeros, scales, g_idx = random_layer(rng, k, n, group_size, act_order)
        packed = (
            pack_gptq(q, zeros, scales, g_idx, act_order)
            if fmt == "gptq"
            else pack_awq(q, zeros, scales)
        )
        for name, array in packed.items():
            files[index % shards][f"{layer}.{name}"] = array
        weights[layer] = dequantized(q, zeros, scales, g_idx)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", files[0])
    else:
        weight_map = {}
        for s, tensors in enumerate(files):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(directory / name, tensors)
            weight_map.update({t: name for t in tensors})
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map})
        )
    if fmt == "gptq":
        config = {"bits": 4, "group_size": group_size, "desc_act": act_order}
        (directory / "quantize_config.json").write_text(json.dumps(config))
    else:
        config = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": group_size}
        (directory / "config.json").write_text(json.dumps({"quantization_config": config}))
    return weights
