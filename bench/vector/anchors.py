#!/usr/bin/env python3
"""FAISS and hnswlib next to gpuopt on the same data, in the same run.

For each data set: float64 brute-force truth; gpuopt's IVF (CPU and GPU engines, nprobe swept, the
index built by `gpuopt vector reindex`) and exact GPU search through the CLI; FAISS IndexIVFFlat
with gpuopt's nlist (nprobe swept), FAISS IndexHNSWFlat and hnswlib (ef swept). Each point:
recall@10 against the truth, queries/s at batch 1000 and the p50 latency of single queries. Then,
per recall target, the fastest point of each engine that reaches it. Prints one `RESULT:` line per
figure and writes everything to OUT/anchors.json.

Data sets (`--datasets`): `fm`, the 60k x 784 synthetic clustered set of
scripts/gpu-check.d/vector_ivf.sh (Fashion-MNIST's shape, same generator and seed), and
`clustered1m`, 1M x 128 synthetic clustered (vector_ivf.sh's build set, seed 1), with 1000 queries
from the same blobs. `--rows-*` shrink them for a quick check.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

K = 10


def fm_data(rows, queries):
    r = np.random.default_rng(7)
    basis = r.standard_normal((40, 784), dtype=np.float32)
    centres = r.standard_normal((300, 40), dtype=np.float32) @ basis * 0.35
    labels = r.integers(0, 300, rows + queries)
    data = (centres[labels] + r.standard_normal((rows + queries, 784), dtype=np.float32)).astype(
        np.float32
    )
    return data[:rows], data[rows:]


def clustered_data(rows, queries):
    r = np.random.default_rng(1)
    centres = r.standard_normal((1000, 128), dtype=np.float32) * 3.0
    labels = r.integers(0, 1000, rows + queries)
    data = (centres[labels] + r.standard_normal((rows + queries, 128), dtype=np.float32)).astype(
        np.float32
    )
    return data[:rows], data[rows:]


def truth_of(base, queries):
    """Indices of the K nearest rows by float64 L2, in blocks of queries."""
    b = base.astype(np.float64)
    norms = (b * b).sum(1)
    out = np.empty((len(queries), K), dtype=np.int64)
    for start in range(0, len(queries), 100):
        q = queries[start : start + 100].astype(np.float64)
        d = norms[None, :] - 2.0 * q @ b.T
        part = np.argpartition(d, K, axis=1)[:, :K]
        order = np.take_along_axis(d, part, 1).argsort(1)
        out[start : start + 100] = np.take_along_axis(part, order, 1)
    return out


def recall(found, truth):
    return float(
        np.mean([len(set(map(int, f)) & set(map(int, t))) / K for f, t in zip(found, truth)])
    )


def batch_qps(search, queries, repeat=3):
    """search(queries) -> ids; best of `repeat` for the rate, the ids of the last call."""
    best, ids = None, None
    for _ in range(repeat):
        start = time.perf_counter()
        ids = search(queries)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return len(queries) / best, ids


def single_p50_us(search, queries, count):
    times = []
    for i in range(count):
        q = queries[i % len(queries)][None, :]
        start = time.perf_counter()
        search(q)
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


class Gpuopt:
    def __init__(self, binary, work):
        self.binary, self.work = binary, work

    def run(self, *args):
        p = subprocess.run([self.binary, *args], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"gpuopt {' '.join(args[:2])}: {p.stderr.strip()[:300]}")
        return p.stdout

    def query(self, store, queries_file, repeat, *extra):
        doc = json.loads(
            self.run(
                "vector",
                "query",
                store,
                queries_file,
                "--k",
                str(K),
                "--repeat",
                str(repeat),
                "--json",
                *extra,
            ).splitlines()[-1]
        )
        ids = [[h["id"] for h in row] for row in doc["results"]]
        return doc, ids


def gpuopt_points(args, name, base, queries, truth, work, points):
    g = Gpuopt(args.gpuopt, work)
    store = os.path.join(work, f"{name}_store")
    np.save(os.path.join(work, "base.npy"), base)
    qfile = os.path.join(work, "queries.npy")
    one = os.path.join(work, "one.npy")
    np.save(qfile, queries)
    np.save(one, queries[:1])
    g.run("vector", "create", store, "--dim", str(base.shape[1]))
    g.run("vector", "import", store, os.path.join(work, "base.npy"), "--batch", "50000")
    os.remove(os.path.join(work, "base.npy"))
    nlist = None
    for engine in args.engines:
        try:
            built = json.loads(
                g.run("vector", "reindex", store, "--engine", engine, "--json").splitlines()[-1]
            )
            nlist = built["nlist"]
            print(
                f"gpuopt {name}: IVF built on {engine}: nlist {nlist}, "
                f"{built.get('build_seconds', 0):.2f} s",
                flush=True,
            )
            break
        except (RuntimeError, KeyError, ValueError) as error:  # no GPU: try the next engine
            print(f"gpuopt {name}: reindex on {engine} failed: {error}", flush=True)
    for engine in args.engines:
        for nprobe in args.nprobes:
            try:
                doc, ids = g.query(
                    store, qfile, 5, "--index", "ivf", "--engine", engine, "--nprobe", str(nprobe)
                )
                single, _ = g.query(
                    store,
                    one,
                    args.single,
                    "--index",
                    "ivf",
                    "--engine",
                    engine,
                    "--nprobe",
                    str(nprobe),
                )
            except (RuntimeError, KeyError, ValueError) as error:
                print(
                    f"RESULT: anchors {name} gpuopt ivf {engine} nprobe {nprobe}: failed ({error})"
                )
                break
            points.append(
                {
                    "dataset": name,
                    "engine": f"gpuopt-ivf-{engine}",
                    "param": f"nprobe={nprobe}",
                    "recall": recall(ids, truth),
                    "qps_b1000": doc["queries_per_s"],
                    "p50_b1_us": single["query_seconds"] * 1e6,
                }
            )
        if engine == "gpu":
            try:
                doc, ids = g.query(store, qfile, 10, "--engine", "gpu")
                single, _ = g.query(store, one, args.single, "--engine", "gpu")
                points.append(
                    {
                        "dataset": name,
                        "engine": "gpuopt-exact-gpu",
                        "param": "exact",
                        "recall": recall(ids, truth),
                        "qps_b1000": doc["queries_per_s"],
                        "p50_b1_us": single["query_seconds"] * 1e6,
                    }
                )
            except (RuntimeError, KeyError, ValueError) as error:
                print(f"RESULT: anchors {name} gpuopt exact gpu: failed ({error})")
    return nlist


def faiss_points(args, name, base, queries, truth, nlist, points):
    try:
        import faiss
    except ImportError as error:
        print(f"RESULT: anchors {name} faiss: not importable ({error})")
        return
    d = base.shape[1]
    nlist = nlist or max(1, int(4 * np.sqrt(len(base))))
    quantizer = faiss.IndexFlatL2(d)
    ivf = faiss.IndexIVFFlat(quantizer, d, nlist)
    start = time.perf_counter()
    ivf.train(base)
    ivf.add(base)
    print(
        f"faiss {name}: IVFFlat nlist {nlist} built in {time.perf_counter() - start:.2f} s "
        f"({faiss.omp_get_max_threads()} threads)",
        flush=True,
    )
    for nprobe in args.nprobes:
        ivf.nprobe = nprobe
        search = lambda q: ivf.search(q, K)[1]
        qps, ids = batch_qps(search, queries)
        points.append(
            {
                "dataset": name,
                "engine": "faiss-ivfflat",
                "param": f"nprobe={nprobe}",
                "recall": recall(ids, truth),
                "qps_b1000": qps,
                "p50_b1_us": single_p50_us(search, queries, args.single),
            }
        )
    hnsw = faiss.IndexHNSWFlat(d, args.hnsw_m)
    hnsw.hnsw.efConstruction = args.ef_construction
    start = time.perf_counter()
    hnsw.add(base)
    print(
        f"faiss {name}: HNSWFlat M {args.hnsw_m} built in {time.perf_counter() - start:.2f} s",
        flush=True,
    )
    for ef in args.efs:
        hnsw.hnsw.efSearch = ef
        search = lambda q: hnsw.search(q, K)[1]
        qps, ids = batch_qps(search, queries)
        points.append(
            {
                "dataset": name,
                "engine": "faiss-hnsw",
                "param": f"ef={ef}",
                "recall": recall(ids, truth),
                "qps_b1000": qps,
                "p50_b1_us": single_p50_us(search, queries, args.single),
            }
        )


def hnswlib_points(args, name, base, queries, truth, points):
    try:
        import hnswlib
    except ImportError as error:
        print(f"RESULT: anchors {name} hnswlib: not importable ({error})")
        return
    index = hnswlib.Index(space="l2", dim=base.shape[1])
    index.init_index(
        max_elements=len(base), M=args.hnsw_m, ef_construction=args.ef_construction, random_seed=100
    )
    start = time.perf_counter()
    index.add_items(base, np.arange(len(base)), num_threads=-1)
    print(
        f"hnswlib {name}: M {args.hnsw_m} built in {time.perf_counter() - start:.2f} s", flush=True
    )
    for ef in args.efs:
        index.set_ef(max(ef, K))
        search = lambda q: index.knn_query(q, k=K, num_threads=-1)[0]
        qps, ids = batch_qps(search, queries)
        points.append(
            {
                "dataset": name,
                "engine": "hnswlib",
                "param": f"ef={ef}",
                "recall": recall(ids, truth),
                "qps_b1000": qps,
                "p50_b1_us": single_p50_us(search, queries, args.single),
            }
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpuopt", required=True, help="the gpuopt CLI")
    parser.add_argument("--out", required=True, help="directory for anchors.json")
    parser.add_argument("--datasets", nargs="+", default=["fm", "clustered1m"])
    parser.add_argument("--rows-fm", type=int, default=60_000)
    parser.add_argument("--rows-1m", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["gpu", "cpu"],
        help="gpuopt engines (reindex uses the first that works)",
    )
    parser.add_argument(
        "--nprobes", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    )
    parser.add_argument("--efs", type=int, nargs="+", default=[10, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--single", type=int, default=200, help="single queries per p50")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.90, 0.95, 0.99])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    points = []
    for name in args.datasets:
        if name == "fm":
            base, queries = fm_data(args.rows_fm, args.queries)
        elif name == "clustered1m":
            base, queries = clustered_data(args.rows_1m, args.queries)
        else:
            parser.error(f"--datasets: unknown {name!r} (fm, clustered1m)")
        label = f"{name} {len(base)}x{base.shape[1]}"
        start = time.perf_counter()
        truth = truth_of(base, queries)
        print(f"{label}: truth in {time.perf_counter() - start:.1f} s", flush=True)
        first = len(points)
        with tempfile.TemporaryDirectory(prefix="gpuopt-anchors-") as work:
            nlist = gpuopt_points(args, label, base, queries, truth, work, points)
        faiss_points(args, label, base, queries, truth, nlist, points)
        hnswlib_points(args, label, base, queries, truth, points)
        for p in points[first:]:
            print(
                f"RESULT: anchors {label} {p['engine']} {p['param']}: recall@10 "
                f"{p['recall']:.4f}, {p['qps_b1000']:.0f} q/s at batch {len(queries)}, batch-1 "
                f"p50 {p['p50_b1_us']:.1f} us"
            )
        engines = sorted({p["engine"] for p in points[first:]})
        for target in args.targets:
            best = []
            for engine in engines:
                ok = [p for p in points[first:] if p["engine"] == engine and p["recall"] >= target]
                if ok:
                    p = max(ok, key=lambda p: p["qps_b1000"])
                    best.append(
                        f"{engine} {p['qps_b1000']:.0f} q/s ({p['param']}, recall "
                        f"{p['recall']:.4f}, b=1 p50 {p['p50_b1_us']:.0f} us)"
                    )
                else:
                    best.append(f"{engine} not reached")
            print(
                f"RESULT: anchors {label} recall@10>={target:.2f}, fastest at batch "
                f"{len(queries)}: " + "; ".join(best)
            )
    with open(os.path.join(args.out, "anchors.json"), "w") as f:
        json.dump({"k": K, "points": points}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
