"""The everyday transforms: step counting and truncation, episode rewards, dtype casts, key
exclusion and renaming, and first-step flags."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from marlkit._utils import check_int
from marlkit.data.composite import Composite
from marlkit.data.keys import (
    ACTION_MASK,
    DONE,
    EPISODE_REWARD,
    IS_INIT,
    MASK,
    STEP_COUNT,
    TRUNCATED,
    NestedKey,
    join_key,
    key_path,
)
from marlkit.data.keys import unravel_key as _unravel
from marlkit.data.specs import Bounded, Categorical, TensorSpec, Unbounded
from marlkit.envs._spec_utils import done_levels, reshape_env_mask
from marlkit.envs.transforms.base import EnvSpecs, Transform

__all__ = [
    "DoubleToFloat",
    "ExcludeKeys",
    "InitTracker",
    "RenameKeys",
    "RewardSum",
    "StepCounter",
]


#: Leaves the env contract itself reads (the done rule, action validation): never renamed or
#: dropped by a transform.
_CONTRACT_LEAVES = (MASK, ACTION_MASK)


def _refuse_contract_leaf(transform: str, key: NestedKey) -> None:
    if key_path(key)[-1] in _CONTRACT_LEAVES:
        raise ValueError(
            f"{transform} cannot touch {key!r}: the env contract reads it (a group's 'mask' "
            "says who is present to the done rule, its 'action_mask' guards action validation)"
        )


def _keep_where_not_reset(
    fresh: torch.Tensor,
    tensordict: TensorDictBase | None,
    key: NestedKey,
    env_mask: torch.Tensor | None,
) -> torch.Tensor:
    """``fresh`` for reset envs; the input's previous value for the others (partial resets)."""
    if env_mask is None or tensordict is None:
        return fresh
    before = tensordict.get(key, None)
    if before is None:
        return fresh
    return torch.where(reshape_env_mask(env_mask, fresh.shape), fresh, before)


class _OutputTransform(Transform):
    """A transform that changes reset and step outputs the same way, through ``_apply``."""

    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        return self._apply(tensordict_reset)

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._apply(next_tensordict)


class StepCounter(Transform):
    """Count steps per env and truncate episodes at ``max_steps``.

    Writes ``"step_count"`` ``[*B, 1]`` int64; when the count reaches ``max_steps`` it truncates
    every agent (``truncated`` and ``done`` of each group, ``[*B, n, 1]``; the root's in an env
    without groups), adding ``truncated`` specs where the env had none. The episode's root flags
    then follow by the done rule (:mod:`marlkit.envs.common`), as for any other truncation.

    Args:
        max_steps: episode length limit, or ``None`` to only count.
        step_count_key: where the count is written.
    """

    def __init__(self, max_steps: int | None = None, *, step_count_key: NestedKey = STEP_COUNT):
        self.max_steps = check_int("max_steps", max_steps, low=1, allow_none=True)
        self.step_count_key = _unravel(step_count_key)
        self._levels: list[tuple[tuple[str, ...], torch.Size]] = []
        self._marked: list[tuple[tuple[str, ...], torch.Size]] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        b = tuple(specs.observation.shape)
        # Not capped at max_steps: a loop that ignores done keeps counting.
        high = torch.iinfo(torch.int64).max
        specs.observation[self.step_count_key] = Bounded(
            0, high, (*b, 1), dtype=torch.int64, device=specs.observation.device
        )
        self._levels = done_levels(specs.done)
        for prefix, shape in self._levels:
            key = join_key(prefix, TRUNCATED)
            if key not in specs.done:
                specs.done[key] = Categorical(2, shape, dtype=torch.bool, device=specs.done.device)
        # The agents' levels: the root is the done rule's, unless it is the one agent's.
        groups = [level for level in self._levels if level[0]]
        self._marked = groups or self._levels
        self._batch = torch.Size(b)
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        zeros = torch.zeros((*self._batch, 1), dtype=torch.int64, device=tensordict_reset.device)
        count = _keep_where_not_reset(zeros, tensordict, self.step_count_key, env_mask)
        tensordict_reset.set(self.step_count_key, count)
        return tensordict_reset

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        # Checked here, before the inner env steps, so that a bad input leaves its state alone.
        if tensordict.get(self.step_count_key, None) is None:
            raise KeyError(
                f"StepCounter: the step input has no {self.step_count_key!r}; start from "
                "env.reset() (or carry the count over with step_mdp)"
            )
        return tensordict

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        count = tensordict.get(self.step_count_key) + 1
        next_tensordict.set(self.step_count_key, count)
        if self.max_steps is None:
            return next_tensordict
        trunc = count >= self.max_steps
        for prefix, shape in self._marked:
            level = reshape_env_mask(trunc.reshape(self._batch), shape)
            trunc_key, done_key = join_key(prefix, TRUNCATED), join_key(prefix, DONE)
            before = next_tensordict.get(trunc_key, None)
            next_tensordict.set(trunc_key, level if before is None else before | level)
            next_tensordict.set(done_key, next_tensordict.get(done_key) | level)
        return next_tensordict

    def __repr__(self) -> str:
        return f"StepCounter(max_steps={self.max_steps})"


class RewardSum(Transform):
    """Sum rewards over the episode, per group: ``(group, "episode_reward")`` ``[*B, n, 1]``.

    Args:
        in_keys: reward keys to sum (default: every reward key of the env).
        out_keys: where the sums go (default: ``"episode_reward"`` next to each reward).
    """

    changes_done_flags = False

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
    ):
        if (in_keys is None) != (out_keys is None) and out_keys is not None:
            raise ValueError("RewardSum: out_keys need in_keys")
        if in_keys is not None and out_keys is not None and len(in_keys) != len(out_keys):
            raise ValueError(
                f"RewardSum: {len(in_keys)} in_keys but {len(out_keys)} out_keys; they pair up"
            )
        self._in_keys = None if in_keys is None else [_unravel(k) for k in in_keys]
        self._out_keys = None if out_keys is None else [_unravel(k) for k in out_keys]
        self.in_keys: list[NestedKey] = []
        self.out_keys: list[NestedKey] = []
        self._shapes: list[tuple[torch.Size, torch.dtype]] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        if self._in_keys is not None and not self._in_keys:
            raise ValueError("RewardSum: in_keys is empty; pass None to sum every reward")
        self.in_keys = self._in_keys or specs.reward.keys(True, True)
        self.out_keys = self._out_keys or [
            join_key(key_path(k)[:-1], EPISODE_REWARD) for k in self.in_keys
        ]
        self._shapes = []
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            if in_key not in specs.reward:
                raise KeyError(
                    f"RewardSum: {in_key!r} is not a reward key; reward keys: "
                    f"{specs.reward.keys(True, True)}"
                )
            reward = specs.reward[in_key]
            dtype = reward.dtype if reward.dtype is not None else torch.float32
            specs.observation[out_key] = Unbounded(reward.shape, dtype=dtype, device=reward.device)
            self._shapes.append((reward.shape, dtype))
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        for out_key, (shape, dtype) in zip(self.out_keys, self._shapes):
            zeros = torch.zeros(shape, dtype=dtype, device=tensordict_reset.device)
            tensordict_reset.set(
                out_key, _keep_where_not_reset(zeros, tensordict, out_key, env_mask)
            )
        return tensordict_reset

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            reward = next_tensordict.get(in_key)
            before = tensordict.get(out_key, None)
            next_tensordict.set(out_key, reward.clone() if before is None else before + reward)
        return next_tensordict

    def __repr__(self) -> str:
        return f"RewardSum(in_keys={self.in_keys}, out_keys={self.out_keys})"


def _with_dtype(spec: TensorSpec, dtype: torch.dtype) -> TensorSpec:
    if isinstance(spec, Bounded):
        return Bounded(spec.low.to(dtype), spec.high.to(dtype), spec.shape, dtype, spec.device)
    if isinstance(spec, Unbounded):
        return Unbounded(spec.shape, dtype, spec.device)
    raise TypeError(f"cannot change the dtype of a {type(spec).__name__} spec")


class DoubleToFloat(_OutputTransform):
    """Cast float64 observations, state and rewards to float32, and float32 actions back to
    the float64 the inner env expects.

    Args:
        in_keys: the keys to cast (default: every float64 leaf).
    """

    changes_done_flags = False

    def __init__(self, in_keys: Sequence[NestedKey] | None = None):
        self._in_keys = None if in_keys is None else [_unravel(k) for k in in_keys]
        self.out_keys: list[NestedKey] = []  # observation/state/reward keys cast on the way out
        self.action_keys: list[NestedKey] = []  # action keys cast on the way in

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        self.out_keys, self.action_keys = [], []
        found: set[NestedKey] = set()
        for composite, outgoing in (
            (specs.observation, True),
            (specs.state, True),
            (specs.reward, True),
            (specs.action, False),
        ):
            for key, spec in composite.items(True, True):
                wanted = self._in_keys is None or key in self._in_keys
                if not wanted or spec.dtype != torch.float64:
                    continue
                composite[key] = _with_dtype(spec, torch.float32)  # type: ignore[arg-type]
                (self.out_keys if outgoing else self.action_keys).append(key)
                found.add(key)
        missing = [k for k in (self._in_keys or []) if k not in found]
        if missing:
            raise KeyError(f"DoubleToFloat: no float64 spec under {missing}")
        return specs

    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        for key in self.out_keys:
            value = tensordict.get(key, None)
            if value is not None:
                tensordict.set(key, value.to(torch.float32))
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._to_double(tensordict, self.action_keys)

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._to_double(tensordict, self.out_keys)

    @staticmethod
    def _to_double(tensordict: TensorDictBase, keys: list[NestedKey]) -> TensorDictBase:
        """A shallow copy with the float32 entries at ``keys`` back in float64."""
        present = [k for k in keys if tensordict.get(k, None) is not None]
        if not present:
            return tensordict
        out = tensordict.clone(False)
        for key in present:
            out.set(key, tensordict.get(key).to(torch.float64))
        return out

    def __repr__(self) -> str:
        return f"DoubleToFloat(out_keys={self.out_keys}, action_keys={self.action_keys})"


class ExcludeKeys(_OutputTransform):
    """Drop observation or state entries (and their specs).

    Args:
        keys: the keys to drop; each must be an observation or state key.
    """

    changes_done_flags = False

    def __init__(self, *keys: NestedKey):
        if not keys:
            raise ValueError("ExcludeKeys needs at least one key")
        self.keys = [_unravel(k) for k in keys]
        for key in self.keys:
            _refuse_contract_leaf("ExcludeKeys", key)

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        for key in self.keys:
            # A group key (e.g. "agents") also holds the group's actions, rewards and done flags.
            if any(key in composite for composite in (specs.action, specs.reward, specs.done)):
                raise ValueError(
                    f"ExcludeKeys cannot drop {key!r}: actions, rewards and done flags are part "
                    "of the env contract"
                )
            found = False
            for composite in (specs.observation, specs.state):
                if key in composite:
                    del composite[key]
                    found = True
            if not found:
                raise KeyError(
                    f"ExcludeKeys: {key!r} is neither an observation nor a state key; they are "
                    f"{specs.observation.keys(True) + specs.state.keys(True)}"
                )
        return specs

    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.exclude(*self.keys, inplace=True)

    def __repr__(self) -> str:
        return f"ExcludeKeys({', '.join(map(repr, self.keys))})"


class RenameKeys(_OutputTransform):
    """Rename entries: observations, state and rewards on the way out, actions on the way in
    (the policy writes the new name, the inner env reads the old one).

    Args:
        in_keys: the env's keys.
        out_keys: their new names, one each.
    """

    changes_done_flags = False

    def __init__(self, in_keys: Sequence[NestedKey], out_keys: Sequence[NestedKey]):
        if len(in_keys) != len(out_keys) or not in_keys:
            raise ValueError(
                f"RenameKeys needs as many out_keys as in_keys (at least one), got "
                f"{len(in_keys)} and {len(out_keys)}"
            )
        self.in_keys = [_unravel(k) for k in in_keys]
        self.out_keys = [_unravel(k) for k in out_keys]
        for key in self.in_keys:
            _refuse_contract_leaf("RenameKeys", key)
        self._outgoing: list[tuple[NestedKey, NestedKey]] = []
        self._actions: list[tuple[NestedKey, NestedKey]] = []

    def _move(self, composite: Composite, old: NestedKey, new: NestedKey) -> None:
        if new in composite:
            raise ValueError(f"RenameKeys: {new!r} already exists")
        composite[new] = composite.pop(old)
        parent = key_path(old)[:-1]
        if parent and parent in composite and not composite[parent].keys():  # type: ignore[union-attr]
            del composite[parent]

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        self._outgoing, self._actions = [], []
        named = {
            "observation": specs.observation,
            "state": specs.state,
            "action": specs.action,
            "reward": specs.reward,
            "done": specs.done,
        }
        for old, new in zip(self.in_keys, self.out_keys):
            holders = [name for name, composite in named.items() if old in composite]
            if len(holders) > 1:  # a group key holds observations, actions, rewards, done flags
                raise ValueError(
                    f"RenameKeys cannot rename {old!r}: it holds entries of the "
                    f"{', '.join(holders)} specs; rename their leaves instead"
                )
            taken = [name for name, composite in named.items() if new in composite]
            if taken:
                raise ValueError(f"RenameKeys: {new!r} already exists (in the {taken[0]} spec)")
            for composite in (specs.observation, specs.state, specs.reward):
                if old in composite:
                    self._move(composite, old, new)
                    self._outgoing.append((old, new))
                    break
            else:
                if old in specs.action:
                    self._move(specs.action, old, new)
                    self._actions.append((old, new))
                elif old in specs.done:
                    raise ValueError(f"RenameKeys cannot rename the done flag {old!r}")
                else:
                    raise KeyError(f"RenameKeys: the env has no {old!r}")
        return specs

    def _apply(self, tensordict: TensorDictBase) -> TensorDictBase:
        for old, new in self._outgoing:
            if old in tensordict.keys(True):
                tensordict.rename_key_(old, new)
        return tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not self._actions:
            return tensordict
        out = tensordict.clone(False)
        for old, new in self._actions:
            out.set(old, tensordict.get(new))
        return out

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        present = [(old, new) for old, new in self._outgoing if new in tensordict.keys(True)]
        if not present:
            return tensordict
        out = tensordict.clone(False)
        for old, new in present:
            out.set(old, tensordict.get(new))
        return out

    def __repr__(self) -> str:
        return f"RenameKeys(in_keys={self.in_keys}, out_keys={self.out_keys})"


class InitTracker(Transform):
    """Flag the first step of each episode: ``"is_init"`` True after a reset, False after a
    step, at every done level (root ``[*B, 1]``, groups ``[*B, n, 1]``). Recurrent policies
    read it to reset their hidden state.

    Args:
        init_key: the flag's name at each level.
    """

    changes_done_flags = False

    def __init__(self, init_key: str = IS_INIT):
        if not isinstance(init_key, str):
            raise TypeError(
                f"init_key must be a str (it is placed at every level), got {init_key!r}"
            )
        self.init_key = init_key
        self._levels: list[tuple[tuple[str, ...], torch.Size]] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        self._levels = done_levels(specs.done)
        for prefix, shape in self._levels:
            specs.observation[join_key(prefix, self.init_key)] = Categorical(
                2, shape, dtype=torch.bool, device=specs.observation.device
            )
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        for prefix, shape in self._levels:
            key = join_key(prefix, self.init_key)
            if env_mask is None:
                flag = torch.ones(shape, dtype=torch.bool, device=tensordict_reset.device)
            else:  # envs not reset keep their flag (True if they were reset just before)
                flag = reshape_env_mask(env_mask, shape).clone()
                before = tensordict.get(key, None) if tensordict is not None else None
                if before is not None:
                    flag |= before
            tensordict_reset.set(key, flag)
        return tensordict_reset

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for prefix, shape in self._levels:
            next_tensordict.set(
                join_key(prefix, self.init_key),
                torch.zeros(shape, dtype=torch.bool, device=next_tensordict.device),
            )
        return next_tensordict

    def __repr__(self) -> str:
        return f"InitTracker(init_key={self.init_key!r})"
