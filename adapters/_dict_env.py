"""Simulators with per-agent dict outputs as marlkit envs (the PettingZoo-parallel protocol).

This is the machinery behind :class:`marlkit.adapters.pettingzoo.PettingZooEnv` and
:func:`marlkit.adapters.custom.from_parallel`. A simulator instance speaks the PettingZoo
``ParallelEnv`` protocol::

    reset(seed=None) -> (observations, infos)                 # dicts keyed by agent name
    step(actions) -> (observations, rewards, terminations, truncations, infos)
    possible_agents, agents                                   # names; agents = still in the game
    observation_space(agent), action_space(agent)             # Gymnasium spaces (optional here)
    state() (optional), render() (optional), close() (optional)

:class:`DictEnv` holds ``num_envs`` instances and steps them in a Python loop (that is all such
simulators offer), batch ``[num_envs]``. Subclasses change how one instance is reset and stepped
(:meth:`DictEnv._reset_instance` / :meth:`DictEnv._step_instance`, which return a
:class:`StepView`); everything else (specs, conversions, validation of what the simulator
returns, agents that leave, action masks, partial resets, seeding) is shared.

Keys, per group (``n`` agents, ``B = [num_envs]``)::

    (group, "observation")    [*B, n, ...]   zeros for agents not in the game
    (group, "action_mask")    [*B, n, A] bool, when the simulator masks Discrete actions
    (group, "mask")           [*B, n] bool   the agent is in the game (can act next)
    (group, "acting")         [*B, n] bool   turn-based (AEC) envs only: whose turn it is
    (group, "action")         [*B, n] or [*B, n, ...]
    ("next", group, "reward") [*B, n, 1]     zero for agents not in the game
    ("next", group, "done"|"terminated"|"truncated")  [*B, n, 1]; true for agents not in the game
    "state"                   [*B, ...]      when the simulator has ``state()``
    ("next", "done"|...)      [*B, 1]        the episode is over: no agent left (or all done);
                                             by the done rule of :mod:`marlkit.envs.common`
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.adapters._dict_layout import (
    Arrays,
    Frame,
    GroupLayout,
    Leaf,
    as_space,
    describe,
    gym_spaces,
    observation_leaves,
    space_from_spec,
)
from marlkit.adapters._spaces import (
    SimulatorOutputError,
    changes_on_cast,
    check_seed,
    numpy_dtype,
    space_repr,
    spec_from_space,
    to_space,
)
from marlkit.data._fast import unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import (
    ACTION,
    ACTION_MASK,
    MASK,
    REWARD,
    STATE,
    TERMINATED,
    TRUNCATED,
)
from marlkit.data.specs import Binary, Categorical
from marlkit.envs import (
    EnvBase,
    IllegalActions,
    InvalidActionError,
    make_done_spec,
    make_reward_spec,
)

__all__ = [
    "ACTING",
    "DictEnv",
    "IllegalActions",
    "SimulatorOutputError",
    "StepView",
    "check_renders",
    "space_from_spec",
]

#: Key of the turn flag of turn-based (AEC) envs: ``(group, "acting")`` ``[*B, n]`` bool.
ACTING = "acting"


@dataclass
class StepView:
    """What one simulator instance reports after a reset or a step (dicts keyed by agent).

    Attributes:
        observations: observations of the agents in the game (and, after a step, of the agents
            that have just left, when the simulator still gives them).
        agents: the agents still in the game afterwards, in the simulator's order.
        rewards, terminations, truncations: after a step, for every agent that was in the game
            before it; ``None`` after a reset.
        infos: per-agent info dicts (read for ``"action_mask"``).
        acting: turn-based envs: the agent whose turn it is (``None`` otherwise).
    """

    observations: Mapping[str, Any]
    agents: Sequence[str]
    rewards: Mapping[str, Any] | None = None
    terminations: Mapping[str, Any] | None = None
    truncations: Mapping[str, Any] | None = None
    infos: Mapping[str, Any] | None = None
    acting: str | None = None


def check_renders(simulators: Sequence[Any]) -> None:
    """Refuse ``render=True`` for simulators without a ``render()`` method, when the env is
    built (a training script would otherwise fail at its first evaluation video).

    Raises:
        TypeError: naming the simulator's class and the instances without one.
    """
    missing = [i for i, sim in enumerate(simulators) if not callable(getattr(sim, "render", None))]
    if missing:
        raise TypeError(
            f"render=True, but {type(simulators[missing[0]]).__name__} (instances {missing}) "
            "has no render() method returning an RGB frame; add one or leave render off"
        )


def _nested_item(values: list[list[Any]], e: int, i: int) -> Any:
    return values[e][i]


def _array_item(values: np.ndarray, e: int, i: int) -> Any:
    return values[e, i]


def _space_item(space: Any, values: torch.Tensor, e: int, i: int) -> Any:
    return to_space(space, values[e, i])


# ---------------------------------------------------------------------- the env
class DictEnv(EnvBase):
    """A batch of per-agent dict simulators (PettingZoo ``ParallelEnv`` protocol) as an env.

    Args:
        simulators: one instance per env of the batch (``B = [len(simulators)]``).
        group_map: ``"agents"``, ``"per_agent"``, ``"by_type"``, an explicit
            ``{group: [agents]}``, or ``None``: ``"agents"`` when every agent has the same
            spaces, else ``"by_type"``.
        observation_spaces, action_spaces: per agent: ``None`` (ask
            ``simulator.observation_space(agent)``), one space (or per-agent marlkit spec) for
            every agent, or ``{agent: space_or_spec}``.
        state_space: the space (or spec) of ``simulator.state()``; ``None`` takes
            ``simulator.state_space`` when there is one; ``False`` declares no state.
        agents: the agent names; default ``simulator.possible_agents``.
        illegal_actions: what happens to an action its ``action_mask`` forbids: ``"raise"``
            (an :class:`~marlkit.envs.InvalidActionError`, before any simulator is touched) or
            ``"mask"`` (replaced by the agent's first legal action).
        render: the simulators' ``render()`` returns RGB frames (declares ``"rgb_array"``).
        device, validate_actions, seed: see :class:`~marlkit.envs.EnvBase`; ``seed`` is given
            to instance ``i`` as ``seed + i`` at its next reset (``set_seed`` returns
            ``seed + num_envs``).
    """

    turn_based = False  # AEC subclasses: one agent acts per step; declares (group, "acting")

    def __init__(
        self,
        simulators: Sequence[Any],
        *,
        group_map: GroupMapLike | None = None,
        observation_spaces: Any = None,
        action_spaces: Any = None,
        state_space: Any = None,
        agents: Sequence[str] | None = None,
        illegal_actions: IllegalActions = "raise",
        render: bool = False,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        seed: int | None = None,
    ):
        sims = list(simulators)
        if not sims:
            raise ValueError("DictEnv needs at least one simulator instance")
        if illegal_actions not in ("raise", "mask"):
            raise ValueError(f"illegal_actions must be 'raise' or 'mask', got {illegal_actions!r}")
        super().__init__(batch_size=(len(sims),), device=device, validate_actions=validate_actions)
        self._sims = sims
        self.num_envs = len(sims)
        self.illegal_actions: IllegalActions = illegal_actions
        if render:
            check_renders(sims)
            self.render_modes = ("rgb_array",)
        names = self._agent_names(agents)
        self.agent_names = names
        obs_spaces = self._per_agent(observation_spaces, names, "observation")
        act_spaces = self._per_agent(action_spaces, names, "action")
        if group_map is None:
            same = all(obs_spaces[a] == obs_spaces[names[0]] for a in names) and all(
                act_spaces[a] == act_spaces[names[0]] for a in names
            )
            group_map = "agents" if same else "by_type"
        self.group_map = make_group_map(names, group_map)
        first = self._reset_instance(0, None)  # probes action masks in infos and the state
        # The probe is the adapter's, not the user's: every env waits for a reset() (the first
        # one resets them all, seeded), and step() before it is refused for each.
        self._started = [False] * self.num_envs
        self._layouts = {
            g: self._layout(g, members, obs_spaces, act_spaces, first)
            for g, members in self.group_map.items()
        }
        #: Agents with Discrete actions and no mask: masks are declared by the first reset's
        #: infos, so one that shows up later in step infos is refused, not ignored.
        self._unmasked = [
            a
            for lay in self._layouts.values()
            if lay.n_actions is not None and not lay.masked
            for a in lay.agents
        ]
        self._slot = {
            a: (g, i) for g, lay in self._layouts.items() for i, a in enumerate(lay.agents)
        }
        self._state_space = self._resolve_state_space(state_space)
        self._build_specs()
        self._init_buffers()
        self._pending_seeds: list[int | None] = [None] * self.num_envs
        self._write_reset(0, first, self._current)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    def _agent_names(self, agents: Sequence[str] | None) -> list[str]:
        if agents is None:
            agents = getattr(self._sims[0], "possible_agents", None)
        if agents is None:
            agents = getattr(self._sims[0], "agents", None)
        if agents is None:
            raise TypeError(
                f"cannot tell the agents of {type(self._sims[0]).__name__}: it has neither "
                "possible_agents nor agents; pass agents=[...]"
            )
        names = list(agents)
        if not names:
            raise ValueError("the simulator declares no agents (possible_agents is empty)")
        return names

    def _per_agent(self, given: Any, names: list[str], kind: str) -> dict[str, Any]:
        sim = self._sims[0]
        if given is None:
            method = getattr(sim, f"{kind}_space", None)
            if method is None:
                raise TypeError(
                    f"{type(sim).__name__} has no {kind}_space(agent) method; pass "
                    f"{kind}_spaces= (a Gymnasium space or marlkit spec, or a dict per agent)"
                )
            return {a: as_space(method(a), f"{kind}_space({a!r})") for a in names}
        if isinstance(given, Mapping) and not isinstance(given, Composite):
            missing = [a for a in names if a not in given]
            if missing:
                raise KeyError(f"{kind}_spaces has no entry for agents {missing}")
            return {a: as_space(given[a], f"{kind}_spaces[{a!r}]") for a in names}
        space = as_space(given, f"{kind}_spaces")
        return dict.fromkeys(names, space)

    def _layout(
        self,
        group: str,
        members: list[str],
        obs_spaces: dict[str, Any],
        act_spaces: dict[str, Any],
        probe: StepView,
    ) -> GroupLayout:
        head = members[0]
        for kind, spaces_ in (("observation", obs_spaces), ("action", act_spaces)):
            for a in members[1:]:
                # As spaces and as specs: one made from a spec declares that spec's type/dtype.
                if spaces_[a] != spaces_[head] or spec_from_space(spaces_[a]) != spec_from_space(
                    spaces_[head]
                ):
                    raise ValueError(
                        f"agents {head!r} and {a!r} of group {group!r} have different {kind} "
                        f"spaces ({space_repr(spaces_[head])} vs {space_repr(spaces_[a])}); a "
                        "group stacks agents with equal spaces: use group_map='by_type', "
                        "'per_agent' or an explicit map"
                    )
        leaves, mask_path = observation_leaves(obs_spaces[head])
        act = act_spaces[head]
        discrete = isinstance(act, gym_spaces().Discrete)
        masked = discrete and (
            mask_path is not None
            or any(
                isinstance((probe.infos or {}).get(a), Mapping)
                and ACTION_MASK in (probe.infos or {})[a]
                for a in members
            )
        )
        return GroupLayout(
            agents=list(members),
            leaves=leaves,
            mask_path=mask_path,
            action_space=act,
            n_actions=int(act.n) if discrete else None,
            action_start=int(act.start) if discrete else 0,
            masked=masked,
            turn_based=self.turn_based,
            box=isinstance(act, gym_spaces().Box),
            batch=torch.Size((self.num_envs, len(members))),
        )

    def _resolve_state_space(self, state_space: Any) -> Any:
        if state_space is False:
            return None
        sim = self._sims[0]
        if state_space is None:
            state_space = getattr(sim, "state_space", None)
            if state_space is None or not callable(getattr(sim, "state", None)):
                return None
            try:
                sim.state()
            except NotImplementedError:
                return None
        space = as_space(state_space, "state_space")
        if not isinstance(space, gym_spaces().Box):
            raise TypeError(f"the state space must be a Box (one array per env), got {space}")
        return space

    def _build_specs(self) -> None:
        b, dev = tuple(self.batch_size), self.device
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        sizes = {g: len(lay.agents) for g, lay in self._layouts.items()}
        flag = Categorical(2, (), dtype=torch.bool, device=dev)
        for g, lay in self._layouts.items():
            lead = (*b, sizes[g])
            group = Composite(shape=lead, device=dev)
            for leaf in lay.leaves:
                group[leaf.key] = spec_from_space(leaf.space, lead, device=dev)
            group[MASK] = flag.expand(lead)
            if lay.masked:
                n = lay.n_actions or 0
                group[ACTION_MASK] = Binary(n, (*lead, n), dtype=torch.bool, device=dev)
            if self.turn_based:
                group[ACTING] = flag.expand(lead)
            obs[g] = group
            act[g] = Composite(
                {ACTION: spec_from_space(lay.action_space, lead, device=dev)},
                shape=lead,
                device=dev,
            )
        self.observation_spec = obs
        self.action_spec = act
        state = Composite(shape=b, device=dev)
        if self._state_space is not None:
            state[STATE] = spec_from_space(self._state_space, b, device=dev)
        self.state_spec = state
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

    def _init_buffers(self) -> None:
        e = self.num_envs
        if self._state_space is not None:
            spec = self.state_spec[STATE]
            self._state_shape = tuple(spec.shape)
            self._state_dtype = numpy_dtype(spec.dtype)
        self._current = self._blank()
        self._term = {g: np.zeros((e, len(lay.agents)), bool) for g, lay in self._layouts.items()}
        self._trunc = {g: np.zeros((e, len(lay.agents)), bool) for g, lay in self._layouts.items()}
        self._over = np.zeros(e, bool)
        self._present: list[frozenset[str]] = [frozenset()] * e
        self._root_batch = torch.Size((e,))

    def _blank(self) -> Frame:
        e = self.num_envs
        groups = {g: Arrays.blank(lay, e) for g, lay in self._layouts.items()}
        state = None
        if self._state_space is not None:
            state = np.zeros(self._state_shape, self._state_dtype)
        return Frame(groups, state)

    # ------------------------------------------------------------------ per-instance hooks
    def _reset_instance(self, index: int, seed: int | None) -> StepView:
        """Reset simulator ``index`` (with ``seed`` when not ``None``) and report it."""
        sim = self._sims[index]
        out = sim.reset(seed=seed)
        if isinstance(out, tuple) and len(out) == 2:
            observations, infos = out
        else:
            observations, infos = out, {}
        if not isinstance(observations, Mapping):
            raise SimulatorOutputError(
                f"reset() of env {index} must return (observations, infos) with observations a "
                f"dict keyed by agent, got {type(observations).__name__}: {describe(observations)}"
            )
        agents = getattr(sim, "agents", None)
        return StepView(observations, list(observations if agents is None else agents), infos=infos)

    def _step_instance(self, index: int, actions: dict[str, Any]) -> StepView:
        """Apply ``actions`` (``{agent: action}`` for the agents in the game) to ``index``."""
        sim = self._sims[index]
        out = sim.step(actions)
        if not isinstance(out, tuple) or len(out) != 5:
            raise SimulatorOutputError(
                f"step() of env {index} must return 5 dicts (observations, rewards, "
                f"terminations, truncations, infos), got {describe(out)}"
            )
        obs, rewards, terms, truncs, infos = out
        for name, value in (
            ("observations", obs),
            ("rewards", rewards),
            ("terminations", terms),
            ("truncations", truncs),
        ):
            if type(value) is not dict and not isinstance(value, Mapping):
                raise SimulatorOutputError(
                    f"step() of env {index}: {name} must be a dict keyed by agent, got "
                    f"{type(value).__name__}: {describe(value)}"
                )
        agents = getattr(sim, "agents", None)
        if agents is None:  # no agents attribute: those with an observation and not done
            agents = [a for a in obs if not (terms.get(a) or truncs.get(a))]
        return StepView(obs, list(agents), rewards, terms, truncs, infos)

    def _state_of(self, index: int) -> Any:
        return self._sims[index].state()

    # ------------------------------------------------------------------ writing outputs
    def _write_reset(self, e: int, view: StepView, frame: Frame) -> None:
        present = self._check_agents(e, view.agents, "reset()", view.observations)
        for g, lay in self._layouts.items():
            arrays = frame.groups[g]
            arrays.mask[e] = False
            self._trunc[g][e] = False
            for i, a in enumerate(lay.agents):
                # not in the game from the start: done from the first step on
                self._term[g][e, i] = a not in present
                if a in present:
                    arrays.mask[e, i] = True
                    self._write_obs(arrays, lay, e, i, a, view, "reset()", required=True)
                else:
                    arrays.zero_agent(e, i)
        self._write_turn(frame, e, view)
        self._write_state(frame, e)
        self._present[e] = present
        self._over[e] = False

    def _check_agents(
        self, e: int, agents: Sequence[str], where: str, observations: Mapping[str, Any]
    ) -> frozenset[str]:
        """The agents in the game, all known; observations of an agent nobody declared are
        refused too (they would be dropped without a word)."""
        present = frozenset(agents)
        if not present <= self._slot.keys():
            raise SimulatorOutputError(
                f"{where} of env {e}: unknown agents {sorted(present - self._slot.keys())} in "
                f"the game; the agents are {self.agent_names}"
            )
        if not observations.keys() <= self._slot.keys():
            unknown = sorted(map(str, observations.keys() - self._slot.keys()))
            raise SimulatorOutputError(
                f"{where} of env {e}: observations of unknown agents {unknown}; the agents are "
                f"{self.agent_names}"
            )
        return present

    def _write_obs(
        self,
        arrays: Arrays,
        lay: GroupLayout,
        e: int,
        i: int,
        agent: str,
        view: StepView,
        where: str,
        required: bool,
    ) -> None:
        value = view.observations.get(agent, None)
        if value is None:
            if required:
                raise SimulatorOutputError(
                    f"{where} of env {e}: no observation for agent {agent!r}, which is in the "
                    f"game; observations came for {sorted(view.observations)}"
                )
            arrays.zero_agent(e, i)
            return
        if lay.simple:
            leaf = lay.leaves[0]
            if getattr(value, "shape", None) != leaf.value_shape:
                self._bad_shape(np.asarray(value), leaf, agent, e, where)
            self._store(arrays.obs[0], e, i, value, leaf, agent, where)
        else:
            for leaf, target in zip(lay.leaves, arrays.obs):
                arr = np.asarray(self._dig(value, leaf.path, agent, e, where))
                if arr.shape != leaf.value_shape:
                    self._bad_shape(arr, leaf, agent, e, where)
                if leaf.store_shape != leaf.value_shape:
                    arr = arr.reshape(leaf.store_shape)
                if leaf.start is not None:
                    arr = arr - leaf.start
                self._store(target, e, i, arr, leaf, agent, where)
        if lay.masked:
            self._write_action_mask(arrays, lay, e, i, agent, value, view)

    @staticmethod
    def _bad_shape(arr: np.ndarray, leaf: Leaf, agent: str, e: int, where: str) -> None:
        if arr.shape == leaf.value_shape:
            return
        raise SimulatorOutputError(
            f"{where} of env {e}: the observation of agent {agent!r} at key {leaf.key!r} has "
            f"shape {list(arr.shape)}, expected {list(leaf.value_shape)} from its "
            f"{space_repr(leaf.space)}; value: {describe(arr)}"
        )

    @staticmethod
    def _store(
        target: np.ndarray, e: int, i: int, value: Any, leaf: Leaf, agent: str, where: str
    ) -> None:
        if target.dtype.kind in "biu" and changes_on_cast(np.asarray(value), target.dtype):
            raise SimulatorOutputError(
                f"{where} of env {e}: the observation of agent {agent!r} at key {leaf.key!r} "
                f"holds values {leaf.dtype} cannot hold exactly (they would wrap or be "
                f"truncated): {describe(value)}"
            )
        try:
            target[e, i] = value
        except (TypeError, ValueError) as err:
            raise SimulatorOutputError(
                f"{where} of env {e}: the observation of agent {agent!r} at key {leaf.key!r} is "
                f"not {leaf.dtype}: {describe(value)} ({err})"
            ) from None

    @staticmethod
    def _dig(value: Any, path: tuple[Any, ...], agent: str, e: int, where: str) -> Any:
        for part in path:
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                raise SimulatorOutputError(
                    f"{where} of env {e}: the observation of agent {agent!r} has no entry "
                    f"{part!r} (expected from its space); value: {describe(value)}"
                ) from None
        return value

    def _write_action_mask(
        self,
        arrays: Arrays,
        lay: GroupLayout,
        e: int,
        i: int,
        agent: str,
        value: Any,
        view: StepView,
    ) -> None:
        """Allowed actions: the simulator's mask for the agents that can act (the acting agent
        in turn-based envs); every action for the others, whose action is ignored."""
        row = arrays.action_mask[e, i]  # type: ignore[index]
        row[:] = True
        if lay.turn_based and agent != view.acting:
            return
        mask = None
        if lay.mask_path is not None:
            mask = self._dig(value, lay.mask_path, agent, e, "action mask")
        else:
            info = (view.infos or {}).get(agent)
            if isinstance(info, Mapping):
                mask = info.get(ACTION_MASK)
        if mask is None:
            return
        arr = np.asarray(mask)
        if arr.shape != (lay.n_actions,):
            raise SimulatorOutputError(
                f"env {e}: the action mask of agent {agent!r} has shape {list(arr.shape)}, "
                f"expected [{lay.n_actions}]; value: {describe(arr)}"
            )
        allowed = arr.astype(bool)
        if allowed.any():  # a mask that allows nothing would leave no action to take
            row[:] = allowed

    def _write_turn(self, frame: Frame, e: int, view: StepView) -> None:
        if not self.turn_based:
            return
        for arrays in frame.groups.values():
            arrays.acting[e] = False  # type: ignore[index]
        if view.acting is not None:
            slot = self._slot.get(view.acting)
            if slot is None:
                raise SimulatorOutputError(
                    f"env {e}: the acting agent {view.acting!r} is not one of {self.agent_names}"
                )
            frame.groups[slot[0]].acting[e, slot[1]] = True  # type: ignore[index]

    def _write_state(self, frame: Frame, e: int) -> None:
        if frame.state is None:
            return
        arr = np.asarray(self._state_of(e))
        if arr.shape != frame.state.shape[1:]:
            raise SimulatorOutputError(
                f"env {e}: state() has shape {list(arr.shape)}, expected "
                f"{list(frame.state.shape[1:])} from the state space; value: {describe(arr)}"
            )
        frame.state[e] = arr

    def _write_step(
        self, e: int, view: StepView, frame: Frame, rewards: dict[str, np.ndarray]
    ) -> None:
        before = self._present[e]
        present = self._check_agents(e, view.agents, "step()", view.observations)
        for g, lay in self._layouts.items():
            term, trunc, arrays, reward = self._term[g], self._trunc[g], frame.groups[g], rewards[g]
            for i, a in enumerate(lay.agents):
                if a in before:
                    r = self._scalar(view.rewards, "rewards", a, e)
                    if not math.isfinite(r):
                        raise SimulatorOutputError(
                            f"step() of env {e}: the reward of agent {a!r} at key "
                            f"{(g, REWARD)!r} is not finite: {r}"
                        )
                    reward[e, i, 0] = r
                    t = bool(self._scalar(view.terminations, "terminations", a, e))
                    u = bool(self._scalar(view.truncations, "truncations", a, e))
                    if a not in present:
                        t = t or not u  # left the game without a flag: over for this agent
                    term[e, i], trunc[e, i] = t, u
                elif a in present:  # joined the game during the episode
                    term[e, i] = trunc[e, i] = False
                if a in present:
                    arrays.mask[e, i] = True
                    if not (lay.simple and self._store_simple(arrays, lay, e, i, a, view)):
                        self._write_obs(arrays, lay, e, i, a, view, "step()", required=True)
                elif a in before:  # its last transition: the final observation when given
                    self._write_obs(arrays, lay, e, i, a, view, "step()", required=False)
                    if arrays.action_mask is not None:
                        arrays.action_mask[e, i] = True
        if self._unmasked and view.infos:
            self._refuse_undeclared_masks(e, view.infos)
        self._write_turn(frame, e, view)
        self._write_state(frame, e)
        over = True
        for a in present:
            g, i = self._slot[a]
            over = over and bool(self._term[g][e, i] or self._trunc[g][e, i])
        self._present[e] = present
        self._over[e] = over

    def _refuse_undeclared_masks(self, e: int, infos: Mapping[str, Any]) -> None:
        for a in self._unmasked:
            info = infos.get(a)
            if isinstance(info, Mapping) and ACTION_MASK in info:
                raise SimulatorOutputError(
                    f"step() of env {e}: the infos of agent {a!r} carry an {ACTION_MASK!r}, but "
                    "the first reset's infos did not, so the env declared no action mask and "
                    "would let forbidden actions through; return the mask from reset() too"
                )

    @staticmethod
    def _store_simple(
        arrays: Arrays, lay: GroupLayout, e: int, i: int, agent: str, view: StepView
    ) -> bool:
        """The fast path: an array of the right shape, stored as is; ``False`` for anything
        else (then the general path converts it or says what is wrong)."""
        value = view.observations.get(agent)
        if getattr(value, "shape", None) != lay.leaves[0].value_shape or lay.masked:
            return False
        target = arrays.obs[0]
        if target.dtype.kind in "biu" and getattr(value, "dtype", None) != target.dtype:
            return False  # the general path checks that the values fit the integer dtype
        try:
            target[e, i] = value
        except (TypeError, ValueError):
            return False
        return True

    @staticmethod
    def _scalar(values: Mapping[str, Any] | None, name: str, agent: str, e: int) -> float:
        try:
            return float(values[agent])  # type: ignore[index]
        except KeyError:
            raise SimulatorOutputError(
                f"step() of env {e}: no {name} entry for agent {agent!r}, which was in the game "
                f"before the step; {name} came for {sorted(values or {})}"
            ) from None
        except (TypeError, ValueError):
            raise SimulatorOutputError(
                f"step() of env {e}: {name} of agent {agent!r} is not a number: "
                f"{describe((values or {}).get(agent))}"
            ) from None

    def _check_finite(self, frame: Frame, where: str) -> None:
        """A SimulatorOutputError naming the call (``"reset()"``, ``"step()"``), env, agent, key
        and value of a non-finite observation or state (rewards are checked as they are read)."""
        for g, lay in self._layouts.items():
            for leaf, arr in zip(lay.leaves, frame.groups[g].obs):
                # one sum is the fast check; inf - inf or an overflow sends us to the exact one
                if not leaf.floating or math.isfinite(arr.sum()) or np.isfinite(arr).all():
                    continue
                e, i = (int(x) for x in np.argwhere(~np.isfinite(arr))[0][:2])
                raise SimulatorOutputError(
                    f"{where} of env {e}: the observation of agent {lay.agents[i]!r} at key "
                    f"{(g, *leaf.key)!r} is not finite: {describe(arr[e, i])}"
                )
        state = frame.state
        if state is not None and state.dtype.kind == "f" and not math.isfinite(state.sum()):
            if np.isfinite(state).all():
                return
            e = int(np.argwhere(~np.isfinite(state))[0][0])
            raise SimulatorOutputError(
                f"{where} of env {e}: state() holds a non-finite value: {describe(state[e])}"
            )

    # ------------------------------------------------------------------ output TensorDicts
    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(arr).to(self.device)

    def _to_td(self, frame: Frame, step: dict[str, dict[str, np.ndarray]] | None) -> TensorDict:
        """The output TensorDict; ``step`` holds per group (and ``""`` for the root) rewards and
        done flags. Every array is fresh, so the tensors can be handed out without copies."""
        tensor = torch.from_numpy if self.device.type == "cpu" else self._tensor
        root: dict[str, Any] = {}
        for g, lay in self._layouts.items():
            arrays = frame.groups[g]
            entries: dict[str, Any] = {}
            for leaf, arr in zip(lay.leaves, arrays.obs):
                node = entries
                for part in leaf.key[:-1]:
                    node = node.setdefault(part, {})
                node[leaf.key[-1]] = tensor(arr)
            entries[MASK] = tensor(arrays.mask)
            if arrays.action_mask is not None:
                entries[ACTION_MASK] = tensor(arrays.action_mask)
            if arrays.acting is not None:
                entries[ACTING] = tensor(arrays.acting)
            if step is not None:
                for k, v in step[g].items():
                    entries[k] = tensor(v)
            root[g] = self._td(entries, lay.batch, flat=lay.flat)
        if frame.state is not None:
            root[STATE] = tensor(frame.state)
        if step is not None:
            for k, v in step[""].items():
                root[k] = tensor(v)
        return self._td(root, self._root_batch, flat=True)

    def _td(self, entries: dict[str, Any], batch: torch.Size, flat: bool) -> TensorDict:
        """A TensorDict of entries whose shapes are right by construction (no checks)."""
        return unchecked_tensordict(entries, batch, self.device, nested=not flat)

    # ------------------------------------------------------------------ EnvBase hooks
    def _set_seed(self, seed: int) -> int:
        check_seed(seed, "the simulator")  # before anything is seeded: a refusal changes nothing
        for e, sim in enumerate(self._sims):
            space_of = getattr(sim, "action_space", None)
            if not callable(space_of):
                continue
            for a in self.agent_names:
                try:
                    space_of(a).seed(seed + e)
                except (AttributeError, KeyError, TypeError):
                    break
        self._pending_seeds = [seed + e for e in range(self.num_envs)]
        return seed + self.num_envs

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None or not all(self._started):
            # The first reset resets every env, whatever the mask: an env never reset has no
            # episode to keep (as the Gymnasium adapter does).
            indices = list(range(self.num_envs))
            frame = self._blank()
        else:
            indices = env_mask.reshape(-1).nonzero().reshape(-1).tolist()
            frame = self._current.copy()
        self._fresh_flags()
        for e in indices:
            seed, self._pending_seeds[e] = self._pending_seeds[e], None
            self._write_reset(e, self._reset_instance(e, seed), frame)
            self._started[e] = True
        self._check_finite(frame, "reset()")
        self._current = frame
        return self._to_td(frame, None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not all(self._started):
            idle = [e for e, s in enumerate(self._started) if not s]
            what = f"env {idle[0]} was" if len(idle) == 1 else f"envs {idle} were"
            raise RuntimeError(f"{what} never reset: call reset() before step()")
        decoded = self._decode_actions(tensordict)
        frame = self._blank()
        rewards = {g: np.zeros((*lay.batch, 1), np.float32) for g, lay in self._layouts.items()}
        self._fresh_flags()  # the flags handed out last time stay as they were
        slot = self._slot
        for e in range(self.num_envs):
            if self._over[e]:  # finished and not reset: nothing moves, everyone is done
                if frame.state is not None:
                    frame.state[e] = self._current.state[e]  # type: ignore[index]
                continue
            actions = {a: decoded[slot[a][0]](e, slot[a][1]) for a in self._present[e]}
            self._write_step(e, self._step_instance(e, actions), frame, rewards)
        self._check_finite(frame, "step()")
        self._current = frame
        # Per-agent flags only: done and the root flags follow from them by the done rule
        # (an env is over when every agent is done, absent ones included).
        step: dict[str, dict[str, np.ndarray]] = {}
        for g in self._layouts:
            term, trunc = self._term[g][..., None], self._trunc[g][..., None]
            step[g] = {REWARD: rewards[g], TERMINATED: term, TRUNCATED: trunc}
        step[""] = {}
        return self._to_td(frame, step)

    def _fresh_flags(self) -> None:
        """Copy the done-flag arrays before writing: earlier outputs share their memory."""
        self._term = {g: t.copy() for g, t in self._term.items()}
        self._trunc = {g: t.copy() for g, t in self._trunc.items()}
        self._over = self._over.copy()

    # ------------------------------------------------------------------ actions
    def _decode_actions(self, tensordict: TensorDictBase) -> dict[str, Callable[[int, int], Any]]:
        """Per group, ``fn(env, agent_index)`` giving the simulator's action; illegal actions
        are refused (``"raise"``) or replaced (``"mask"``) first, for every env at once."""
        out: dict[str, Callable[[int, int], Any]] = {}
        for g, lay in self._layouts.items():
            action = tensordict.get((g, ACTION))
            space = lay.action_space
            if lay.n_actions is not None:
                arr = action.numpy(force=True)
                if lay.masked:  # against the env's own masks, whatever the input carries
                    arr = self._legal(g, lay, arr.astype(np.int64, copy=False))
                values = (arr + lay.action_start).tolist() if lay.action_start else arr.tolist()
                out[g] = functools.partial(_nested_item, values)
            elif lay.box:
                arr = np.array(action.numpy(force=True), dtype=space.dtype)
                out[g] = functools.partial(_array_item, arr)
            else:  # MultiDiscrete, MultiBinary, Dict, Tuple: the general conversion
                value = action.detach().cpu().clone()
                out[g] = functools.partial(_space_item, space, value)
        return out

    def _legal(self, g: str, lay: GroupLayout, arr: np.ndarray) -> np.ndarray:
        """``arr`` ``[E, n]`` with illegal actions of agents that act refused or replaced."""
        arrays = self._current.groups[g]
        mask = arrays.action_mask
        assert mask is not None  # lay.masked
        live = arrays.mask & ~self._over[:, None]
        if arrays.acting is not None:
            live &= arrays.acting
        n = lay.n_actions or 0
        index = np.clip(arr, 0, n - 1)[..., None]
        illegal = live & ~(np.take_along_axis(mask, index, -1)[..., 0] & (arr >= 0) & (arr < n))
        if not illegal.any():
            return arr
        if self.illegal_actions == "mask":
            return np.where(illegal, mask.argmax(-1), arr)
        e, i = (int(x) for x in np.argwhere(illegal)[0])
        raise InvalidActionError(
            f"step(): action {int(arr[e, i])} of agent {lay.agents[i]!r} (env {e}) at "
            f"{(g, ACTION)!r} is illegal: its action mask allows "
            f"{np.flatnonzero(mask[e, i]).tolist()} (illegal_actions='mask' replaces illegal "
            "actions by a legal one)"
        )

    # ------------------------------------------------------------------ rendering, closing
    def _render(self, env_index: int) -> Any:
        if not self._started[env_index]:  # the simulator's own error would be its assert
            raise RuntimeError(f"{type(self).__name__}: call reset() before render()")
        return self._sims[env_index].render()

    def _close(self) -> None:
        for sim in self._sims:
            close = getattr(sim, "close", None)
            if callable(close):
                close()

    @property
    def simulators(self) -> list[Any]:
        """The simulator instances, one per env of the batch (read them, do not step them)."""
        return list(self._sims)
