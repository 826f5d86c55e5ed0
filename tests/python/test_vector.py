"""gpuopt.vector against independent references: numpy brute force for search, a Python
evaluator of the `where` language for filters, and reopened stores for durability."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import gpuopt
import gpuopt.vector


def brute_force(base, ids, queries, k, metric):
    """float64 distances (smaller is closer) and the k best ids per query, ties by id."""
    base64, queries64 = base.astype(np.float64), queries.astype(np.float64)
    if metric == "l2":
        distances = ((queries64[:, None, :] - base64[None, :, :]) ** 2).sum(-1)
    elif metric == "ip":
        distances = -(queries64 @ base64.T)
    else:
        norms = np.linalg.norm(queries64, axis=1)[:, None] * np.linalg.norm(base64, axis=1)[None, :]
        distances = 1.0 - (queries64 @ base64.T) / np.where(norms == 0, 1, norms)
    order = np.lexsort((np.broadcast_to(ids, distances.shape), distances), axis=1)[:, :k]
    return ids[order], np.take_along_axis(distances, order, axis=1)


def assert_same_neighbours(got_ids, got_distances, base, ids, queries, k, metric):
    """Ids equal the reference's, except where two distances tie within float32 rounding."""
    want_ids, want_distances = brute_force(base, ids, queries, k, metric)
    np.testing.assert_allclose(got_distances, want_distances, rtol=1e-4, atol=1e-4)
    for q in range(len(queries)):
        for i in range(k):
            if got_ids[q, i] != want_ids[q, i]:
                # A swap is acceptable only between (near-)equal distances.
                assert abs(want_distances[q, i] - got_distances[q, i]) < 1e-4


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_exact_query_matches_brute_force(store, rng, metric):
    base = rng.standard_normal((700, 24)).astype(np.float32)
    queries = rng.standard_normal((37, 24)).astype(np.float32)
    collection = store.create_collection("c", dim=24, metric=metric)
    ids = collection.add(base)
    np.testing.assert_array_equal(ids, np.arange(700))
    got_ids, got_distances = collection.query(queries, k=10)
    assert got_ids.dtype == np.int64 and got_distances.dtype == np.float32
    assert got_ids.shape == got_distances.shape == (37, 10)
    assert_same_neighbours(got_ids, got_distances, base, np.arange(700), queries, 10, metric)


def test_ivf_probing_every_list_equals_exact(store, rng):
    base = rng.standard_normal((2000, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    collection = store.create_collection("c", dim=16)
    collection.add(base)
    collection.build_ivf(nlist=16)
    ivf_ids, ivf_distances = collection.query(queries, k=5, index="ivf", nprobe=16, nlist=16)
    assert_same_neighbours(ivf_ids, ivf_distances, base, np.arange(2000), queries, 5, "l2")


def test_round_trip_with_metadata_and_reopen(tmp_path, rng):
    path = tmp_path / "s"
    base = rng.standard_normal((50, 4)).astype(np.float32)
    metadata = [
        {"genre": ["jazz", "rock"][i % 2], "year": 1990 + i, "score": i / 7} for i in range(50)
    ]
    ids = np.arange(1000, 1050) * 3
    with gpuopt.vector.open(path, create=True) as store:
        collection = store.create_collection("music", dim=4, metric="ip")
        np.testing.assert_array_equal(collection.add(base, ids=ids, metadata=metadata), ids)
    with gpuopt.vector.open(path) as store:
        assert store.collection_names() == ["music"]
        assert "music" in store
        collection = store.collection("music")
        assert (collection.name, collection.dim, collection.metric) == ("music", 4, "ip")
        assert collection.count == len(collection) == 50
        for row in (0, 17, 49):
            vector, meta = collection.get(int(ids[row]))
            np.testing.assert_array_equal(vector, base[row])
            assert meta == metadata[row]
        assert collection.next_free_id() == ids[-1] + 1
        info = collection.info()
        assert (info["live"], info["deleted"], info["dim"], info["metric"]) == (50, 0, 4, "ip")
        assert sum(s["rows"] for s in info["segments"]) == 50
        collection.verify()


def test_lists_and_other_dtypes_are_converted(store):
    collection = store.create_collection("c", dim=2)
    collection.add([[1, 2], [3, 4]], ids=[5, 6])
    collection.add(np.array([[0.5, 0.25]], dtype=np.float64), ids=np.array([7], dtype=np.uint32))
    collection.add(np.asfortranarray(np.array([[9.0, 8.0], [7.0, 6.0]])), ids=[8, 9])
    np.testing.assert_array_equal(collection.get(6)[0], [3, 4])
    np.testing.assert_array_equal(collection.get(7)[0], [0.5, 0.25])
    np.testing.assert_array_equal(collection.get(9)[0], [7, 6])
    ids, _ = collection.query([[3, 4]], k=1)
    assert ids.tolist() == [[6]]


def test_delete_upsert_and_padding(store, rng):
    base = rng.standard_normal((10, 3)).astype(np.float32)
    collection = store.create_collection("c", dim=3)
    collection.add(base)
    assert collection.delete([2, 3, 999]) == 2
    assert collection.count == 8
    with pytest.raises(gpuopt.NotFoundError):
        collection.get(2)
    collection.upsert(np.full((1, 3), 100.0), ids=[4], metadata=[{"v": 2}])
    vector, meta = collection.get(4)
    np.testing.assert_array_equal(vector, [100, 100, 100])
    assert meta == {"v": 2}
    ids, distances = collection.query(base[:1], k=12)
    live = [i for i in range(10) if i not in (2, 3)]
    assert sorted(ids[0, :8].tolist()) == live
    assert ids[0, 8:].tolist() == [-1] * 4 and np.isinf(distances[0, 8:]).all()
    assert collection.info()["deleted"] == 3  # two deletes and the replaced row


def where_matches(where, metadata):
    """An independent evaluator of the documented `where` semantics."""
    if "$and" in where:
        return all(where_matches(c, metadata) for c in where["$and"])
    if "$or" in where:
        return any(where_matches(c, metadata) for c in where["$or"])
    for field, condition in where.items():
        if not isinstance(condition, dict):
            condition = {"$eq": condition}
        ((op, operand),) = condition.items()
        present = field in metadata
        value = metadata.get(field)

        def same_type(a, b):
            return isinstance(a, str) == isinstance(b, str)

        if op == "$eq":
            ok = present and same_type(value, operand) and value == operand
        elif op == "$ne":
            ok = not (present and same_type(value, operand) and value == operand)
        elif op in ("$gt", "$gte", "$lt", "$lte"):
            if not present or isinstance(value, str):
                ok = False
            else:
                ok = {
                    "$gt": value > operand,
                    "$gte": value >= operand,
                    "$lt": value < operand,
                    "$lte": value <= operand,
                }[op]
        elif op == "$in":
            ok = present and any(same_type(value, o) and value == o for o in operand)
        elif op == "$nin":
            ok = not (present and any(same_type(value, o) and value == o for o in operand))
        else:
            raise AssertionError(op)
        if not ok:
            return False
    return True


FILTERS = [
    {"genre": "jazz"},
    {"year": {"$gte": 2000}},
    {"year": {"$lt": 1995}, "genre": {"$ne": "rock"}},
    {"genre": {"$in": ["pop", "rock"]}},
    {"genre": {"$nin": ["jazz"]}},
    {"$or": [{"genre": "pop"}, {"year": {"$gt": 2015}}]},
    {"$and": [{"score": {"$lte": 0.5}}, {"label": {"$ne": "x"}}]},
    {"label": "x"},
]


@pytest.mark.parametrize("where", FILTERS, ids=[json.dumps(f) for f in FILTERS])
def test_filters_match_a_python_evaluator(store, rng, where):
    count = 400
    base = rng.standard_normal((count, 8)).astype(np.float32)
    genres = ["jazz", "rock", "pop"]
    metadata = []
    for i in range(count):
        entry = {"genre": genres[i % 3], "year": 1980 + (i * 7) % 45, "score": float(rng.random())}
        if i % 5 == 0:
            entry["label"] = "x"
        if i % 11 == 0:
            del entry["genre"]
        metadata.append(entry)
    collection = store.create_collection("c", dim=8)
    collection.add(base, metadata=metadata)
    allowed = np.array([i for i in range(count) if where_matches(where, metadata[i])])
    assert 0 < len(allowed) < count
    queries = rng.standard_normal((5, 8)).astype(np.float32)
    for query_where in (where, json.dumps(where)):
        got_ids, got_distances = collection.query(queries, k=7, where=query_where)
        k = min(7, len(allowed))
        assert set(got_ids[:, :k].ravel()) <= set(allowed.tolist())
        assert_same_neighbours(
            got_ids[:, :k], got_distances[:, :k], base[allowed], allowed, queries, k, "l2"
        )


def test_get_or_create_collection(store):
    first = store.get_or_create_collection("c", dim=4, metric="cosine")
    again = store.get_or_create_collection("c", dim=4, metric="cosine")
    assert again.name == first.name == "c"
    with pytest.raises(ValueError, match="dim 4"):
        store.get_or_create_collection("c", dim=5, metric="cosine")


def test_concurrent_readers_and_a_writer(store, rng):
    base = rng.standard_normal((3000, 32)).astype(np.float32)
    queries = rng.standard_normal((16, 32)).astype(np.float32)
    collection = store.create_collection("c", dim=32)
    collection.add(base)
    want_ids, _ = collection.query(queries, k=5)
    failures = []

    def reader():
        for _ in range(10):
            ids, _ = collection.query(queries, k=5)
            if not np.array_equal(ids, want_ids):
                failures.append(ids)

    def writer():
        # Far-away rows: they never enter the readers' top 5.
        for batch in range(5):
            collection.add(np.full((10, 32), 1e3 + batch, dtype=np.float32))

    threads = [threading.Thread(target=reader) for _ in range(4)] + [
        threading.Thread(target=writer)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert collection.count == 3050


def test_empty_collection_and_empty_add(store):
    collection = store.create_collection("c", dim=2)
    assert collection.add(np.zeros((0, 2))).tolist() == []
    ids, distances = collection.query(np.zeros((2, 2)), k=3)
    assert (ids == -1).all() and np.isinf(distances).all()
    assert collection.next_free_id() == 0


def test_batches_larger_than_a_chunk_equal_one_call(store, rng, monkeypatch):
    base = rng.standard_normal((300, 8)).astype(np.float32)
    queries = rng.standard_normal((50, 8)).astype(np.float32)
    collection = store.create_collection("c", dim=8)
    collection.add(base)
    whole_ids, whole_distances = collection.query(queries, k=4)
    monkeypatch.setattr(gpuopt.vector, "_QUERY_CHUNK", 7)
    chunked_ids, chunked_distances = collection.query(queries, k=4)
    np.testing.assert_array_equal(chunked_ids, whole_ids)
    np.testing.assert_array_equal(chunked_distances, whole_distances)
