"""gpuopt.runtime: without a GPU every call raises GpuUnavailableError saying why; on a GPU the
pool's and the plan's streams work as torch ExternalStreams and report their SMs."""

from __future__ import annotations

import pytest

import gpuopt
import gpuopt.runtime as rt
from conftest import requires_gpu


def has_usable_gpu() -> bool:
    try:
        rt.device_properties(0)
        return True
    except gpuopt.GpuUnavailableError:
        return False


@pytest.mark.skipif(has_usable_gpu(), reason="this machine has a usable GPU")
def test_without_a_gpu_calls_raise_gpu_unavailable_with_a_reason():
    for call in (
        lambda: rt.device_properties(0),
        lambda: rt.StreamPool(),
        lambda: rt.PartitionPlan([rt.WorkloadSpec("a")]),
        lambda: rt.stream_sm_count(0),
    ):
        with pytest.raises(gpuopt.GpuUnavailableError) as caught:
            call()
        assert isinstance(caught.value, RuntimeError)
        message = str(caught.value).lower()
        assert any(word in message for word in ("cuda", "driver", "device", "gpu")), message


def test_bad_workload_specs_are_rejected_before_the_gpu():
    with pytest.raises(ValueError, match="WorkloadSpec"):
        rt.PartitionPlan([("a", 8, "high", 1)])


@requires_gpu
def test_stream_pool_streams_work_in_torch():
    import torch

    pool = rt.StreamPool(0, streams_per_level=2)
    first, second, third = pool.next("critical"), pool.next("critical"), pool.next("critical")
    assert first != second and third == first  # round-robin over two
    assert pool.priority_value("critical") <= pool.priority_value("background")
    stream = pool.torch_stream("high")
    with torch.cuda.stream(stream):
        y = torch.ones(1 << 20, device="cuda") * 3
    stream.synchronize()
    assert float(y.sum()) == 3 * (1 << 20)
    props = rt.device_properties(0)
    assert rt.stream_sm_count(stream) == props["sm_count"]
    with pytest.raises(ValueError):
        pool.next("urgent")


@requires_gpu
def test_partition_plan_streams_and_sm_counts():
    import torch

    total = rt.device_properties(0)["sm_count"]
    with rt.PartitionPlan(
        [rt.WorkloadSpec("critical", 16, "critical"), rt.WorkloadSpec("rest", 0, "background", 2)]
    ) as plan:
        assert gpuopt._native.native.partition_plan_active(0)
        critical, rest = plan.workload("critical"), plan.workload("rest")
        assert len(rest.streams) == 2
        if plan.isolated:
            assert 16 <= critical.sm_count < total
            assert critical.sm_count + rest.sm_count <= total
            assert rt.stream_sm_count(critical.streams[0]) == critical.sm_count
        else:
            assert plan.fallback_reason
        with torch.cuda.stream(plan.torch_stream("critical")):
            y = torch.arange(1000, device="cuda").sum()
        torch.cuda.synchronize()
        assert int(y) == 999 * 1000 // 2
        with pytest.raises(gpuopt.FailedPreconditionError):
            rt.StreamPool(0)
        with pytest.raises(gpuopt.NotFoundError, match="critical"):
            plan.workload("nope")
    with pytest.raises(gpuopt.FailedPreconditionError):
        plan.describe()
