"""marlkit: TensorDict-first multi-agent reinforcement learning and simulator integration.

Every component reads and writes named keys of one nested ``tensordict.TensorDict`` with one
sub-TensorDict per agent group. Start with ``marlkit.make("navigation", num_envs=32)``.
"""

from __future__ import annotations

from marlkit.envs.registry import list_envs, make, register, register_adapter

__version__ = "0.1.0"

__all__ = ["__version__", "list_envs", "make", "register", "register_adapter"]
