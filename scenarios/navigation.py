"""``navigation``: N holonomic agents in 2-D, each driving to its own goal, batched over envs.

Physics (C++ kernel on CPU, the same maths in torch elsewhere, see
:mod:`marlkit.native.particles`): forces from actions, drag, substepped semi-implicit Euler,
soft agent-agent contacts (penetration-proportional forces) and square world bounds.

Keys (group ``"agents"`` by default; any group map works)::

    (group, "observation")  [E, n, 6 + 2k]  own position (2), velocity (2), goal - position (2),
                                            positions of the k nearest others relative to self
    (group, "action")       [E, n, 2] in [-1, 1] (continuous force), or [E, n] in {0..4}
                                            (no-op, -x, +x, -y, +y)
    ("next", group, "reward") [E, n, 1]     progress to goal - collision penalty + shared bonus
    "state"                 [E, 6N]         every agent's position, velocity and goal

An env terminates when every agent is on its goal.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import ACTION, OBSERVATION, REWARD, STATE, TERMINATED, TRUNCATED
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.native import extension_available, load_extension
from marlkit.native.particles import knn, particle_step
from marlkit.native.render import Circles, group_color, lighten, render_frame

__all__ = ["DISCRETE_DIRECTIONS", "NavigationEnv"]

#: Unit force of each discrete action: no-op, -x, +x, -y, +y (VMAS's order).
DISCRETE_DIRECTIONS = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))

Backend = Literal["auto", "native", "torch"]


def _resolve_backend(backend: Backend, device: torch.device) -> Literal["native", "torch"]:
    if backend == "torch":
        return "torch"
    if backend == "native":
        if device.type != "cpu":
            raise ValueError(f"backend='native' runs on cpu only, the env is on {device}")
        load_extension()  # raises ExtensionError with the rebuild command
        return "native"
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'native' or 'torch', got {backend!r}")
    return "native" if device.type == "cpu" and extension_available() else "torch"


class NavigationEnv(EnvBase):
    """N agents, N goals, one batch of ``num_envs`` worlds.

    Args:
        num_envs: worlds stepped together (the env batch ``B = [num_envs]``).
        n_agents: agents per world.
        continuous_actions: 2-D force in ``[-1, 1]`` (True) or 5 discrete moves (False).
        device: where the state lives; the C++ kernel serves cpu, torch serves the rest.
        seed: seed for resets and random actions (``None``: nondeterministic).
        k_nearest: neighbours in each observation (capped at ``n_agents - 1``).
        world_size: half-width ``L`` of the square world ``[-L, L]^2``; default grows with
            ``sqrt(n_agents)`` to keep the density constant.
        agent_radius, mass, drag, dt, substeps, contact_stiffness, max_force: physics.
        goal_radius: distance at which an agent counts as arrived (default ``agent_radius``).
        shaping_factor: reward per unit of distance gained towards the goal.
        collision_penalty: penalty per agent touched, per step.
        final_reward: bonus to everyone while every agent is on its goal.
        group_map: ``"agents"``, ``"per_agent"`` or an explicit map over ``agent_0..``.
        backend: ``"auto"`` (C++ on cpu when built, else torch), ``"native"`` or ``"torch"``.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        render_size: side in pixels of the frames :meth:`render` returns.
    """

    render_modes = ("rgb_array",)

    def __init__(
        self,
        num_envs: int = 32,
        n_agents: int = 4,
        *,
        continuous_actions: bool = True,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        k_nearest: int = 4,
        world_size: float | None = None,
        agent_radius: float = 0.05,
        mass: float = 1.0,
        drag: float = 0.25,
        dt: float = 0.1,
        substeps: int = 4,
        contact_stiffness: float = 100.0,
        max_force: float = 1.0,
        goal_radius: float | None = None,
        shaping_factor: float = 1.0,
        collision_penalty: float = 1.0,
        final_reward: float = 0.01,
        group_map: GroupMapLike = "agents",
        backend: Backend = "auto",
        validate_actions: bool = True,
        render_size: int = 256,
    ):
        for name, value in (("num_envs", num_envs), ("n_agents", n_agents)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(k_nearest, bool) or not isinstance(k_nearest, int) or k_nearest < 0:
            raise ValueError(f"k_nearest must be an int >= 0, got {k_nearest!r}")
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.num_envs, self.n_agents = num_envs, n_agents
        self.continuous_actions = continuous_actions
        self.k = min(k_nearest, n_agents - 1)
        self.half_extent = (
            float(world_size) if world_size is not None else max(1.0, 0.25 * math.sqrt(n_agents))
        )
        self.physics = {
            "radius": float(agent_radius),
            "mass": float(mass),
            "drag": float(drag),
            "dt": float(dt),
            "substeps": int(substeps),
            "stiffness": float(contact_stiffness),
            "half_extent": self.half_extent,
        }
        if self.half_extent <= agent_radius:
            raise ValueError(
                f"world_size {self.half_extent} must exceed agent_radius {agent_radius}"
            )
        self.max_force = float(max_force)
        self.goal_radius = float(goal_radius if goal_radius is not None else agent_radius)
        self.shaping_factor = float(shaping_factor)
        self.collision_penalty = float(collision_penalty)
        self.final_reward = float(final_reward)
        self.backend = _resolve_backend(backend, self.device)
        self.render_size = int(render_size)

        names = [f"agent_{i}" for i in range(n_agents)]
        self.group_map = make_group_map(names, group_map)
        index = {name: i for i, name in enumerate(names)}
        self._group_index = {
            g: torch.tensor([index[a] for a in agents], device=self.device)
            for g, agents in self.group_map.items()
        }
        self._single_group = list(self.group_map.values()) == [names]
        self._directions = torch.tensor(DISCRETE_DIRECTIONS, device=self.device) * self.max_force

        self._build_specs()
        e, n = num_envs, n_agents
        self._pos = torch.zeros(e, n, 2, device=self.device)
        self._vel = torch.zeros(e, n, 2, device=self.device)
        self._goal = torch.zeros(e, n, 2, device=self.device)
        self._dist = torch.zeros(e, n, device=self.device)
        self._gen = torch.Generator(device=self.device)
        self._gen.seed()
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ specs
    @property
    def observation_dim(self) -> int:
        return 6 + 2 * self.k

    def _build_specs(self) -> None:
        b, dev = self.batch_size, self.device
        sizes = {g: len(a) for g, a in self.group_map.items()}
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        for g, n in sizes.items():
            obs[g] = Composite(
                {OBSERVATION: Unbounded((*b, n, self.observation_dim), device=dev)},
                shape=(*b, n),
                device=dev,
            )
            leaf = (
                Bounded(-1.0, 1.0, (*b, n, 2), device=dev)
                if self.continuous_actions
                else Categorical(len(DISCRETE_DIRECTIONS), (*b, n), device=dev)
            )
            act[g] = Composite({ACTION: leaf}, shape=(*b, n), device=dev)
        self.observation_spec = obs
        self.action_spec = act
        self.state_spec = Composite(
            {STATE: Unbounded((*b, 6 * self.n_agents), device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> None:
        # Offset so that resets and the base class's random actions draw different streams.
        self._gen.manual_seed(seed + 1_000_003)

    def _sample_positions(self, count: int) -> torch.Tensor:
        span = self.half_extent - self.physics["radius"]
        u = torch.rand(count, self.n_agents, 2, generator=self._gen, device=self.device)
        return (u * 2.0 - 1.0) * span

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None:
            self._pos = self._sample_positions(self.num_envs)
            self._goal = self._sample_positions(self.num_envs)
            self._vel = torch.zeros_like(self._pos)
        else:
            idx = env_mask.nonzero().squeeze(-1)
            self._pos[idx] = self._sample_positions(idx.numel())
            self._goal[idx] = self._sample_positions(idx.numel())
            self._vel[idx] = 0.0
        self._dist = torch.linalg.vector_norm(self._goal - self._pos, dim=-1)
        return self._output(reward=None, arrived_all=None)

    def _force(self, tensordict: TensorDictBase) -> torch.Tensor:
        """Per-agent force ``[E, N, 2]`` from the groups' actions."""
        parts = []
        for g in self.group_map:
            action = tensordict.get((g, ACTION))
            if self.continuous_actions:
                parts.append(action.to(torch.float32) * self.max_force)
            else:
                parts.append(self._directions[action.long()])
        if self._single_group:
            return parts[0].contiguous()
        force = torch.empty(self.num_envs, self.n_agents, 2, device=self.device)
        for g, part in zip(self.group_map, parts):
            force[:, self._group_index[g]] = part
        return force

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        force = self._force(tensordict)
        contacts = particle_step(self._pos, self._vel, force, backend=self.backend, **self.physics)
        dist = torch.linalg.vector_norm(self._goal - self._pos, dim=-1)
        arrived_all = (dist < self.goal_radius).all(-1)
        reward = self.shaping_factor * (self._dist - dist)
        if self.collision_penalty:
            reward = reward - self.collision_penalty * contacts.to(torch.float32)
        reward = reward + self.final_reward * arrived_all.unsqueeze(-1).to(torch.float32)
        self._dist = dist
        return self._output(reward=reward, arrived_all=arrived_all)

    # ------------------------------------------------------------------ outputs
    def _observations(self) -> torch.Tensor:
        parts = [self._pos, self._vel, self._goal - self._pos]
        if self.k > 0:
            rel, _ = knn(self._pos, self.k, backend=self.backend)
            parts.append(rel.reshape(self.num_envs, self.n_agents, 2 * self.k))
        return torch.cat(parts, dim=-1)

    def _output(
        self, reward: torch.Tensor | None, arrived_all: torch.Tensor | None
    ) -> TensorDictBase:
        e = self.num_envs
        obs = self._observations()
        groups = {}
        for g, idx in self._group_index.items():
            n = idx.numel()
            entries = {OBSERVATION: obs if self._single_group else obs[:, idx]}
            if reward is not None and arrived_all is not None:
                r = reward if self._single_group else reward[:, idx]
                entries[REWARD] = r.unsqueeze(-1)
                entries[TERMINATED] = arrived_all.view(e, 1, 1).expand(e, n, 1).clone()
                entries[TRUNCATED] = torch.zeros(e, n, 1, dtype=torch.bool, device=self.device)
            groups[g] = TensorDict(entries, batch_size=(e, n), device=self.device)
        state = torch.cat([self._pos, self._vel, self._goal], dim=-1).reshape(e, -1)
        return TensorDict({**groups, STATE: state}, batch_size=(e,), device=self.device)

    def _render(self, env_index: int) -> object:
        """Goals as rings, agents as discs, coloured by group (the native renderer)."""
        pos, goal = self._pos[env_index].cpu(), self._goal[env_index].cpu()
        radius = self.physics["radius"]
        layers = []
        for i, idx in enumerate(self._group_index.values()):
            color, members = group_color(i), idx.cpu()
            layers.append(Circles(goal[members], radius * 1.4, lighten(color), filled=False))
        for i, (g, idx) in enumerate(self._group_index.items()):
            layers.append(Circles(pos[idx.cpu()], radius, group_color(i), name=g))
        return render_frame(layers, half_extent=self.half_extent, size=self.render_size)

    # ------------------------------------------------------------------ introspection
    @property
    def positions(self) -> torch.Tensor:
        """Agent positions ``[E, N, 2]`` (a copy)."""
        return self._pos.clone()

    @property
    def goals(self) -> torch.Tensor:
        """Goal positions ``[E, N, 2]`` (a copy)."""
        return self._goal.clone()
