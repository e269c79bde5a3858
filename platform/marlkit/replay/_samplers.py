"""Writers and samplers: where items go, and which come back.

* :class:`RoundRobinWriter`: circular overwrite, the newest items kept.
* :class:`RandomSampler`: uniform, with replacement.
* :class:`SamplerWithoutReplacement`: epochs over the data (PPO minibatches).
* :class:`PrioritizedSampler`: in proportion to priority, on the native sum and min trees, with
  importance weights.
* :class:`SliceSampler`: fixed-length sequences that never cross an episode boundary.

Every sampler draws from its own ``torch.Generator`` (seeded with ``seed``, else from torch's
global generator), saved with its state so that a restored buffer samples what the original
would have.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_real
from marlkit.data.keys import COLLECTOR_MASK, DONE, NEXT, TRAJ_IDS, NestedKey, unravel_key
from marlkit.data.trajectories import id_changes, trajectory_runs
from marlkit.native.segment_tree import (
    MinSegmentTree,
    SegmentTreeBackend,
    SumSegmentTree,
    prioritized_sample,
    prioritized_update,
)
from marlkit.replay._storage import Storage, as_index

__all__ = [
    "PrioritizedSampler",
    "RandomSampler",
    "RoundRobinWriter",
    "Sampler",
    "SamplerWithoutReplacement",
    "SliceSampler",
]

Info = dict[str, torch.Tensor]


def expand_to(value: torch.Tensor, batch_size: torch.Size) -> torch.Tensor:
    """``value`` ``[*lead]`` (one entry per sampled item) over a sample's ``[*lead, *item]``
    (a view: every one of an item's entries holds the item's value)."""
    if value.shape == batch_size:
        return value
    extra = len(batch_size) - value.ndim
    return value.reshape(*value.shape, *([1] * extra)).expand(batch_size)


class RoundRobinWriter:
    """Writes items one after the other, wrapping around: once full, the oldest go first.

    ``extend`` of more than ``capacity`` items keeps the newest ``capacity``. The storage is told
    after each write how many items are valid and where the next write goes (its
    :attr:`~marlkit.replay.Storage.cursor`, which a :class:`~marlkit.replay.MemmapStorage` keeps
    in its files), so that a buffer built on a reopened storage writes on after its newest item.
    """

    def __init__(self) -> None:
        self.cursor = 0

    def resume(self, storage: Storage) -> None:
        """Write on after the items ``storage`` already holds (at its cursor)."""
        self.cursor = storage.cursor

    def extend(self, storage: Storage, data: TensorDictBase) -> torch.Tensor:
        """Write ``data`` (items along dim 0) into ``storage``; returns the slots written."""
        storage.check(data)
        n = data.batch_size[0]
        capacity = storage.capacity
        if n > capacity:  # only the newest fit; the older ones would be overwritten anyway
            self.cursor = (self.cursor + n - capacity) % capacity
            data, n = data[n - capacity :], capacity
        stored = len(storage)
        head = min(n, capacity - self.cursor)  # up to the end; the rest wraps to slot 0
        # (cursor + arange(n)) % capacity, without the modulo (8x the time of the aranges)
        index = torch.arange(self.cursor, self.cursor + head)
        if head < n:
            index = torch.cat([index, torch.arange(n - head)])
        # Each part records the length and cursor as of its own end: a process killed between
        # the two leaves files that say what was written.
        if head:
            part = data[:head] if head < n else data
            storage.set_range(
                self.cursor, part, min(stored + head, capacity), cursor=self.cursor + head
            )
        if head < n:
            storage.set_range(0, data[head:], min(stored + n, capacity), cursor=n - head)
        self.cursor = (self.cursor + n) % capacity
        return index

    def empty(self) -> None:
        self.cursor = 0

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` would raise for ``state``; loads nothing."""
        if "cursor" not in state:
            raise KeyError(f"the writer state has no 'cursor'; entries: {sorted(state)}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.cursor = int(state["cursor"])


class Sampler:
    """Chooses the slots a sample reads. Subclasses implement :meth:`sample`."""

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        self.generator.manual_seed(check_int("seed", seed, low=0))

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, Info]:
        """``(slots, extra entries)`` of a sample of ``batch_size`` from the ``len(storage)``
        valid items."""
        raise NotImplementedError

    def annotate(self, batch: TensorDictBase, info: Info) -> TensorDictBase:
        """Write what :meth:`sample` returned besides the slots into the sampled ``batch``
        (expanded over the items' own batch dims)."""
        for key, value in info.items():
            batch.set(key, expand_to(value, batch.batch_size))
        return batch

    def extend(self, index: torch.Tensor) -> None:
        """Told the slots just written."""

    def empty(self) -> None:
        """Told the storage was emptied."""

    @property
    def ran_out(self) -> bool:
        """True at the end of an epoch (samplers with epochs); False otherwise."""
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` would raise for ``state``; loads nothing."""
        if "generator" not in state:
            raise KeyError(f"the sampler state has no 'generator'; entries: {sorted(state)}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.generator.set_state(state["generator"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Uniform over the stored items, with replacement."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, Info]:
        index = torch.randint(0, len(storage), (batch_size,), generator=self.generator)
        return index, {}


class SamplerWithoutReplacement(Sampler):
    """Every stored item once per epoch, in a random order (``shuffle``) or in storage order.

    An epoch is a permutation of the items stored when it began; samples take consecutive
    chunks of it. The last chunk is shorter unless ``drop_last``, which skips it.
    :attr:`ran_out` says that the epoch ended with the last sample.
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True, seed: int | None = None):
        super().__init__(seed)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._order: torch.Tensor | None = None
        self._position = 0
        self._ran_out = False

    def _new_epoch(self, n: int) -> torch.Tensor:
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        self._order, self._position = order, 0
        return order

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, Info]:
        n = len(storage)
        if self.drop_last and batch_size > n:
            raise ValueError(
                f"drop_last: a sample of {batch_size} cannot come from {n} stored items"
            )
        order = self._order
        left = 0 if order is None else order.numel() - self._position
        if order is None or left == 0 or (self.drop_last and left < batch_size):
            order = self._new_epoch(n)
        index = order[self._position : self._position + batch_size]
        self._position += index.numel()
        left = order.numel() - self._position
        self._ran_out = left == 0 or (self.drop_last and left < batch_size)
        return index, {}

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    def empty(self) -> None:
        self._order, self._position, self._ran_out = None, 0, False

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "order": self._order,
            "position": self._position,
            "ran_out": self._ran_out,
        }

    def check_state(self, state: dict[str, Any]) -> None:
        super().check_state(state)
        for entry in ("order", "position", "ran_out"):
            if entry not in state:
                raise KeyError(f"the sampler state has no {entry!r}; entries: {sorted(state)}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._order = state["order"]
        self._position = int(state["position"])
        self._ran_out = bool(state["ran_out"])


class PrioritizedSampler(Sampler):
    """Samples item ``i`` with probability ``p_i / sum(p)``, ``p_i = (priority_i + eps)^alpha``,
    on the native sum and min segment trees (Schaul et al., 2016).

    New items get the largest priority seen so far (1 at first). Each sample carries
    ``"priority_weight"`` ``[B]``: the importance weights ``(N p_i / sum(p))^-beta`` divided by
    the largest possible one, ``(N min(p) / sum(p))^-beta``, so they lie in ``(0, 1]``.

    Args:
        capacity: the storage's capacity.
        alpha: how much priorities count (0: uniform).
        beta: how much importance weights correct for it (1: fully).
        eps: added to every priority, so that no item has probability 0.
        dtype: the trees' dtype (``torch.float32`` or ``torch.float64``).
        backend: the trees' backend (``"auto"``: the native kernels on CPU, see
            :mod:`marlkit.native.segment_tree`; ``"torch"``: cumsum + searchsorted).
        seed: the sampler's generator seed.

    Raises:
        ValueError: a negative ``alpha`` or ``beta``, an ``eps`` that is not > 0.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        *,
        dtype: torch.dtype = torch.float32,
        backend: SegmentTreeBackend = "auto",
        seed: int | None = None,
    ):
        super().__init__(seed)
        self.capacity = check_int("capacity", capacity, low=1)
        self.backend: SegmentTreeBackend = backend
        # a string ('0.5' from a config) was torch's "must be real number, not str"
        self.alpha = check_real("alpha", alpha, low=0.0, strict=False)
        self.beta = check_real("beta", beta, low=0.0, strict=False)
        self.eps = check_real("eps", eps, low=0.0)
        self.dtype = dtype
        self._new_trees()

    def _new_trees(self) -> None:
        self._sum = SumSegmentTree(self.capacity, dtype=self.dtype, backend=self.backend)
        self._min = MinSegmentTree(self.capacity, dtype=self.dtype, backend=self.backend)
        self._max_priority = 1.0

    def extend(self, index: torch.Tensor) -> None:
        if index.numel():
            index = as_index(index).reshape(-1).contiguous()
            priority = torch.full(index.shape, self._max_priority, dtype=self.dtype)
            prioritized_update(
                self._sum,
                self._min,
                index,
                priority,
                length=self.capacity,
                eps=self.eps,
                alpha=self.alpha,
            )

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, Info]:
        uniforms = torch.rand(batch_size, generator=self.generator, dtype=self.dtype)
        index, weight = prioritized_sample(self._sum, self._min, uniforms, self.beta)
        return index, {"priority_weight": weight}

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor, length: int) -> None:
        """Set the priorities of the slots ``index`` (of the ``length`` stored items).

        ``priority`` is a scalar, one per index, or one per item of a sample's ``"index"``
        ``[B, *item]`` expanded over the items' own batch dims (``[B]``, broadcast over
        them). A priority that requires grad (a TD error) is detached.

        Raises:
            IndexError: an index outside ``[0, length)``.
            ValueError: a negative, NaN or infinite priority, or shapes that do not match.
            Nothing is updated when any of these is raised.
        """
        index = as_index(index)
        if isinstance(priority, torch.Tensor):
            priority = priority.detach()
        priority = torch.as_tensor(priority, dtype=self.dtype)
        if priority.numel() == 1:
            priority = priority.reshape(1).expand(index.numel())
        elif index.ndim > priority.ndim and index.shape[: priority.ndim] == priority.shape:
            priority = expand_to(priority, index.shape)
        index = index.reshape(-1)
        largest = prioritized_update(
            self._sum,
            self._min,
            index.contiguous(),
            priority.reshape(-1).contiguous(),
            length=length,
            eps=self.eps,
            alpha=self.alpha,
        )
        self._max_priority = max(self._max_priority, largest)

    def priorities(self, index: torch.Tensor) -> torch.Tensor:
        """The trees' values ``(priority + eps)^alpha`` at ``index``."""
        return self._sum[as_index(index)]

    def empty(self) -> None:
        self._new_trees()

    def state_dict(self) -> dict[str, Any]:
        every = torch.arange(self.capacity)
        return {
            **super().state_dict(),
            "sum": self._sum[every],
            "min": self._min[every],
            "max_priority": self._max_priority,
        }

    def check_state(self, state: dict[str, Any]) -> None:
        super().check_state(state)
        for entry in ("sum", "min", "max_priority"):
            if entry not in state:
                raise KeyError(f"the sampler state has no {entry!r}; entries: {sorted(state)}")
        if state["sum"].numel() != self.capacity or state["min"].numel() != self.capacity:
            raise ValueError(
                f"the state holds {state['sum'].numel()} priorities; this sampler has capacity "
                f"{self.capacity}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        total, lowest = state["sum"], state["min"]
        super().load_state_dict(state)
        self._new_trees()
        self._sum.update(torch.arange(self.capacity), total.to(self.dtype))
        written = torch.isfinite(lowest).nonzero().reshape(-1)  # unwritten leaves hold +inf
        self._min.update(written, lowest[written].to(self.dtype))
        self._max_priority = float(state["max_priority"])

    def __repr__(self) -> str:
        return (
            f"PrioritizedSampler(capacity={self.capacity}, alpha={self.alpha}, "
            f"beta={self.beta}, eps={self.eps})"
        )


class SliceSampler(Sampler):
    """Sequences of ``slice_len`` consecutive steps of one trajectory: ``[B / slice_len,
    slice_len]``, for recurrent policies.

    Trajectories are runs of equal ``traj_key`` (the collectors' trajectory ids) in storage
    order, or, where the items have none, runs that end at a true ``end_key``; the write cursor
    (where the newest items meet the oldest) and the end of the storage always end one. A
    sequence never crosses a trajectory's end. Each start position of every long enough
    trajectory is equally likely. With ``pad=True`` shorter trajectories are sampled too, padded
    with zeros after their end, and ``mask_key`` ``[B / slice_len, slice_len]`` marks the real
    steps (it is written with or without padding).

    Args:
        slice_len: steps per sequence; the batch size must be a multiple of it.
        traj_key: the trajectory ids. The default, the collectors' ``("collector",
            "traj_ids")``, is used when the items have it (else ``end_key``); another key must
            be in the items (a ``KeyError`` at sampling otherwise: a typo does not fall back
            silently); ``None``: ``end_key`` only.
        end_key: the done flag ``[N, 1]`` that ends a trajectory (used without trajectory ids).
        pad: sample trajectories shorter than ``slice_len`` too, padded.
        mask_key: where the mask of real steps goes.
        seed: the sampler's generator seed.
    """

    def __init__(
        self,
        slice_len: int,
        *,
        traj_key: NestedKey | None = TRAJ_IDS,
        end_key: NestedKey = (NEXT, DONE),
        pad: bool = False,
        mask_key: NestedKey = COLLECTOR_MASK,
        seed: int | None = None,
    ):
        super().__init__(seed)
        self.slice_len = check_int("slice_len", slice_len, low=1)
        #: A key of the caller's own: the items must have it (no fallback to the flags).
        self._traj_key_given = traj_key is not None and unravel_key(traj_key) != TRAJ_IDS
        self.traj_key, self.end_key, self.mask_key = traj_key, end_key, mask_key
        self.pad = bool(pad)
        self._cursor = 0
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def extend(self, index: torch.Tensor) -> None:
        if index.numel():
            self._cursor = int(index[-1]) + 1
        self._cache = None

    def empty(self) -> None:
        self._cursor, self._cache = 0, None

    def _ends(self, storage: Storage) -> torch.Tensor:
        """``[len]`` bool: item ``i`` is the last of its trajectory."""
        data = storage.data
        n = len(storage)
        if data is None:
            raise ValueError("the storage is empty")
        ends = torch.zeros(n, dtype=torch.bool)
        ids = data.get(self.traj_key, None) if self.traj_key is not None else None
        if ids is None and self._traj_key_given:
            raise KeyError(
                f"SliceSampler: the items have no {self.traj_key!r} (traj_key); stored: "
                f"{sorted(map(str, data.keys(True, True)))}"
            )
        if ids is not None:
            ends[:-1] = id_changes(ids[:n].reshape(n, -1)[:, 0].cpu())
        else:
            done = data.get(self.end_key, None)
            if done is None:
                raise KeyError(
                    f"SliceSampler: the items have neither {self.traj_key!r} nor "
                    f"{self.end_key!r} to find their trajectories"
                )
            ends |= done[:n].reshape(n, -1).any(-1).cpu()
        ends[-1] = True
        if 0 < self._cursor < n:
            ends[self._cursor - 1] = True
        return ends

    def _trajectories(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        """``(starts, lengths)`` of every trajectory, cached until the next write."""
        if self._cache is None:
            ends = self._ends(storage)
            starts = torch.ones_like(ends)
            starts[1:] = ends[:-1]  # a trajectory starts after each end
            self._cache = trajectory_runs(starts)
        return self._cache

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, Info]:
        if batch_size % self.slice_len:
            raise ValueError(
                f"batch_size={batch_size} is not a multiple of slice_len={self.slice_len}"
            )
        items = getattr(storage, "item_batch_size", None)
        if items:  # extend([E, T]) stored E whole rollouts: consecutive items are other envs
            raise ValueError(
                f"SliceSampler slices runs of consecutive items, but these items are sequences "
                f"already ({list(items)} each: extend of a [E, T] batch stores E whole "
                "rollouts); extend the steps in time order instead (a collector's batch "
                "reshaped to [-1], with its ('collector', 'traj_ids')), or sample whole items "
                "with RandomSampler"
            )
        starts, lengths = self._trajectories(storage)
        windows = (lengths - self.slice_len + 1).clamp_min(1 if self.pad else 0)
        total = int(windows.sum())
        if total == 0:
            raise ValueError(
                f"SliceSampler: no stored trajectory has {self.slice_len} steps (the longest "
                f"has {int(lengths.max())}); store more, or pass pad=True"
            )
        slices = batch_size // self.slice_len
        # A window uniformly among all: its trajectory, then its offset within it.
        pick = torch.randint(0, total, (slices,), generator=self.generator)
        bounds = windows.cumsum(0)
        traj = torch.searchsorted(bounds, pick, right=True)
        offset = pick - (bounds[traj] - windows[traj])
        steps = torch.arange(self.slice_len)
        real = steps[None, :] < (lengths[traj] - offset)[:, None]
        first = starts[traj] + offset
        last = starts[traj] + lengths[traj] - 1
        index = torch.minimum(first[:, None] + steps[None, :], last[:, None])
        return index, {"mask": real}

    def annotate(self, batch: TensorDictBase, info: Info) -> TensorDictBase:
        real = info["mask"]
        if not bool(real.all()):  # zeros after each short trajectory's end

            def pad(value: torch.Tensor) -> torch.Tensor:
                keep = real.reshape(*real.shape, *([1] * (value.ndim - 2))).to(value.device)
                return torch.where(keep, value, torch.zeros((), dtype=value.dtype))

            padded = batch.apply(pad)
            if padded is not None:
                batch = padded
        batch.set(self.mask_key, expand_to(real, batch.batch_size))
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cursor": self._cursor}

    def check_state(self, state: dict[str, Any]) -> None:
        super().check_state(state)
        if "cursor" not in state:
            raise KeyError(f"the sampler state has no 'cursor'; entries: {sorted(state)}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._cursor, self._cache = int(state["cursor"]), None

    def __repr__(self) -> str:
        return f"SliceSampler(slice_len={self.slice_len}, pad={self.pad})"
