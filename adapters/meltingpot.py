"""MeltingPot substrates as marlkit envs, through the dict-of-agents machinery.

``marlkit.make("meltingpot/commons_harvest__open", num_envs=2, seed=0)`` builds ``num_envs``
instances of DeepMind's MeltingPot substrate (``dm-meltingpot`` on ``dmlab2d``; see
``docs/adapters.md`` for how it installs) and steps them in a Python loop as a
:class:`~marlkit.adapters._dict_env.DictEnv`: one marlkit step is one step of every player.

Keys, per group (``n`` players, ``B = [num_envs]``)::

    (group, "observation", "RGB")               [*B, n, 88, 88, 3] uint8: the player's view
    (group, "observation", "READY_TO_SHOOT")    [*B, n] float32 (each substrate has its own
    (group, "observation", "COLLECTIVE_REWARD") [*B, n] float32  vectors, under their names)
    (group, "action")                           [*B, n] int64, one of the substrate's actions
    ("next", group, "reward")                   [*B, n, 1] each player's own reward
    "state"                                     [*B, H, W, 3] uint8: ``WORLD.RGB``, the world

Players are ``player_0``, ``player_1``, ... in MeltingPot's order, taking ``roles`` (default:
the substrate's ``default_player_roles``). They form one group ``"agents"`` when every player
observes and acts alike (every substrate of dm-meltingpot 2.4 with its default roles), else one
group per role; ``group_map="by_role"`` asks for groups by role, and any marlkit group map works.

What MeltingPot gives is kept as it is, except:

* Floating observations (MeltingPot's float64 vectors) are float32, as every marlkit module
  computes (they hold counts and small sums).
* The episode end: MeltingPot ends an episode with a dm_env ``termination`` whether its step
  limit (``maxEpisodeLengthFrames``) came or the game itself ended it (most substrates end
  each step with a small probability once past a minimum length). Here an episode that ends on
  the step limit is truncated; one that ends before it is terminated.
* ``WORLD.RGB`` (MeltingPot's global observation, given to every player) is the ``"state"``,
  not a player's observation; ``render(i)`` returns it, so every env renders (``marlkit
  record``) at no extra cost.
* Seeds: a seeded reset builds the substrate again with MeltingPot's ``env_seed`` (the seed of
  its Lua simulation and of its episodes); an unseeded one goes on from the last. MeltingPot does
  not replay an episode from its seed, for a reason outside it and outside marlkit (see
  :attr:`_Substrate.upstream_nondeterminism`; the tests pin it): its Lua code hands the
  seeded spawn points to the avatars (and runs later steps of some substrates) in the
  ``pairs()`` order of tables keyed by strings and by objects, which dmlab2d's LuaJIT 2.1 draws
  anew for every Lua state, that is for every build: string ids from a generator seeded by the
  operating system (``getrandom``), objects by their memory addresses. Two builds with one
  ``env_seed`` can start with the players in each other's places. Seeded rollouts are not
  reproducible here either.

MeltingPot's *scenarios* (a substrate whose background players are trained bots, TensorFlow
saved models that dm-meltingpot downloads when it builds) are not built: their names are known
and refused with the reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch

from marlkit._checks import check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import has_module
from marlkit.adapters._dict_env import DictEnv
from marlkit.adapters._dict_layout import gym_spaces
from marlkit.adapters._dict_writer import StepView
from marlkit.data.group_map import GroupMapLike
from marlkit.envs.registry import UnknownEnvError

__all__ = ["MeltingPotEnv", "accepted_kwargs", "list_scenarios", "make_env"]

#: MeltingPot's global observation: the whole world, drawn (the env's ``"state"``).
WORLD = "WORLD.RGB"

_INSTALL = (
    "the MeltingPot adapter needs dm-meltingpot and dmlab2d: `make install` installs them "
    "here (see docs/adapters.md, 'MeltingPot'), or pip install dm-meltingpot where "
    "storage.googleapis.com is reachable (its build downloads its bots)"
)


def _meltingpot(name: str) -> ModuleType:
    """``meltingpot.<name>`` (``substrate``, ``configs.scenarios``).

    dm-meltingpot's ``meltingpot/__init__.py`` imports its bots, and with them TensorFlow, which
    its substrates never use. Where TensorFlow is not installed, the package's module is made
    from its spec without running that file, so that its submodules import; importing
    ``meltingpot.bot`` or ``meltingpot.scenario`` then fails as it would anyway (no
    TensorFlow), and nothing else changes.
    """
    if "meltingpot" not in sys.modules:
        spec = importlib.util.find_spec("meltingpot")
        if spec is None or not has_module("dmlab2d"):
            raise ImportError(_INSTALL)
        if not has_module("tensorflow"):
            package = importlib.util.module_from_spec(spec)
            sys.modules["meltingpot"] = package
    try:
        return importlib.import_module(f"meltingpot.{name}")
    except ModuleNotFoundError as err:
        raise ImportError(f"{_INSTALL} ({err})") from err


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree: no metadata
        return "(version unknown)"


def list_scenarios() -> list[str]:
    """The MeltingPot substrates (``commons_harvest__open``, ...), when dm-meltingpot imports."""
    if not (has_module("meltingpot") and has_module("dmlab2d")):
        return []
    return sorted(_meltingpot("configs.substrates").SUBSTRATES)  # no dmlab2d, no JAX imported


def _options() -> list[str]:
    return keyword_names(make_env, skip=("scenario",), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"meltingpot/{scenario}")`` takes (:func:`make_env`'s).

    Raises:
        UnknownEnvError: not a MeltingPot substrate (a ``KeyError``).
    """
    _config(scenario)
    return _options()


def _config(name: str) -> Any:
    """The substrate's config, or an error saying what ``name`` is."""
    substrate = _meltingpot("substrate")
    if name in substrate.SUBSTRATES:
        return substrate.get_config(name)
    scenarios = _meltingpot("configs.scenarios").SCENARIO_CONFIGS
    if name in scenarios:
        raise UnknownEnvError(
            f"meltingpot/{name} is a MeltingPot scenario (substrate "
            f"{scenarios[name].substrate!r} with background bots); marlkit builds substrates "
            "only: a scenario's bots are TensorFlow saved models that dm-meltingpot downloads "
            "when its package is built (the install `make install` makes has neither them nor "
            f"TensorFlow). The substrate itself is meltingpot/{scenarios[name].substrate}"
        )
    hint = did_you_mean(name, substrate.SUBSTRATES, n=3, cutoff=0.6)
    raise UnknownEnvError(
        f"no MeltingPot substrate {name!r}.{hint} Substrates: "
        f"{', '.join(sorted(substrate.SUBSTRATES))}"
    )


def _space(spec: Any) -> Any:
    """A dm_env array spec as a Gymnasium space (floats as float32)."""
    spaces = gym_spaces()
    shape = tuple(spec.shape)
    dtype = np.dtype(spec.dtype)
    if np.issubdtype(dtype, np.floating):
        low = getattr(spec, "minimum", -np.inf)
        high = getattr(spec, "maximum", np.inf)
        return spaces.Box(
            np.broadcast_to(np.asarray(low, np.float32), shape),
            np.broadcast_to(np.asarray(high, np.float32), shape),
            shape,
            np.float32,
        )
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        low = np.broadcast_to(np.asarray(getattr(spec, "minimum", info.min), dtype), shape)
        high = np.broadcast_to(np.asarray(getattr(spec, "maximum", info.max), dtype), shape)
        return spaces.Box(low, high, shape, dtype)
    raise TypeError(f"MeltingPot observation {spec.name!r} of dtype {dtype} has no marlkit spec")


class _Substrate:
    """One MeltingPot substrate with the PettingZoo-parallel protocol that
    :class:`~marlkit.adapters._dict_env.DictEnv` steps (players ``player_0``, ...)."""

    def __init__(
        self,
        name: str,
        config: Any,
        roles: Sequence[str],
        max_episode_steps: int | None = None,
        seed: int | None = None,
    ):
        self.name = name
        self.roles = tuple(roles)
        self._config = config
        # Built once per instance, as meltingpot.substrate.build does (a reset reuses them).
        self._settings = config.lab2d_settings_builder(roles=self.roles, config=config)
        if max_episode_steps is not None:
            self._settings["maxEpisodeLengthFrames"] = max_episode_steps
        self._max_steps = int(self._settings.get("maxEpisodeLengthFrames", 0)) or None
        #: The last dm_env ``TimeStep`` of the substrate, as MeltingPot gave it.
        self.timestep: Any = None
        self._env = self._build(seed)
        # The seed the substrate was built with, until its first reset: a first reset with that
        # seed need not build it again.
        self._fresh_seed = seed
        self.possible_agents = [f"player_{i}" for i in range(len(self.roles))]
        self.agents: list[str] = []
        specs = self._env.observation_spec()
        self._global = frozenset(config.global_observation_names)
        spaces = gym_spaces()
        self._observation_spaces = {
            agent: spaces.Dict(
                {key: _space(spec) for key, spec in specs[i].items() if key not in self._global}
            )
            for i, agent in enumerate(self.possible_agents)
        }
        self._action_spaces = {
            agent: spaces.Discrete(int(self._env.action_spec()[i].num_values))
            for i, agent in enumerate(self.possible_agents)
        }
        self.state_space = _space(specs[0][WORLD]) if WORLD in specs[0] else None
        self._world: np.ndarray | None = None
        self._steps = 0

    def _build(self, seed: int | None) -> Any:
        """The substrate as ``meltingpot.substrate.build`` builds it, with MeltingPot's
        ``env_seed`` (which that function does not take)."""
        builder = _meltingpot("utils.substrates.builder")
        substrate = _meltingpot("utils.substrates.substrate")
        wrappers = "utils.substrates.wrappers"
        env = builder.builder(self._settings, env_seed=seed)
        try:
            env = _meltingpot(f"{wrappers}.observables_wrapper").ObservablesWrapper(env)
            env = _meltingpot(f"{wrappers}.multiplayer_wrapper").Wrapper(
                env,
                individual_observation_names=self._config.individual_observation_names,
                global_observation_names=self._config.global_observation_names,
            )
            env = _meltingpot(f"{wrappers}.discrete_action_wrapper").Wrapper(
                env, action_table=self._config.action_set
            )
            env = _meltingpot(f"{wrappers}.collective_reward_wrapper").CollectiveRewardWrapper(env)
            return substrate.Substrate(env)
        except Exception:
            env.close()
            raise

    @property
    def upstream_nondeterminism(self) -> str:
        """Why the substrate does not replay a seed (``check_adapter`` reports it, every time,
        instead of comparing rollouts that agree now and then)."""
        return (
            f"dm-meltingpot {_version('dm-meltingpot')} hands the spawn points its env_seed draws "
            "to the avatars in the pairs() order of Lua tables keyed by strings and by objects "
            "(base_simulation.lua's _avatarStart; later steps of some substrates too), "
            f"which dmlab2d {_version('dmlab2d')}'s LuaJIT 2.1 draws anew in every Lua state, "
            "that is every build: string ids from a generator seeded by the operating system "
            "(getrandom), objects by their memory addresses. So builds with one env_seed can "
            "start with the players in each other's places, and go on differently"
        )

    @property
    def upstream_simulator(self) -> Any:
        """MeltingPot's own substrate under this shim (``check_adapter`` names it where a
        seed does not replay)."""
        return self._env

    def observation_space(self, agent: str) -> Any:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self._action_spaces[agent]

    def _observations(self, timestep: Any) -> dict[str, dict[str, Any]]:
        self.timestep = timestep
        observations = timestep.observation
        if self.state_space is not None:
            self._world = observations[0][WORLD]
        return {
            agent: {key: value for key, value in obs.items() if key not in self._global}
            for agent, obs in zip(self.possible_agents, observations)
        }

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None and seed != self._fresh_seed:
            self._env.close()
            self._env = None
            self._env = self._build(seed)
        self._fresh_seed = None
        timestep = self._env.reset()
        self._steps = 0
        self.agents = list(self.possible_agents)
        return self._observations(timestep), {}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        timestep = self._env.step([int(actions[agent]) for agent in self.possible_agents])
        self._steps += 1
        rewards = {
            agent: float(reward) for agent, reward in zip(self.possible_agents, timestep.reward)
        }
        last = timestep.last()
        cut = last and self._max_steps is not None and self._steps >= self._max_steps
        terminations = dict.fromkeys(self.possible_agents, last and not cut)
        truncations = dict.fromkeys(self.possible_agents, cut)
        if last:
            self.agents = []
        return self._observations(timestep), rewards, terminations, truncations, {}

    def state(self) -> np.ndarray:
        if self._world is None:
            raise RuntimeError("MeltingPot substrate: reset() before state()")
        return self._world

    def render(self) -> np.ndarray:
        return self.state()

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class MeltingPotEnv(DictEnv):
    """A batch of MeltingPot substrates (see the module docstring for keys and rules).

    Attributes:
        substrate: the substrate's name.
        roles: each player's role, in player order.
    """

    def __init__(
        self,
        substrate: str,
        roles: Sequence[str],
        simulators: Sequence[_Substrate],
        *,
        group_map: GroupMapLike,
        state: bool,
        device: str | torch.device,
        validate_actions: bool,
        seed: int | None,
    ):
        self.substrate = substrate
        self.roles = tuple(roles)
        first = simulators[0]
        super().__init__(
            simulators,
            group_map=group_map,
            state_space=first.state_space if state and first.state_space is not None else False,
            render=True,
            device=device,
            validate_actions=validate_actions,
            seed=seed,
        )

    def _reset_instance(self, index: int, seed: int | None) -> StepView:
        sim = self._simulators[index]
        observations, infos = sim.reset(seed=seed)
        return StepView(observations, list(sim.agents), infos=infos)

    def _step_instance(self, index: int, actions: dict[str, Any]) -> StepView:
        sim = self._simulators[index]
        observations, rewards, terminations, truncations, infos = sim.step(actions)
        return StepView(observations, list(sim.agents), rewards, terminations, truncations, infos)

    def __repr__(self) -> str:
        return (
            f"MeltingPotEnv({self.substrate!r}, num_envs={self.num_envs}, "
            f"players={len(self.roles)}, groups={list(self.group_map)})"
        )


def _roles(name: str, config: Any, roles: Sequence[str] | None) -> tuple[str, ...]:
    if roles is None:
        return tuple(config.default_player_roles)
    if isinstance(roles, str) or not isinstance(roles, Sequence):
        raise TypeError(f"roles must be a sequence of role names (one per player), got {roles!r}")
    valid = set(config.valid_roles)
    bad = [role for role in roles if role not in valid]
    if bad or not roles:
        raise ValueError(
            f"meltingpot/{name}: roles {bad or list(roles)} are not among the substrate's roles "
            f"{sorted(valid)} (one role per player, at least one player)"
        )
    return tuple(roles)


def _group_map(
    sim: _Substrate, group_map: GroupMapLike | Literal["by_role"] | None
) -> GroupMapLike:
    by_role: dict[str, list[str]] = {}
    for agent, role in zip(sim.possible_agents, sim.roles):
        by_role.setdefault(role, []).append(agent)
    if group_map == "by_role":
        return by_role
    if group_map is not None:
        return group_map
    head = sim.possible_agents[0]
    alike = all(
        sim.observation_space(agent) == sim.observation_space(head)
        and sim.action_space(agent) == sim.action_space(head)
        for agent in sim.possible_agents
    )
    return "agents" if alike else by_role


def make_env(
    scenario: str,
    *,
    num_envs: int = 1,
    roles: Sequence[str] | None = None,
    group_map: GroupMapLike | Literal["by_role"] | None = None,
    seed: int | None = None,
    state: bool = True,
    max_episode_steps: int | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **kwargs: Any,
) -> MeltingPotEnv:
    """Build ``meltingpot/<scenario>``, one of ``meltingpot.substrate.SUBSTRATES``.

    Args:
        num_envs: instances stepped in a loop (``ParallelEnv`` spreads them over processes).
        roles: one role per player (default: the substrate's ``default_player_roles``); their
            number is the number of players.
        group_map: ``None`` (``"agents"`` when every player observes and acts alike, else one
            group per role), ``"by_role"``, or any marlkit group map over ``player_<i>``.
        seed: MeltingPot's ``env_seed`` of instance ``i`` at its first reset is ``seed + i``
            (MeltingPot does not replay episodes from it: see the module docstring).
        state: declare ``"state"`` (``WORLD.RGB``); ``False`` leaves it out of every step.
        max_episode_steps: MeltingPot's step limit (``maxEpisodeLengthFrames``; default the
            substrate's, 1,000 to 5,000); an episode that reaches it is truncated.
        device, validate_actions: see :class:`~marlkit.envs.EnvBase`.

    Raises:
        UnknownEnvError: not a substrate (a ``KeyError``; a scenario's name says why it is not
            built).
        ValueError: a role the substrate does not have.
        TypeError: a keyword this function does not take (the message suggests the closest).
        ImportError: dm-meltingpot or dmlab2d missing.
    """
    config = _config(scenario)
    check_kwargs(f"env 'meltingpot/{scenario}'", kwargs, _options())
    check_int("num_envs", num_envs, low=1)
    check_int("max_episode_steps", max_episode_steps, low=1, allow_none=True)
    check_int("seed", seed, low=0, allow_none=True)  # MeltingPot's env_seed, before any build
    player_roles = _roles(scenario, config, roles)
    simulators: list[_Substrate] = []
    try:
        for i in range(num_envs):
            first_seed = None if seed is None else seed + i  # what set_seed(seed) gives it
            simulators.append(
                _Substrate(scenario, config, player_roles, max_episode_steps, first_seed)
            )
        return MeltingPotEnv(
            scenario,
            player_roles,
            simulators,
            group_map=_group_map(simulators[0], group_map),
            state=state,
            device=device,
            validate_actions=validate_actions,
            seed=seed,
        )
    except BaseException:
        for sim in simulators:
            sim.close()
        raise
