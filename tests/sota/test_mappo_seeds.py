"""``seeds_in_process=K`` of the MAPPO/IPPO script: a seed inside a stack takes the updates it
takes alone; each seed's folder is a run folder of its own, and the stack resumes."""

from __future__ import annotations

import pathlib

import pytest
import torch

from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import run, summary

#: One batch of 4 MPE envs x 50 steps, 64-unit networks, 2 epochs of 2 minibatches.
MPE = (
    "env=pettingzoo/mpe2.simple_spread_v3",
    "env.num_envs=4",
    "policy.num_cells=64",
    "critic.num_cells=64",
    "policy.share_params=false",  # per-agent actors: the stacked layers' per-agent layout
    "collector.frames_per_batch=200",
    "collector.total_frames=200",
    "train.epochs=2",
    "train.minibatch_size=100",
    "eval.video=false",
)


def policy_of(run_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    return Checkpointer(run_dir / "checkpoints").load()["policy"]


def assert_same_first_updates(alone: pathlib.Path, inside: pathlib.Path) -> None:
    a, b = policy_of(alone), policy_of(inside)
    assert a.keys() == b.keys()
    for name in a:  # after 4 Adam steps of lr 3e-4, equal to float rounding
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=1e-4, msg=name)
    first, own = read_metrics(alone / "metrics.csv")[0], read_metrics(inside / "metrics.csv")[0]
    for key in [k for k in first if k.startswith("train/") or k.endswith("episode_reward")]:
        assert own[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), key


def test_a_seed_alone_and_inside_a_stack_take_the_same_first_updates(tmp_path):
    run("mappo_ippo", tmp_path / "stack", (*MPE, "seeds_in_process=2"))
    # 4 Python envs take seeds 0-3: the second run's seed is 4, its envs 4-7
    seeds = sorted(p.name for p in (tmp_path / "stack").glob("seed_*"))
    assert seeds == ["seed_0", "seed_4"]
    run("mappo_ippo", tmp_path / "alone", (*MPE, "seed=4"))
    assert_same_first_updates(tmp_path / "alone", tmp_path / "stack" / "seed_4")
    # and another seed's networks are far from these (the comparison tells seeds apart)
    other, own = policy_of(tmp_path / "stack" / "seed_0"), policy_of(tmp_path / "alone")
    assert max(float((other[n] - own[n]).abs().max()) for n in own) > 0.05
    info = summary(tmp_path / "stack" / "seed_4")
    assert info["seeds_in_process"] == 2 and info["frames"] == 200
    assert Checkpointer(tmp_path / "stack" / "seed_4" / "checkpoints").load()["config"]["seed"] == 4


def test_a_continuous_seed_of_a_batched_env_takes_the_same_first_updates(tmp_path):
    """Native navigation: TanhNormal actions (drawn, and the entropy estimated, on each seed's
    stream), a batched simulator that takes one seed (the second run's seed is 1)."""
    budget = (*MPE[1:], "env=navigation")
    run("mappo_ippo", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    run("mappo_ippo", tmp_path / "alone", (*budget, "seed=1"))
    assert_same_first_updates(tmp_path / "alone", tmp_path / "stack" / "seed_1")


@pytest.mark.slow  # two runs, ~30 s
def test_standardised_rewards_keep_each_seeds_statistics_as_its_own_run(tmp_path):
    """``loss.standardise_rewards``: each seed's GAE reads its rewards on its own running
    scale (its first updates are its own run's), its logged returns stay the env's, and its
    checkpoint holds its statistics as its own run's would."""
    budget = (*MPE, "loss.standardise_rewards=true")
    run("mappo_ippo", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    run("mappo_ippo", tmp_path / "alone", (*budget, "seed=4"))
    alone, inside = tmp_path / "alone", tmp_path / "stack" / "seed_4"
    assert_same_first_updates(alone, inside)  # its episode_reward too: the env's
    a, b = (Checkpointer(d / "checkpoints").load()["reward_standardisers"] for d in (alone, inside))
    assert sorted(a) == sorted(b) == ["agents.stats.count", "agents.stats.mean", "agents.stats.var"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-7, msg=name)
    assert float(b["agents.stats.count"]) == pytest.approx(200 * 3 + 1e-4)  # 1 batch, 3 agents
    plain = read_metrics(tmp_path / "stack" / "seed_0" / "metrics.csv")[0]
    assert plain["agents/episode_reward"] < -1  # simple_spread's distances: the env's scale


@pytest.mark.slow  # two runs, ~30 s
def test_epymarls_estimator_keeps_each_seeds_target_critic_as_its_own_run(tmp_path):
    """``loss.estimator=nstep loss.target_critic_tau loss.refresh_advantage``: in a stack each
    seed's target critic is its slice of the stacked copy, soft-updated with the others; over
    two batches (the second reads the moved target) a seed takes its own run's updates, and its
    checkpoint holds its target as its own run's would."""
    budget = (
        *MPE,
        "collector.total_frames=400",
        "loss.estimator=nstep",
        "loss.target_critic_tau=0.1",
        "loss.refresh_advantage=true",
    )
    run("mappo_ippo", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    run("mappo_ippo", tmp_path / "alone", (*budget, "seed=4"))
    alone, inside = tmp_path / "alone", tmp_path / "stack" / "seed_4"
    assert_same_first_updates(alone, inside)
    own = Checkpointer(alone / "checkpoints").load()["target_critics"]
    params = Checkpointer(inside / "checkpoints").load()["seed"]["params"]["target_critic.agents"]
    assert len(params) == len(own) > 0
    for name, value in own.items():  # the solo run's ModuleDict names its entries by group
        torch.testing.assert_close(params[name.removeprefix("agents.")], value, rtol=1e-4,
                                   atol=1e-5, msg=name)  # fmt: skip


def test_the_stack_resumes_every_seed(tmp_path):
    stack = tmp_path / "stack"
    run("mappo_ippo", stack, (*MPE, "seeds_in_process=2"))
    more = (*MPE, "seeds_in_process=2", "collector.total_frames=400", f"resume={stack}")
    run("mappo_ippo", stack, more)
    for seed in ("seed_0", "seed_4"):
        rows = read_metrics(stack / seed / "metrics.csv")
        assert [r["frames"] for r in rows] == [200, 400]
        state = Checkpointer(stack / seed / "checkpoints").load()
        assert state["iteration"] == 2
        steps = [s["step"] for s in state["seed"]["optims"]["agents"] if s]
        assert steps and all(float(s) == 8 for s in steps)  # 2 batches of 4 Adam steps


def test_seeds_in_process_below_one_is_refused(tmp_path):
    with pytest.raises(AssertionError, match="seeds_in_process must be an int >= 1, got 0"):
        run("mappo_ippo", tmp_path / "run", (*MPE, "seeds_in_process=0"))
