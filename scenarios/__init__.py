"""Native batched scenarios, registered with :func:`marlkit.register` on import.

Physics runs through ``marlkit._C`` on CPU and through the same maths in torch elsewhere.
"""

from __future__ import annotations

from marlkit.envs.registry import register
from marlkit.scenarios.navigation import NavigationEnv
from marlkit.scenarios.swarm import SwarmEnv

__all__ = ["NavigationEnv", "SwarmEnv"]

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
