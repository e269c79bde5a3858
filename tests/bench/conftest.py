"""Shared by the benchmark smoke tests: run a script of ``benchmarks/`` as a user would."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import _forked

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return _forked.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        timeout=timeout,
    )


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_script("replay.py", "--capacity", "15000")``: the script in a subprocess, its
    exit status and output returned unchecked (for the tests of bad arguments)."""
    return _script


@pytest.fixture
def run_benchmark() -> Callable[..., dict[str, Any]]:
    """``run_benchmark("losses.py", "--only", "qmix", ...)``: the script in a subprocess, its
    exit status checked (stderr in the failure), its one JSON object returned."""

    def run(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
        out = _script(script, *args, timeout=timeout)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    return run
