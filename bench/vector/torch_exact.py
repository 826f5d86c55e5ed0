#!/usr/bin/env python3
"""Anchor for the GPU exact search: torch's best exact top-k on the same data, and float64 truth.

Loads base/queries from .npy (or makes a seeded synthetic set) onto the GPU as fp32 and times two
exact fp32 formulations (TF32 off): `matmul` (||q||^2 - 2 q.x^T + ||x||^2, then topk) and
`torch.cdist` (squared, then topk), both with topk(sorted=False). Reports the median of --repeat
CUDA-event-timed runs after warm-up for each, and the faster one as "best". With --truth, also
computes float64 ground truth (distances of the true k nearest, ascending) in query chunks and
saves it, and with --check checks another engine's ids (.npy [nq, k]) against that truth.
With --batch1 N, also times N single queries the way a caller sees them (wall clock: the host
query uploaded, matmul + topk, the result downloaded) and reports p50/p99 per query.
"""
import argparse
import json
import time

import numpy as np
import torch


def time_it(fn, repeat):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


def time_single_queries(base, base_norms, queries_host, k, count, dev):
    """Wall-clock microseconds per single query: upload, matmul + topk, download (p50, p99)."""
    def one(i):
        q = torch.from_numpy(queries_host[i:i + 1]).to(dev, non_blocking=False)
        d = (q * q).sum(1, keepdim=True) - 2.0 * q @ base.T + base_norms
        found = torch.topk(d, k, dim=1, largest=False, sorted=True)
        return found.indices.cpu(), found.values.cpu()
    for i in range(10):
        one(i % len(queries_host))
    torch.cuda.synchronize()
    us = []
    for i in range(count):
        start = time.perf_counter()
        one(i % len(queries_host))
        us.append((time.perf_counter() - start) * 1e6)
    us.sort()
    return {"p50_us": us[len(us) // 2], "p99_us": us[len(us) * 99 // 100], "min_us": us[0],
            "calls": len(us)}


def float64_truth(base, queries, k, chunk=100):
    """[nq, k] float64 squared-L2 distances of the k nearest rows, ascending."""
    base64 = base.double()
    base_norms = (base64 * base64).sum(1)
    out = []
    for i in range(0, queries.shape[0], chunk):
        q = queries[i:i + chunk].double()
        d = (q * q).sum(1, keepdim=True) - 2.0 * q @ base64.T + base_norms
        out.append(torch.topk(d, k, dim=1, largest=False, sorted=True).values)
    return torch.cat(out)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base")
    p.add_argument("--queries")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--nq", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--ids", help="write the best variant's result ids here (.npy)")
    p.add_argument("--batch1", type=int, default=0,
                   help="also time this many single queries, wall clock per query")
    p.add_argument("--skip-batch", action="store_true",
                   help="only the single-query timing (with --batch1)")
    p.add_argument("--check", help="ids of another engine ([nq, k]; .npy, else raw int64) to check "
                   "against float64 truth")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32: no TF32 shortcut for torch either
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    if a.base:
        base = torch.from_numpy(np.load(a.base)).to(dev).float()
        queries = torch.from_numpy(np.load(a.queries)).to(dev).float()
    else:
        g = torch.Generator(device=dev).manual_seed(1234)
        base = torch.randn(a.rows, a.dim, device=dev, generator=g)
        queries = torch.randn(a.nq, a.dim, device=dev, generator=g)
    base_norms = (base * base).sum(1)

    def by_matmul():
        d = (queries * queries).sum(1, keepdim=True) - 2.0 * queries @ base.T + base_norms
        return torch.topk(d, a.k, dim=1, largest=False, sorted=False)

    def by_cdist():
        d = torch.cdist(queries, base)  # Euclidean; its square ranks the same
        return torch.topk(d, a.k, dim=1, largest=False, sorted=False)

    if a.skip_batch:
        result = {"engine": "torch-exact-matmul", "rows": int(base.shape[0]),
                  "dim": int(base.shape[1]), "k": a.k, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(),
                  "batch1": time_single_queries(base, base_norms, queries.cpu().numpy(), a.k,
                                                a.batch1, dev)}
        print(json.dumps(result))
        return
    variants = {}
    for name, fn in (("matmul", by_matmul), ("cdist", by_cdist)):
        times = time_it(fn, a.repeat)
        variants[name] = {"median_ms": float(np.median(times)), "min_ms": float(np.min(times)),
                          "max_ms": float(np.max(times)), "runs": len(times)}
    best = min(variants, key=lambda n: variants[n]["median_ms"])
    result = {"engine": "torch-exact-best", "best": best,
              "median_ms": variants[best]["median_ms"], "variants": variants,
              "tf32": torch.backends.cuda.matmul.allow_tf32, "rows": int(base.shape[0]),
              "dim": int(base.shape[1]), "queries": int(queries.shape[0]), "k": a.k,
              "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if a.batch1 > 0:
        result["batch1"] = time_single_queries(base, base_norms, queries.cpu().numpy(), a.k,
                                               a.batch1, dev)
    if a.ids:
        found = (by_matmul if best == "matmul" else by_cdist)()
        np.save(a.ids, found.indices.cpu().numpy().astype(np.int64))
    if a.check:
        truth = float64_truth(base, queries, a.k)
        raw = (np.load(a.check) if a.check.endswith(".npy")
               else np.fromfile(a.check, dtype=np.int64).reshape(queries.shape[0], a.k))
        ids = torch.from_numpy(raw.astype(np.int64)).to(dev)
        valid = ids >= 0
        rows = base.double()[ids.clamp(min=0)]  # [nq, k, dim]
        got = ((rows - queries.double()[:, None, :]) ** 2).sum(2)
        got = torch.where(valid, got, torch.full_like(got, float("inf")))
        got_sorted = torch.sort(got, dim=1).values
        scale = truth.abs().clamp(min=1.0)
        deviation = ((got_sorted - truth).abs() / scale).max().item()
        result["check"] = {"max_rank_relative_deviation": deviation,
                           "ranks_off": int(((got_sorted - truth).abs() / scale > 1e-9).sum()),
                           "invalid_ids": int((~valid).sum())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
