"""One GPTQ/AWQ layer of a checkpoint as a torch module on the GPU, checked against the CPU twin.

    python examples/gptq_layer.py CHECKPOINT_DIR LAYER [--m 16] [--dtype float16]

e.g. LAYER = model.layers.0.mlp.down_proj. Without a checkpoint, ``--synthetic`` writes a small
random GPTQ layer first. Needs torch and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile

import numpy as np

import gpuopt.quant


def write_synthetic(directory: str, k: int = 4096, n: int = 4096, group_size: int = 128) -> str:
    """A random GPTQ (v1) layer "synthetic.proj" in DIRECTORY/model.safetensors."""
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=(k, n)).astype(np.uint32)
    zeros = rng.integers(1, 16, size=(k // group_size, n)).astype(np.uint32)
    qweight = np.zeros((k // 8, n), dtype=np.uint32)
    qzeros = np.zeros((k // group_size, n // 8), dtype=np.uint32)
    for i in range(8):
        qweight |= q[i::8] << (4 * i)
        qzeros |= (zeros[:, i::8] - 1) << (4 * i)
    scales = (rng.uniform(0.5, 2.0, size=(k // group_size, n)) / 64).astype(np.float16)
    tensors = {
        "synthetic.proj.qweight": ("I32", qweight.view(np.int32)),
        "synthetic.proj.qzeros": ("I32", qzeros.view(np.int32)),
        "synthetic.proj.scales": ("F16", scales),
    }
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = array.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(f"{directory}/model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(f"{directory}/quantize_config.json", "w") as handle:
        json.dump({"bits": 4, "group_size": group_size, "desc_act": False}, handle)
    return "synthetic.proj"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("layer", nargs="?")
    parser.add_argument("--synthetic", action="store_true", help="write and use a random layer")
    parser.add_argument("--m", type=int, default=16, help="rows of x")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        if args.synthetic:
            checkpoint, layer_name = scratch, write_synthetic(scratch)
        elif args.checkpoint and args.layer:
            checkpoint, layer_name = args.checkpoint, args.layer
        else:
            parser.error("give CHECKPOINT_DIR LAYER, or --synthetic")
        layer = gpuopt.quant.load_layer(checkpoint, layer_name, dtype=args.dtype)
    linear = gpuopt.quant.W4A16Linear(layer, device="cuda")
    print(linear)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.m, layer.k, dtype=dtype, device="cuda")
    y = linear(x)
    torch.cuda.synchronize()
    want = layer.reference(x.float().cpu().numpy())
    error = np.abs(y.float().cpu().numpy() - want).max() / max(np.abs(want).max(), 1e-30)
    print(f"y {tuple(y.shape)} {y.dtype}; max |y - CPU twin| / max |twin| = {error:.2e}")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        linear(x)
    end.record()
    end.synchronize()
    print(
        f"{start.elapsed_time(end) * 10:.1f} us per call (100 back to back, events on the stream)"
    )


if __name__ == "__main__":
    main()
