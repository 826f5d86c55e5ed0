"""Ctrl-C during a long vector call: a child Python process starts a reindex, a large CPU query or a
large add that would run for minutes, the parent sends SIGINT, and the child must get
KeyboardInterrupt within seconds, then find the store as it was before the call (same rows, same
saved IVF index), verified."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gpuopt.vector

DIM = 32
ROWS = 60000

# argv: store path, operation. Prints "started" just before the long call, then after the
# KeyboardInterrupt "interrupted <seconds inside the call>", and "clean" once the reopened store
# verified and held what it held before.
CHILD = textwrap.dedent(
    """
    import faulthandler, signal, sys, time, numpy as np, gpuopt.vector
    faulthandler.dump_traceback_later(60, exit=True)  # a hang prints every thread's stack
    # Started in the background by a non-interactive shell (as CI runs), a process inherits SIGINT
    # ignored and Python installs no KeyboardInterrupt handler: install it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path, operation = sys.argv[1], sys.argv[2]
    store = gpuopt.vector.open(path)
    name = "a" if operation == "add" else "c"
    c = store.collection(name)
    rows, ivf = c.count, c.info()["ivf"]
    if operation == "add":
        # Millions of rows: checking and cataloguing their ids alone takes many seconds.
        batch = np.random.default_rng(1).standard_normal((4_000_000, c.dim)).astype(np.float32)
        ids = np.arange(10**9, 10**9 + batch.shape[0])
    elif operation == "query":
        queries = np.random.default_rng(2).standard_normal((100_000, c.dim)).astype(np.float32)
    print("started", flush=True)
    start = time.monotonic()
    try:
        if operation == "reindex":
            c.reindex(nlist=512, iterations=100000, engine="cpu")
        elif operation == "query":
            c.query(queries, k=10, engine="cpu")
        else:
            c.add(batch, ids=ids)
        print("finished", flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic() - start:.3f}", flush=True)
    store.close()
    with gpuopt.vector.open(path) as again:
        c = again.collection(name)
        c.verify()
        assert c.count == rows, (c.count, rows)
        now = c.info()["ivf"]
        for key in ("present", "generation", "nlist", "file", "trained_rows"):
            assert now[key] == ivf[key], (key, now[key], ivf[key])
        if operation == "add":
            for probe in (10**9, 10**9 + 1000):
                try:
                    c.get(probe)
                    raise AssertionError(f"id {probe} of the cancelled batch is there")
                except gpuopt.NotFoundError:
                    pass
    print("clean", flush=True)
    """
)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cancel") / "store")
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    with gpuopt.vector.open(path, create=True) as store:
        c = store.create_collection("c", dim=DIM)
        for start in range(0, ROWS, 20000):
            c.add(vectors[start : start + 20000])
        c.reindex(nlist=16, iterations=2, engine="cpu")  # the index a cancelled reindex keeps
        store.create_collection("a", dim=4).add(vectors[:1000, :4])
    return path


@pytest.mark.parametrize("operation", ["reindex", "query", "add"])
def test_ctrl_c_cancels_a_long_call_and_leaves_the_store_as_it_was(store_path, operation):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, store_path, operation],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "started", child.stderr.read()
        time.sleep(1.0)  # well inside the call (each would run for minutes)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        answered = time.monotonic() - sent
        # Not communicate(): it reads the pipe itself, missing lines already in stdout's buffer.
        child.wait(timeout=60)
        exited = time.monotonic() - sent
        out, err = child.stdout.read(), child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert line and line[0] == "interrupted", (line, out, err)
    assert float(line[1]) >= 0.5, "the signal arrived before the call began"
    assert answered < 2.0, f"KeyboardInterrupt came {answered:.2f} s after SIGINT"
    assert out.strip() == "clean" and child.returncode == 0, (child.returncode, out, err)
    # Reopening and verifying 60000 rows takes well under a second; allow for a loaded machine.
    assert exited < 5.0, f"the child exited {exited:.2f} s after SIGINT"


def test_compact_from_python(tmp_path):
    with gpuopt.vector.open(str(tmp_path / "s"), create=True) as store:
        c = store.create_collection("c", dim=4)
        vectors = np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)
        for start in range(0, 40, 5):
            c.add(vectors[start : start + 5])
        c.delete([0, 1])
        report = c.compact(target_rows=20)
        assert report == {"segments_before": 8, "segments_after": 2, "rows_dropped": 2}
        c.verify()
        assert c.count == 38
        for i in (2, 39):
            np.testing.assert_array_equal(c.get(i)[0], vectors[i])
        with pytest.raises(gpuopt.InvalidArgumentError, match="target_rows"):
            c.compact(target_rows=-1)


def test_a_signal_handlers_exception_cancels_a_reindex_in_this_process(store_path):
    """Any exception a signal handler raises cancels the call and comes out of it unchanged."""

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        with gpuopt.vector.open(store_path) as store:
            c = store.collection("c")
            before = c.info()["ivf"]
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            start = time.monotonic()
            with pytest.raises(Stop):
                c.reindex(nlist=512, iterations=100000, engine="cpu")  # minutes if not stopped
            elapsed = time.monotonic() - start
            assert 0.4 < elapsed < 3.0, elapsed
            c.verify()
            now = c.info()["ivf"]
            for key in ("present", "generation", "nlist", "file", "trained_rows"):
                assert now[key] == before[key], key
            assert c.count == ROWS
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
