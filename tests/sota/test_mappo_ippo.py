"""What is MAPPO's own in ``sota-implementations/mappo_ippo`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

import pytest

import marlkit
from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import ALGORITHMS, run, summary

BUDGET = ALGORITHMS["mappo_ippo"].budget


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


@pytest.mark.slow
def test_compiled_loss_trains_like_the_eager_one(tmp_path):
    one = (*BUDGET, "collector.total_frames=400", "eval.video=false")
    run("mappo_ippo", tmp_path / "eager", one)
    run("mappo_ippo", tmp_path / "run", (*one, "train.compile=true"))
    eager, compiled = (read_metrics(tmp_path / n / "metrics.csv")[-1] for n in ("eager", "run"))
    for term in ("loss_objective", "loss_critic", "grad_norm"):
        key = f"train/agents/{term}"
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), key


def test_a_minibatch_larger_than_the_batch_is_refused(tmp_path):
    # each epoch cuts the batch into minibatches: one larger than the batch is named
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


@pytest.mark.slow  # two short runs, ~30 s
def test_anneal_lr_falls_linearly_over_the_batches_and_goes_on_after_a_resume(tmp_path):
    """``train.anneal_lr`` (JaxMARL's ``ANNEAL_LR``): batch i of n at ``lr * (1 - i / n)``,
    logged as ``lr`` and set on the optimiser the checkpoint saves; a resumed run with a larger
    budget goes on from its collector's count, not from the start."""
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "train.lr=1e-3")
    run("mappo_ippo", run_dir, (*budget, "train.anneal_lr=true"))  # 2 batches of 400
    assert [row["lr"] for row in read_metrics(run_dir / "metrics.csv")] == [1e-3, 5e-4]
    resumed = (*budget, "train.anneal_lr=true", "collector.total_frames=1600", f"resume={run_dir}")
    run("mappo_ippo", run_dir, resumed)  # now 4 batches: the 3rd and 4th at 1/2 and 1/4
    assert [row["lr"] for row in read_metrics(run_dir / "metrics.csv")] == [
        1e-3,
        5e-4,
        5e-4,
        2.5e-4,
    ]
    optims = Checkpointer(run_dir / "checkpoints").load()["optims"]
    assert {g["lr"] for o in optims.values() for g in o["param_groups"]} == {2.5e-4}


def _mappo_module():
    import importlib.util

    from ._scripts import script

    spec = importlib.util.spec_from_file_location("_mappo_advantages", script("mappo_ippo"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_standardised_rewards_reach_gae_and_leave_the_batch_as_collected():
    """``loss.standardise_rewards`` (EPyMARL's): GAE reads ``(r - mean) / std`` of the
    rewards seen so far; the batch the run logs keeps the env's rewards."""
    import torch
    from omegaconf import OmegaConf

    from marlkit.objectives import GAE

    module = _mappo_module()
    torch.manual_seed(0)
    env = marlkit.make("navigation", num_envs=4, n_agents=3, seed=0)
    batch = env.rollout(20)
    raw = batch["next", "agents", "reward"].clone()
    assert raw.std() > 0  # navigation's shaped reward: something to standardise
    cells = {"centralised": True, "share_params": True, "depth": 1, "num_cells": 8}
    cells = OmegaConf.create(cells)
    model = OmegaConf.create({"memory": "none", "critic_memory": False, "kind": "mlp"})
    critic = module.make_critic(env, "agents", cells, model)
    gae = {"agents": GAE(0.99, 0.95, value_network=critic, group="agents")}
    on = OmegaConf.create({"loss": {"standardise_rewards": True}})
    off = OmegaConf.create({"loss": {"standardise_rewards": False}})
    assert module.reward_standardisers(["agents"], off) is None
    standardisers = module.reward_standardisers(["agents"], on)

    out = module.advantages(batch, gae, standardisers)
    assert torch.equal(batch["next", "agents", "reward"], raw)  # as collected
    expected = batch.clone()
    # EPyMARL's running moments after one batch of n rewards, from mean 0 and variance 1
    # weighted as eps = 1e-4 samples (which counts here: navigation's rewards are ~1e-3)
    n, eps, m = raw.numel(), 1e-4, raw.mean().double()
    mean = m * n / (n + eps)
    var = (eps + raw.double().var() * n + m**2 * eps * n / (n + eps)) / (n + eps)
    expected["next", "agents", "reward"] = ((raw - mean) / var.sqrt()).float()
    module.advantages(expected, gae, None)
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(
            out["agents", key], expected["agents", key], rtol=1e-4, atol=1e-5
        )
    stats = standardisers["agents"].stats
    assert float(stats.count) == pytest.approx(raw.numel() + 1e-4)  # every agent's reward
    # without standardisers GAE reads the rewards as they are: other advantages
    plain = module.advantages(batch.clone(), gae, None)
    assert not torch.allclose(plain["agents", "value_target"], out["agents", "value_target"])


@pytest.mark.slow  # two short runs, ~30 s
def test_standardised_rewards_resume_their_statistics(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "loss.standardise_rewards=true")
    run("mappo_ippo", run_dir, budget)  # 2 batches of 400 frames, 3 agents each
    count = Checkpointer(run_dir / "checkpoints").load()["reward_standardisers"]
    assert float(count["agents.stats.count"]) == pytest.approx(2 * 400 * 3 + 1e-4)
    run("mappo_ippo", run_dir, (*budget, "collector.total_frames=1200", f"resume={run_dir}"))
    count = Checkpointer(run_dir / "checkpoints").load()["reward_standardisers"]
    assert float(count["agents.stats.count"]) == pytest.approx(3 * 400 * 3 + 1e-4)  # went on
