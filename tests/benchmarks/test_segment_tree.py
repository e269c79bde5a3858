"""benchmarks/segment_tree.py: the native segment trees against torch (a tiny tree)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_benchmark_script_prints_one_json_object(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--capacity", "3000", "--batch", "64", "--repeats", "2", "--rounds", "1"]
    record = run_benchmark("segment_tree.py", *args, "--torch-threads", "1", "--threads", "1")
    assert record["torch_threads"] == [1] and record["settings"]["threads"] == 1
    assert set(record["results"]) == {"native", "torch[threads=1]", "torch_twin[threads=1]"}
    for metric in ("updates_per_s", "samples_per_s", "cycles_per_s"):
        assert record["results"]["native"][metric] > 0
        assert record["ratios"]["native_over_torch"][metric] > 0
