"""Native batched scenarios, registered with :func:`marlkit.register` on import.

Physics runs through ``marlkit._C`` on CPU and through the same maths in torch elsewhere.
"""

from __future__ import annotations

from marlkit.envs.registry import register, register_adapter
from marlkit.scenarios.navigation import NavigationEnv
from marlkit.scenarios.predator_prey import PredatorPreyEnv
from marlkit.scenarios.smax import accepted_kwargs as smax_accepted_kwargs
from marlkit.scenarios.smax import make_smax, scenario_names
from marlkit.scenarios.swarm import SwarmEnv

__all__ = ["NavigationEnv", "PredatorPreyEnv", "SwarmEnv"]

register(
    "navigation",
    NavigationEnv,
    description="N holonomic agents driving to their own goals (native C++ physics)",
)
register(
    "swarm",
    SwarmEnv,
    description="a flock of up to 10,000 agents seeing their k nearest neighbours (native C++)",
)
register(
    "predator_prey",
    PredatorPreyEnv,
    description="predators hunt faster prey: two groups with different specs (native C++)",
)
register_adapter(
    "smax",
    make_smax,
    description="StarCraft-style micromanagement, JaxMARL's SMAX rules (native C++)",
    scenarios=scenario_names,
    accepted_kwargs=smax_accepted_kwargs,
)
