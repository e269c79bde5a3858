"""How each simulator instance's report is checked and written into the batch's arrays: the
writing half of :class:`~marlkit.adapters._dict_env.DictEnv` (the layout it writes into is
:mod:`~marlkit.adapters._dict_layout`).

* ``StepView``: what one simulator instance reports after a reset or a step (dicts per agent).
* ``FrameWriter``: checks a ``StepView`` and writes it into a
  :class:`~marlkit.adapters._dict_layout.Frame` (observations, action masks, turns, state,
  rewards and per-agent done flags), refusing what the simulator got wrong with a
  :class:`~marlkit.adapters._spaces.SimulatorOutputError` naming the call, env, agent and key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marlkit.adapters._dict_layout import Arrays, Frame, GroupLayout, Leaf
from marlkit.adapters._spaces import SimulatorOutputError, changes_on_cast, describe, space_repr
from marlkit.data.keys import ACTION_MASK, REWARD

__all__ = ["BATCHED_FROM", "FrameWriter", "StepView"]

#: Groups of this many agents or more are written in one go (rewards, flags and observations as
#: arrays); in smaller ones, agent by agent costs less than the arrays' fixed costs (measured
#: on MPE and MAgent2 battle: 3 agents 8 us a step against 18, 12 agents even, 144 agents
#: 175 us against 325).
BATCHED_FROM = 16


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


# ---------------------------------------------------------------------- writing reports
class FrameWriter:
    """Checks what each simulator instance reports and writes it into a :class:`Frame`.

    It also keeps, per instance, what the next step starts from: the agents in the game
    (``present``), each agent's done flags (``terminated``/``truncated``, per group
    ``[E, n]`` bool) and whether the episode is over (``over``, ``[E]`` bool).

    Args:
        layouts: ``{group: GroupLayout}``.
        agent_names: every agent, in the env's order (named in messages).
        num_envs: ``E``.
        turn_based: one agent acts per step (writes ``acting``).
        state_of: ``state_of(env_index)`` is the simulator's ``state()`` (called only when a
            frame has a state).
    """

    def __init__(
        self,
        layouts: dict[str, GroupLayout],
        agent_names: list[str],
        num_envs: int,
        turn_based: bool,
        state_of: Callable[[int], Any],
    ):
        self.layouts = layouts
        self.agent_names = agent_names
        self.turn_based = turn_based
        self.state_of = state_of
        #: Where each agent sits: ``{agent: (group, index in the group)}``.
        self.slots = {
            agent: (group, index)
            for group, layout in layouts.items()
            for index, agent in enumerate(layout.agents)
        }
        #: Agents with Discrete actions and no mask: masks are declared by the first reset's
        #: infos, so one that shows up later in step infos is refused, not ignored.
        self.unmasked = [
            agent
            for layout in layouts.values()
            if layout.n_actions is not None and not layout.masked
            for agent in layout.agents
        ]
        #: Each group's agents as a set: ``{group: frozenset}``.
        self._agent_sets = {group: frozenset(layout.agents) for group, layout in layouts.items()}
        self.terminated = {
            group: np.zeros((num_envs, len(layout.agents)), bool)
            for group, layout in layouts.items()
        }
        self.truncated = {
            group: np.zeros((num_envs, len(layout.agents)), bool)
            for group, layout in layouts.items()
        }
        self.over = np.zeros(num_envs, bool)
        self.present: list[frozenset[str]] = [frozenset()] * num_envs

    def copy_flags(self) -> None:
        """Copy the done-flag arrays before writing: earlier outputs share their memory."""
        self.terminated = {group: flags.copy() for group, flags in self.terminated.items()}
        self.truncated = {group: flags.copy() for group, flags in self.truncated.items()}
        self.over = self.over.copy()

    # ------------------------------------------------------------------ after a reset
    def write_reset(self, env_index: int, view: StepView, frame: Frame) -> None:
        """Write instance ``env_index``'s reset into ``frame``; every agent starts not done,
        except those not in the game from the start (done from the first step on)."""
        present = self._check_agents(env_index, view.agents, "reset()", view.observations)
        for group, layout in self.layouts.items():
            arrays = frame.groups[group]
            arrays.mask[env_index] = False
            self.truncated[group][env_index] = False
            for agent_index, agent in enumerate(layout.agents):
                self.terminated[group][env_index, agent_index] = agent not in present
                if agent in present:
                    arrays.mask[env_index, agent_index] = True
                    self._write_observation(
                        arrays, layout, env_index, agent_index, agent, view, "reset()", True
                    )
                else:
                    arrays.zero_agent(env_index, agent_index)
        self._write_turn(frame, env_index, view)
        self._write_state(frame, env_index)
        self.present[env_index] = present
        self.over[env_index] = False

    # ------------------------------------------------------------------ after a step
    def write_step(
        self, env_index: int, view: StepView, frame: Frame, rewards: dict[str, np.ndarray]
    ) -> None:
        """Write instance ``env_index``'s step into ``frame`` and ``rewards`` (per group
        ``[E, n, 1]``), and its agents' done flags.

        A group of ``BATCHED_FROM`` agents or more goes in one go where it can (its rewards
        and flags read into arrays, its observations stacked into the group's array); a
        smaller group, or one that cannot (values to convert, or something wrong), is written
        agent by agent, into the same entries, and that path raises the error, naming the
        agent and key as it always has. Both write the same values, bit for bit.
        """
        before = self.present[env_index]
        present = self._check_agents(env_index, view.agents, "step()", view.observations)
        over = True  # the episode is over when every agent in the game is done
        for group, layout in self.layouts.items():
            done = None
            if len(layout.agents) >= BATCHED_FROM:
                try:
                    done = self._write_group(
                        env_index, group, layout, view, frame, rewards, before, present
                    )
                # a value the fast path cannot read (not a number, a missing agent, a shape
                # that does not fit): the agent-by-agent path says what is wrong
                except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError):
                    done = None
            if done is None:
                done = self._write_group_by_agent(
                    env_index, group, layout, view, frame, rewards, before, present
                )
            over = over and done
        if self.unmasked and view.infos:
            self._refuse_undeclared_masks(env_index, view.infos)
        self._write_turn(frame, env_index, view)
        self._write_state(frame, env_index)
        self.present[env_index] = present
        self.over[env_index] = over

    def _write_group(
        self,
        env_index: int,
        group: str,
        layout: GroupLayout,
        view: StepView,
        frame: Frame,
        rewards: dict[str, np.ndarray],
        before: frozenset[str],
        present: frozenset[str],
    ) -> bool | None:
        """A group's step in one go: whether all its agents in the game are done, or ``None``
        when the group must go agent by agent (which writes every entry this wrote again, and
        raises any error)."""
        agents, everyone = layout.agents, self._agent_sets[group]
        was = _positions(agents, everyone, before)
        now = _positions(agents, everyone, present)
        names = agents if isinstance(was, slice) else [agents[i] for i in was]
        reward = _numbers(view.rewards, names)
        if not np.isfinite(reward).all():
            return None
        ended = _numbers(view.terminations, names) != 0
        cut = _numbers(view.truncations, names) != 0
        left: list[int] = []
        if not isinstance(now, slice):  # left the game without a flag: over for it
            ended |= ~cut & np.fromiter((name not in present for name in names), bool, len(names))
            left = [i for i, agent in enumerate(agents) if agent in before and agent not in present]
        terminated, truncated = self.terminated[group], self.truncated[group]
        rewards[group][env_index, was, 0] = reward
        terminated[env_index, was] = ended
        truncated[env_index, was] = cut
        if not isinstance(was, slice):  # joined the game during the episode
            joined = np.array(
                [i for i, agent in enumerate(agents) if agent in present and agent not in before],
                np.intp,
            )
            terminated[env_index, joined] = truncated[env_index, joined] = False
        arrays = frame.groups[group]
        arrays.mask[env_index, now] = True
        if not _stack_as_is(arrays, layout, env_index, now, view):
            for agent_index in range(len(agents)) if isinstance(now, slice) else now.tolist():
                agent = agents[agent_index]
                if not (
                    layout.simple
                    and _store_as_is(arrays, layout, env_index, agent_index, agent, view)
                ):
                    self._write_observation(
                        arrays, layout, env_index, agent_index, agent, view, "step()", True
                    )
        for agent_index in left:  # its last transition: the final observation when given
            self._write_observation(
                arrays, layout, env_index, agent_index, agents[agent_index], view, "step()", False
            )
            if arrays.action_mask is not None:
                arrays.action_mask[env_index, agent_index] = True
        return bool((terminated[env_index, now] | truncated[env_index, now]).all())

    def _write_group_by_agent(
        self,
        env_index: int,
        group: str,
        layout: GroupLayout,
        view: StepView,
        frame: Frame,
        rewards: dict[str, np.ndarray],
        before: frozenset[str],
        present: frozenset[str],
    ) -> bool:
        """A group's step agent by agent, each value checked as it is written: whether all its
        agents in the game are done."""
        terminated, truncated = self.terminated[group], self.truncated[group]
        arrays, group_rewards = frame.groups[group], rewards[group]
        done = True
        for agent_index, agent in enumerate(layout.agents):
            if agent in before:
                reward = _read_number(view.rewards, "rewards", agent, env_index)
                if not math.isfinite(reward):
                    raise SimulatorOutputError(
                        f"step() of env {env_index}: the reward of agent {agent!r} at key "
                        f"{(group, REWARD)!r} is not finite: {reward}"
                    )
                group_rewards[env_index, agent_index, 0] = reward
                ended = bool(_read_number(view.terminations, "terminations", agent, env_index))
                cut = bool(_read_number(view.truncations, "truncations", agent, env_index))
                if agent not in present:
                    ended = ended or not cut  # left the game without a flag: over for it
                terminated[env_index, agent_index] = ended
                truncated[env_index, agent_index] = cut
                if agent in present:
                    done = done and (ended or cut)
            elif agent in present:  # joined the game during the episode
                terminated[env_index, agent_index] = truncated[env_index, agent_index] = False
                done = False
            if agent in present:
                arrays.mask[env_index, agent_index] = True
                if not (
                    layout.simple
                    and _store_as_is(arrays, layout, env_index, agent_index, agent, view)
                ):
                    self._write_observation(
                        arrays, layout, env_index, agent_index, agent, view, "step()", True
                    )
            elif agent in before:  # its last transition: the final observation when given
                self._write_observation(
                    arrays, layout, env_index, agent_index, agent, view, "step()", False
                )
                if arrays.action_mask is not None:
                    arrays.action_mask[env_index, agent_index] = True
        return done

    # ------------------------------------------------------------------ checks
    def _check_agents(
        self,
        env_index: int,
        agents: Sequence[str],
        where: str,
        observations: Mapping[str, Any],
    ) -> frozenset[str]:
        """The agents in the game, all known; observations of an agent nobody declared are
        refused too (they would be dropped without a word)."""
        present = frozenset(agents)
        if not present <= self.slots.keys():
            raise SimulatorOutputError(
                f"{where} of env {env_index}: unknown agents "
                f"{sorted(present - self.slots.keys())} in the game; the agents are "
                f"{self.agent_names}"
            )
        if not observations.keys() <= self.slots.keys():
            unknown = sorted(map(str, observations.keys() - self.slots.keys()))
            raise SimulatorOutputError(
                f"{where} of env {env_index}: observations of unknown agents {unknown}; the "
                f"agents are {self.agent_names}"
            )
        return present

    def _refuse_undeclared_masks(self, env_index: int, infos: Mapping[str, Any]) -> None:
        if not any(
            ACTION_MASK in info
            for info in infos.values()
            if type(info) is dict or isinstance(info, Mapping)
        ):
            return  # no mask anywhere (the usual case), in one pass over the infos
        for agent in self.unmasked:
            info = infos.get(agent)
            if isinstance(info, Mapping) and ACTION_MASK in info:
                raise SimulatorOutputError(
                    f"step() of env {env_index}: the infos of agent {agent!r} carry an "
                    f"{ACTION_MASK!r}, but the first reset's infos did not, so the env declared "
                    "no action mask and would let forbidden actions through; return the mask "
                    "from reset() too"
                )

    def check_finite(self, frame: Frame, where: str) -> None:
        """A SimulatorOutputError naming the call (``"reset()"``, ``"step()"``), env, agent, key
        and value of a non-finite observation or state (rewards are checked as they are read)."""
        for group, layout in self.layouts.items():
            for leaf, values in zip(layout.leaves, frame.groups[group].observations):
                # one sum is the fast check; inf - inf or an overflow sends us to the exact one
                if not leaf.floating or math.isfinite(values.sum()) or np.isfinite(values).all():
                    continue
                env_index, agent_index = (int(x) for x in np.argwhere(~np.isfinite(values))[0][:2])
                raise SimulatorOutputError(
                    f"{where} of env {env_index}: the observation of agent "
                    f"{layout.agents[agent_index]!r} at key {(group, *leaf.key)!r} is not "
                    f"finite: {describe(values[env_index, agent_index])}"
                )
        state = frame.state
        if state is not None and state.dtype.kind == "f" and not math.isfinite(state.sum()):
            if np.isfinite(state).all():
                return
            env_index = int(np.argwhere(~np.isfinite(state))[0][0])
            raise SimulatorOutputError(
                f"{where} of env {env_index}: state() holds a non-finite value: "
                f"{describe(state[env_index])}"
            )

    # ------------------------------------------------------------------ writing entries
    def _write_observation(
        self,
        arrays: Arrays,
        layout: GroupLayout,
        env_index: int,
        agent_index: int,
        agent: str,
        view: StepView,
        where: str,
        required: bool,
    ) -> None:
        value = view.observations.get(agent, None)
        if value is None:
            if required:
                raise SimulatorOutputError(
                    f"{where} of env {env_index}: no observation for agent {agent!r}, which is "
                    f"in the game; observations came for {sorted(view.observations)}"
                )
            arrays.zero_agent(env_index, agent_index)
            return
        if layout.simple:
            leaf = layout.leaves[0]
            if getattr(value, "shape", None) != leaf.value_shape:
                _check_shape(np.asarray(value), leaf, agent, env_index, where)
            _store_checked(
                arrays.observations[0], env_index, agent_index, value, leaf, agent, where
            )
        else:
            for leaf, target in zip(layout.leaves, arrays.observations):
                entry = np.asarray(_entry_at(value, leaf.path, agent, env_index, where))
                if entry.shape != leaf.value_shape:
                    _check_shape(entry, leaf, agent, env_index, where)
                if leaf.store_shape != leaf.value_shape:
                    entry = entry.reshape(leaf.store_shape)
                if leaf.start is not None:
                    entry = entry - leaf.start
                _store_checked(target, env_index, agent_index, entry, leaf, agent, where)
        if layout.masked:
            self._write_action_mask(arrays, layout, env_index, agent_index, agent, value, view)

    @staticmethod
    def _write_action_mask(
        arrays: Arrays,
        layout: GroupLayout,
        env_index: int,
        agent_index: int,
        agent: str,
        value: Any,
        view: StepView,
    ) -> None:
        """Allowed actions: the simulator's mask for the agents that can act (the acting agent
        in turn-based envs); every action for the others, whose action is ignored."""
        row = arrays.action_mask[env_index, agent_index]  # type: ignore[index]
        row[:] = True
        if layout.turn_based and agent != view.acting:
            return
        mask = None
        if layout.mask_path is not None:
            mask = _entry_at(value, layout.mask_path, agent, env_index, "action mask")
        else:
            info = (view.infos or {}).get(agent)
            if isinstance(info, Mapping):
                mask = info.get(ACTION_MASK)
        if mask is None:
            return
        given = np.asarray(mask)
        if given.shape != (layout.n_actions,):
            raise SimulatorOutputError(
                f"env {env_index}: the action mask of agent {agent!r} has shape "
                f"{list(given.shape)}, expected [{layout.n_actions}]; value: {describe(given)}"
            )
        allowed = given.astype(bool)
        if allowed.any():  # a mask that allows nothing would leave no action to take
            row[:] = allowed

    def _write_turn(self, frame: Frame, env_index: int, view: StepView) -> None:
        if not self.turn_based:
            return
        for arrays in frame.groups.values():
            arrays.acting[env_index] = False  # type: ignore[index]
        if view.acting is not None:
            slot = self.slots.get(view.acting)
            if slot is None:
                raise SimulatorOutputError(
                    f"env {env_index}: the acting agent {view.acting!r} is not one of "
                    f"{self.agent_names}"
                )
            group, agent_index = slot
            frame.groups[group].acting[env_index, agent_index] = True  # type: ignore[index]

    def _write_state(self, frame: Frame, env_index: int) -> None:
        if frame.state is None:
            return
        state = np.asarray(self.state_of(env_index))
        if state.shape != frame.state.shape[1:]:
            raise SimulatorOutputError(
                f"env {env_index}: state() has shape {list(state.shape)}, expected "
                f"{list(frame.state.shape[1:])} from the state space; value: {describe(state)}"
            )
        frame.state[env_index] = state


def _store_as_is(
    arrays: Arrays,
    layout: GroupLayout,
    env_index: int,
    agent_index: int,
    agent: str,
    view: StepView,
) -> bool:
    """The fast path: an array of the right shape, stored as is; ``False`` for anything else
    (then the general path converts it or says what is wrong)."""
    value = view.observations.get(agent)
    if getattr(value, "shape", None) != layout.leaves[0].value_shape or layout.masked:
        return False
    target = arrays.observations[0]
    if target.dtype.kind in "biu" and getattr(value, "dtype", None) != target.dtype:
        return False  # the general path checks that the values fit the integer dtype
    try:
        target[env_index, agent_index] = value
    except (TypeError, ValueError):
        return False
    return True


def _positions(agents: list[str], everyone: frozenset[str], members: frozenset[str]) -> Any:
    """The positions in ``agents`` (a group, ``everyone`` as a set) of those in ``members``: a
    slice of all when they all are (the usual case, cheaper to index with), else an array."""
    if everyone and members.issuperset(everyone):
        return slice(None)
    return np.array([i for i, agent in enumerate(agents) if agent in members], np.intp)


def _numbers(values: Any, agents: list[str]) -> np.ndarray:
    """``[float(values[agent]) for agent in agents]`` as a float64 array (rewards or flags);
    errors (``values`` not a mapping, a missing agent, not a number) are left to
    :func:`_read_number` to name."""
    return np.fromiter(map(float, map(values.__getitem__, agents)), np.float64, len(agents))


def _stack_as_is(
    arrays: Arrays, layout: GroupLayout, env_index: int, now: Any, view: StepView
) -> bool:
    """The fast path for a whole group: the observations of its agents in the game (positions
    ``now``), all NumPy arrays of the leaf's shape and of one dtype a plain cast stores as
    :func:`_store_as_is` would, stacked into the group's array in one go; ``False`` (nothing
    written) for anything else."""
    if not layout.simple or layout.masked:
        return False
    agents = layout.agents
    names = agents if isinstance(now, slice) else [agents[i] for i in now.tolist()]
    if not names:
        return True
    values: list[Any] = list(map(view.observations.get, names))
    first = values[0]
    if type(first) is not np.ndarray:
        return False
    dtype, shape = first.dtype, layout.leaves[0].value_shape
    target = arrays.observations[0]
    if dtype.kind not in "biuf" or (target.dtype.kind in "biu" and dtype != target.dtype):
        return False  # the general path checks that the values fit the integer dtype
    if not all(
        type(value) is np.ndarray and value.dtype is dtype and value.shape == shape
        for value in values
    ):
        return False
    if not shape or not target.flags.c_contiguous:
        target[env_index, now] = np.stack(values)
    elif isinstance(now, slice):  # straight into the group's rows (a view: target is contiguous)
        np.concatenate(values, out=target[env_index].reshape(-1, *shape[1:]), casting="unsafe")
    else:  # concatenate is stack's work without its per-array views
        target[env_index, now] = np.concatenate(values).reshape(-1, *shape)
    return True


def _check_shape(value: np.ndarray, leaf: Leaf, agent: str, env_index: int, where: str) -> None:
    if value.shape == leaf.value_shape:
        return
    raise SimulatorOutputError(
        f"{where} of env {env_index}: the observation of agent {agent!r} at key {leaf.key!r} has "
        f"shape {list(value.shape)}, expected {list(leaf.value_shape)} from its "
        f"{space_repr(leaf.space)}; value: {describe(value)}"
    )


def _store_checked(
    target: np.ndarray,
    env_index: int,
    agent_index: int,
    value: Any,
    leaf: Leaf,
    agent: str,
    where: str,
) -> None:
    """Store ``value`` at ``target[env_index, agent_index]``, refusing values its dtype cannot
    hold exactly."""
    if target.dtype.kind in "biu" and changes_on_cast(np.asarray(value), target.dtype):
        raise SimulatorOutputError(
            f"{where} of env {env_index}: the observation of agent {agent!r} at key "
            f"{leaf.key!r} holds values {leaf.dtype} cannot hold exactly (they would wrap or be "
            f"truncated): {describe(value)}"
        )
    try:
        target[env_index, agent_index] = value
    except (TypeError, ValueError) as err:
        raise SimulatorOutputError(
            f"{where} of env {env_index}: the observation of agent {agent!r} at key "
            f"{leaf.key!r} is not {leaf.dtype}: {describe(value)} ({err})"
        ) from None


def _entry_at(value: Any, path: tuple[Any, ...], agent: str, env_index: int, where: str) -> Any:
    """The entry of an agent's (nested) observation at ``path``."""
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            raise SimulatorOutputError(
                f"{where} of env {env_index}: the observation of agent {agent!r} has no entry "
                f"{part!r} (expected from its space); value: {describe(value)}"
            ) from None
    return value


def _read_number(values: Mapping[str, Any] | None, name: str, agent: str, env_index: int) -> float:
    """``values[agent]`` (a reward or a flag) as a float."""
    try:
        return float(values[agent])  # type: ignore[index]
    except KeyError:
        raise SimulatorOutputError(
            f"step() of env {env_index}: no {name} entry for agent {agent!r}, which was in the "
            f"game before the step; {name} came for {sorted(values or {})}"
        ) from None
    except (TypeError, ValueError):
        raise SimulatorOutputError(
            f"step() of env {env_index}: {name} of agent {agent!r} is not a number: "
            f"{describe((values or {}).get(agent))}"
        ) from None
