"""gpuopt.vector with torch tensors: CUDA tensors are ingested through the device-pointer path on
the caller's stream and round-trip exactly; CPU tensors go in by DLPack; results come back in
torch on the queries' device; bad tensors are refused with the reason. The GPU engine (host and
CUDA queries, filters, deletes, the resident copy, the memory budget, IVF) against float64 brute
force."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import requires_gpu, requires_torch

import gpuopt
import gpuopt.vector


@requires_torch
def test_cpu_tensors_in_and_out(store):
    import torch

    collection = store.create_collection("c", dim=8)
    base = torch.randn(50, 8)
    ids = collection.add(base, metadata=[{"i": i} for i in range(50)])
    assert ids.tolist() == list(range(50))
    np.testing.assert_array_equal(collection.get(13)[0], base[13].numpy())
    got_ids, got_distances = collection.query(base[:3], k=1)
    assert isinstance(got_ids, torch.Tensor) and got_ids[:, 0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="float32"):
        collection.add(torch.zeros(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="strides"):
        collection.add(torch.zeros(8, 2).t())


@requires_gpu
def test_cuda_tensor_ingest_round_trips_on_the_current_stream(store):
    import torch

    collection = store.create_collection("c", dim=64)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        base = torch.randn(5000, 64, device="cuda")  # produced on `stream`; no sync before add
        ids = collection.add(base)
    assert ids.shape == (5000,)
    host = base.cpu().numpy()
    for row in (0, 2500, 4999):
        np.testing.assert_array_equal(collection.get(row)[0], host[row])
    queries = base[:10]
    got_ids, got_distances = collection.query(queries, k=1)
    assert got_ids.is_cuda and got_ids[:, 0].tolist() == list(range(10))
    with pytest.raises(ValueError, match="float32"):
        collection.add(torch.zeros(2, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="strides"):
        collection.add(torch.zeros(64, 2, device="cuda").t())
    with pytest.raises(ValueError, match="dimension"):
        collection.add(torch.zeros(2, 32, device="cuda"))


def brute_force64(base, ids, queries, k, metric):
    """float64 distances through matrix products (large batches) and the k best ids per query."""
    base64, queries64 = base.astype(np.float64), queries.astype(np.float64)
    dots = queries64 @ base64.T
    if metric == "l2":
        distances = (queries64**2).sum(1)[:, None] - 2 * dots + (base64**2).sum(1)[None, :]
    elif metric == "ip":
        distances = -dots
    else:
        norms = np.linalg.norm(queries64, axis=1)[:, None] * np.linalg.norm(base64, axis=1)[None, :]
        distances = 1.0 - dots / np.where(norms == 0, 1, norms)
    order = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return ids[order], np.take_along_axis(distances, order, axis=1)


def assert_brute_force(got_ids, got_distances, base, ids, queries, k, metric):
    """Distances equal float64 brute force's (rounded to float32); ids too, except where two
    distances tie."""
    want_ids, want_distances = brute_force64(base, ids, queries, k, metric)
    got_ids, got_distances = np.asarray(got_ids), np.asarray(got_distances)
    np.testing.assert_allclose(got_distances, want_distances, rtol=1e-5, atol=1e-5)
    swapped = got_ids != want_ids
    assert np.all(np.abs(want_distances[swapped] - got_distances[swapped]) < 1e-5)
    assert set(got_ids.ravel().tolist()) <= set(ids.tolist())


def filled_collection(store, rng, metric, rows=20000, dim=64):
    base = rng.standard_normal((rows, dim)).astype(np.float32)
    ids = np.arange(rows, dtype=np.int64) * 5 + 77
    collection = store.create_collection("g", dim=dim, metric=metric)
    collection.add(base, ids=ids, metadata=[{"bucket": i % 4} for i in range(rows)])
    collection.delete(ids[1000:3000])
    keep = np.ones(rows, dtype=bool)
    keep[1000:3000] = False
    return collection, base, ids, keep, np.arange(rows) % 4


@requires_gpu
@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
@pytest.mark.parametrize("batch", [1, 16, 1000])
def test_gpu_engine_equals_float64_brute_force(store, rng, metric, batch):
    import torch

    collection, base, ids, live, buckets = filled_collection(store, rng, metric)
    queries = rng.standard_normal((batch, 64)).astype(np.float32)
    queries[0] = base[1500]  # a deleted row: it must not come back
    k = 10
    for where, keep in ((None, live), ({"bucket": {"$in": [1, 3]}}, live & (buckets % 2 == 1))):
        # Host queries.
        got_ids, got_distances, report = collection.query(
            queries, k=k, where=where, engine="gpu", report=True
        )
        assert report["engine"] == "gpu" and not report["queries_on_device"]
        assert report["gpu_small_batch"] == (batch <= 16)
        assert_brute_force(got_ids, got_distances, base[keep], ids[keep], queries, k, metric)
        # CUDA queries: answered on the device, results CUDA tensors on the same device.
        device_queries = torch.from_numpy(queries).cuda()
        cuda_ids, cuda_distances, report = collection.query(
            device_queries, k=k, where=where, engine="gpu", report=True
        )
        assert report["engine"] == "gpu" and report["queries_on_device"]
        assert cuda_ids.is_cuda and cuda_ids.device == device_queries.device
        assert cuda_distances.is_cuda and cuda_distances.device == device_queries.device
        assert cuda_ids.dtype == torch.int64 and cuda_distances.dtype == torch.float32
        assert_brute_force(
            cuda_ids.cpu(), cuda_distances.cpu(), base[keep], ids[keep], queries, k, metric
        )
        # Default "auto" answers on the GPU here.
        _, _, report = collection.query(queries, k=k, where=where, report=True)
        assert report["engine"] == "gpu", report["fallback_reason"]


@requires_gpu
def test_cuda_queries_on_a_side_stream_and_padding(store, rng):
    import torch

    collection = store.create_collection("p", dim=32)
    base = rng.standard_normal((50, 32)).astype(np.float32)
    collection.add(base, metadata=[{"even": int(i % 2 == 0)} for i in range(50)])
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        queries = torch.from_numpy(base[:3]).cuda() * 1.0  # produced on `stream`, no sync
        ids, distances = collection.query(queries, k=40, where={"even": 1})
    stream.synchronize()
    assert ids.shape == (3, 40) and ids.is_cuda
    host_ids, host_distances = ids.cpu().numpy(), distances.cpu().numpy()
    # 25 rows pass the filter: the rest is padding, -1 and inf.
    assert (host_ids[:, 25:] == -1).all() and np.isinf(host_distances[:, 25:]).all()
    assert set(host_ids[:, :25].ravel().tolist()) == set(range(0, 50, 2))
    assert host_ids[0, 0] == 0 and host_ids[2, 0] == 2
    # fp16 queries are converted on the device.
    half_ids, _ = collection.query(torch.from_numpy(base[:2]).cuda().half(), k=1)
    assert half_ids.is_cuda and half_ids[:, 0].tolist() == [0, 1]


@requires_gpu
def test_resident_copy_follows_writes_and_release(store, rng):
    collection = store.create_collection("r", dim=16)
    base = rng.standard_normal((3000, 16)).astype(np.float32)
    collection.add(base[:2000])
    _, _, report = collection.query(base[:1], k=1, engine="gpu", report=True)
    assert report["gpu_rows_uploaded"] == 2000
    gpu = collection.info()["gpu"]
    assert gpu["resident"] and gpu["rows"] == 2000 and gpu["device_bytes"] > 0
    _, _, report = collection.query(base[:1], k=1, engine="gpu", report=True)
    assert report["gpu_rows_uploaded"] == 0
    collection.add(base[2000:])
    ids, _, report = collection.query(base[2500:2501], k=1, engine="gpu", report=True)
    assert report["gpu_rows_uploaded"] == 1000 and ids[0, 0] == 2500
    collection.delete([2500])
    ids, _ = collection.query(base[2500:2501], k=1, engine="gpu")
    assert ids[0, 0] != 2500
    collection.release_gpu()
    assert collection.info()["gpu"]["resident"] is False
    _, _, report = collection.query(base[:1], k=1, engine="gpu", report=True)
    assert report["gpu_rows_uploaded"] == 3000


@requires_gpu
def test_memory_budget_errors_for_gpu_and_falls_back_for_auto(store, rng):
    import torch

    collection = store.create_collection("b", dim=16)
    base = rng.standard_normal((500, 16)).astype(np.float32)
    collection.add(base)
    with pytest.raises(gpuopt.ResourceExhaustedError, match="budget"):
        collection.query(base[:2], k=3, engine="gpu", gpu_memory_budget=1000)
    ids, _, report = collection.query(base[:2], k=3, gpu_memory_budget=1000, report=True)
    assert report["engine"] == "cpu" and "budget" in report["fallback_reason"]
    assert ids[:, 0].tolist() == [0, 1]
    cuda_ids, _, report = collection.query(
        torch.from_numpy(base[:2]).cuda(), k=3, gpu_memory_budget=1000, report=True
    )
    assert report["engine"] == "cpu" and "budget" in report["fallback_reason"]
    assert cuda_ids.is_cuda and cuda_ids[:, 0].tolist() == [0, 1]


@requires_gpu
def test_gpu_ivf_reindex_and_query(tmp_path, rng):
    import torch

    base = rng.standard_normal((8000, 32)).astype(np.float32)
    queries = rng.standard_normal((50, 32)).astype(np.float32)
    path = tmp_path / "store"
    with gpuopt.vector.open(path, create=True) as store:
        collection = store.create_collection("i", dim=32)
        ids = collection.add(base)
        collection.reindex(nlist=32, engine="gpu")
        assert collection.info()["ivf"]["train_engine"] == "gpu"
    with gpuopt.vector.open(path) as store:
        collection = store.collection("i")
        got_ids, got_distances, report = collection.query(
            queries, k=10, index="ivf", nprobe=32, engine="gpu", report=True
        )
        assert report["engine"] == "gpu" and not report["ivf_built"]
        assert collection.info()["gpu"]["ivf_resident"]
        # Every list probed: IVF equals exact search (fp32 distances, as on the CPU).
        want_ids, want_distances = brute_force64(base, ids, queries, 10, "l2")
        np.testing.assert_allclose(got_distances, want_distances, rtol=1e-4, atol=1e-3)
        # CUDA queries on IVF go through the host and come back as CUDA tensors.
        cuda_ids, _, report = collection.query(
            torch.from_numpy(queries).cuda(), k=10, index="ivf", nprobe=32, report=True
        )
        assert cuda_ids.is_cuda and report["engine"] == "gpu" and not report["queries_on_device"]
        np.testing.assert_array_equal(cuda_ids.cpu().numpy(), got_ids)
