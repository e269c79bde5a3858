"""Shared by the smoke tests of ``benchmarks/``: run a script as a user would."""

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
#: What every script's JSON starts with (marlkit.bench.rounds.start).
HEADER = {"benchmark", "environment", "settings"}


def _script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return _forked.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        timeout=timeout,
    )


def _check_header(data: dict[str, Any], benchmark: str) -> None:
    """``data`` starts with the shared header of ``benchmark``."""
    assert set(data) >= HEADER, sorted(data)
    assert data["benchmark"] == benchmark
    assert {"date", "torch", "torch_threads", "cpus", "load_average_end"} <= set(
        data["environment"]
    )


@pytest.fixture
def check_header() -> Callable[[dict[str, Any], str], None]:
    """``check_header(data, "results")``: ``data`` starts with the shared header."""
    return _check_header


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_script("replay.py", "--capacity", "15000")``: the script in a subprocess, its
    exit status and output returned unchecked (for the tests of bad arguments)."""
    return _script


@pytest.fixture
def run_benchmark() -> Callable[..., dict[str, Any]]:
    """``run_benchmark("losses.py", "--only", "qmix", ...)``: the script in a subprocess, its
    exit status checked (stderr in the failure), its one JSON object returned, its header
    checked (``benchmark`` is the script's name)."""

    def run(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
        out = _script(script, *args, timeout=timeout)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        _check_header(data, script.removesuffix(".py"))
        return data

    return run
