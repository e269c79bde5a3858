"""Write your own adapter: a simulator of yours as a marlkit env in a few lines.

Two shapes of simulator are covered:

* :func:`from_parallel`: per-agent dicts, the PettingZoo ``ParallelEnv`` protocol
  (``reset(seed) -> (obs, infos)``, ``step(actions) -> (obs, rewards, terminations,
  truncations, infos)``, ``possible_agents``/``agents``). The same machinery as the PettingZoo
  adapter (:class:`~marlkit.adapters._dict_env.DictEnv`): agents that leave, action masks,
  partial resets, seeding. Batches ``num_envs`` instances in a Python loop.
* :func:`from_batched`: a simulator that already steps a whole batch and returns arrays
  ``[num_envs, n_agents, ...]`` per group (NumPy or torch).

Spaces are Gymnasium spaces or marlkit specs, given per agent (no batch dimensions); with
``from_parallel`` they default to the simulator's ``observation_space(agent)`` /
``action_space(agent)``. What the simulator returns is checked: a wrong shape, a missing agent or
a non-finite value raises :class:`SimulatorOutputError` (a ``ValueError``) naming the agent, the
key and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int
from marlkit.adapters._dict_env import (
    DictEnv,
    IllegalActions,
    SimulatorOutputError,
    check_renders,
)
from marlkit.adapters._dict_layout import space_from_spec
from marlkit.adapters._spaces import GIVEN_SPEC, _spaces_of, space_repr, spec_from_space
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike
from marlkit.data.keys import ACTION, DONE, OBSERVATION, REWARD, STATE, TERMINATED, TRUNCATED
from marlkit.data.specs import TensorSpec, format_shape
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import check_on_probe

__all__ = [
    "BatchedEnv",
    "DictEnv",
    "SimulatorOutputError",
    "from_batched",
    "from_parallel",
    "space_from_spec",
]


def _instances(simulator: Any, num_envs: int) -> list[Any]:
    check_int("num_envs", num_envs, low=1)
    if not isinstance(simulator, type) and callable(getattr(simulator, "step", None)):
        if num_envs != 1:
            raise ValueError(
                f"a simulator object makes one env, not num_envs={num_envs}; pass a factory "
                "(a class or a function returning a new simulator) to batch"
            )
        return [simulator]
    if not callable(simulator):
        raise TypeError(
            f"simulator must be a simulator object or a factory, got {type(simulator).__name__}"
        )
    return [simulator() for _ in range(num_envs)]


def from_parallel(
    simulator: Any,
    *,
    num_envs: int = 1,
    group_map: GroupMapLike | None = None,
    observation_spaces: Any = None,
    action_spaces: Any = None,
    state_space: Any = None,
    agents: Sequence[str] | None = None,
    illegal_actions: IllegalActions = "raise",
    render: bool = False,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
) -> DictEnv:
    """A simulator with per-agent dict outputs (PettingZoo-parallel style) as an env.

    Args:
        simulator: an instance (``num_envs=1``) or a factory (a class, a function) called
            ``num_envs`` times. It needs ``reset(seed=None)`` returning ``(observations, infos)``
            and ``step(actions)`` returning ``(observations, rewards, terminations, truncations,
            infos)``, all dicts keyed by agent; ``possible_agents`` (or ``agents=``) and
            ``agents`` (the agents still in the game; optional: without it, the agents with an
            observation that are not done).
        num_envs: the batch ``B = [num_envs]``.
        group_map: see :class:`~marlkit.adapters._dict_env.DictEnv` (default: one group when
            every agent has the same spaces, else by type).
        observation_spaces, action_spaces: one Gymnasium space or marlkit spec for every agent,
            or ``{agent: space_or_spec}``; default ``simulator.observation_space(agent)`` and
            ``simulator.action_space(agent)``. A ``Dict`` with ``"observation"`` and
            ``"action_mask"`` declares ``(group, "action_mask")``, as does an ``"action_mask"``
            in the infos.
        state_space: the space of ``simulator.state()`` (default: ``simulator.state_space``
            when present; ``False``: none).
        agents: agent names when the simulator has no ``possible_agents``.
        illegal_actions: ``"raise"`` or ``"mask"`` (replaced by the first legal action).
        render: ``simulator.render()`` returns ``uint8 [H, W, 3]`` frames.
        seed, device, validate_actions: see :class:`~marlkit.envs.EnvBase`.

    Example:
        >>> env = from_parallel(MySim, num_envs=4, observation_spaces=Unbounded((3,)),
        ...                     action_spaces=Categorical(5))
    """
    options: dict[str, Any] = {
        "group_map": group_map,
        "observation_spaces": observation_spaces,
        "action_spaces": action_spaces,
        "state_space": state_space,
        "agents": agents,
        "illegal_actions": illegal_actions,
        "render": render,
        "device": device,
    }
    if isinstance(simulator, type) or not callable(getattr(simulator, "step", None)):
        check_on_probe(  # a factory: one simulator sizes the batch before it is made
            "from_parallel",
            check_int("num_envs", num_envs, low=1),
            lambda: DictEnv(_instances(simulator, 1), validate_actions=False, **options),
            device=device,
        )
    return DictEnv(
        _instances(simulator, num_envs), validate_actions=validate_actions, seed=seed, **options
    )


# ---------------------------------------------------------------------- batched simulators
def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def _converted(space: Any) -> str | None:
    """Why the values of a Gymnasium ``space`` differ from those of its spec (a ``start``
    offset, dims that the spec flattens), or None where they are the same arrays."""
    spaces = _spaces_of(space)
    if getattr(space, GIVEN_SPEC, None) is not None:
        return None
    if isinstance(space, spaces.Dict):
        reasons = (_converted(s) for s in space.spaces.values())
        return next((r for r in reasons if r is not None), None)
    if isinstance(space, spaces.Tuple):
        return "its entries are a tuple, the spec's a dict keyed '0', '1', ..."
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) and np.any(space.start):
        return f"its values start at {space.start}, the spec's at 0"
    if isinstance(space, spaces.MultiDiscrete) and np.ndim(space.nvec) > 1:
        return f"its values have shape {tuple(space.shape)}, the spec flattens them"
    if isinstance(space, spaces.MultiBinary) and len(space.shape) > 1:
        return f"its values have shape {tuple(space.shape)}, the spec flattens them"
    return None


def _per_agent_spec(value: Any, lead: tuple[int, ...], what: str) -> TensorSpec | Composite:
    """A per-agent space or spec expanded to ``lead`` (``[*B, n]`` or ``[*B]``).

    Raises:
        TypeError: neither a spec nor a space; or a space whose values are not its spec's
            (``from_batched`` passes the simulator's arrays through as they are).
    """
    if isinstance(value, Composite):
        return value.expand(*lead, *value.shape)
    if isinstance(value, TensorSpec):
        return value.expand(*lead, *value.shape)
    try:
        spec = spec_from_space(value, lead)
    except TypeError as err:
        raise TypeError(f"{what} must be a marlkit spec or a Gymnasium space: {err}") from None
    why = _converted(value)
    if why is not None:
        raise TypeError(
            f"{what}: from_batched passes the simulator's arrays through as they are, and the "
            f"values of {space_repr(value)} are not those of its spec {spec!r}: {why}; give the "
            "spec (and convert in the simulator), or use from_parallel, which converts per agent"
        )
    return spec


class BatchedEnv(EnvBase):
    """A simulator that steps a whole batch at once, returning arrays per group.

    The simulator protocol (arrays are NumPy or torch; ``E = num_envs``)::

        reset(seed=None, env_mask=None) -> observations           # or (observations, info)
        step(actions) -> (observations, rewards, terminated, truncated, info)
        state() -> [E, ...]                                        # when state_space is given
        render(env_index) -> uint8 [H, W, 3]                       # when render=True

    ``observations`` is ``{group: [E, n, ...]}`` (a nested dict for Dict spaces), ``actions``
    ``{group: [E, n, ...]}``, ``rewards`` ``{group: [E, n]}`` (or ``[E, n, 1]``);
    ``terminated``/``truncated`` are ``{group: [E, n]}`` or one ``[E]`` array for every agent.
    ``env_mask`` (``[E]`` bool, ``None`` = all) selects the envs to reset; observations of the
    whole batch come back. The episode of an env is over when all its agents are done.

    Args:
        simulator: the simulator object.
        num_envs: its batch size ``E``.
        group_map: ``{group: [agent names]}`` or ``{group: n_agents}`` (names ``group_i``).
        observation_spaces, action_spaces: ``{group: space_or_spec}``, per agent.
        state_space: per env, or ``None`` for no state.
        array_type: what the simulator receives as actions: ``"numpy"`` or ``"torch"``.
        render, seed, device, validate_actions: as for :func:`from_parallel`.
    """

    def __init__(
        self,
        simulator: Any,
        *,
        num_envs: int,
        group_map: Mapping[str, Sequence[str] | int],
        observation_spaces: Mapping[str, Any],
        action_spaces: Mapping[str, Any],
        state_space: Any = None,
        array_type: Literal["numpy", "torch"] = "numpy",
        render: bool = False,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        check_int("num_envs", num_envs, low=1)
        if array_type not in ("numpy", "torch"):
            raise ValueError(f"array_type must be 'numpy' or 'torch', got {array_type!r}")
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.simulator = simulator
        self.num_envs = num_envs
        self.array_type = array_type
        if render:
            check_renders([simulator])
            self.render_modes = ("rgb_array",)
        self.group_map = {
            g: [f"{g}_{i}" for i in range(m)] if isinstance(m, int) else list(m)
            for g, m in group_map.items()
        }
        for name, given in (("observation", observation_spaces), ("action", action_spaces)):
            missing = [g for g in self.group_map if g not in given]
            if missing:
                raise KeyError(f"{name}_spaces has no entry for groups {missing}")
        b = (num_envs,)
        sizes = {g: len(a) for g, a in self.group_map.items()}
        obs, act = Composite(shape=b, device=device), Composite(shape=b, device=device)
        for g, n in sizes.items():
            lead = (*b, n)
            obs[g] = Composite(
                {OBSERVATION: _per_agent_spec(observation_spaces[g], lead, f"observation of {g}")},
                shape=lead,
            )
            act[g] = Composite(
                {ACTION: _per_agent_spec(action_spaces[g], lead, f"action of {g}")}, shape=lead
            )
        self.observation_spec, self.action_spec = obs, act
        state = Composite(shape=b, device=device)
        if state_space is not None:
            state[STATE] = _per_agent_spec(state_space, b, "state_space")
        self.state_spec = state
        self.reward_spec = make_reward_spec(b, sizes, device=device)
        self.done_spec = make_done_spec(b, sizes, device=device)
        self._pending_seed: int | None = None
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ conversions
    def _agent(self, group: str, index: tuple[int, ...]) -> str:
        if len(index) >= 2 and index[1] < len(self.group_map[group]):
            return self.group_map[group][index[1]]
        return "?"

    def _check(self, value: Any, spec: TensorSpec, group: str | None, key: tuple) -> torch.Tensor:
        """``value`` as a tensor of ``spec``, or a SimulatorOutputError naming what is wrong."""
        full = (group, *key) if group else key
        try:
            tensor = _as_tensor(value)
        except (TypeError, ValueError) as err:
            raise SimulatorOutputError(
                f"{full!r}: the simulator returned {type(value).__name__}, not an array ({err})"
            ) from None
        if tensor.shape != spec.shape:
            raise SimulatorOutputError(
                f"{full!r}: the simulator returned shape {format_shape(tensor.shape)}, expected "
                f"{format_shape(spec.shape)} ([num_envs, n_agents, ...] of group {group!r})"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            where = tuple((~torch.isfinite(tensor)).nonzero()[0].tolist())
            agent = self._agent(group, where) if group else "-"
            row = tensor[where[:2]] if group else tensor[where[:1]]
            raise SimulatorOutputError(
                f"{full!r}: non-finite value {tensor[where].item()} for agent {agent!r} "
                f"(env {where[0]}): {row.tolist()}"
            )
        # a copy: the simulator may reuse (or later overwrite) the memory it returned
        out = tensor.to(device=self.device, dtype=spec.dtype, copy=True)
        if out.dtype != tensor.dtype and not out.is_floating_point():
            changed = out.to(tensor.dtype) != tensor.to(self.device)  # 300 wraps to 44 in uint8
            if bool(changed.any()):
                where = tuple(changed.nonzero()[0].tolist())
                agent = self._agent(group, where) if group else "-"
                raise SimulatorOutputError(
                    f"{full!r}: value {tensor[where].item()} for agent {agent!r} (env "
                    f"{where[0]}) does not fit {spec.dtype} exactly (it would wrap or be "
                    "truncated)"
                )
        return out

    def _tree(self, value: Any, spec: Any, group: str, key: tuple) -> Any:
        if isinstance(spec, Composite):
            if not isinstance(value, Mapping):
                raise SimulatorOutputError(
                    f"{(group, *key)!r}: expected a dict with keys {list(spec.keys())}, got "
                    f"{type(value).__name__}"
                )
            missing = [k for k in spec if k not in value]
            if missing:
                raise SimulatorOutputError(f"{(group, *key)!r}: missing entries {missing}")
            return {k: self._tree(value[k], spec[k], group, (*key, k)) for k in spec}
        return self._check(value, spec, group, key)

    def _groups_of(self, values: Any, name: str) -> Mapping[str, Any]:
        if not isinstance(values, Mapping):
            raise SimulatorOutputError(
                f"the simulator's {name} must be a dict keyed by group {list(self.group_map)}, "
                f"got {type(values).__name__}"
            )
        missing = [g for g in self.group_map if g not in values]
        if missing:
            raise SimulatorOutputError(
                f"the simulator's {name} miss groups {missing} (got {list(values)})"
            )
        return values

    def _observations(self, values: Any) -> TensorDict:
        values = self._groups_of(values, "observations")
        e = self.num_envs
        out = TensorDict(batch_size=(e,), device=self.device)
        for g, agents in self.group_map.items():
            spec = self.observation_spec[g, OBSERVATION]
            obs = self._tree(values[g], spec, g, (OBSERVATION,))
            out.set(g, TensorDict({OBSERVATION: obs}, batch_size=(e, len(agents))))
        if STATE in self.state_spec:
            out.set(
                STATE, self._check(self.simulator.state(), self.state_spec[STATE], None, (STATE,))
            )
        return out

    def _flags(self, values: Any, name: str) -> dict[str, torch.Tensor]:
        e = self.num_envs
        if not isinstance(values, Mapping):
            arr = _as_tensor(values)
            if arr.numel() != e:
                raise SimulatorOutputError(
                    f"{name!r}: one flag per env means shape [{e}], got {format_shape(arr.shape)}"
                )
            if arr.dtype != torch.bool and not bool(((arr == 0) | (arr == 1)).all()):
                odd = arr.reshape(-1)[((arr != 0) & (arr != 1)).reshape(-1)][0].item()
                raise SimulatorOutputError(
                    f"{name!r}: flags are bool (or 0 and 1), got {odd!r} ({arr.dtype})"
                )
            flat = arr.reshape(e, 1, 1).to(torch.bool)
            return {g: flat.expand(e, len(a), 1).clone() for g, a in self.group_map.items()}
        values = self._groups_of(values, name)
        out = {}
        for g, agents in self.group_map.items():
            arr = torch.as_tensor(
                np.asarray(values[g]) if not torch.is_tensor(values[g]) else values[g]
            )
            if arr.shape == (e, len(agents)):
                arr = arr.unsqueeze(-1)
            spec = self.done_spec[g, DONE]
            out[g] = self._check(arr, spec, g, (name,))
        return out

    def _actions(self, tensordict: TensorDictBase) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g in self.group_map:
            action = tensordict.get((g, ACTION)).detach()
            out[g] = action.clone() if self.array_type == "torch" else action.cpu().numpy().copy()
        return out

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> int:
        # Given to the simulator's next reset; its instances may take seed .. seed + E - 1.
        self._pending_seed = seed
        return seed + self.num_envs

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        seed, self._pending_seed = self._pending_seed, None
        mask = None if env_mask is None else env_mask.reshape(-1).cpu().numpy()
        out = self.simulator.reset(seed=seed, env_mask=mask)
        if isinstance(out, tuple):
            out = out[0]
        return self._observations(out)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.simulator.step(self._actions(tensordict))
        if not isinstance(out, tuple) or len(out) != 5:
            raise SimulatorOutputError(
                "step() must return (observations, rewards, terminated, truncated, info), got "
                f"{type(out).__name__}"
            )
        obs, rewards, terminated, truncated, _ = out
        td = self._observations(obs)
        rewards = self._groups_of(rewards, "rewards")
        terms, truncs = self._flags(terminated, TERMINATED), self._flags(truncated, TRUNCATED)
        e = self.num_envs
        for g, agents in self.group_map.items():
            reward = rewards[g]
            reward = _as_tensor(reward)
            if reward.shape == (e, len(agents)):
                reward = reward.unsqueeze(-1)
            sub = td.get(g)
            sub.set(REWARD, self._check(reward, self.reward_spec[g, REWARD], g, (REWARD,)))
            sub.set(TERMINATED, terms[g])  # done and the root flags: the done rule
            sub.set(TRUNCATED, truncs[g])
        return td

    def _replay_simulator(self, seed: int, steps: int) -> list[Any]:
        """One run of the raw simulator, for :func:`~marlkit.testing.check_adapter`'s seeding
        diagnosis: ``reset(seed=seed)`` of the whole batch, then ``steps`` steps of actions
        drawn from the action spec by a generator seeded with ``seed``; its observations after
        the reset and its outputs (info left out) after each step. The env must be reset
        afterwards."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        out = self.simulator.reset(seed=seed, env_mask=None)
        trace = [out[0] if isinstance(out, tuple) else out]
        for _ in range(steps):
            out = self.simulator.step(self._actions(self.action_spec.rand(generator=generator)))
            trace.append(out[:4] if isinstance(out, tuple) else out)
        return trace

    def _render(self, env_index: int) -> Any:
        return self.simulator.render(env_index)

    def _close(self) -> None:
        close = getattr(self.simulator, "close", None)
        if callable(close):
            close()


def from_batched(
    simulator: Any,
    *,
    num_envs: int,
    group_map: Mapping[str, Sequence[str] | int],
    observation_spaces: Mapping[str, Any],
    action_spaces: Mapping[str, Any],
    state_space: Any = None,
    array_type: Literal["numpy", "torch"] = "numpy",
    render: bool = False,
    seed: int | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
) -> BatchedEnv:
    """A simulator that steps the whole batch and returns ``[num_envs, n_agents, ...]`` arrays
    per group, as an env (see :class:`BatchedEnv` for the protocol and the arguments)."""
    return BatchedEnv(
        simulator,
        num_envs=num_envs,
        group_map=group_map,
        observation_spaces=observation_spaces,
        action_spaces=action_spaces,
        state_space=state_space,
        array_type=array_type,
        render=render,
        seed=seed,
        device=device,
        validate_actions=validate_actions,
    )
