"""End-to-end runs of ``sota-implementations/mappo_ippo`` on tiny budgets (subprocesses)."""

from __future__ import annotations

import pytest

import marlkit
from marlkit.record import read_metrics, read_video

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
    "critic.num_cells=32",
    "eval.every=1",
)


def test_native_navigation_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    out = run("mappo_ippo", run_dir, BUDGET).stdout
    assert "iteration 2: frames 800" in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "frames",
        "frames_per_s",
        "collection_time",
        "training_time",
        "train/agents/loss_objective",
        "train/agents/loss_critic",
        "agents/episode_reward",
        "episode_length",
        "eval/agents/episode_reward",
    ):
        assert key in rows[-1], key
    assert rows[-1]["frames"] == 800
    assert rows[-1]["episode_length"] == 25
    info = summary(run_dir)
    assert info["frames"] == 800 and info["env"] == "navigation" and info["variant"] == "MAPPO"
    assert set(info["trained"]) == set(info["random"]) >= {"agents/episode_reward"}
    for name in ("rollout.mp4", "reward.png", "videos/eval-0001.mp4", "checkpoints/latest"):
        assert (run_dir / name).stat().st_size > 0, name
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last


def test_ippo_on_vmas(tmp_path):
    run_dir = tmp_path / "run"
    run("mappo_ippo", run_dir, (*BUDGET, "env=vmas/navigation", "critic.centralised=false"))
    info = summary(run_dir)
    assert info["env"] == "vmas/navigation" and info["variant"] == "IPPO"
    assert "agents/episode_reward" in info["trained"]


def test_a_registered_env_without_a_config_file_runs_from_the_command_line(tmp_path):
    """As docs/training.md says: replace the default env's keyword arguments, do not merge
    into them (Gymnasium's single-agent Pendulum, one group "agents" of one agent)."""
    run_dir = tmp_path / "run"
    env = (
        "env.name=gymnasium/Pendulum-v1",
        "~env.kwargs",
        "+env.kwargs={g: 9.81}",
        "+env.eval_kwargs.render_mode=rgb_array",
    )
    run("mappo_ippo", run_dir, (*BUDGET, *env))
    assert list((run_dir / "videos").glob("*.mp4"))  # the evaluation filmed Pendulum
    info = summary(run_dir)
    assert info["env"] == "gymnasium/Pendulum-v1"
    assert info["random"]["agents/episode_reward"] < 0  # Pendulum's cost: always negative


def test_heterogeneous_groups_get_a_loss_each(tmp_path):
    run_dir = tmp_path / "run"
    run("mappo_ippo", run_dir, (*BUDGET, "env=predator_prey", "eval.video=false"))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for group in ("predator", "prey"):
        assert f"train/{group}/loss_objective" in last
        assert f"eval/{group}/episode_reward" in last


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["multisync", "ray"])
def test_multiprocess_and_ray_collectors(tmp_path, collector):
    run_dir = tmp_path / "run"
    run("mappo_ippo", run_dir, (*BUDGET, f"collector={collector}", "eval.video=false"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["frames"] for r in rows] == [400, 800]


@pytest.mark.slow
def test_compiled_loss_trains_like_the_eager_one(tmp_path):
    one = (*BUDGET, "collector.total_frames=400", "eval.video=false")
    run("mappo_ippo", tmp_path / "eager", one)
    run("mappo_ippo", tmp_path / "run", (*one, "train.compile=true"))
    eager, compiled = (read_metrics(tmp_path / n / "metrics.csv")[-1] for n in ("eager", "run"))
    for term in ("loss_objective", "loss_critic", "grad_norm"):
        key = f"train/agents/{term}"
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), key


def test_killed_run_resumes_to_the_same_frames_with_one_metrics_file(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        *BUDGET,
        "collector.total_frames=2000",  # five iterations
        "checkpoint.every=1",
        "eval.every=0",
        "eval.video=false",
    )
    kill_after("mappo_ippo", run_dir, budget, "iteration 3:")
    before = read_metrics(run_dir / "metrics.csv")
    assert 3 <= len(before) < 5
    run("mappo_ippo", run_dir, (*budget, f"resume={run_dir}"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["frames"] for r in rows] == [400, 800, 1200, 1600, 2000]
    assert rows[:3] == before[:3]  # the rows before the checkpoint are kept as they were
    assert summary(run_dir)["frames"] == 2000


def test_a_finished_run_resumes_to_its_summary(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.video=false")  # evaluations at iterations 1 and 2
    run("mappo_ippo", run_dir, budget)
    first = summary(run_dir)
    out = run("mappo_ippo", run_dir, (*budget, f"resume={run_dir}")).stdout
    assert "iteration" not in out
    assert len(read_metrics(run_dir / "metrics.csv")) == 2
    # the evaluation env is seeded before each evaluation: the resumed run's first evaluation
    # of the same policy plays the episodes of the first run's last one
    again = summary(run_dir)
    assert again["trained"] == first["trained"] and again["random"] == first["random"]
    # Hydra's copy of the first run's config is kept; the resumed run's goes next to it
    assert "resume=" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    (resumed,) = run_dir.glob(".hydra-resumed-*")
    assert f"resume={run_dir}" in (resumed / "overrides.yaml").read_text()


def test_unknown_env_is_named(tmp_path):
    with pytest.raises(AssertionError, match=r"no env registered as .no_such_env."):
        run("mappo_ippo", tmp_path / "run", (*BUDGET, "env.name=no_such_env"))


def test_a_minibatch_larger_than_the_batch_is_refused(tmp_path):
    # It trained on one minibatch of the whole batch per epoch, without a word.
    with pytest.raises(AssertionError, match=r"train.minibatch_size \(1000\) is larger than"):
        run("mappo_ippo", tmp_path / "run", (*BUDGET, "train.minibatch_size=1000"))


def test_uniform_action_bounds_reach_tanh_normal_as_numbers() -> None:
    import importlib.util

    from omegaconf import OmegaConf

    from ._scripts import script

    spec = importlib.util.spec_from_file_location("_mappo_bounds", script("mappo_ippo"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = marlkit.make("navigation", num_envs=2, n_agents=3)
    cfg = OmegaConf.create({"share_params": True, "depth": 1, "num_cells": 8})
    actor = module.make_actor(env, "agents", cfg)
    assert actor.module[-1].distribution_kwargs == {"low": -1.0, "high": 1.0}
