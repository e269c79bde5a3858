"""A run's evaluation in the exploration mode it asks for: ``deterministic`` (the greedy or
mean action), ``random`` (the policy's own sampled actions: how a stochastic strategy is
judged) or ``both``; the summary reports which, and a uniformly random policy beside it."""

from __future__ import annotations

import json

import pytest
import torch

import marlkit
from marlkit.collectors import Collector
from marlkit.data.exploration import exploration_mode
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.record import read_metrics
from marlkit.train import TrainingRun, evaluate, summarise_run


def nav(num_envs=2, max_steps=5):
    env = marlkit.make("navigation", num_envs=num_envs, n_agents=2, seed=0)
    return TransformedEnv(env, Compose(StepCounter(max_steps), RewardSum()))


class ModalPolicy:
    """Stands still when deterministic, acts at random when exploring; counts its calls per
    mode (one call per step)."""

    def __init__(self, env):
        self.env = env
        self.calls = {"deterministic": 0, "random": 0}

    def __call__(self, td):
        mode = exploration_mode()
        self.calls[mode] += 1
        if mode == "random":
            return self.env.rand_action(td)
        action = self.env.action_spec["agents", "action"]
        td["agents", "action"] = torch.zeros(action.shape, dtype=action.dtype)
        return td


def _train(tmp_path, exploration):
    eval_env = nav()
    policy = ModalPolicy(eval_env)
    collector = Collector(nav(), None, frames_per_batch=10, total_frames=20)
    run = TrainingRun(
        tmp_path,
        eval_env=eval_env,
        eval_steps=5,
        eval_seed=3,
        eval_exploration=exploration,
        video=False,
        backends=["csv"],
    )
    for batch in run.batches(collector):
        run.end_iteration(batch, {}, policy=policy, state=dict, frames=collector.frames)
    during = dict(policy.calls)
    return run.finish(policy), policy, during


def test_both_evaluates_deterministic_and_sampled_actions_and_reports_each(tmp_path):
    summary, policy, during = _train(tmp_path, "both")
    assert during == {"deterministic": 5, "random": 5}  # the last iteration, 5 steps each
    assert policy.calls == during  # the summary reuses both evaluations
    last = read_metrics(tmp_path / "metrics.csv")[-1]
    assert summary["exploration"] == "both"
    assert summary["trained"] == {k[5:]: v for k, v in last.items() if k.startswith("eval/")}
    sampled = {k[12:]: v for k, v in last.items() if k.startswith("eval_random/")}
    assert summary["trained_random"] == sampled and set(sampled) == set(summary["trained"])
    # the sampled evaluation and the random baseline play the same episodes with the same
    # seeded random actions: the same returns
    assert summary["trained_random"] == summary["random"]
    assert summary["trained"] != summary["random"]  # standing still is another return
    assert summary["improvement_random"]["agents/episode_reward"] == 0
    assert json.loads((tmp_path / "summary.json").read_text())["exploration"] == "both"


def test_random_reports_the_policys_sampled_actions_as_trained(tmp_path):
    summary, policy, _ = _train(tmp_path, "random")
    assert policy.calls["deterministic"] == 0
    assert summary["exploration"] == "random" and "trained_random" not in summary
    assert summary["trained"] == summary["random"]


def test_deterministic_is_the_default_and_never_samples(tmp_path):
    summary, policy, _ = _train(tmp_path, "deterministic")
    assert policy.calls["random"] == 0 and policy.calls["deterministic"] == 5
    assert summary["exploration"] == "deterministic" and "trained_random" not in summary
    assert not any(k.startswith("eval_random/") for k in read_metrics(tmp_path / "metrics.csv")[-1])


@pytest.mark.parametrize("bad", ["greedy", "", None, True])
def test_an_unknown_mode_is_refused_before_anything_is_written(tmp_path, bad):
    with pytest.raises(ValueError, match=r"eval exploration must be one of \['deterministic', "):
        TrainingRun(tmp_path / "run", eval_env=nav(), eval_steps=5, eval_exploration=bad)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="eval exploration must be one of"):
        summarise_run(tmp_path / "s", nav(), None, steps=5, rows=[], exploration=bad)
    assert not (tmp_path / "s").exists()


def test_summarise_run_without_a_run_evaluates_both_modes(tmp_path):
    env = nav()
    policy = ModalPolicy(env)
    summary = summarise_run(
        tmp_path, env, policy, steps=5, rows=[], video=False, seed=1, exploration="both"
    )
    assert policy.calls == {"deterministic": 5, "random": 5}
    still = evaluate(env, policy, steps=5, seed=1).metrics
    assert summary["trained"] == still and summary["trained_random"] == summary["random"]
