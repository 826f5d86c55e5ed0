"""Consumer wait of a GPU training loop fed by torch's DataLoader against gpuopt.data.

    python bench/python/prefetch_bench.py [--batches 240 --workers 8 --step-ms 15 --json OUT]
                                          [--device cuda|cpu]

One synthetic Dataset for every loader: 4 MB float32 samples (value = index), each produced after
a sleep that stands for decode work; "constant" sleeps --sample-ms for every sample, "bursty"
sleeps --burst-sample-ms except one sample in --stall-every that sleeps --stall-ms. The same
worker count for every configuration:

- torch-pf2 / torch-pf8: DataLoader(pin_memory=True, prefetch_factor=2 / 8), the batch moved with
  .cuda(non_blocking=True) on the consumer's stream (the documented recipe);
- gpuopt: gpuopt.data.prefetch(DataLoader(prefetch_factor=2)) (adaptive depth; loader_ahead
  "auto" lets the DataLoader request more batches ahead as the depth grows: the cap it reached is
  reported);
- gpuopt-no-ahead (bursty only): the same with loader_ahead=False (the adaptive depth alone);
- native (constant only): gpuopt.data.RecordFile over a file of the same samples, pread.

The consumer runs --step-ms of GPU work per batch (torch.cuda._sleep on its stream, after reading
the batch) and synchronises once per step, as a loop that logs its loss does. Consumer wait % =
time blocked in next() / wall of the loop, after --warmup batches. Every batch's first element is
checked against its sample index.

`--device cpu` (no GPU needed): the same datasets and loaders with the consumer step a
time.sleep of --step-ms, torch-pf2/pf8 without pin_memory and gpuopt with device="cpu"; only the
constant and bursty scenarios run. `--sample-kib 64` keeps the same timing with smaller samples
where the host cannot move 4 MB samples through the workers' shared memory at the consumer's
rate (a 2-core machine: the copies, not the sleeps, then decide the wait).

Then H2D throughput of large batches (256 MiB, pageable and pinned sources) through
gpuopt.data.prefetch against a pinned-host-to-device copy of the same size in the same run (CUDA
events, best of 5). Prints a JSON document and `RESULT:` lines for scripts/gpu-check.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import gpuopt.data

SAMPLE_FLOATS = 1 << 20  # 4 MB float32 (--sample-kib changes it)


class Synthetic(Dataset):
    """4 MB samples whose production sleeps (decode stand-in); value = index."""

    def __init__(self, count: int, sample_ms: float, stall_every: int = 0, stall_ms: float = 0):
        self.count, self.sample_ms = count, sample_ms
        self.stall_every, self.stall_ms = stall_every, stall_ms
        self.floats = SAMPLE_FLOATS  # kept here: spawned workers do not see main()'s setting

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        stall = self.stall_every and index % self.stall_every == self.stall_every - 1
        time.sleep((self.stall_ms if stall else self.sample_ms) / 1000.0)
        return torch.full((self.floats,), float(index), dtype=torch.float32)


def cycles_for_ms(ms: float) -> int:
    """torch.cuda._sleep cycles that take about `ms` on this GPU (measured)."""
    probe = 1_000_000
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(probe)
    stop.record()
    stop.synchronize()
    return int(probe * ms / start.elapsed_time(stop))


def step(cycles: int | None, seconds: float) -> None:
    """The consumer's work for one batch: GPU sleep cycles, or a host sleep in CPU mode."""
    if cycles is None:
        time.sleep(seconds)
    else:
        torch.cuda._sleep(cycles)


def consume(batches, cycles: int | None, batch_size: int, warmup: int, move: bool,
            step_s: float = 0.0) -> dict:
    """Runs the training-loop stand-in; returns wait and wall after the warm-up batches."""
    iterator = iter(batches)
    wait = 0.0
    seen = 0
    first_index = 0
    began = None
    errors = 0
    per_batch = []
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if seen == warmup:
            began, wait, per_batch = t0, 0.0, []
        wait += t1 - t0
        per_batch.append(t1 - t0)
        if isinstance(batch, (tuple, list)):
            batch = batch[0]
        if move:
            batch = batch.cuda(non_blocking=True)
        head = batch.view(batch.shape[0], -1)[:, 0]  # one value per sample: its index
        step(cycles, step_s)
        expected = torch.arange(first_index, first_index + batch.shape[0], device=head.device)
        errors += int((head.float() != expected.float()).sum())  # the step's one sync
        first_index += batch.shape[0]
        seen += 1
    end = time.perf_counter()
    measured = seen - warmup
    wall = end - began if began is not None else 0.0
    return {
        "batches": measured,
        "wall_s": wall,
        "wait_s": wait,
        "wait_pct": 100.0 * wait / wall if wall > 0 else None,
        # Is the wait a few stalls or a little on every batch? next()'s time per batch, ms.
        "wait_per_batch_ms": {
            "median": 1e3 * statistics.median(per_batch) if per_batch else None,
            "p90": 1e3 * sorted(per_batch)[int(0.9 * (len(per_batch) - 1))] if per_batch else None,
            "max": 1e3 * max(per_batch) if per_batch else None,
            "over_1ms": sum(1 for w in per_batch if w > 1e-3),
        },
        "batches_per_s": measured / wall if wall > 0 else None,
        "value_errors": errors,
        "samples": first_index,
        "batch_size": batch_size,
    }


def loader_runs(args, cycles: int | None, scenario: str) -> list[dict]:
    if scenario == "constant":
        dataset = Synthetic(args.batches * args.batch_size, args.sample_ms)
    else:
        dataset = Synthetic(
            args.batches * args.batch_size, args.burst_sample_ms, args.stall_every, args.stall_ms
        )
    runs = []
    common = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=False)
    cuda = args.device == "cuda"
    for name, make, move in (
        ("torch-pf2", lambda: DataLoader(dataset, pin_memory=cuda, prefetch_factor=2, **common),
         cuda),
        ("torch-pf8", lambda: DataLoader(dataset, pin_memory=cuda, prefetch_factor=8, **common),
         cuda),
        ("gpuopt", lambda: gpuopt.data.prefetch(
            DataLoader(dataset, prefetch_factor=2, **common), device=args.device), False),
        ("gpuopt-no-ahead", lambda: gpuopt.data.prefetch(
            DataLoader(dataset, prefetch_factor=2, **common), device=args.device,
            loader_ahead=False), False),
    ):
        if name == "gpuopt-no-ahead" and scenario != "bursty":
            continue
        loader = make()
        result = consume(loader, cycles, args.batch_size, args.warmup, move, args.step_ms / 1000)
        result.update(scenario=scenario, config=name)
        if name.startswith("gpuopt"):
            stats = loader.stats()
            result["max_depth_reached"] = stats["max_depth_reached"]
            result["depth_timeline"] = stats["depth_timeline"][-6:]
            ahead = stats["loader_ahead"]
            result["loader_ahead"] = {
                "active": ahead["active"], "reason": ahead["reason"], "base": ahead.get("base"),
                "cap": ahead.get("cap"), "extra_tasks": ahead.get("extra_tasks"),
                "timeline": ahead.get("timeline", [])[-6:],
            }
        runs.append(result)
        print(f"# {scenario} {name}: wait {result['wait_pct']:.2f}% "
              f"{result['batches_per_s']:.1f} batches/s", file=sys.stderr, flush=True)
    return runs


def native_run(args, cycles: int) -> dict:
    count = args.batches * args.batch_size
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        path = os.path.join(scratch, "samples.bin")
        with open(path, "wb") as file:
            for index in range(count):
                file.write(np.full(SAMPLE_FLOATS, float(index), dtype=np.float32).tobytes())
        source = gpuopt.data.RecordFile(
            path, SAMPLE_FLOATS * 4, batch_size=args.batch_size, shape=(SAMPLE_FLOATS,),
            dtype="float32", workers=args.workers, io="pread", device="cuda",
        )
        result = consume(source, cycles, args.batch_size, args.warmup, False)
        stats = source.stats()
    result.update(scenario="constant", config="native-record-file",
                  max_depth_reached=stats.get("max_depth_reached"),
                  h2d_gbps=stats.get("h2d_gbps"), io=stats.get("io"))
    return result


def h2d_runs(args) -> dict:
    nbytes = args.h2d_mib << 20
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 0.0
    for _ in range(5):
        start.record()
        device.copy_(pinned, non_blocking=True)
        stop.record()
        stop.synchronize()
        best = max(best, nbytes / (start.elapsed_time(stop) / 1000.0) / 1e9)
    # torch's own copy from pageable memory (the driver stages it through its pinned buffers).
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    best_pageable = 0.0
    for _ in range(5):
        start.record()
        device.copy_(pageable, non_blocking=True)
        stop.record()
        stop.synchronize()
        best_pageable = max(best_pageable, nbytes / (start.elapsed_time(stop) / 1000.0) / 1e9)
    del device
    result = {"batch_bytes": nbytes, "reference_pinned_gbps": best,
              "reference_pageable_gbps": best_pageable}
    for kind, threads in (("pageable", 4), ("pageable_8_threads", 8), ("pinned", 4)):
        if kind.startswith("pageable"):
            source = [pageable, torch.ones(nbytes, dtype=torch.uint8)]
        else:
            source = [pinned, torch.ones(nbytes, dtype=torch.uint8).pin_memory()]
        batches = [source[i % 2] for i in range(args.h2d_batches)]
        loader = gpuopt.data.prefetch(batches, device="cuda", depth=2, copy_threads=threads)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0
        for batch in loader:
            total += batch.numel()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        staging = loader.stats()["staging"]
        result[kind] = {
            "staged_gbps": staging["h2d_gbps"],  # per batch: first host copy to last DMA
            "loop_gbps": total / wall / 1e9,  # the whole loop, producer and consumer
            "fraction_of_reference": total / wall / 1e9 / best,
        }
    return result


def main() -> None:
    global SAMPLE_FLOATS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=240)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=15.0)
    parser.add_argument("--sample-ms", type=float, default=8.0)
    parser.add_argument("--burst-sample-ms", type=float, default=2.0)
    parser.add_argument("--stall-every", type=int, default=36)  # not a multiple of the workers
    parser.add_argument("--stall-ms", type=float, default=300.0)
    parser.add_argument("--h2d-mib", type=int, default=256)
    parser.add_argument("--h2d-batches", type=int, default=12)
    parser.add_argument("--scratch", default=None, help="folder for the record file")
    parser.add_argument("--only", default="", help="comma list: constant,bursty,native,h2d")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: host-sleep consumer, CPU batches; constant and bursty only")
    parser.add_argument("--sample-kib", type=int, default=4096,
                        help="bytes per sample / 1024 (float32)")
    args = parser.parse_args()
    SAMPLE_FLOATS = args.sample_kib * 1024 // 4
    only = set(filter(None, args.only.split(",")))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.init()
        cycles = cycles_for_ms(args.step_ms)
        name = torch.cuda.get_device_name()
    else:
        cycles, name = None, f"cpu ({os.cpu_count()} cores)"
    doc = {"device": name, "torch": torch.__version__, "args": vars(args), "runs": []}
    for scenario in ("constant", "bursty"):
        if not only or scenario in only:
            doc["runs"] += loader_runs(args, cycles, scenario)
    if cuda and (not only or "native" in only):
        doc["runs"].append(native_run(args, cycles))
    if cuda and (not only or "h2d" in only):
        doc["h2d"] = h2d_runs(args)
    text = json.dumps(doc, indent=2)
    if args.json:
        with open(args.json, "w") as file:
            file.write(text)
    else:
        print(text)

    by = {(r["scenario"], r["config"]): r for r in doc["runs"]}
    for scenario in ("constant", "bursty"):
        runs = [r for r in doc["runs"] if r["scenario"] == scenario]
        if not runs:
            continue
        parts = " ".join(f"{r['config']}={r['wait_pct']:.2f}% ({r['batches_per_s']:.1f}/s)"
                         for r in runs)
        errors = sum(r["value_errors"] for r in runs)
        line = f"RESULT: prefetch {scenario}: wait {parts}; value errors {errors}"
        gp, pf2 = by.get((scenario, "gpuopt")), by.get((scenario, "torch-pf2"))
        if gp and pf2:
            ratio = pf2["wait_pct"] / max(gp["wait_pct"], 1e-9)
            speed = gp["batches_per_s"] / pf2["batches_per_s"]
            ahead = gp["loader_ahead"]
            cap = (f"loader-ahead cap {ahead['cap']} (loader's own {ahead['base']})"
                   if ahead["active"] else f"loader-ahead inactive: {ahead['reason']}")
            line += (f"; gpuopt max depth {gp['max_depth_reached']}, {cap}, wait {ratio:.1f}x "
                     f"less than pf2, rate {speed:.2f}x of pf2")
            for r in (gp, pf2):
                w = r["wait_per_batch_ms"]
                line += (f"; {r['config']} next() per batch median {w['median']:.3f} ms, p90 "
                         f"{w['p90']:.3f}, max {w['max']:.1f}, {w['over_1ms']} over 1 ms")
            reasons = [e.get("reason", "") for e in gp.get("depth_timeline", [])]
            line += "; gpuopt depth timeline: " + " | ".join(reasons)
        print(line)
    if "h2d" in doc:
        h = doc["h2d"]
        # Batches delivered per second of the whole loop (producer, staging and consumer), as a
        # fraction of the pinned copy reference timed just before.
        print(f"RESULT: prefetch h2d {h['batch_bytes'] >> 20} MiB batches: gpuopt from pageable "
              f"{h['pageable']['loop_gbps']:.1f} GB/s "
              f"({100 * h['pageable']['fraction_of_reference']:.0f}% of pinned), 8 copy threads "
              f"{h['pageable_8_threads']['loop_gbps']:.1f} GB/s "
              f"({100 * h['pageable_8_threads']['fraction_of_reference']:.0f}%), from pinned "
              f"{h['pinned']['loop_gbps']:.1f} GB/s "
              f"({100 * h['pinned']['fraction_of_reference']:.0f}%); references: torch copy_ "
              f"from pinned {h['reference_pinned_gbps']:.1f} GB/s, from pageable "
              f"{h['reference_pageable_gbps']:.1f} GB/s")


if __name__ == "__main__":
    main()
