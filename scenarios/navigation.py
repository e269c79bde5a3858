"""``navigation``: N holonomic agents in 2-D, each driving to its own goal, batched over envs.

Physics (C++ kernel on CPU, the same maths in torch elsewhere, see
:mod:`marlkit.native.particles`): forces from actions, drag, substepped semi-implicit Euler,
soft agent-agent contacts (penetration-proportional forces) and square world bounds.

Observations (``obs_mode``): ``"knn"`` (the default) sees the ``k`` nearest other agents;
``"lidar"`` is VMAS ``navigation``'s observation, ``n_lidar_rays`` LiDAR rays per agent against
the other agents' discs (:func:`marlkit.native.lidar.lidar`, C++ grid kernel on CPU).

Keys (group ``"agents"`` by default; any group map works)::

    (group, "observation")  [E, n, 6 + 2k]  "knn": own position (2), velocity (2),
                                            goal - position (2), positions of the k nearest
                                            others relative to self (2k)
                            [E, n, 6 + R]   "lidar": own position (2), velocity (2),
                                            position - goal (2, VMAS's sign), lidar_range -
                                            reading of each of the R rays (R)
    (group, "action")       [E, n, 2] in [-1, 1] (continuous force), or [E, n] in {0..4}
                                            (no-op, -x, +x, -y, +y)
    ("next", group, "reward") [E, n, 1]     progress to goal - collision penalty + shared bonus
    "state"                 [E, 6N]         every agent's position, velocity and goal

An env terminates when every agent is on its goal.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_flag, check_one_of, check_real
from marlkit.data.group_map import GroupMapLike
from marlkit.native.particles import knn, particle_step
from marlkit.native.render import Circles, group_color, lighten, render_frame
from marlkit.scenarios._homogeneous import (
    DISCRETE_DIRECTIONS,
    Backend,
    HomogeneousScenario,
    ObsMode,
    check_physics,
)

__all__ = ["DISCRETE_DIRECTIONS", "NavigationEnv"]


class NavigationEnv(HomogeneousScenario):
    """N agents, N goals, one batch of ``num_envs`` worlds.

    Args:
        num_envs: worlds stepped together (the env batch ``B = [num_envs]``).
        n_agents: agents per world.
        continuous_actions: 2-D force in ``[-1, 1]`` (True) or 5 discrete moves (False).
        device: where the state lives; the C++ kernel serves cpu, torch serves the rest.
        seed: seed for resets and random actions (``None``: nondeterministic).
        k_nearest: neighbours in each ``"knn"`` observation (capped at ``n_agents - 1``).
        obs_mode: ``"knn"`` (the k nearest others' relative positions) or ``"lidar"`` (VMAS
            ``navigation``'s observation: ``n_lidar_rays`` rays against the other agents'
            discs); see the module docstring for the layouts.
        n_lidar_rays: rays per agent in ``"lidar"`` mode (VMAS's default, 12), at the angles
            ``linspace(0, 2 pi, R + 1)[:R]``.
        lidar_range: the rays' range in ``"lidar"`` mode (VMAS's default, 0.35); the
            observation holds ``lidar_range - reading``: 0 where nothing is in range.
        world_size: half-width ``L`` of the square world ``[-L, L]^2``; default grows with
            ``sqrt(n_agents)`` to keep the density constant.
        agent_radius, mass, drag, dt, substeps, contact_stiffness, max_force: physics.
        goal_radius: distance at which an agent counts as arrived (default ``agent_radius``).
        shaping_factor: reward per unit of distance gained towards the goal.
        collision_penalty: penalty per agent touched, per step.
        final_reward: bonus to everyone while every agent is on its goal.
        shared_reward: every agent's progress term is the sum of all agents' progress (VMAS
            navigation's ``shared_rew``, on by default there); collisions stay each agent's.
        group_map: ``"agents"``, ``"per_agent"`` or an explicit map over ``agent_0..``.
        backend: ``"auto"`` (C++ on cpu when built, else torch), ``"native"`` or ``"torch"``.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        render_size: side in pixels of the frames :meth:`render` returns.
        color_by: ``"agent"`` (each agent in its own colour, its goal a ring of the same colour,
            so a viewer sees who goes where) or ``"group"`` (one colour per group).
    """

    seed_offset = 1_000_003

    def __init__(
        self,
        num_envs: int = 32,
        n_agents: int = 4,
        *,
        continuous_actions: bool = True,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        k_nearest: int = 4,
        obs_mode: ObsMode = "knn",
        n_lidar_rays: int = 12,
        lidar_range: float = 0.35,
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
        shared_reward: bool = False,
        group_map: GroupMapLike = "agents",
        backend: Backend = "auto",
        validate_actions: bool = True,
        render_size: int = 256,
        color_by: Literal["agent", "group"] = "agent",
    ):
        super().__init__(
            num_envs=num_envs,
            n_agents=n_agents,
            k_nearest=k_nearest,
            continuous_actions=continuous_actions,
            max_force=max_force,
            group_map=group_map,
            device=device,
            backend=backend,
            validate_actions=validate_actions,
            render_size=render_size,
            obs_mode=obs_mode,
            n_lidar_rays=n_lidar_rays,
            lidar_range=lidar_range,
        )
        check_one_of("color_by", color_by, ("agent", "group"), owner="navigation")
        self.color_by = color_by
        default_size = max(1.0, 0.25 * math.sqrt(n_agents))
        self.half_extent = check_real(
            "world_size", world_size if world_size is not None else default_size
        )
        radius = check_real("agent_radius", agent_radius)
        if self.half_extent <= radius:
            raise ValueError(f"world_size {self.half_extent} must exceed agent_radius {radius}")
        self.physics = {
            "radius": radius,
            **check_physics(mass, drag, dt, substeps, contact_stiffness),
            "half_extent": self.half_extent,
        }
        self.goal_radius = check_real(
            "goal_radius", goal_radius if goal_radius is not None else radius
        )
        self.shaping_factor = check_real("shaping_factor", shaping_factor, strict=False)
        self.collision_penalty = check_real("collision_penalty", collision_penalty, strict=False)
        self.final_reward = check_real("final_reward", final_reward, strict=False)
        self.shared_reward = check_flag("shared_reward", shared_reward)

        self._build_specs()
        self._goal = torch.zeros_like(self._pos)
        self._dist = torch.zeros(num_envs, n_agents, device=self.device)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ specs
    @property
    def observation_dim(self) -> int:
        return 6 + (self.n_lidar_rays if self.obs_mode == "lidar" else 2 * self.k)

    @property
    def state_dim(self) -> int:
        """``6N``: every agent's position, velocity and goal."""
        return 6 * self.n_agents

    # ------------------------------------------------------------------ hooks
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

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        force = self._force(tensordict)
        contacts = particle_step(self._pos, self._vel, force, backend=self.backend, **self.physics)
        dist = torch.linalg.vector_norm(self._goal - self._pos, dim=-1)
        arrived_all = (dist < self.goal_radius).all(-1)
        reward = self.shaping_factor * (self._dist - dist)
        if self.shared_reward:  # VMAS's shared_rew: everyone gets the team's progress
            reward = reward.sum(-1, keepdim=True).expand_as(reward)
        if self.collision_penalty:
            reward = reward - self.collision_penalty * contacts.to(torch.float32)
        reward = reward + self.final_reward * arrived_all.unsqueeze(-1).to(torch.float32)
        self._dist = dist
        return self._output(reward=reward, arrived_all=arrived_all)

    # ------------------------------------------------------------------ outputs
    def _observations(self) -> torch.Tensor:
        if self.obs_mode == "lidar":
            sensed = self._lidar_observation()
            return torch.cat([self._pos, self._vel, self._pos - self._goal, sensed], dim=-1)
        parts = [self._pos, self._vel, self._goal - self._pos]
        if self.k > 0:
            rel, _ = knn(self._pos, self.k, backend=self.backend)
            parts.append(rel.reshape(self.num_envs, self.n_agents, 2 * self.k))
        return torch.cat(parts, dim=-1)

    def _output(
        self, reward: torch.Tensor | None, arrived_all: torch.Tensor | None
    ) -> TensorDictBase:
        state = torch.cat([self._pos, self._vel, self._goal], dim=-1).reshape(self.num_envs, -1)
        return self._outputs(self._observations(), state, reward, terminated=arrived_all)

    def _render(self, env_index: int) -> object:
        """Goals as rings, agents as discs, coloured by agent or by group (``color_by``)."""
        pos, goal = self._pos[env_index].cpu(), self._goal[env_index].cpu()
        radius = self.physics["radius"]
        layers = []
        for i, (g, idx) in enumerate(self._group_index.items()):
            members = idx.cpu()
            if self.color_by == "agent":
                colors = np.array([group_color(int(a)) for a in members])
                ring = colors
            else:
                colors = np.array([group_color(i)] * len(members))
                ring = np.array([lighten(group_color(i))] * len(members))
            layers.append(Circles(goal[members], radius * 1.4, ring, filled=False))
            layers.append(Circles(pos[members], radius, colors, name=g))
        return render_frame(layers, half_extent=self.half_extent, size=self.render_size)

    # ------------------------------------------------------------------ introspection
    @property
    def goals(self) -> torch.Tensor:
        """Goal positions ``[E, N, 2]`` (a copy)."""
        return self._goal.clone()
