"""gpuopt.data on the CPU path (numpy; no GPU needed): values and structure against the source,
len() and re-iteration, the source's exception re-raised with its traceback, and a clean stop
(no leaked thread) on break, garbage collection, close(), Ctrl-C and interpreter exit. The native
sources (record file, JPEG folder) against bytes written by the test and the fixtures' formula."""

from __future__ import annotations

import collections
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest

import gpuopt
import gpuopt.data as gdata

from conftest import TEST_DATA

Pair = collections.namedtuple("Pair", "x y")


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuopt.data.prefetch"]


def wait_no_prefetch_threads(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch_threads() == [], "a prefetch thread outlived its pass"


@pytest.fixture(autouse=True)
def no_thread_leaks():
    before = set(threading.enumerate())
    yield
    gc.collect()
    wait_no_prefetch_threads()
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - before == set()


def batches(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        {
            "image": rng.standard_normal((4, 3, 5)).astype(np.float32),
            "pair": Pair(rng.integers(0, 9, size=4), ("a", i)),
            "ids": [np.array([i], dtype=np.int64), i * 2],
        }
        for i in range(count)
    ]


def assert_same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
    else:
        assert got == want


class SlowSource:
    """An iterable with len() whose items take `cost_s` each; counts the items produced."""

    def __init__(self, count: int, cost_s: float = 0.0, fail_at: int | None = None) -> None:
        self.count, self.cost_s, self.fail_at = count, cost_s, fail_at
        self.produced = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for i in range(self.count):
            if self.cost_s:
                time.sleep(self.cost_s)
            if i == self.fail_at:
                self.explode(i)
            self.produced += 1
            yield np.full(3, i, dtype=np.int32)

    @staticmethod
    def explode(i: int) -> None:
        raise KeyError(f"sample {i} is missing from the index")


def test_cpu_prefetch_yields_the_source_batches_in_order_with_structure():
    source = batches(40)
    got = list(gdata.prefetch(source, device="cpu"))
    assert len(got) == 40
    for a, b in zip(got, source):
        assert_same(a, b)


def test_len_and_reiteration_make_one_pass_each():
    source = SlowSource(7)
    loader = gdata.prefetch(source, device="cpu")
    assert len(loader) == 7
    first = [int(x[0]) for x in loader]
    second = [int(x[0]) for x in loader]
    assert first == second == list(range(7))
    assert source.produced == 14  # iter() of the source once per pass
    assert loader.stats()["batches"] == 7


def test_len_of_a_source_without_len_is_a_type_error():
    loader = gdata.prefetch((np.zeros(2) for _ in range(3)), device="cpu")
    with pytest.raises(TypeError, match="no len"):
        len(loader)
    assert len(list(loader)) == 3
    assert list(loader) == []  # a generator is one pass, as without prefetch


def test_fixed_and_adaptive_depth_bound_the_read_ahead():
    source = SlowSource(50)
    loader = gdata.prefetch(source, device="cpu", depth=3)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.2)
    # One handed out, `depth` queued, at most one being fetched.
    assert source.produced <= 1 + 3 + 1
    iterator.close()


def test_adaptive_depth_grows_while_the_consumer_waits_on_a_bursty_source():
    class Bursty:
        def __iter__(self):
            for i in range(160):
                time.sleep(0.03 if i % 16 == 15 else 0.0005)
                yield np.full(8, i)

    loader = gdata.prefetch(Bursty(), device="cpu")
    for _ in loader:
        time.sleep(0.003)
    stats = loader.stats()
    assert stats["max_depth_reached"] > 2, stats["depth_timeline"]
    assert any(d["reason"].startswith("grow") for d in stats["depth_timeline"])


@pytest.mark.skipif(gpuopt._native.native is None, reason="the depth controller is native")
def test_the_depth_controller_grows_by_the_waits_deficit_within_its_bounds():
    native = gpuopt._native.native
    # 8 batches of 15 ms consumer work and 0.27 s of wait: 18 more batches would have covered it
    # (x1.5 alone gives 3). Arguments: wall, wait, batches, capacity, pressure, now, batch.
    window = (8 * 0.015 + 0.27, 0.27, 8)
    controller = native.DepthController(True, 2, 1, 64, 8, 64)
    depth, reason = controller.observe(*window, 1000.0, False, 1.0, 8)
    assert depth == 20 and reason.startswith("grow"), reason
    by_bound = native.DepthController(True, 2, 1, 64, 8, 12)  # upper bound 12
    assert by_bound.observe(*window, 1000.0, False, 1.0, 8)[0] == 12
    by_max = native.DepthController(True, 2, 1, 9, 8, 64)  # max_depth 9
    assert by_max.observe(*window, 1000.0, False, 1.0, 8)[0] == 9
    held = native.DepthController(True, 2, 1, 64, 8, 64)
    depth, reason = held.observe(*window, 50.0, False, 1.0, 8)  # demand 66.7 batches/s
    assert depth == 2 and "producer-bound" in reason, reason


def test_memory_budget_caps_the_depth_and_one_batch_too_many_is_an_error():
    source = [np.zeros(1000, dtype=np.uint8) for _ in range(30)]  # 1000 B per batch
    loader = gdata.prefetch(source, device="cpu", depth=20, memory_budget=5000)
    assert len(list(loader)) == 30
    assert loader.stats()["depth"] == 3  # 5000 // 1000 - 2 in use
    with pytest.raises(gpuopt.ResourceExhaustedError, match="memory_budget 1500"):
        list(gdata.prefetch(source, device="cpu", memory_budget=1500))


def test_source_exception_is_reraised_with_message_and_original_traceback():
    loader = gdata.prefetch(SlowSource(10, fail_at=4), device="cpu")
    got = []
    with pytest.raises(KeyError, match="sample 4 is missing") as caught:
        for item in loader:
            got.append(int(item[0]))
    assert got == [0, 1, 2, 3]
    text = "".join(traceback.format_exception(caught.value))
    assert "in explode" in text and "raise KeyError" in text  # the producer-side frames
    assert "producer thread" in text


def test_break_stops_the_producer():
    source = SlowSource(10_000, cost_s=0.001)
    for i, _ in enumerate(gdata.prefetch(source, device="cpu")):
        if i == 3:
            break
    wait_no_prefetch_threads()
    produced = source.produced
    time.sleep(0.1)
    assert source.produced == produced  # nothing runs after the stop


def test_garbage_collection_stops_the_producer():
    source = SlowSource(10_000, cost_s=0.001)
    iterator = iter(gdata.prefetch(source, device="cpu"))
    next(iterator)
    assert len(prefetch_threads()) == 1
    del iterator
    gc.collect()
    wait_no_prefetch_threads()


def test_close_and_context_manager_stop_the_producer():
    with gdata.prefetch(SlowSource(10_000, cost_s=0.001), device="cpu") as loader:
        next(iter(loader))
    wait_no_prefetch_threads()


def test_a_new_pass_stops_the_previous_one():
    loader = gdata.prefetch(SlowSource(10_000, cost_s=0.001), device="cpu")
    first = iter(loader)
    next(first)
    second = iter(loader)
    assert int(next(second)[0]) == 0
    assert next(first, None) is None  # the old pass ended
    second.close()


def test_bad_arguments_are_named():
    with pytest.raises(gpuopt.InvalidArgumentError, match="expected an iterable"):
        gdata.prefetch(42, device="cpu")
    with pytest.raises(gpuopt.InvalidArgumentError, match="depth 0"):
        gdata.prefetch([], device="cpu", depth=0)
    with pytest.raises(gpuopt.InvalidArgumentError, match="device 'tpu'"):
        gdata.prefetch([], device="tpu")


@pytest.mark.skipif(gpuopt.built_with_cuda and "torch" in sys.modules, reason="CUDA may exist")
def test_cuda_without_cuda_is_gpu_unavailable():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    except ImportError:
        pass
    with pytest.raises(gpuopt.GpuUnavailableError, match="device='cpu'"):
        gdata.prefetch([], device="cuda")
    assert gdata.prefetch([np.ones(2)]).stats() == {}  # device=None falls back to the CPU


CHILD_SIGINT = textwrap.dedent(
    """
    import faulthandler, signal, sys, threading, time, numpy as np, gpuopt.data as gdata
    faulthandler.dump_traceback_later(20, exit=True)  # a hang prints every thread's stack
    # A process started in the background by a non-interactive shell (as CI runs) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: install it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    def slow():
        while True:
            time.sleep(0.05)
            yield np.zeros(4)
    try:
        for i, batch in enumerate(gdata.prefetch(slow(), device="cpu", depth=1)):
            if i == 2:
                print("ready", flush=True)
                time.sleep(0.01)   # then wait in next() for a slow batch
    except KeyboardInterrupt:
        deadline = time.monotonic() + 5
        while any(t.name == "gpuopt.data.prefetch" for t in threading.enumerate()):
            if time.monotonic() > deadline:
                print("leaked", flush=True)
                sys.exit(3)
            time.sleep(0.01)
        print("clean", flush=True)
    """
)


def _interrupt_child() -> tuple[int, str, str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SIGINT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    try:
        out, err = child.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        return -1, out, err
    return child.returncode, out, err


def test_ctrl_c_in_the_consumer_stops_cleanly():
    code, out, err = _interrupt_child()
    assert code == 0 and out.strip() == "clean", (code, out, err)


CHILD_EXIT = textwrap.dedent(
    """
    import time, numpy as np, gpuopt.data as gdata
    def stuck():
        yield np.zeros(4)
        time.sleep(3600)   # the producer is inside the source at exit
        yield np.zeros(4)
    kept = iter(gdata.prefetch(stuck(), device="cpu"))
    next(kept)
    busy = iter(gdata.prefetch((np.zeros(4) for _ in range(10**9)), device="cpu"))
    next(busy)
    print("exiting", flush=True)
    """
)


def test_interpreter_exit_with_running_passes_does_not_hang():
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD_EXIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
    assert time.monotonic() - started < 30


# ---- native sources on the CPU path --------------------------------------------------------------
def write_records(path, count: int, record_bytes: int) -> np.ndarray:
    rng = np.random.default_rng(count)
    data = rng.integers(0, 256, size=(count, record_bytes), dtype=np.uint8)
    data.tofile(path)
    return data


def test_record_file_yields_every_record_once_per_pass(tmp_path):
    path = tmp_path / "records.bin"
    want = write_records(path, 37, 64)
    source = gdata.RecordFile(
        path, 64, batch_size=8, shape=(16,), dtype="float32", device="cpu", io="pread",
        return_indices=True,
    )
    assert len(source) == 5 and source.dataset_size == 37
    for _ in range(2):
        got = list(source)
        assert [len(i) for _, i in got] == [8, 8, 8, 8, 5]
        values = np.concatenate([b for b, _ in got])
        assert values.dtype == np.float32 and values.shape == (37, 16)
        np.testing.assert_array_equal(values.view(np.uint8), want)
        np.testing.assert_array_equal(np.concatenate([i for _, i in got]), np.arange(37))


def test_record_file_drop_last_and_shuffle(tmp_path):
    path = tmp_path / "records.bin"
    want = write_records(path, 37, 32)
    source = gdata.RecordFile(
        path, 32, batch_size=8, shuffle=True, seed=5, drop_last=True, device="cpu", io="pread",
        return_indices=True,
    )
    assert len(source) == 4
    orders = []
    for _ in range(2):
        got = list(source)
        assert [len(i) for _, i in got] == [8, 8, 8, 8]
        indices = np.concatenate([i for _, i in got])
        np.testing.assert_array_equal(np.concatenate([b for b, _ in got]), want[indices])
        assert len(set(indices.tolist())) == 32
        orders.append(indices.tolist())
    assert orders[0] != orders[1]  # a new permutation per pass


def test_record_file_errors_are_named(tmp_path):
    path = tmp_path / "records.bin"
    write_records(path, 4, 32)
    with open(path, "ab") as file:
        file.write(b"x" * 10)  # a truncated fifth record
    with pytest.raises(gpuopt.DataLossError, match="record 4"):
        list(gdata.RecordFile(path, 32, batch_size=2, device="cpu", io="pread"))
    skipped = gdata.RecordFile(path, 32, batch_size=2, device="cpu", io="pread", on_error="skip")
    assert sum(len(b) for b in skipped) == 4
    with pytest.raises(gpuopt.InvalidArgumentError, match="bytes per sample"):
        gdata.RecordFile(path, 32, batch_size=2, shape=(3,), dtype="float32", device="cpu")
    with pytest.raises(gpuopt.InvalidArgumentError, match="dtype 'complex'"):
        gdata.RecordFile(path, 32, batch_size=2, dtype="complex", device="cpu")
    with pytest.raises(gpuopt.NotFoundError):
        gdata.RecordFile(tmp_path / "missing.bin", 32, batch_size=2, device="cpu")


def test_record_file_break_and_gc_stop_the_loader(tmp_path):
    path = tmp_path / "records.bin"
    write_records(path, 1000, 64)
    source = gdata.RecordFile(path, 64, batch_size=4, device="cpu", io="pread")
    for i, _ in enumerate(source):
        if i == 2:
            break
    gc.collect()
    assert len(list(source)) == 250  # a fresh pass after the break


def test_jpeg_folder_decodes_and_resizes_on_native_threads():
    h, w = 24, 20
    source = gdata.JpegFolder(
        os.path.join(TEST_DATA, "loader", "jpeg"), height=h, width=w, batch_size=2, device="cpu"
    )
    assert len(source) == 2
    images = np.concatenate(list(source))
    assert images.shape == (3, h, w, 3) and images.dtype == np.uint8
    for i, in_h in enumerate((48, 32, 60)):  # G = y*255/(h-1) in every fixture (README there)
        sy = np.clip((np.arange(h) + 0.5) * in_h / h - 0.5, 0, in_h - 1)
        expected = sy * 255 / (in_h - 1)
        assert np.abs(images[i, :, :, 1].astype(float) - expected[:, None]).max() <= 12


def test_jpeg_folder_bad_files_raise_or_skip():
    folder = os.path.join(TEST_DATA, "loader", "jpeg_bad")
    with pytest.raises(gpuopt.DataLossError, match="b_truncated.jpg|d_not_a_jpeg.jpg"):
        list(gdata.JpegFolder(folder, height=16, width=16, batch_size=4, device="cpu"))
    kept = gdata.JpegFolder(
        folder, height=16, width=16, batch_size=4, device="cpu", on_error="skip",
        return_indices=True,
    )
    assert [i.tolist() for _, i in kept] == [[0, 2]]


def test_public_names_have_docstrings():
    assert gdata.__doc__
    for name in gdata.__all__:
        value = getattr(gdata, name)
        assert value.__doc__, name
        for attribute, member in vars(value).items() if isinstance(value, type) else ():
            public = not attribute.startswith("_")
            if public and (callable(member) or isinstance(member, property)):
                assert member.__doc__, f"{name}.{attribute}"
