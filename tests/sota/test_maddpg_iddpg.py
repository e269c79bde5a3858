"""What is MADDPG's own in ``sota-implementations/maddpg_iddpg`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

from ._scripts import ALGORITHMS, run, summary

BUDGET = ALGORITHMS["maddpg_iddpg"].budget


def test_iddpg_on_vmas_balance(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*BUDGET, "env=vmas/balance", "critic.centralised=false", "eval.video=false")
    run("maddpg_iddpg", run_dir, overrides)
    info = summary(run_dir)
    assert info["env"] == "vmas/balance" and info["variant"] == "IDDPG"
    assert "agents/episode_reward" in info["trained"]
