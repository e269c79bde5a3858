"""benchmarks/threads.py runs, prints one JSON object, and leaves the thread settings as found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Run = Callable[..., dict[str, Any]]


def test_threads_benchmark_prints_json(run_benchmark: Run) -> None:
    data = run_benchmark(
        "threads.py", "--cells", "64x4,16x16", "--rounds", "2", "--round-seconds", "0.02"
    )
    assert data["benchmark"] == "threads"
    assert data["default_min_work_per_thread"] == 262144
    assert [(c["envs"], c["agents"]) for c in data["cells"]] == [(64, 4), (16, 16)]
    for cell in data["cells"]:
        for side in ("one_thread", "two_threads", "two_threads_small_grain"):
            assert cell[f"{side}_ms"] > 0
        assert len(cell["two_threads_speedup_rounds"]) == 2
        assert cell["work"]["work"] == "lidar"
