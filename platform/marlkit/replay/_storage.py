"""Storages: where a replay buffer keeps its items, as one TensorDict ``[capacity, *item]``.

* :class:`TensorStorage`: tensors in memory (any device), allocated from the first write.
* :class:`MemmapStorage`: tensordict memory maps in a folder on disk: the capacity may exceed
  RAM, and the items outlive the process (:meth:`MemmapStorage.open` reopens them).

Items go along the first batch dim; their own batch dims (an item ``[T]`` of a rollout, a group
sub-TensorDict ``[n_agents]``) are recorded from the first write, at the root and in every
nested TensorDict, and what :meth:`Storage.get` returns has them again. Nested keys (agent
groups, ``"next"``) are kept as they are. A storage checks every write against the layout of its
first one (keys, feature shapes, dtypes) and refuses a different one before anything is written.
Items are stored as plain data: writes copy under ``torch.no_grad()``, so a storage never holds
an autograd graph.
"""

from __future__ import annotations

import abc
import errno
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int
from marlkit._files import no_space, reserve
from marlkit.data._fast import get_entry, unchecked_tensordict
from marlkit.native.gather import gather_rows
from marlkit.native.memory import zeros
from marlkit.replay._memmap import read_items

__all__ = ["MemmapStorage", "Storage", "TensorStorage"]

#: The file a MemmapStorage keeps next to its memory maps: capacity, items written, cursor.
_META = "storage.json"


def as_index(index: Any, what: str = "index") -> torch.Tensor:
    """``index`` (ints, a list or an integer tensor) as an int64 tensor.

    Raises:
        TypeError: bool or floating-point indices: a bool mask would be read as the positions 0
            and 1, a float truncated (``torch.nonzero(mask)`` gives a mask's positions).
    """
    tensor = torch.as_tensor(index)
    if tensor.dtype == torch.bool or tensor.dtype.is_floating_point or tensor.is_complex():
        raise TypeError(
            f"{what} must hold integer positions, got {tensor.dtype} (for a bool mask pass "
            "mask.nonzero().squeeze(-1))"
        )
    return tensor.to(torch.int64)


def _layout(td: TensorDictBase) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    """Each leaf's per-item shape and dtype (the dims after the first batch dim)."""
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in td.items(True, True)}


def _signature(td: TensorDictBase) -> dict[Any, Any]:
    """The layout of the items and their batch dims: each leaf's per-item shape and dtype, and
    each (sub-)TensorDict's item batch dims (the root's under ``()``)."""
    signature: dict[Any, Any] = {(): ("batch", tuple(td.batch_size[1:]))}
    for key, value in td.items(True):
        if isinstance(value, TensorDictBase):
            signature[key] = ("batch", tuple(value.batch_size[1:]))
        else:
            signature[key] = (tuple(value.shape[1:]), value.dtype)
    return signature


def check_layout(expected: TensorDictBase, data: TensorDictBase, what: str) -> None:
    """Raise a KeyError / ValueError / TypeError naming the first difference between the items
    ``data`` holds and those ``expected`` holds (both with items along dim 0)."""
    want, got = _layout(expected), _layout(data)
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing or extra:
        raise KeyError(
            f"{what}: the items' keys differ from the stored ones: missing {missing}, "
            f"unexpected {extra}"
        )
    for key, (shape, dtype) in want.items():
        other_shape, other_dtype = got[key]
        if other_shape != shape:
            raise ValueError(
                f"{what}: {key!r} has items of shape {list(other_shape)}, the storage holds "
                f"{list(shape)}"
            )
        if other_dtype != dtype:
            raise TypeError(f"{what}: {key!r} has dtype {other_dtype}, the storage holds {dtype}")


def _skeleton(
    like: TensorDictBase,
    capacity: int,
    device: torch.device | None,
    leaf: Callable[[tuple[int, ...], torch.dtype], torch.Tensor],
) -> TensorDict:
    """Slots ``[capacity, *item]`` for the items of ``like``: its structure, with every
    (sub-)TensorDict's item batch dims, and ``leaf(shape, dtype)`` for each leaf."""
    out = TensorDict(batch_size=[capacity, *like.batch_size[1:]], device=device)
    for name, value in like.items():
        if isinstance(value, TensorDictBase):
            out.set(name, _skeleton(value, capacity, device, leaf))
        else:
            out.set(name, leaf((capacity, *value.shape[1:]), value.dtype))
    return out


class _Items:
    """The stored items' structure, read once from the slots: every leaf (its key, its slots,
    where it goes) and every (sub-)TensorDict with its item batch dims, so that :meth:`build`
    puts gathered rows back together as items with no per-key lookup or check."""

    def __init__(self, data: TensorDictBase):
        self.device = data.device
        self.keys: list[Any] = []  # leaf keys, as items(True, True) names them
        self.slots: list[torch.Tensor] = []  # leaf slots [capacity, *feature]
        self.places: list[tuple[int, str, tuple[int, ...]]] = []  # (node, name, feature shape)
        # (parent node, name, item batch dims, entry names) of every (sub-)TensorDict, parents
        # before children; node 0 is the root.
        self.nodes: list[tuple[int, str, tuple[int, ...], tuple[str, ...]]] = []
        self._walk(data, -1, "", ())

    def _walk(self, td: TensorDictBase, parent: int, name: str, prefix: tuple[str, ...]) -> None:
        node = len(self.nodes)
        self.nodes.append((parent, name, tuple(td.batch_size[1:]), tuple(td.keys())))
        for key, value in td.items():
            if isinstance(value, TensorDictBase):
                self._walk(value, node, key, (*prefix, key))
            elif isinstance(value, torch.Tensor):
                self.keys.append((*prefix, key) if prefix else key)
                self.slots.append(value)
                self.places.append((node, key, tuple(value.shape[1:])))
            else:  # storages hold tensors only (Storage.check)
                raise TypeError(f"{(*prefix, key)!r} is a {type(value).__name__}, not a tensor")

    def build(self, rows: list[torch.Tensor], lead: torch.Size) -> TensorDict:
        """The items of ``rows`` (one per leaf, ``[lead.numel(), *feature]``) as a TensorDict
        ``[*lead, *item]``, each sub-TensorDict ``[*lead, *its item batch dims]``."""
        entries: list[dict[str, Any]] = [dict.fromkeys(names) for *_, names in self.nodes]
        reshape = len(lead) != 1
        for (node, name, feature), row in zip(self.places, rows):
            entries[node][name] = row.view((*lead, *feature)) if reshape else row
        for node in range(len(self.nodes) - 1, 0, -1):  # children before their parents
            parent, name, batch, _ = self.nodes[node]
            entries[parent][name] = unchecked_tensordict(
                entries[node], torch.Size((*lead, *batch)), self.device, nested=False
            )
        root_batch = torch.Size((*lead, *self.nodes[0][2]))
        return unchecked_tensordict(entries[0], root_batch, self.device, nested=False)


def _cursor(length: int, capacity: int, recorded: Any, where: str) -> int:
    """The write cursor: the one ``recorded``, else derived from ``length`` (states and files
    written before the cursor was recorded)."""
    if recorded is not None:
        return check_int("cursor", recorded, low=0) % capacity
    if length < capacity:  # never wrapped around: the items are the slots [0, length)
        return length
    warnings.warn(
        f"{where} records no write cursor (saved by an older marlkit) and the storage is full: "
        "the cursor is taken as 0, so the next writes overwrite slots 0, 1, ... (which may not "
        "hold the oldest items), and a SliceSampler without trajectory ids cannot tell where "
        "the newest items meet the oldest",
        stacklevel=3,
    )
    return 0


class Storage(abc.ABC):
    """``capacity`` items in one TensorDict ``[capacity, *item]``, written and read by index.

    ``len(storage)`` counts the items written so far (at most ``capacity``); the writer decides
    where items go and tells the storage how many are valid and where it writes next
    (:attr:`cursor`).
    """

    def __init__(self, capacity: int):
        self.capacity = check_int("capacity", capacity, low=1)
        self._data: TensorDictBase | None = None
        self._items: _Items | None = None
        self._len = 0
        self._cursor = 0

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self._len

    @property
    def data(self) -> TensorDictBase | None:
        """Every slot ``[capacity, *item]`` (those past ``len`` hold zeros), or None before a
        write."""
        return self._data

    @property
    def cursor(self) -> int:
        """The slot the writer writes next, as it told the storage with its last write (kept
        in :meth:`state_dict` and, for a :class:`MemmapStorage`, in its files)."""
        return self._cursor

    @property
    def item_batch_size(self) -> torch.Size | None:
        """The batch dims of one item (``torch.Size([])`` for transitions), or None before a
        write."""
        return None if self._items is None else torch.Size(self._items.nodes[0][2])

    def stored_index(self) -> torch.Tensor:
        """The slots of the ``len`` stored items, oldest first (the newest ends before
        :attr:`cursor`)."""
        return (torch.arange(self._len) + (self._cursor - self._len)) % self.capacity

    def get(self, index: torch.Tensor) -> TensorDictBase:
        """The items at ``index`` (int64 of any shape), copied, as a TensorDict
        ``[*index.shape, *item]`` whose sub-TensorDicts have their own item batch dims too.

        Raises:
            IndexError: an index outside ``[0, len)``.
        """
        items = self._items
        if items is None or self._len == 0:
            raise IndexError("the storage is empty")
        index = as_index(index)
        if index.numel():
            low, high = (int(v) for v in torch.aminmax(index))
            if low < 0 or high >= self._len:
                bad = low if low < 0 else high
                raise IndexError(f"index {bad} is out of range for {self._len} stored items")
        # One kernel call for every leaf, prefetching the random rows (CPU); index_select per
        # leaf elsewhere. Either is a third of the time of TensorDict indexing or less.
        rows = gather_rows(items.slots, index.reshape(-1))
        return items.build(rows, index.shape)

    # ------------------------------------------------------------------ writing
    def check(self, data: TensorDictBase) -> None:
        """Raise if ``data`` (items along dim 0) cannot be written here; writes nothing."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"a storage holds TensorDicts, got {type(data).__name__}")
        if data.batch_dims < 1:
            raise ValueError("items go along the first batch dim; got a TensorDict of batch []")
        for key, value in data.non_tensor_items(include_nested=True):  # not kept by a storage
            raise TypeError(
                f"{key!r} is non-tensor data ({type(value).__name__}), not a tensor: a storage "
                f"keeps tensors only; drop it first (data.exclude({key!r}))"
            )
        if self._data is not None:
            check_layout(self._data, data, "extend")
        else:
            for key, value in data.items(True, True):
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"{key!r} is a {type(value).__name__}, not a tensor")

    def set(
        self, index: torch.Tensor, data: TensorDictBase, length: int, *, cursor: int | None = None
    ) -> None:
        """Write ``data[i]`` at ``index[i]`` (checked by :meth:`check` first), and record that
        ``length`` items are valid (and, when given, that the writer writes next at
        ``cursor``). The values are copied without their autograd history."""
        items = self._slots(data)
        index = as_index(index).reshape(-1)
        if index.numel():
            self._reserve(int(index.max()) + 1)
        with torch.no_grad():
            for key, slots in zip(items.keys, items.slots):
                slots[index.to(slots.device)] = get_entry(data, key).to(slots.device)
        self._record(length, cursor)

    def set_range(
        self, start: int, data: TensorDictBase, length: int, *, cursor: int | None = None
    ) -> None:
        """Write ``data`` at the slots ``start, start + 1, ...`` (a copy, no scatter; checked
        by :meth:`check` first), and record that ``length`` items are valid (and, when given,
        that the writer writes next at ``cursor``). The values are copied without their
        autograd history."""
        stop = start + data.batch_size[0]
        if not 0 <= start <= stop <= self.capacity:
            raise IndexError(f"slots [{start}, {stop}) are not within [0, {self.capacity})")
        items = self._slots(data)
        self._reserve(stop)
        with torch.no_grad():
            for key, slots in zip(items.keys, items.slots):
                slots[start:stop].copy_(get_entry(data, key))
        self._record(length, cursor)

    def _record(self, length: int, cursor: int | None) -> None:
        self._len = length
        if cursor is not None:
            self._cursor = cursor % self.capacity
        self._written()

    def _slots(self, like: TensorDictBase) -> _Items:
        if self._items is None:
            data = self._allocate(like)
            self._data, self._items = data, _Items(data)
        return self._items

    def _set_data(self, data: TensorDictBase | None) -> None:
        self._data = data
        self._items = None if data is None else _Items(data)

    @abc.abstractmethod
    def _allocate(self, like: TensorDictBase) -> TensorDictBase:
        """Zeroed slots ``[capacity, *item]`` with the items of ``like`` (and their batch
        dims)."""

    def _written(self) -> None:  # noqa: B027  # optional hook: most storages need nothing
        """Called after each write."""

    def _reserve(  # noqa: B027  # optional hook
        self, stop: int, slots: list[torch.Tensor] | None = None
    ) -> None:
        """Called before a write to the slots below ``stop`` (of ``slots``, default the
        storage's): make sure it cannot fail half-way (a memory-mapped file's disk space)."""

    def empty(self) -> None:
        """Forget every item (the slots stay allocated)."""
        self._len = self._cursor = 0
        self._written()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "len": self._len,
            "cursor": self._cursor,
            "data": self._data,
        }

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` would raise for ``state``; loads nothing.

        Raises:
            KeyError: an entry missing.
            ValueError: another capacity, or saved items of another number of slots.
        """
        for entry in ("capacity", "len", "data"):
            if entry not in state:
                raise KeyError(f"the storage state has no {entry!r}; entries: {sorted(state)}")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"the state is of a storage of capacity {state['capacity']}, this one holds "
                f"{self.capacity}"
            )
        data = state["data"]
        if data is not None and (data.batch_dims < 1 or data.batch_size[0] != self.capacity):
            raise ValueError(
                f"the saved items are of batch {list(data.batch_size)}, not [{self.capacity}, ...]"
            )
        if not 0 <= int(state["len"]) <= (0 if data is None else self.capacity):
            raise ValueError(f"the state holds {state['len']} items of {self.capacity} slots")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold the items of ``state`` (:meth:`state_dict`'s) instead of these ones. Items of
        other keys, shapes or batch dims replace the stored ones (new slots); a state without
        a cursor (older) gets ``len`` when not full, else 0 with a warning."""
        self.check_state(state)
        data = state["data"]
        self._set_data(None if data is None else self._adopt(data))
        self._len = int(state["len"])
        self._cursor = _cursor(self._len, self.capacity, state.get("cursor"), "the storage state")
        self._written()

    def _adopt(self, data: TensorDictBase) -> TensorDictBase:
        """This storage's slots, holding ``data`` (saved slots ``[capacity, *item]``): these
        slots where they have its layout and batch dims, else new ones."""
        mine = self._data
        if mine is None or _signature(mine) != _signature(data):
            mine = self._allocate(data)
        self._reserve(self.capacity, _Items(mine).slots)  # every slot is written
        with torch.no_grad():
            for key, value in data.items(True, True):
                mine.get(key).copy_(value)
        return mine

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, len={self._len})"


class TensorStorage(Storage):
    """Items in memory, on ``device`` (default: where the first write's tensors are).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> storage = TensorStorage(100)
        >>> storage.set(torch.arange(2), TensorDict({"x": torch.ones(2, 3)}, [2]), length=2)
        >>> storage.data["x"].shape
        torch.Size([100, 3])
    """

    def __init__(self, capacity: int, device: str | torch.device | None = None):
        super().__init__(capacity)
        self.device = None if device is None else torch.device(device)

    def _allocate(self, like: TensorDictBase) -> TensorDictBase:
        return _zeros_like(like, self.capacity, self.device or like.device or torch.device("cpu"))


def _zeros_like(like: TensorDictBase, capacity: int, device: torch.device) -> TensorDictBase:
    """Zeroed slots ``[capacity, *item]`` for the items of ``like``; on the CPU on huge pages
    where Linux offers them (:mod:`marlkit.native.memory`: samples read rows at random)."""

    def leaf(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if device.type == "cpu":
            return zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    return _skeleton(like, capacity, device, leaf)


class MemmapStorage(Storage):
    """Items in memory-mapped files under ``path`` (created if missing), on the CPU.

    The OS pages the files in and out, so ``capacity`` may exceed RAM. The folder holds one file
    per key (under ``data/``, with tensordict's metadata: the items' batch dims included) and
    ``storage.json`` (capacity, items written and the write cursor, rewritten after each write),
    so a later process can reopen the items with :meth:`open`, also after this one was killed:
    every write that returned is in the files (the OS writes them back even when the process
    dies), and a buffer built on the reopened storage writes on after its newest item. Durable,
    consistent checkpoints of a whole buffer (priorities included) are
    :meth:`ReplayBuffer.dumps`'s job.

    Raises:
        FileExistsError: ``path`` already holds a storage (reopen it with :meth:`open`).
    """

    def __init__(self, capacity: int, path: str | os.PathLike[str]):
        super().__init__(capacity)
        self.path = Path(path)
        if (self.path / _META).exists():
            raise FileExistsError(
                f"{self.path} already holds a memmap storage; MemmapStorage.open({str(path)!r}) "
                "reopens it"
            )
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> MemmapStorage:
        """Reopen the storage a (possibly dead) process left under ``path``: its items, their
        batch dims and the write cursor. A ``storage.json`` of an older marlkit has no cursor:
        it is ``len`` when the storage is not full, else 0, with a warning (the boundary between
        the newest and the oldest items is unknown then).

        Raises:
            FileNotFoundError: no storage there.
            ValueError: a ``storage.json`` that does not parse or holds impossible values (a
                length above the capacity, say), or item files that do not load or do not
                hold ``capacity`` slots, or a file the layout does not define (an
                ``other.pickle``: nothing in the folder is ever unpickled); the message names
                the file.
        """
        folder = Path(path)
        meta_file = folder / _META
        if not meta_file.exists():
            raise FileNotFoundError(f"{folder} holds no memmap storage ({_META} is missing)")

        def damaged(why: str) -> ValueError:
            return ValueError(f"memmap storage {folder}: {why}; the storage is damaged")

        try:
            meta = json.loads(meta_file.read_text())
            capacity = check_int("capacity", meta["capacity"], low=1)
            length = check_int("len", meta["len"], low=0)
            if length > capacity:
                raise ValueError(f"len {length} above capacity {capacity}")
            allocated = meta["allocated"]
            if not isinstance(allocated, bool):
                raise ValueError(f"allocated must be true or false, got {allocated!r}")
            cursor = _cursor(length, capacity, meta.get("cursor"), str(meta_file))
        except (ValueError, TypeError, KeyError) as err:  # JSONDecodeError is a ValueError
            what = f"no {err.args[0]!r} entry" if isinstance(err, KeyError) else str(err)
            raise damaged(f"{_META}: {what}") from None
        storage = cls.__new__(cls)
        Storage.__init__(storage, capacity)
        storage.path = folder
        if allocated:
            # Never TensorDict.load_memmap: it unpickles what it finds in the folder.
            data = read_items(folder / "data", f"memmap storage {folder}", writable=True)
            if not data.batch_size or data.batch_size[0] != capacity:
                raise damaged(
                    f"its item files hold {list(data.batch_size)[:1]} slots, {_META} says "
                    f"capacity {capacity}"
                )
            storage._set_data(data)
        elif length:
            raise damaged(f"{_META} says {length} items were written, but none are allocated")
        storage._len = length
        storage._cursor = cursor
        return storage

    def _allocate(self, like: TensorDictBase) -> TensorDictBase:
        # Contentless memory maps: zero-stride placeholders give memmap_like the shapes and
        # dtypes without allocating them, and the new files are sparse and read as zeros, so
        # no RAM (and little disk) is taken before items are written.
        def leaf(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros((), dtype=dtype).expand(shape)

        shapes = _skeleton(like, self.capacity, None, leaf)
        shutil.rmtree(self.path / "data", ignore_errors=True)  # the files of another layout
        self._reserved = 0
        return shapes.memmap_like(self.path / "data")

    def _reserve(self, stop: int, slots: list[torch.Tensor] | None = None) -> None:
        """Allocate the disk space of the slots below ``stop`` in every item file before they
        are written: a write into a memory map beyond what the disk holds is a ``SIGBUS`` that
        kills the process; this makes it an ``OSError`` naming the file, with nothing written.
        (Slots are allocated as they are first written, so a storage larger than the disk
        works until it holds more than the disk.)"""
        reserved = getattr(self, "_reserved", 0)
        if slots is None:
            slots = self._items.slots if self._items is not None else []
        if stop <= reserved:
            return
        for leaf in slots:
            filename = getattr(leaf, "filename", None)
            if filename is None or not leaf.numel():
                continue
            row = leaf.element_size() * math.prod(leaf.shape[1:])
            fd = os.open(filename, os.O_RDWR)
            try:
                reserve(fd, filename, reserved * row, (stop - reserved) * row)
            finally:
                os.close(fd)
        self._reserved = stop

    def _written(self) -> None:
        meta = {
            "capacity": self.capacity,
            "len": self._len,
            "cursor": self._cursor,
            "allocated": self._data is not None,
        }
        text = json.dumps(meta)
        tmp = self.path / f"{_META}.tmp"
        try:
            tmp.write_text(text)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise no_space(tmp, len(text), err) from None
            raise
        os.replace(tmp, self.path / _META)
