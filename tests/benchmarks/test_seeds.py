"""benchmarks/seeds.py: seeds_in_process against sequential and parallel runs of the same
seeds, one JSON object (a tiny budget, K = 2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

TINY = (
    "--seeds-in-process=2",
    "--num-envs=2",
    "--frames-per-batch=100",
    "--batches=1",
    "--epochs=1",
    "--minibatch-size=50",
    "--eval-envs=2",
)


@pytest.mark.slow  # five script processes: about 70 s on 2 loaded cores
@pytest.mark.parametrize("section", ["mpe", "qmix_mpe"])
def test_the_three_sides_train_the_same_seeds(
    run_benchmark: Callable[..., Any], section: str
) -> None:
    out = run_benchmark("seeds.py", "--only", section, "--rounds", "1", *TINY, timeout=600)
    mpe = out[section]
    assert mpe["seeds"] == [0, 2]  # 2 Python envs per run take seeds 0-1: the next run's is 2
    assert set(mpe["seconds"]) == {"stacked", "sequential", "parallel"}
    assert all(len(v) == 1 and v[0] > 0 for v in mpe["seconds"].values())
    assert mpe["speedup_over_faster"] == min(
        mpe["ratio_sequential_over_stacked"], mpe["ratio_parallel_over_stacked"]
    )
    assert isinstance(mpe["target_met"], bool)
    # a seed inside the stack trains as it does alone: the same final evaluation
    rewards = mpe["final_reward"]
    assert rewards["stacked"] == pytest.approx(rewards["sequential"], abs=1e-3)
    assert rewards["sequential"] == rewards["parallel"]


def test_one_seed_is_refused(run_script: Callable[..., Any]) -> None:
    out = run_script("seeds.py", "--seeds-in-process", "1")
    assert out.returncode != 0
    assert "--seeds-in-process must be at least 2, got 1" in out.stderr
