"""benchmarks/adapters.py: every adapter against its raw simulator loop (tiny budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.slow
def test_adapters_benchmark_prints_every_section(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--round-seconds", "0", "--min-steps", "2", "--warmup", "1", "--rounds", "2"]
    data = run_benchmark("adapters.py", *args)
    assert data["vmas"]["step"]["ratio"] > 0 and data["vmas"]["rollout"]["ratio"] > 0
    for n in ("N=3", "N=10"):
        assert data["pettingzoo"][n]["adapter_ratio"] > 0
        assert data["pettingzoo"][n]["adapter_pairs"] == 2
    mujoco = data["mujoco"]
    assert len(mujoco["speedup_rounds"]) == 2 and mujoco["speedup"] > 0
    assert mujoco["num_envs"] == 64 and mujoco["target_speedup"] == 1.5
    for family in ("lbforaging", "rware"):  # EPyMARL's format, against raw Gymnasium loops
        for num_envs in (1, 16):
            entry = data[family][f"num_envs={num_envs}"]
            assert entry["pairs"] == 2 and entry["ratio"] > 0 and entry["cpu_ratio"] > 0
            assert 0 < entry["adapter_time_in_simulator_fraction"] <= 1
        assert data[family]["target"] == 0.85
    for game in ("tic_tac_toe", "goofspiel"):  # shimmy's AEC games, against PettingZoo's loop
        for num_envs in (1, 16):
            entry = data["openspiel"][game][f"num_envs={num_envs}"]
            assert entry["ratio"] > 0 and len(entry["ratio_rounds"]) == 2
            assert entry["raw_env_steps_per_s"] > 0 and entry["adapter_env_steps_per_s"] > 0
            assert 0 < entry["adapter_time_in_simulator_fraction"] <= 1
    assert set(data["openspiel"]["work"]) == {"raw", "adapter"}
    coins = data["meltingpot"]["coins"]  # a MeltingPot substrate against its own loop
    assert coins["players"] == 2 and coins["ratio"] > 0 and len(coins["ratio_rounds"]) == 2
    assert 0 < coins["adapter_time_in_simulator_fraction"] <= 1
