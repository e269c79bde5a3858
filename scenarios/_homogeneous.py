"""What the native scenarios with one kind of agent share (navigation, swarm).

Agents are named ``agent_0 .. agent_{N-1}`` and may be split by any group map; every group has
the same observation and action specs; actions are a 2-D force in ``[-1, 1]`` or one of five
discrete moves; physics runs on the C++ kernels on cpu and on their torch twin elsewhere. Each
agent senses the others through its ``k`` nearest neighbours (``obs_mode="knn"``) or through
VMAS's LiDAR (``obs_mode="lidar"``, :func:`marlkit.native.lidar.lidar`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_flag, check_int, check_one_of, check_real
from marlkit.data._fast import unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import ACTION, OBSERVATION, REWARD, STATE, TERMINATED, TRUNCATED
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import (
    SPEC_FACTOR,
    check_batch_memory,
    format_bytes,
    reward_done_bytes,
)
from marlkit.native import load_extension, native_or_fallback
from marlkit.native.lidar import lidar

__all__ = [
    "DISCRETE_DIRECTIONS",
    "OBS_MODES",
    "Backend",
    "HomogeneousScenario",
    "ObsMode",
    "resolve_backend",
]

#: Unit force of each discrete action: no-op, -x, +x, -y, +y (VMAS's order).
DISCRETE_DIRECTIONS = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))

Backend = Literal["auto", "native", "torch"]
ObsMode = Literal["knn", "lidar"]
#: How an agent senses the others: its k nearest neighbours, or VMAS's LiDAR.
OBS_MODES: tuple[str, ...] = ("knn", "lidar")


def resolve_backend(backend: Backend, device: torch.device) -> Literal["native", "torch"]:
    """``"auto"`` -> C++ kernels on cpu when built, else the torch twin; ``"native"`` insists."""
    if backend == "torch":
        return "torch"
    if backend == "native":
        if device.type != "cpu":
            raise ValueError(f"backend='native' runs on cpu only, the env is on {device}")
        load_extension()  # raises ExtensionError with the rebuild command
        return "native"
    check_one_of("backend", backend, ("auto", "native", "torch"))
    if device.type == "cpu" and native_or_fallback("the native scenarios"):
        return "native"
    return "torch"


#: Dense ``[N, N]`` float32 tensors per env that the torch twins of the particle kernels (pair
#: forces, k nearest neighbours) hold at the peak of a step, at least: measured (peak resident
#: memory per env, less the spec term) 8 to 27 in navigation, swarm and predator_prey for N from
#: 16 to 512; and per LiDAR ray, dense ``[N, N]`` tensors of the torch LiDAR (4.3 to 7.3).
TORCH_PAIR_TENSORS = 6
TORCH_RAY_TENSORS = 4


def check_memory(
    env: EnvBase, owner: str, spec_bytes: int, n_bodies: int, rays: int, backend: str
) -> None:
    """Refuse a batch of ``env.batch_size`` worlds that would not fit in memory (see
    :func:`~marlkit.envs._memory.check_batch_memory`), before any of it is allocated.

    Per world: :data:`~marlkit.envs._memory.SPEC_FACTOR` times ``spec_bytes`` (what the
    scenario's specs hold per world), plus, on the torch backend, the dense pair tensors of its
    ``n_bodies`` bodies (and of ``rays`` LiDAR rays per agent).
    """
    per_env = SPEC_FACTOR * spec_bytes
    basis = f"{SPEC_FACTOR} x the {spec_bytes:,} bytes its specs hold"
    if backend == "torch":
        dense = 4 * n_bodies * n_bodies * (TORCH_PAIR_TENSORS + TORCH_RAY_TENSORS * rays)
        per_env += dense
        basis += f", and {format_bytes(dense)} of the torch backend's dense pair tensors"
    check_batch_memory(owner, env.batch_size[0], per_env, env.device, basis=basis)


def check_physics(
    mass: object, drag: object, dt: object, substeps: object, contact_stiffness: object
) -> dict[str, Any]:
    """The ``particle_step`` keyword arguments a scenario's physics arguments give, each
    checked and named as the scenario's argument (``contact_stiffness``, not ``stiffness``).

    Raises:
        TypeError: a value that is not a number (``substeps``: not an int).
        ValueError: ``mass`` or ``dt`` not ``> 0``, ``drag`` outside ``[0, 1)``,
            ``contact_stiffness`` negative, ``substeps < 1``, or a value not finite.
    """
    return {
        "mass": check_real("mass", mass),
        "drag": check_real("drag", drag, strict=False, below=1.0),
        "dt": check_real("dt", dt),
        "substeps": check_int("substeps", substeps, low=1),
        "stiffness": check_real("contact_stiffness", contact_stiffness, strict=False),
    }


class HomogeneousScenario(EnvBase):
    """Base of navigation and swarm: agents, groups, action specs and forces, group outputs.

    Subclasses call :meth:`_build_specs` once their observation and state sizes are known, use
    :meth:`_force` in ``_step`` and :meth:`_outputs` to assemble what reset and step return;
    in ``obs_mode="lidar"``, :meth:`lidar_readings` casts the rays (against discs of radius
    ``physics["radius"]``, which subclasses set).
    The base holds the agents' positions and velocities ``[E, N, 2]`` and the generator of
    their resets, seeded at ``seed + seed_offset`` (each scenario its own offset, so that
    resets and the base class's random actions draw different streams).
    """

    render_modes = ("rgb_array",)
    seed_offset: int = 0
    #: The keyword arguments of :func:`~marlkit.native.particles.particle_step` (set by each
    #: subclass); ``physics["radius"]`` is also the radius the LiDAR rays hit.
    physics: dict[str, Any]

    def __init__(
        self,
        *,
        num_envs: int,
        n_agents: int,
        k_nearest: int,
        continuous_actions: bool,
        max_force: float,
        group_map: GroupMapLike,
        device: str | torch.device,
        backend: Backend,
        validate_actions: bool,
        render_size: int,
        obs_mode: ObsMode = "knn",
        n_lidar_rays: int = 12,
        lidar_range: float = 0.35,
    ):
        check_one_of("obs_mode", obs_mode, list(OBS_MODES))
        n_lidar_rays = check_int("n_lidar_rays", n_lidar_rays, low=1)
        lidar_range = check_real("lidar_range", lidar_range)
        num_envs = check_int("num_envs", num_envs, low=1)
        n_agents = check_int("n_agents", n_agents, low=1)
        k_nearest = check_int("k_nearest", k_nearest, low=0)
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.num_envs, self.n_agents = num_envs, n_agents
        self.k = min(k_nearest, n_agents - 1)
        self.continuous_actions = check_flag("continuous_actions", continuous_actions)
        self.max_force = check_real("max_force", max_force, strict=False)
        self.backend = resolve_backend(backend, self.device)
        self.render_size = check_int("render_size", render_size, low=1)
        self.obs_mode: ObsMode = obs_mode
        self.n_lidar_rays = n_lidar_rays
        self.lidar_range = lidar_range
        check_memory(
            self,
            f"{type(self).__name__}(n_agents={n_agents})",
            self._spec_bytes_per_env(),
            n_agents,
            n_lidar_rays if obs_mode == "lidar" else 0,
            self.backend,
        )
        names = [f"agent_{i}" for i in range(n_agents)]
        self.group_map = make_group_map(names, group_map)
        index = {name: i for i, name in enumerate(names)}
        self._group_index = {
            g: torch.tensor([index[a] for a in agents], device=self.device)
            for g, agents in self.group_map.items()
        }
        self._single_group = list(self.group_map.values()) == [names]
        self._directions = torch.tensor(DISCRETE_DIRECTIONS, device=self.device) * self.max_force
        self._pos = torch.zeros(num_envs, n_agents, 2, device=self.device)
        self._vel = torch.zeros(num_envs, n_agents, 2, device=self.device)
        self._gen = torch.Generator(device=self.device)
        self._gen.seed()

    def _set_seed(self, seed: int) -> None:
        self._gen.manual_seed(seed + self.seed_offset)

    @property
    def positions(self) -> torch.Tensor:
        """Agent positions ``[E, N, 2]`` (a copy)."""
        return self._pos.clone()

    def lidar_readings(self) -> torch.Tensor:
        """LiDAR readings ``[E, N, n_lidar_rays]`` of the current positions: along each ray, the
        distance to the nearest other agent's disc, at most ``lidar_range``."""
        radius = float(self.physics["radius"])
        return lidar(self._pos, self.n_lidar_rays, self.lidar_range, radius, backend=self.backend)

    def _lidar_observation(self) -> torch.Tensor:
        """What the agents observe of their LiDAR, as VMAS writes it: ``lidar_range - reading``
        ``[E, N, n_lidar_rays]`` (0 where nothing is in range)."""
        return torch.rsub(self.lidar_readings(), self.lidar_range)

    @property
    def observation_dim(self) -> int:
        """The size of an agent's observation (set by each subclass)."""
        raise NotImplementedError

    @property
    def state_dim(self) -> int:
        """The size of the root state (set by each subclass)."""
        raise NotImplementedError

    def _spec_bytes_per_env(self) -> int:
        """The bytes :meth:`_build_specs` declares per world (worked out before it runs): per
        agent the float32 observation, the action (two float32 forces or one int64 move), the
        reward and flags; the float32 state."""
        action = 2 * torch.float32.itemsize if self.continuous_actions else torch.int64.itemsize
        per_agent = self.observation_dim * torch.float32.itemsize + action
        return (
            self.n_agents * per_agent
            + self.state_dim * torch.float32.itemsize
            + reward_done_bytes(self.n_agents)
        )

    def _build_specs(self) -> None:
        """Per group: ``observation`` ``[E, n, observation_dim]`` and the action; root state
        ``[E, state_dim]``; rewards and done flags of the standard layout."""
        observation_dim, state_dim = self.observation_dim, self.state_dim
        b, dev = self.batch_size, self.device
        sizes = {g: len(a) for g, a in self.group_map.items()}
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        for g, n in sizes.items():
            obs[g] = Composite(
                {OBSERVATION: Unbounded((*b, n, observation_dim), device=dev)},
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
            {STATE: Unbounded((*b, state_dim), device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

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

    def _outputs(
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        reward: torch.Tensor | None = None,
        terminated: torch.Tensor | None = None,
        truncated: torch.Tensor | None = None,
    ) -> TensorDictBase:
        """The root TensorDict of a reset (``reward`` None) or a step.

        Args:
            obs: ``[E, N, obs_dim]`` for every agent.
            state: ``[E, state_dim]``.
            reward: ``[E, N]`` (steps only).
            terminated, truncated: ``[E]`` bool, env-level (steps only; default all False),
                written at the root: the done rule gives every agent its env's flags.
        """
        e = self.num_envs
        root: dict[str, torch.Tensor | TensorDictBase] = {STATE: state}
        for g, idx in self._group_index.items():
            n = idx.numel()
            entries = {OBSERVATION: obs if self._single_group else obs[:, idx]}
            if reward is not None:
                entries[REWARD] = (reward if self._single_group else reward[:, idx]).unsqueeze(-1)
            root[g] = unchecked_tensordict(entries, (e, n), self.device, nested=False)
        if reward is not None:
            for key, flag in ((TERMINATED, terminated), (TRUNCATED, truncated)):
                root[key] = (
                    flag.reshape(e, 1)
                    if flag is not None
                    else torch.zeros(e, 1, dtype=torch.bool, device=self.device)
                )
        return unchecked_tensordict(root, (e,), self.device, nested=False)
