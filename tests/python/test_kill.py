"""A child Python process adding batches is killed with SIGKILL at random moments; every batch it
had acknowledged (add() returned) is still there after reopening, byte for byte."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import gpuopt.vector

DIM = 16
BATCH = 200

CHILD = textwrap.dedent(
    f"""
    import sys, numpy as np, gpuopt.vector
    store = gpuopt.vector.open(sys.argv[1], create=True)
    collection = store.get_or_create_collection("c", dim={DIM})
    batch = collection.count // {BATCH}
    while True:
        rng = np.random.default_rng(batch)
        ids = np.arange(batch * {BATCH}, (batch + 1) * {BATCH})
        collection.add(rng.standard_normal(({BATCH}, {DIM})).astype(np.float32), ids=ids,
                       metadata=[{{"batch": batch}}] * {BATCH})
        print(batch, flush=True)   # acknowledged
        batch += 1
    """
)


def test_sigkill_during_adds_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "store")
    rng = np.random.default_rng(7)
    acknowledged = -1
    for attempt in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True
        )
        # Wait for at least one acknowledgement, then kill at a random moment.
        line = child.stdout.readline()
        assert line, f"child exited early with {child.wait()}"
        time.sleep(float(rng.uniform(0.0, 0.3)))
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()
        child.wait()
        printed = [int(x) for x in (line + rest).split()]
        acknowledged = max(acknowledged, printed[-1])
        with gpuopt.vector.open(path) as store:
            collection = store.collection("c")
            collection.verify()
            assert collection.count >= (acknowledged + 1) * BATCH
            assert collection.count % BATCH == 0  # batches are all or nothing
            for batch in (0, acknowledged):
                want = np.random.default_rng(batch).standard_normal((BATCH, DIM)).astype(np.float32)
                for row in (0, BATCH - 1):
                    vector, meta = collection.get(batch * BATCH + row)
                    np.testing.assert_array_equal(vector, want[row])
                    assert meta == {"batch": batch}
