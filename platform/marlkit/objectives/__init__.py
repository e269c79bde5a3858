"""Losses and target-network updaters (see DESIGN.md: objectives import modules and data,
never envs)."""

from __future__ import annotations

# --- value-based and off-policy losses (QMIX, VDN, IQL, MADDPG, MASAC) and target networks ---
from marlkit.objectives._common import DiscreteKeys, ValueKeys, ValueLoss
from marlkit.objectives._per_agent import AgentTDKeys, AgentTDLoss
from marlkit.objectives.ddpg import DDPGLoss
from marlkit.objectives.dqn import DQNLoss
from marlkit.objectives.qmixer import QMixerLoss
from marlkit.objectives.sac import SACLoss
from marlkit.objectives.target import HardUpdate, SoftUpdate, TargetNetUpdater

__all__ = [
    # value-based and off-policy losses (QMIX, VDN, IQL, MADDPG, MASAC) and target networks
    "AgentTDKeys",
    "AgentTDLoss",
    "DDPGLoss",
    "DQNLoss",
    "DiscreteKeys",
    "HardUpdate",
    "QMixerLoss",
    "SACLoss",
    "SoftUpdate",
    "TargetNetUpdater",
    "ValueKeys",
    "ValueLoss",
]
