"""benchmarks/precision.py: bf16 against fp32 on the recipes' gradient steps and on whole
training runs, one JSON object (tiny budgets)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest

TINY = (
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "train.epochs=1",
    "train.minibatch_size=200",
    "eval.num_envs=2",
)


def test_the_step_section_times_both_precisions(run_benchmark: Callable[..., Any]) -> None:
    out = run_benchmark("precision.py", "--only", "step", "--rounds", "1", "--round-seconds", "0")
    step = out["step"]
    for recipe in ("mappo", "mappo_fast", "qmix"):
        result = step[recipe]
        assert result["bf16_ran_as"] == ("bf16" if step["bf16_hardware"] else "fp32")
        assert result["fp32_ms"] > 0 and result["bf16_ms"] > 0
        assert result["ratio_bf16_over_fp32"] > 0 and len(result["ratio_rounds"]) == 1
        # the two sides compute the same losses, within bf16's rounding
        assert all(d < 0.05 for d in result["loss_terms_relative_difference"].values())
    assert "torchrl_fp32_ms" not in step["mappo"]  # no --torchrl-python: no peer


@pytest.mark.slow  # four script runs: about 60 s on 2 loaded cores
def test_the_runs_section_pairs_seeds_of_both_precisions(
    tmp_path: pathlib.Path, run_benchmark: Callable[..., Any]
) -> None:
    args = ["--only", "runs", "--experiments", "mappo-native", "--seeds", "0,1"]
    out = run_benchmark(
        "precision.py", *args, "--out", str(tmp_path), *(f"--override={o}" for o in TINY)
    )
    exp = out["runs"]["mappo-native"]
    for side in ("fp32", "bf16"):
        assert [r["seed"] for r in exp[side]["runs"]] == [0, 1]
        assert all(f"train.precision={side}" in r["command"] for r in exp[side]["runs"])
        final = exp[side]["final"]
        assert final["low"] <= final["mean"] <= final["high"]
    assert len(exp["ratio_bf16_over_fp32_seconds_per_seed"]) == 2
    assert isinstance(exp["intervals_overlap"], bool) and isinstance(exp["target_met"], bool)


def test_an_unknown_experiment_is_named(run_script: Callable[..., Any]) -> None:
    out = run_script("precision.py", "--only", "runs", "--experiments", "mappo-vmass")
    assert out.returncode != 0
    assert "unknown experiment 'mappo-vmass'" in out.stderr
