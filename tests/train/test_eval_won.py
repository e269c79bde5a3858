"""A win rate for envs whose root says which episodes were won (native SMAX's ``"won"``): the
evaluation's ``won`` (each env's first episode), the training batches' ``won`` (the episodes
that ended in them), both logged by a run, ``eval/won`` and ``eval_random/won`` per mode; envs
without the flag log nothing new."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.collectors import Collector
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.record import read_metrics
from marlkit.train import TrainingRun, evaluate
from marlkit.train.evaluation import episode_wins


def five_on_one(num_envs=8):
    """Five marines against one: a random policy wins some episodes, not all."""
    env = marlkit.make("smax/custom", allies=5, enemies=1, num_envs=num_envs, seed=0)
    return TransformedEnv(env, Compose(StepCounter(100), RewardSum()))


def attacker(td):
    """Shoots the first enemy in range, else stands still: wins five on one every time."""
    mask = td["ally", "action_mask"]
    attack = mask[..., 5:]
    stop = torch.full(mask.shape[:-1], 4)
    td["ally", "action"] = torch.where(attack.any(-1), 5 + attack.float().argmax(-1), stop)
    return td


def test_evaluation_win_rate_is_the_share_of_first_episodes_won():
    env = five_on_one()
    ev = evaluate(env, None, steps=100, seed=1, exploration="random")
    # a won episode's return is the enemy's whole health (1) plus the win bonus (1); a lost or
    # cut one gets no bonus, so at most 1
    won = (ev.returns["ally"] > 1.5).float().mean()
    assert 0.0 < ev.metrics["won"] < 1.0
    assert ev.metrics["won"] == pytest.approx(float(won))
    assert evaluate(env, attacker, steps=100, seed=1).metrics["won"] == 1.0
    # an episode not over within the rollout is not won
    assert evaluate(env, attacker, steps=2, seed=1).metrics["won"] == 0.0


def test_training_batches_log_the_win_rate_of_their_ended_episodes():
    env = five_on_one()
    collector = Collector(env, None, frames_per_batch=8 * 60, total_frames=8 * 60)
    batch = next(iter(collector))
    done = batch["next", "done"].squeeze(-1)
    returns = batch["next", "ally", "episode_reward"].mean((-2, -1))[done]
    assert done.sum() > 0 and 0 < (returns > 1.5).sum() < done.sum()
    assert episode_wins(batch) == {"won": pytest.approx(float((returns > 1.5).float().mean()))}
    assert episode_wins(batch[:, :1]) == {}  # no episode ended in one step
    collector.shutdown()


def test_a_run_logs_won_per_evaluation_mode_and_only_for_envs_with_the_flag(tmp_path):
    for name, env_fn in (("smax", five_on_one), ("navigation", _navigation)):
        folder = tmp_path / name
        eval_env = env_fn()
        collector = Collector(env_fn(), None, frames_per_batch=8 * 50, total_frames=8 * 100)
        run = TrainingRun(
            folder,
            eval_env=eval_env,
            eval_steps=100,
            eval_seed=3,
            eval_exploration="both",
            video=False,
            backends=["csv"],
        )
        policy = attacker if name == "smax" else None
        for batch in run.batches(collector):
            out = run.end_iteration(batch, {}, policy=policy, state=dict, frames=collector.frames)
        summary = run.finish(policy)
        collector.shutdown()
        rows = read_metrics(folder / "metrics.csv")
        wins = {k for row in rows for k in row if k.split("/")[-1] == "won"}
        if name == "smax":
            assert wins == {"won", "eval/won", "eval_random/won"}
            assert out["eval/won"] == 1.0 and summary["trained"]["won"] == 1.0
            assert "won" in summary["random"] and "won" in summary["trained_random"]
            assert "won" in run.progress(out)
        else:
            assert wins == set()
            assert "won" not in summary["trained"] and "won" not in summary["random"]


def _navigation():
    env = marlkit.make("navigation", num_envs=8, n_agents=2, seed=0)
    return TransformedEnv(env, Compose(StepCounter(100), RewardSum()))


def test_won_of_another_shape_or_without_done_is_refused():
    batch = TensorDict({"next": {"won": torch.zeros(2, 3, 2, dtype=torch.bool)}}, batch_size=[2, 3])
    with pytest.raises(ValueError, match=r"\('next', 'won'\) must hold one flag per env"):
        episode_wins(batch)
    batch["next", "won"] = torch.zeros(2, 3, 1, dtype=torch.bool)
    with pytest.raises(KeyError, match=r"no \('next', 'done'\)"):
        episode_wins(batch)
    batch["next", "done"] = torch.tensor([[False, True, False], [False, False, True]])[..., None]
    batch["next", "won"] = torch.tensor([[True, True, False], [False, False, False]])[..., None]
    assert episode_wins(batch) == {"won": 0.5}  # the won flag counts only where an episode ended
