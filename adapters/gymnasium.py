"""Gymnasium envs as marlkit envs: one agent in a group, or TorchRL-style plain keys.

``marlkit.make("gymnasium/CartPole-v1")`` builds one env (batch ``B = []``);
``marlkit.make("gymnasium/CartPole-v1", num_envs=8)`` builds a Gymnasium vector env (``sync`` or
``async``) as a batch ``B = [8]``. :class:`GymnasiumEnv` wraps an env or vector env you made.

Keys, with the default group ``"agents"`` (one agent, ``"agent_0"``)::

    ("agents", "observation")    [*B, 1, *obs_shape]  (a nested TensorDict for Dict/Tuple spaces)
    ("agents", "action")         [*B, 1, *act_shape]  ([*B, 1] for Discrete)
    ("next", "agents", "reward") [*B, 1, 1] float32
    ("next", "agents", "done" | "terminated" | "truncated")   [*B, 1, 1] bool
    ("next", "done" | "terminated" | "truncated")             [*B, 1] bool

With ``plain_keys=True`` (no group, ``group_map == {}``)::

    "observation" [*B, *obs_shape], "action" [*B, *act_shape], ("next", "reward") [*B, 1],
    ("next", "done" | "terminated" | "truncated") [*B, 1]

Spaces map through :mod:`marlkit.adapters._spaces` (Box, Discrete, MultiDiscrete, MultiBinary,
Dict, Tuple); observation dtypes are kept (float64 stays float64: ``DoubleToFloat`` casts).
``terminated`` is the env's own, ``truncated`` comes from ``TimeLimit``. The ``info`` dicts are
dropped.

Vector envs: marlkit's contract is that ``step`` reports the true last observation of a finished
episode and that the caller resets exactly the done envs (``"_reset"``). Vector envs made here use
``autoreset_mode=DISABLED`` and reset through ``reset(options={"reset_mask": mask})``. A vector
env you pass in may use ``DISABLED``, ``SAME_STEP`` (the final observation is taken from
``info["final_obs"]`` and the reset observation is kept for the next ``"_reset"``) or, for a bare
``SyncVectorEnv`` or an ``AsyncVectorEnv`` with shared memory (what ``gymnasium.make_vec`` builds
by default), ``NEXT_STEP``: the ``"_reset"`` of the done envs goes through ``reset_mask``, which
cancels their pending autoreset, so no env loses a step. Other ``NEXT_STEP`` vector envs (custom
ones such as CartPole's own, wrapped ones) are refused.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import has_module, import_optional
from marlkit.adapters import gymma
from marlkit.adapters._spaces import (
    SimulatorOutputError,
    check_seed,
    check_steppable,
    space_repr,
    spec_from_space,
    to_space,
    to_tensor,
)
from marlkit.data._fast import unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import make_group_map
from marlkit.data.keys import (
    ACTION,
    DEFAULT_GROUP,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    NestedKey,
)
from marlkit.data.specs import Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import check_on_probe
from marlkit.envs.registry import UnknownEnvError

__all__ = ["AGENT_NAME", "GymnasiumEnv", "accepted_kwargs", "list_scenarios", "make_env"]

#: The name of the one agent in the group.
AGENT_NAME = "agent_0"

Vectorization = Literal["sync", "async"]
#: A tensor, or a (nested) dict of them for Dict/Tuple spaces.
Tree = torch.Tensor | dict[str, "Tree"]

# Registry entry points (module prefixes) and the module each needs beyond gymnasium.
_EXTRA_MODULES = {
    "gymnasium.envs.box2d": "Box2D",
    "gymnasium.envs.mujoco": "mujoco",
    "gymnasium.envs.phys2d": "jax",
    "gymnasium.envs.tabular": "jax",
}


def _gym() -> Any:
    return import_optional("gymnasium", extra="gymnasium", purpose="the gymnasium adapter")


def _tree_map(fn: Callable[..., torch.Tensor], *trees: Tree) -> Tree:
    """``fn`` leaf by leaf over (nested) dicts of tensors of the same structure."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: _tree_map(fn, *(t[k] for t in trees)) for k in first}  # type: ignore[index]
    return fn(*trees)


def _as_flags(value: Any, n: int, what: str) -> np.ndarray:
    flags = np.asarray(value)
    if flags.size != n:
        raise ValueError(
            f"the simulator returned {what} of shape {list(flags.shape)}, expected {n}"
        )
    return flags.reshape(n).astype(bool)


def _autoreset_mode(env: Any) -> Any:
    """The vector env's autoreset mode; refuse the modes marlkit cannot step exactly."""
    modes = _gym().vector.AutoresetMode
    raw = env.metadata.get("autoreset_mode")
    if raw is None:
        raise ValueError(
            f"the vector env {env} declares no metadata['autoreset_mode'] (gymnasium then "
            "assumes NEXT_STEP, which marlkit takes only from SyncVectorEnv and AsyncVectorEnv); "
            "build it with autoreset_mode=AutoresetMode.DISABLED"
        )
    try:
        mode = modes(raw)
    except ValueError:
        raise ValueError(f"unknown autoreset_mode {raw!r} in {env}'s metadata") from None
    if mode == modes.NEXT_STEP and not _resets_clear_autoreset(env):
        raise ValueError(
            f"vector envs in AutoresetMode.NEXT_STEP are supported only as a bare SyncVectorEnv, "
            f"or AsyncVectorEnv with shared_memory=True, whose reset(options={{'reset_mask': "
            f"...}}) cancels the pending autoreset of the envs it resets; got "
            f"{type(env).__name__}, whose autoreset would cost a finished env a step of its own "
            "and break marlkit's exact partial resets. Build the vector env with vector_kwargs="
            "{'autoreset_mode': AutoresetMode.DISABLED} (or SAME_STEP), e.g. gymnasium.make_vec"
            "(id, num_envs, vectorization_mode='sync', vector_kwargs=...), or use "
            "marlkit.make('gymnasium/<id>', num_envs=...)"
        )
    return mode


def _resets_clear_autoreset(env: Any) -> bool:
    """Whether a NEXT_STEP vector env's partial reset cancels its pending autoresets.

    Gymnasium's SyncVectorEnv clears its autoreset flags for the envs in ``reset_mask``; the
    AsyncVectorEnv workers clear theirs on reset only with shared memory (without it they would
    still reset at the next step). A wrapper may keep its own NEXT_STEP bookkeeping (episode
    statistics, ...), and a custom vector env (e.g. CartPole's own) may not take ``reset_mask``
    at all: both are refused.
    """
    vector = _gym().vector
    if type(env) is vector.SyncVectorEnv:
        return True
    return type(env) is vector.AsyncVectorEnv and bool(env.shared_memory)


class GymnasiumEnv(EnvBase):
    """A Gymnasium env (batch ``[]``) or vector env (batch ``[num_envs]``) as a marlkit env.

    Args:
        env: a ``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv`` (autoreset mode
            ``DISABLED``, ``SAME_STEP``, or ``NEXT_STEP`` for a bare ``SyncVectorEnv`` or an
            ``AsyncVectorEnv`` with shared memory). The marlkit env owns it: :meth:`close`
            closes it.
        group: the group holding the one agent (``"agents"``); ignored with ``plain_keys``.
        plain_keys: TorchRL's single-agent layout (root ``"observation"``, ``"action"``,
            ``("next", "reward")`` ``[*B, 1]``), no group.
        seed: seed of the first reset and of the action space (``None``: unseeded).
        device: where the tensors live (the simulator runs on cpu).
        validate_actions: check actions against ``action_spec`` before the simulator sees them.

    Raises:
        TypeError: ``env`` is neither a Gymnasium env nor a vector env, or has a space marlkit
            does not map (Text, Graph, Sequence, ...).
        ValueError: a ``NEXT_STEP`` vector env other than those above, or a bad group name.
    """

    def __init__(
        self,
        env: Any,
        *,
        group: str = DEFAULT_GROUP,
        plain_keys: bool = False,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        gym = _gym()
        if isinstance(env, gym.vector.VectorEnv):
            self._mode = _autoreset_mode(env)
            self._num = int(env.num_envs)
            batch: tuple[int, ...] = (self._num,)
            obs_space, act_space = env.single_observation_space, env.single_action_space
        elif isinstance(env, gym.Env):
            self._mode, self._num, batch = None, 1, ()
            obs_space, act_space = env.observation_space, env.action_space
        else:
            raise TypeError(
                f"GymnasiumEnv wraps a gymnasium.Env or gymnasium.vector.VectorEnv, got "
                f"{type(env).__name__}"
            )
        super().__init__(batch_size=batch, device=device, validate_actions=validate_actions)
        self._env = env
        self._on_cpu = self.device.type == "cpu"
        self._obs_space, self._act_space = obs_space, act_space
        self.plain_keys = bool(plain_keys)
        self.group = None if self.plain_keys else group
        if self.group is not None:
            self.group_map = make_group_map([AGENT_NAME], {self.group: [AGENT_NAME]})
        self.render_modes = ("rgb_array",) if env.render_mode == "rgb_array" else ()
        self._build_specs()
        self._obs: Tree | None = None  # the observations marlkit last reported, [*B, (1), ...]
        self._needs_reset = np.zeros(self._num, dtype=bool)
        self._seeds: list[int | None] = [None] * self._num
        self._pending_obs: Tree | None = None  # SAME_STEP: reset observations kept
        self._same_step = (
            self._mode is not None and self._mode == gym.vector.AutoresetMode.SAME_STEP
        )
        self._pending = np.zeros(self._num, dtype=bool)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ specs
    def _key(self, name: str) -> NestedKey:
        return name if self.group is None else (self.group, name)

    def _build_specs(self) -> None:
        b, dev = tuple(self.batch_size), self.device
        lead = b if self.group is None else (*b, 1)
        obs = spec_from_space(self._obs_space, lead, device=dev)
        self._obs_leaf = spec_from_space(self._obs_space, ())  # one env's, for the checks
        act = spec_from_space(self._act_space, lead, device=dev)
        if self.group is None:
            self.observation_spec = Composite({OBSERVATION: obs}, shape=b, device=dev)
            self.action_spec = Composite({ACTION: act}, shape=b, device=dev)
            self.reward_spec = Composite(
                {REWARD: Unbounded((*b, 1), device=dev)}, shape=b, device=dev
            )
            self.done_spec = make_done_spec(b, {}, device=dev)
            return
        g = self.group
        self.observation_spec = Composite(
            {g: Composite({OBSERVATION: obs}, shape=lead, device=dev)}, shape=b, device=dev
        )
        self.action_spec = Composite(
            {g: Composite({ACTION: act}, shape=lead, device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, {g: 1}, device=dev)
        self.done_spec = make_done_spec(b, {g: 1}, device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def gym_env(self) -> Any:
        """The wrapped ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv``."""
        return self._env

    @property
    def simulators(self) -> list[Any]:
        """``[gym_env]``: the one simulator under this env (a vector env steps the batch), as
        the other adapters list theirs (read it, do not step it)."""
        return [self._env]

    @property
    def is_vector(self) -> bool:
        return self._mode is not None

    # ------------------------------------------------------------------ conversions
    def _obs_value(self, raw: Any, batched: bool = True) -> Tree:
        """Fresh tensors of a simulator observation in the layout: ``[*B, 1, ...]`` in a group,
        ``[*B, ...]`` with plain keys (``B = []`` for one env of a vector env when not
        ``batched``); a dict of them for Dict/Tuple spaces."""
        lead = len(self.batch_size) if batched else 0
        value = to_tensor(self._obs_space, raw)
        self._check_obs(value, self._obs_leaf, tuple(self.batch_size)[:lead], ())
        if self.group is None:
            return _tree_map(lambda t: t.to(self.device, copy=True), value)
        return _tree_map(lambda t: t.to(self.device, copy=True).unsqueeze(lead), value)

    def _check_obs(self, value: Tree, spec: Any, lead: tuple[int, ...], key: tuple) -> None:
        """A SimulatorOutputError for an observation of another shape than its space's, or
        with a NaN or infinite value, naming the key, as ``from_parallel`` does."""
        if isinstance(value, dict):
            for k, v in value.items():
                self._check_obs(v, spec[k], lead, (*key, k))
            return
        name = (OBSERVATION, *key)
        expected = (*lead, *spec.shape)
        if tuple(value.shape) != expected:
            raise SimulatorOutputError(
                f"the env returned an observation {name!r} of shape {list(value.shape)}, "
                f"expected {list(expected)} (from its {space_repr(self._obs_space)})"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            where = tuple((~torch.isfinite(value)).nonzero()[0].tolist())
            raise SimulatorOutputError(
                f"the env returned an observation {name!r} that is not finite: "
                f"{value[where].item()} at index {list(where)}"
            )

    def _td(self, obs: Tree, group: Mapping[str, Any], root: Mapping[str, Any]) -> TensorDict:
        """The output TensorDict: ``obs`` and ``group`` entries at the observation's level,
        ``root`` entries at the root."""
        # Every entry is made here with its shape and device: no checks again.
        b, dev, nested = self.batch_size, self.device, isinstance(obs, dict)
        if self.group is None:
            return unchecked_tensordict({OBSERVATION: obs, **group, **root}, b, dev, nested=nested)
        inner = unchecked_tensordict({OBSERVATION: obs, **group}, (*b, 1), dev, nested=nested)
        return unchecked_tensordict({self.group: inner, **root}, b, dev, nested=False)

    def _where(self, mask: np.ndarray, new: Tree, old: Tree) -> Tree:
        """``new`` for the envs in ``mask`` (``[N]`` bool), ``old`` for the others."""
        cond = torch.from_numpy(mask).to(self.device)

        def pick(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.where(cond.reshape(-1, *([1] * (a.ndim - 1))), a, b)

        return _tree_map(pick, new, old)

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> int:
        # Each env takes its seed at its next reset (a partial reset seeds only the envs it
        # resets; the others keep theirs for later), as gymnasium's reset(seed=s) gives s + i.
        check_seed(seed, "Gymnasium")  # before anything is seeded: a refused seed changes nothing
        self._env.action_space.seed(seed)
        self._seeds = [seed + i for i in range(self._num)]
        return seed + self._num

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None or self._obs is None:
            mask = np.ones(self._num, dtype=bool)  # the first reset resets every env
        else:
            mask = env_mask.detach().cpu().numpy().reshape(self._num).astype(bool)
        if mask.any():
            self._reset_envs(mask)
        if self._obs is None:  # unreachable: the first reset resets every env
            raise RuntimeError(f"{type(self).__name__}: the first reset gave no observation")
        return self._td(_tree_map(torch.clone, self._obs), {}, {})

    def _reset_envs(self, mask: np.ndarray) -> None:
        seeds = self._seeds
        # SAME_STEP envs already hold their reset observation, unless a new seed is pending.
        cached = mask & self._pending & np.array([s is None for s in seeds])
        real = mask & ~cached
        if real.all():
            seed: Any = None if all(s is None for s in seeds) else list(seeds)
            if not self.is_vector:
                seed = seeds[0]
            raw, _ = self._env.reset(seed=seed)
            self._obs = self._obs_value(raw)
        else:
            obs, pending = self._obs, self._pending_obs
            if obs is None:  # unreachable: the first reset resets every env (see _reset)
                raise RuntimeError(f"{type(self).__name__}: a partial reset before any reset")
            if real.any():
                seed = [s if r else None for s, r in zip(seeds, real)]
                raw, _ = self._env.reset(
                    seed=None if all(s is None for s in seed) else seed,
                    options={"reset_mask": real.copy()},
                )
                obs = self._where(real, self._obs_value(raw), obs)
            if cached.any() and pending is not None:  # cached envs hold a pending observation
                obs = self._where(cached, pending, obs)
            self._obs = obs
        self._seeds = [None if r else s for s, r in zip(seeds, real)]
        self._pending &= ~mask
        self._needs_reset &= ~mask

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        ended = "finished their episode"
        check_steppable(type(self).__name__, self._obs is None, self._needs_reset, ended)
        action = tensordict.get(self._key(ACTION))
        if self.group is not None:  # drop the agent dim: [*B, 1, ...] -> [*B, ...]
            action = action[(slice(None),) * len(self.batch_size) + (0,)]
        raw, reward, terminated, truncated, info = self._env.step(to_space(self._act_space, action))
        terminated = _as_flags(terminated, self._num, "terminated")
        truncated = _as_flags(truncated, self._num, "truncated")
        done = terminated | truncated
        obs = self._obs_value(raw)
        if self._same_step and done.any():
            obs = self._swap_final_obs(obs, info, done)
        self._needs_reset = done
        self._obs = obs
        out = _tree_map(torch.clone, obs)  # the cache and the output share no storage
        # Fresh arrays (astype copies) become tensors without another copy: [*B, 1] bool, at
        # the root; the done rule gives the agent (and done) its flags.
        root = {
            TERMINATED: self._tensor(terminated, 1),
            TRUNCATED: self._tensor(truncated, 1),
        }
        reward = np.array(reward, dtype=np.float32)
        if reward.size != self._num:
            raise SimulatorOutputError(
                f"the env returned a reward of shape {list(reward.shape)} for {self._num} env(s), "
                "expected one per env; a list of rewards, one per agent, is EPyMARL's "
                "multi-agent format: make the env with marlkit.make('gymma/<id>')"
            )
        if self.group is None:
            return self._td(out, {REWARD: self._tensor(reward, 1), **root}, {})
        return self._td(out, {REWARD: self._tensor(reward, 2)}, root)

    def _tensor(self, array: np.ndarray, ones: int) -> torch.Tensor:
        """A per-env NumPy array ``[N]`` as a tensor ``[*B, 1]`` (``ones=1``) or
        ``[*B, 1, 1]`` (``ones=2``) on the env's device."""
        tensor = torch.from_numpy(array.reshape(*self.batch_size, *([1] * ones)))
        return tensor if self._on_cpu else tensor.to(self.device)

    def _swap_final_obs(self, obs: Tree, info: Mapping[str, Any], done: np.ndarray) -> Tree:
        """SAME_STEP: report the final observations, keep the reset ones for ``_reset``."""
        final = info.get("final_obs")
        if final is None:
            raise RuntimeError(
                "a SAME_STEP vector env finished an episode without info['final_obs']; "
                "marlkit cannot report its last observation"
            )
        pending = obs if self._pending_obs is None else self._pending_obs
        self._pending_obs = self._where(done, obs, pending)
        self._pending |= done
        obs = _tree_map(torch.clone, obs)
        for i in np.flatnonzero(done).tolist():

            def put(leaf: torch.Tensor, value: torch.Tensor, i: int = i) -> torch.Tensor:
                leaf[i] = value
                return leaf

            obs = _tree_map(put, obs, self._obs_value(final[i], batched=False))
        return obs

    def _render(self, env_index: int) -> np.ndarray:
        if self._obs is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before render()")
        if not self.is_vector:
            frame = self._env.render()
        else:
            envs = getattr(self._env.unwrapped, "envs", None)  # SyncVectorEnv: render one env
            if envs is not None:
                frame = envs[env_index].render()
            else:
                frames = self._env.render()
                frame = None if frames is None else frames[env_index]
        if frame is None:
            raise RuntimeError(
                f"the gymnasium env returned no frame (render_mode={self._env.render_mode!r})"
            )
        return np.asarray(frame)

    def _close(self) -> None:
        self._env.close()


def _prepare_headless_rendering() -> None:
    """Off-screen rendering defaults, set only when unset: pygame without a window, and MuJoCo
    through EGL where there is no display."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("MUJOCO_GL", "egl")


def _check_id(gym: Any, scenario: str) -> None:
    if ":" in scenario or scenario in gym.registry:  # "module:Env-v0" imports its module first
        return
    hint = did_you_mean(scenario, gym.registry, n=5, cutoff=0.5)
    raise UnknownEnvError(
        f"gymnasium has no env {scenario!r}.{hint} `marlkit list --all` shows the ids"
    )


#: ``gymnasium.make_vec`` arguments that :func:`make_env` sets itself.
_MAKE_VEC_OWN = ("id", "num_envs", "vectorization_mode", "vector_kwargs")


def _gym_options(gym: Any, vector: bool) -> list[str]:
    """``gymnasium.make``'s own keywords (``max_episode_steps``, ``disable_env_checker``), and
    ``gymnasium.make_vec``'s (``wrappers``) for a vector env."""
    names = keyword_names(gym.make, skip=("id",), partial=True) or []
    if vector:
        names += keyword_names(gym.make_vec, skip=_MAKE_VEC_OWN, partial=True) or []
    return names


def _constructor_kwargs(gym: Any, scenario: str) -> list[str] | None:
    """The keywords the env's constructor (its registered entry point) takes, or ``None`` when
    that cannot be told: it takes ``**kwargs``, or the entry point does not load (then
    ``gymnasium.make`` says why)."""
    module, _, env_id = scenario.rpartition(":")
    try:
        if module:  # "module:Env-v0": the module registers the id
            importlib.import_module(module)
        entry = gym.spec(env_id).entry_point
        creator = entry if callable(entry) else gym.envs.registration.load_env_creator(entry)
    except Exception:  # best effort: gymnasium.make raises the real error
        return None
    return keyword_names(creator)


def _options() -> list[str]:
    """The keywords :func:`make_env` takes itself."""
    return keyword_names(make_env, skip=("scenario",), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"gymnasium/{scenario}")`` takes: the env constructor's,
    ``gymnasium.make``'s own options and :func:`make_env`'s; ``None`` when the constructor's
    cannot be told (it takes ``**kwargs``, as MuJoCo's envs do).

    Raises:
        UnknownEnvError: no such Gymnasium id.
    """
    gym = _gym()
    _check_id(gym, scenario)
    names = _constructor_kwargs(gym, scenario)
    return None if names is None else [*names, *_gym_options(gym, True), *_options()]


def make_env(
    scenario: str,
    *,
    num_envs: int | None = None,
    vectorization: Vectorization | None = "sync",
    vector_kwargs: Mapping[str, Any] | None = None,
    group: str = DEFAULT_GROUP,
    plain_keys: bool = False,
    seed: int | None = 0,
    render_mode: str | None = None,
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **gym_kwargs: Any,
) -> GymnasiumEnv:
    """``marlkit.make("gymnasium/<id>", ...)``: a registered Gymnasium env as a marlkit env.

    Args:
        scenario: the Gymnasium id, e.g. ``"CartPole-v1"``.
        num_envs: ``None`` for one env (batch ``[]``), else a vector env of that many
            (batch ``[num_envs]``).
        vectorization: ``"sync"`` (default; ``None`` means the same) or ``"async"`` (one process
            per env).
        vector_kwargs: extra arguments of the vector env (``shared_memory``, ``context``, ...);
            ``autoreset_mode`` defaults to ``DISABLED``.
        group, plain_keys, seed, device, validate_actions: see :class:`GymnasiumEnv`.
        render_mode: ``"rgb_array"`` enables :meth:`~marlkit.envs.EnvBase.render`.
        **gym_kwargs: passed to ``gymnasium.make`` (``max_episode_steps``, env arguments).

    Raises:
        UnknownEnvError: no such Gymnasium id (the message lists close matches).
        ValueError: a bad ``num_envs`` or ``vectorization``.
        TypeError: a keyword that neither the env's constructor nor ``gymnasium.make`` nor this
            function takes (checked where the constructor's signature can be read; the message
            suggests the closest ones and lists them all).
    """
    gym = _gym()
    if not isinstance(scenario, str) or not scenario:
        raise ValueError(f"a gymnasium env id must be a non-empty str, got {scenario!r}")
    _check_id(gym, scenario)
    _refuse_epymarl_format(None, scenario)
    check_int("num_envs", num_envs, low=1, allow_none=True)
    names = _constructor_kwargs(gym, scenario)
    if names is not None:  # None: the constructor checks them itself
        accepted = [*names, *_gym_options(gym, num_envs is not None), *_options()]
        check_kwargs(f"env 'gymnasium/{scenario}'", gym_kwargs, accepted)
    if render_mode is not None:  # passed only when given: some envs take no render_mode
        gym_kwargs["render_mode"] = render_mode
        if render_mode == "rgb_array":
            _prepare_headless_rendering()
    if num_envs is None:
        env = gym.make(scenario, **gym_kwargs)
    else:
        mode = "sync" if vectorization is None else vectorization
        if mode not in ("sync", "async"):
            raise ValueError(f"vectorization must be 'sync', 'async' or None, got {mode!r}")
        check_on_probe(
            f"gymnasium/{scenario}",
            num_envs,
            lambda: make_env(
                scenario,
                num_envs=1,
                vectorization=mode,
                vector_kwargs=vector_kwargs,
                group=group,
                plain_keys=plain_keys,
                seed=None,
                device=device,
                validate_actions=False,
                **gym_kwargs,
            ),
            device=device,
        )
        kwargs = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED, **(vector_kwargs or {})}
        env = gym.make_vec(
            scenario,
            num_envs=num_envs,
            vectorization_mode=mode,
            vector_kwargs=kwargs,
            **gym_kwargs,
        )
    try:
        _refuse_epymarl_format(env, scenario)
        return GymnasiumEnv(
            env,
            group=group,
            plain_keys=plain_keys,
            seed=seed,
            device=device,
            validate_actions=validate_actions,
        )
    except BaseException:
        env.close()
        raise


def _refuse_epymarl_format(env: Any, scenario: str) -> None:
    """Refuse an env in EPyMARL's multi-agent format (Tuple observation and action spaces with
    one entry per agent, a list of rewards): as one agent it would fail at its first step. LBF
    and RWARE ids are refused before anything is built (``env=None``), others once built.

    Raises:
        ValueError: naming the family that makes it multi-agent.
    """
    family = gymma.family_of(scenario)
    if env is not None:
        one = getattr(env, "envs", [env])[0] if isinstance(env, _gym().vector.VectorEnv) else env
        if one is None or not gymma.is_multi_agent(one):
            return
    elif family == "gymma":
        return
    name = scenario.rpartition(":")[2] if family != "gymma" else scenario
    raise ValueError(
        f"gymnasium/{scenario} is a multi-agent env in EPyMARL's format (Tuple spaces with one "
        f"entry per agent, a reward per agent), which the one-agent gymnasium adapter cannot "
        f"step; make it with marlkit.make('{family}/{name}') (see marlkit.adapters.gymma)"
    )


# Entry points that refuse the installed version of what they need (they raise when built):
# Gymnasium's Pusher-v4 runs only on mujoco < 3.
_REFUSES = {"gymnasium.envs.mujoco.pusher_v4": ("mujoco", 3)}


def _refuses_installed(module: str) -> bool:
    """Whether the entry point ``module`` refuses the installed version of its dependency."""
    if module not in _REFUSES:
        return False
    dist, major = _REFUSES[module]
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    head = installed.split(".")[0]
    return head.isdigit() and int(head) >= major


def _requirements(module: str) -> list[str]:
    if module.split(".")[0] != "gymnasium":
        return [module.split(".")[0]]
    return [need for prefix, need in _EXTRA_MODULES.items() if module.startswith(prefix)]


def list_scenarios() -> list[str]:
    """Gymnasium's registered ids whose dependencies import (placeholders such as the retired
    mujoco-py versions, which only raise, are left out, as are ids that refuse the installed
    version of their dependency: ``Pusher-v4`` on mujoco >= 3)."""
    registry = _gym().registry
    ids = set()
    for env_id, spec in registry.items():
        entry = spec.entry_point
        if isinstance(entry, str):
            module = entry.partition(":")[0]
        elif callable(entry):
            module = getattr(entry, "__module__", "") or ""
            if module == "gymnasium.envs":  # placeholders registered only to raise a hint
                continue
        else:
            continue
        if all(has_module(m) for m in _requirements(module)) and not _refuses_installed(module):
            ids.add(env_id)
    return sorted(ids)
