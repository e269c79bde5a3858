"""JaxMARL environments as marlkit envs: ``num_envs`` envs stepped as one jitted, vmapped batch.

``marlkit.make("jaxmarl/<name>", num_envs=N)`` builds JaxMARL's env ``<name>`` (a name of
``jaxmarl.registered_envs``: ``MPE_simple_spread_v3``, ``SMAX`` with ``map_name="3m"``,
``overcooked``, ``hanabi``, ``storm_2p``, ``storm_np``, ``coin_game``, ...;
``pip install 'marlkit[jaxmarl]'``) and steps the whole batch in one ``jax.jit(jax.vmap(...))``
call. Every array crosses to torch through DLPack without a copy (``torch.from_dlpack`` on the
jitted function's outputs; the torch tensors share the JAX buffers), actions go the other way
the same way (cast to ``int32``/``float32`` first, as JAX without x64 takes them).

Keys, for a group of ``n`` agents and the env batch ``B = [num_envs]``::

    (group, "observation")          [*B, n, ...] JaxMARL's dtype (float32, uint8 for Overcooked,
                                    int8 for coin game); a nested Composite where an agent
                                    observes a dict (STORM 2p: "observation", "inventory")
    (group, "action")               [*B, n] int64 classes (Discrete), or [*B, n, d] float32 in
                                    the Box (MPE with action_type="Continuous")
    (group, "action_mask")          [*B, n, n_actions] bool, where JaxMARL gives one
                                    (SMAX ``get_avail_actions``, Hanabi ``get_legal_moves``)
    (group, "mask")                 [*B, n] bool, the agent is alive (SMAX units)
    "state"                         [*B, ...] SMAX's ``world_state``
    ("next", group, "reward")       [*B, n, 1] float32
    ("next", group, "terminated"|"truncated"|"done")   [*B, n, 1]

Episodes: JaxMARL's own ``step`` resets a finished env inside the step (autoreset), returning the
first observation of the next episode. The adapter steps with ``step_env`` instead, so the last
observation of an episode is the true one, and resets exactly the envs marlkit's caller resets
(``"_reset"``, as ``step_and_maybe_reset`` and the collectors do); the other envs keep their
state and report what they reported. A step in which an env is done also computes a reset of
every env (``jax.vmap(env.reset)``, as JaxMARL's step does on every step) and what the batch
reports once the done envs are reset, so resetting exactly those (as ``step_and_maybe_reset``
does) costs no call: their states are swapped in at the next step. Any other reset (all envs,
or not exactly the envs the last step ended) is a jitted call of its own.
``__all__`` ends an episode; it is a truncation when JaxMARL's step counter reached
``max_steps`` (MPE, Overcooked; SMAX when no team was wiped out) or the env only ends at its
horizon (STORM, coin game), a termination otherwise (Hanabi, SMAX wipe-outs). A SMAX unit that
dies is ``terminated`` at that step, then ``mask`` false.

Seeding: one JAX PRNG key for the batch, made from the marlkit seed (``key_from_seed``); each
step and reset splits it, one sub-key per env, so seeded rollouts replay and every env draws its
own stream.

Rendering (``render_modes``): MPE and SMAX are drawn by marlkit's circle renderer from their
states (entities and units as discs, dead units left out); STORM by its own
``render`` (``storm_2p``). The others have no RGB frames from JaxMARL (Overcooked, Hanabi,
``storm``, ``storm_np``, switch_riddle; coin game's ``render`` calls a matplotlib function
matplotlib 3.10 removed) and ``render`` says so.

Processes: JAX is multithreaded and must not be forked once started; ``ParallelEnv`` starts its
workers with ``"spawn"`` by default, which works (each worker compiles its own functions).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import get_logger, import_optional
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import ACTION, ACTION_MASK, MASK, OBSERVATION, STATE
from marlkit.data.specs import Binary, Bounded, Categorical, TensorSpec, Unbounded
from marlkit.envs import EnvBase, UnknownEnvError, make_done_spec, make_reward_spec
from marlkit.native.render import Circles, group_color, render_frame

__all__ = ["JaxMarlEnv", "accepted_kwargs", "list_scenarios", "make_env"]

_log = get_logger("adapters.jaxmarl")

#: Registered JaxMARL names that need packages JaxMARL leaves optional (brax, jaxrobotarium).
_MABRAX = ("ant_4x2", "halfcheetah_6x1", "hopper_3x1", "humanoid_9|8", "walker2d_2x3")
#: Env classes JaxMARL draws RGB frames for itself (``env.render(state)``).
_OWN_RENDER = ("InTheGrid_2p",)
#: Why an env does not render, where it is not simply that JaxMARL draws no frames for it.
_NO_RENDER = {
    "CoinGame": "JaxMARL's CoinGame.render calls matplotlib's FigureCanvasAgg.tostring_rgb, "
    "which matplotlib 3.10 removed",
}
_SMAX = ("SMAX", "HeuristicEnemySMAX", "LearnedPolicyEnemySMAX")


def _jaxmarl() -> ModuleType:
    """JaxMARL, imported without its print about submoduled environments on stdout (logged at
    debug level instead). Something JaxMARL imports puts ``sys.__stdout__`` back as
    ``sys.stdout``, so both are pointed at the buffer while it imports."""
    if "jaxmarl" in sys.modules:
        return sys.modules["jaxmarl"]
    said, real = io.StringIO(), sys.__stdout__
    try:
        sys.__stdout__ = said  # type: ignore[misc,assignment]
        with contextlib.redirect_stdout(said):
            module = import_optional("jaxmarl", extra="jaxmarl", purpose="the JaxMARL adapter")
    finally:
        sys.__stdout__ = real  # type: ignore[misc]
    if said.getvalue().strip():
        _log.debug("jaxmarl: %s", said.getvalue().strip())
    return module


def list_scenarios() -> list[str]:
    """JaxMARL's registered env names this installation can build, sorted."""
    jaxmarl = _jaxmarl()
    envs = importlib.import_module("jaxmarl.environments")
    names = set(jaxmarl.registered_envs)
    if not getattr(envs, "MABRAX_AVAILABLE", False):
        names -= set(_MABRAX)
    if not getattr(envs, "SUBMODULE_ENVIRONMENTS", False):
        names = {n for n in names if not n.startswith("JaxRobotarium")}
    return sorted(names)


def _check_name(scenario: str) -> None:
    known = list_scenarios()
    if scenario not in known:
        hint = did_you_mean(scenario, known, n=5, cutoff=0.5)
        raise UnknownEnvError(
            f"JaxMARL has no env {scenario!r} here.{hint} Envs: {', '.join(known)}."
        )


def _env_class(scenario: str) -> type:
    """The class ``jaxmarl.make(scenario)`` builds (one default instance is made to find it)."""
    _check_name(scenario)
    return type(_jaxmarl().make(scenario))


def _options() -> list[str]:
    return keyword_names(JaxMarlEnv, skip=("scenario",), partial=True) or []


def _env_kwargs(scenario: str) -> list[str]:
    """The keywords the JaxMARL env's constructor takes, following ``**kwargs`` up its bases
    (``SimpleSpreadMPE`` hands them to ``SimpleMPE``; the SMAX wrappers to ``SMAX``)."""
    cls = _env_class(scenario)
    chain = list(cls.__mro__)
    if scenario in _SMAX[1:]:  # wrappers taking **env_kwargs for the SMAX they build
        chain.insert(1, importlib.import_module("jaxmarl.environments.smax").SMAX)
    names: list[str] = []
    for klass in chain:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names += [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return list(dict.fromkeys(names))


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"jaxmarl/{scenario}")`` takes: :class:`JaxMarlEnv`'s own
    (``map_name`` for SMAX), then the JaxMARL env's constructor's.

    Raises:
        UnknownEnvError: not a JaxMARL env name.
    """
    return [*_options(), *_env_kwargs(scenario)]


def make_env(scenario: str, **kwargs: Any) -> JaxMarlEnv:
    """Build JaxMARL's ``scenario``; ``marlkit.make("jaxmarl/<scenario>")`` calls this.

    See :class:`JaxMarlEnv` for the keyword arguments.
    """
    return JaxMarlEnv(scenario, **kwargs)


def _jax_device(device: torch.device) -> Any:
    """The JAX device matching a torch device (``cpu``; ``cuda:i`` is JAX's GPU ``i``)."""
    import jax

    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        index = device.index or 0
        if index < len(gpus):
            return gpus[index]
        raise ValueError(
            f"device {str(device)!r}: JAX sees {len(gpus)} GPU(s) here (a CPU-only jax?); "
            "install jax with CUDA support, or use device='cpu'"
        )
    raise ValueError(f"device {str(device)!r}: the JaxMARL adapter runs on 'cpu' or 'cuda'")


def _torch_dtype(dtype: Any) -> torch.dtype:
    name = np.dtype(dtype).name
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise TypeError(f"JaxMARL gives {name} arrays, which torch has no dtype for")
    return value


def _leaf_spec(aval: Any, lead: tuple[int, ...], device: torch.device) -> TensorSpec:
    return Unbounded((*lead, *aval.shape), _torch_dtype(aval.dtype), device)


def _tree_spec(tree: Any, lead: tuple[int, ...], device: torch.device) -> Any:
    """A spec for one agent's abstract value: a leaf spec, or a Composite for a dict."""
    if isinstance(tree, Mapping):
        return Composite(
            {str(k): _tree_spec(v, lead, device) for k, v in tree.items()},
            shape=lead,
            device=device,
        )
    return _leaf_spec(tree, lead, device)


def _signature(tree: Any) -> Any:
    """What must agree between the agents of one group: shapes and dtypes."""
    if isinstance(tree, Mapping):
        return tuple(sorted((str(k), _signature(v)) for k, v in tree.items()))
    if isinstance(tree, (list, tuple)):
        return tuple(_signature(v) for v in tree)
    return (tuple(tree.shape), np.dtype(tree.dtype).name)


def _space_signature(space: Any) -> tuple[Any, ...]:
    kind = type(space).__name__
    if kind == "Discrete":
        return (kind, int(space.n))
    if kind == "Box":
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        return (kind, tuple(space.shape), low.tobytes(), high.tobytes())
    raise TypeError(
        f"the JaxMARL action space {kind} is not supported by the adapter (Discrete and Box are)"
    )


def _to_torch(value: Any) -> Any:
    """JAX arrays (or dicts of them) as torch tensors sharing their buffers (DLPack)."""
    if isinstance(value, Mapping):
        return {str(k): _to_torch(v) for k, v in value.items()}
    return torch.from_dlpack(value)


class JaxMarlEnv(EnvBase):
    """A JaxMARL env, ``num_envs`` of them stepped in one jitted, vmapped call.

    Args:
        scenario: a JaxMARL env name (``list_scenarios()``), e.g. ``"MPE_simple_spread_v3"``.
        num_envs: envs stepped together (the env batch ``B = [num_envs]``).
        device: where the arrays live: ``"cpu"``; ``"cuda"`` with a CUDA-enabled jax (the
            tensors are then CUDA tensors, through DLPack as on the CPU).
        seed: seed of the batch's JAX PRNG key and of random actions (``None``: a random one).
        group_map: ``None`` (``"by_type"`` when agents have types, e.g. ``ally``/``enemy``,
            ``adversary``/``agent``, and each type shares specs; else ``"agents"`` when all
            agents share specs; else ``"per_agent"``), ``"agents"``, ``"by_type"``,
            ``"per_agent"`` or ``{group: [agent names]}``.
        map_name: SMAX only: a SMAX map (``"3m"``, ``"2s3z"``, ...), JaxMARL's
            ``map_name_to_scenario``.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        **env_kwargs: passed to the JaxMARL env's constructor (``max_steps``,
            ``action_type``, ``num_agents``, ...); unknown ones raise ``TypeError``.

    Raises:
        UnknownEnvError: no JaxMARL env has that name (the message lists close matches).
        TypeError: unknown keyword arguments, or an action space the adapter does not take.
        ValueError: a bad value; agents of different specs in one group (the message names
            them); a ``map_name`` SMAX does not know.
    """

    def __init__(
        self,
        scenario: str,
        num_envs: int = 32,
        *,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        group_map: GroupMapLike | None = None,
        map_name: str | None = None,
        validate_actions: bool = True,
        **env_kwargs: Any,
    ):
        num_envs = check_int("num_envs", num_envs, low=1)
        if not isinstance(scenario, str):
            raise TypeError(f"scenario must be a JaxMARL env name (str), got {scenario!r}")
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.scenario_name = scenario
        self.num_envs = num_envs
        jax_device = _jax_device(self.device)
        self._jaxmarl_env = self._make(scenario, map_name, env_kwargs)
        from marlkit.adapters._jax_bridge import JaxBatch, Layout, agent_names

        self._batch = JaxBatch(self._jaxmarl_env, num_envs, jax_device)
        self.agent_names = agent_names(self._batch.agents)
        if len(set(self.agent_names)) != len(self.agent_names):
            raise ValueError(f"JaxMARL agent names collide as strings: {self.agent_names}")
        outputs = self._batch.agent_outputs()
        spaces = [self._jaxmarl_env.action_space(a) for a in self._batch.agents]
        per_agent = [
            (
                _signature(outputs["observation"][i]),
                _space_signature(spaces[i]),
                _signature(outputs["action_mask"][i]) if "action_mask" in outputs else None,
            )
            for i in range(len(spaces))
        ]
        self.group_map = self._resolve_group_map(per_agent, group_map)
        index = {name: i for i, name in enumerate(self.agent_names)}
        groups = tuple(
            (g, tuple(index[a] for a in members)) for g, members in self.group_map.items()
        )
        self._build_specs(outputs, spaces, groups)
        dtypes = {}
        for g, idx in groups:
            space = spaces[idx[0]]
            dtypes[g] = space.dtype if type(space).__name__ == "Discrete" else np.float32
        self._batch.build(Layout(self._batch.agents, groups), dtypes)
        #: What the env reported last (its observation keys are kept for partial resets).
        self._last: TensorDictBase | None = None
        self.render_modes = ("rgb_array",) if self._render_kind() else ()
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") % 2**63
        self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _make(scenario: str, map_name: str | None, env_kwargs: dict[str, Any]) -> Any:
        jaxmarl = _jaxmarl()
        _check_name(scenario)
        check_kwargs(f"env 'jaxmarl/{scenario}'", env_kwargs, _env_kwargs(scenario))
        if map_name is not None:
            if scenario not in _SMAX:
                raise TypeError(f"map_name is a SMAX option; {scenario!r} does not take it")
            if "scenario" in env_kwargs:
                raise TypeError("give either map_name or scenario, not both")
            smax = importlib.import_module("jaxmarl.environments.smax.smax_env")
            maps = smax.MAP_NAME_TO_SCENARIO
            if map_name not in maps:
                hint = did_you_mean(map_name, maps, n=3, cutoff=0.5)
                raise ValueError(
                    f"SMAX has no map {map_name!r}.{hint} Maps: {', '.join(sorted(maps))}"
                )
            env_kwargs = {**env_kwargs, "scenario": smax.map_name_to_scenario(map_name)}
        return jaxmarl.make(scenario, **env_kwargs)

    def _resolve_group_map(
        self, specs: list[tuple[Any, ...]], group_map: GroupMapLike | None
    ) -> dict[str, list[str]]:
        names = self.agent_names
        if group_map is None:
            by_type = make_group_map(names, "by_type")
            if len(by_type) > 1 and self._mismatch(by_type, specs) is None:
                return by_type
            if all(s == specs[0] for s in specs):
                return make_group_map(names, "agents")
            _log.info("jaxmarl/%s: agents differ in specs; grouped per agent", self.scenario_name)
            return make_group_map(names, "per_agent")
        resolved = make_group_map(names, group_map)
        mixed = self._mismatch(resolved, specs)
        if mixed is not None:
            raise ValueError(mixed)
        return resolved

    def _mismatch(self, group_map: Mapping[str, list[str]], specs: list[tuple[Any, ...]]) -> Any:
        index = {name: i for i, name in enumerate(self.agent_names)}
        for group, members in group_map.items():
            for other in members[1:]:
                a, b = specs[index[members[0]]], specs[index[other]]
                for what, x, y in zip(("observation", "action", "action mask"), a, b):
                    if x != y:
                        return (
                            f"group {group!r} mixes agents whose {what} specs differ: "
                            f"{members[0]!r} has {x} but {other!r} has {y}; agents in one group "
                            "must share specs (try group_map='by_type' or 'per_agent')"
                        )
        return None

    def _build_specs(
        self, outputs: dict[str, Any], spaces: list[Any], groups: tuple[tuple[str, Any], ...]
    ) -> None:
        b, dev = (self.num_envs,), self.device
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        for group, idx in groups:
            lead = (*b, len(idx))
            first = idx[0]
            entries: dict[str, Any] = {
                OBSERVATION: _tree_spec(outputs["observation"][first], lead, dev)
            }
            if "action_mask" in outputs:
                n = int(outputs["action_mask"][first].shape[-1])
                entries[ACTION_MASK] = Binary(n, (*lead, n), torch.bool, dev)
            if "mask" in outputs:
                entries[MASK] = Categorical(2, lead, torch.bool, dev)
            obs[group] = Composite(entries, shape=lead, device=dev)
            space = spaces[first]
            if type(space).__name__ == "Discrete":
                action: TensorSpec = Categorical(int(space.n), lead, torch.int64, dev)
            else:
                shape = (*lead, *space.shape)
                low = torch.as_tensor(np.asarray(space.low, np.float32)).expand(shape)
                high = torch.as_tensor(np.asarray(space.high, np.float32)).expand(shape)
                action = Bounded(low.clone(), high.clone(), shape, torch.float32, dev)
            act[group] = Composite({ACTION: action}, shape=lead, device=dev)
        self.observation_spec = obs
        self.action_spec = act
        if "state" in outputs:
            self.state_spec = Composite(
                {STATE: _leaf_spec(outputs["state"], b, dev)}, shape=b, device=dev
            )
        sizes = {g: len(idx) for g, idx in groups}
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)
        self._group_sizes = sizes
        self._action_dtypes = {
            g: torch.int32 if isinstance(act[g, ACTION], Categorical) else torch.float32
            for g in sizes
        }

    # ------------------------------------------------------------------ properties
    @property
    def jaxmarl_env(self) -> Any:
        """The wrapped JaxMARL ``MultiAgentEnv`` (one env; the batch is vmapped over it)."""
        return self._jaxmarl_env

    @property
    def jax_state(self) -> Any:
        """The batch's JaxMARL state (a pytree of JAX arrays ``[num_envs, ...]``)."""
        return self._batch.current_state()

    @property
    def n_agents(self) -> int:
        return len(self.agent_names)

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> None:
        import jax

        from marlkit.adapters._jax_bridge import key_from_seed

        self._batch.key = jax.device_put(key_from_seed(seed), self._batch.device)
        self._batch.pending_valid = False  # resets made from the old key are not used

    def _actions(self, tensordict: TensorDictBase) -> dict[str, Any]:
        """Each group's actions as a JAX array sharing the torch buffer where it can (DLPack);
        a cast to JAX's ``int32``/``float32`` first where the dtype differs."""
        import jax

        out = {}
        for group, dtype in self._action_dtypes.items():
            value = tensordict.get((group, ACTION))
            value = value.detach().to(device=self.device, dtype=dtype).contiguous()
            try:
                out[group] = jax.dlpack.from_dlpack(value)
            except Exception:  # a buffer JAX does not take as is (alignment)
                out[group] = jax.device_put(value.cpu().numpy(), self._batch.device)
        return out

    def _output(self, out: Mapping[str, Any]) -> TensorDictBase:
        entries: dict[str, Any] = {}
        for group, n in self._group_sizes.items():
            entries[group] = TensorDict(
                _to_torch(out[group]), batch_size=(self.num_envs, n), device=self.device
            )
        if "state" in out:
            entries[STATE] = torch.from_dlpack(out["state"])
        return TensorDict(entries, batch_size=self.batch_size, device=self.device)

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        batch = self._batch
        if env_mask is None:
            mask = np.ones(self.num_envs, dtype=bool)
        else:
            mask = env_mask.reshape(-1).cpu().numpy()
        if self._last is not None and batch.can_defer(mask):
            # Exactly the envs the last step ended: that step computed their next episodes
            # already (as JaxMARL's own step does), and what the batch reports once they are
            # reset. A reset() of every env after all ended is the same reset (so SerialEnv,
            # which calls reset() then, and ParallelEnv, which resets by mask, replay alike).
            out = batch.defer(mask)
        else:
            out = batch.reset(None if env_mask is None or self._last is None else mask)
        self._last = self._output(out)
        return self._last

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._last is None:
            raise RuntimeError(f"{self!r}: call reset() before the first step")
        out = self._output(self._batch.step(self._actions(tensordict)))
        self._last = out
        return out

    def _replay_simulator(self, seed: int, steps: int) -> list[Any]:
        """The raw JaxMARL batch run once for :func:`~marlkit.testing.check_adapter`: the key
        from ``seed``, a reset, ``steps`` steps of actions drawn from the action spec by a
        generator seeded with ``seed``; the JAX outputs as NumPy. The env must be reset after."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self._set_seed(seed)
        trace: list[Any] = [_as_numpy(self._batch.reset(None))]
        self._last = None  # the env must be reset again
        for _ in range(steps):
            actions = self._actions(self.action_spec.rand(generator=generator))
            trace.append(_as_numpy(self._batch.step(actions)))
        return trace

    # ------------------------------------------------------------------ rendering
    def _render_kind(self) -> str | None:
        name = type(self._jaxmarl_env).__name__
        if name in _OWN_RENDER:
            return "own"
        state = self._batch.state
        if hasattr(state, "p_pos") and hasattr(self._jaxmarl_env, "rad"):
            return "mpe"
        if hasattr(getattr(state, "state", state), "unit_positions"):
            return "smax"
        return None

    def render(self, env_index: int = 0) -> np.ndarray:
        if not self.render_modes:
            name = type(self._jaxmarl_env).__name__
            why = _NO_RENDER.get(name, f"JaxMARL draws no RGB frames for {name}")
            raise NotImplementedError(
                f"jaxmarl/{self.scenario_name} does not render: {why} (MPE, SMAX and STORM 2p "
                "render)"
            )
        return super().render(env_index)

    def _render(self, env_index: int) -> np.ndarray:
        kind = self._render_kind()
        state = self._batch.env_state(env_index)
        if kind == "own":
            frame = np.asarray(self._jaxmarl_env.render(state))
            return np.ascontiguousarray(frame[..., :3]).astype(np.uint8)
        if kind == "mpe":
            env = self._jaxmarl_env
            pos = np.asarray(state.p_pos, np.float64)
            radius = np.asarray(env.rad, np.float64)
            colors = np.asarray(env.colour, np.int64).reshape(-1, 3)
            extent = max(1.0, float(np.abs(pos).max() + radius.max()))
            layer = Circles(pos, radius, colors, name="entities")
            return render_frame([layer], half_extent=extent * 1.05, size=256)
        return self._render_smax(state)

    def _render_smax(self, state: Any) -> np.ndarray:
        env = self._jaxmarl_env
        inner = getattr(state, "state", state)
        alive = np.asarray(inner.unit_alive, bool)
        pos = np.asarray(inner.unit_positions, np.float64)[alive]
        teams = np.asarray(inner.unit_teams, np.int64)[alive]
        radius = np.asarray(env.unit_type_radiuses)[np.asarray(inner.unit_types)][alive]
        half = max(float(env.map_width), float(env.map_height)) / 2
        colors = np.asarray([group_color(int(t)) for t in teams], np.int64).reshape(-1, 3)
        layer = Circles(pos - half, np.asarray(radius, np.float64), colors, name="units")
        return render_frame([layer], half_extent=half, size=256)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, scenario={self.scenario_name!r})"


def _as_numpy(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _as_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)
