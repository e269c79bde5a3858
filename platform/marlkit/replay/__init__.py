"""Replay buffers: storages, writers, samplers, and checkpoints that survive a killed process.

* :class:`ReplayBuffer`: ``extend``, ``sample``, ``update_priority``, ``dumps`` / ``loads``.
* Storages: :class:`TensorStorage` (memory), :class:`MemmapStorage` (memory maps on disk).
* :class:`RoundRobinWriter`: circular overwrite.
* :class:`GroupReplayBuffers`: one buffer per agent group.
* :class:`FolderInUse`: another process writes checkpoints into the folder (``dumps``).
* Samplers: :class:`RandomSampler`, :class:`SamplerWithoutReplacement`,
  :class:`PrioritizedSampler` (native segment trees), :class:`SliceSampler` (sequences).

See ``docs/replay.md``.
"""

from __future__ import annotations

from marlkit._files import FolderInUse
from marlkit.replay._buffer import ReplayBuffer
from marlkit.replay._groups import GroupReplayBuffers
from marlkit.replay._samplers import (
    PrioritizedSampler,
    RandomSampler,
    RoundRobinWriter,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
)
from marlkit.replay._storage import MemmapStorage, Storage, TensorStorage

__all__ = [
    "FolderInUse",
    "GroupReplayBuffers",
    "MemmapStorage",
    "PrioritizedSampler",
    "RandomSampler",
    "ReplayBuffer",
    "RoundRobinWriter",
    "Sampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "Storage",
    "TensorStorage",
]
