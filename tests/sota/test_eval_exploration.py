"""``eval.exploration`` of the training scripts: ``both`` evaluates the policy's greedy and
sampled actions, logs each, and reports each in ``summary.json`` and the last lines."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics

from . import test_mappo_ippo
from ._scripts import run, summary


def test_both_reports_the_greedy_and_the_sampled_policy(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*test_mappo_ippo.BUDGET, "eval.video=false", "eval.exploration=both")
    out = run("mappo_ippo", run_dir, budget).stdout
    info = summary(run_dir)
    assert info["exploration"] == "both"
    assert set(info["trained_random"]) == set(info["trained"]) == set(info["random"])
    assert set(info["improvement_random"]) == {"agents/episode_reward"}
    last = read_metrics(run_dir / "metrics.csv")[-1]
    sampled = {k.removeprefix("eval_random/"): v for k, v in last.items() if "eval_random/" in k}
    assert sampled == info["trained_random"]
    assert out.splitlines()[-2].startswith("sampling its actions: {")


def test_an_unknown_mode_is_refused_before_collecting(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(AssertionError, match=r"exploration must be one of \['deterministic'"):
        run("mappo_ippo", run_dir, (*test_mappo_ippo.BUDGET, "eval.exploration=greedy"))
    assert not (run_dir / "metrics.csv").exists()
