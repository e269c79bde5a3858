"""The done rule of :mod:`marlkit.envs.common`, in one place, cheap on the step path.

1. per agent, ``done = terminated | truncated``;
2. root ``done``: every agent is done, or the simulator ended the episode (a root flag given),
   in which case the agents not done yet are truncated;
3. root ``truncated``: the episode is over and an agent present at its end (its group's
   ``"mask"`` in the step input, where the group has one; else every agent) was truncated;
   root ``terminated = done & ~truncated``.

A :class:`DonePlan` is built once per env from its specs; :func:`apply_done_rule` then costs a
handful of tensor operations per group (a few microseconds each for small batches).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from marlkit.data._fast import get_entry, set_leaf
from marlkit.data.composite import Composite
from marlkit.data.keys import DONE, DONE_KEYS, MASK, TERMINATED, TRUNCATED, NestedKey, join_key
from marlkit.envs._spec_utils import done_levels

__all__ = ["DonePlan", "LevelPlan", "apply_done_rule", "make_done_plan"]


@dataclass(frozen=True)
class LevelPlan:
    """A group level of the done spec."""

    key: NestedKey  # where its sub-TensorDict sits (a group name, or a nested key)
    shape: torch.Size  # of its flags, [*B, n, 1]
    mask_key: NestedKey | None  # (group, "mask") where the group declares one
    keys: tuple[str, ...]  # the done-like leaves it declares
    agent_dim: bool  # shape is exactly [*B, n, 1]: reduce over dim -2


@dataclass(frozen=True)
class DonePlan:
    """Where an env's done flags live: its group levels and the root leaves it declares."""

    batch: torch.Size
    levels: tuple[LevelPlan, ...]
    root_keys: tuple[str, ...]


def make_done_plan(
    done_spec: Composite, observation_spec: Composite, batch: torch.Size
) -> DonePlan:
    observed = set(observation_spec.keys(True, True))
    declared = set(done_spec.keys(True, True))
    levels = []
    for prefix, shape in done_levels(done_spec):
        if not prefix:
            continue
        mask_key = join_key(prefix, MASK)
        levels.append(
            LevelPlan(
                key=join_key(prefix),
                shape=shape,
                mask_key=mask_key if mask_key in observed else None,
                keys=tuple(k for k in DONE_KEYS if join_key(prefix, k) in declared),
                agent_dim=len(shape) == len(batch) + 2 and shape[-1] == 1,
            )
        )
    return DonePlan(batch, tuple(levels), tuple(k for k in DONE_KEYS if k in declared))


def _either(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    return a if b is None else a | b


def _per_env(level: LevelPlan, batch: torch.Size, flags: torch.Tensor, how: str) -> torch.Tensor:
    """A level's ``[*B, n, 1]`` flags reduced to ``[*B, 1]`` with ``all`` or ``any``."""
    if level.agent_dim:
        return flags.all(-2) if how == "all" else flags.any(-2)
    flat = flags.reshape(*batch, -1)
    return flat.all(-1, keepdim=True) if how == "all" else flat.any(-1, keepdim=True)


def _broadcast(value: torch.Tensor, batch: torch.Size, shape: torch.Size) -> torch.Tensor:
    """A root flag ``[*B, 1]`` as a view of a level's shape ``[*B, n, 1]``."""
    return value.reshape(*batch, *([1] * (len(shape) - len(batch)))).expand(shape)


def _level_flags(
    plan: DonePlan,
    level: LevelPlan,
    sub: TensorDictBase | None,
    root: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(terminated, truncated)`` of a level: its own, else the root's broadcast."""
    term = trunc = None
    if sub is not None:
        term, trunc = get_entry(sub, TERMINATED), get_entry(sub, TRUNCATED)
        if term is None and trunc is None:
            term = get_entry(sub, DONE)
    if term is None and trunc is None:  # a simulator that decides whole envs
        root_done, root_term, root_trunc = root
        if root_done is None and root_term is None and root_trunc is None:
            raise KeyError(
                f"_step() returned no terminated, truncated or done flag under {level.key!r} "
                "nor at the root"
            )
        over = root_term
        if over is None and root_done is not None:
            over = root_done if root_trunc is None else root_done & ~root_trunc
        if over is not None:
            term = _broadcast(over, plan.batch, level.shape)
        if root_trunc is not None:
            trunc = _broadcast(root_trunc, plan.batch, level.shape)
    if term is None and trunc is not None:
        term = torch.zeros(level.shape, dtype=torch.bool, device=trunc.device)
    elif trunc is None and term is not None:
        trunc = torch.zeros(level.shape, dtype=torch.bool, device=term.device)
    if term is None or trunc is None:  # unreachable: a root flag was given above
        raise KeyError(f"no done flag for {level.key!r}")
    return term, trunc


def apply_done_rule(
    plan: DonePlan, next_td: TensorDictBase, tensordict: TensorDictBase | None
) -> None:
    """Write every declared done flag of a step output ``next_td`` (in place) by the rule;
    ``tensordict`` is the step input, whose ``(group, "mask")`` says who was present."""
    root = (get_entry(next_td, DONE), get_entry(next_td, TERMINATED), get_entry(next_td, TRUNCATED))
    ended = _either(_either(root[0], root[1]), root[2])
    if not plan.levels:  # no groups: the root flags are the one agent's
        if ended is None:
            raise KeyError("_step() returned no done flag at the root (the env has no groups)")
        over = ended
        truncated = over & root[2] if root[2] is not None else torch.zeros_like(over)
        _write_root(plan, next_td, over, truncated)
        return
    levels = []
    env_done = []
    for level in plan.levels:
        sub = get_entry(next_td, level.key)
        term, trunc = _level_flags(plan, level, sub, root)
        done = term | trunc
        env_done.append(_per_env(level, plan.batch, done, "all"))
        levels.append([level, sub, term, trunc, done])
    every = functools.reduce(operator.and_, env_done)
    over = every if ended is None else every | ended
    if ended is not None:
        short = over & ~every  # ended by the simulator with agents not done: cut short
        if bool(short.any()):
            for entry in levels:
                extra = _broadcast(short, plan.batch, entry[0].shape) & ~entry[4]
                entry[3], entry[4] = entry[3] | extra, entry[4] | extra
    env_cut = []
    for level, sub, term, trunc, done in levels:
        seen = trunc
        if level.mask_key is not None and tensordict is not None:
            present = get_entry(tensordict, level.mask_key)
            if present is not None:  # [*B, n]: who acted in this transition
                present = present.unsqueeze(-1) if level.agent_dim else present.reshape(seen.shape)
                seen = seen & present
        env_cut.append(_per_env(level, plan.batch, seen, "any"))
        values = {TERMINATED: term, TRUNCATED: trunc, DONE: done}
        for name in level.keys:
            if sub is None:
                next_td.set(join_key(level.key, name), values[name])
            else:
                set_leaf(sub, name, values[name])
    _write_root(plan, next_td, over, over & functools.reduce(operator.or_, env_cut))


def _write_root(
    plan: DonePlan, next_td: TensorDictBase, over: torch.Tensor, truncated: torch.Tensor
) -> None:
    values = {DONE: over, TRUNCATED: truncated, TERMINATED: over ^ truncated}  # truncated => over
    for name in plan.root_keys:
        set_leaf(next_td, name, values[name])
