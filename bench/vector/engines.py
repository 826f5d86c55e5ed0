#!/usr/bin/env python3
"""Runs one external vector engine on the same data and queries as `gpuopt bench vector`.

`--compare` instead runs, in one go: `gpuopt bench vector` (exact and IVF on the CPU, exporting its
data and float64 ground truth), then FAISS flat/IVF (same nlist, nprobe and threads), hnswlib,
embedded Chroma and Qdrant Edge (HNSW at their defaults and at a higher ef) on that exported
data, each engine `--repeat` times, and prints one table (and JSON with --json-out).

Reads base.npy / queries.npy / truth_ids.npy / truth_distances.npy from --data, builds the
engine's index, and prints one JSON object: build time, peak RSS, and for each configuration
(nprobe / ef) recall@k (id overlap and ann-benchmarks' distance rule), QPS at batch 1 and at the
full batch, and batch-1 latency p50/p99. Engines whose package is missing report "unavailable".
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def recall(found_ids, base, queries, truth_ids, truth_distances, k):
    """Id overlap, and ann-benchmarks' k-nn rule (the same as `gpuopt bench vector`): a returned
    id counts when its true Euclidean distance, recomputed in float64, is at most the k-th true
    Euclidean distance (truth_distances) + 1e-3."""
    overlap = 0
    by_distance = 0
    for q in range(len(queries)):
        ids = [int(i) for i in found_ids[q][:k] if 0 <= i < len(base)]
        overlap += len(set(ids) & set(int(t) for t in truth_ids[q][:k]))
        if ids:
            diff = base[ids].astype(np.float64) - queries[q].astype(np.float64)
            d = np.sqrt((diff ** 2).sum(axis=1))
            by_distance += int((d <= truth_distances[q][k - 1] + 1e-3).sum())
    total = len(queries) * k
    return overlap / total, by_distance / total


def measure(search_batch, search_one, base, queries, truth_ids, truth_distances, k, single):
    search_batch(queries[:min(len(queries), 50)])  # warm-up, as gpuopt bench vector does
    start = time.perf_counter()
    ids = search_batch(queries)
    batch_seconds = time.perf_counter() - start
    latencies = []
    for q in range(min(single, len(queries))):
        t0 = time.perf_counter()
        search_one(queries[q:q + 1])
        latencies.append(time.perf_counter() - t0)
    latencies = np.array(latencies)
    r_ids, r_dist = recall(ids, base, queries, truth_ids, truth_distances, k)
    return {
        "recall_ids": r_ids,
        "recall_distance": r_dist,
        "qps_batch": len(queries) / batch_seconds,
        "qps_batch1": len(latencies) / latencies.sum() if len(latencies) else None,
        "latency_p50_ms": float(np.percentile(latencies, 50) * 1e3) if len(latencies) else None,
        "latency_p99_ms": float(np.percentile(latencies, 99) * 1e3) if len(latencies) else None,
    }


def run(args):
    base = np.load(f"{args.data}/base.npy").astype(np.float32)
    queries = np.load(f"{args.data}/queries.npy").astype(np.float32)
    truth_ids = np.load(f"{args.data}/truth_ids.npy")
    truth_distances = np.load(f"{args.data}/truth_distances.npy")
    k = args.k
    params = [int(p) for p in args.params.split(",") if p]
    out = {"engine": args.engine, "configs": []}
    engine = args.engine
    rss_before = peak_rss_mib()
    if engine.startswith("faiss"):
        import faiss
        faiss.omp_set_num_threads(args.threads)
        out["version"] = faiss.__version__
        start = time.perf_counter()
        if engine == "faiss-flat":
            index = faiss.IndexFlatL2(base.shape[1])
        elif engine == "faiss-ivf":
            quantizer = faiss.IndexFlatL2(base.shape[1])
            index = faiss.IndexIVFFlat(quantizer, base.shape[1], args.nlist)
            index.cp.niter = args.iterations
            index.train(base)
        elif engine == "faiss-hnsw":
            index = faiss.IndexHNSWFlat(base.shape[1], args.hnsw_m)
            index.hnsw.efConstruction = args.ef_construction
        else:
            raise SystemExit(f"unknown engine {engine}")
        index.add(base)
        out["build_seconds"] = time.perf_counter() - start
        settings = params if engine != "faiss-flat" else [0]
        for p in settings:
            if engine == "faiss-ivf":
                index.nprobe = p
            elif engine == "faiss-hnsw":
                index.hnsw.efSearch = p
            fn = lambda x: index.search(x, k)[1]
            row = measure(fn, fn, base, queries, truth_ids, truth_distances, k, args.single)
            row["param"] = p
            out["configs"].append(row)
    elif engine == "hnswlib":
        import hnswlib
        out["version"] = getattr(hnswlib, "__version__", "0.8.0")
        start = time.perf_counter()
        index = hnswlib.Index(space="l2", dim=base.shape[1])
        index.init_index(max_elements=len(base), M=args.hnsw_m, ef_construction=args.ef_construction)
        index.set_num_threads(args.threads)
        index.add_items(base, np.arange(len(base)))
        out["build_seconds"] = time.perf_counter() - start
        for p in params:
            index.set_ef(max(p, k))
            fn = lambda x: index.knn_query(x, k=k)[0]
            row = measure(fn, fn, base, queries, truth_ids, truth_distances, k, args.single)
            row["param"] = p
            out["configs"].append(row)
    elif engine == "chroma":
        # Embedded Chroma (PersistentClient in a scratch directory: durable, like gpuopt's store),
        # HNSW with Chroma's defaults (M 16, ef_construction 100, ef_search 100). ef_search only
        # takes effect when the collection is created (collection.modify() leaves the loaded index
        # as it was, checked with chromadb 1.5.9), so each --params value builds its own
        # collection (0 = the default); each row carries its own build time.
        import shutil
        import tempfile
        import chromadb
        out["version"] = chromadb.__version__
        scratch = tempfile.mkdtemp(prefix="gpuopt-bench-chroma-")
        try:
            client = chromadb.PersistentClient(path=scratch)
            out["config"] = {"max_neighbors": 16, "ef_construction": 100, "ef_search_default": 100,
                             "client": "PersistentClient"}
            batch = min(5000, client.get_max_batch_size())
            for p in params or [0]:
                hnsw = {"space": "l2", "num_threads": args.threads}
                if p:
                    hnsw["ef_search"] = p
                collection = client.create_collection(f"bench-{p}", configuration={"hnsw": hnsw})
                start = time.perf_counter()
                for s in range(0, len(base), batch):
                    chunk = base[s:s + batch]
                    collection.add(ids=[str(i) for i in range(s, s + len(chunk))],
                                   embeddings=chunk)
                build_seconds = time.perf_counter() - start
                out.setdefault("build_seconds", build_seconds)
                fn = lambda x: np.array([[int(i) for i in r] for r in
                                         collection.query(query_embeddings=x, n_results=k,
                                                          include=[])["ids"]])
                row = measure(fn, fn, base, queries, truth_ids, truth_distances, k, args.single)
                row["param"] = p if p else 100
                row["build_seconds"] = build_seconds
                out["configs"].append(row)
                client.delete_collection(f"bench-{p}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    elif engine == "qdrant-edge":
        # Qdrant Edge (in-process shard, PyPI qdrant-edge-py): Euclid distance, HNSW with Qdrant's
        # defaults (m 16, ef_construct 100, full_scan_threshold 10000 KB), built by optimize();
        # each --params value is the search hnsw_ef (0 = Qdrant's default).
        import shutil
        import tempfile
        import qdrant_edge as qe
        from importlib.metadata import version
        out["version"] = version("qdrant-edge-py")
        scratch = tempfile.mkdtemp(prefix="gpuopt-bench-qdrant-")
        try:
            config = qe.EdgeConfig(
                vectors=qe.EdgeVectorParams(size=base.shape[1], distance=qe.Distance.Euclid),
                hnsw_config=qe.HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10000,
                                               max_indexing_threads=args.threads),
                max_search_threads=args.threads)
            out["config"] = {"m": 16, "ef_construct": 100, "full_scan_threshold_kb": 10000}
            start = time.perf_counter()
            shard = qe.EdgeShard.create(os.path.join(scratch, "shard"), config)
            for s in range(0, len(base), 1000):
                points = [qe.Point(id=s + i, vector=v) for i, v in
                          enumerate(base[s:s + 1000].tolist())]
                shard.update(qe.UpdateOperation.upsert_points(points))
            shard.optimize()  # builds the HNSW graph: part of the build time
            out["build_seconds"] = time.perf_counter() - start
            for p in params or [0]:
                search = qe.SearchParams(hnsw_ef=p) if p else None
                request = lambda v: qe.QueryRequest(limit=k, query=qe.Query.Nearest(v),
                                                    params=search)
                def batch_fn(x):
                    found = shard.query_batch(qe.QueryBatchRequest([request(v) for v in x.tolist()]))
                    return np.array([[int(point.id) for point in r] + [-1] * (k - len(r))
                                     for r in found])
                def one_fn(x):
                    return np.array([[int(point.id) for point in shard.query(request(x[0].tolist()))]])
                row = measure(batch_fn, one_fn, base, queries, truth_ids, truth_distances, k,
                              args.single)
                row["param"] = p
                out["configs"].append(row)
            shard.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    else:
        raise SystemExit(f"unknown engine {engine}")
    out["peak_rss_mib"] = peak_rss_mib()
    out["rss_before_index_mib"] = rss_before
    return out


def run_engine_process(args, engine, data_dir, params):
    command = [sys.executable, __file__, "--engine", engine, "--data", data_dir, "--k", str(args.k),
               "--params", params, "--nlist", str(args.nlist), "--iterations",
               str(args.iterations), "--hnsw-m", str(args.hnsw_m), "--ef-construction",
               str(args.ef_construction), "--threads", str(args.threads), "--single",
               str(args.single)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"engine": engine, "error": done.stderr.strip()[-2000:]}
    return json.loads(done.stdout)


def gpuopt_rows(doc):
    """Flattens `gpuopt bench vector --json` into the compare table's rows."""
    rows = []
    cases = {t["key"]: t for t in doc["testcases"]}
    exact = cases.get("exact-cpu", {}).get("data")
    if exact:
        by_batch = {r["batch"]: r for r in exact["rows"]}
        single = by_batch.get(1, {})
        batch = [r for b, r in by_batch.items() if b != 1]
        rows.append({"engine": "gpuopt-exact-cpu", "param": 0, "build_seconds": 0,
                     "recall_ids": exact["id_recall"], "recall_distance": exact["distance_recall"],
                     "qps_batch": batch[0]["qps"] if batch else None,
                     "qps_batch1": single.get("qps"), "latency_p50_ms": single.get("p50_ms"),
                     "latency_p99_ms": single.get("p99_ms"),
                     "peak_rss_mib": exact.get("peak_rss_mib")})
    ivf = cases.get("ivf-cpu", {}).get("data")
    if ivf:
        for r in ivf["sweep"]:
            rows.append({"engine": "gpuopt-ivf-cpu", "param": r["nprobe"],
                         "build_seconds": ivf["build_s"], "recall_ids": r["id_recall"],
                         "recall_distance": r["distance_recall"], "qps_batch": r["batch_qps"],
                         "qps_batch1": r["batch1_qps"], "latency_p50_ms": r["p50_ms"],
                         "latency_p99_ms": r["p99_ms"], "peak_rss_mib": ivf.get("peak_rss_mib")})
    return rows


def compare(args):
    out_dir = os.path.abspath(args.out)
    data_dir = os.path.join(out_dir, "data")
    os.makedirs(out_dir, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report = {"started": started, "load_before": os.getloadavg(), "runs": []}
    table = []
    nprobes = args.nprobe
    for repeat in range(1, 0 if args.skip_gpuopt else args.repeat + 1):
        command = [args.gpuopt, "bench", "vector", "--json", "--testcase", "exact-cpu,ivf-cpu",
                   "--threads", str(args.threads), "--nlist", str(args.nlist), "--nprobe", nprobes,
                   "--k", str(args.k), "--single", str(args.single), "--export", data_dir]
        if args.queries:
            command += ["--queries", str(args.queries)]
        if args.rows:
            command += ["--rows", str(args.rows)]
        if args.gpuopt_data:
            command += ["--data", args.gpuopt_data]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode not in (0, 1):
            raise SystemExit(f"gpuopt bench vector failed ({done.returncode}): {done.stderr}")
        doc = json.loads(done.stdout)
        report["runs"].append({"engine": "gpuopt", "repeat": repeat, "command": command,
                               "result": doc})
        for row in gpuopt_rows(doc):
            table.append(dict(row, repeat=repeat))
        print(f"gpuopt run {repeat} done", file=sys.stderr)
    engines = [("faiss-flat", "0"), ("faiss-ivf", nprobes), ("hnswlib", args.ef)]
    engines += [(name, params) for name, params in (("chroma", args.chroma_ef),
                                                     ("qdrant-edge", args.qdrant_ef))
                if name in args.engines.split(",")]
    engines = [e for e in engines if e[0] in args.engines.split(",")]
    for engine, params in engines:
        for repeat in range(1, args.repeat + 1):
            result = run_engine_process(args, engine, data_dir, params)
            report["runs"].append({"engine": engine, "repeat": repeat, "result": result})
            for c in result.get("configs", []):
                table.append(dict(c, engine=engine, repeat=repeat,
                                  build_seconds=c.get("build_seconds",
                                                      result.get("build_seconds")),
                                  peak_rss_mib=result.get("peak_rss_mib"),
                                  version=result.get("version")))
            if "configs" not in result:
                print(f"{engine}: {result}", file=sys.stderr)
            print(f"{engine} run {repeat} done", file=sys.stderr)
    report["load_after"] = os.getloadavg()
    report["table"] = table
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    fmt = lambda v, d: "-" if v is None else f"{v:.{d}f}"
    print(f"started {started}, load average before {report['load_before'][0]:.2f}, "
          f"after {report['load_after'][0]:.2f}, threads {args.threads}, nlist {args.nlist}")
    print("| engine | run | nprobe/ef | recall ids | recall dist | QPS batch | QPS b=1 | p50 ms "
          "| p99 ms | build s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['engine']} | {r['repeat']} | {r['param']} | {fmt(r['recall_ids'], 4)} | "
              f"{fmt(r['recall_distance'], 4)} | {fmt(r['qps_batch'], 0)} | "
              f"{fmt(r['qps_batch1'], 0)} | {fmt(r['latency_p50_ms'], 3)} | "
              f"{fmt(r['latency_p99_ms'], 3)} | {fmt(r.get('build_seconds'), 2)} | "
              f"{fmt(r.get('peak_rss_mib'), 0)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", help="faiss-flat | faiss-ivf | faiss-hnsw | hnswlib | chroma | "
                        "qdrant-edge")
    parser.add_argument("--data", help="directory with base/queries/truth .npy")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--params", default="", help="nprobe (IVF) or ef (HNSW) values, comma list")
    parser.add_argument("--nlist", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    compare_group = parser.add_argument_group("--compare")
    compare_group.add_argument("--compare", action="store_true",
                               help="run gpuopt, FAISS and hnswlib on the same data in one go")
    compare_group.add_argument("--gpuopt", default="build/tools/gpuopt/gpuopt")
    compare_group.add_argument("--gpuopt-data", default="",
                               help="--data for gpuopt bench vector (default Fashion-MNIST)")
    compare_group.add_argument("--out", default="/tmp/gpuopt-vector-compare")
    compare_group.add_argument("--json-out", default="")
    compare_group.add_argument("--nprobe", default="1,2,4,8,16,32,64")
    compare_group.add_argument("--ef", default="10,20,40,80,160")
    compare_group.add_argument("--engines", default="faiss-flat,faiss-ivf,hnswlib,chroma,qdrant-edge",
                               help="which other engines to run (comma list)")
    compare_group.add_argument("--chroma-ef", default="0,400",
                               help="Chroma ef_search values (0 = its default, 100)")
    compare_group.add_argument("--qdrant-ef", default="0,400",
                               help="Qdrant Edge hnsw_ef values (0 = its default)")
    compare_group.add_argument("--skip-gpuopt", action="store_true",
                               help="reuse the data already exported in --out/data")
    compare_group.add_argument("--queries", type=int, default=0)
    compare_group.add_argument("--rows", type=int, default=0, help="base rows (0 = all)")
    compare_group.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if args.compare:
        compare(args)
        return
    if not args.engine or not args.data:
        parser.error("--engine and --data are required (or --compare)")
    try:
        result = run(args)
    except ImportError as error:
        result = {"engine": args.engine, "unavailable": f"python package missing: {error.name}"}
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
