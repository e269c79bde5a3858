"""End-to-end runs of ``sota-implementations/iql`` on tiny budgets (subprocesses)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics, read_video
from marlkit.train import Checkpointer

from ._scripts import kill_after, run, summary

#: Two iterations of 8 envs x 25 steps, two short epochs.
BUDGET = (
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "train.epochs=2",
    "train.minibatch_size=200",
    "policy.num_cells=32",
    "eval.every=1",
)


def test_native_navigation_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    out = run("iql", run_dir, BUDGET).stdout
    assert "iteration 2: frames 800" in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "frames",
        "frames_per_s",
        "collection_time",
        "training_time",
        "eps",
        "replay/agents/size",
        "train/agents/loss",
        "train/agents/q_value",
        "train/agents/target_value",
        "train/agents/grad_norm",
        "agents/episode_reward",
        "episode_length",
        "eval/agents/episode_reward",
    ):
        assert key in rows[-1], key
    assert rows[-1]["frames"] == 800
    assert rows[-1]["episode_length"] == 25
    assert [r["replay/agents/size"] for r in rows] == [400, 400]
    assert rows[0]["eps"] == pytest.approx(0.3) and rows[1]["eps"] == pytest.approx(0.0, abs=1e-6)
    info = summary(run_dir)
    assert info["frames"] == 800 and info["env"] == "navigation" and info["variant"] == "IQL"
    assert set(info["trained"]) == set(info["random"]) >= {"agents/episode_reward"}
    for name in ("rollout.mp4", "reward.png", "videos/eval-0001.mp4", "checkpoints/latest"):
        assert (run_dir / name).stat().st_size > 0, name
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last
    latest = Checkpointer(run_dir / "checkpoints").latest()
    assert latest is not None and (latest / "replay" / "replay" / "agents" / "latest").exists()


def test_iql_on_mpe_simple_spread(tmp_path):
    run_dir = tmp_path / "run"
    # The env config's 8 envs x 25 steps (max_cycles 25): 200 frames a batch.
    budget = (*BUDGET, "collector.frames_per_batch=200", "collector.total_frames=400")
    run("iql", run_dir, (*budget, "env=pettingzoo/mpe2.simple_spread_v3", "eval.video=false"))
    info = summary(run_dir)
    assert info["env"] == "pettingzoo/mpe2.simple_spread_v3" and info["frames"] == 400
    assert "agents/episode_reward" in info["trained"]


def test_heterogeneous_groups_get_a_loss_each(tmp_path):
    run_dir = tmp_path / "run"
    run("iql", run_dir, (*BUDGET, "env=predator_prey", "eval.video=false"))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for group in ("predator", "prey"):
        assert f"train/{group}/loss" in last
        assert last[f"replay/{group}/size"] == 400
        assert f"eval/{group}/episode_reward" in last


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["multisync", "ray"])
def test_multiprocess_and_ray_collectors(tmp_path, collector):
    run_dir = tmp_path / "run"
    run("iql", run_dir, (*BUDGET, f"collector={collector}", "eval.video=false"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["frames"] for r in rows] == [400, 800]


def test_an_annealing_fraction_of_0_drops_eps_at_once(tmp_path):
    run_dir = tmp_path / "run"  # EGreedy refused 0 steps, naming its own argument
    run("iql", run_dir, (*BUDGET, "exploration.annealing_fraction=0", "eval.video=false"))
    assert read_metrics(run_dir / "metrics.csv")[-1]["eps"] == 0.0


def test_killed_run_resumes_with_its_replay_buffer_and_epsilon(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        *BUDGET,
        "collector.total_frames=2000",  # five iterations; eps 0.3 -> 0 over the first 1000
        "buffer.capacity=800",  # two batches: a fresh buffer would hold 400 after one
        "checkpoint.every=1",
        "eval.every=0",
        "eval.video=false",
    )
    kill_after("iql", run_dir, budget, "iteration 3:")
    before = read_metrics(run_dir / "metrics.csv")
    assert 3 <= len(before) < 5
    run("iql", run_dir, (*budget, f"resume={run_dir}"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["frames"] for r in rows] == [400, 800, 1200, 1600, 2000]
    assert rows[:3] == before[:3]  # the rows before the checkpoint are kept as they were
    assert [r["replay/agents/size"] for r in rows] == [400, 800, 800, 800, 800]
    eps = [r["eps"] for r in rows]
    assert eps == pytest.approx([0.3, 0.18, 0.06, 0.0, 0.0], abs=1e-6)
    assert summary(run_dir)["frames"] == 2000


def test_continuous_actions_are_refused(tmp_path):
    message = (
        r"discrete actions are needed.*Bounded actions \(continuous_actions=True in its keyword"
    )
    with pytest.raises(AssertionError, match=message):
        run("iql", tmp_path / "run", (*BUDGET, "+env.kwargs.continuous_actions=true"))
