"""Every status code maps to its exception class, with the right built-in bases and the C++
message; real calls raise them."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gpuopt
import gpuopt.vector
from gpuopt import errors


@pytest.mark.parametrize(
    "code, cls, builtin",
    [
        (1, errors.CancelledError, None),
        (2, errors.UnknownError, None),
        (3, errors.InvalidArgumentError, ValueError),
        (4, errors.DeadlineExceededError, TimeoutError),
        (5, errors.NotFoundError, FileNotFoundError),
        (6, errors.AlreadyExistsError, FileExistsError),
        (7, errors.PermissionDeniedError, PermissionError),
        (8, errors.ResourceExhaustedError, MemoryError),
        (9, errors.FailedPreconditionError, RuntimeError),
        (10, errors.AbortedError, RuntimeError),
        (11, errors.OutOfRangeError, IndexError),
        (12, errors.UnimplementedError, NotImplementedError),
        (13, errors.InternalError, RuntimeError),
        (14, errors.GpuUnavailableError, RuntimeError),
        (15, errors.DataLossError, OSError),
    ],
)
def test_each_code_has_its_class(code, cls, builtin):
    exception = errors._exception_for_status(code, "the message")
    assert type(exception) is cls
    assert isinstance(exception, gpuopt.Error)
    if builtin is not None:
        assert isinstance(exception, builtin)
    assert str(exception) == "the message"


def test_unimplemented_for_missing_cuda_is_gpu_unavailable():
    exception = errors._exception_for_status(12, "stream SM count: gpuopt was built without CUDA")
    assert type(exception) is errors.GpuUnavailableError
    assert (
        type(errors._exception_for_status(12, "no cuDNN forward algorithm"))
        is errors.UnimplementedError
    )


def test_every_public_name_is_exported_and_documented():
    for name in gpuopt.__all__:
        value = getattr(gpuopt, name)
        if isinstance(value, (str, bool)):
            continue
        assert value.__doc__, name


def test_not_found_carries_the_cpp_message(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(FileNotFoundError) as caught:
        gpuopt.vector.open(missing)
    assert isinstance(caught.value, gpuopt.NotFoundError)
    assert str(missing) in str(caught.value)


def test_already_exists(store):
    collection = store.create_collection("c", dim=2)
    collection.add(np.zeros((1, 2)), ids=[7])
    with pytest.raises(gpuopt.AlreadyExistsError) as caught:
        collection.add(np.ones((1, 2)), ids=[7])
    assert "7" in str(caught.value)
    with pytest.raises(gpuopt.AlreadyExistsError):
        store.create_collection("c", dim=2)


def test_invalid_arguments_name_what_was_wrong(store):
    collection = store.create_collection("c", dim=3)
    cases = [
        (lambda: collection.add(np.zeros((2, 4))), "dimension 4"),
        (lambda: collection.add(np.zeros(3)), "2-D"),
        (lambda: collection.add(np.array([["a", "b", "c"]])), "dtype"),
        (lambda: collection.add(np.full((1, 3), np.nan)), "NaN"),
        (lambda: collection.add(np.zeros((2, 3)), ids=[1]), "1 ids for 2 vectors"),
        (lambda: collection.add(np.zeros((1, 3)), ids=[-1]), "[0, 2**63)"),
        (lambda: collection.add(np.zeros((1, 3)), ids=[1.5]), "integer"),
        (lambda: collection.add(np.zeros((1, 3)), metadata=[{"a": [1]}]), "metadata[0].a"),
        (lambda: collection.add(np.zeros((1, 3)), metadata=[{"a": True}]), "metadata[0].a"),
        (lambda: collection.add(np.zeros((1, 3)), metadata=[{}, {}]), "2 entries for 1 vectors"),
        (lambda: collection.query(np.zeros((1, 2))), "dimension 2"),
        (lambda: collection.query(np.zeros((1, 3)), k=0), "k"),
        (lambda: collection.query(np.zeros((1, 3)), index="hnsw"), "index"),
        (lambda: collection.query(np.zeros((1, 3)), where={"year": {"$gtx": 1}}), "$gtx"),
        (lambda: collection.query(np.zeros((1, 3)), where="{not json"), "where"),
        (lambda: store.create_collection("d", dim=0), "dim"),
        (lambda: store.create_collection("d", dim=2, metric="manhattan"), "metric"),
    ]
    for call, fragment in cases:
        with pytest.raises(ValueError) as caught:
            call()
        assert isinstance(caught.value, gpuopt.InvalidArgumentError)
        assert fragment in str(caught.value), (fragment, str(caught.value))
    assert collection.count == 0  # nothing was written by any of them


def test_closed_store_raises_failed_precondition(tmp_path):
    store = gpuopt.vector.open(tmp_path / "s", create=True)
    collection = store.create_collection("c", dim=2)
    store.close()
    assert store.closed
    with pytest.raises(gpuopt.FailedPreconditionError, match="closed"):
        collection.count
    with pytest.raises(gpuopt.FailedPreconditionError):
        store.collection("c")


def test_truncated_segment_is_data_loss(tmp_path):
    path = tmp_path / "s"
    with gpuopt.vector.open(path, create=True) as store:
        store.create_collection("c", dim=8).add(np.ones((100, 8)))
    segments = list((path / "segments").glob("*.seg"))
    assert segments
    with open(segments[0], "r+b") as handle:
        handle.truncate(os.path.getsize(segments[0]) - 100)
    with pytest.raises(gpuopt.DataLossError) as caught:
        with gpuopt.vector.open(path) as store:
            store.collection("c").query(np.ones((1, 8)))
    assert segments[0].name in str(caught.value)


def test_corrupt_segment_data_is_data_loss_on_verify(tmp_path):
    path = tmp_path / "s"
    with gpuopt.vector.open(path, create=True) as store:
        store.create_collection("c", dim=8).add(np.ones((100, 8)))
    segment = next((path / "segments").glob("*.seg"))
    with open(segment, "r+b") as handle:
        handle.seek(4096 + 17)
        handle.write(b"\x7f")
    with gpuopt.vector.open(path) as store:
        with pytest.raises(gpuopt.DataLossError, match=segment.name):
            store.collection("c").verify()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unreadable_store_is_permission_or_not_found(tmp_path):
    path = tmp_path / "s"
    gpuopt.vector.open(path, create=True).close()
    os.chmod(path, 0)
    try:
        with pytest.raises(gpuopt.Error):
            gpuopt.vector.open(path)
    finally:
        os.chmod(path, 0o755)
