"""What every collector shares: the iterator of batches, frame accounting, progress, and the
checks of its arguments. One module per collector kind builds on it (``_single``, ...)."""

from __future__ import annotations

import abc
import hashlib
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tqdm import tqdm

from marlkit._checks import check_int, check_one_of
from marlkit.data.exploration import EXPLORATION_MODES, Exploration
from marlkit.data.keys import TRAJ_IDS, WORKER
from marlkit.data.trajectories import split_trajectories

__all__ = [
    "CollectorBase",
    "Policy",
    "PostProc",
    "check_env_fns",
    "check_worker_batches",
    "resume_seed",
    "seed_rngs",
    "split_frames",
    "split_workers",
    "tag_worker",
]

#: Reads a root TensorDict and writes actions (and whatever else it computes) into it.
Policy = Callable[[TensorDictBase], TensorDictBase]
#: Applied to every batch before it is yielded.
PostProc = Callable[[TensorDictBase], TensorDictBase]


def split_frames(frames_per_batch: int, env_batch: torch.Size) -> int:
    """Steps per batch ``T = frames_per_batch / numel(env batch)``; refuses a remainder.

    Raises:
        ValueError: ``frames_per_batch`` is not a multiple of the env batch (the message gives
            the two nearest values that are).
    """
    frames = check_int("frames_per_batch", frames_per_batch, low=1)
    per_step = max(1, env_batch.numel())
    if frames % per_step:
        low = max(per_step, frames - frames % per_step)
        raise ValueError(
            f"frames_per_batch={frames} is not a multiple of the {per_step} envs of the batch "
            f"{list(env_batch)}: a batch holds T steps of every env; use {low} or "
            f"{low + per_step}"
        )
    return frames // per_step


def check_env_fns(create_env_fns: object) -> list[Callable[[], Any]]:
    """The env factories of a multi-worker collector (one per worker), as a list.

    Raises:
        TypeError: not a sequence (a single factory, say), or an element that is not callable.
        ValueError: an empty sequence.
    """
    if callable(create_env_fns) or not isinstance(create_env_fns, Sequence):
        raise TypeError(
            "create_env_fns must be a list of env factories (one per worker, e.g. "
            f"[make_env] * 4), got {type(create_env_fns).__name__}"
        )
    fns = list(create_env_fns)
    if not fns:
        raise ValueError("create_env_fns is empty: a collector of workers needs one factory each")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"create_env_fns[{i}] is not callable: {fn!r}")
    return fns


def split_workers(frames_per_batch: int, num_workers: int) -> int:
    """Each worker's share of a synchronous batch of ``frames_per_batch`` frames.

    Raises:
        ValueError: ``frames_per_batch`` is not a multiple of ``num_workers``.
    """
    frames = check_int("frames_per_batch", frames_per_batch, low=1)
    workers = check_int("num_workers", num_workers, low=1)
    if frames % workers:
        low = max(workers, frames - frames % workers)
        raise ValueError(
            f"frames_per_batch={frames} does not split evenly over {workers} workers; use "
            f"{low} or {low + workers}"
        )
    return frames // workers


def split_random_frames(init_random_frames: int, num_workers: int) -> int:
    """Each worker's share of ``init_random_frames``, which counts the frames of all the workers
    together (as ``frames_per_batch`` does), rounded up: a whole first batch of random actions
    stays one batch, not one per worker.

    Raises:
        TypeError, ValueError: ``init_random_frames`` is not an int >= 0.
    """
    frames = check_int("init_random_frames", init_random_frames, low=0)
    return -(-frames // num_workers)


def check_worker_batches(
    batches: list[tuple[int, ...]], frames_per_batch: int, *, stacked: bool, hint: str
) -> None:
    """Refuse workers' env batches that ``frames_per_batch`` (the user's value: over all the
    workers when their batches are ``stacked``, each worker's batch otherwise) does not divide
    into whole steps, or, when ``stacked``, that differ (``hint`` says what to use instead).

    Raises:
        ValueError: naming ``frames_per_batch`` as given, the batch that does not fit, and the
            two nearest values of ``frames_per_batch`` that do.
    """
    frames, workers = frames_per_batch, len(batches)
    if stacked and len(set(batches)) > 1:
        raise ValueError(
            f"the workers' envs have different batch sizes {batches}; a synchronous batch "
            f"stacks one batch of every worker and needs equal ones ({hint})"
        )
    steps = [max(1, math.prod(batch)) for batch in batches]
    if stacked:
        unit = steps[0] * workers
        if frames % unit:
            low = max(unit, frames - frames % unit)
            who = "the worker" if workers == 1 else f"each of the {workers} workers"
            raise ValueError(
                f"frames_per_batch={frames} does not divide into whole steps of the workers' "
                f"envs: {who} collects {frames // workers} frames, not a multiple of the "
                f"{steps[0]} envs of its batch {list(batches[0])}; use {low} or {low + unit} "
                f"(a multiple of {workers} workers x {steps[0]} envs)"
            )
        return
    for w, (batch, per_step) in enumerate(zip(batches, steps, strict=True)):
        if frames % per_step:
            unit = math.lcm(*steps)
            low = max(unit, frames - frames % unit)
            raise ValueError(
                f"frames_per_batch={frames} is not a multiple of the {per_step} envs of worker "
                f"{w}'s batch {list(batch)}: each batch holds T steps of every env of one worker; "
                f"use {low} or {low + unit}"
            )


def tag_worker(batch: TensorDictBase, worker: int, num_workers: int) -> TensorDictBase:
    """Make worker ``worker``'s batch unique among ``num_workers`` workers, in place.

    Its trajectory ids (counted by the worker alone) become ``id * num_workers + worker``, so ids
    stay unique across workers, batches and resets, and ``("collector", "worker")`` ``[*B, T]``
    says which worker collected each step.
    """
    ids = batch.get(TRAJ_IDS)
    batch.set(TRAJ_IDS, ids * num_workers + worker)
    batch.set(WORKER, torch.full_like(ids, worker))
    return batch


def _derived_seed(*parts: object) -> int:
    """A 64-bit seed derived from ``parts`` (a purpose and the numbers it depends on), the same
    in every process and run."""
    text = ":".join(map(str, parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def seed_rngs(seed: int | None) -> None:
    """Seed this process's global generators, the ones a policy draws its exploration from:
    torch's (every device), NumPy's and Python's ``random``.

    With ``seed``, deterministically from a seed derived from it (not ``seed`` itself: an env
    seeds its own torch generator with ``seed``, and the policy's noise would replay the env's
    random actions); with ``None``, from fresh OS entropy (what a worker does when it starts, as
    forked workers would otherwise all draw the parent's numbers).
    """
    if seed is None:
        torch.seed()
        np.random.seed()
        random.seed()
        return
    derived = _derived_seed("marlkit.collectors", seed)
    torch.manual_seed(derived)
    np.random.seed([derived & 0xFFFFFFFF, derived >> 32])
    random.seed(derived)


def resume_seed(seed: int | None, batches: int) -> int:
    """The seed a resumed collector gives its envs: derived from the run's ``seed`` and the
    ``batches`` done (the same resume gives the same episodes, another point of the run other
    ones, none of them the run's first), or drawn from OS entropy when ``seed`` is ``None``.
    In ``[0, 2**31)``, which every simulator takes."""
    if seed is None:
        return random.SystemRandom().randrange(2**31)
    return _derived_seed("marlkit.resume", seed, batches) % 2**31


class CollectorBase(abc.ABC):
    """An iterator of batches of frames, stopping after ``total_frames`` (``-1``: never).

    Subclasses implement :meth:`_collect` (one batch) and :meth:`_shutdown`; the base counts
    frames (real ones: before ``split_trajs`` pads), times each batch (``frames_per_s``), drives
    the progress bar, applies ``split_trajs`` and ``postproc``, and writes each batch into the
    ``replay_buffer`` when there is one (as transitions, ``batch.reshape(-1)``: env after env,
    each env's steps in order; the batch is returned all the same).
    """

    def __init__(
        self,
        *,
        frames_per_batch: int,
        total_frames: int,
        exploration: Exploration,
        postproc: PostProc | None,
        progress: bool,
        split_trajs: bool = False,
        replay_buffer: Any = None,
    ):
        self.frames_per_batch = check_int("frames_per_batch", frames_per_batch, low=1)
        total = check_int("total_frames", total_frames, low=-1)
        if total == 0:
            raise ValueError("total_frames must be -1 (no end) or >= 1, got 0")
        self.total_frames = total
        check_one_of("exploration", exploration, list(EXPLORATION_MODES))
        self.exploration: Exploration = exploration
        if postproc is not None and not callable(postproc):
            raise TypeError(f"postproc must be callable, got {type(postproc).__name__}")
        self.postproc = postproc
        self.split_trajs = bool(split_trajs)
        if replay_buffer is not None:
            if not callable(getattr(replay_buffer, "extend", None)):
                raise TypeError(
                    f"replay_buffer must have an extend method (a ReplayBuffer), got "
                    f"{type(replay_buffer).__name__}"
                )
            if self.split_trajs:
                raise ValueError(
                    "split_trajs pads trajectories; a replay buffer stores transitions: pass "
                    "one or the other"
                )
        #: Where every batch is written (flattened to transitions), when given.
        self.replay_buffer = replay_buffer
        self.progress = bool(progress)
        #: Frames collected so far (every batch yielded, whole).
        self.frames = 0
        #: Batches yielded so far.
        self.batches = 0
        #: Frames per second of the last batch (collection only, ``postproc`` excluded).
        self.frames_per_s = math.nan
        self._bar: Any = None
        self._closed = False

    # ------------------------------------------------------------------ the iterator
    @property
    def num_batches(self) -> int | None:
        """How many batches the iterator yields in all, those yielded so far included
        (``None``: no end). The iterator stops once ``total_frames`` frames are collected, so
        after a :meth:`load_state_dict` with another ``frames_per_batch`` the count is the
        batches so far and those the remaining frames take."""
        if self.total_frames < 0:
            return None
        remaining = max(0, self.total_frames - self.frames)
        return self.batches + -(-remaining // self.frames_per_batch)

    def __iter__(self) -> Iterator[TensorDictBase]:
        while True:
            if 0 <= self.total_frames <= self.frames:
                self._close_bar()
                return
            yield self.next()

    def next(self) -> TensorDictBase:
        """Collect and return one batch (whatever ``total_frames`` says)."""
        self._check_open()
        start = time.perf_counter()
        batch = self._collect()
        seconds = max(time.perf_counter() - start, 1e-9)
        frames = int(batch.numel())
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        if self.replay_buffer is not None:
            self._store(batch)
        # counted once delivered: a batch that postproc or the replay buffer refused is not in
        # frames (nor in a state_dict), as it is in no buffer
        self.frames += frames
        self.batches += 1
        self.frames_per_s = frames / seconds
        self._advance_bar(frames)
        return batch

    def _store(self, batch: TensorDictBase) -> None:
        try:
            self.replay_buffer.extend(batch.reshape(-1))
        except KeyError as err:
            raise KeyError(
                f"{type(self).__name__}: the batch does not fit the replay buffer: {err.args[0]} "
                "(batches of init_random_frames carry no policy outputs: store the keys both "
                "have, e.g. postproc=lambda batch: batch.exclude(...))"
            ) from None

    @abc.abstractmethod
    def _collect(self) -> TensorDictBase:
        """One batch ``[*B, T]`` (split into trajectories afterwards, with ``split_trajs``)."""

    # ------------------------------------------------------------------ the shared interface
    @abc.abstractmethod
    def update_policy_weights_(self, weights: Any = None) -> None:
        """Send the policy's current weights (or ``weights``) to where the envs run."""

    @abc.abstractmethod
    def set_seed(self, seed: int) -> int:
        """Seed the envs (restarting them at the next batch); returns the next unused seed."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Counters (and env states) to resume from with :meth:`load_state_dict`."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next batch starts from a reset."""

    # ------------------------------------------------------------------ progress
    def _advance_bar(self, frames: int) -> None:
        if not self.progress:
            return
        if self._bar is None:
            total = self.total_frames if self.total_frames > 0 else None
            self._bar = tqdm(
                total=total,
                desc=type(self).__name__,
                unit="frame",
                unit_scale=True,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        self._bar.update(frames)
        self._bar.set_postfix(frames_per_s=f"{self.frames_per_s:,.0f}", refresh=False)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ------------------------------------------------------------------ closing
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is shut down; create a new one")

    @abc.abstractmethod
    def _shutdown(self) -> None:
        """Release the envs (and processes) the collector holds."""

    def shutdown(self) -> None:
        """Close the collector and what it holds; it yields nothing afterwards. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_bar()
        self._shutdown()

    @property
    def is_shut_down(self) -> bool:
        return self._closed

    def __enter__(self) -> CollectorBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ state
    def _counters(self) -> dict[str, Any]:
        return {"frames": self.frames, "batches": self.batches}

    def _load_counters(self, state: dict[str, Any]) -> None:
        self.frames, self.batches = self._checked_counters(state)

    @staticmethod
    def _checked_counters(state: dict[str, Any]) -> tuple[int, int]:
        """``(frames, batches)`` of a collector state, checked."""
        for key in ("frames", "batches"):
            if key not in state:
                raise KeyError(f"the collector state has no {key!r}; keys: {sorted(state)}")
        return (
            check_int("frames", state["frames"], low=0),
            check_int("batches", state["batches"], low=0),
        )
