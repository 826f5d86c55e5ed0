"""Shared fixtures and skip rules of the Python tests (CPU tests everywhere; GPU tests skip with
the reason when torch, CUDA or a GPU is missing)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import gpuopt

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEST_DATA = os.path.join(REPO_ROOT, "tests", "data")


def _gpu_reason() -> str | None:
    """Why GPU tests cannot run here, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if not gpuopt.built_with_cuda:
        return "gpuopt was built without CUDA"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    return None


GPU_REASON = _gpu_reason()
requires_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"GPU test: {GPU_REASON}")
requires_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261201)


@pytest.fixture
def store(tmp_path):
    import gpuopt.vector

    with gpuopt.vector.open(tmp_path / "store", create=True) as opened:
        yield opened
