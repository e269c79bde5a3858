"""What is IQL's own in ``sota-implementations/iql`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

from marlkit.record import read_metrics

from ._scripts import ALGORITHMS, run, summary

BUDGET = ALGORITHMS["iql"].budget


def test_iql_on_mpe_simple_spread(tmp_path):
    run_dir = tmp_path / "run"
    # The env config's 8 envs x 25 steps (max_cycles 25): 200 frames a batch.
    budget = (*BUDGET, "collector.frames_per_batch=200", "collector.total_frames=400")
    run("iql", run_dir, (*budget, "env=pettingzoo/mpe2.simple_spread_v3", "eval.video=false"))
    info = summary(run_dir)
    assert info["env"] == "pettingzoo/mpe2.simple_spread_v3" and info["frames"] == 400
    assert "agents/episode_reward" in info["trained"]


def test_an_annealing_fraction_of_0_drops_eps_at_once(tmp_path):
    run_dir = tmp_path / "run"  # eps is the final one from the first step, no annealing
    run("iql", run_dir, (*BUDGET, "exploration.annealing_fraction=0", "eval.video=false"))
    assert read_metrics(run_dir / "metrics.csv")[-1]["eps"] == 0.0
