"""gpuopt.vector's engine choice and saved IVF index, on any machine: engine="cpu" against numpy
float64 brute force with filters and deletes, the report of which engine answered, "gpu" and
"auto" where no GPU can answer, the IVF index surviving a reopen without retraining, and info()."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GPU_REASON
from test_vector import assert_same_neighbours

import gpuopt
import gpuopt.vector

no_gpu = pytest.mark.skipif(GPU_REASON is None, reason="a GPU answers here")
REPORT_KEYS = {
    "engine",
    "requested_engine",
    "fallback_reason",
    "queries_on_device",
    "gpu_fused",
    "gpu_small_batch",
    "gpu_fallback_queries",
    "gpu_rows_uploaded",
    "gpu_upload_seconds",
    "ivf_built",
    "ivf_retrained",
    "ivf_build_seconds",
    "ivf_rows_assigned",
}


def filled(store, rng, metric="l2", rows=900, dim=12):
    """A collection with ids offset from positions, a `bucket` field, and 100 deletes."""
    base = rng.standard_normal((rows, dim)).astype(np.float32)
    ids = np.arange(rows, dtype=np.int64) * 3 + 1000
    collection = store.create_collection("c", dim=dim, metric=metric)
    collection.add(base, ids=ids, metadata=[{"bucket": i % 3} for i in range(rows)])
    deleted = ids[200:300]
    assert collection.delete(deleted) == 100
    live = np.ones(rows, dtype=bool)
    live[200:300] = False
    buckets = np.arange(rows) % 3
    return collection, base, ids, live, buckets


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_cpu_engine_equals_brute_force_with_filter_and_deletes(store, rng, metric):
    collection, base, ids, live, buckets = filled(store, rng, metric)
    queries = rng.standard_normal((25, 12)).astype(np.float32)
    queries[:3] = base[200:203]  # deleted rows: they must not come back
    for where, keep in ((None, live), ({"bucket": 1}, live & (buckets == 1))):
        got_ids, got_distances, report = collection.query(
            queries, k=9, where=where, engine="cpu", report=True
        )
        assert set(report) == REPORT_KEYS
        assert report["engine"] == "cpu" and report["requested_engine"] == "cpu"
        assert report["fallback_reason"] == "" and not report["queries_on_device"]
        assert set(got_ids.ravel()) <= set(ids[keep].tolist())
        assert_same_neighbours(got_ids, got_distances, base[keep], ids[keep], queries, 9, metric)
        assert collection.last_query_report == report


def test_report_flag_and_last_query_report(store, rng):
    collection, base, *_ = filled(store, rng)
    assert collection.last_query_report is None
    two = collection.query(base[:2], k=3, engine="cpu")
    assert len(two) == 2
    three = collection.query(base[:2], k=3, engine="cpu", report=True)
    assert len(three) == 3 and three[2] is collection.last_query_report
    np.testing.assert_array_equal(two[0], three[0])


@no_gpu
def test_gpu_engine_without_a_gpu_raises_gpu_unavailable(store, rng):
    collection, base, *_ = filled(store, rng)
    with pytest.raises(gpuopt.GpuUnavailableError) as raised:
        collection.query(base[:4], k=3, engine="gpu")
    message = str(raised.value)
    assert "engine='gpu'" in message
    assert any(
        reason in message.lower()
        for reason in ("without cuda", "no nvidia driver", "no cuda device", "no usable cuda")
    ), message
    with pytest.raises(gpuopt.GpuUnavailableError, match="engine='gpu'"):
        collection.query(base[:4], k=3, index="ivf", engine="gpu")
    with pytest.raises(gpuopt.GpuUnavailableError, match="reindex"):
        collection.reindex(nlist=4, engine="gpu")


@no_gpu
def test_auto_falls_back_to_the_cpu_with_the_reason(store, rng):
    collection, base, ids, live, _ = filled(store, rng)
    queries = rng.standard_normal((30, 12)).astype(np.float32)
    cpu_ids, cpu_distances = collection.query(queries, k=5, engine="cpu")
    auto_ids, auto_distances, report = collection.query(queries, k=5, report=True)  # default auto
    assert report["engine"] == "cpu" and report["requested_engine"] == "auto"
    assert report["fallback_reason"], report
    assert report["gpu_rows_uploaded"] == 0
    np.testing.assert_array_equal(auto_ids, cpu_ids)
    np.testing.assert_array_equal(auto_distances, cpu_distances)
    info = collection.info()
    assert info["gpu"]["resident"] is False and info["gpu"]["device"] == -1
    collection.release_gpu()  # nothing to free: still fine


def test_auto_answers_k_above_the_gpu_limit_on_the_cpu(store, rng):
    collection, base, ids, live, _ = filled(store, rng)
    k = gpuopt.vector.GPU_MAX_K + 1
    got_ids, got_distances, report = collection.query(base[:3], k=k, report=True)
    assert report["engine"] == "cpu"
    assert f"k {k}" in report["fallback_reason"]
    assert_same_neighbours(got_ids, got_distances, base[live], ids[live], base[:3], k, "l2")
    with pytest.raises(gpuopt.InvalidArgumentError, match=f"k {k}"):
        collection.query(base[:3], k=k, engine="gpu")


def test_bad_engine_arguments_are_refused(store, rng):
    collection, base, *_ = filled(store, rng)
    with pytest.raises(gpuopt.InvalidArgumentError, match="engine"):
        collection.query(base[:1], engine="tpu")
    with pytest.raises(gpuopt.InvalidArgumentError, match="device"):
        collection.query(base[:1], device=-1)
    with pytest.raises(gpuopt.InvalidArgumentError, match="gpu_memory_budget"):
        collection.query(base[:1], gpu_memory_budget=-5)
    with pytest.raises(gpuopt.InvalidArgumentError, match="nprobe"):
        collection.query(base[:1], index="ivf", nprobe=-1)
    with pytest.raises(gpuopt.InvalidArgumentError, match="engine"):
        collection.reindex(engine="fpga")
    with pytest.raises(gpuopt.InvalidArgumentError, match="iterations"):
        collection.reindex(iterations=0)


def test_ivf_index_is_saved_and_reloaded_without_retraining(tmp_path, rng):
    base = rng.standard_normal((3000, 16)).astype(np.float32)
    more = rng.standard_normal((200, 16)).astype(np.float32)
    queries = rng.standard_normal((12, 16)).astype(np.float32)
    path = tmp_path / "store"
    with gpuopt.vector.open(path, create=True) as store:
        collection = store.create_collection("c", dim=16)
        collection.add(base)
        assert collection.info()["ivf"]["present"] is False
        seconds = collection.reindex(nlist=16, engine="cpu")
        assert seconds >= 0
        ivf = collection.info()["ivf"]
        assert ivf["present"] and ivf["nlist"] == 16 and ivf["trained_rows"] == 3000
        assert ivf["train_engine"] == "cpu" and ivf["trainings"] == 1 and ivf["error"] == ""
        generation = ivf["generation"]
        first_ids, first_distances, report = collection.query(
            queries, k=5, index="ivf", nprobe=16, engine="cpu", report=True
        )
        assert not report["ivf_built"]
    with gpuopt.vector.open(path) as store:
        collection = store.collection("c")
        ivf = collection.info()["ivf"]
        # Loaded from the store: same generation and lists, no k-means run by this Store.
        assert ivf["present"] and ivf["generation"] == generation and ivf["nlist"] == 16
        assert ivf["trainings"] == 0
        ids, distances, report = collection.query(
            queries, k=5, index="ivf", nprobe=16, engine="cpu", report=True
        )
        assert not report["ivf_built"] and not report["ivf_retrained"]
        np.testing.assert_array_equal(ids, first_ids)
        np.testing.assert_array_equal(distances, first_distances)
        # Probing every list equals exact search.
        assert_same_neighbours(ids, distances, base, np.arange(3000), queries, 5, "l2")
        # Rows added later join the saved lists; still no retraining.
        new_ids = collection.add(more)
        ids, distances, report = collection.query(
            more[:4], k=1, index="ivf", nprobe=16, engine="cpu", report=True
        )
        assert report["ivf_rows_assigned"] == 200 and not report["ivf_built"]
        np.testing.assert_array_equal(ids[:, 0], new_ids[:4])
        ivf = collection.info()["ivf"]
        assert ivf["trainings"] == 0 and ivf["rows_since_training"] == 200
        assert ivf["generation"] == generation
        # reindex retrains and saves a new generation.
        collection.reindex(nlist=8, engine="cpu")
        ivf = collection.info()["ivf"]
        assert ivf["trainings"] == 1 and ivf["nlist"] == 8 and ivf["generation"] > generation
        assert ivf["trained_rows"] == 3200


def test_first_ivf_query_trains_and_saves_once(tmp_path, rng):
    base = rng.standard_normal((1500, 8)).astype(np.float32)
    path = tmp_path / "store"
    with gpuopt.vector.open(path, create=True) as store:
        collection = store.create_collection("c", dim=8)
        collection.add(base)
        _, _, report = collection.query(base[:2], k=3, index="ivf", nlist=8, report=True)
        assert report["ivf_built"]
        _, _, report = collection.query(base[:2], k=3, index="ivf", nlist=8, report=True)
        assert not report["ivf_built"]
    with gpuopt.vector.open(path) as store:
        collection = store.collection("c")
        ids, _, report = collection.query(base[:2], k=1, index="ivf", nprobe=8, report=True)
        assert not report["ivf_built"] and collection.info()["ivf"]["trainings"] == 0
        np.testing.assert_array_equal(ids[:, 0], [0, 1])


def test_chunked_queries_merge_their_reports(store, rng, monkeypatch):
    collection, base, ids, live, _ = filled(store, rng)
    queries = rng.standard_normal((23, 12)).astype(np.float32)
    whole = collection.query(queries, k=4, engine="cpu")
    monkeypatch.setattr(gpuopt.vector, "_QUERY_CHUNK", 5)
    chunked_ids, chunked_distances, report = collection.query(
        queries, k=4, engine="cpu", report=True
    )
    np.testing.assert_array_equal(chunked_ids, whole[0])
    np.testing.assert_array_equal(chunked_distances, whole[1])
    assert report["engine"] == "cpu"



def test_stub_and_docstrings_cover_the_engine_api():
    import inspect
    import os

    stub = open(
        os.path.join(os.path.dirname(gpuopt.__file__), "_gpuopt.pyi"), encoding="utf-8"
    ).read()
    for name in ("def query_device", "def release_gpu", "def gpu_residency", "engine: str"):
        assert name in stub, name
    collection = gpuopt.vector.Collection
    for name in ("query", "reindex", "build_ivf", "release_gpu", "info", "last_query_report"):
        assert getattr(collection, name).__doc__, name
    parameters = inspect.signature(collection.query).parameters
    assert parameters["engine"].default == "auto"
    assert parameters["engine"].kind is inspect.Parameter.KEYWORD_ONLY
