"""What each side of a navigation benchmark computes, and the JSON ``"work"`` object saying so.

A *work* names what the native (and torch-twin) side of a cell computes; VMAS always runs its
``navigation`` defaults:

- ``"lidar"`` (the default, like for like): native navigation with VMAS's sensor, observation,
  agent radius and substeps: ``obs_mode="lidar"``, 12 rays of range 0.35 against the other
  agents' discs, ``agent_radius=0.1``, 2 substeps, in a box as wide as VMAS's spawning square;
- ``"knn"``: native navigation's own defaults (the k nearest neighbours instead of a LiDAR,
  radius 0.05, 4 substeps): different work, kept to compare with earlier figures.

:func:`native_work` and :func:`vmas_work` describe a built env from its own attributes, with the
same keys on both sides (sensor, rays, radius, substeps, world bounds, observation size, ...), so
that a reader of the JSON can check what was compared. Each also lists what that side computes
and the other does not.
"""

from __future__ import annotations

import math
from typing import Any

from marlkit._checks import check_one_of

__all__ = [
    "DEFAULT_WORK",
    "VMAS_NAVIGATION",
    "WORKS",
    "WORK_LABELS",
    "native_kwargs",
    "native_work",
    "vmas_spawning",
    "vmas_work",
]

#: The works a cell's native side can compute (see the module docstring).
WORKS: tuple[str, ...] = ("lidar", "knn")
DEFAULT_WORK = "lidar"
#: One line per work, for tables, plots and the JSON.
WORK_LABELS: dict[str, str] = {
    "lidar": "like for like: VMAS navigation's 12-ray LiDAR, observation, agent radius and "
    "substeps",
    "knn": "different work: native navigation's defaults (k nearest neighbours, no LiDAR), "
    "not comparable with VMAS",
}

#: VMAS ``navigation``'s defaults that the ``"lidar"`` work copies (checked against VMAS's
#: scenario in the tests).
VMAS_NAVIGATION: dict[str, Any] = {
    "n_lidar_rays": 12,
    "lidar_range": 0.35,
    "agent_radius": 0.1,
    "substeps": 2,
    "dt": 0.1,
    "drag": 0.25,
}

#: What VMAS navigation computes that the native side does not, and why it does not matter.
_VMAS_ONLY = [
    "rotation and torque integration of its rotatable agents (always 0 here: contacts between "
    "discs exert no torque); benchmarks/env_step.py --vmas-extras measures its share of a step",
    "per-agent info dicts (references to reward terms it already holds)",
]
#: What the native side computes that VMAS does not.
_NATIVE_ONLY = [
    "world bounds (each coordinate clamped to the box, velocity zeroed there)",
    "the global state [E, 6N] (positions, velocities, goals)",
    "TensorDict outputs and step_mdp (the env API a rollout uses)",
]


def vmas_spawning(agents: int) -> float:
    """Half-width of VMAS's spawning square for ``agents`` agents: ``max(1, 0.5 sqrt(agents))``.

    VMAS spawns with a minimum spacing inside ``[-1, 1]^2`` by default, which never completes for
    64 agents; growing the area with ``sqrt(agents)`` keeps the density constant, as the native
    world does.
    """
    return max(1.0, 0.5 * math.sqrt(agents))


def _check_work(work: str) -> None:
    check_one_of("work", work, list(WORKS))


def native_kwargs(work: str, agents: int) -> dict[str, Any]:
    """Keyword arguments of native ``navigation`` for ``work`` with ``agents`` agents per env."""
    _check_work(work)
    if work == "knn":
        return {}
    v = VMAS_NAVIGATION
    return {
        "obs_mode": "lidar",
        "n_lidar_rays": v["n_lidar_rays"],
        "lidar_range": v["lidar_range"],
        "agent_radius": v["agent_radius"],
        "substeps": v["substeps"],
        "dt": v["dt"],
        "drag": v["drag"],
        "world_size": vmas_spawning(agents),
    }


def native_work(env: Any, work: str) -> dict[str, Any]:
    """The ``"work"`` object of a native ``navigation`` env built for ``work``."""
    _check_work(work)
    physics = env.physics
    if env.obs_mode == "lidar":
        sensor = {
            "kind": "lidar",
            "rays": env.n_lidar_rays,
            "range": env.lidar_range,
            "hits": "the other agents' discs",
            "cost": "agents within range + radius, through a uniform grid: O(N R) per env",
        }
        observation = "[pos, vel, pos - goal, lidar_range - reading per ray]"
    else:
        sensor = {"kind": "knn", "k": env.k, "cost": "uniform grid: O(N k) per env"}
        observation = "[pos, vel, goal - pos, relative positions of the k nearest agents]"
    return {
        "work": work,
        "label": WORK_LABELS[work],
        "sensor": sensor,
        "observation": observation,
        "observation_size": env.observation_dim,
        "agent_radius": physics["radius"],
        "substeps": physics["substeps"],
        "dt": physics["dt"],
        "drag": physics["drag"],
        "contacts": (
            f"soft springs (stiffness {physics['stiffness']:g}) between touching agents, found "
            "through a uniform grid"
        ),
        "world_bounds": f"box [-{env.half_extent:g}, {env.half_extent:g}]^2",
        "spawn_half_width": env.half_extent - physics["radius"],
        "reward": "shaping (distance gained), collision penalty per agent touched, final reward",
        "done": "every agent on its goal",
        "api": "EnvBase.step (action validation off) then step_mdp, TensorDicts in and out",
        "not_done_by_the_peer": list(_NATIVE_ONLY),
    }


def vmas_work(env: Any, spawn: float) -> dict[str, Any]:
    """The ``"work"`` object of a raw VMAS ``navigation`` env (``vmas.make_env``)."""
    scenario, world = env.scenario, env.world
    if scenario.collisions:
        sensor = {
            "kind": "lidar",
            "rays": scenario.n_lidar_rays,
            "range": scenario.lidar_range,
            "hits": "the other agents' discs",
            "cost": "every ray against every other agent: O(N^2 R) per env",
        }
    else:
        sensor = {"kind": "none"}
    bounds = world.x_semidim
    return {
        "work": "vmas navigation defaults",
        "label": "VMAS navigation with its defaults (spawning area grown with sqrt(agents))",
        "sensor": sensor,
        "observation": "[pos, vel, pos - goal, lidar_range - reading per ray]",
        "observation_size": int(env.observation_space[0].shape[0]),
        "agent_radius": scenario.agent_radius,
        "substeps": world._substeps,
        "dt": world.dt,
        "drag": world._drag,
        "contacts": (
            f"penalty forces (collision_force {world._collision_force:g}) over every pair of agents"
        ),
        "world_bounds": "unbounded" if bounds is None else f"box [-{bounds:g}, {bounds:g}]^2",
        "spawn_half_width": spawn,
        "reward": "shaping (distance gained), collision penalty per pair closer than 0.005, "
        "final reward",
        "done": "every agent on its goal",
        "api": "raw Environment.step: a list of per-agent action tensors in, lists out",
        "not_done_by_the_peer": list(_VMAS_ONLY),
    }
