"""gpuopt.bench: run one ``gpuopt bench`` suite and get its JSON report as a dict.

Each suite runs in a child process of the bundled CLI, as ``gpuopt audit`` runs its stages, so a
benchmark that crashes or hangs cannot take the Python process with it.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any, Iterable

from ._cli import cli_path
from .errors import DeadlineExceededError, Error, InvalidArgumentError

__all__ = ["SUITES", "run"]

#: The suites `gpuopt bench` knows.
SUITES = ("pcie", "streams", "loader", "scaler", "gemm", "vector")
# The flag each suite's command selects testcases with (scaler has one testcase).
_ONLY_FLAG = {
    "pcie": "--testcase",
    "loader": "--testcase",
    "vector": "--testcase",
    "gemm": "--only",
    "streams": "--only",
    "scaler": None,
}


def run(
    suite: str,
    only: str | Iterable[str] | None = None,
    *,
    quick: bool = False,
    args: Iterable[str] = (),
    timeout: float | None = None,
) -> dict[str, Any]:
    """Runs ``gpuopt bench SUITE --json`` and returns its report.

    Args:
        suite: one of SUITES.
        only: testcase key(s) to run (``--testcase``); None = all.
        quick: the short run ``gpuopt audit`` uses (``--quick``), where the suite has one.
        args: further CLI arguments, e.g. ``["--rows", "200000"]``.
        timeout: seconds before the child is stopped (DeadlineExceededError).

    Testcases that cannot run here (no GPU) are in the report as waived, with the reason.

    Raises:
        Error: the suite printed no JSON (the message has its stderr and exit code).
    """
    if suite not in SUITES:
        raise InvalidArgumentError(f"suite: {suite!r}; expected one of {SUITES}")
    selection = []
    if only is not None:
        flag = _ONLY_FLAG[suite]
        if flag is None:
            raise InvalidArgumentError(f"suite {suite!r} has no testcase selection")
        for key in [only] if isinstance(only, str) else list(only):
            selection += [flag, key]
    command = [cli_path(), "bench", suite, "--json", *selection]
    if quick:
        command.append("--quick")
    command += [str(a) for a in args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DeadlineExceededError(
            f"gpuopt bench {suite} ran past {timeout} s and was stopped"
        ) from None
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Error(
            f"gpuopt bench {suite} exited {done.returncode} without JSON: "
            f"{done.stderr.strip()[-2000:]}"
        ) from None
