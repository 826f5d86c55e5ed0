"""gpuopt.data on a GPU (skipped without one): prefetched batches equal the source's, with
structure, dtype and shape kept; they are ready on the consumer's stream, also a side stream,
without a host sync; a long run with a slow consumer never sees a buffer rewritten under it; the
native sources yield CUDA tensors equal to the file's bytes and survive being held past the next
batch."""

from __future__ import annotations

import collections
import gc
import threading
import time

import numpy as np
import pytest

from conftest import requires_gpu

pytestmark = requires_gpu

Pair = collections.namedtuple("Pair", "x y")


def make_batches(count: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        out.append(
            {
                "x": torch.randn(8, 3, 17, generator=g),
                "half": torch.randn(5, generator=g).half(),
                "np": np.arange(12, dtype=np.int16).reshape(3, 4) + i,
                "pair": Pair(torch.randint(0, 100, (7,), generator=g), f"name{i}"),
                "list": [torch.tensor([i], dtype=torch.int64), i],
                "strided": torch.arange(20.0).reshape(4, 5).t(),
            }
        )
    return out


def check_same(got, want) -> None:
    import torch

    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.is_cuda
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, torch.Tensor) and got.is_cuda
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            check_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            check_same(a, b)
    else:
        assert got == want


def test_values_structure_dtype_and_shape_match_the_source():
    import gpuopt.data as gdata

    source = make_batches(20)
    got = list(gdata.prefetch(source, device="cuda"))
    assert len(got) == 20
    for a, b in zip(got, source):
        check_same(a, b)


def test_pinned_sources_and_a_torch_dataloader_with_workers():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import gpuopt.data as gdata

    data = torch.randn(256, 33)
    labels = torch.arange(256)
    loader = DataLoader(TensorDataset(data, labels), batch_size=32, num_workers=2,
                        pin_memory=True)
    prefetched = gdata.prefetch(loader, device="cuda")
    assert len(prefetched) == 8
    for _ in range(2):  # re-iteration: one epoch each
        xs, ys = zip(*prefetched)
        assert torch.equal(torch.cat(xs).cpu(), data) and torch.equal(torch.cat(ys).cpu(), labels)


def test_ready_on_a_side_stream_without_host_sync():
    import torch

    import gpuopt.data as gdata

    big = [torch.full((64, 1024, 1024), float(i)) for i in range(6)]  # 256 MiB each
    side = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(side):
        for batch in gdata.prefetch(big, device="cuda"):
            sums.append(batch.sum())  # queued on `side`, which waits on the copy's event
    side.synchronize()
    want = [float(i) * 64 * 1024 * 1024 for i in range(6)]
    assert [float(s) for s in sums] == pytest.approx(want, rel=1e-6)


def test_no_host_sync_when_handing_out_batches():
    import torch

    import gpuopt.data as gdata

    source = [torch.randn(1024, 1024) for _ in range(8)]
    prefetched = gdata.prefetch(source, device="cuda")
    iterator = iter(prefetched)
    first = next(iterator)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rest = [b for b in iterator]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first.cpu(), source[0])
    for got, want in zip(rest, source[1:]):
        assert torch.equal(got.cpu(), want)


def test_slow_consumer_never_sees_a_reused_buffer():
    """Each batch is consumed by a long kernel sequence on the current stream while the producer
    runs ahead; the batch's checksum, computed after the slow work, must equal the source's."""
    import torch

    import gpuopt.data as gdata

    count = 120
    source = [torch.full((256, 1024), float(i)) + torch.arange(1024.0) for i in range(count)]
    want = [float(t.double().sum()) for t in source]
    got = []
    for i, batch in enumerate(gdata.prefetch(source, device="cuda", depth=6)):
        torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time before the read
        got.append(batch.double().sum())
        if i % 10 == 0:
            time.sleep(0.01)  # a slow host too, so the producer is far ahead
    assert [float(g) for g in got] == want


def test_break_and_gc_stop_the_producer_on_the_gpu_path():
    import torch

    import gpuopt.data as gdata

    source = [torch.randn(1000) for _ in range(1000)]
    for i, _ in enumerate(gdata.prefetch(source, device="cuda")):
        if i == 5:
            break
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.name == "gpuopt.data.prefetch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a prefetch thread outlived its pass"
        time.sleep(0.01)


def test_large_batches_report_copy_throughput():
    import torch

    import gpuopt.data as gdata

    source = [torch.ones(64 << 20, dtype=torch.uint8) for _ in range(6)]
    loader = gdata.prefetch(source, device="cuda")
    total = sum(int(b.sum()) for b in loader)
    assert total == 6 * (64 << 20)
    staging = loader.stats()["staging"]
    assert staging["h2d_bytes"] >= 6 * (64 << 20) and staging["h2d_gbps"] > 0


def write_records(path, count: int, record_bytes: int) -> np.ndarray:
    data = np.random.default_rng(count).integers(0, 256, size=(count, record_bytes),
                                                 dtype=np.uint8)
    data.tofile(path)
    return data


@pytest.mark.parametrize("io", ["pread", "auto"])
def test_record_file_yields_cuda_tensors_equal_to_the_file(tmp_path, io):
    import torch

    import gpuopt.data as gdata

    path = tmp_path / "records.bin"
    want = write_records(path, 203, 4096)
    source = gdata.RecordFile(path, 4096, batch_size=16, shape=(1024,), dtype="float32",
                              device="cuda", io=io, return_indices=True)
    held = []
    for batch, indices in source:
        assert batch.is_cuda and batch.dtype == torch.float32 and batch.shape[1:] == (1024,)
        held.append((batch, indices))  # held past the next batch: its slot stays ours
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = torch.cat([b for b, _ in held]).view(torch.uint8).cpu().numpy()
    np.testing.assert_array_equal(got.reshape(203, 4096), want)
    np.testing.assert_array_equal(np.concatenate([i for _, i in held]), np.arange(203))
    assert source.stats()["batches"] == 13


def test_record_file_slow_consumer_checksums(tmp_path):
    import torch

    import gpuopt.data as gdata

    path = tmp_path / "records.bin"
    want = write_records(path, 512, 8192)
    source = gdata.RecordFile(path, 8192, batch_size=8, device="cuda", io="pread", depth=4,
                              return_indices=True)
    for batch, indices in source:
        torch.cuda._sleep(1_000_000)
        checksum = int(batch.to(torch.int64).sum())
        assert checksum == int(want[indices].astype(np.int64).sum())
