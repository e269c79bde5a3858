"""What is MADDPG's own in ``sota-implementations/maddpg_iddpg`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

from marlkit.record import read_metrics

from ._scripts import ALGORITHMS, run, summary

BUDGET = ALGORITHMS["maddpg_iddpg"].budget


def test_iddpg_on_vmas_balance(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*BUDGET, "env=vmas/balance", "critic.centralised=false", "eval.video=false")
    run("maddpg_iddpg", run_dir, overrides)
    info = summary(run_dir)
    assert info["env"] == "vmas/balance" and info["variant"] == "IDDPG"
    assert "agents/episode_reward" in info["trained"]


def test_the_options_against_saturation_reach_the_loss(tmp_path):
    """loss.actor_preact_penalty makes the actor write its pre-tanh output and the loss log
    the penalty; target smoothing and the delayed actor run with it (issue 37)."""
    run_dir = tmp_path / "run"
    options = (
        "loss.actor_preact_penalty=0.01",
        "loss.target_policy_noise=0.2",
        "loss.target_noise_clip=0.5",
        "loss.actor_delay=2",
    )
    run("maddpg_iddpg", run_dir, (*BUDGET, "eval.every=0", *options))
    rows = read_metrics(run_dir / "metrics.csv")
    assert all(r["train/agents/preact_abs"] > 0 for r in rows)
    assert all(r["train/agents/loss_preact"] > 0 for r in rows)
    assert summary(run_dir)["variant"] == "MADDPG"
