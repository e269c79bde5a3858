"""benchmarks/scaling.py: a thin front of `marlkit bench scaling` printing one JSON object."""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Callable
from typing import Any


def test_benchmark_script_prints_one_json_object(
    tmp_path: pathlib.Path,
    run_script: Callable[..., subprocess.CompletedProcess[str]],
    check_header: Callable[[dict[str, Any], str], None],
) -> None:
    args = ["--agents", "2", "--total-agents", "8", "--backends", "native", "--min-seconds", "0"]
    out = run_script("scaling.py", *args, "--threads", "1", "--no-plot", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    check_header(data, "scaling")
    assert data["cells"][0]["status"] == "ok" and data["cells"][0]["envs"] == 4
    assert data["settings"]["threads"] == 1
    assert "native agent-steps/s" in out.stderr  # the table went to stderr
    assert (tmp_path / "scaling.json").exists() and not (tmp_path / "scaling.png").exists()


def test_benchmark_script_sweeps_any_env(
    tmp_path: pathlib.Path,
    run_script: Callable[..., subprocess.CompletedProcess[str]],
    check_header: Callable[[dict[str, Any], str], None],
) -> None:
    args = ["--env", "swarm", "--param", "n_agents=4", "--min-seconds", "0", "--min-steps", "1"]
    out = run_script("scaling.py", *args, "--threads", "1", "--no-plot", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    check_header(data, "scaling")
    assert data["mode"] == "env" and data["sweeps"][0]["param"] == "n_agents"
    cell = data["cells"][0]
    assert (cell["status"], cell["agents"]) == ("ok", 4) and cell["peak_rss_mb"] > 0
    assert "computes" in data  # what each cell steps, in words
