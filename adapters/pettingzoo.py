"""PettingZoo parallel and AEC envs as marlkit envs.

``marlkit.make("pettingzoo/mpe2.simple_spread_v3", N=3, num_envs=4, seed=0)`` imports the module
``mpe2.simple_spread_v3`` and builds ``num_envs`` instances of its ``parallel_env`` (or of its
``env``, the AEC one, when it has no parallel version, or with ``api="aec"``); every other
keyword goes to the PettingZoo constructor, and one the constructor does not take is refused
with the closest names it does take (``n=3`` -> ``N``). :class:`PettingZooEnv` wraps an env
object or a factory directly. The batch ``[num_envs]`` is stepped in a Python loop (PettingZoo
offers nothing batched); wrap it in :class:`~marlkit.envs.ParallelEnv` to spread it over processes.

Keys (see :mod:`marlkit.adapters._dict_env` for the whole layout):

* ``(group, "observation")``; a ``Dict(observation=..., action_mask=...)`` space (classic games)
  gives ``(group, "observation")`` and ``(group, "action_mask")`` ``[*B, n, A]`` bool, as does an
  ``"action_mask"`` in the agents' infos. The random policy samples legal actions only.
  ``illegal_actions="raise"`` (default) refuses an illegal action with an
  :class:`~marlkit.envs.InvalidActionError` before any simulator moves; ``"mask"`` replaces it
  by the agent's first legal action.
* ``(group, "mask")`` ``[*B, n]``: the agent is still in the game. An agent that dies or leaves
  gets, at the step it leaves, its reward, its final observation (when PettingZoo gives one) and
  done; afterwards zero observations, zero reward, done true and mask false. The episode (root
  ``done``) is over when no agent is left or all are done.
* ``"state"``: ``env.state()`` when the env has a ``state_space`` (MPE does).

AEC (turn-based) envs: one marlkit step applies the action of the agent whose turn it is
(``agent_selection``) and ignores the others'; ``(group, "acting")`` ``[*B, n]`` bool says who
acts next. Agents that are done are removed (PettingZoo's ``step(None)``) within the same step.
Observations are given for every agent still in the game. The action mask of an agent that is
not acting allows every action (its action is ignored), so that any policy output passes.
``("next", group, "reward")`` is, for every agent, the reward that this one move earned it
(PettingZoo's ``rewards``): summed over an episode it equals what PettingZoo hands out through
``last()``/``_cumulative_rewards``, which only defers each agent's share to its next turn.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import torch

from marlkit._checks import check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import has_module, import_optional
from marlkit.adapters._dict_env import DictEnv, IllegalActions, SimulatorOutputError
from marlkit.adapters._dict_writer import StepView
from marlkit.data.group_map import GroupMapLike
from marlkit.envs._memory import check_on_probe
from marlkit.envs.registry import UnknownEnvError

__all__ = [
    "PettingZooEnv",
    "SimulatorOutputError",
    "accepted_kwargs",
    "list_scenarios",
    "make_env",
]

Api = Literal["auto", "parallel", "aec"]

_MPE = ("mpe2", "pygame")
_PZ = ("pettingzoo", "pygame")
#: Scenarios known to work here, with the modules each one needs (``cooperative_pong_v6`` is left
#: out: its reset renders, and warns, without a render mode).
_SCENARIOS: dict[str, tuple[str, ...]] = {
    **{
        f"mpe2.{name}": _MPE
        for name in (
            "simple_v3",
            "simple_adversary_v3",
            "simple_crypto_v3",
            "simple_push_v3",
            "simple_reference_v3",
            "simple_speaker_listener_v4",
            "simple_spread_v3",
            "simple_tag_v3",
            "simple_world_comm_v3",
        )
    },
    "pettingzoo.classic.tictactoe_v3": _PZ,
    "pettingzoo.classic.connect_four_v3": _PZ,
    "pettingzoo.classic.rps_v2": _PZ,
    "pettingzoo.classic.go_v5": _PZ,
    "pettingzoo.classic.chess_v6": (*_PZ, "chess"),
    "pettingzoo.classic.leduc_holdem_v4": (*_PZ, "rlcard"),
    "pettingzoo.classic.texas_holdem_v4": (*_PZ, "rlcard"),
    "pettingzoo.butterfly.knights_archers_zombies_v11": _PZ,
    "pettingzoo.butterfly.pistonball_v6": (*_PZ, "pymunk"),
    "pettingzoo.sisl.pursuit_v5": _PZ,
    "pettingzoo.sisl.multiwalker_v9": (*_PZ, "Box2D"),
}

#: PettingZoo >= 1.26 warns when an env module is imported instead of using its registry.
_OLD_API_WARNING = "The old environment creation API has been deprecated"


def list_scenarios() -> list[str]:
    """The curated scenarios whose simulator is installed here, e.g. ``mpe2.simple_spread_v3``.

    Any other PettingZoo env module works too: ``marlkit.make("pettingzoo/<module path>")``.
    """
    return sorted(name for name, needs in _SCENARIOS.items() if all(map(has_module, needs)))


def _import_scenario(name: str) -> ModuleType:
    """The module of scenario ``name``: a module path, or a curated scenario's last part."""
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"a PettingZoo scenario is a module path such as 'mpe2.simple_spread_v3', got {name!r}"
        )
    if "." not in name:
        matches = [s for s in _SCENARIOS if s.rsplit(".", 1)[1] == name]
        if len(matches) == 1:
            name = matches[0]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_OLD_API_WARNING, category=DeprecationWarning)
            return importlib.import_module(name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing and missing != name and not name.startswith(missing + "."):
            raise ImportError(
                f"PettingZoo scenario {name!r} needs the module {missing!r}, which is not "
                f"installed ({err})"
            ) from err
        hint = did_you_mean(name, _SCENARIOS, n=3, cutoff=0.6)
        raise UnknownEnvError(
            f"no PettingZoo env module {name!r}.{hint} Known here: {', '.join(list_scenarios())}"
        ) from None


def _set_headless() -> None:
    # pygame (MPE, classic games) opens no window for rgb_array, but SDL still needs a driver.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def _is_instance(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, "step", None))


def _api_of(env: Any) -> Literal["parallel", "aec"]:
    pz = import_optional("pettingzoo", extra="pettingzoo", purpose="the PettingZoo adapter")
    if isinstance(env, pz.AECEnv):
        return "aec"
    if isinstance(env, pz.ParallelEnv):
        return "parallel"
    aec = callable(getattr(env, "observe", None)) and callable(getattr(env, "last", None))
    return "aec" if aec else "parallel"


def _convert(env: Any, api: Api) -> Any:
    """``env`` speaking ``api`` (PettingZoo's own conversion wrappers when it does not)."""
    kind = _api_of(env)
    if api == "auto" or api == kind:
        return env
    conversions = importlib.import_module("pettingzoo.utils.conversions")
    if api == "aec":
        return conversions.parallel_to_aec(env)
    if not env.metadata.get("is_parallelizable", False):
        raise ValueError(
            f"{type(env).__name__} is an AEC env that PettingZoo does not declare parallelizable "
            "(metadata['is_parallelizable']); use api='aec'"
        )
    return conversions.aec_to_parallel(env)


class PettingZooEnv(DictEnv):
    """A batch of PettingZoo envs (parallel or AEC) as one marlkit env.

    Args:
        env: a PettingZoo env object (then ``num_envs`` must be 1) or a zero-argument factory
            returning one, called ``num_envs`` times.
        num_envs: instances in the batch ``B = [num_envs]``.
        api: ``"auto"`` (what ``env`` is), ``"parallel"`` or ``"aec"`` (converted with
            PettingZoo's wrappers when needed).
        group_map: ``"agents"``, ``"per_agent"``, ``"by_type"``, ``{group: [agents]}``, or
            ``None``: ``"agents"`` when all agents share their spaces, else ``"by_type"``.
        illegal_actions: ``"raise"`` or ``"mask"`` (replace by the first legal action).
        seed: instance ``i`` is reset with ``seed + i`` (and its action spaces seeded).
        state: write ``env.state()`` as ``"state"`` when the env has a ``state_space``
            (``False`` saves its cost when no centralised critic needs it).
        device, validate_actions: see :class:`~marlkit.envs.EnvBase`.

    Rendering works when the envs were built with ``render_mode="rgb_array"``.
    """

    def __init__(
        self,
        env: Any,
        *,
        num_envs: int = 1,
        api: Api = "auto",
        group_map: GroupMapLike | None = None,
        illegal_actions: IllegalActions = "raise",
        seed: int | None = None,
        state: bool = True,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        check_int("num_envs", num_envs, low=1)
        if api not in ("auto", "parallel", "aec"):
            raise ValueError(f"api must be 'auto', 'parallel' or 'aec', got {api!r}")
        if _is_instance(env):
            if num_envs != 1:
                raise ValueError(
                    f"an env object makes one instance, not num_envs={num_envs}; pass a factory "
                    "(e.g. functools.partial(simple_spread_v3.parallel_env, N=3)) to batch"
                )
            instances = [env]
        elif callable(env):
            check_on_probe(
                "PettingZooEnv",
                num_envs,
                lambda: PettingZooEnv(
                    env,
                    api=api,
                    group_map=group_map,
                    illegal_actions=illegal_actions,
                    state=state,
                    device=device,
                    validate_actions=False,
                ),
                device=device,
            )
            instances = [self._build(env) for _ in range(num_envs)]
        else:
            raise TypeError(f"env must be a PettingZoo env or a factory, got {type(env).__name__}")
        instances = [_convert(sim, api) for sim in instances]
        self.api: Literal["parallel", "aec"] = _api_of(instances[0])
        self.turn_based = self.api == "aec"
        render = getattr(instances[0], "render_mode", None) == "rgb_array"
        super().__init__(
            instances,
            group_map=group_map,
            illegal_actions=illegal_actions,
            state_space=None if state else False,
            render=render,
            device=device,
            validate_actions=validate_actions,
            seed=seed,
        )

    @staticmethod
    def _build(factory: Callable[[], Any]) -> Any:
        sim = factory()
        if not _is_instance(sim):
            raise TypeError(f"the env factory returned {type(sim).__name__}, not a PettingZoo env")
        return sim

    # ------------------------------------------------------------------ AEC
    def _reset_instance(self, index: int, seed: int | None) -> StepView:
        if not self.turn_based:
            return super()._reset_instance(index, seed)
        sim = self._simulators[index]
        sim.reset(seed=seed)
        self._remove_done(index)
        present = list(sim.agents)
        observations = {a: sim.observe(a) for a in present}
        acting = sim.agent_selection if present else None
        return StepView(observations, present, infos=dict(sim.infos), acting=acting)

    def _step_instance(self, index: int, actions: dict[str, Any]) -> StepView:
        if not self.turn_based:
            return super()._step_instance(index, actions)
        sim = self._simulators[index]
        sim.step(actions[sim.agent_selection])
        rewards = dict(sim.rewards)
        terms, truncs = dict(sim.terminations), dict(sim.truncations)
        # Final observations of the agents this move ended, before PettingZoo removes them.
        observations = {a: sim.observe(a) for a in sim.agents if terms.get(a) or truncs.get(a)}
        self._remove_done(index)
        present = list(sim.agents)
        observations.update({a: sim.observe(a) for a in present})
        acting = sim.agent_selection if present else None
        return StepView(observations, present, rewards, terms, truncs, dict(sim.infos), acting)

    def _remove_done(self, index: int) -> None:
        """PettingZoo removes a done agent when it is stepped with ``None``: do it now."""
        sim = self._simulators[index]
        for _ in range(len(self.agent_names) + 1):
            if not sim.agents:
                return
            agent = sim.agent_selection
            if not (sim.terminations.get(agent) or sim.truncations.get(agent)):
                return
            sim.step(None)
        raise SimulatorOutputError(
            f"env {index}: agent {sim.agent_selection!r} is done but stepping it with None did "
            "not remove it from the game"
        )


def _constructor(module: ModuleType, api: Api) -> tuple[str, Callable[..., Any]]:
    """``(attribute, constructor)`` of an env module: ``parallel_env`` for ``api`` ``"auto"`` or
    ``"parallel"`` when the module has one, else ``env`` (AEC)."""
    has_parallel = callable(getattr(module, "parallel_env", None))
    if api == "parallel" and not has_parallel:
        raise ValueError(f"{module.__name__} has no parallel_env (it is AEC only); use api='aec'")
    attr = "parallel_env" if api in ("auto", "parallel") and has_parallel else "env"
    build = getattr(module, attr, None)
    if not callable(build):
        raise UnknownEnvError(
            f"{module.__name__} is not a PettingZoo env module (no env/parallel_env)"
        )
    return attr, build


def _constructor_kwargs(module: ModuleType, build: Callable[..., Any]) -> list[str] | None:
    """The keywords the constructor takes, or ``None`` when they cannot be told. PettingZoo's
    ``env`` and ``parallel_env`` take ``**kwargs`` and hand them to the module's ``raw_env``
    (the convention of its env modules), whose signature is then the one that counts."""
    names = keyword_names(build)
    if names is not None:
        return names
    raw_env = getattr(module, "raw_env", None)
    return keyword_names(raw_env) if callable(raw_env) else None


def _options() -> list[str]:
    """The keywords :func:`make_env` takes itself (every other one goes to the constructor)."""
    return keyword_names(make_env, skip=("scenario",), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"pettingzoo/{scenario}")`` takes: the PettingZoo
    constructor's, then :func:`make_env`'s own; ``None`` when the constructor's cannot be told
    (it takes ``**kwargs`` and its module has no ``raw_env`` that says more).

    Raises:
        UnknownEnvError: no such module (a ``KeyError``).
    """
    module = _import_scenario(scenario)
    names = _constructor_kwargs(module, _constructor(module, "auto")[1])
    return None if names is None else [*names, *_options()]


def make_env(
    scenario: str,
    *,
    num_envs: int = 1,
    group_map: GroupMapLike | None = None,
    api: Api = "auto",
    seed: int | None = None,
    illegal_actions: IllegalActions = "raise",
    state: bool = True,
    render_mode: str | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **env_kwargs: Any,
) -> PettingZooEnv:
    """Build ``pettingzoo/<scenario>``: ``scenario`` is an env module path
    (``"mpe2.simple_spread_v3"``, ``"pettingzoo.classic.tictactoe_v3"``) or a curated scenario's
    last part (``"tictactoe_v3"``); ``env_kwargs`` go to the PettingZoo constructor.

    Args:
        render_mode: ``"rgb_array"`` to render frames (headless: SDL's dummy video driver is
            selected when ``SDL_VIDEODRIVER`` is unset).
        others: see :class:`PettingZooEnv`.

    Raises:
        UnknownEnvError: no such module (a ``KeyError``; the message lists the known
            scenarios).
        ValueError: ``api="parallel"`` for an env that only has an AEC version.
        TypeError: a keyword that neither this function nor the constructor takes (the message
            suggests the closest ones and lists them all).
    """
    if api not in ("auto", "parallel", "aec"):
        raise ValueError(f"api must be 'auto', 'parallel' or 'aec', got {api!r}")
    module = _import_scenario(scenario)
    attr, build = _constructor(module, api)
    names = _constructor_kwargs(module, build)
    if names is not None:  # None: the constructor checks them itself (see _construct)
        check_kwargs(f"env 'pettingzoo/{scenario}'", env_kwargs, [*names, *_options()])
    if render_mode is not None:
        if render_mode != "rgb_array":
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        _set_headless()
        env_kwargs["render_mode"] = render_mode
    factory = functools.partial(_construct, build, f"{module.__name__}.{attr}", env_kwargs)
    return PettingZooEnv(
        factory,
        num_envs=num_envs,
        api="parallel" if attr == "parallel_env" else "aec",
        group_map=group_map,
        illegal_actions=illegal_actions,
        seed=seed,
        state=state,
        device=device,
        validate_actions=validate_actions,
    )


def _construct(build: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Any:
    try:
        return build(**kwargs)
    except TypeError as err:
        raise TypeError(f"{name}() rejected the arguments {sorted(kwargs)}: {err}") from err
