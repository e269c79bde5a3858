"""``swarm``: flocking with local observations, built to scale to 10,000 agents in one env.

N holonomic agents share a square world whose side grows with ``sqrt(N)`` (constant density).
Each agent senses only its ``k`` nearest neighbours within ``sensing_radius``, found by the
O(N) grid kernel of :mod:`marlkit.native.particles`, and is rewarded for the three rules of
Reynolds' boids measured on those neighbours, plus cruising at a target speed:

* **cohesion**: the distance to the centroid of its visible neighbours (an agent that sees
  nobody gets the largest penalty);
* **alignment**: the difference between its velocity and their mean velocity;
* **separation**: the number of agents it touches (soft contacts push them apart);
* **speed**: ``| |v| - target_speed |``, so that standing still is not a solution.

Physics (C++ kernel on CPU, the same maths in torch elsewhere): forces from actions, drag, a
speed limit, substepped semi-implicit Euler, soft agent-agent contacts and square world bounds.
Nothing terminates; episodes are truncated after ``max_steps`` steps.

Keys (group ``"agents"`` by default; any group map works)::

    (group, "observation")  [E, n, 4 + 5k]  "knn" (the default): own velocity (2), own position
                                            / L (2), then for the k nearest neighbours within
                                            the sensing radius: relative positions /
                                            sensing_radius (2k), relative velocities (2k), 1
                                            where the slot holds one (k)
                            [E, n, 4 + R]   "lidar": own velocity (2), own position / L (2),
                                            lidar_range - reading of each of the R LiDAR rays
                                            (VMAS's sensor, :mod:`marlkit.native.lidar`); the
                                            rewards still measure the k nearest neighbours
    (group, "action")       [E, n, 2] in [-1, 1] (continuous force), or [E, n] in {0..4}
                                            (no-op, -x, +x, -y, +y)
    ("next", group, "reward") [E, n, 1]     minus the weighted cohesion, alignment, speed and
                                            separation terms
    "state"                 [E, 4N]         every agent's position and velocity
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_real
from marlkit.data.group_map import GroupMapLike
from marlkit.native.particles import knn, particle_step
from marlkit.native.render import Circles, render_frame
from marlkit.scenarios._homogeneous import Backend, HomogeneousScenario, ObsMode, check_physics

__all__ = ["SwarmEnv"]


def _heading_colors(vel: np.ndarray) -> np.ndarray:
    """An RGB colour per agent from its heading (hue), grey when it barely moves: ``[n, 3]``."""
    angle = np.arctan2(vel[:, 1], vel[:, 0])  # [-pi, pi]
    hue = (angle / (2 * np.pi)) % 1.0
    k = (np.array([5.0, 3.0, 1.0])[None, :] + hue[:, None] * 6.0) % 6.0
    rgb = 1.0 - np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)  # HSV to RGB at S = V = 1
    rgb = 0.15 + 0.7 * rgb  # away from white and black
    slow = np.hypot(vel[:, 0], vel[:, 1]) < 1e-3
    rgb[slow] = 0.5
    return np.rint(rgb * 255).astype(np.int64)


class SwarmEnv(HomogeneousScenario):
    """A flock of ``n_agents`` in each of ``num_envs`` worlds.

    Args:
        num_envs: worlds stepped together (the env batch ``B = [num_envs]``).
        n_agents: agents per world (10,000 in one world steps in milliseconds on the CPU).
        continuous_actions: 2-D force in ``[-1, 1]`` (True) or 5 discrete moves (False).
        device: where the state lives; the C++ kernels serve cpu, torch serves the rest (its
            dense pair tensors need ``O(n_agents^2)`` memory per world).
        seed: seed for resets and random actions (``None``: nondeterministic).
        k_nearest: neighbours each agent senses (capped at ``n_agents - 1``): in its
            ``"knn"`` observation and in its cohesion and alignment rewards.
        sensing_radius: how far an agent sees its neighbours.
        obs_mode: ``"knn"`` (the k nearest neighbours) or ``"lidar"`` (``n_lidar_rays`` LiDAR
            rays against the other agents' discs, as VMAS's navigation sees); see the module
            docstring for the layouts.
        n_lidar_rays, lidar_range: the rays of ``"lidar"`` mode (VMAS's defaults: 12, 0.35).
        density: agents per unit area, which sets the default world size.
        world_size: half-width ``L`` of the square world ``[-L, L]^2``; default
            ``max(1, sqrt(n_agents / density) / 2)``.
        agent_radius, mass, drag, dt, substeps, contact_stiffness, max_force: physics.
        max_speed: the agents' speed limit.
        target_speed: the cruising speed the speed term rewards.
        cohesion_weight, alignment_weight, separation_weight, speed_weight: reward weights.
        max_steps: steps before an episode is truncated (``None``: never).
        group_map: ``"agents"``, ``"per_agent"`` or an explicit map over ``agent_0..``.
        backend: ``"auto"`` (C++ on cpu when built, else torch), ``"native"`` or ``"torch"``.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        render_size: side in pixels of the frames :meth:`render` returns.

    Example:
        >>> import marlkit
        >>> env = marlkit.make("swarm", num_envs=2, n_agents=50, k_nearest=6, seed=0)
        >>> env.reset()["agents", "observation"].shape
        torch.Size([2, 50, 34])
    """

    seed_offset = 2_000_003

    def __init__(
        self,
        num_envs: int = 8,
        n_agents: int = 64,
        *,
        continuous_actions: bool = True,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        k_nearest: int = 6,
        sensing_radius: float = 1.0,
        obs_mode: ObsMode = "knn",
        n_lidar_rays: int = 12,
        lidar_range: float = 0.35,
        density: float = 4.0,
        world_size: float | None = None,
        agent_radius: float = 0.05,
        mass: float = 1.0,
        drag: float = 0.25,
        dt: float = 0.1,
        substeps: int = 2,
        contact_stiffness: float = 100.0,
        max_force: float = 1.0,
        max_speed: float = 1.0,
        target_speed: float = 0.5,
        cohesion_weight: float = 1.0,
        alignment_weight: float = 1.0,
        separation_weight: float = 1.0,
        speed_weight: float = 0.5,
        max_steps: int | None = 200,
        group_map: GroupMapLike = "agents",
        backend: Backend = "auto",
        validate_actions: bool = True,
        render_size: int = 256,
    ):
        check_int("max_steps", max_steps, low=1, allow_none=True)
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
        self.sensing_radius = check_real("sensing_radius", sensing_radius)
        default_size = max(1.0, 0.5 * math.sqrt(n_agents / check_real("density", density)))
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
            "max_speed": check_real("max_speed", max_speed),
        }
        self.target_speed = check_real("target_speed", target_speed, strict=False)
        self.weights = {
            name: check_real(f"{name}_weight", value, strict=False)
            for name, value in (
                ("cohesion", cohesion_weight),
                ("alignment", alignment_weight),
                ("separation", separation_weight),
                ("speed", speed_weight),
            )
        }
        self.max_steps = max_steps

        self._build_specs()
        self._steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ specs
    @property
    def observation_dim(self) -> int:
        return 4 + (self.n_lidar_rays if self.obs_mode == "lidar" else 5 * self.k)

    @property
    def state_dim(self) -> int:
        """``4N``: every agent's position and velocity."""
        return 4 * self.n_agents

    # ------------------------------------------------------------------ hooks
    def _spawn(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform positions in the world and velocities of random heading at half the target
        speed: ``[count, N, 2]`` each."""
        span = self.half_extent - self.physics["radius"]
        u = torch.rand(count, self.n_agents, 3, generator=self._gen, device=self.device)
        pos = (u[..., :2] * 2.0 - 1.0) * span
        angle = u[..., 2] * (2.0 * math.pi)
        vel = torch.stack((angle.cos(), angle.sin()), dim=-1) * (0.5 * self.target_speed)
        return pos, vel

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None:
            self._pos, self._vel = self._spawn(self.num_envs)
            self._steps.zero_()
        else:
            idx = env_mask.nonzero().squeeze(-1)
            self._pos[idx], self._vel[idx] = self._spawn(idx.numel())
            self._steps[idx] = 0
        obs, _ = self._observe(None)
        return self._output(obs, reward=None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        force = self._force(tensordict)
        contacts = particle_step(self._pos, self._vel, force, backend=self.backend, **self.physics)
        self._steps += 1
        obs, reward = self._observe(contacts)
        return self._output(obs, reward=reward)

    # ------------------------------------------------------------------ outputs
    def _observe(self, contacts: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Observations ``[E, N, observation_dim]``; given the contacts ``[E, N]``, rewards
        ``[E, N]``."""
        e, n, k = self.num_envs, self.n_agents, self.k
        pos, vel = self._pos, self._vel
        speed = torch.linalg.vector_norm(vel, dim=-1)  # [E, N]
        parts = [vel, pos / self.half_extent]
        knn_obs = self.obs_mode == "knn"
        if not knn_obs:
            parts.append(self._lidar_observation())
        cohesion = torch.ones(e, n, device=self.device)  # nobody in sight: the largest penalty
        alignment = torch.zeros(e, n, device=self.device)
        if k > 0 and (knn_obs or contacts is not None):
            rel, idx = knn(pos, k, radius=self.sensing_radius, backend=self.backend)
            found = idx >= 0  # [E, N, k]
            flat = idx.clamp(min=0).view(e, n * k, 1).expand(e, n * k, 2)
            rel_vel = torch.gather(vel, 1, flat).view(e, n, k, 2) - vel[:, :, None, :]
            rel_vel = torch.where(found[..., None], rel_vel, 0.0)
            if knn_obs:
                parts += [
                    (rel / self.sensing_radius).reshape(e, n, 2 * k),
                    rel_vel.reshape(e, n, 2 * k),
                    found.to(torch.float32),
                ]
            if contacts is not None:
                count = found.sum(-1, keepdim=True)  # [E, N, 1]
                seen = count[..., 0] > 0
                mean = 1.0 / count.clamp(min=1)
                centroid = torch.linalg.vector_norm(rel.sum(2) * mean, dim=-1)
                cohesion = torch.where(seen, centroid / self.sensing_radius, 1.0)
                alignment = torch.linalg.vector_norm(rel_vel.sum(2) * mean, dim=-1)
                alignment = alignment / (2.0 * self.physics["max_speed"])
        obs = torch.cat(parts, dim=-1)
        if contacts is None:
            return obs, None
        w = self.weights
        cost = (
            w["cohesion"] * cohesion
            + w["alignment"] * alignment
            + w["speed"] * (speed - self.target_speed).abs() / self.physics["max_speed"]
            + w["separation"] * contacts.to(torch.float32)
        )
        return obs, -cost

    def _output(self, obs: torch.Tensor, reward: torch.Tensor | None) -> TensorDictBase:
        truncated = self._steps >= self.max_steps if self.max_steps is not None else None
        state = torch.cat([self._pos, self._vel], dim=-1).reshape(self.num_envs, -1)
        return self._outputs(obs, state, reward, truncated=truncated)

    def _render(self, env_index: int) -> object:
        """Agents as discs coloured by heading (the native renderer); a disc smaller than a pixel
        still shows as one pixel."""
        pos = self._pos[env_index].cpu().numpy()
        colors = _heading_colors(self._vel[env_index].cpu().numpy())
        layer = Circles(pos, self.physics["radius"], colors, name="agents")
        return render_frame([layer], half_extent=self.half_extent, size=self.render_size)

    # ------------------------------------------------------------------ introspection
    @property
    def velocities(self) -> torch.Tensor:
        """Agent velocities ``[E, N, 2]`` (a copy)."""
        return self._vel.clone()
