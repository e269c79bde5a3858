"""Adapters: external simulators as marlkit envs, one module per simulator.

Each family is registered here without importing its simulator; ``marlkit.make("vmas/balance")``
imports :mod:`marlkit.adapters.vmas` (and VMAS) on first use. Third-party packages register their
own families with :func:`register_adapter`, from the entry-point group ``marlkit.adapters``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from marlkit.envs.registry import register_adapter

__all__ = ["register_adapter"]


def _lazy(module: str, attr: str) -> Callable[..., Any]:
    """A callable that imports ``marlkit.adapters.<module>`` only when called."""

    def call(*args: Any, **kwargs: Any) -> Any:
        target = getattr(importlib.import_module(f"marlkit.adapters.{module}"), attr)
        return target(*args, **kwargs)

    call.__module__ = f"marlkit.adapters.{module}"
    call.__qualname__ = attr
    return call


_BUILTIN: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("vmas", "VMAS vectorized multi-agent scenarios (batched, torch)", ("vmas",), "vmas"),
    (
        "pettingzoo",
        "PettingZoo parallel and AEC envs, e.g. pettingzoo/mpe2.simple_spread_v3",
        ("pettingzoo",),
        "pettingzoo",
    ),
    (
        "gymnasium",
        "Gymnasium envs as a one-agent group, e.g. gymnasium/CartPole-v1",
        ("gymnasium",),
        "gymnasium",
    ),
    (
        "mujoco",
        "Multi-agent MuJoCo: actuators partitioned into agents, e.g. mujoco/ant_2x4",
        ("mujoco", "gymnasium"),
        "mujoco",
    ),
    (
        "magent2",
        "MAgent2 grid battles grouped by team, e.g. magent2/battle_v4 (map_size sizes them)",
        ("magent2", "pettingzoo"),
        "magent2",
    ),
    (
        "meltingpot",
        "MeltingPot substrates on dmlab2d, WORLD.RGB as state, e.g. meltingpot/clean_up",
        ("meltingpot", "dmlab2d", "gymnasium"),
        "meltingpot",
    ),
    (
        "openspiel",
        "OpenSpiel games through shimmy, turn by turn with masks, e.g. openspiel/leduc_poker",
        ("shimmy", "pyspiel", "pettingzoo"),
        "openspiel",
    ),
    (
        "gymma",
        "Gymnasium envs in EPyMARL's format (Tuple spaces, one entry per agent), e.g. "
        "gymma/lbforaging:Foraging-8x8-2p-2f-coop-v3",
        ("gymnasium",),
        "gymnasium",
    ),
    (
        "lbforaging",
        "Level-Based Foraging (EPyMARL's format), e.g. lbforaging/Foraging-8x8-2p-2f-coop-v3",
        ("lbforaging", "gymnasium"),
        "lbforaging",
    ),
    (
        "rware",
        "Multi-Robot Warehouse (EPyMARL's format), e.g. rware/rware-tiny-2ag-v2",
        ("rware", "gymnasium"),
        "rware",
    ),
    (
        "jaxmarl",
        "JaxMARL envs (SMAX, MPE, Overcooked, Hanabi, STORM, coin game) as one jitted, vmapped "
        "batch, e.g. jaxmarl/MPE_simple_spread_v3",
        ("jaxmarl", "jax"),
        "jaxmarl",
    ),
)

for _name, _description, _requires, _extra in _BUILTIN:
    register_adapter(
        _name,
        _lazy(_name, "make_env"),
        description=_description,
        requires=_requires,
        extra=_extra,
        scenarios=_lazy(_name, "list_scenarios"),
        accepted_kwargs=_lazy(_name, "accepted_kwargs"),
    )
