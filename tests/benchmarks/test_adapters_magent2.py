"""benchmarks/adapters_magent2.py: magent2/battle_v4 against MAgent2's raw loop (a tiny map)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_benchmark_script_prints_one_json_object(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--map-size", "16", "--rounds", "1", "--round-seconds", "0", "--min-steps", "2"]
    record = run_benchmark("adapters_magent2.py", *args, "--threads", "1")
    battle = record["battle"]
    assert set(battle["work"]) == {"raw", "adapter"}
    cell = battle["map_size=16"]
    assert cell["agents"] == 12
    for side in ("adapter", "adapter_with_state"):
        assert cell[f"{side}_steps_per_s"] > 0 and cell[f"{side}_raw_steps_per_s"] > 0
        assert cell[f"{side}_ratio"] > 0 and len(cell[f"{side}_ratio_rounds"]) == 1
        assert 0 < cell[f"{side}_time_in_simulator_fraction"] <= 1
