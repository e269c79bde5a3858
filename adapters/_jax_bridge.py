"""The JAX side of the JaxMARL adapter: one env's outputs in marlkit's group layout, batched.

:class:`JaxBatch` holds ``num_envs`` JaxMARL states and two jitted functions over the whole batch:

* ``step``: ``jax.vmap(env.step_env)`` (JaxMARL's step *without* its autoreset, so a finished
  episode reports its true last observation), then everything marlkit reads, already in the
  group layout: observations stacked per group ``[E, n, ...]``, rewards and done flags
  ``[E, n, 1]``, action masks, the alive mask, the world state. Where an env is done, the same
  call computes a reset of every env (``jax.vmap(env.reset)``, JaxMARL's own step does that on
  every step), kept *pending*, and what the batch reports once the done envs are reset:
  resetting exactly those afterwards (``defer``) reports that at once and swaps their states in
  at the start of the next step;
* ``reset``: any other reset (every env, or envs the last step did not end) in a call of its
  own, ``jax.vmap(env.reset)`` selected where ``mask`` is set (``jnp.where``), the others
  keeping their state and last observations bit for bit.

What a JaxMARL env gives is read once with :func:`jax.eval_shape` (no compilation): per-agent
dicts (MPE, SMAX, Overcooked, Hanabi, coin game), tuples (STORM 2p) or arrays stacked over
agents (STORM ``storm_np``) all become per-agent values. Arrays cross to torch with
``torch.from_dlpack`` (no copy) in :mod:`marlkit.adapters.jaxmarl`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["JaxBatch", "agent_names", "key_from_seed"]

#: Keys of JaxMARL observation dicts that are not an agent's: the global state (SMAX).
WORLD_STATE = "world_state"

#: JaxMARL env classes whose episode ends only at their horizon (``__all__`` is a time limit).
_HORIZON_ONLY = ("CoinGame", "InTheGrid", "InTheGrid_2p", "InTheMatrix")


def agent_names(agents: Sequence[Any]) -> list[str]:
    """marlkit names of JaxMARL agents: ``str`` names as they are, integers and digit strings
    (STORM's ``0, 1``, coin game's ``"0", "1"``) as ``agent_<i>``."""
    out = []
    for agent in agents:
        text = str(agent)
        out.append(f"agent_{text}" if text.isdigit() else text)
    return out


def key_from_seed(seed: int) -> jax.Array:
    """A threefry PRNG key (``uint32 [2]``) from any int: its 64 low bits, high word first
    (``jax.random.PRNGKey``'s layout for 64-bit seeds), so every int seed names one key."""
    value = int(seed) % 2**64
    return jnp.asarray(np.array([value >> 32, value & 0xFFFFFFFF], dtype=np.uint32))


def per_agent(value: Any, agents: Sequence[Any], what: str) -> list[Any]:
    """One entry per agent of a JaxMARL output: a dict keyed by agent, a tuple/list in agent
    order, an array (or dict of arrays) stacked over agents on its first axis."""
    n = len(agents)
    if isinstance(value, Mapping) and all(a in value for a in agents):
        return [value[a] for a in agents]
    if isinstance(value, (tuple, list)) and len(value) == n:
        return list(value)
    leaves = jax.tree.leaves(value)
    if leaves and all(getattr(x, "ndim", 0) >= 1 and x.shape[0] == n for x in leaves):
        return [jax.tree.map(lambda x, i=i: x[i], value) for i in range(n)]
    raise TypeError(
        f"the JaxMARL {what} is neither keyed by agent ({list(agents)}), nor a sequence of "
        f"{n}, nor stacked over {n} agents: {jax.tree.map(lambda x: x.shape, value)}"
    )


def _stack(values: Sequence[Any]) -> Any:
    """Per-agent values (arrays or dicts of them) stacked on a new first axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *values)


@dataclass(frozen=True)
class Layout:
    """Where each marlkit group's agents sit among the JaxMARL agents."""

    agents: tuple[Any, ...]  # JaxMARL's agent names, in its order
    groups: tuple[tuple[str, tuple[int, ...]], ...]  # (group, agent indices)


class JaxBatch:
    """``num_envs`` JaxMARL envs as one batch, their outputs in the group layout.

    Args:
        env: a JaxMARL ``MultiAgentEnv``.
        num_envs: the batch size ``E``.
        device: the JAX device every array lives on.
    """

    def __init__(self, env: Any, num_envs: int, device: Any):
        self.env = env
        self.num_envs = num_envs
        self.device = device
        self.agents = tuple(env.agents)
        self.avail = self._find_avail()
        self.alive = self._find_alive()
        self.layout: Layout | None = None
        self._step_fn: Callable[..., Any] = _unbuilt
        self._reset_fn: Callable[..., Any] = _unbuilt
        self.state: Any = None
        self.last: Any = None  # the observation part of the last outputs (jax arrays)
        self.key: jax.Array = key_from_seed(0)

    # ------------------------------------------------------------------ discovery
    def _find_avail(self) -> Callable[[Any], Any] | None:
        """JaxMARL's action masks: ``get_avail_actions`` (SMAX), ``get_legal_moves`` (Hanabi)."""
        env = self.env
        _, state = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        for name in ("get_avail_actions", "get_legal_moves"):
            fn = getattr(env, name, None)
            if fn is None:
                continue
            try:
                jax.eval_shape(fn, state)
            except NotImplementedError:
                continue
            return fn
        return None

    def _find_alive(self) -> Callable[[Any], Any] | None:
        """Which agents are alive, where units die (SMAX: ``unit_alive``)."""
        env = self.env
        _, state = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
        inner = getattr(state, "state", state)  # HeuristicEnemySMAX wraps SMAX's state
        if getattr(inner, "unit_alive", None) is None:
            return None
        ids = getattr(env, "agent_ids", None) or {a: i for i, a in enumerate(self.agents)}
        index = jnp.asarray([ids[a] for a in self.agents])

        def alive(s: Any) -> jax.Array:
            return getattr(s, "state", s).unit_alive[index]

        return alive

    def agent_outputs(self) -> dict[str, list[Any]]:
        """Per-agent abstract values (``jax.ShapeDtypeStruct``) of one env after a step:
        ``observation`` and, where the env has them, ``action_mask``; plus ``state``."""
        env = self.env
        key = jax.random.PRNGKey(0)

        def probe(k: jax.Array) -> Any:
            obs, state = env.reset(k)
            actions = {a: env.action_space(a).sample(k) for a in self.agents}
            obs, state, *_ = env.step_env(k, state, actions)
            return self._observe_agents(obs, state)

        return jax.eval_shape(probe, key)

    def _observe_agents(self, obs: Any, state: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        agent_obs = obs
        if isinstance(obs, Mapping) and WORLD_STATE in obs:
            out["state"] = obs[WORLD_STATE]
            agent_obs = {k: v for k, v in obs.items() if k != WORLD_STATE}
        out["observation"] = per_agent(agent_obs, self.agents, "observation")
        if self.avail is not None:
            masks = per_agent(self.avail(state), self.agents, "action mask")
            out["action_mask"] = [m.astype(bool) for m in masks]
        if self.alive is not None:
            out["mask"] = list(self.alive(state))
        return out

    # ------------------------------------------------------------------ the group layout
    def _single_env(
        self, layout: Layout, action_dtypes: Mapping[str, Any]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """``reset_one(key) -> (state, obs)`` and ``step_one(key, state, actions) -> (state,
        out, done)`` of one env, their outputs in the group layout."""
        env, agents = self.env, self.agents
        slots = {}
        for group, index in layout.groups:
            for j, i in enumerate(index):
                slots[agents[i]] = (group, j)
        time_up = self._time_up()

        def observe(obs: Any, state: Any) -> dict[str, Any]:
            per = self._observe_agents(obs, state)
            out: dict[str, Any] = {}
            for group, index in layout.groups:
                entry = {
                    name: _stack([v[i] for i in index])
                    for name, v in per.items()
                    if name != "state"
                }
                out[group] = entry
            if "state" in per:
                out["state"] = per["state"]
            return out

        def reset_one(key: jax.Array) -> tuple[Any, Any]:
            obs, state = env.reset(key)
            return state, observe(obs, state)

        def step_one(key: jax.Array, state: Any, actions: Any) -> tuple[Any, Any, jax.Array]:
            acts = {}
            for a in agents:
                group, j = slots[a]
                acts[a] = actions[group][j].astype(action_dtypes[group])
            obs, state, rewards, dones, _ = env.step_env(key, state, acts)
            out = observe(obs, state)
            rew = per_agent(
                {a: rewards[a] for a in agents} if isinstance(rewards, Mapping) else rewards,
                agents,
                "reward",
            )
            done_all = jnp.asarray(dones["__all__"], bool)
            done = [jnp.asarray(dones.get(a, done_all), bool) | done_all for a in agents]
            truncated_env = done_all & time_up(state)
            for group, index in layout.groups:
                g = out[group]
                alive = g["mask"] if "mask" in g else jnp.ones(len(index), bool)
                trunc = truncated_env & alive
                g["reward"] = jnp.stack([rew[i] for i in index]).astype(jnp.float32)[:, None]
                g["truncated"] = trunc[:, None]
                g["terminated"] = (jnp.stack([done[i] for i in index]) & ~trunc)[:, None]
            return state, out, done_all

        return reset_one, step_one

    def build(self, layout: Layout, action_dtypes: Mapping[str, Any]) -> None:
        """Compile-ready functions for ``layout``; ``action_dtypes``: the JaxMARL dtype of each
        group's actions."""
        self.layout = layout
        reset_one, step_one = self._single_env(layout, action_dtypes)
        n = self.num_envs
        # A batch of states and observations as a reset makes them: the step's states are cast
        # to these dtypes, so both functions see one signature (no second compilation).
        state_shape, obs_shape = jax.eval_shape(jax.vmap(reset_one), jax.random.split(self.key, n))

        def zeros() -> Any:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (state_shape, obs_shape))

        def fresh(key: jax.Array) -> Any:
            return jax.vmap(reset_one)(jax.random.split(key, n))

        def pick(mask: jax.Array) -> Callable[[jax.Array, jax.Array], jax.Array]:
            def where(new: jax.Array, old: jax.Array) -> jax.Array:
                flags = mask.reshape(mask.shape + (1,) * (new.ndim - 1))
                return jnp.where(flags, new, old.astype(new.dtype))

            return where

        def step(
            key: jax.Array, state: Any, pending: Any, deferred: jax.Array, actions: Any
        ) -> Any:
            # Resets the caller asked for since the last step, from the pending reset states.
            state = jax.tree.map(pick(deferred), pending, state)
            key, k_step, k_reset = jax.random.split(key, 3)
            state, out, done = jax.vmap(step_one)(jax.random.split(k_step, n), state, actions)
            state = jax.tree.map(lambda x, s: x.astype(s.dtype), state, state_shape)
            observed = observation_part(out)

            # Where an env is done, a reset of every env (JaxMARL's own step computes one on
            # every step), kept pending, and what the batch reports once the done envs are
            # reset: their first observations, the others' observations of this step.
            def with_reset(k: jax.Array) -> Any:
                new_state, new_obs = fresh(k)
                return new_state, jax.tree.map(pick(done), new_obs, observed)

            def without(k: jax.Array) -> Any:
                return zeros()[0], observed

            pending, after = jax.lax.cond(done.any(), with_reset, without, k_reset)
            return key, state, out, pending, after, done

        def reset(
            key: jax.Array, state: Any, last: Any, pending: Any, deferred: jax.Array, mask: Any
        ) -> Any:
            state = jax.tree.map(pick(deferred), pending, state)
            key, sub = jax.random.split(key)
            new_state, new_obs = fresh(sub)
            state = jax.tree.map(pick(mask), new_state, state)
            return key, state, jax.tree.map(pick(mask), new_obs, last)

        self._step_fn = jax.jit(step)
        self._reset_fn = jax.jit(reset)
        # Committed to the device, as the jitted functions' outputs are: the first call and the
        # later ones share one signature (no second compilation).
        blank = (np.zeros(s.shape, s.dtype) for s in jax.tree.leaves((state_shape, obs_shape)))
        tree = jax.tree.structure((state_shape, obs_shape))
        self.state, self.last = jax.device_put(jax.tree.unflatten(tree, list(blank)), self.device)
        self.pending = self.state  # reset states made by the last step where an env was done
        self.after = self.last  # what the batch reports once the envs done then are reset
        self.done = np.zeros(n, dtype=bool)  # the envs the last step ended
        self.pending_valid = False
        self.deferred = np.zeros(n, dtype=bool)
        self._no_mask = jax.device_put(self.deferred, self.device)
        self.key = jax.device_put(self.key, self.device)

    def _time_up(self) -> Callable[[Any], jax.Array]:
        """Whether an episode that ended was cut by a time limit (truncated) rather than ended
        by the game: the step counter at ``max_steps`` (MPE, Overcooked, SMAX when no team was
        wiped out); always for the games that only end at their horizon (STORM, coin game)."""
        env = self.env
        if type(env).__name__ in _HORIZON_ONLY:
            return lambda state: jnp.asarray(True)
        max_steps = getattr(env, "max_steps", None)
        if max_steps is None:
            max_steps = getattr(getattr(env, "_env", None), "max_steps", None)
        if max_steps is None:
            return lambda state: jnp.asarray(False)  # Hanabi: the game's own end
        allies = getattr(env, "num_allies", None)

        def time_up(state: Any) -> jax.Array:
            inner = getattr(state, "state", state)
            up = jnp.asarray(inner.step >= max_steps)
            alive = getattr(inner, "unit_alive", None)
            if alive is not None and allies is not None:  # SMAX: a team wiped out terminates
                wiped = ~alive[:allies].any() | ~alive[allies:].any()
                up = up & ~wiped
            return up

        return time_up

    # ------------------------------------------------------------------ calls
    def _deferred_flags(self) -> jax.Array:
        if not self.deferred.any():
            return self._no_mask
        return jax.device_put(self.deferred, self.device)

    def step(self, actions: Mapping[str, jax.Array]) -> Any:
        """Step every env (the deferred resets first); returns the outputs (jax arrays,
        ready)."""
        flags = self._deferred_flags()
        self.key, self.state, out, self.pending, self.after, done = self._step_fn(
            self.key, self.state, self.pending, flags, dict(actions)
        )
        self.done = np.asarray(done)
        self.pending_valid = bool(self.done.any())
        self.deferred = np.zeros(self.num_envs, dtype=bool)
        self.last = observation_part(out)
        return jax.block_until_ready(out)

    def can_defer(self, mask: np.ndarray) -> bool:
        """Whether resetting the envs of ``mask`` needs no call: they are exactly the envs the
        last step ended (whose resets it computed), and none was reset since."""
        return self.pending_valid and bool(np.array_equal(mask, self.done))

    def defer(self, mask: np.ndarray) -> Any:
        """Reset the envs of ``mask`` (see :meth:`can_defer`) from the pending states, swapped
        in at the next step (or reset); returns every env's observation part (jax arrays)."""
        self.deferred = mask.copy()
        self.pending_valid = False
        self.last = self.after
        return jax.block_until_ready(self.after)

    def reset(self, mask: np.ndarray | None) -> Any:
        """Reset the envs where ``mask`` (``bool [E]``, ``None``: all) in a call of their own,
        from the current key; returns every env's observation part (the others' as they
        were)."""
        if mask is None:
            mask = np.ones(self.num_envs, dtype=bool)
        flags = jax.device_put(mask, self.device)
        self.key, self.state, self.last = self._reset_fn(
            self.key, self.state, self.last, self.pending, self._deferred_flags(), flags
        )
        self.deferred = np.zeros(self.num_envs, dtype=bool)
        self.pending_valid = False  # the next step makes new ones
        return jax.block_until_ready(self.last)

    def current_state(self) -> Any:
        """The batch's JaxMARL states, the deferred resets applied."""
        if not self.deferred.any():
            return self.state
        flags = self.deferred

        def where(new: Any, old: Any) -> Any:
            mask = flags.reshape(flags.shape + (1,) * (np.ndim(new) - 1))
            return jnp.where(mask, new, old)

        return jax.tree.map(where, self.pending, self.state)

    def env_state(self, index: int) -> Any:
        """The JaxMARL state of env ``index`` (for rendering)."""
        return jax.tree.map(lambda x: x[index], self.current_state())


def _unbuilt(*args: Any) -> Any:
    raise RuntimeError("JaxBatch.build() must be called before stepping or resetting")


#: Entries of a step's group outputs that a reset does not report.
_STEP_ONLY = ("reward", "terminated", "truncated")


def observation_part(out: Mapping[str, Any]) -> dict[str, Any]:
    """What a reset reports of a step's outputs: all but rewards and done flags."""
    return {
        k: ({n: v for n, v in g.items() if n not in _STEP_ONLY} if k != "state" else g)
        for k, g in out.items()
    }
