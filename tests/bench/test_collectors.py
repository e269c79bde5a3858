"""benchmarks/collectors.py's two-process sections run, and report the machine's ceilings beside
their ratios (tiny budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


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
