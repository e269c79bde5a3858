"""benchmarks/env_step.py: native navigation against VMAS navigation, like for like, through
the shared cells and rounds of marlkit.bench (tiny cells)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest

Run = Callable[..., dict[str, Any]]
TIMING = ("--rounds", "2", "--round-seconds", "0", "--min-steps", "2", "--warmup", "1")


def test_env_step_benchmark_uses_the_shared_harness(run_benchmark: Run) -> None:
    data = run_benchmark("env_step.py", *TIMING, "--threads", "1", "--cells", "4x3", "--no-vmas")
    (row,) = data["results"]
    assert row["native"]["steps"] == 4 and row["native"]["kernel"] == "native"
    assert len(row["native"]["rounds_steps_per_s"]) == 2
    assert row["native"]["work"]["work"] == "lidar" and row["native_knn"]["work"]["work"] == "knn"
    assert row["native"]["work"]["observation_size"] == 18
    assert "different work" in row["native_knn"]["work"]["label"]
    assert data["environment"]["torch_threads"] == 1 and data["targets"] == []
    assert data["settings"]["cells"] == "4x3"


def test_env_step_benchmark_compares_like_for_like_with_vmas(run_benchmark: Run) -> None:
    args = ("--threads", "1", "--cells", "4x3", "--vmas-extras")
    data = run_benchmark("env_step.py", *TIMING, *args)
    (row,) = data["results"]
    native, vmas = row["native"], row["vmas"]
    assert native["work"]["sensor"] == {
        **vmas["work"]["sensor"],
        "cost": native["work"]["sensor"]["cost"],
    }
    ratio = statistics.median(
        a / b for a, b in zip(native["rounds_steps_per_s"], vmas["rounds_steps_per_s"])
    )
    assert row["native_over_vmas"] == pytest.approx(ratio)
    assert row["native_knn_over_vmas"] > 0 and "different work" in row["native_knn_note"]
    assert "vmas_rotation_share_of_step" in row and row["native_over_vmas_no_rotation"] > 0
    assert [t["cell"] for t in data["targets"]] == ["1024x4", "64x64"]
    assert all(t["value"] is None for t in data["targets"])  # neither cell was run
