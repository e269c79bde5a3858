"""``predator_prey``: two heterogeneous groups in one 2-D world, batched over envs.

Slow, large predators hunt fast, small prey among static landmarks. The two groups differ in
what they see, how they act and what they are paid for, which makes this the test bed for
heterogeneous groups:

* **predators** (``predator_0..``): radius 0.075, force up to 3, speed up to 1.0. They see their
  own state, the other predators and the ``k`` nearest *live* prey (not the landmarks).
* **prey** (``prey_0..``): radius 0.05, force up to 4, speed up to 1.3, and 9 discrete moves
  (no-op and 8 compass directions) against the predators' 5. They see their own state, the ``k``
  nearest predators and every landmark.

A prey closer than ``catch_distance`` to any predator after a step is **caught** (the default,
1.5 times the touching distance ``r_pred + r_prey``, counts a catch before the soft contact has
bounced the two apart, which it does within one step). From that step on its ``terminated``
and ``done`` are true, its ``("prey", "mask")`` entry is false, its observation and reward are
0, and it is inactive in the physics (it neither moves nor collides nor appears in anyone's
observation) until its env resets. An env's episode terminates when all its prey are caught
(the root flags, and the predators' flags, which follow the root), and is truncated at every
level after ``max_steps``.

Physics (C++ kernel on CPU, the same maths in torch elsewhere, see
:mod:`marlkit.native.particles`): forces from actions, drag, per-agent radius and speed limit,
substepped semi-implicit Euler, soft contacts between agents and against landmarks, square world
bounds.

Keys (groups ``"predator"`` and ``"prey"`` by default, ``P`` predators, ``Q`` prey, ``M``
landmarks, ``kp = min(k_nearest_prey, Q)``, ``kd = min(k_nearest_predators, P - 1)`` and
``ks = min(k_nearest_predators, P)``)::

    ("predator", "observation") [E, P, 4 + 2kd + 5kp]  own velocity (2), own position (2),
                                positions of the kd nearest other predators relative to self,
                                then for the kp nearest live prey: relative positions (2kp),
                                relative velocities (2kp), 1 where the slot holds one (kp)
    ("prey", "observation")     [E, Q, 4 + 4ks + 2M]   own velocity (2), own position (2),
                                the ks nearest predators: relative positions (2ks), relative
                                velocities (2ks); landmark positions relative to self (2M);
                                all 0 once caught
    ("prey", "mask")            [E, Q] bool            the prey is still in the game
    ("predator", "action")      [E, P, 2] in [-3, 3]   force; or [E, P] in {0..4}
    ("prey", "action")          [E, Q, 2] in [-4, 4]   force; or [E, Q] in {0..8}
    ("next", "predator", "reward") [E, P, 1]  catch_reward * (prey caught in the env this step)
                                              - shaping_factor * (distance to the nearest live
                                              prey, 0 when none is left)
    ("next", "prey", "reward")  [E, Q, 1]  -catch_penalty on the step it is caught,
                                           +survival_reward on each step it is still free after,
                                           0 once caught
    "state"                     [E, 4(P + Q) + Q + 2M]  every agent's position and velocity
                                (0 for caught prey), the prey's alive flags, landmark positions
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_flag, check_int, check_real
from marlkit.data._fast import unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, agent_type, make_group_map
from marlkit.data.keys import (
    ACTION,
    DONE,
    MASK,
    OBSERVATION,
    REWARD,
    STATE,
    TERMINATED,
    TRUNCATED,
)
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import reward_done_bytes
from marlkit.native.particles import knn, particle_step
from marlkit.native.render import GROUP_COLORS, LANDMARK_COLOR, Circles, lighten, render_frame
from marlkit.scenarios._homogeneous import (
    DISCRETE_DIRECTIONS,
    check_memory,
    check_physics,
    resolve_backend,
)

__all__ = [
    "PREDATOR_COLOR",
    "PREDATOR_DIRECTIONS",
    "PREY_COLOR",
    "PREY_DIRECTIONS",
    "PredatorPreyEnv",
]

Backend = Literal["auto", "native", "torch"]

#: Unit force of the predators' 5 discrete actions: no-op, -x, +x, -y, +y (VMAS's order).
PREDATOR_DIRECTIONS = DISCRETE_DIRECTIONS

_D = 1.0 / math.sqrt(2.0)
#: Unit force of the prey's 9 discrete actions: the predators' 5, then the diagonals
#: (-x-y), (-x+y), (+x-y), (+x+y), each of length 1.
PREY_DIRECTIONS = (*DISCRETE_DIRECTIONS, (-_D, -_D), (-_D, _D), (_D, -_D), (_D, _D))

#: Render colours by agent type (whatever the group map): predators red, prey green; caught prey
#: are drawn in a faded green, landmarks grey.
PREDATOR_COLOR = GROUP_COLORS[3]
PREY_COLOR = GROUP_COLORS[2]

_PREDATOR, _PREY = "predator", "prey"


def _nearest_all(rel: torch.Tensor, d2: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest targets of each query, ordered by ``d2``, ties by index.

    Args:
        rel: ``[E, A, B, 2]`` target minus query positions.
        d2: ``[E, A, B]`` squared distances.
        k: slots, ``<= B``.

    Returns:
        ``rel`` ``[E, A, k, 2]`` and ``idx`` ``[E, A, k]``.
    """
    e, a = d2.shape[0], d2.shape[1]
    order = torch.sort(d2, dim=-1, stable=True).indices[..., :k]
    return torch.gather(rel, 2, order[..., None].expand(e, a, k, 2)), order


def _nearest(
    rel: torch.Tensor, d2: torch.Tensor, valid: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` nearest *valid* targets of each query, as :func:`_nearest_all`.

    Args:
        rel, d2, k: as in :func:`_nearest_all`.
        valid: ``[E, A, B]`` bool (or broadcastable), which targets qualify.

    Returns:
        ``rel`` ``[E, A, k, 2]`` (0 in empty slots), ``idx`` ``[E, A, k]`` (-1 in empty slots),
        ``found`` ``[E, A, k]`` bool.
    """
    valid = valid.expand(d2.shape)
    key = torch.where(valid, d2, math.nan)  # NaN sorts last
    near, order = _nearest_all(rel, key, k)
    found = torch.gather(valid, -1, order)
    return torch.where(found[..., None], near, 0.0), torch.where(found, order, -1), found


def _relative_velocities(
    vel: torch.Tensor, own: torch.Tensor, idx: torch.Tensor, found: torch.Tensor | None
) -> torch.Tensor:
    """``vel[idx] - own`` where found, else 0: ``[E, A, k, 2]`` from targets' ``vel``
    ``[E, B, 2]``, queries' ``own`` ``[E, A, 2]`` and ``idx``/``found`` ``[E, A, k]``
    (``found=None``: every slot holds a target)."""
    e, a, k = idx.shape
    flat = idx.clamp(min=0).reshape(e, a * k, 1).expand(e, a * k, 2)
    out = torch.gather(vel, 1, flat).view(e, a, k, 2) - own[:, :, None, :]
    return out if found is None else torch.where(found[..., None], out, 0.0)


class PredatorPreyEnv(EnvBase):
    """``n_predators`` predators hunting ``n_prey`` prey among ``n_landmarks`` landmarks.

    Args:
        num_envs: worlds stepped together (the env batch ``B = [num_envs]``).
        n_predators, n_prey: agents of each type per world (``>= 1``).
        n_landmarks: static grey circles per world (``>= 0``), placed at random on reset.
        continuous_actions: a 2-D force (True), or discrete moves (False): 5 for predators
            (:data:`PREDATOR_DIRECTIONS`), 9 for prey (:data:`PREY_DIRECTIONS`).
        device: where the state lives; the C++ kernel serves cpu, torch serves the rest.
        seed: seed for resets and random actions (``None``: nondeterministic).
        k_nearest_prey: live prey in a predator's observation (capped at ``n_prey``).
        k_nearest_predators: predators in a prey's observation (capped at ``n_predators``) and
            other predators in a predator's (capped at ``n_predators - 1``).
        world_size: half-width ``L`` of the square world ``[-L, L]^2``; default
            ``max(1, sqrt(n_predators + n_prey + n_landmarks) / 4)``.
        predator_radius, prey_radius, landmark_radius: sizes.
        predator_max_force, prey_max_force: the action bounds (continuous) or the force of a
            discrete move.
        predator_max_speed, prey_max_speed: speed limits.
        mass, drag, dt, substeps, contact_stiffness: physics shared by everyone.
        catch_distance: centre distance under which a prey is caught (default
            ``1.5 * (predator_radius + prey_radius)``).
        catch_reward: paid to every predator of the env per prey caught.
        catch_penalty: taken from a prey on the step it is caught.
        survival_reward: paid to each prey per step it is still free.
        shaping_factor: predators lose this times their distance to the nearest live prey.
        max_steps: steps before an episode is truncated (``None``: never).
        group_map: ``"by_type"`` (``predator`` and ``prey``), ``"per_agent"``, or an explicit
            map over ``predator_0..``, ``prey_0..`` whose groups each hold one type.
        backend: ``"auto"`` (C++ on cpu when built, else torch), ``"native"`` or ``"torch"``.
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
        render_size: side in pixels of the frames :meth:`render` returns.

    Example:
        >>> import marlkit
        >>> env = marlkit.make("predator_prey", num_envs=4, n_predators=3, n_prey=2, seed=0)
        >>> td = env.reset()
        >>> td["predator", "observation"].shape, td["prey", "observation"].shape
        (torch.Size([4, 3, 18]), torch.Size([4, 2, 20]))
    """

    render_modes = ("rgb_array",)

    def __init__(
        self,
        num_envs: int = 32,
        n_predators: int = 3,
        n_prey: int = 2,
        n_landmarks: int = 2,
        *,
        continuous_actions: bool = True,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        k_nearest_prey: int = 4,
        k_nearest_predators: int = 4,
        world_size: float | None = None,
        predator_radius: float = 0.075,
        prey_radius: float = 0.05,
        landmark_radius: float = 0.15,
        predator_max_force: float = 3.0,
        prey_max_force: float = 4.0,
        predator_max_speed: float = 1.0,
        prey_max_speed: float = 1.3,
        mass: float = 1.0,
        drag: float = 0.1,
        dt: float = 0.1,
        substeps: int = 2,
        contact_stiffness: float = 100.0,
        catch_distance: float | None = None,
        catch_reward: float = 10.0,
        catch_penalty: float = 10.0,
        survival_reward: float = 0.1,
        shaping_factor: float = 0.1,
        max_steps: int | None = 200,
        group_map: GroupMapLike = "by_type",
        backend: Backend = "auto",
        validate_actions: bool = True,
        render_size: int = 256,
    ):
        num_envs = check_int("num_envs", num_envs, low=1)
        self.n_predators = check_int("n_predators", n_predators, low=1)
        self.n_prey = check_int("n_prey", n_prey, low=1)
        self.n_landmarks = check_int("n_landmarks", n_landmarks, low=0)
        k_nearest_prey = check_int("k_nearest_prey", k_nearest_prey, low=0)
        k_nearest_predators = check_int("k_nearest_predators", k_nearest_predators, low=0)
        max_steps = check_int("max_steps", max_steps, low=1, allow_none=True)
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.num_envs = num_envs
        self.continuous_actions = check_flag("continuous_actions", continuous_actions)
        self.max_steps = max_steps
        p, q, m = self.n_predators, self.n_prey, self.n_landmarks
        self.k_prey = min(k_nearest_prey, q)
        self.k_others = min(k_nearest_predators, p - 1)
        self.k_predators = min(k_nearest_predators, p)
        self._check_sizes(world_size, predator_radius, prey_radius, landmark_radius)
        self._check_physics(mass, drag, dt, substeps, contact_stiffness)
        self.max_force = {
            _PREDATOR: check_real("predator_max_force", predator_max_force),
            _PREY: check_real("prey_max_force", prey_max_force),
        }
        self.max_speed = {
            _PREDATOR: check_real("predator_max_speed", predator_max_speed),
            _PREY: check_real("prey_max_speed", prey_max_speed),
        }
        reach = 1.5 * (self.radius[_PREDATOR] + self.radius[_PREY])
        self.catch_distance = check_real(
            "catch_distance", reach if catch_distance is None else catch_distance
        )
        self.rewards = {
            name: check_real(name, value, strict=False)
            for name, value in (
                ("catch_reward", catch_reward),
                ("catch_penalty", catch_penalty),
                ("survival_reward", survival_reward),
                ("shaping_factor", shaping_factor),
            )
        }
        self.backend = resolve_backend(backend, self.device)
        self.render_size = check_int("render_size", render_size, low=1)
        check_memory(
            self,
            f"PredatorPreyEnv(n_predators={p}, n_prey={q}, n_landmarks={m})",
            self._spec_bytes_per_env(),
            p + q,
            0,
            self.backend,
        )
        self._build_groups(group_map)
        self._build_specs()

        dev, n = self.device, p + q
        self._radius = torch.tensor([self.radius[_PREDATOR]] * p + [self.radius[_PREY]] * q)
        self._radius = self._radius.to(dev)
        speeds = [self.max_speed[_PREDATOR]] * p + [self.max_speed[_PREY]] * q
        self._speed = torch.tensor(speeds, dtype=torch.float32, device=dev)
        self._directions = {
            _PREDATOR: torch.tensor(PREDATOR_DIRECTIONS, device=dev) * self.max_force[_PREDATOR],
            _PREY: torch.tensor(PREY_DIRECTIONS, device=dev) * self.max_force[_PREY],
        }
        self._pos = torch.zeros(num_envs, n, 2, device=dev)
        self._vel = torch.zeros(num_envs, n, 2, device=dev)
        self._landmarks = torch.zeros(num_envs, m, 2, device=dev)
        self._active = torch.ones(num_envs, n, dtype=torch.bool, device=dev)
        self._steps = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self._gen = torch.Generator(device=dev)
        self._gen.seed()
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    def _check_sizes(
        self,
        world_size: float | None,
        predator_radius: float,
        prey_radius: float,
        landmark_radius: float,
    ) -> None:
        self.radius = {
            _PREDATOR: check_real("predator_radius", predator_radius),
            _PREY: check_real("prey_radius", prey_radius),
        }
        self.landmark_radius = check_real("landmark_radius", landmark_radius, strict=False)
        total = self.n_predators + self.n_prey + self.n_landmarks
        default = max(1.0, 0.25 * math.sqrt(total))
        self.half_extent = check_real("world_size", default if world_size is None else world_size)
        largest = max(*self.radius.values(), self.landmark_radius)
        if self.half_extent <= largest:
            raise ValueError(
                f"world_size {self.half_extent} must exceed every radius (the largest is {largest})"
            )

    def _check_physics(
        self, mass: float, drag: float, dt: float, substeps: int, contact_stiffness: float
    ) -> None:
        self.physics: dict[str, Any] = {  # particle_step keyword arguments
            **check_physics(mass, drag, dt, substeps, contact_stiffness),
            "half_extent": self.half_extent,
        }

    def _build_groups(self, group_map: GroupMapLike) -> None:
        """Resolve the group map; each group must hold one agent type."""
        predators = [f"predator_{i}" for i in range(self.n_predators)]
        prey = [f"prey_{i}" for i in range(self.n_prey)]
        self.group_map = make_group_map(predators + prey, group_map)
        self._group_type: dict[str, str] = {}
        self._local: dict[str, torch.Tensor | None] = {}  # index within the type, None: all
        self._slots: dict[str, torch.Tensor] = {}  # index among all agents (predators first)
        for g, agents in self.group_map.items():
            types = sorted({agent_type(a) for a in agents})
            if len(types) > 1:
                raise ValueError(
                    f"group {g!r} mixes predators and prey ({agents}); their observation and "
                    "action specs differ, so each group must hold one type (use 'by_type', "
                    "'per_agent' or an explicit map with one type per group)"
                )
            kind = types[0]
            local = [int(a.rpartition("_")[2]) for a in agents]
            offset = 0 if kind == _PREDATOR else self.n_predators
            self._group_type[g] = kind
            everyone = local == list(range(self.n_predators if kind == _PREDATOR else self.n_prey))
            self._local[g] = None if everyone else torch.tensor(local, device=self.device)
            self._slots[g] = torch.tensor([offset + i for i in local], device=self.device)

    @property
    def predator_observation_dim(self) -> int:
        """``4 + 2 kd + 5 kp`` (see the module docstring)."""
        return 4 + 2 * self.k_others + 5 * self.k_prey

    @property
    def prey_observation_dim(self) -> int:
        """``4 + 4 ks + 2 M`` (see the module docstring)."""
        return 4 + 4 * self.k_predators + 2 * self.n_landmarks

    @property
    def state_dim(self) -> int:
        """``4 (P + Q) + Q + 2 M`` (see the module docstring)."""
        return 4 * (self.n_predators + self.n_prey) + self.n_prey + 2 * self.n_landmarks

    def _spec_bytes_per_env(self) -> int:
        """The bytes :meth:`_build_specs` declares per world (worked out before it runs): per
        agent the float32 observation, the action (two float32 forces or one int64 move), the
        reward and flags, and each prey's bool mask; the float32 state."""
        f32 = torch.float32.itemsize
        action = 2 * f32 if self.continuous_actions else torch.int64.itemsize
        p, q = self.n_predators, self.n_prey
        predators = p * (self.predator_observation_dim * f32 + action)
        prey = q * (self.prey_observation_dim * f32 + action + torch.bool.itemsize)
        return predators + prey + self.state_dim * f32 + reward_done_bytes(p + q)

    def _build_specs(self) -> None:
        b, dev = self.batch_size, self.device
        sizes = {g: len(a) for g, a in self.group_map.items()}
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        n_moves = {_PREDATOR: len(PREDATOR_DIRECTIONS), _PREY: len(PREY_DIRECTIONS)}
        for g, n in sizes.items():
            kind = self._group_type[g]
            lead = (*b, n)
            dim = self.predator_observation_dim if kind == _PREDATOR else self.prey_observation_dim
            group = Composite(
                {OBSERVATION: Unbounded((*lead, dim), device=dev)}, shape=lead, device=dev
            )
            if kind == _PREY:
                group[MASK] = Categorical(2, lead, dtype=torch.bool, device=dev)
            obs[g] = group
            f = self.max_force[kind]
            leaf = (
                Bounded(-f, f, (*lead, 2), device=dev)
                if self.continuous_actions
                else Categorical(n_moves[kind], lead, device=dev)
            )
            act[g] = Composite({ACTION: leaf}, shape=lead, device=dev)
        self.observation_spec = obs
        self.action_spec = act
        self.state_spec = Composite(
            {STATE: Unbounded((*b, self.state_dim), device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> None:
        # Offset so that resets and the base class's random actions draw different streams.
        self._gen.manual_seed(seed + 3_000_017)

    def _spawn(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform agent positions ``[count, P + Q, 2]`` and landmarks ``[count, M, 2]``."""
        n, dev = self.n_predators + self.n_prey, self.device
        u = torch.rand(count, n + self.n_landmarks, 2, generator=self._gen, device=dev)
        u = u * 2.0 - 1.0
        span = (self.half_extent - self._radius)[None, :, None]
        landmark_span = self.half_extent - self.landmark_radius
        return u[:, :n] * span, u[:, n:] * landmark_span

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None:
            pos, landmarks = self._spawn(self.num_envs)
            self._pos, self._landmarks = pos.contiguous(), landmarks.contiguous()
            self._vel = torch.zeros_like(self._pos)
            self._active.fill_(True)
            self._steps.zero_()
        else:
            idx = env_mask.nonzero().squeeze(-1)
            self._pos[idx], self._landmarks[idx] = self._spawn(idx.numel())
            self._vel[idx] = 0.0
            self._active[idx] = True
            self._steps[idx] = 0
        return self._output(None)

    def _force(self, tensordict: TensorDictBase) -> torch.Tensor:
        """Per-agent force ``[E, P + Q, 2]`` (predators first) from the groups' actions."""
        force = torch.empty_like(self._pos)
        for g, slots in self._slots.items():
            kind = self._group_type[g]
            action = tensordict.get((g, ACTION))
            if self.continuous_actions:
                force[:, slots] = action.to(torch.float32)
            else:
                force[:, slots] = self._directions[kind][action.long()]
        return force

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        force = self._force(tensordict)
        landmarks = self._landmarks if self.n_landmarks else None
        particle_step(
            self._pos,
            self._vel,
            force,
            radius=self._radius,
            max_speed=self._speed,
            active=self._active,
            landmarks=landmarks,
            landmark_radius=self.landmark_radius if self.n_landmarks else None,
            backend=self.backend,
            **self.physics,
        )
        self._steps += 1
        p = self.n_predators
        rel, d2 = self._pairs()
        alive = self._active[:, p:]
        caught = ((d2 < self.catch_distance**2) & alive[:, None, :]).any(1)  # [E, Q]
        self._active[:, p:] = alive & ~caught
        return self._output((rel, d2, caught))

    # ------------------------------------------------------------------ outputs
    def _pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Prey minus predator positions ``[E, P, Q, 2]``, their squared lengths ``[E, P, Q]``."""
        p = self.n_predators
        rel = self._pos[:, None, p:, :] - self._pos[:, :p, None, :]
        return rel, rel[..., 0] * rel[..., 0] + rel[..., 1] * rel[..., 1]

    def _predator_view(
        self, rel: torch.Tensor, d2: torch.Tensor, alive: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Predator observations ``[E, P, dim]`` and nearest live prey distances ``[E, P]``."""
        e, p = self.num_envs, self.n_predators
        pos, vel = self._pos[:, :p], self._vel[:, :p]
        parts = [vel, pos]
        if self.k_others > 0:
            others, _ = knn(pos.contiguous(), self.k_others, backend=self.backend)
            parts.append(others.reshape(e, p, 2 * self.k_others))
        valid = alive[:, None, :]
        if self.k_prey > 0:
            near, idx, found = _nearest(rel, d2, valid, self.k_prey)
            near_vel = _relative_velocities(self._vel[:, p:], vel, idx, found)
            parts += [
                near.reshape(e, p, 2 * self.k_prey),
                near_vel.reshape(e, p, 2 * self.k_prey),
                found.to(torch.float32),
            ]
        nearest2 = torch.where(valid, d2, math.inf).amin(-1)  # [E, P]
        nearest = torch.where(torch.isfinite(nearest2), nearest2.sqrt(), 0.0)
        return torch.cat(parts, dim=-1), nearest

    def _prey_view(self, rel: torch.Tensor, d2: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Prey observations ``[E, Q, dim]``, 0 for caught prey."""
        e, p, q = self.num_envs, self.n_predators, self.n_prey
        pos, vel = self._pos[:, p:], self._vel[:, p:]
        parts = [vel, pos]
        if self.k_predators > 0:
            # Predators are always in the game: every slot holds one.
            near, idx = _nearest_all(-rel.transpose(1, 2), d2.transpose(1, 2), self.k_predators)
            near_vel = _relative_velocities(self._vel[:, :p], vel, idx, None)
            parts += [near.reshape(e, q, -1), near_vel.reshape(e, q, -1)]
        if self.n_landmarks:
            parts.append((self._landmarks[:, None, :, :] - pos[:, :, None, :]).reshape(e, q, -1))
        obs = torch.cat(parts, dim=-1)
        return torch.where(alive[..., None], obs, 0.0)

    def _rewards(
        self, caught: torch.Tensor, alive: torch.Tensor, nearest: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Rewards ``[E, P]`` and ``[E, Q]`` (see the module docstring)."""
        r = self.rewards
        catches = caught.sum(-1, keepdim=True).to(torch.float32)  # [E, 1]
        predator = r["catch_reward"] * catches - r["shaping_factor"] * nearest
        free = torch.where(alive, r["survival_reward"], 0.0)
        prey = torch.where(caught, -r["catch_penalty"], free)
        return {_PREDATOR: predator, _PREY: prey}

    def _done_flags(self, alive: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
        """Terminated and truncated per agent type, ``[E, P]`` and ``[E, Q]``."""
        e, p = self.num_envs, self.n_predators
        truncated = (
            self._steps >= self.max_steps
            if self.max_steps is not None
            else torch.zeros(e, dtype=torch.bool, device=self.device)
        )
        over = ~alive.any(-1)  # [E]
        return {
            _PREDATOR: {TERMINATED: over[:, None].expand(e, p), TRUNCATED: truncated[:, None]},
            _PREY: {TERMINATED: ~alive, TRUNCATED: truncated[:, None]},
        }

    def _output(
        self, step: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    ) -> TensorDictBase:
        """Everything ``_reset`` (``step=None``) or ``_step`` (``(rel, d2, caught)``) returns."""
        e, p = self.num_envs, self.n_predators
        if step is None:
            rel, d2 = self._pairs()
            caught = None
        else:
            rel, d2, caught = step
        alive = self._active[:, p:].clone()
        pred_obs, nearest = self._predator_view(rel, d2, alive)
        views = {_PREDATOR: pred_obs, _PREY: self._prey_view(rel, d2, alive)}
        rewards = None if caught is None else self._rewards(caught, alive, nearest)
        flags = self._done_flags(alive)
        groups = {}
        for g, local in self._local.items():
            kind = self._group_type[g]
            n = len(self.group_map[g])

            def pick(x: torch.Tensor, local: torch.Tensor | None = local) -> torch.Tensor:
                return x if local is None else x[:, local]

            entries = {OBSERVATION: pick(views[kind])}
            if kind == _PREY:
                entries[MASK] = pick(alive)
            if rewards is not None:
                entries[REWARD] = pick(rewards[kind]).unsqueeze(-1)
            term = pick(flags[kind][TERMINATED].expand(e, -1)).reshape(e, n, 1)
            trunc = flags[kind][TRUNCATED].expand(e, n).reshape(e, n, 1)
            entries.update({TERMINATED: term.clone(), TRUNCATED: trunc.clone(), DONE: term | trunc})
            groups[g] = unchecked_tensordict(entries, (e, n), self.device, nested=False)
        # The root flags follow from the agents' by the done rule (over when every prey is
        # caught: the predators terminate with the last one).
        root = {STATE: self._state(alive)}
        return unchecked_tensordict({**groups, **root}, (e,), self.device, nested=False)

    def _state(self, alive: torch.Tensor) -> torch.Tensor:
        """``[E, 4(P + Q) + Q + 2M]``: positions and velocities (0 for caught prey), alive flags,
        landmarks."""
        e = self.num_envs
        agents = torch.cat([self._pos, self._vel], dim=-1)  # [E, N, 4]
        agents = torch.where(self._active[..., None], agents, 0.0).reshape(e, -1)
        parts = [agents, alive.to(torch.float32), self._landmarks.reshape(e, -1)]
        return torch.cat(parts, dim=-1)

    def _render(self, env_index: int) -> object:
        """Landmarks grey, prey green (faded once caught), predators red."""
        p = self.n_predators
        pos = self._pos[env_index].cpu()
        alive = self._active[env_index, p:].cpu().numpy()
        prey_colors = np.where(alive[:, None], PREY_COLOR, lighten(PREY_COLOR, 0.7))
        layers = []
        if self.n_landmarks:
            landmarks = self._landmarks[env_index].cpu()
            layers.append(
                Circles(landmarks, self.landmark_radius, LANDMARK_COLOR, name="landmarks")
            )
        layers += [
            Circles(pos[p:], self.radius[_PREY], prey_colors, name="prey"),
            Circles(pos[:p], self.radius[_PREDATOR], PREDATOR_COLOR, name="predators"),
        ]
        return render_frame(layers, half_extent=self.half_extent, size=self.render_size)

    # ------------------------------------------------------------------ introspection
    def place(
        self,
        *,
        predators: torch.Tensor | None = None,
        prey: torch.Tensor | None = None,
        landmarks: torch.Tensor | None = None,
    ) -> None:
        """Move agents and landmarks, for tests and demos (velocities of moved agents become 0).

        The next :meth:`step` starts from there; the observations returned last are stale until
        then. Caught prey stay caught. Positions outside the world are clamped by the next step.

        Args:
            predators: ``[E, P, 2]`` predator positions, or ``None`` to leave them.
            prey: ``[E, Q, 2]`` prey positions, or ``None``.
            landmarks: ``[E, M, 2]`` landmark positions, or ``None``.

        Raises:
            TypeError: a value that is not a tensor.
            ValueError: a wrong shape or a non-finite position.
        """
        p, q, e = self.n_predators, self.n_prey, self.num_envs
        items = (
            ("predators", predators, (e, p, 2)),
            ("prey", prey, (e, q, 2)),
            ("landmarks", landmarks, (e, self.n_landmarks, 2)),
        )
        checked = {}
        for name, value, shape in items:
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"place(): {name} must be a tensor, got {type(value).__name__}")
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"place(): {name} must have shape {list(shape)}, got {list(value.shape)}"
                )
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"place(): {name} holds a non-finite position")
            checked[name] = value.detach().to(self.device, torch.float32)
        for name, span in (("predators", slice(0, p)), ("prey", slice(p, p + q))):
            if name in checked:
                self._pos[:, span] = checked[name]
                self._vel[:, span] = 0.0
        if "landmarks" in checked:
            self._landmarks = checked["landmarks"].clone()

    @property
    def predator_positions(self) -> torch.Tensor:
        """``[E, P, 2]`` (a copy)."""
        return self._pos[:, : self.n_predators].clone()

    @property
    def prey_positions(self) -> torch.Tensor:
        """``[E, Q, 2]`` (a copy; caught prey stay where they were caught)."""
        return self._pos[:, self.n_predators :].clone()

    @property
    def landmarks(self) -> torch.Tensor:
        """``[E, M, 2]`` (a copy)."""
        return self._landmarks.clone()

    @property
    def alive(self) -> torch.Tensor:
        """``[E, Q]`` bool: which prey are still free (a copy)."""
        return self._active[:, self.n_predators :].clone()
