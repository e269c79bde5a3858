"""Native batched scenarios, registered with :func:`marlkit.register` on import.

Physics runs through ``marlkit._C`` on CPU and through the same maths in torch elsewhere.
"""

from __future__ import annotations

from marlkit.envs.registry import register
from marlkit.scenarios.navigation import NavigationEnv
from marlkit.scenarios.predator_prey import PredatorPreyEnv
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
