"""gpuopt.vector from Python against the C++ figures of the same store, in one run.

    python bench/python/vector_bench.py [--rows 1000000 --dim 128 --queries 1000 --k 10]
        [--repeat 20 --single 200] [--gpuopt PATH] [--out DIR]

Data: numpy ``default_rng(1234)`` standard normal float32, rows [rows, dim] then queries
[queries, dim] (the draws of scripts/gpu-check.d/vector.sh). Measures, wall clock as a caller sees
it:

- ``add``: the rows as one torch CUDA tensor (the device-pointer ingest) and as one numpy array,
  into fresh stores, in rows/s; and the CLI's ``gpuopt vector import --batch ROWS`` of the same rows
  from a .npy (the C++ commit path; its ``ingest_vectors_per_s``).
- ``query`` on the GPU engine (exact, k): batch ``queries`` (median of ``repeat`` calls) and batch 1
  (p50 and p99 of ``single`` calls, one query each), with numpy queries (results on the host) and
  with torch CUDA queries (results stay on the device; the time includes a stream synchronisation
  so the results are ready). The first call of each, which copies the rows to the device, is not
  timed (its ``gpu_upload_seconds`` is printed).
- The C++ reference: ``gpuopt vector query STORE FILE --engine gpu --repeat N --json`` on the same
  store and the same queries (batch ``queries`` and batch 1), its ``query_seconds`` median, which
  times ``Collection::query`` the same way (first call untimed).

Prints one JSON object, then ``RESULT:`` lines (for scripts/gpu-check.sh's table), with the ratio
Python / C++ (the target is at most 1.10).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import gpuopt
import gpuopt.vector


def cli_path(given: str | None) -> str | None:
    if given:
        return given
    bundled = os.path.join(os.environ.get("GPUOPT_BIN", ""), "gpuopt")
    if os.environ.get("GPUOPT_BIN") and os.access(bundled, os.X_OK):
        return bundled
    return shutil.which("gpuopt")


def run_cli(cli: str, *arguments: str) -> dict:
    done = subprocess.run([cli, *arguments], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{cli} {' '.join(arguments)}: exit {done.returncode}: {done.stderr}")
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def profile_calls(call, batches: list, calls: int) -> list[dict]:
    """cProfile over `calls` calls: the functions by their own time, per call (the native query
    shows as one builtin method; cProfile's own overhead inflates the Python frames alike)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(calls):
        call(batches[i % len(batches)])
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tottime, cumtime, ...)}
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.items():
        where = f"{os.path.basename(file)}:{line}({name})" if line else name
        rows.append({"function": where, "calls_per_query": ncalls / calls,
                     "own_us_per_query": tottime / calls * 1e6,
                     "cumulative_us_per_query": cumtime / calls * 1e6})
    rows.sort(key=lambda row: row["own_us_per_query"], reverse=True)
    return rows[:12]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20, help="timed calls at full batch")
    parser.add_argument("--single", type=int, default=200, help="timed calls at batch 1")
    parser.add_argument("--gpuopt", help="the gpuopt CLI (default $GPUOPT_BIN/gpuopt, PATH)")
    parser.add_argument("--out", help="keep the CLI's JSON here")
    parser.add_argument("--profile", type=int, default=0, metavar="CALLS",
                        help="also profile CALLS batch-1 torch CUDA queries (cProfile) and print "
                             "where each call's time goes")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("RESULT: python vector bench: skipped, torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("RESULT: python vector bench: skipped, no CUDA device visible to torch")
        return 0
    if not gpuopt.built_with_cuda:
        print("RESULT: python vector bench: skipped, gpuopt was built without CUDA")
        return 0
    rng = np.random.default_rng(1234)
    base = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    cli = cli_path(args.gpuopt)
    result: dict = {
        "rows": args.rows,
        "dim": args.dim,
        "queries": args.queries,
        "k": args.k,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "cli": cli,
    }
    with tempfile.TemporaryDirectory(prefix="gpuopt-pyvec-") as scratch:
        # add: torch CUDA tensor (the store the queries then use), numpy, and the CLI's import.
        device_base = torch.from_numpy(base).cuda()
        torch.cuda.synchronize()
        with gpuopt.vector.open(os.path.join(scratch, "numpy"), create=True) as store:
            collection = store.create_collection("default", dim=args.dim)
            start = time.perf_counter()
            collection.add(base)
            result["add_numpy_rows_per_s"] = args.rows / (time.perf_counter() - start)
        shutil.rmtree(os.path.join(scratch, "numpy"))
        store_path = os.path.join(scratch, "store")
        store = gpuopt.vector.open(store_path, create=True)
        collection = store.create_collection("default", dim=args.dim)
        start = time.perf_counter()
        collection.add(device_base)
        result["add_torch_cuda_rows_per_s"] = args.rows / (time.perf_counter() - start)
        del device_base
        torch.cuda.empty_cache()
        np.save(os.path.join(scratch, "queries.npy"), queries)
        np.save(os.path.join(scratch, "query1.npy"), queries[:1])
        if cli:
            np.save(os.path.join(scratch, "base.npy"), base)
            run_cli(cli, "vector", "create", os.path.join(scratch, "imported"),
                    "--dim", str(args.dim), "--json")
            imported = run_cli(cli, "vector", "import", os.path.join(scratch, "imported"),
                               os.path.join(scratch, "base.npy"), "--batch", str(args.rows),
                               "--json")
            result["cli_import_rows_per_s"] = imported["ingest_vectors_per_s"]
            shutil.rmtree(os.path.join(scratch, "imported"))
            os.remove(os.path.join(scratch, "base.npy"))
        del base

        # query on the GPU engine: the first call makes the resident copy (untimed).
        _, _, report = collection.query(queries, k=args.k, engine="gpu", report=True)
        result["gpu_upload_seconds"] = report["gpu_upload_seconds"]
        device_queries = torch.from_numpy(queries).cuda()
        stream = torch.cuda.current_stream()

        def host_call(batch: np.ndarray) -> float:
            start = time.perf_counter()
            collection.query(batch, k=args.k, engine="gpu")
            return time.perf_counter() - start

        def cuda_call(batch) -> float:
            start = time.perf_counter()
            collection.query(batch, k=args.k, engine="gpu")
            stream.synchronize()
            return time.perf_counter() - start

        for name, call, batch_all, rows in (
            ("numpy", host_call, queries, [queries[i : i + 1] for i in range(args.queries)]),
            (
                "torch_cuda",
                cuda_call,
                device_queries,
                [device_queries[i : i + 1] for i in range(args.queries)],
            ),
        ):
            call(batch_all)  # warm-up of this path
            full = [call(batch_all) for _ in range(args.repeat)]
            call(rows[0])
            single = [call(rows[i % len(rows)]) for i in range(args.single)]
            result[f"query_{name}_batch_seconds"] = statistics.median(full)
            result[f"query_{name}_batch_qps"] = args.queries / statistics.median(full)
            result[f"query_{name}_single_p50_seconds"] = percentile(single, 0.5)
            result[f"query_{name}_single_p99_seconds"] = percentile(single, 0.99)
        if args.profile > 0:
            result["profile_torch_cuda_single"] = profile_calls(
                cuda_call, [device_queries[i : i + 1] for i in range(args.queries)], args.profile)
        _, _, report = collection.query(device_queries[:1], k=args.k, report=True)
        result["default_engine_cuda_queries"] = report["engine"]
        result["queries_on_device"] = report["queries_on_device"]
        info = collection.info()
        result["gpu_copy"] = info["gpu"]

        store.close()  # frees the GPU copy; the CLI then opens the store on its own
        # The C++ reference: the CLI on the same store and the same queries.
        if cli:
            for name, file, repeat in (
                ("batch", "queries.npy", args.repeat),
                ("single", "query1.npy", args.single),
            ):
                out = run_cli(cli, "vector", "query", store_path, os.path.join(scratch, file),
                              "--engine", "gpu", "--k", str(args.k), "--repeat", str(repeat),
                              "--json")
                result[f"cli_{name}_seconds"] = out["query_seconds"]
                result[f"cli_{name}_p99_seconds"] = percentile(out["query_seconds_all"], 0.99)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, f"cli_{name}.json"), "w") as handle:
                        json.dump(out, handle)

    print(json.dumps(result, indent=2))
    shape = f"{args.rows // 1000}k x {args.dim}" if args.rows < 1_000_000 else (
        f"{args.rows / 1e6:g}M x {args.dim}")
    print(f"RESULT: python vector add {shape} from torch CUDA: "
          f"{result['add_torch_cuda_rows_per_s']:.0f} rows/s")
    numpy_rate = result["add_numpy_rows_per_s"]
    line = f"RESULT: python vector add {shape} from numpy: {numpy_rate:.0f} rows/s"
    if "cli_import_rows_per_s" in result:
        cli_rate = result["cli_import_rows_per_s"]
        line += f" (CLI import {cli_rate:.0f} rows/s; C++/python {cli_rate / numpy_rate:.2f})"
    print(line)
    for name in ("numpy", "torch_cuda"):
        batch_ms = result[f"query_{name}_batch_seconds"] * 1e3
        line = (f"RESULT: python vector query {shape} gpu batch {args.queries} ({name} queries): "
                f"{batch_ms:.3f} ms, {result[f'query_{name}_batch_qps']:.0f} QPS")
        if "cli_batch_seconds" in result:
            cli_ms = result["cli_batch_seconds"] * 1e3
            line += f"; CLI {cli_ms:.3f} ms (python/C++ {batch_ms / cli_ms:.2f})"
        print(line)
        p50 = result[f"query_{name}_single_p50_seconds"] * 1e6
        p99 = result[f"query_{name}_single_p99_seconds"] * 1e6
        line = (f"RESULT: python vector query {shape} gpu batch 1 ({name} queries): "
                f"p50 {p50:.0f} us, p99 {p99:.0f} us")
        if "cli_single_seconds" in result:
            cli_us = result["cli_single_seconds"] * 1e6
            line += f"; CLI p50 {cli_us:.0f} us (python/C++ {p50 / cli_us:.2f})"
        print(line)
    for row in result.get("profile_torch_cuda_single", []):
        print(f"RESULT: python vector query batch 1 (torch_cuda queries) profile: "
              f"{row['own_us_per_query']:.1f} us own, {row['cumulative_us_per_query']:.1f} us "
              f"with callees, {row['calls_per_query']:g} calls per query: {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
