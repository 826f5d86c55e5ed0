"""Per-call overhead of the W4A16 layer from Python on the GPU.

    python bench/python/w4a16_overhead.py [--k 8192 --n 28672 --m 1 --iters 500]

Times W4A16Linear.forward back to back with torch tensors in and out (CUDA events around ITERS
calls, the median of REPEATS such blocks), and the same call captured in a CUDA graph and replayed
ITERS times (the kernel's own time with no Python or launch cost). The difference per call is what
Python adds. Prints one JSON object; the `RESULT:` line is for scripts/gpu-check.sh's table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gptq_layer import write_synthetic  # noqa: E402

import gpuopt.quant  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--n", type=int, default=28672)
    parser.add_argument("--m", type=int, default=1)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        name = write_synthetic(scratch, k=args.k, n=args.n)
        layer = gpuopt.quant.load_layer(scratch, name, dtype="float16")
    linear = gpuopt.quant.W4A16Linear(layer, device="cuda")
    x = torch.randn(args.m, args.k, dtype=torch.float16, device="cuda")
    for _ in range(20):  # plan, workspace, module load
        linear(x)
    torch.cuda.synchronize()

    def timed(body) -> float:
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        body()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1000.0 / args.iters  # us per call

    def eager() -> None:
        for _ in range(args.iters):
            linear(x)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        linear(x)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(args.iters):
                y_graph = linear(x)
    torch.cuda.synchronize()

    eager_us, graph_us, host_us = [], [], []
    for _ in range(args.repeats):  # interleaved, so drift hits both
        eager_us.append(timed(eager))
        graph_us.append(timed(graph.replay))
        # The host's own cost per call: the loop's wall time without waiting for the GPU (the
        # launch queue holds far more than ITERS kernels, so the loop never blocks on it).
        torch.cuda.synchronize()
        begin = time.perf_counter()
        eager()
        host_us.append((time.perf_counter() - begin) * 1e6 / args.iters)
        torch.cuda.synchronize()
    y_eager = linear(x)
    torch.cuda.synchronize()
    same = bool(torch.equal(y_eager, y_graph))
    eager_med, graph_med = statistics.median(eager_us), statistics.median(graph_us)
    result = {
        "k": args.k, "n": args.n, "m": args.m, "iters": args.iters, "repeats": args.repeats,
        "eager_us_per_call": eager_us, "graph_us_per_call": graph_us,
        "eager_median_us": eager_med, "graph_median_us": graph_med,
        "overhead_us": eager_med - graph_med,
        "host_us_per_call": host_us,
        "host_median_us": statistics.median(host_us),
        # Bitwise: the default (non-deterministic) mode's split-K sums may differ in the last bit.
        "graph_replay_bitwise_equal": same,
    }
    print(json.dumps(result))
    spread = lambda v: (max(v) - min(v)) / statistics.median(v) * 100  # noqa: E731
    print(f"RESULT: python W4A16 K={args.k} N={args.n} M={args.m}: eager {eager_med:.1f} us "
          f"(±{spread(eager_us):.1f}%), graph {graph_med:.1f} us (±{spread(graph_us):.1f}%), "
          f"Python adds {eager_med - graph_med:.2f} us per call, host time per call "
          f"{statistics.median(host_us):.1f} us")


if __name__ == "__main__":
    main()
