#!/usr/bin/env python3
"""Runs one external vector engine on the same data and queries as `gpuopt bench vector`.

Reads base.npy / queries.npy / truth_ids.npy / truth_distances.npy from --data, builds the
engine's index, and prints one JSON object: build time, peak RSS, and for each configuration
(nprobe / ef) recall@k (id overlap and ann-benchmarks' distance rule), QPS at batch 1 and at the
full batch, and batch-1 latency p50/p99. Engines whose package is missing report "unavailable".
"""
import argparse
import json
import resource
import sys
import time

import numpy as np


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def recall(found_ids, base, queries, truth_ids, truth_distances, k):
    """Id overlap, and ann-benchmarks' rule: a hit counts when its true L2 distance is within
    (1 + 1e-3) of the k-th true distance."""
    overlap = 0
    by_distance = 0
    for q in range(len(queries)):
        ids = [int(i) for i in found_ids[q][:k] if i >= 0]
        overlap += len(set(ids) & set(int(t) for t in truth_ids[q][:k]))
        if ids:
            d = ((base[ids] - queries[q]) ** 2).sum(axis=1)
            threshold = truth_distances[q][k - 1] * (1 + 1e-3) + 1e-6
            by_distance += int((d <= threshold).sum())
    total = len(queries) * k
    return overlap / total, by_distance / total


def measure(search_batch, search_one, base, queries, truth_ids, truth_distances, k, single):
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
        import chromadb
        out["version"] = chromadb.__version__
        client = chromadb.EphemeralClient()
        collection = client.create_collection("bench", metadata={"hnsw:space": "l2"})
        start = time.perf_counter()
        for s in range(0, len(base), 5000):
            chunk = base[s:s + 5000]
            collection.add(ids=[str(i) for i in range(s, s + len(chunk))], embeddings=chunk)
        out["build_seconds"] = time.perf_counter() - start
        fn = lambda x: np.array([[int(i) for i in r] for r in
                                 collection.query(query_embeddings=x, n_results=k)["ids"]])
        row = measure(fn, fn, base, queries, truth_ids, truth_distances, k, args.single)
        row["param"] = 0
        out["configs"].append(row)
    else:
        raise SystemExit(f"unknown engine {engine}")
    out["peak_rss_mib"] = peak_rss_mib()
    out["rss_before_index_mib"] = rss_before
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", required=True,
                        help="faiss-flat | faiss-ivf | faiss-hnsw | hnswlib | chroma")
    parser.add_argument("--data", required=True)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--params", default="", help="nprobe (IVF) or ef (HNSW) values, comma list")
    parser.add_argument("--nlist", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    args = parser.parse_args()
    try:
        result = run(args)
    except ImportError as error:
        result = {"engine": args.engine, "unavailable": f"python package missing: {error.name}"}
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
