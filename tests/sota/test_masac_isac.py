"""What is MASAC's own in ``sota-implementations/masac_isac`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

from marlkit.record import read_metrics, read_video

from ._scripts import ALGORITHMS, finished, run, summary

BUDGET = ALGORITHMS["masac_isac"].budget


def test_the_temperature_is_learned(tmp_path_factory):
    rows = read_metrics(finished("masac_isac", tmp_path_factory).run_dir / "metrics.csv")
    assert rows[-1]["train/agents/alpha"] < rows[0]["train/agents/alpha"] < 0.1


def test_isac_on_vmas_balance(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*BUDGET, "env=vmas/balance", "critic.centralised=false", "eval.video=false")
    run("masac_isac", run_dir, overrides)
    info = summary(run_dir)
    assert info["env"] == "vmas/balance" and info["variant"] == "ISAC"
    assert "agents/episode_reward" in info["trained"]


def test_mujoco_ant(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*BUDGET, "env=mujoco/ant_2x4", "env.num_envs=4", "collector.frames_per_batch=100")
    overrides = (*overrides, "collector.init_random_frames=100")
    run("masac_isac", run_dir, (*overrides, "collector.total_frames=200", "eval.every=0"))
    info = summary(run_dir)
    assert info["env"] == "mujoco/ant_2x4" and info["frames"] == 200
    assert "agents/episode_reward" in info["trained"]
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27
