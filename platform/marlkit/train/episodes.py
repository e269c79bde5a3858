"""Episode statistics of collector batches and evaluation rollouts, per agent group.

:func:`episode_metrics` reads what :class:`~marlkit.envs.RewardSum` and
:class:`~marlkit.envs.StepCounter` write (``("next", group, "episode_reward")``,
``("next", "step_count")``) at the steps where an episode ended (``("next", "done")``), so a
training loop logs the mean episode reward of each group without knowing the simulator.
:func:`episode_returns` sums the rewards of each env's first episode in a rollout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import DONE, EPISODE_REWARD, NEXT, REWARD, STEP_COUNT

__all__ = ["episode_metrics", "episode_returns", "reward_groups"]


def _groups_with(batch: TensorDictBase, leaf: str) -> list[str]:
    if NEXT not in batch:
        raise KeyError(f"the batch has no 'next' entry; keys: {sorted(map(str, batch.keys()))}")
    nxt = batch.get(NEXT)
    subtrees = [(g, nxt.get(g)) for g in nxt.keys()]  # noqa: SIM118 (a TD iterates its batch)
    return [g for g, sub in subtrees if isinstance(sub, TensorDictBase) and leaf in sub.keys()]  # noqa: SIM118


def reward_groups(batch: TensorDictBase) -> list[str]:
    """The groups of ``batch`` with a reward under ``("next", group, "reward")``."""
    return _groups_with(batch, REWARD)


def _done(batch: TensorDictBase) -> torch.Tensor:
    key = (NEXT, DONE)
    if key not in batch.keys(True, True):
        raise KeyError("the batch has no ('next', 'done') [*B, T, 1]")
    return batch.get(key).reshape(batch.shape)


def episode_metrics(batch: TensorDictBase, groups: Sequence[str] | None = None) -> dict[str, float]:
    """Mean reward and length of the episodes that ended in ``batch``.

    Args:
        batch: a collector batch ``[*B, T]`` of an env with :class:`~marlkit.envs.RewardSum`
            (``("next", group, "episode_reward")`` ``[*B, T, n, 1]``) and, for the lengths,
            :class:`~marlkit.envs.StepCounter` (``("next", "step_count")`` ``[*B, T, 1]``).
        groups: the groups to report (default: every group with an ``episode_reward``).

    Returns:
        ``{"<group>/episode_reward": mean over the ended episodes and the group's agents,
        "episode_length": mean length, "episodes": how many ended}``; without an ended
        episode only ``{"episodes": 0.0}``.

    Raises:
        KeyError: no ``("next", "done")``, or a group given without an ``episode_reward``.
    """
    done = _done(batch)
    ended = int(done.sum())
    out: dict[str, float] = {"episodes": float(ended)}
    if not ended:
        return out
    nxt = batch.get(NEXT)
    if groups is None:
        groups = _groups_with(batch, EPISODE_REWARD)
    for group in groups:
        key = (group, EPISODE_REWARD)
        if key not in nxt.keys(True, True):
            raise KeyError(
                f"the batch has no ('next', {group!r}, {EPISODE_REWARD!r}); add RewardSum to "
                "the env"
            )
        reward = nxt.get(key)  # [*B, T, n, 1]
        per_episode = reward.reshape(*batch.shape, -1).float().mean(-1)[done]
        out[f"{group}/{EPISODE_REWARD}"] = float(per_episode.mean())
    if STEP_COUNT in nxt.keys():  # noqa: SIM118
        lengths = nxt.get(STEP_COUNT).reshape(batch.shape)[done]
        out["episode_length"] = float(lengths.float().mean())
    return out


def episode_returns(rollout: TensorDictBase, group: str) -> torch.Tensor:
    """Each env's first-episode return in ``rollout`` ``[*B, T]``, mean over the group's agents:
    ``[*B]``. Rewards after the first ``done`` are left out; an env whose episode did not end
    within ``T`` steps counts what it got so far.

    Raises:
        KeyError: no ``("next", group, "reward")`` or ``("next", "done")``.
    """
    key = (NEXT, group, REWARD)
    if key not in rollout.keys(True, True):
        raise KeyError(f"the rollout has no {key}; groups with rewards: {reward_groups(rollout)}")
    done = _done(rollout)  # [*B, T]
    reward = rollout.get(key).reshape(*rollout.shape, -1).float().mean(-1)  # [*B, T]
    # Steps after the first done: the cumulative count of dones before the step is > 0.
    before = done.cumsum(-1) - done.long()
    return (reward * (before == 0)).sum(-1)
