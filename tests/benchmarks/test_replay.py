"""benchmarks/replay.py runs every section and prints one JSON object (a small buffer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Run = Callable[..., dict[str, Any]]


def test_every_section_prints_json(run_benchmark: Run) -> None:
    args = ("--capacity", "20000", "--rounds", "2", "--round-seconds", "0.02")
    data = run_benchmark("replay.py", *args)
    assert data["benchmark"] == "replay"
    prioritized = data["prioritized"]
    assert prioritized["capacity"] == 20000
    assert len(prioritized["rounds"]) == 2
    assert prioritized["native_iterations_per_s"] > 0 and prioritized["torch_iterations_per_s"] > 0
    for side in ("native_extend", "torch_extend"):
        assert set(prioritized[side]) == {
            "extend_first_fill_items_per_s",
            "extend_refill_items_per_s",
        }
    assert data["uniform"]["samples_per_s"] > 0
    assert data["gather"]["rows"] == 20000 and data["gather"]["native_over_torch"] > 0
    assert data["memory"]["items"] == 20000 and data["memory"]["raw_bytes"] == 20000 * 37 * 4


def test_checksum_section_prints_json(run_benchmark: Run) -> None:
    args = ("--only", "checksum", "--capacity", "20000", "--rounds", "2")
    data = run_benchmark("replay.py", *args)
    checksum = data["checksum"]
    assert checksum["items"] == 20000 and checksum["checkpoint_bytes"] > 20000 * 37 * 4
    assert len(checksum["rounds"]["checksum_share_of_dumps"]) == 2
    assert checksum["dumps_s"] > 0 and checksum["verify_share_of_loads"] > 0
    assert set(data) & {"memory", "prioritized", "uniform", "gather"} == set()


def test_a_capacity_that_is_not_whole_chunks_is_refused(run_script: Callable[..., Any]) -> None:
    out = run_script("replay.py", "--capacity", "15000", timeout=60)
    assert out.returncode == 2
    assert "--capacity must be a positive multiple of 10000, got 15000" in out.stderr
