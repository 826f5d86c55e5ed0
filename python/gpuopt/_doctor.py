"""gpuopt.doctor(): the platform diagnosis as the dict ``gpuopt doctor --json`` prints."""

from __future__ import annotations

import json
import os
from typing import Any

from . import _native

__all__ = ["doctor"]


def doctor(
    root: str | os.PathLike[str] | None = None,
    *,
    all_devices: bool = False,
    nvml: bool = True,
    vulkan: bool = True,
) -> dict[str, Any]:
    """Reads the PCIe links, IOMMU, ASPM, NVML state, GPU processes and Vulkan, judges them into
    findings and returns the report (docs/schemas/doctor.schema.json), as ``gpuopt doctor --json``.

    Args:
        root: a recorded machine's directory (its /sys, /proc, /etc) instead of this machine.
        all_devices: describe every PCI device, not only GPUs and accelerators.
        nvml: ask NVML (the driver) for GPU state; ignored for a recorded machine.
        vulkan: probe Vulkan; ignored for a recorded machine.

    Raises:
        NotFoundError / InvalidArgumentError: ``root`` is unusable. Everything else the machine
        lacks (no GPU, no driver) becomes a note or finding inside the report.
    """
    native = _native.require()
    text = native.doctor_json(
        os.fspath(root) if root is not None else "/",
        all_devices=all_devices,
        use_nvml=nvml,
        use_vulkan=vulkan,
    )
    return json.loads(text)
