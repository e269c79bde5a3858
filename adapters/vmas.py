"""VMAS (Vectorized Multi-Agent Simulator) scenarios as marlkit envs.

``marlkit.make("vmas/<scenario>", **kwargs)`` builds a :class:`VmasEnv` over any VMAS scenario
(``marlkit list`` or :func:`list_scenarios` names them). VMAS steps the whole batch of
``num_envs`` worlds in one call, in torch, on any device; the adapter stacks each group's
per-agent tensors into one group tensor and hands everything else through as it comes (no NumPy
round trip, no device change).

Keys, for a group of ``n`` agents and the env batch ``B = [num_envs]``::

    (group, "observation")            [*B, n, obs_dim], or a nested Composite when the
                                      scenario observes a dict
    (group, "info", name)             [*B, n, ...] the scenario's per-agent info entries
    (group, "action")                 [*B, n, act_dim] in [-u_range, u_range] (plus [0, 1]
                                      for communication) when continuous; [*B, n] in {0..k-1}
                                      when discrete; [*B, n, m] with multidiscrete_actions
    ("next", group, "reward")         [*B, n, 1]
    ("next", group, "terminated"|"truncated"|"done")   [*B, n, 1] (VMAS ends whole envs: its
                                      env flags, expanded to every agent by the done rule)
    ("next", "terminated"|"truncated"|"done")          [*B, 1]

VMAS has no global state: ``state_spec`` is empty.

Groups: one group ``"agents"`` when every agent has the same observation, action and info specs,
otherwise ``"by_type"`` (``simple_tag`` gives ``adversary`` and ``agent``), or ``"per_agent"``
when agents of one type still differ. Agents of one group must share specs.

Info specs are inferred at construction: the scenario's ``info(agent)`` is read once after the
first reset; each tensor ``[num_envs, *shape]`` becomes ``Unbounded([*B, n, *shape])`` with its
dtype (a per-env scalar ``[num_envs]`` becomes ``[*B, n, 1]``). Later values are cast to that
dtype; keys that appear only later are ignored. Infos describe a transition (VMAS computes them
with the rewards), so ``reset`` reports them as zeros; VMAS's own values at that point are left
over from before the reset.

Seeding: VMAS keeps one random state for *all* its envs in a process (torch, NumPy and
``random`` states, a class attribute it swaps in around each call). Each ``VmasEnv`` puts its
own copy of that state in place for its calls and takes it back after them, so two VMAS envs in
one process (the workers of a ``SerialEnv``) draw from streams of their own: ``set_seed`` on one
does not move the other, and a ``SerialEnv`` replays a ``ParallelEnv`` built alike. On CUDA,
VMAS draws from torch's global CUDA generator, which stays shared.
"""

from __future__ import annotations

import contextlib
import importlib
import pathlib
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int, did_you_mean, keyword_names, unexpected_kwargs_message
from marlkit._utils import get_logger, import_optional
from marlkit.adapters._spaces import spec_from_space
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import ACTION, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from marlkit.data.specs import Unbounded
from marlkit.envs import EnvBase, UnknownEnvError, make_done_spec, make_reward_spec
from marlkit.envs._memory import check_on_probe
from marlkit.native.render import LANDMARK_COLOR, Circles, render_frame

__all__ = ["INFO", "VmasEnv", "accepted_kwargs", "list_scenarios", "make_env"]

#: Sub-key of each group holding the scenario's per-agent info entries.
INFO = "info"

RenderBackend = Literal["auto", "vmas", "native"]

_log = get_logger("adapters.vmas")

#: VMAS ``make_env`` options the adapter does not take, and why.
_REFUSED_OPTIONS = {
    "terminated_truncated": "it is always on: terminated and truncated are separate keys",
    "clamp_actions": "actions are validated against the action spec; project them with "
    "env.action_spec[key].project(action), or turn validation off",
    "wrapper": "the adapter is the wrapper",
    "wrapper_kwargs": "the adapter is the wrapper",
    "grad_enabled": "differentiable stepping is not supported by the adapter",
}
_UNUSED_KWARGS = r"Scenario kwargs: .* passed but not used"
_KWARG_NAME = re.compile(r"kwargs\.(?:pop|get)\(\s*[\"'](\w+)[\"']")


def _vmas() -> ModuleType:
    return import_optional("vmas", extra="vmas", purpose="the VMAS adapter")


def list_scenarios() -> list[str]:
    """Every VMAS scenario name (its main, MPE and debug lists), sorted."""
    vmas = _vmas()
    return sorted({*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios})


def make_env(scenario: str, **kwargs: Any) -> VmasEnv:
    """Build the VMAS scenario ``scenario``; ``marlkit.make("vmas/<scenario>")`` calls this.

    See :class:`VmasEnv` for the keyword arguments.
    """
    return VmasEnv(scenario, **kwargs)


def _load_scenario(name: str) -> Any:
    """A fresh instance of the VMAS scenario called ``name``."""
    known = list_scenarios()
    if name not in known:
        hint = did_you_mean(name, known, n=5, cutoff=0.5)
        raise UnknownEnvError(
            f"VMAS has no scenario {name!r}.{hint} Scenarios: {', '.join(known)}."
        )
    # ``vmas.scenarios`` is rebound to the list of names; the loader lives in the subpackage.
    return importlib.import_module("vmas.scenarios").load(f"{name}.py").Scenario()


def _check_scenario(scenario: Any) -> Any:
    """A ``BaseScenario`` instance (a subclass is instantiated), or a ``TypeError``."""
    _vmas()
    base = importlib.import_module("vmas.simulator.scenario").BaseScenario
    if isinstance(scenario, type) and issubclass(scenario, base):
        return scenario()
    if not isinstance(scenario, base):
        raise TypeError(
            "a VMAS scenario is a name (str) or a vmas BaseScenario (instance or subclass), got "
            f"{type(scenario).__name__}: {scenario!r}"
        )
    return scenario


def _scenario_kwarg_names(scenario: Any) -> list[str]:
    """Keyword arguments the scenario's source reads (``kwargs.pop("name", ...)``), best effort."""
    try:  # VMAS loads scenario files as anonymous modules: read the file itself
        source = pathlib.Path(type(scenario).make_world.__code__.co_filename).read_text()
    except (AttributeError, OSError):
        return []
    return sorted(set(_KWARG_NAME.findall(source)))


def _options() -> list[str]:
    """The keywords :class:`VmasEnv` takes itself (every other one goes to the scenario)."""
    return keyword_names(VmasEnv, skip=("scenario",), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"vmas/{scenario}")`` takes: :class:`VmasEnv`'s options, then
    those the scenario's source reads (best effort: VMAS itself reports any it did not use).

    Raises:
        UnknownEnvError: no VMAS scenario has that name.
    """
    return [*_options(), *_scenario_kwarg_names(_load_scenario(scenario))]


def _unused_kwargs_error(name: str, scenario: Any, kwargs: Mapping[str, Any], err: Warning) -> str:
    reads, options = _scenario_kwarg_names(scenario), _options()
    unknown = [k for k in kwargs if k not in reads] if reads else sorted(kwargs)
    return unexpected_kwargs_message(
        f"env 'vmas/{name}'",
        unknown,
        [*reads, *options],
        accepts=(
            f"used neither by VmasEnv nor by the scenario, which reads: "
            f"{', '.join(reads) or 'nothing that could be listed'}; VmasEnv takes: "
            f"{', '.join(options)} (VMAS said: {err})"
        ),
    )


def _as_list(value: Any, names: Sequence[str]) -> list[Any]:
    """Per-agent values in agent order (VMAS gives a dict by name when ``dict_spaces``)."""
    return [value[n] for n in names] if isinstance(value, Mapping) else list(value)


def _stack(values: Sequence[Any]) -> Any:
    """Stack per-agent values ``[E, ...]`` (tensors or dicts of them) into ``[E, n, ...]``."""
    first = values[0]
    if isinstance(first, Mapping):
        return {k: _stack([v[k] for v in values]) for k in first}
    if len(values) == 1:
        return first.unsqueeze(1)  # a view: one agent needs no copy
    return torch.stack(list(values), dim=1)


def _info_signature(info: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{name: (per-agent shape, dtype)}`` of an agent's info tensors (scalars as ``(1,)``)."""
    out = {}
    for key, value in info.items():
        if not isinstance(value, torch.Tensor) or value.ndim == 0:
            _log.warning("VMAS info entry %r is not a batched tensor; it is left out", key)
            continue
        out[str(key)] = (tuple(value.shape[1:]) or (1,), value.dtype)
    return out


def _color(entity: Any) -> tuple[int, int, int]:
    try:
        rgb = [float(c) for c in list(entity.color)[:3]]
        return (round(255 * rgb[0]), round(255 * rgb[1]), round(255 * rgb[2]))
    except (TypeError, ValueError, IndexError):
        return LANDMARK_COLOR


class VmasEnv(EnvBase):
    """A VMAS scenario, ``num_envs`` worlds stepped in one call.

    Args:
        scenario: a VMAS scenario name (e.g. ``"balance"``, ``"simple_tag"``) or a
            ``vmas.simulator.scenario.BaseScenario`` (an instance, or a subclass to instantiate).
        num_envs: worlds stepped together (the env batch ``B = [num_envs]``).
        device: where VMAS simulates and where every tensor stays.
        continuous_actions: forces in ``[-u_range, u_range]`` (True) or VMAS's discrete
            actions (False).
        seed: seed of VMAS's random state and of random actions (``None``: not reseeded).
        group_map: ``None`` (``"agents"`` when all agents share specs, else ``"by_type"``),
            ``"agents"``, ``"by_type"``, ``"per_agent"`` or ``{group: [agent names]}``.
        max_steps: VMAS's horizon: envs are truncated after that many steps (``None``: none).
        multidiscrete_actions: with discrete actions, one class per action dimension
            (``MultiCategorical [*B, n, m]``) instead of one flat class.
        dict_spaces: VMAS's own option (per-agent outputs keyed by name); the keys and specs of
            the env are the same either way.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        render_backend: ``"vmas"`` (VMAS's pyglet renderer, headless through EGL), ``"native"``
            (marlkit's circle renderer: every entity as a disc, approximate) or ``"auto"``
            (VMAS's, falling back to the native one when no OpenGL context can be made).
        **scenario_kwargs: passed to the scenario (e.g. ``n_agents=5``); one the scenario does
            not use raises ``TypeError``.

    Raises:
        UnknownEnvError: no VMAS scenario has that name (the message lists close matches).
        TypeError: unknown keyword arguments, or a VMAS option the adapter does not take.
        ValueError: a bad value, or a group map that puts agents with different specs in one
            group (the message names them).
    """

    render_modes = ("rgb_array",)

    def __init__(
        self,
        scenario: str | Any,
        num_envs: int = 32,
        *,
        device: str | torch.device = "cpu",
        continuous_actions: bool = True,
        seed: int | None = None,
        group_map: GroupMapLike | None = None,
        max_steps: int | None = None,
        multidiscrete_actions: bool = False,
        dict_spaces: bool = False,
        validate_actions: bool = True,
        render_backend: RenderBackend = "auto",
        **scenario_kwargs: Any,
    ):
        self._check_options(num_envs, max_steps, seed, render_backend, scenario_kwargs)
        try:
            wanted = torch.device(device)
        except (RuntimeError, TypeError):
            wanted = None  # the base class reports it
        if wanted is not None and wanted.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available on this machine")
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        if multidiscrete_actions and continuous_actions:
            raise ValueError("multidiscrete_actions=True needs continuous_actions=False")
        self.num_envs = num_envs
        self.continuous_actions = bool(continuous_actions)
        self.multidiscrete_actions = bool(multidiscrete_actions)
        self.render_backend: RenderBackend = render_backend
        self._render_fallback = False
        given = scenario  # a probe loads a name afresh
        if isinstance(scenario, str):
            self.scenario_name = scenario
            scenario = _load_scenario(scenario)
        else:
            scenario = _check_scenario(scenario)
            self.scenario_name = type(scenario).__name__
        options = {
            "device": self.device,
            "continuous_actions": self.continuous_actions,
            "max_steps": max_steps,
            "dict_spaces": dict_spaces,
            "multidiscrete_actions": self.multidiscrete_actions,
            "group_map": group_map,
            "render_backend": render_backend,
            **scenario_kwargs,
        }
        self._check_memory(given, options)
        self._env = self._make_vmas(
            scenario,
            num_envs=num_envs,
            device=self.device,
            continuous_actions=self.continuous_actions,
            max_steps=max_steps,
            seed=seed,
            dict_spaces=bool(dict_spaces),
            multidiscrete_actions=self.multidiscrete_actions,
            scenario_kwargs=scenario_kwargs,
        )
        self.max_steps = max_steps
        self.agent_names = [agent.name for agent in self._env.agents]
        self._build(group_map)
        # This env's own copy of VMAS's class-wide random state (see the module notes).
        self._random_state = list(self._env.vmas_random_state)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _check_options(
        num_envs: Any,
        max_steps: Any,
        seed: Any,
        render_backend: Any,
        scenario_kwargs: Mapping[str, Any],
    ) -> None:
        check_int("num_envs", num_envs, low=1)
        check_int("max_steps", max_steps, low=1, allow_none=True)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if render_backend not in ("auto", "vmas", "native"):
            raise ValueError(
                f"render_backend must be 'auto', 'vmas' or 'native', got {render_backend!r}"
            )
        refused = [k for k in scenario_kwargs if k in _REFUSED_OPTIONS]
        if refused:
            reasons = "; ".join(f"{k}: {_REFUSED_OPTIONS[k]}" for k in refused)
            raise TypeError(f"VmasEnv does not take the VMAS option(s) {refused} ({reasons})")

    def _check_memory(self, scenario: Any, options: Mapping[str, Any]) -> None:
        """Refuse a batch that would not fit in memory before VMAS allocates it, sized on a
        probe of one env of the same scenario and options (see
        :func:`~marlkit.envs._memory.check_on_probe`; VMAS's shared random state is left as it
        was)."""
        shared = importlib.import_module("vmas.simulator.environment").Environment

        def probe() -> VmasEnv:
            state = list(shared.vmas_random_state)
            try:
                return VmasEnv(scenario, 1, validate_actions=False, **options)
            finally:
                shared.vmas_random_state[:] = state

        check_on_probe(f"vmas/{self.scenario_name}", self.num_envs, probe, device=self.device)

    def _make_vmas(
        self, scenario: Any, *, scenario_kwargs: Mapping[str, Any], **options: Any
    ) -> Any:
        vmas = _vmas()
        with warnings.catch_warnings():
            # VMAS only warns about kwargs no scenario read; marlkit makes that an error.
            warnings.filterwarnings("error", message=_UNUSED_KWARGS, category=UserWarning)
            try:
                return vmas.make_env(
                    scenario, terminated_truncated=True, **options, **scenario_kwargs
                )
            except UserWarning as err:
                if not re.match(_UNUSED_KWARGS, str(err)):
                    raise
                message = _unused_kwargs_error(self.scenario_name, scenario, scenario_kwargs, err)
        raise TypeError(message)

    def _agent_specs(self) -> list[tuple[Any, Any, dict[str, Any]]]:
        """``(observation space, action space, info signature)`` of each agent."""
        env = self._env
        obs_space = _as_list(env.observation_space, self.agent_names)
        act_space = _as_list(env.action_space, self.agent_names)
        try:
            (infos,) = env.get_from_scenario(
                get_observations=False,
                get_rewards=False,
                get_infos=True,
                get_dones=False,
                dict_agent_names=False,
            )
        except Exception as err:  # a scenario whose info() needs a step first
            _log.warning(
                "vmas/%s: info() failed after the first reset (%s: %s); no info entries",
                self.scenario_name,
                type(err).__name__,
                err,
            )
            infos = [{} for _ in self.agent_names]
        return [(o, a, _info_signature(i)) for o, a, i in zip(obs_space, act_space, infos)]

    def _resolve_group_map(
        self, specs: list[tuple[Any, Any, dict[str, Any]]], group_map: GroupMapLike | None
    ) -> dict[str, list[str]]:
        names = self.agent_names
        if group_map is None:
            if all(s == specs[0] for s in specs):
                return make_group_map(names, "agents")
            by_type = make_group_map(names, "by_type")
            if self._group_spec_mismatch(by_type, specs) is None:
                return by_type
            _log.info("vmas/%s: agents of one type differ; grouped per agent", self.scenario_name)
            return make_group_map(names, "per_agent")
        resolved = make_group_map(names, group_map)
        mixed = self._group_spec_mismatch(resolved, specs)
        if mixed is not None:
            raise ValueError(mixed)
        return resolved

    def _group_spec_mismatch(
        self, group_map: Mapping[str, list[str]], specs: list[tuple[Any, Any, dict[str, Any]]]
    ) -> str | None:
        """A message naming two agents of one group whose specs differ, or None."""
        index = {name: i for i, name in enumerate(self.agent_names)}
        for group, members in group_map.items():
            first = members[0]
            for other in members[1:]:
                a, b = specs[index[first]], specs[index[other]]
                for what, x, y in zip(("observation", "action", "info"), a, b):
                    if x != y:
                        return (
                            f"group {group!r} mixes agents whose {what} specs differ: {first!r} "
                            f"has {x} but {other!r} has {y}; agents in one group must share "
                            "observation, action and info specs (try group_map='by_type' or "
                            "'per_agent')"
                        )
        return None

    def _build(self, group_map: GroupMapLike | None) -> None:
        specs = self._agent_specs()
        self.group_map = self._resolve_group_map(specs, group_map)
        index = {name: i for i, name in enumerate(self.agent_names)}
        #: ``(group, [VMAS agent indices])`` in group order.
        self._groups = [(g, [index[a] for a in agents]) for g, agents in self.group_map.items()]
        b, dev = tuple(self.batch_size), self.device
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        self._info_specs: dict[str, dict[str, Unbounded]] = {}
        for group, idx in self._groups:
            gb = (*b, len(idx))
            obs_space, act_space, info = specs[idx[0]]
            entries: dict[str, Any] = {OBSERVATION: spec_from_space(obs_space, gb, device=dev)}
            infos = {k: Unbounded((*gb, *shape), dtype, dev) for k, (shape, dtype) in info.items()}
            if infos:
                entries[INFO] = Composite(infos, shape=gb, device=dev)
            self._info_specs[group] = infos
            obs[group] = Composite(entries, shape=gb, device=dev)
            act[group] = Composite(
                {ACTION: spec_from_space(act_space, gb, device=dev)}, shape=gb, device=dev
            )
        sizes = {g: len(idx) for g, idx in self._groups}
        self.observation_spec = obs
        self.action_spec = act
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)
        self._wants_info = any(self._info_specs.values())
        self._flat_discrete = not self.continuous_actions and not self.multidiscrete_actions
        # Where each VMAS agent's action comes from: (group, position in the group).
        slots: list[tuple[str, int]] = [("", 0)] * len(self.agent_names)
        for group, idx in self._groups:
            for j, i in enumerate(idx):
                slots[i] = (group, j)
        self._slots = slots

    # ------------------------------------------------------------------ properties
    @property
    def vmas_env(self) -> Any:
        """The wrapped ``vmas.simulator.environment.Environment`` (for what the adapter lacks)."""
        return self._env

    @property
    def n_agents(self) -> int:
        return len(self.agent_names)

    # ------------------------------------------------------------------ hooks
    @contextlib.contextmanager
    def _own_random_state(self) -> Iterator[None]:
        """VMAS's class-wide random state set to this env's for the calls inside, and this
        env's taken back from it after them."""
        shared = self._env.vmas_random_state
        shared[:] = self._random_state
        try:
            yield
        finally:
            self._random_state = list(shared)

    def _set_seed(self, seed: int) -> None:
        # One random state for the whole batch: one seed (``set_seed`` returns ``seed + 1``).
        if not 0 <= seed < 2**32:
            raise ValueError(f"VMAS seeds must be in [0, 2**32), got {seed}")
        with self._own_random_state():
            self._env.seed(seed)

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        env = self._env
        with self._own_random_state():
            if env_mask is None:
                env.reset(return_observations=False)  # one vectorised call
            else:
                # VMAS resets one env index per call (reset_at) and has no vectorised partial
                # reset, so this loop over the selected envs is the simulator's only way.
                for i in env_mask.reshape(-1).nonzero().flatten().tolist():
                    env.reset_at(i, return_observations=False)
            (obs,) = env.get_from_scenario(
                get_observations=True,
                get_rewards=False,
                get_infos=False,
                get_dones=False,
                dict_agent_names=False,
            )
        out = self._output(obs, None)
        if env_mask is not None and tensordict is not None:
            self._keep_unreset(out, tensordict, env_mask)
        return out

    def _keep_unreset(
        self, out: TensorDictBase, previous: TensorDictBase, env_mask: torch.Tensor
    ) -> None:
        """Envs outside ``env_mask`` report what they reported before (observation noise and
        side effects of VMAS's observation functions must not change them)."""
        for key in self.observation_keys:
            old, new = previous.get(key, None), out.get(key, None)
            if old is None or new is None or old.shape != new.shape:
                continue
            mask = env_mask.reshape(*env_mask.shape, *([1] * (new.ndim - env_mask.ndim)))
            out.set(key, torch.where(mask, new, old.to(new.dtype)))

    def _vmas_actions(self, tensordict: TensorDictBase) -> list[torch.Tensor]:
        """The actions of ``tensordict`` as VMAS takes them: one ``[E, size]`` tensor per agent
        (a flat class becomes ``[E, 1]``), views of the group tensors."""
        group_actions = {}
        for group, _ in self._groups:
            action = tensordict.get((group, ACTION))
            group_actions[group] = action.unsqueeze(-1) if self._flat_discrete else action
        return [group_actions[group][:, index] for group, index in self._slots]

    def _replay_simulator(self, seed: int, steps: int) -> list[Any]:
        """One run of the raw VMAS env, for :func:`~marlkit.testing.check_adapter`'s seeding
        diagnosis: ``reset(seed=seed)``, then ``steps`` steps of actions drawn from the action
        spec by a generator seeded with ``seed``; what VMAS returned each time, infos left out.
        It runs in this env's random state; the env must be reset afterwards."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        with self._own_random_state():
            trace: list[Any] = [self._env.reset(seed=seed)]
            for _ in range(steps):
                actions = self._vmas_actions(self.action_spec.rand(generator=generator))
                trace.append(self._env.step(actions)[:-1])
        return trace

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = self._vmas_actions(tensordict)
        with self._own_random_state():
            obs, rewards, terminated, truncated, infos = self._env.step(actions)
        # Env-level flags at the root only: the done rule expands them to every agent.
        flags = {TERMINATED: terminated.unsqueeze(-1), TRUNCATED: truncated.unsqueeze(-1)}
        return self._output(obs, infos if self._wants_info else None, rewards, flags)

    # ------------------------------------------------------------------ outputs
    def _output(
        self,
        obs: Any,
        infos: Any,
        rewards: Any = None,
        flags: dict[str, torch.Tensor] | None = None,
    ) -> TensorDictBase:
        """Group TensorDicts ``[E, n]`` from VMAS's per-agent outputs; flags are ``[E, 1]``."""
        names, e = self.agent_names, self.num_envs
        obs = _as_list(obs, names)
        infos = _as_list(infos, names) if infos is not None else None
        rewards = _as_list(rewards, names) if rewards is not None else None
        out: dict[str, Any] = {}
        for group, idx in self._groups:
            n = len(idx)
            entries: dict[str, Any] = {OBSERVATION: _stack([obs[i] for i in idx])}
            info_specs = self._info_specs[group]
            if infos is not None and info_specs:
                entries[INFO] = {
                    k: _stack([infos[i][k] for i in idx]).reshape(spec.shape).to(spec.dtype)
                    for k, spec in info_specs.items()
                }
            elif info_specs:  # at reset: VMAS computes infos with the rewards, none yet
                entries[INFO] = {k: spec.zero() for k, spec in info_specs.items()}
            if rewards is not None:
                reward = _stack([rewards[i] for i in idx]).reshape(e, n, 1)
                entries[REWARD] = reward.to(torch.float32)  # no-op unless a scenario differs
            out[group] = TensorDict(entries, batch_size=(e, n), device=self.device)
        if flags is not None:
            out.update(flags)
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    # ------------------------------------------------------------------ rendering
    def _render(self, env_index: int) -> np.ndarray:
        """A frame of env ``env_index`` from VMAS's renderer (or the native fallback)."""
        if self.render_backend == "native" or self._render_fallback:
            return self._render_native(env_index)
        try:
            frame = self._render_vmas(env_index)
        except Exception as err:
            if self.render_backend == "vmas":
                raise RuntimeError(
                    f"VMAS could not render ({type(err).__name__}: {err}). Headless rendering "
                    "needs EGL (e.g. apt-get install libegl1 libgl1) or an X display (e.g. "
                    "xvfb-run); render_backend='native' draws without OpenGL"
                ) from err
            _log.warning(
                "VMAS rendering failed (%s: %s); drawing with marlkit's native renderer",
                type(err).__name__,
                err,
            )
            self._render_fallback = True
            return self._render_native(env_index)
        return frame

    def _render_vmas(self, env_index: int) -> np.ndarray:
        # mode="rgb_array" without visualize_when_rgb makes VMAS set pyglet.options["headless"]
        # before pyglet opens anything, whenever libEGL lists a device (a GPU, or Mesa's
        # software device): no display needed. Without EGL, pyglet needs an X display, which is
        # what _render falls back from. (VMAS also points PYGLET_HEADLESS_DEVICE at the first
        # CUDA_VISIBLE_DEVICES entry when it is imported.)
        with self._own_random_state():
            frame = self._env.render(mode="rgb_array", env_index=env_index)
        return np.array(frame, dtype=np.uint8)  # VMAS gives a flipped view of a GL buffer

    def _render_native(self, env_index: int, size: int = 512) -> np.ndarray:
        """Every entity as a disc of its circumscribed radius, in its VMAS colour."""
        world = self._env.world
        layers, extent = [], 1.0
        for entities in (world.landmarks, world.agents):
            if not entities:
                continue
            pos = torch.stack([ent.state.pos[env_index] for ent in entities]).detach().cpu()
            radius = [float(ent.shape.circumscribed_radius()) for ent in entities]
            extent = max(extent, float(pos.abs().max()) + max(radius))
            colors = [_color(ent) for ent in entities]
            layers.append(Circles(pos.double().numpy(), np.asarray(radius), np.asarray(colors)))
        for semidim in (world.x_semidim, world.y_semidim):
            if semidim is not None:
                extent = max(extent, float(semidim))
        return render_frame(layers, half_extent=extent * 1.05, size=size)

    def _close(self) -> None:
        viewer = getattr(self._env, "viewer", None)
        if viewer is not None:
            viewer.close()
            self._env.viewer = None

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, scenario={self.scenario_name!r})"
