"""Collectors: batches of frames from envs, for training loops.

* :class:`Collector`: one env (of any batch) in this process.
* :class:`MultiSyncCollector`: one Collector per worker process, their batches stacked.
* :class:`MultiAsyncCollector`: one Collector per worker process, each batch yielded as it comes.
* :class:`RayCollector`: one remote Collector per env factory on Ray actors (``marlkit[ray]``).

Every collector is an iterator of TensorDicts ``[*B, T]`` with ``("collector", "traj_ids")``,
runs its policy under an exploration mode (:mod:`marlkit.data.exploration`), counts its frames
and can be shut down (also as a context manager). :func:`make_collector` picks one by name.
"""

from __future__ import annotations

from marlkit.collectors._base import CollectorBase, split_frames
from marlkit.collectors._factory import CollectorKind, make_collector
from marlkit.collectors._multi import MultiAsyncCollector, MultiSyncCollector
from marlkit.collectors._ray import RayCollector
from marlkit.collectors._single import Collector
from marlkit.data.trajectories import split_trajectories

__all__ = [
    "Collector",
    "CollectorBase",
    "CollectorKind",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "RayCollector",
    "make_collector",
    "split_frames",
    "split_trajectories",
]
