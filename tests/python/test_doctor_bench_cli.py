"""gpuopt.doctor() equals `gpuopt doctor --json`; gpuopt.bench.run() returns the CLI's bench
JSON; the console script runs the bundled CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import gpuopt
import gpuopt.bench
from gpuopt._cli import cli_path
from conftest import TEST_DATA


def bundled_cli() -> bool:
    try:
        cli_path()
        return True
    except gpuopt.NotFoundError:
        return False


# The GPU machine's wheel is built without the CLI (GPUOPT_PYTHON_CLI=OFF, for its size).
requires_cli = pytest.mark.skipif(not bundled_cli(), reason="this wheel has no bundled gpuopt CLI")

RECORDED = os.path.join(TEST_DATA, "doctor", "h200-healthy")


def without_timing(report):
    report = dict(report)
    report.pop("elapsed_ms", None)
    return report


@pytest.mark.skipif(not os.path.isdir(RECORDED), reason="needs the repository's tests/data")
@requires_cli
def test_doctor_on_a_recorded_machine_equals_the_cli():
    got = gpuopt.doctor(RECORDED)
    assert got["schema_version"] == 1 and got["recorded"] is True
    assert got["findings"] is not None
    done = subprocess.run(
        [cli_path(), "doctor", "--json", "--root", RECORDED], capture_output=True, text=True
    )
    assert done.returncode in (0, 1, 2), done.stderr
    assert without_timing(got) == without_timing(json.loads(done.stdout))


def test_doctor_on_this_machine_returns_the_report():
    report = gpuopt.doctor(vulkan=False)
    assert report["schema_version"] == 1 and report["recorded"] is False
    assert isinstance(report["findings"], list)


def test_doctor_missing_root_is_not_found(tmp_path):
    with pytest.raises(gpuopt.NotFoundError):
        gpuopt.doctor(tmp_path / "no-such-machine")


@requires_cli
def test_bench_returns_the_suite_json():
    report = gpuopt.bench.run("scaler", timeout=300)
    assert report["testcases"], report
    for testcase in report["testcases"]:
        assert testcase["outcome"] in ("passed", "waived", "failed")
        if not gpuopt.built_with_cuda:
            assert testcase["outcome"] == "waived" and testcase["reason"]


def test_bench_rejects_unknown_suites_and_selections():
    with pytest.raises(ValueError, match="suite"):
        gpuopt.bench.run("nonsense")
    with pytest.raises(ValueError, match="no testcase selection"):
        gpuopt.bench.run("scaler", only="x")


@requires_cli
def test_console_script_runs_the_bundled_cli():
    script = shutil.which("gpuopt", path=os.path.dirname(sys.executable))
    assert script, "the gpuopt console script is not installed beside this Python"
    done = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "doctor" in done.stdout
    done = subprocess.run(
        [script, "vector", "info", "/nonexistent/store"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "/nonexistent/store" in done.stderr


def test_stubs_are_shipped():
    package = os.path.dirname(gpuopt.__file__)
    stub = os.path.join(package, "_gpuopt.pyi")
    assert os.path.isfile(stub)
    text = open(stub, encoding="utf-8").read()
    for name in (
        "class VectorStore",
        "class VectorCollection",
        "def doctor_json",
        "class W4A16Plan",
    ):
        assert name in text
    assert os.path.isfile(os.path.join(package, "py.typed"))


def test_public_names_have_docstrings():
    import inspect

    import gpuopt.quant
    import gpuopt.runtime
    import gpuopt.vector

    for module in (
        gpuopt,
        gpuopt.vector,
        gpuopt.runtime,
        gpuopt.quant,
        gpuopt.bench,
        gpuopt.errors,
    ):
        assert module.__doc__, module.__name__
        for name in module.__all__:
            if name == "W4A16Linear":
                continue  # built on first use (needs torch); documented in the module's __getattr__
            value = getattr(module, name)
            if isinstance(value, (str, bool, tuple)):
                continue
            assert value.__doc__, f"{module.__name__}.{name}"
            if inspect.isclass(value):
                for attribute, member in vars(value).items():
                    if (
                        not attribute.startswith("_")
                        and callable(member)
                        or isinstance(member, property)
                    ):
                        if not attribute.startswith("_"):
                            assert member.__doc__, f"{module.__name__}.{name}.{attribute}"
