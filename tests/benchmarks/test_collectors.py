"""benchmarks/collectors.py: every section runs (tiny budget); the two-process sections report
the machine's ceilings beside their ratios."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Run = Callable[..., dict[str, Any]]


@pytest.mark.parametrize(
    ("section", "ratio_key", "ceilings"),
    [
        ("parallel_env", "parallel_over_serial", ("machine_ceiling", "lockstep_ceiling")),
        ("multisync", "multisync_over_collector", ("machine_ceiling",)),
    ],
)
def test_section_reports_ratio_and_ceilings(
    run_benchmark: Callable[..., dict[str, Any]],
    section: str,
    ratio_key: str,
    ceilings: tuple[str, ...],
) -> None:
    # Workers fork from the benchmark's process, which imported torch and marlkit already (the
    # default, spawn, spends seconds importing them again in each worker)
    args = ("--only", section, "--rounds", "1", "--round-seconds", "0.01", "--mpe-steps", "2")
    data = run_benchmark("collectors.py", *args, "--start-method", "fork")[section]
    assert data["start_method"] == "fork"
    ratio = data[ratio_key]
    assert ratio > 0 and data["rounds"] == [ratio]
    for name in ceilings:
        (ceiling,) = data[f"{name}_rounds"]
        assert data[name] == ceiling > 0
        assert data[f"share_of_{name}"] == pytest.approx(ratio / ceiling)
    if "lockstep_ceiling" not in ceilings:
        assert "lockstep_ceiling" not in data
    assert "no marlkit" in data["ceiling_work"]


def test_single_section_splits_the_policy_time(run_benchmark: Run) -> None:
    args = ("--only", "single", "--rounds", "1", "--steps", "1", "--pairs", "2")
    data = run_benchmark("collectors.py", *args)["single"]
    assert data["pairs"] == 2 and data["frames_per_batch"] == 1024
    assert data["collector_frames_per_s"] > 0 and data["bare_loop_frames_per_s"] > 0
    assert 0 < data["mlp_policy"]["policy_share"] < 1


def test_buffer_section_times_the_extend_alone(run_benchmark: Run) -> None:
    args = ("--only", "buffer", "--rounds", "1", "--round-seconds", "0", "--start-method", "fork")
    data = run_benchmark("collectors.py", *args)["buffer"]
    assert len(data["rounds"]) == 1 and data["with_over_without_batches_per_s"] > 0
    assert data["extend_s"] > 0 and data["extend_share_of_batch"] > 0
