"""End-to-end runs of ``sota-implementations/maddpg_iddpg`` on tiny budgets (subprocesses)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics, read_video

from ._scripts import kill_after, run, summary

#: Two iterations of 8 envs x 25 steps (the first one random), a few small updates each.
BUDGET = (
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "collector.init_random_frames=400",
    "exploration.annealing_fraction=1.0",
    "buffer.size=4000",
    "train.num_updates=4",
    "train.minibatch_size=64",
    "policy.num_cells=32",
    "critic.num_cells=32",
    "eval.every=1",
)


def test_native_navigation_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    out = run("maddpg_iddpg", run_dir, BUDGET).stdout
    assert "iteration 2: frames 800" in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "frames",
        "frames_per_s",
        "collection_time",
        "training_time",
        "train/agents/loss_actor",
        "train/agents/loss_value",
        "train/agents/q_value",
        "train/agents/grad_norm",
        "train/agents/sigma",
        "replay/agents/size",
        "agents/episode_reward",
        "episode_length",
        "eval/agents/episode_reward",
    ):
        assert key in rows[-1], key
    assert [r["replay/agents/size"] for r in rows] == [400, 800]
    assert [r["train/agents/sigma"] for r in rows] == pytest.approx([1.0, 0.55])
    assert rows[-1]["frames"] == 800
    assert rows[-1]["episode_length"] == 25
    info = summary(run_dir)
    assert info["frames"] == 800 and info["env"] == "navigation"
    assert info["variant"] == "MADDPG"
    assert set(info["trained"]) == set(info["random"]) >= {"agents/episode_reward"}
    for name in ("rollout.mp4", "reward.png", "videos/eval-0001.mp4", "checkpoints/latest"):
        assert (run_dir / name).stat().st_size > 0, name
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last


def test_iddpg_on_vmas_balance(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*BUDGET, "env=vmas/balance", "critic.centralised=false", "eval.video=false")
    run("maddpg_iddpg", run_dir, overrides)
    info = summary(run_dir)
    assert info["env"] == "vmas/balance" and info["variant"] == "IDDPG"
    assert "agents/episode_reward" in info["trained"]


def test_heterogeneous_groups_get_a_loss_and_a_buffer_each(tmp_path):
    run_dir = tmp_path / "run"
    run("maddpg_iddpg", run_dir, (*BUDGET, "env=predator_prey", "eval.video=false"))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for group in ("predator", "prey"):
        assert f"train/{group}/loss_actor" in last
        assert f"train/{group}/loss_value" in last
        assert last[f"replay/{group}/size"] == 800
        assert f"eval/{group}/episode_reward" in last


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["multisync", "ray"])
def test_multiprocess_and_ray_collectors(tmp_path, collector):
    run_dir = tmp_path / "run"
    run("maddpg_iddpg", run_dir, (*BUDGET, f"collector={collector}", "eval.video=false"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["frames"] for r in rows] == [400, 800]
    assert [r["replay/agents/size"] for r in rows] == [400, 800]


def test_killed_run_resumes_with_its_replay_buffer_and_noise(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        *BUDGET,
        "collector.total_frames=2000",  # five iterations
        "exploration.annealing_fraction=2.0",  # 4000 frames: sigma 1.0, 0.91, 0.82, ...
        "checkpoint.every=1",
        "eval.every=0",
        "eval.video=false",
    )
    kill_after("maddpg_iddpg", run_dir, budget, "iteration 3:")
    before = read_metrics(run_dir / "metrics.csv")
    assert 3 <= len(before) < 5
    run("maddpg_iddpg", run_dir, (*budget, f"resume={run_dir}"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["frames"] for r in rows] == [400, 800, 1200, 1600, 2000]
    # The buffer and the noise come back: the resumed iterations go on from the saved ones.
    assert [r["replay/agents/size"] for r in rows] == [400, 800, 1200, 1600, 2000]
    assert [r["train/agents/sigma"] for r in rows] == pytest.approx([1.0, 0.91, 0.82, 0.73, 0.64])
    assert rows[:3] == before[:3]  # the rows before the checkpoint are kept as they were
    assert summary(run_dir)["frames"] == 2000


def test_a_finished_run_resumes_to_its_summary(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false")
    run("maddpg_iddpg", run_dir, budget)
    out = run("maddpg_iddpg", run_dir, (*budget, f"resume={run_dir}")).stdout
    assert "iteration" not in out
    assert len(read_metrics(run_dir / "metrics.csv")) == 2


def test_discrete_actions_are_refused(tmp_path):
    overrides = (*BUDGET, "+env.kwargs.continuous_actions=false")
    with pytest.raises(
        AssertionError,
        match=r"continuous actions are needed.* has Categorical actions \(continuous_actions=False",
    ):
        run("maddpg_iddpg", tmp_path / "run", overrides)
