#!/usr/bin/env python3
"""Writes a tiny GPTQ or AWQ checkpoint (safetensors + quantize_config.json), an input x.npy and the
float64 reference y_ref.npy, packed here with numpy independently of gpuopt's C++ packer.

usage: make_fixture.py OUT_DIR [gptq|gptq_v2|awq] [--act-order]
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        dtype = {np.dtype("int32"): "I32", np.dtype("float16"): "F16"}[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    out = Path(sys.argv[1])
    fmt = sys.argv[2] if len(sys.argv) > 2 else "gptq"
    act_order = "--act-order" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    k, n, group, m = 256, 128, 64, 5
    groups = k // group
    q = rng.integers(0, 16, size=(k, n), dtype=np.uint32)  # checkpoint row order
    zeros = rng.integers(1, 16, size=(groups, n), dtype=np.uint32)
    scales = (rng.uniform(0.5, 2.0, size=(groups, n)) / 64).astype(np.float16)
    g_idx = np.arange(k) // group
    if act_order:
        g_idx = rng.permutation(g_idx)
    w = (q.astype(np.float64) - zeros[g_idx]) * scales.astype(np.float64)[g_idx]
    tensors = {}
    if fmt.startswith("gptq"):
        qweight = np.zeros((k // 8, n), dtype=np.uint32)
        for i in range(8):
            qweight |= q[i::8, :] << (4 * i)
        stored = zeros - (0 if fmt == "gptq_v2" else 1)
        qzeros = np.zeros((groups, n // 8), dtype=np.uint32)
        for i in range(8):
            qzeros |= stored[:, i::8] << (4 * i)
        tensors["layer.qweight"] = qweight.view(np.int32)
        tensors["layer.qzeros"] = qzeros.view(np.int32)
        if act_order:
            tensors["layer.g_idx"] = g_idx.astype(np.int32)
        config = {"bits": 4, "group_size": group, "desc_act": act_order, "sym": False,
                  "quant_method": "gptq",
                  "checkpoint_format": "gptq_v2" if fmt == "gptq_v2" else "gptq"}
    else:
        qweight = np.zeros((k, n // 8), dtype=np.uint32)
        qzeros = np.zeros((groups, n // 8), dtype=np.uint32)
        for p, column in enumerate(AWQ_ORDER):
            qweight |= q[:, column::8] << (4 * p)
            qzeros |= zeros[:, column::8] << (4 * p)
        tensors["layer.qweight"] = qweight.view(np.int32)
        tensors["layer.qzeros"] = qzeros.view(np.int32)
        config = {"quant_method": "awq", "w_bit": 4, "q_group_size": group, "zero_point": True,
                  "version": "gemm"}
    tensors["layer.scales"] = scales
    write_safetensors(out / "model.safetensors", tensors)
    (out / "quantize_config.json").write_text(json.dumps(config))
    x = rng.uniform(-1, 1, size=(m, k)).astype(np.float16)
    np.save(out / "x.npy", x)
    np.save(out / "y_ref.npy", x.astype(np.float64) @ w)


if __name__ == "__main__":
    main()
