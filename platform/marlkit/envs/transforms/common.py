"""The everyday transforms: step counting and truncation, episode rewards, dtype casts, key
exclusion and renaming, and first-step flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_one_of
from marlkit.data.composite import Composite
from marlkit.data.keys import (
    ACTION_MASK,
    DONE,
    EPISODE_REWARD,
    IS_INIT,
    MASK,
    NEXT,
    RESET,
    STEP_COUNT,
    TERMINATED,
    TRUNCATED,
    NestedKey,
    check_key,
    check_keys,
    join_key,
    key_path,
    unravel_key,
)
from marlkit.data.specs import Bounded, Categorical, TensorSpec, Unbounded, format_shape
from marlkit.envs._spec_utils import done_levels, reshape_env_mask
from marlkit.envs.transforms.base import EnvSpecs, Transform

__all__ = [
    "CommonReward",
    "DoubleToFloat",
    "ExcludeKeys",
    "InitTracker",
    "MissingCarriedError",
    "RenameKeys",
    "RewardSum",
    "StepCounter",
    "TruncationAsTermination",
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


class MissingCarriedError(KeyError):
    """An entry a transform carries from step to step (``step_count``, ``episode_reward``,
    ``is_init``) is absent from the input that needs it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _missing_carried(owner: str, key: NestedKey, reset: bool) -> MissingCarriedError:
    if reset:
        where = "the input of a partial reset"
        why = "the envs that are not reset keep theirs"
    else:
        where, why = "the step input", "the step continues from it"
    return MissingCarriedError(
        f"{owner}: {where} has no {key!r} ({why}); pass the last step's TensorDict (the root "
        "that env.reset(), step_and_maybe_reset or step_mdp returns; for a partial reset, with "
        'the "_reset" mask set on it), not only the actions or the mask'
    )


def _check_carried(owner: str, key: NestedKey, value: object, spec: TensorSpec) -> None:
    """Refuse a carried entry (``step_count``, ``episode_reward``, ...) whose dtype, shape or
    device does not fit ``spec``, before anything is computed from it (its values are not
    checked: this runs on every step)."""
    if (
        isinstance(value, torch.Tensor)
        and value.dtype == spec.dtype
        and value.shape == spec.shape
        and value.device == spec.device
    ):
        return
    reason = spec.explain(value)
    if reason is not None:
        got = (
            f"{str(value.dtype).replace('torch.', '')} {format_shape(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(
            f"{owner}: the input's {key!r} does not fit its spec ({reason}): expected "
            f"{spec!r}, got {got}; carry it over unchanged from the env's last output"
        )


def _carried_before(
    owner: str,
    tensordict: TensorDictBase | None,
    key: NestedKey,
    spec: TensorSpec,
    env_mask: torch.Tensor | None,
) -> torch.Tensor | None:
    """The value a partial reset keeps for the envs not reset (``None`` for a full reset):
    the input's, checked against ``spec``. A partial reset without it is refused: guessing
    (zeros, or a value left from an earlier call) would silently restart their episodes."""
    if env_mask is None:
        return None
    before = None if tensordict is None else tensordict.get(key, None)
    if before is None:
        raise _missing_carried(owner, key, reset=True)
    _check_carried(owner, key, before, spec)
    return before


def _keep_where_not_reset(
    fresh: torch.Tensor, before: torch.Tensor | None, env_mask: torch.Tensor | None
) -> torch.Tensor:
    """``fresh`` for reset envs; ``before`` (the input's value) for the others."""
    if env_mask is None or before is None:
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
    without groups), adding ``truncated`` specs where the env had none. In a group that
    declares only ``done`` (its terminations, by the done rule), an agent the simulator ended
    at that very step is left as it is: its termination stays one.
    The episode's root flags then follow by the done rule (:mod:`marlkit.envs.common`), as for
    any other truncation.

    The count is carried by the env's TensorDicts: a step reads it from its input (a step input
    without it, or with one that does not fit its spec, is refused before the simulator runs),
    and a partial reset keeps the input's count for the envs that are not reset (a partial reset
    whose input has none is refused: pass the last step's TensorDict with the ``"_reset"``
    mask, as ``step_and_maybe_reset`` does).

    Args:
        max_steps: episode length limit, or ``None`` to only count.
        step_count_key: where the count is written.
    """

    def __init__(self, max_steps: int | None = None, *, step_count_key: NestedKey = STEP_COUNT):
        self.max_steps = check_int("max_steps", max_steps, low=1, allow_none=True)
        self.step_count_key = check_key("StepCounter", "step_count_key", step_count_key)
        self._levels: list[tuple[tuple[str, ...], torch.Size]] = []
        self._marked: list[tuple[tuple[str, ...], torch.Size]] = []
        self._done_only: list[bool] = []
        self._spec: TensorSpec | None = None

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        b = tuple(specs.observation.shape)
        # Not capped at max_steps: a loop that ignores done keeps counting.
        high = torch.iinfo(torch.int64).max
        self._spec = Bounded(0, high, (*b, 1), dtype=torch.int64, device=specs.observation.device)
        _check_new_key(specs, self.step_count_key, "StepCounter", "step_count_key", _API_NAMES)
        specs.observation[self.step_count_key] = self._spec
        self._levels = done_levels(specs.done)
        for prefix, shape in self._levels:
            key = join_key(prefix, TRUNCATED)
            if key not in specs.done:
                specs.done[key] = Categorical(2, shape, dtype=torch.bool, device=specs.done.device)
        # The agents' levels: the root is the done rule's, unless it is the one agent's.
        groups = [level for level in self._levels if level[0]]
        self._marked = groups or self._levels
        # Levels without "terminated": their done flags are their terminations (done rule).
        self._done_only = [join_key(p, TERMINATED) not in specs.done for p, _ in self._marked]
        self._batch = torch.Size(b)
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        before = _carried_before(
            "StepCounter", tensordict, self.step_count_key, self._count_spec(), env_mask
        )
        zeros = torch.zeros((*self._batch, 1), dtype=torch.int64, device=tensordict_reset.device)
        tensordict_reset.set(self.step_count_key, _keep_where_not_reset(zeros, before, env_mask))
        return tensordict_reset

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        # Checked here, before the inner env steps, so that a bad input leaves its state alone.
        count = tensordict.get(self.step_count_key, None)
        if count is None:
            raise _missing_carried("StepCounter", self.step_count_key, reset=False)
        _check_carried("StepCounter", self.step_count_key, count, self._count_spec())
        return tensordict

    def _count_spec(self) -> TensorSpec:
        if self._spec is None:
            raise RuntimeError("StepCounter is not attached: use TransformedEnv(env, StepCounter)")
        return self._spec

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        count = tensordict.get(self.step_count_key) + 1
        next_tensordict.set(self.step_count_key, count)
        if self.max_steps is None:
            return next_tensordict
        trunc = count >= self.max_steps
        for (prefix, shape), done_only in zip(self._marked, self._done_only):
            trunc_key, done_key = join_key(prefix, TRUNCATED), join_key(prefix, DONE)
            done = next_tensordict.get(done_key)
            level = reshape_env_mask(trunc.reshape(self._batch), shape)
            if done_only:
                # The done rule reads a done that is not a truncation as a termination: an
                # agent the simulator ended at this step stays terminated, not truncated.
                level = level & ~done
            before = next_tensordict.get(trunc_key, None)
            next_tensordict.set(trunc_key, level if before is None else before | level)
            next_tensordict.set(done_key, done | level)
        return next_tensordict

    def __repr__(self) -> str:
        return f"StepCounter(max_steps={self.max_steps})"


class RewardSum(Transform):
    """Sum rewards over the episode, per group: ``(group, "episode_reward")`` ``[*B, n, 1]``.

    The sums are carried by the env's TensorDicts like ``StepCounter``'s count: a step adds its
    rewards to the input's sums (a step input without them, or with sums of another shape, is
    refused before the simulator runs), and a partial reset keeps the input's sums for the envs
    that are not reset (a partial reset whose input has none is refused).

    Args:
        in_keys: a list of reward keys to sum (default: every reward key of the env).
        out_keys: a list of where the sums go, one per in_key (default: ``"episode_reward"``
            next to each reward); each must be a new key.
    """

    changes_done_flags = False

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
    ):
        if (in_keys is None) != (out_keys is None) and out_keys is not None:
            raise ValueError("RewardSum: out_keys need in_keys")
        self._in_keys = None if in_keys is None else check_keys("RewardSum", "in_keys", in_keys)
        self._out_keys = None if out_keys is None else check_keys("RewardSum", "out_keys", out_keys)
        n_in, n_out = len(self._in_keys or ()), len(self._out_keys or ())
        if out_keys is not None and n_in != n_out:
            raise ValueError(f"RewardSum: {n_in} in_keys but {n_out} out_keys; they pair up")
        self.in_keys: list[NestedKey] = []
        self.out_keys: list[NestedKey] = []
        self._specs: list[TensorSpec] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        if self._in_keys is not None and not self._in_keys:
            raise ValueError("RewardSum: in_keys is empty; pass None to sum every reward")
        self.in_keys = self._in_keys or specs.reward.keys(True, True)
        self.out_keys = self._out_keys or [
            join_key(key_path(k)[:-1], EPISODE_REWARD) for k in self.in_keys
        ]
        if len(set(self.out_keys)) != len(self.out_keys):
            raise ValueError(f"RewardSum: out_keys {self.out_keys} name a key more than once")
        self._specs = []
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            if in_key not in specs.reward:
                raise KeyError(
                    f"RewardSum: {in_key!r} is not a reward key; reward keys: "
                    f"{specs.reward.keys(True, True)}"
                )
            _check_new_key(specs, out_key, "RewardSum", "out_key", _API_NAMES)
            reward = specs.reward[in_key]
            dtype = reward.dtype if reward.dtype is not None else torch.float32
            spec = Unbounded(reward.shape, dtype=dtype, device=reward.device)
            specs.observation[out_key] = spec
            self._specs.append(spec)
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        for out_key, spec in zip(self.out_keys, self._specs):
            carried_spec = _spec_in_input_dtype(spec, tensordict, out_key)
            before = _carried_before("RewardSum", tensordict, out_key, carried_spec, env_mask)
            zeros = torch.zeros(spec.shape, dtype=spec.dtype, device=tensordict_reset.device)
            if before is not None:
                before = before.to(spec.dtype)
            tensordict_reset.set(out_key, _keep_where_not_reset(zeros, before, env_mask))
        return tensordict_reset

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        # Checked here, before the inner env steps, so that a bad input leaves its state alone.
        for out_key, spec in zip(self.out_keys, self._specs):
            before = tensordict.get(out_key, None)
            if before is None:
                raise _missing_carried("RewardSum", out_key, reset=False)
            _check_carried(
                "RewardSum", out_key, before, _spec_in_input_dtype(spec, tensordict, out_key)
            )
        return tensordict

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key, spec in zip(self.in_keys, self.out_keys, self._specs):
            reward = next_tensordict.get(in_key)
            before = tensordict.get(out_key)
            next_tensordict.set(out_key, (before + reward).to(spec.dtype))
        return next_tensordict

    def __repr__(self) -> str:
        return f"RewardSum(in_keys={self.in_keys}, out_keys={self.out_keys})"


class CommonReward(Transform):
    """Give every agent of a group the group's reward: its agents' rewards summed (or averaged),
    as EPyMARL's ``common_reward: True`` with ``reward_scalarisation`` does for every task it
    runs. ``(group, "reward")`` ``[*B, n, 1]`` keeps its shape; each agent's entry becomes the
    group's sum (``"sum"``, EPyMARL's default) or mean over its ``n`` agents (``"mean"``).

    An agent out of the game (``mask`` false) has reward 0 in marlkit's layout, so it adds
    nothing to the sum and counts in the mean, as EPyMARL's mean over its agents' list. The spec
    becomes ``Unbounded`` (a sum leaves a per-agent bound). Named in ``env.transforms`` as
    ``common_reward`` (``{name: common_reward, scalarisation: mean}``); a training script places
    it before its episode sums (:attr:`before_episode_sums`), so that ``episode_reward`` is the
    return trained on: the team's, for every agent.

    Args:
        in_keys: the group rewards to make common; default every group's reward (a reward with
            an agents' dim: ``[*B, n, 1]``).
        scalarisation: ``"sum"`` or ``"mean"``.

    Raises:
        KeyError: an ``in_keys`` entry that is not a reward of the env (when attached).
        ValueError: an entry without an agents' dim (a root team reward ``[*B, 1]`` is common
            already), no group reward by default, or another ``scalarisation``.

    Examples:
        >>> import marlkit
        >>> from marlkit.envs.transforms import CommonReward, TransformedEnv
        >>> env = TransformedEnv(marlkit.make("navigation", num_envs=2, n_agents=3), CommonReward())
        >>> td = env.step(env.rand_action(env.reset()))
        >>> bool((td["next", "agents", "reward"] == td["next", "agents", "reward"][:, :1]).all())
        True
    """

    changes_done_flags = False
    #: A script's env builder places it before the step counter and the episode sums.
    before_episode_sums = True

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        scalarisation: Literal["sum", "mean"] = "sum",
    ):
        self._in_keys = None if in_keys is None else check_keys("CommonReward", "in_keys", in_keys)
        if self._in_keys is not None and not self._in_keys:
            raise ValueError("CommonReward: in_keys is empty; pass None for every group's reward")
        self.scalarisation = check_one_of(
            "scalarisation", scalarisation, ("sum", "mean"), owner="CommonReward"
        )
        self.in_keys: list[NestedKey] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        root = specs.reward.ndim  # the env's batch dims; a group's reward has two more
        rewards = specs.reward.keys(True, True)
        grouped = [k for k in rewards if len(specs.reward[k].shape) == root + 2]
        if self._in_keys is None:
            if not grouped:
                raise ValueError(
                    "CommonReward: the env has no group reward [*B, n, 1] (its rewards: "
                    + ", ".join(f"{k!r} {format_shape(specs.reward[k].shape)}" for k in rewards)
                    + "); a root team reward is common already"
                )
            self.in_keys = grouped
        else:
            for key in self._in_keys:
                if key not in rewards:
                    raise KeyError(
                        f"CommonReward: {key!r} is not a reward key; reward keys: {rewards}"
                    )
                if key not in grouped:
                    raise ValueError(
                        f"CommonReward: {key!r} {format_shape(specs.reward[key].shape)} has no "
                        f"agents' dim after the env's batch dims "
                        f"{format_shape(specs.reward.shape)}; a group's reward is [*B, n, 1]"
                    )
            self.in_keys = list(self._in_keys)
        for key in self.in_keys:
            reward = specs.reward[key]
            dtype = reward.dtype if reward.dtype is not None else torch.float32
            specs.reward[key] = Unbounded(reward.shape, dtype=dtype, device=reward.device)
        return specs

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for key in self.in_keys:
            reward = next_tensordict.get(key)
            agents = reward.dim() - 2
            common = (
                reward.sum(agents, keepdim=True)
                if self.scalarisation == "sum"
                else reward.mean(agents, keepdim=True)
            )
            next_tensordict.set(key, common.expand_as(reward).contiguous())
        return next_tensordict

    def __repr__(self) -> str:
        return f"CommonReward(in_keys={self.in_keys}, scalarisation={self.scalarisation!r})"


class TruncationAsTermination(Transform):
    """End every truncated episode as a terminated one: a time limit's cut stops bootstrapping,
    as EPyMARL does on its Gymnasium tasks (LBF, RWARE, MPE through ``gymma``: its runners store
    ``terminated`` as ``(terminated or truncated) != info["episode_limit"]``, and gymma's info
    has no ``episode_limit``, so the step where the time limit cuts is stored as a
    termination, and its value targets do not read the next state).

    At every level with ``truncated`` (each group's ``[*B, n, 1]``, the root's ``[*B, 1]``) a
    truncated entry becomes terminated and ``truncated`` false; ``done`` is unchanged, so
    episodes end where they ended. The losses then treat the cut as the episode's end (QMIX's
    target mixes no next value there, GAE and n-step returns stop). marlkit's default is the
    other rule, the correct one for a task whose time limit is not in the observation: a
    truncated episode bootstraps from its last observation (docs/algorithms.md, "Value
    decomposition"); this transform is for runs that must do what EPyMARL does. Named in
    ``env.transforms`` as ``truncation_as_termination``; place it after the step counter (a
    training script's env builder does: its truncations are the step counter's as well as the
    simulator's).

    Raises:
        ValueError: the env has no ``truncated`` flag at any level (nothing is ever truncated).

    Examples:
        >>> import marlkit
        >>> from marlkit.envs.transforms import StepCounter, TransformedEnv, TruncationAsTermination
        >>> env = TransformedEnv(marlkit.make("navigation", num_envs=2), StepCounter(max_steps=1))
        >>> env = env.append_transform(TruncationAsTermination())
        >>> td = env.step(env.rand_action(env.reset()))
        >>> bool(td["next", "agents", "terminated"].all()), bool(td["next", "truncated"].any())
        (True, False)
    """

    def __init__(self) -> None:
        self._levels: list[tuple[NestedKey, NestedKey | None]] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        levels = []
        for prefix, _ in done_levels(specs.done):
            trunc = join_key(prefix, TRUNCATED)
            if trunc not in specs.done:
                continue
            term = join_key(prefix, TERMINATED)
            levels.append((trunc, term if term in specs.done else None))
        if not levels:
            raise ValueError(
                "TruncationAsTermination: the env has no 'truncated' flag at any level (its "
                f"done keys: {list(specs.done.keys(True, True))}); nothing is ever truncated"
            )
        self._levels = levels
        return specs

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        # A level whose flags the step left out (the root's, before the done rule fills them
        # from the groups') is the done rule's: it reads done without truncated as terminated.
        for trunc_key, term_key in self._levels:
            trunc = next_tensordict.get(trunc_key, None)
            if trunc is None:
                continue
            if term_key is not None and (term := next_tensordict.get(term_key, None)) is not None:
                next_tensordict.set(term_key, term | trunc)
            next_tensordict.set(trunc_key, torch.zeros_like(trunc))
        return next_tensordict

    def __repr__(self) -> str:
        return "TruncationAsTermination()"


def _spec_in_input_dtype(
    spec: TensorSpec, tensordict: TensorDictBase | None, key: NestedKey
) -> TensorSpec:
    """``spec`` with the dtype of the input's float entry at ``key``: a sum may come back in
    another float dtype (a ``DoubleToFloat`` after ``RewardSum`` hands float32 sums)."""
    value = None if tensordict is None else tensordict.get(key, None)
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != spec.dtype:
        return Unbounded(spec.shape, dtype=value.dtype, device=spec.device)
    return spec


#: Names the env API reads at every level: a transform's new entry may not take them (the done
#: rule, the reset masks, action validation and ``step_mdp`` would read it instead).
_API_NAMES = (NEXT, RESET, MASK, ACTION_MASK, DONE, TERMINATED, TRUNCATED)


def _check_new_key(
    specs: EnvSpecs, key: NestedKey, who: str, role: str, names: Sequence[str]
) -> None:
    """Refuse a transform's output ``key`` (its ``role``, e.g. ``"out_key"``) that an entry of
    ``specs`` holds already, or whose last name is one of ``names`` (see :data:`_API_NAMES`).

    Raises:
        ValueError: naming the key and why.
    """
    label = f"the {role} {key!r}" if role else repr(key)
    taken = [name for name, composite in _named_specs(specs) if key in composite]
    if taken:
        raise ValueError(
            f"{who}: {label} already exists (in the {taken[0]} spec) and would be "
            "overwritten; choose a new key"
        )
    path = key_path(key)
    if path[-1] in names:
        what = f"is {path[-1]!r}" if len(path) == 1 else f"ends in {path[-1]!r}"
        raise ValueError(
            f"{who}: {label} {what}, a name the env API reads (the done rule, the "
            "reset masks, action validation, step_mdp); choose another key"
        )


def _named_specs(specs: EnvSpecs) -> list[tuple[str, Composite]]:
    return [
        ("observation", specs.observation),
        ("state", specs.state),
        ("action", specs.action),
        ("reward", specs.reward),
        ("done", specs.done),
    ]


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
        self._in_keys = None if in_keys is None else check_keys("DoubleToFloat", "in_keys", in_keys)
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
        self.keys = [unravel_key(k) for k in keys]
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
        self.in_keys = check_keys("RenameKeys", "in_keys", in_keys)
        self.out_keys = check_keys("RenameKeys", "out_keys", out_keys)
        if len(self.in_keys) != len(self.out_keys) or not self.in_keys:
            raise ValueError(
                f"RenameKeys needs as many out_keys as in_keys (at least one), got "
                f"{len(self.in_keys)} and {len(self.out_keys)}"
            )
        for key in (*self.in_keys, *self.out_keys):
            _refuse_contract_leaf("RenameKeys", key)
        self._outgoing: list[tuple[NestedKey, NestedKey]] = []
        self._actions: list[tuple[NestedKey, NestedKey]] = []

    def _move(self, composite: Composite, old: NestedKey, new: NestedKey) -> None:
        if new in composite:
            raise ValueError(f"RenameKeys: {new!r} already exists")
        spec = composite.pop(old)
        try:
            composite[new] = spec
        except ValueError as err:  # e.g. into a group of another size: the shapes disagree
            composite[old] = spec
            raise ValueError(f"RenameKeys cannot move {old!r} to {new!r}: {err}") from err
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
            # "mask" and the like may be the point of a renaming; "next" and "_reset" never
            _check_new_key(specs, new, "RenameKeys", "", (NEXT, RESET))
            for composite in (specs.observation, specs.state, specs.reward):
                if old in composite:
                    self._move(composite, old, new)
                    self._outgoing.append((old, new))
                    break
            else:
                if old in specs.action:
                    _refuse_leaving_the_mask(old, new, specs)
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
        # Actions under the inner env's names, and the renamed entries a step input carries
        # (an episode_reward renamed after RewardSum) under the names the transforms before
        # this one read.
        return self._also_under_old_names(tensordict, self._actions + self._outgoing)

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._also_under_old_names(tensordict, self._outgoing)

    @staticmethod
    def _also_under_old_names(
        tensordict: TensorDictBase, pairs: list[tuple[NestedKey, NestedKey]]
    ) -> TensorDictBase:
        """A shallow copy with the entries at the new names also under the old ones."""
        present = [(old, tensordict.get(new, None)) for old, new in pairs]
        present = [(old, value) for old, value in present if value is not None]
        if not present:
            return tensordict
        out = tensordict.clone(False)
        for old, value in present:
            out.set(old, value)
        return out

    def __repr__(self) -> str:
        return f"RenameKeys(in_keys={self.in_keys}, out_keys={self.out_keys})"


def _refuse_leaving_the_mask(old: NestedKey, new: NestedKey, specs: EnvSpecs) -> None:
    """A masked action must stay next to its ``action_mask``: validation and random actions
    look for the mask beside the action, so moving it elsewhere would let masked-out actions
    through (and the mask is never renamed)."""
    parent = key_path(old)[:-1]
    mask_key = join_key(parent, ACTION_MASK)
    if mask_key not in specs.observation or key_path(new)[:-1] == parent:
        return
    raise ValueError(
        f"RenameKeys cannot move the action {old!r} to {new!r}: its action mask {mask_key!r} "
        f"must sit next to it (validation and random actions look for it there); rename it "
        f"within {parent!r}, e.g. to {join_key(parent, key_path(new)[-1])!r}"
    )


class InitTracker(Transform):
    """Flag the first step of each episode: ``"is_init"`` True after a reset, False after a
    step, at every done level (root ``[*B, 1]``, groups ``[*B, n, 1]``). Recurrent policies
    read it to reset their hidden state. A partial reset keeps the input's flags for the envs
    that are not reset (a partial reset whose input has none is refused, as ``StepCounter``
    refuses one without counts).

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
        self._specs: list[TensorSpec] = []

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        self._levels = done_levels(specs.done)
        self._specs = []
        for prefix, _ in self._levels:
            key = join_key(prefix, self.init_key)
            _check_new_key(specs, key, "InitTracker", "init_key", _API_NAMES)
        for prefix, shape in self._levels:
            spec = Categorical(2, shape, dtype=torch.bool, device=specs.observation.device)
            specs.observation[join_key(prefix, self.init_key)] = spec
            self._specs.append(spec)
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        for (prefix, shape), spec in zip(self._levels, self._specs):
            key = join_key(prefix, self.init_key)
            before = _carried_before("InitTracker", tensordict, key, spec, env_mask)
            if before is None or env_mask is None:
                flag = torch.ones(shape, dtype=torch.bool, device=tensordict_reset.device)
            else:  # envs not reset keep their flag (True if they were reset just before)
                flag = reshape_env_mask(env_mask, shape) | before
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
