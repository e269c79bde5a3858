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
:class:`~marlkit.adapters._dict_writer.StepView`); everything else (specs, conversions,
validation of what the simulator returns, agents that leave, action masks, partial resets,
seeding) is shared. What one instance reports is checked and written into the batch's arrays by
:class:`~marlkit.adapters._dict_writer.FrameWriter`.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.adapters._dict_layout import (
    Arrays,
    Frame,
    GroupLayout,
    as_space,
    describe,
    gym_spaces,
    observation_leaves,
)
from marlkit.adapters._dict_writer import FrameWriter, StepView
from marlkit.adapters._spaces import (
    SimulatorOutputError,
    check_seed,
    numpy_dtype,
    space_repr,
    spec_from_space,
    to_space,
)
from marlkit.data._fast import get_entry, unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import (
    ACTING,
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

__all__ = ["DictEnv", "IllegalActions", "SimulatorOutputError", "check_renders"]


def check_renders(simulators: Sequence[Any]) -> None:
    """Refuse ``render=True`` for simulators without a ``render()`` method, when the env is
    built (a training script would otherwise fail at its first evaluation video).

    Raises:
        TypeError: naming the simulator's class and the instances without one.
    """
    missing = [
        index for index, sim in enumerate(simulators) if not callable(getattr(sim, "render", None))
    ]
    if missing:
        raise TypeError(
            f"render=True, but {type(simulators[missing[0]]).__name__} (instances {missing}) "
            "has no render() method returning an RGB frame; add one or leave render off"
        )


# One agent's action for its simulator, from a group's actions ``[E, n, ...]``.
def _action_from_lists(actions: list[list[Any]], env_index: int, agent_index: int) -> Any:
    return actions[env_index][agent_index]


def _action_from_array(actions: np.ndarray, env_index: int, agent_index: int) -> Any:
    return actions[env_index, agent_index]


def _action_in_space(space: Any, actions: torch.Tensor, env_index: int, agent_index: int) -> Any:
    return to_space(space, actions[env_index, agent_index])


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
    #: Each batch entry is its own simulator, seeded ``seed + index``: a batch of ``k * n``
    #: entries seeded ``s`` steps as ``k`` batches of ``n`` seeded ``s, s + n, ...`` (what
    #: ``marlkit.train.seeds`` relies on to step a stack of seeds' envs as one env).
    seeded_per_instance = True

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
        instances = list(simulators)
        if not instances:
            raise ValueError("DictEnv needs at least one simulator instance")
        if illegal_actions not in ("raise", "mask"):
            raise ValueError(f"illegal_actions must be 'raise' or 'mask', got {illegal_actions!r}")
        super().__init__(
            batch_size=(len(instances),), device=device, validate_actions=validate_actions
        )
        self._simulators = instances
        self.num_envs = len(instances)
        self.illegal_actions: IllegalActions = illegal_actions
        if render:
            check_renders(instances)
            self.render_modes = ("rgb_array",)
        names = self._agent_names(agents)
        self.agent_names = names
        obs_spaces = self._per_agent(observation_spaces, names, "observation")
        act_spaces = self._per_agent(action_spaces, names, "action")
        if group_map is None:
            same = all(obs_spaces[name] == obs_spaces[names[0]] for name in names) and all(
                act_spaces[name] == act_spaces[names[0]] for name in names
            )
            group_map = "agents" if same else "by_type"
        self.group_map = make_group_map(names, group_map)
        probe = self._reset_instance(0, None)  # probes action masks in infos and the state
        # The probe is the adapter's, not the user's: every env waits for a reset() (the first
        # one resets them all, seeded), and step() before it is refused for each.
        self._started = [False] * self.num_envs
        self._layouts = {
            group: self._layout(group, members, obs_spaces, act_spaces, probe)
            for group, members in self.group_map.items()
        }
        self._state_space = self._resolve_state_space(state_space)
        self._build_specs()
        if self._state_space is not None:
            spec = self.state_spec[STATE]
            self._state_shape = tuple(spec.shape)
            self._state_dtype = numpy_dtype(spec.dtype)
        self._writer = FrameWriter(
            self._layouts, names, self.num_envs, self.turn_based, self._state_of
        )
        self._last_frame = self._blank_frame()
        self._root_batch = torch.Size((self.num_envs,))
        self._pending_seeds: list[int | None] = [None] * self.num_envs
        self._writer.write_reset(0, probe, self._last_frame)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    def _agent_names(self, agents: Sequence[str] | None) -> list[str]:
        first = self._simulators[0]
        if agents is None:
            agents = getattr(first, "possible_agents", None)
        if agents is None:
            agents = getattr(first, "agents", None)
        if agents is None:
            raise TypeError(
                f"cannot tell the agents of {type(first).__name__}: it has neither "
                "possible_agents nor agents; pass agents=[...]"
            )
        names = list(agents)
        if not names:
            raise ValueError("the simulator declares no agents (possible_agents is empty)")
        return names

    def _per_agent(self, given: Any, names: list[str], kind: str) -> dict[str, Any]:
        sim = self._simulators[0]
        if given is None:
            method = getattr(sim, f"{kind}_space", None)
            if method is None:
                raise TypeError(
                    f"{type(sim).__name__} has no {kind}_space(agent) method; pass "
                    f"{kind}_spaces= (a Gymnasium space or marlkit spec, or a dict per agent)"
                )
            return {name: as_space(method(name), f"{kind}_space({name!r})") for name in names}
        if isinstance(given, Mapping) and not isinstance(given, Composite):
            missing = [name for name in names if name not in given]
            if missing:
                raise KeyError(f"{kind}_spaces has no entry for agents {missing}")
            return {name: as_space(given[name], f"{kind}_spaces[{name!r}]") for name in names}
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
        for kind, per_agent in (("observation", obs_spaces), ("action", act_spaces)):
            for agent in members[1:]:
                # As spaces and as specs: one made from a spec declares that spec's type/dtype.
                if per_agent[agent] != per_agent[head] or spec_from_space(
                    per_agent[agent]
                ) != spec_from_space(per_agent[head]):
                    raise ValueError(
                        f"agents {head!r} and {agent!r} of group {group!r} have different "
                        f"{kind} spaces ({space_repr(per_agent[head])} vs "
                        f"{space_repr(per_agent[agent])}); a group stacks agents with equal "
                        "spaces: use group_map='by_type', 'per_agent' or an explicit map"
                    )
        leaves, mask_path = observation_leaves(obs_spaces[head])
        action_space = act_spaces[head]
        discrete = isinstance(action_space, gym_spaces().Discrete)
        infos = probe.infos or {}
        masked = discrete and (
            mask_path is not None
            or any(
                isinstance(infos.get(agent), Mapping) and ACTION_MASK in infos[agent]
                for agent in members
            )
        )
        return GroupLayout(
            agents=list(members),
            leaves=leaves,
            mask_path=mask_path,
            action_space=action_space,
            n_actions=int(action_space.n) if discrete else None,
            action_start=int(action_space.start) if discrete else 0,
            masked=masked,
            turn_based=self.turn_based,
            box=isinstance(action_space, gym_spaces().Box),
            batch=torch.Size((self.num_envs, len(members))),
        )

    def _resolve_state_space(self, state_space: Any) -> Any:
        if state_space is False:
            return None
        sim = self._simulators[0]
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
        batch, device = tuple(self.batch_size), self.device
        observation_spec = Composite(shape=batch, device=device)
        action_spec = Composite(shape=batch, device=device)
        sizes = {group: len(layout.agents) for group, layout in self._layouts.items()}
        flag = Categorical(2, (), dtype=torch.bool, device=device)
        for group, layout in self._layouts.items():
            lead = (*batch, sizes[group])
            entries = Composite(shape=lead, device=device)
            for leaf in layout.leaves:
                entries[leaf.key] = spec_from_space(leaf.space, lead, device=device)
            entries[MASK] = flag.expand(lead)
            if layout.masked:
                n_actions = layout.n_actions or 0
                entries[ACTION_MASK] = Binary(
                    n_actions, (*lead, n_actions), dtype=torch.bool, device=device
                )
            if self.turn_based:
                entries[ACTING] = flag.expand(lead)
            observation_spec[group] = entries
            action_spec[group] = Composite(
                {ACTION: spec_from_space(layout.action_space, lead, device=device)},
                shape=lead,
                device=device,
            )
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        state = Composite(shape=batch, device=device)
        if self._state_space is not None:
            state[STATE] = spec_from_space(self._state_space, batch, device=device)
        self.state_spec = state
        self.reward_spec = make_reward_spec(batch, sizes, device=device)
        self.done_spec = make_done_spec(batch, sizes, device=device)

    def _blank_frame(self) -> Frame:
        groups = {
            group: Arrays.blank(layout, self.num_envs) for group, layout in self._layouts.items()
        }
        state = None
        if self._state_space is not None:
            state = np.zeros(self._state_shape, self._state_dtype)
        return Frame(groups, state)

    # ------------------------------------------------------------------ per-instance hooks
    def _reset_instance(self, index: int, seed: int | None) -> StepView:
        """Reset simulator ``index`` (with ``seed`` when not ``None``) and report it."""
        sim = self._simulators[index]
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
        sim = self._simulators[index]
        out = sim.step(actions)
        if not isinstance(out, tuple) or len(out) != 5:
            raise SimulatorOutputError(
                f"step() of env {index} must return 5 dicts (observations, rewards, "
                f"terminations, truncations, infos), got {describe(out)}"
            )
        observations, rewards, terminations, truncations, infos = out
        for name, value in (
            ("observations", observations),
            ("rewards", rewards),
            ("terminations", terminations),
            ("truncations", truncations),
        ):
            if type(value) is not dict and not isinstance(value, Mapping):
                raise SimulatorOutputError(
                    f"step() of env {index}: {name} must be a dict keyed by agent, got "
                    f"{type(value).__name__}: {describe(value)}"
                )
        agents = getattr(sim, "agents", None)
        if agents is None:  # no agents attribute: those with an observation and not done
            agents = [
                agent
                for agent in observations
                if not (terminations.get(agent) or truncations.get(agent))
            ]
        return StepView(observations, list(agents), rewards, terminations, truncations, infos)

    def _state_of(self, index: int) -> Any:
        return self._simulators[index].state()

    # ------------------------------------------------------------------ output TensorDicts
    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _output(self, frame: Frame, step: dict[str, dict[str, np.ndarray]] | None) -> TensorDict:
        """The output TensorDict; ``step`` holds per group (and ``""`` for the root) rewards and
        done flags. Every array is fresh, so the tensors can be handed out without copies."""
        tensor = torch.from_numpy if self.device.type == "cpu" else self._tensor
        root: dict[str, Any] = {}
        for group, layout in self._layouts.items():
            arrays = frame.groups[group]
            entries: dict[str, Any] = {}
            for leaf, values in zip(layout.leaves, arrays.observations):
                node = entries
                for part in leaf.key[:-1]:
                    node = node.setdefault(part, {})
                node[leaf.key[-1]] = tensor(values)
            entries[MASK] = tensor(arrays.mask)
            if arrays.action_mask is not None:
                entries[ACTION_MASK] = tensor(arrays.action_mask)
            if arrays.acting is not None:
                entries[ACTING] = tensor(arrays.acting)
            if step is not None:
                for key, values in step[group].items():
                    entries[key] = tensor(values)
            root[group] = self._tensordict(entries, layout.batch, flat=layout.flat)
        if frame.state is not None:
            root[STATE] = tensor(frame.state)
        if step is not None:
            for key, values in step[""].items():
                root[key] = tensor(values)
        return self._tensordict(root, self._root_batch, flat=True)

    def _tensordict(self, entries: dict[str, Any], batch: torch.Size, flat: bool) -> TensorDict:
        """A TensorDict of entries whose shapes are right by construction (no checks)."""
        return unchecked_tensordict(entries, batch, self.device, nested=not flat)

    # ------------------------------------------------------------------ EnvBase hooks
    def _set_seed(self, seed: int) -> int:
        check_seed(seed, "the simulator")  # before anything is seeded: a refusal changes nothing
        for env_index, sim in enumerate(self._simulators):
            space_of = getattr(sim, "action_space", None)
            if not callable(space_of):
                continue
            for agent in self.agent_names:
                try:
                    space_of(agent).seed(seed + env_index)
                except (AttributeError, KeyError, TypeError):
                    break
        self._pending_seeds = [seed + env_index for env_index in range(self.num_envs)]
        return seed + self.num_envs

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None or not all(self._started):
            # The first reset resets every env, whatever the mask: an env never reset has no
            # episode to keep (as the Gymnasium adapter does).
            indices = list(range(self.num_envs))
            frame = self._blank_frame()
        else:
            indices = env_mask.reshape(-1).nonzero().reshape(-1).tolist()
            frame = self._last_frame.copy()
        writer = self._writer
        writer.copy_flags()
        for env_index in indices:
            seed, self._pending_seeds[env_index] = self._pending_seeds[env_index], None
            writer.write_reset(env_index, self._reset_instance(env_index, seed), frame)
            self._started[env_index] = True
        writer.check_finite(frame, "reset()")
        self._last_frame = frame
        return self._output(frame, None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not all(self._started):
            idle = [index for index, started in enumerate(self._started) if not started]
            what = f"env {idle[0]} was" if len(idle) == 1 else f"envs {idle} were"
            raise RuntimeError(f"{what} never reset: call reset() before step()")
        action_of = self._decode_actions(tensordict)
        frame = self._blank_frame()
        rewards = {
            group: np.zeros((*layout.batch, 1), np.float32)
            for group, layout in self._layouts.items()
        }
        writer = self._writer
        writer.copy_flags()  # the flags handed out last time stay as they were
        slots = writer.slots
        for env_index in range(self.num_envs):
            if writer.over[env_index]:  # finished and not reset: nothing moves, everyone is done
                if frame.state is not None:
                    frame.state[env_index] = self._last_frame.state[env_index]  # type: ignore[index]
                continue
            actions = {
                agent: action_of[slots[agent][0]](env_index, slots[agent][1])
                for agent in writer.present[env_index]
            }
            writer.write_step(env_index, self._step_instance(env_index, actions), frame, rewards)
        writer.check_finite(frame, "step()")
        self._last_frame = frame
        # Per-agent flags only: done and the root flags follow from them by the done rule
        # (an env is over when every agent is done, absent ones included).
        step: dict[str, dict[str, np.ndarray]] = {}
        for group in self._layouts:
            step[group] = {
                REWARD: rewards[group],
                TERMINATED: writer.terminated[group][..., None],
                TRUNCATED: writer.truncated[group][..., None],
            }
        step[""] = {}
        return self._output(frame, step)

    # ------------------------------------------------------------------ actions
    def _decode_actions(self, tensordict: TensorDictBase) -> dict[str, Callable[[int, int], Any]]:
        """Per group, ``fn(env_index, agent_index)`` giving the simulator's action; illegal
        actions are refused (``"raise"``) or replaced (``"mask"``) first, for every env at once."""
        action_of: dict[str, Callable[[int, int], Any]] = {}
        for group, layout in self._layouts.items():
            action = get_entry(tensordict, (group, ACTION))
            if action is None:
                action = tensordict.get((group, ACTION))  # absent: the public KeyError
            if layout.n_actions is not None:
                classes = action.numpy(force=True)
                if layout.masked:  # against the env's own masks, whatever the input carries
                    classes = self._legal_actions(
                        group, layout, classes.astype(np.int64, copy=False)
                    )
                if layout.action_start:
                    classes = classes + layout.action_start
                action_of[group] = functools.partial(_action_from_lists, classes.tolist())
            elif layout.box:
                values = np.array(action.numpy(force=True), dtype=layout.action_space.dtype)
                action_of[group] = functools.partial(_action_from_array, values)
            else:  # MultiDiscrete, MultiBinary, Dict, Tuple: the general conversion
                action_of[group] = functools.partial(
                    _action_in_space, layout.action_space, action.detach().cpu().clone()
                )
        return action_of

    def _legal_actions(self, group: str, layout: GroupLayout, classes: np.ndarray) -> np.ndarray:
        """``classes`` ``[E, n]`` with the illegal actions of agents that act refused or
        replaced."""
        arrays = self._last_frame.groups[group]
        mask = arrays.action_mask
        assert mask is not None  # layout.masked
        live = arrays.mask & ~self._writer.over[:, None]
        if arrays.acting is not None:
            live &= arrays.acting
        n_actions = layout.n_actions or 0
        inside = (classes >= 0) & (classes < n_actions)
        rows, cols = _grid(classes.shape)  # mask[e, i, classes[e, i]], out-of-range ones at 0
        allowed = mask[rows, cols, np.where(inside, classes, 0)] & inside
        illegal = live & ~allowed
        if not illegal.any():
            return classes
        if self.illegal_actions == "mask":
            return np.where(illegal, mask.argmax(-1), classes)
        env_index, agent_index = (int(x) for x in np.argwhere(illegal)[0])
        allows = np.flatnonzero(mask[env_index, agent_index]).tolist()
        raise InvalidActionError(
            f"step(): action {int(classes[env_index, agent_index])} of agent "
            f"{layout.agents[agent_index]!r} (env {env_index}) at {(group, ACTION)!r} is "
            f"illegal: its action mask allows {allows} (illegal_actions='mask' replaces illegal "
            "actions by a legal one)"
        )

    # ------------------------------------------------------------------ rendering, closing
    def _render(self, env_index: int) -> Any:
        if not self._started[env_index]:  # the simulator's own error would be its assert
            raise RuntimeError(f"{type(self).__name__}: call reset() before render()")
        return self._simulators[env_index].render()

    def _close(self) -> None:
        for sim in self._simulators:
            close = getattr(sim, "close", None)
            if callable(close):
                close()

    @property
    def simulators(self) -> list[Any]:
        """The simulator instances, one per env of the batch (read them, do not step them)."""
        return list(self._simulators)


@functools.lru_cache(maxsize=8)
def _grid(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``np.indices(shape)`` (read-only), made once per shape: the env and agent index of each
    entry, to pick one action per agent from ``[E, n, A]`` masks (a third of
    ``np.take_along_axis``'s time, with ``np.clip``, on a small batch)."""
    grid = np.indices(shape)
    grid.flags.writeable = False
    return tuple(grid)
