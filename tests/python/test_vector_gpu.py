"""gpuopt.vector with torch tensors: CUDA tensors are ingested through the device-pointer path on
the caller's stream and round-trip exactly; CPU tensors go in by DLPack; results come back in
torch on the queries' device; bad tensors are refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_gpu, requires_torch


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
