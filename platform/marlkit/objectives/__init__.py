"""Losses and target-network updaters (see DESIGN.md: objectives import modules and data,
never envs)."""

from __future__ import annotations

# --- value decomposition (QMIX / VDN / IQL) and target networks --------------------------------
from marlkit.objectives._common import ValueKeys, ValueLoss
from marlkit.objectives.dqn import DQNLoss
from marlkit.objectives.qmixer import QMixerLoss
from marlkit.objectives.target import HardUpdate, SoftUpdate, TargetNetUpdater

__all__ = [
    # value decomposition (QMIX / VDN / IQL) and target networks
    "DQNLoss",
    "HardUpdate",
    "QMixerLoss",
    "SoftUpdate",
    "TargetNetUpdater",
    "ValueKeys",
    "ValueLoss",
]
