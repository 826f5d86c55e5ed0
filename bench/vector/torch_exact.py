#!/usr/bin/env python3
"""Anchor for the GPU exact search: torch `cdist-free` L2 via matmul + topk on the same data.

Loads base/queries from .npy (or makes a seeded synthetic set), computes squared L2 as
||q||^2 - 2 q.x^T + ||x||^2 with one fp32 matmul, then topk(k, largest=False); times the median
of --repeat runs with CUDA events after warm-up and prints one JSON object (and the ids to --ids).
"""
import argparse
import json

import numpy as np
import torch


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base")
    p.add_argument("--queries")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--nq", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--ids", help="write the result ids here (.npy)")
    a = p.parse_args()
    dev = torch.device("cuda")
    if a.base:
        base = torch.from_numpy(np.load(a.base)).to(dev)
        queries = torch.from_numpy(np.load(a.queries)).to(dev)
    else:
        g = torch.Generator(device=dev).manual_seed(1234)
        base = torch.randn(a.rows, a.dim, device=dev, generator=g)
        queries = torch.randn(a.nq, a.dim, device=dev, generator=g)
    base_norms = (base * base).sum(1)

    def search():
        d = (queries * queries).sum(1, keepdim=True) - 2.0 * queries @ base.T + base_norms
        return torch.topk(d, a.k, dim=1, largest=False)

    for _ in range(3):
        search()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        result = search()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    if a.ids:
        np.save(a.ids, result.indices.cpu().numpy().astype(np.int64))
    print(json.dumps({"engine": "torch-matmul-topk", "median_ms": float(np.median(times)),
                      "min_ms": float(np.min(times)), "tf32": torch.backends.cuda.matmul.allow_tf32,
                      "rows": int(base.shape[0]), "dim": int(base.shape[1]),
                      "queries": int(queries.shape[0]), "k": a.k, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
