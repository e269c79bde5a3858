"""``seeds_in_process=K`` of the Q-learning scripts (QMIX/VDN, IQL): a seed inside a stack takes
the updates it takes alone (its Q-network, QMIX's mixer and both targets); each seed's folder is
a run folder of its own, and the stack resumes with its seeds' buffers and exploration."""

from __future__ import annotations

import pathlib

import pytest
import torch

from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import run, summary

#: One batch of 4 MPE envs x 25 steps, 64-unit Q-networks, 2 epochs of 2 minibatches.
MPE = (
    "env=pettingzoo/mpe2.simple_spread_v3",
    "env.num_envs=4",
    "policy.num_cells=64",
    "policy.share_params=false",  # per-agent Q-networks: the stacked layers' per-agent layout
    "collector.frames_per_batch=100",
    "collector.total_frames=100",
    "train.epochs=2",
    "train.minibatch_size=50",
    "eval.video=false",
)


def checkpoint(run_dir: pathlib.Path) -> dict:
    return Checkpointer(run_dir / "checkpoints").load()


def mixer_of(run_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    """The online and target mixers' parameters of a run, in ``nn.Linear``'s layout: a run's
    own losses, or a stack's seed's share (``[1, in, out]`` slices of the stacked layers)."""
    state = checkpoint(run_dir)
    if "losses" in state:
        return {k[len("agents.") :]: v for k, v in state["losses"].items() if "mixer" in k}
    own = state["seed"]["params"]["agents"]
    return {
        k: v[0].t() if k.endswith("weight") else v.reshape(-1)
        for k, v in own.items()
        if "mixer" in k
    }


def assert_same_first_updates(alone: pathlib.Path, inside: pathlib.Path, mixer: bool) -> None:
    a, b = checkpoint(alone)["policy"], checkpoint(inside)["policy"]
    assert a.keys() == b.keys()
    for name in a:  # after 4 Adam steps of lr 3e-4 and soft target updates: float rounding
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=1e-4, msg=name)
    if mixer:
        ma, mb = mixer_of(alone), mixer_of(inside)
        assert ma.keys() == mb.keys() and any("target_mixer" in k for k in ma)
        for name in ma:
            torch.testing.assert_close(mb[name], ma[name], atol=1e-5, rtol=1e-4, msg=name)
    first, own = read_metrics(alone / "metrics.csv")[0], read_metrics(inside / "metrics.csv")[0]
    keys = [k for k in first if k.startswith(("train/", "replay/", "eps")) or "episode_reward" in k]
    assert any(k.startswith("train/") for k in keys)
    for key in keys:
        assert own[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), key


def test_a_qmix_seed_alone_and_inside_a_stack_take_the_same_first_updates(tmp_path):
    run("qmix_vdn", tmp_path / "stack", (*MPE, "seeds_in_process=2"))
    # 4 Python envs take seeds 0-3: the second run's seed is 4, its envs 4-7
    seeds = sorted(p.name for p in (tmp_path / "stack").glob("seed_*"))
    assert seeds == ["seed_0", "seed_4"]
    run("qmix_vdn", tmp_path / "alone", (*MPE, "seed=4"))
    assert_same_first_updates(tmp_path / "alone", tmp_path / "stack" / "seed_4", mixer=True)
    # and another seed's networks are far from these (the comparison tells seeds apart)
    other = checkpoint(tmp_path / "stack" / "seed_0")["policy"]
    own = checkpoint(tmp_path / "alone")["policy"]
    assert max(float((other[n].float() - own[n].float()).abs().max()) for n in own) > 0.05
    info = summary(tmp_path / "stack" / "seed_4")
    assert info["seeds_in_process"] == 2 and info["frames"] == 100 and info["variant"] == "QMIX"


def test_an_iql_seed_of_a_batched_env_takes_the_same_first_updates(tmp_path):
    """Native navigation: a batched simulator that takes one seed (the second run's is 1),
    its envs stepped together as one SerialEnv."""
    budget = (*MPE[1:], "env=navigation", "env.max_steps=25")
    run("iql", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    run("iql", tmp_path / "alone", (*budget, "seed=1"))
    assert_same_first_updates(tmp_path / "alone", tmp_path / "stack" / "seed_1", mixer=False)


def test_the_q_learning_stack_resumes_every_seed(tmp_path):
    stack = tmp_path / "stack"
    run("qmix_vdn", stack, (*MPE, "seeds_in_process=2"))
    more = (*MPE, "seeds_in_process=2", "collector.total_frames=200", f"resume={stack}")
    run("qmix_vdn", stack, more)
    for seed in ("seed_0", "seed_4"):
        rows = read_metrics(stack / seed / "metrics.csv")
        assert [r["frames"] for r in rows] == [100, 200]
        assert rows[1]["replay/agents/size"] == 100  # its buffer, restored, overwritten
        state = checkpoint(stack / seed)
        assert state["iteration"] == 2
        steps = [s["step"] for s in state["seed"]["optims"]["agents"] if s]
        assert steps and all(float(s) == 8 for s in steps)  # 2 batches of 4 Adam steps
        assert int(state["exploration"]["agents"]["steps_done"]) == 200  # its own frames


def test_a_config_the_stack_cannot_run_is_refused_by_its_key(tmp_path):
    with pytest.raises(AssertionError, match=r"does not support model\.memory=gru"):
        run("iql", tmp_path / "run", (*MPE, "seeds_in_process=2", "model.memory=gru"))


@pytest.mark.slow  # two runs and a resumption, ~40 s
def test_standardised_rewards_keep_each_seeds_statistics_as_its_own_run(tmp_path):
    """``loss.standardise_rewards`` in a stack: each seed's rewards on its own running scale,
    so a seed's first updates, its logged scale and its saved statistics are its own run's;
    the statistics resume."""
    budget = (*MPE, "loss.standardise_rewards=true")
    run("qmix_vdn", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    run("qmix_vdn", tmp_path / "alone", (*budget, "seed=4"))
    alone, inside = tmp_path / "alone", tmp_path / "stack" / "seed_4"
    assert_same_first_updates(alone, inside, mixer=True)  # train/agents/reward_std too
    a, b = (checkpoint(d)["reward_standardisers"] for d in (alone, inside))
    assert sorted(a) == sorted(b) == ["agents.stats.count", "agents.stats.mean", "agents.stats.var"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-7, msg=name)
    # 2 epochs x 2 minibatches of 50 steps x 3 agents, pooled
    assert float(b["agents.stats.count"]) == pytest.approx(4 * 50 * 3 + 1e-4)
    other = checkpoint(tmp_path / "stack" / "seed_0")["reward_standardisers"]
    assert float(other["agents.stats.mean"]) != pytest.approx(float(b["agents.stats.mean"]))
    more = (*budget, "seeds_in_process=2", "collector.total_frames=200")
    run("qmix_vdn", tmp_path / "stack", (*more, f"resume={tmp_path / 'stack'}"))
    again = checkpoint(inside)["reward_standardisers"]
    assert float(again["agents.stats.count"]) == pytest.approx(2 * 4 * 50 * 3 + 1e-4)


def test_hard_target_updates_copy_each_seeds_own_networks(tmp_path):
    """``loss.hard_update_interval=4``: the 4th and last gradient step of the batch copies
    each seed's online mixer into its target, inside a stack as alone."""
    hard = (*MPE, "loss.hard_update_interval=4")
    run("qmix_vdn", tmp_path / "stack", (*hard, "seeds_in_process=2"))
    run("qmix_vdn", tmp_path / "alone", (*hard, "seed=4"))
    assert_same_first_updates(tmp_path / "alone", tmp_path / "stack" / "seed_4", mixer=True)
    stack = tmp_path / "stack"
    for run_dir in (tmp_path / "alone", stack / "seed_0", stack / "seed_4"):
        mixer = mixer_of(run_dir)
        targets = [k for k in mixer if "target_mixer" in k]
        assert targets
        for name in targets:
            torch.testing.assert_close(mixer[name], mixer[name.replace("target_mixer", "mixer", 1)])
