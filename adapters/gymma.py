"""The EPyMARL Gymnasium format ("gymma") as marlkit envs: Level-Based Foraging, RWARE and kin.

A Gymnasium env in this format (EPyMARL's ``gymma`` convention) is multi-agent inside a one-agent
API: its observation and action spaces are ``Tuple``\\ s with one entry per agent, ``step`` takes
a list of actions (one per agent) and returns a tuple of observations, a list of rewards (one per
agent) and one ``done`` flag for the whole env. Here it becomes one group ``"agents"`` of agents
``agent_0 .. agent_{n-1}``::

    ("agents", "observation")     [*B, n, *obs_shape]   the agents' Box observations, stacked
    ("agents", "action")          [*B, n] int64 (Discrete), [*B, n, k] (MultiDiscrete, Box)
    ("agents", "action_mask")     [*B, n, n_actions] bool, where Discrete sizes differ
    ("next", "agents", "reward")  [*B, n, 1] float32    each agent's own, or the common reward
    ("next", "done" | "terminated" | "truncated")       [*B, 1] bool (the agents' follow them)

with ``B = [num_envs]``, the instances stepped in a Python loop (``ParallelEnv`` spreads them over
processes). Three families share this module:

* ``marlkit.make("lbforaging/Foraging-8x8-2p-2f-coop-v3")``: Level-Based Foraging's registered
  ids (``pip install 'marlkit[lbforaging]'``);
* ``marlkit.make("rware/rware-tiny-2ag-v2")``: Multi-Robot Warehouse's (``marlkit[rware]``);
* ``marlkit.make("gymma/<id>")``: any Gymnasium id in the format (``"module:Id"`` imports the
  module first, as in EPyMARL's ``env_args.key``); LBF and RWARE ids get their rules there too.

**Rewards** follow EPyMARL's ``common_reward`` and ``reward_scalarisation``: with
``common_reward=False`` (the default) each agent gets its own reward; with ``True`` every agent
gets the agents' rewards scalarised by ``reward_scalarisation``, ``"sum"`` (EPyMARL's default) or
``"mean"``. A simulator returning one scalar reward gives it to every agent.

**Time limits.** These simulators end an episode at their step limit with ``done=True``, the flag
they also raise when the task is solved. The adapter tells the two apart by a rule per task
(:data:`RULES`), so that value estimates bootstrap where an episode was cut short:

* Level-Based Foraging: ``done`` with food left on the field is a time limit (``truncated``);
  every food eaten is ``terminated`` (also when it happens at the last step);
* RWARE: ``done`` only comes from its step limit (``max_steps``) or inactivity limit
  (``max_inactivity_steps``): always ``truncated``;
* other ids: the simulator's own ``terminated``/``truncated`` (a Gymnasium ``TimeLimit``
  truncates).

``time_limit`` sets the episode length as EPyMARL's ``env_args.time_limit`` does (LBF 50 and
RWARE 500 in its benchmark, their registrations' own limits): the simulator's own limit is set to
it (LBF's ``max_episode_steps``, RWARE's ``max_steps``) and the adapter ends an episode at that
step as ``truncated`` unless it terminated there.

**Seeding**: instance ``i`` is reset with ``seed + i`` at its next reset (``set_seed`` returns
``seed + num_envs``); LBF and RWARE replay a seed exactly.

**Rendering**: ``render_mode="rgb_array"`` declares RGB frames (LBF and RWARE draw with pyglet,
asked for ``mode="rgb_array"`` whatever their own ``render_mode``). Where there is no display
(``DISPLAY``/``WAYLAND_DISPLAY`` unset), pyglet is switched to headless (EGL) before anything
imports its windowing, so ``marlkit record lbforaging/...`` writes a video on a server.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import (
    check_flag,
    check_int,
    check_kwargs,
    check_one_of,
    did_you_mean,
    keyword_names,
)
from marlkit._utils import import_optional
from marlkit.adapters._spaces import (
    SimulatorOutputError,
    box_dtype,
    check_seed,
    check_steppable,
    describe,
    spec_from_space,
    to_space,
)
from marlkit.data._fast import get_entry, unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import make_group_map
from marlkit.data.keys import (
    ACTION,
    ACTION_MASK,
    DEFAULT_GROUP,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
)
from marlkit.data.specs import Binary, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs.registry import UnknownEnvError

__all__ = [
    "RULES",
    "GymmaEnv",
    "TaskRule",
    "accepted_kwargs",
    "agent_names",
    "build",
    "list_scenarios",
    "make_env",
]

Scalarisation = Literal["sum", "mean"]

#: ``np.add.reduce``: an array's sum without ``ndarray.sum``'s Python wrapper.
_SUM = np.add.reduce
#: Up to this many entries, :func:`_finite_sum` adds them in Python (a small array's ``reduce``
#: costs more than its ``tolist``); 64 float32 values cannot overflow a Python float.
_PYTHON_SUM = 64


def _finite_sum(array: np.ndarray) -> bool:
    """Whether the sum of a float array is finite: then every entry is (an overflowing sum of
    finite entries is not: look at each then)."""
    if array.size <= _PYTHON_SUM:
        return math.isfinite(sum(array.ravel().tolist()))
    return math.isfinite(_SUM(array, None))


@dataclass(frozen=True)
class TaskRule:
    """What the adapter knows of a simulator in the format, found by its entry point.

    Attributes:
        family: the marlkit family of its ids (``"lbforaging"``).
        package: the module that registers its ids with Gymnasium.
        entry_point: its Gymnasium entry point (``"lbforaging.foraging:ForagingEnv"``).
        limit_attr: the attribute of the unwrapped simulator that holds its step limit.
        limit_kwarg: the constructor keyword of that limit (refused: ``time_limit`` sets it).
        time_limit: the limit its registration sets (and EPyMARL's benchmark uses).
        truncated: given the unwrapped simulator after a step that returned ``done``, whether
            the episode was cut short (``truncated``) rather than ended by the task.
        rule: the rule in words, for docs and messages.
        before_reset: called with the unwrapped simulator before each of its resets.
    """

    family: str
    package: str
    entry_point: str
    limit_attr: str
    limit_kwarg: str
    time_limit: int
    truncated: Callable[[Any], bool]
    rule: str
    before_reset: Callable[[Any], None] | None = None


def _food_left(sim: Any) -> bool:
    return bool(np.asarray(sim.field).sum() > 0)


def _always(sim: Any) -> bool:
    return True


def _forget_players(sim: Any) -> None:
    """LBF 2.0.0 places a reset's players and food away from where the last episode's players
    stood (``_is_empty_location`` reads their old positions), so ``reset(seed=s)`` gives another
    start after each episode: forgetting them first makes a reset depend on its generator alone,
    as a fresh env's first reset does."""
    for player in sim.players:
        player.position = None


#: The registered simulators, by family.
RULES: dict[str, TaskRule] = {
    "lbforaging": TaskRule(
        "lbforaging",
        "lbforaging",
        "lbforaging.foraging:ForagingEnv",
        "_max_episode_steps",
        "max_episode_steps",
        50,
        _food_left,
        "done with food left is truncated (the step limit); every food eaten is terminated",
        _forget_players,
    ),
    "rware": TaskRule(
        "rware",
        "rware",
        "rware.warehouse:Warehouse",
        "max_steps",
        "max_steps",
        500,
        _always,
        "done is always truncated (RWARE ends episodes only at its step or inactivity limit)",
    ),
}


def agent_names(n: int) -> list[str]:
    """``["agent_0", ..., "agent_{n-1}"]``: the agents of the group, in the simulator's order."""
    return [f"agent_{i}" for i in range(n)]


def _gym() -> Any:
    return import_optional("gymnasium", extra="gymnasium", purpose="the gymma adapter")


def _flag(value: Any) -> bool:
    """One done flag of an env: a bool, or every agent's (EPyMARL's ``all(done)``)."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    flags = np.asarray(value)
    return bool(flags.all()) if flags.ndim else bool(flags)


def prepare_headless_pyglet() -> None:
    """Headless (EGL) pyglet where there is no display, set before pyglet's windowing is
    imported (LBF and RWARE import it at their first render); a display, or windowing already
    imported, is left as it is."""
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    if "pyglet.window" in sys.modules or "pyglet.gl" in sys.modules:
        return
    try:
        pyglet = importlib.import_module("pyglet")
    except ImportError:  # the simulator's first render names what is missing
        return
    pyglet.options["headless"] = True


class GymmaEnv(EnvBase):
    """A batch of Gymnasium envs in EPyMARL's format as one group of agents.

    Args:
        factory: a zero-argument callable returning one Gymnasium env in the format (observation
            and action spaces: ``Tuple``\\ s of one space per agent), called ``num_envs`` times.
            The marlkit env owns the instances: :meth:`close` closes them.
        num_envs: instances in the batch ``B = [num_envs]``.
        group: the group of the agents.
        common_reward: every agent gets the scalarised reward (EPyMARL's ``common_reward``);
            ``False``: each its own.
        reward_scalarisation: ``"sum"`` or ``"mean"`` of the agents' rewards (with
            ``common_reward``).
        time_limit: end episodes after this many steps, as ``truncated`` (``None``: the
            simulator's own limit); also set as the simulator's own limit where :data:`RULES`
            knows its attribute.
        rule: how a ``done`` is told apart from a time limit (``None``: the simulator's flags).
        seed: seed of the first reset (``None``: unseeded).
        render: declare ``"rgb_array"`` rendering (headless where there is no display).
        device: where the tensors live (the simulator runs on cpu).
        validate_actions: check actions against ``action_spec`` before the simulator sees them.

    Raises:
        TypeError: the spaces are not ``Tuple``\\ s of one space per agent, the agents' action
            spaces differ (other than Discrete spaces of one start and other sizes, which get an
            ``action_mask``), or an observation space is not a ``Box``.
    """

    #: Each batch entry is its own simulator, seeded ``seed + index`` (see
    #: ``marlkit.adapters._dict_env.DictEnv.seeded_per_instance``).
    seeded_per_instance = True

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        num_envs: int = 1,
        group: str = DEFAULT_GROUP,
        common_reward: bool = False,
        reward_scalarisation: Scalarisation = "sum",
        time_limit: int | None = None,
        rule: TaskRule | None = None,
        seed: int | None = None,
        render: bool = False,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        check_int("num_envs", num_envs, low=1)
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.common_reward = check_flag("common_reward", common_reward)
        self.reward_scalarisation = check_one_of(
            "reward_scalarisation", reward_scalarisation, ("sum", "mean")
        )
        self.time_limit = check_int("time_limit", time_limit, low=1, allow_none=True)
        self.rule = rule
        self.group = group
        self._num = num_envs
        self._sims: list[Any] = []
        try:
            for _ in range(num_envs):
                sim = factory()
                self._sims.append(sim)
                if time_limit is not None and rule is not None:
                    setattr(sim.unwrapped, rule.limit_attr, time_limit)
            self._read_spaces(self._sims[0])
        except BaseException:
            for sim in self._sims:
                sim.close()
            raise
        self.n_agents = len(self._agent_spaces)
        self.group_map = make_group_map(
            agent_names(self.n_agents), {group: agent_names(self.n_agents)}
        )
        if render:
            prepare_headless_pyglet()
            self.render_modes = ("rgb_array",)
        self._build_specs()
        self._obs: np.ndarray | None = None  # the last observations reported, [N, n, *obs]
        self._steps = [0] * num_envs  # steps since each instance's reset
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._ended = False  # _needs_reset.any(), kept as a bool for the step's first check
        self._seeds: list[int | None] = [None] * num_envs
        self._on_cpu = self.device.type == "cpu"
        self._float_obs = self._obs_dtype.kind == "f"
        self._group_batch = torch.Size((num_envs, self.n_agents))
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ spaces and specs
    def _read_spaces(self, sim: Any) -> None:
        spaces = _gym().spaces
        obs, act = sim.observation_space, sim.action_space
        if not isinstance(obs, spaces.Tuple) or not isinstance(act, spaces.Tuple):
            raise TypeError(
                f"{_name(sim)} is not in EPyMARL's format: its observation and action spaces "
                f"must be Tuples with one space per agent, got {obs} and {act}; for a one-agent "
                "env use marlkit.make('gymnasium/<id>')"
            )
        if len(obs.spaces) != len(act.spaces) or not obs.spaces:
            raise TypeError(
                f"{_name(sim)}: {len(obs.spaces)} observation spaces and {len(act.spaces)} "
                "action spaces; EPyMARL's format has one of each per agent"
            )
        first = act.spaces[0]
        differ = [i for i, s in enumerate(act.spaces) if s != first]
        self._action_mask: np.ndarray | None = None  # [n, n_actions]: EPyMARL's avail actions
        known = _discrete_sizes(spaces, act.spaces) if differ else None
        if known is not None:
            # Discrete spaces of other sizes: the largest, with each agent's own actions
            # available (EPyMARL's get_avail_actions).
            sizes = np.array(known)
            first = spaces.Discrete(int(sizes.max()), start=int(first.start))
            self._action_mask = np.arange(sizes.max())[None, :] < sizes[:, None]
        elif differ:
            raise TypeError(
                f"{_name(sim)}: agents {differ} have other action spaces than agent 0 ({first}: "
                f"{[str(act.spaces[i]) for i in differ]}); one group takes one action space, or "
                "Discrete spaces of one start (masked to each agent's size)"
            )
        not_box = [i for i, s in enumerate(obs.spaces) if not isinstance(s, spaces.Box)]
        if not_box:
            raise TypeError(
                f"{_name(sim)}: the observation spaces of agents {not_box} are not Box "
                f"({obs.spaces[not_box[0]]}); the gymma adapter stacks Box observations"
            )
        self._agent_spaces = list(obs.spaces)
        self._act_space = first
        shapes = {s.shape for s in obs.spaces}
        # EPyMARL pads observations of different sizes, flattened, with zeros to the longest.
        self._pad = len(shapes) > 1 or len({s.dtype for s in obs.spaces}) > 1
        if self._pad:
            width = max(int(np.prod(s.shape)) for s in obs.spaces)
            self._obs_shape: tuple[int, ...] = (width,)
            self._obs_dtype = np.dtype(np.float32)
        else:
            self._obs_shape = tuple(obs.spaces[0].shape)
            self._obs_dtype = box_dtype(obs.spaces[0])
        # Discrete actions go to the simulator as ints: the tensor's values plus the start.
        self._discrete_start = int(first.start) if isinstance(first, spaces.Discrete) else None

    def _build_specs(self) -> None:
        b, dev, g, n = (self._num,), self.device, self.group, self.n_agents
        lead = (*b, n)
        if self._pad:
            obs: Any = Unbounded((*lead, *self._obs_shape), torch.float32, dev)
        else:
            spaces = self._agent_spaces
            same = all(
                np.array_equal(s.low, spaces[0].low) and np.array_equal(s.high, spaces[0].high)
                for s in spaces
            )
            obs = spec_from_space(spaces[0], lead, device=dev)
            if not same:  # agents with other bounds: one spec holds them all
                obs = Unbounded(obs.shape, obs.dtype, dev)
        act = spec_from_space(self._act_space, lead, device=dev)
        entries = {OBSERVATION: obs}
        if self._action_mask is not None:
            k = self._action_mask.shape[1]
            entries[ACTION_MASK] = Binary(k, (*lead, k), dtype=torch.bool, device=dev)
        self.observation_spec = Composite(
            {g: Composite(entries, shape=lead, device=dev)}, shape=b, device=dev
        )
        self.action_spec = Composite(
            {g: Composite({ACTION: act}, shape=lead, device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, {g: n}, device=dev)
        self.done_spec = make_done_spec(b, {g: n}, device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def simulators(self) -> list[Any]:
        """The Gymnasium env of each instance (read them, do not step them)."""
        return list(self._sims)

    @property
    def num_envs(self) -> int:
        return self._num

    # ------------------------------------------------------------------ conversions
    def _write_obs(self, out: np.ndarray, index: int, raw: Any) -> None:
        """Instance ``index``'s observations (a tuple, one per agent) into ``out[index]``."""
        try:
            if self._pad:
                row = out[index]
                row[:] = 0
                for j, o in enumerate(raw):
                    flat = np.asarray(o).reshape(-1)
                    row[j, : flat.size] = flat
                if len(raw) != self.n_agents:
                    raise ValueError(f"{len(raw)} observations for {self.n_agents} agents")
            else:
                if len(raw) != self.n_agents:
                    raise ValueError(f"{len(raw)} observations for {self.n_agents} agents")
                out[index] = raw
        except (ValueError, TypeError) as err:
            shapes = [list(np.shape(o)) for o in raw] if isinstance(raw, (tuple, list)) else None
            raise SimulatorOutputError(
                f"env {index} returned observations {shapes or describe(raw)} that do not fit "
                f"({self.group!r}, 'observation') [{self.n_agents}, "
                f"{', '.join(map(str, self._obs_shape))}]: {err}"
            ) from None

    def _check_finite(self, array: np.ndarray, what: str) -> None:
        if array.dtype.kind != "f" or _finite_sum(array):
            return  # a finite sum: every entry is finite (the sum is a third cheaper)
        self._explain_not_finite(array, what)

    @staticmethod
    def _explain_not_finite(array: np.ndarray, what: str) -> None:
        """Raise where ``array``, whose sum is not finite, has an entry that is not (an
        overflowing sum of finite entries passes)."""
        if not np.isfinite(array).all():
            where = np.argwhere(~np.isfinite(array))[0].tolist()
            raise SimulatorOutputError(
                f"the env returned a {what} that is not finite: {array[tuple(where)]} at index "
                f"{where} ([env, agent, ...])"
            )

    def _actions(self, tensordict: TensorDictBase) -> list[Any]:
        """The batch's actions as each instance's ``step`` takes them: a list per instance, one
        entry per agent (ints for Discrete spaces, arrays for the others)."""
        action = get_entry(tensordict, (self.group, ACTION))
        start = self._discrete_start
        if start is not None:  # [N, n] int64
            if not start:
                return action.tolist()  # Python ints straight from the tensor, on any device
            return (action.detach().cpu().numpy() + start).tolist()
        actions = to_space(self._act_space, action)  # [N, n, ...], the space's start added
        return [list(a) for a in actions]

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> int:
        check_seed(seed, "Gymnasium")
        self._seeds = [seed + i for i in range(self._num)]
        return seed + self._num

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None or self._obs is None:
            mask = np.ones(self._num, dtype=bool)
            obs = np.empty((self._num, self.n_agents, *self._obs_shape), self._obs_dtype)
        else:
            mask = env_mask.detach().cpu().numpy().reshape(self._num).astype(bool)
            obs = self._obs.copy()  # a fresh array: earlier outputs keep theirs
        before = None if self.rule is None else self.rule.before_reset
        for i in np.flatnonzero(mask).tolist():
            if before is not None:
                before(self._sims[i].unwrapped)
            raw, _ = self._sims[i].reset(seed=self._seeds[i])
            self._seeds[i] = None
            self._write_obs(obs, i, raw)
        self._check_finite(obs[mask], f"({self.group!r}, 'observation')")
        for i in np.flatnonzero(mask).tolist():
            self._steps[i] = 0
        self._needs_reset &= ~mask
        self._ended = bool(self._needs_reset.any())
        self._obs = obs
        return self._output(obs, {}, {})

    def _output(self, obs: np.ndarray, group: dict[str, Any], root: dict[str, Any]) -> Any:
        dev = self.device
        entries = {OBSERVATION: self._tensor(obs), **group}
        if self._action_mask is not None:  # the same for every step: a fresh copy each time
            mask = np.broadcast_to(self._action_mask, (self._num, *self._action_mask.shape))
            entries[ACTION_MASK] = self._tensor(mask.copy())
        inner = unchecked_tensordict(entries, self._group_batch, dev, nested=False)
        return unchecked_tensordict({self.group: inner, **root}, self.batch_size, dev, nested=False)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        if self._on_cpu:
            return torch.from_numpy(array)
        return torch.from_numpy(array).to(self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._ended or self._obs is None:
            check_steppable(type(self).__name__, self._obs is None, self._needs_reset, "ended")
        actions = self._actions(tensordict)
        num, n = self._num, self.n_agents
        obs = np.empty((num, n, *self._obs_shape), self._obs_dtype)
        reward = np.empty((num, n, 1), dtype=np.float32)
        rewards = reward[..., 0]  # [N, n]: one row per instance
        # [N, 1] each: the env's flags, decided per instance as it steps (see _classify)
        terminated = np.empty((num, 1), dtype=bool)
        truncated = np.empty((num, 1), dtype=bool)
        steps = [k + 1 for k in self._steps]
        ended = False
        for i, sim in enumerate(self._sims):
            raw, rew, done, cut, _ = sim.step(actions[i])
            self._write_obs(obs, i, raw)
            try:
                rewards[i] = rew
            except (ValueError, TypeError):
                raise SimulatorOutputError(
                    f"env {i} returned a reward {describe(rew)} that does not fit "
                    f"({self.group!r}, 'reward'): one per agent ({n}) or one for all"
                ) from None
            term, trunc = self._classify(sim, _flag(done), _flag(cut), steps[i])
            terminated[i, 0] = term
            truncated[i, 0] = trunc
            ended = ended or term or trunc
        if self._float_obs and not _finite_sum(obs):
            self._explain_not_finite(obs, f"({self.group!r}, 'observation')")
        if not _finite_sum(reward):
            self._explain_not_finite(reward[..., 0], f"({self.group!r}, 'reward')")
        if self.common_reward:
            common = reward.sum(1) if self.reward_scalarisation == "sum" else reward.mean(1)
            reward = np.repeat(common[:, None], n, axis=1)  # [N, 1] to [N, n, 1]
        self._steps = steps
        if ended:  # else every instance may step again, as before this step (checked above)
            self._needs_reset = (terminated | truncated).reshape(num)
            self._ended = True
        self._obs = obs
        root = {TERMINATED: self._tensor(terminated), TRUNCATED: self._tensor(truncated)}
        return self._output(obs, {REWARD: self._tensor(reward)}, root)

    def _classify(self, sim: Any, done: bool, cut: bool, steps: int) -> tuple[bool, bool]:
        """An instance's ``terminated`` and ``truncated`` from its flags after its ``steps``-th
        step: a ``done`` the task's rule calls a time limit is truncated, and so is reaching
        ``time_limit``; an episode that terminated at its last step stays terminated."""
        truncated = cut and not done
        if done and self.rule is not None and self.rule.truncated(sim.unwrapped):
            done, truncated = False, True
        if self.time_limit is not None and steps >= self.time_limit and not done:
            truncated = True
        return done, truncated

    def _render(self, env_index: int) -> np.ndarray:
        if self._obs is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before render()")
        sim = self._sims[env_index]
        render = sim.unwrapped.render
        try:
            takes_mode = "mode" in inspect.signature(render).parameters
        except (TypeError, ValueError):
            takes_mode = False
        frame = render(mode="rgb_array") if takes_mode else sim.render()
        if not isinstance(frame, np.ndarray):
            raise RuntimeError(
                f"{_name(sim)} returned no frame ({type(frame).__name__}); an env without "
                "render(mode=...) must be made with render_mode='rgb_array'"
            )
        return frame[..., :3] if frame.ndim == 3 and frame.shape[-1] == 4 else frame

    def _close(self) -> None:
        for sim in self._sims:
            sim.close()


def _discrete_sizes(spaces: Any, given: Sequence[Any]) -> list[int] | None:
    """The sizes of Discrete action spaces that share a start, else ``None``."""
    if not all(isinstance(s, spaces.Discrete) for s in given):
        return None
    if len({int(s.start) for s in given}) != 1:
        return None
    return [int(s.n) for s in given]


def _name(sim: Any) -> str:
    spec = getattr(sim, "spec", None)
    return getattr(spec, "id", None) or type(getattr(sim, "unwrapped", sim)).__name__


# ---------------------------------------------------------------------- families
def _entry_point(gym: Any, env_id: str) -> str:
    entry = gym.spec(env_id).entry_point
    if isinstance(entry, str):
        return entry
    return f"{getattr(entry, '__module__', '')}:{getattr(entry, '__qualname__', '')}"


def _resolve(family: str, scenario: str) -> tuple[Any, str, TaskRule | None]:
    """Gymnasium, the id to make and the rule of its simulator; the family's package (or the
    id's ``module:`` prefix) imported first so that its ids are registered."""
    gym = _gym()
    if not isinstance(scenario, str) or not scenario:
        raise ValueError(f"a {family} env id must be a non-empty str, got {scenario!r}")
    rule = RULES.get(family)
    if rule is not None:
        import_optional(rule.package, extra=family, purpose=f"the {family} adapter")
    module, _, env_id = scenario.rpartition(":")
    if module:
        importlib.import_module(module)
    elif rule is None and env_id not in gym.registry:
        for known in RULES.values():  # gymma/<an LBF or RWARE id>: register their ids
            try:
                importlib.import_module(known.package)
            except ImportError:
                continue
    if env_id not in gym.registry:
        ids = scenarios(family) if rule is not None else list(gym.registry)
        hint = did_you_mean(env_id, ids, n=5, cutoff=0.6)
        raise UnknownEnvError(
            f"no {family} env {env_id!r}.{hint} `marlkit list --all` shows the ids"
        )
    entry = _entry_point(gym, env_id)
    found = next((r for r in RULES.values() if r.entry_point == entry), None)
    if rule is not None and found is not rule:
        raise UnknownEnvError(f"{env_id!r} is not a {family} env (its entry point is {entry})")
    return gym, env_id, found


def _constructor_kwargs(gym: Any, env_id: str, rule: TaskRule | None) -> list[str] | None:
    """The simulator constructor's keywords (those the adapter sets itself left out), ``None``
    when they cannot be told."""
    entry = gym.spec(env_id).entry_point
    try:
        creator = entry if callable(entry) else gym.envs.registration.load_env_creator(entry)
    except Exception:  # gymnasium.make raises the real error
        return None
    skip = {"render_mode", *(() if rule is None else (rule.limit_kwarg,))}
    return keyword_names(creator, skip=skip)


def _options() -> list[str]:
    """The keywords :func:`build` takes itself."""
    return keyword_names(build, skip=("family", "scenario"), partial=True) or []


def kwargs_of(family: str, scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"{family}/{scenario}")`` takes: the simulator constructor's
    (its step limit left out: ``time_limit`` sets it), then :func:`build`'s own; ``None`` when
    the constructor's cannot be told.

    Raises:
        UnknownEnvError: no such id in the family.
    """
    gym, env_id, rule = _resolve(family, scenario)
    names = _constructor_kwargs(gym, env_id, rule)
    return None if names is None else [*names, *_options()]


def scenarios(family: str) -> list[str]:
    """The Gymnasium ids of ``family``'s simulator (LBF's ``Foraging-...-v3``, RWARE's
    ``rware-...-v2``); for ``gymma`` those of every simulator in :data:`RULES` installed."""
    gym = _gym()
    rules = [RULES[family]] if family in RULES else list(RULES.values())
    ids: list[str] = []
    for rule in rules:
        try:
            importlib.import_module(rule.package)
        except ImportError:
            continue
        ids += [
            env_id
            for env_id, spec in gym.registry.items()
            if isinstance(spec.entry_point, str) and spec.entry_point == rule.entry_point
        ]
    return sorted(ids)


def _build_one(gym: Any, env_id: str, kwargs: dict[str, Any]) -> Any:
    # The passive checker would warn at every step of this format (its reward is a list).
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def build(
    family: str,
    scenario: str,
    *,
    num_envs: int = 1,
    common_reward: bool = False,
    reward_scalarisation: Scalarisation = "sum",
    time_limit: int | None = None,
    group: str = DEFAULT_GROUP,
    seed: int | None = None,
    render_mode: str | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **env_kwargs: Any,
) -> GymmaEnv:
    """``marlkit.make(f"{family}/{scenario}", ...)``: ``family`` is ``"lbforaging"``,
    ``"rware"`` or ``"gymma"`` (any id in the format); ``env_kwargs`` go to the simulator's
    constructor (LBF's ``sight``, ``force_coop``; RWARE's ``reward_type``, ...).

    Args:
        num_envs: instances in the batch ``B = [num_envs]``.
        common_reward, reward_scalarisation: EPyMARL's reward options (see the module).
        time_limit: the episode length (``None``: the task's own, LBF 50 and RWARE 500).
        render_mode: ``"rgb_array"`` for :meth:`~marlkit.envs.EnvBase.render` (headless
            where there is no display).
        others: see :class:`GymmaEnv`.

    Raises:
        UnknownEnvError: no such id in the family (the message lists close matches).
        TypeError: a keyword neither this function nor the simulator takes (its step limit is
            refused: use ``time_limit``).
        ValueError: a bad option value.
    """
    gym, env_id, rule = _resolve(family, scenario)
    if rule is not None and rule.limit_kwarg in env_kwargs:
        raise TypeError(
            f"env '{family}/{scenario}': {rule.limit_kwarg!r} is the simulator's step limit; "
            f"pass time_limit={env_kwargs[rule.limit_kwarg]!r} (EPyMARL's time_limit), which sets "
            "it and makes the episodes it ends truncated"
        )
    names = _constructor_kwargs(gym, env_id, rule)
    if names is not None:
        check_kwargs(f"env '{family}/{scenario}'", env_kwargs, [*names, *_options()])
    if render_mode is not None and render_mode != "rgb_array":
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
    return GymmaEnv(
        functools.partial(_build_one, gym, scenario if ":" in scenario else env_id, env_kwargs),
        num_envs=num_envs,
        group=group,
        common_reward=common_reward,
        reward_scalarisation=reward_scalarisation,
        time_limit=time_limit,
        rule=rule,
        seed=seed,
        render=render_mode == "rgb_array",
        device=device,
        validate_actions=validate_actions,
    )


def is_multi_agent(env: Any) -> bool:
    """Whether a Gymnasium env looks like EPyMARL's format: Tuple observation and action spaces
    of the same length (two or more), and ``n_agents`` of that number where it says."""
    spaces = _gym().spaces
    obs, act = env.observation_space, env.action_space
    if not (isinstance(obs, spaces.Tuple) and isinstance(act, spaces.Tuple)):
        return False
    n = len(obs.spaces)
    declared = getattr(getattr(env, "unwrapped", env), "n_agents", n)
    return n >= 2 and len(act.spaces) == n and declared == n


def family_of(env_id: str) -> str:
    """The family whose rule knows ``env_id``'s simulator (``"gymma"`` when none does); a
    ``"module:"`` prefix is imported first (it registers the id)."""
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = _entry_point(_gym(), name)
    except Exception:  # not registered: gymma, which imports a "module:" prefix
        return "gymma"
    return next((r.family for r in RULES.values() if r.entry_point == entry), "gymma")


# ---------------------------------------------------------------------- the gymma family
def make_env(scenario: str, **kwargs: Any) -> GymmaEnv:
    """``marlkit.make("gymma/<id>")``: any Gymnasium id in EPyMARL's format (``"module:Id"``
    imports the module first); see :func:`build`."""
    return build("gymma", scenario, **kwargs)


def list_scenarios() -> list[str]:
    """The LBF and RWARE ids (any other id in the format is made by name)."""
    return scenarios("gymma")


def accepted_kwargs(scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"gymma/{scenario}")`` takes (see :func:`kwargs_of`)."""
    return kwargs_of("gymma", scenario)
