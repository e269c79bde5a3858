"""Policies, critics and mixers as TensorDict modules (see DESIGN.md: modules import only
``marlkit.data``, ``marlkit.native``, ``marlkit._utils``, torch and tensordict)."""

from __future__ import annotations

# --- value decomposition (QMIX / VDN / IQL) ---------------------------------------------------
from marlkit.modules.mixers import Mixer, QMixer, VDNMixer
from marlkit.modules.qvalue import EGreedy, QValueActor

__all__ = [
    # value decomposition (QMIX / VDN / IQL)
    "EGreedy",
    "Mixer",
    "QMixer",
    "QValueActor",
    "VDNMixer",
]
