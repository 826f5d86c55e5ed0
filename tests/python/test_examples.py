"""The examples run: the embeddings example on the CPU (its filtered query returns only documents
the filter allows), the GPTQ layer example on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT, requires_gpu

EXAMPLES = os.path.join(REPO_ROOT, "examples")


def test_embeddings_example_runs_on_the_cpu(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(EXAMPLES, "embeddings_store.py"),
            "--store",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "added 8 documents; the collection holds 8"
    hits = [line for line in lines[2:] if line.startswith("  ")]
    assert hits, done.stdout
    for line in hits:  # where: topic in (runtime, hardware) and year >= 2023
        topic, year = line.split("[")[1].split("]")[0].split()
        assert topic in ("runtime", "hardware") and int(year) >= 2023, line


@requires_gpu
def test_gptq_layer_example_runs_on_the_gpu():
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "gptq_layer.py"), "--synthetic", "--m", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    error = float(done.stdout.split("max |y - CPU twin| / max |twin| = ")[1].split()[0])
    assert error < 2e-2, done.stdout


@requires_gpu
def test_training_loop_example_learns_on_the_gpu():
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "train_loop.py"), "--epochs", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    losses = [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("epoch")]
    assert len(losses) == 3, done.stdout
    # Random labels: the model can only memorise, but three epochs of AdamW must lower the loss.
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0], done.stdout
