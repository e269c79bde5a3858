"""``make_collector``: one collector kind chosen by name, for configs and scripts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from marlkit._checks import check_int
from marlkit.collectors._base import CollectorBase
from marlkit.collectors._multi import MultiAsyncCollector, MultiSyncCollector
from marlkit.collectors._ray import RayCollector
from marlkit.collectors._single import Collector
from marlkit.envs import EnvBase

__all__ = ["CollectorKind", "make_collector"]

CollectorKind = Literal["single", "multisync", "multiasync", "ray", "ray_async"]


def make_collector(
    kind: CollectorKind,
    env_fn: Callable[[], EnvBase],
    policy: Any,
    frames_per_batch: int,
    total_frames: int = -1,
    *,
    num_workers: int = 2,
    seed: int | None = None,
    **kwargs: Any,
) -> CollectorBase:
    """Build the collector ``kind`` over envs made by ``env_fn``.

    Args:
        kind: ``"single"`` (:class:`Collector`, one env in this process), ``"multisync"`` /
            ``"multiasync"`` (:class:`MultiSyncCollector` / :class:`MultiAsyncCollector`,
            ``num_workers`` processes), ``"ray"`` / ``"ray_async"`` (:class:`RayCollector`
            with ``sync=True`` / ``False``, ``num_workers`` actors).
        env_fn: makes one env (every worker calls it); the process and Ray kinds send it with
            cloudpickle, so a lambda, a closure or a function of a notebook works.
        policy, frames_per_batch, total_frames: as for every collector. ``frames_per_batch`` is
            the size of every yielded batch: for ``"multisync"`` and ``"ray"`` the frames of
            all workers together (each collects ``frames_per_batch / num_workers``), for
            ``"multiasync"`` and ``"ray_async"`` one worker's batch (each batch comes from one
            worker).
        num_workers: processes or actors of the multi-worker kinds (ignored by ``"single"``).
        seed: seed the envs and the policy's random generators
            (:meth:`~CollectorBase.set_seed`; workers get seeds in a chain).
        **kwargs: the collector's other keyword arguments (``max_frames_per_traj``,
            ``init_random_frames``, ``exploration``, ...).

    Raises:
        ValueError: an unknown ``kind`` (the message lists the known ones), ``num_workers < 1``.
    """
    kinds = get_args(CollectorKind)
    if kind not in kinds:
        raise ValueError(f"unknown collector kind {kind!r}; expected one of {list(kinds)}")
    workers = check_int("num_workers", num_workers, low=1)
    collector: CollectorBase
    if kind == "single":
        collector = Collector(env_fn, policy, frames_per_batch, total_frames, **kwargs)
    elif kind in ("multisync", "multiasync"):
        cls = MultiSyncCollector if kind == "multisync" else MultiAsyncCollector
        collector = cls([env_fn] * workers, policy, frames_per_batch, total_frames, **kwargs)
    else:
        collector = RayCollector(
            [env_fn] * workers,
            policy,
            frames_per_batch,
            total_frames,
            sync=kind == "ray",
            **kwargs,
        )
    if seed is not None:
        try:
            collector.set_seed(seed)
        except BaseException:
            collector.shutdown()
            raise
    return collector
