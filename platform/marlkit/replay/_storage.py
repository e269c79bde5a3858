"""Storages: where a replay buffer keeps its items, as one TensorDict of batch ``[capacity]``.

* :class:`TensorStorage`: tensors in memory (any device), allocated from the first write.
* :class:`MemmapStorage`: tensordict memory maps in a folder on disk: the capacity may exceed
  RAM, and the items outlive the process (:meth:`MemmapStorage.open` reopens them).

Both keep nested keys (agent groups, ``"next"``) as they are. A storage checks every write
against the layout of its first one (keys, feature shapes, dtypes) and refuses a different one
before anything is written.
"""

from __future__ import annotations

import abc
import json
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._utils import check_int
from marlkit.native.gather import gather_rows
from marlkit.native.memory import zeros

__all__ = ["MemmapStorage", "Storage", "TensorStorage"]

#: The file a MemmapStorage keeps next to its memory maps: capacity and items written.
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


class Storage(abc.ABC):
    """``capacity`` items in one TensorDict ``[capacity]``, written and read by index.

    ``len(storage)`` counts the items written so far (at most ``capacity``); the writer decides
    where items go and tells the storage how many are valid.
    """

    def __init__(self, capacity: int):
        self.capacity = check_int("capacity", capacity, low=1)
        self._data: TensorDictBase | None = None
        self._len = 0

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self._len

    @property
    def data(self) -> TensorDictBase | None:
        """Every slot ``[capacity]`` (those past ``len`` hold zeros), or None before a write."""
        return self._data

    def get(self, index: torch.Tensor) -> TensorDictBase:
        """The items at ``index`` (int64 of any shape: the result has its shape), copied.

        Raises:
            IndexError: an index outside ``[0, len)``.
        """
        data = self._data
        if data is None or self._len == 0:
            raise IndexError("the storage is empty")
        index = as_index(index)
        if index.numel():
            low, high = (int(v) for v in torch.aminmax(index))
            if low < 0 or high >= self._len:
                bad = low if low < 0 else high
                raise IndexError(f"index {bad} is out of range for {self._len} stored items")
        flat = index.reshape(-1)
        # One kernel call for every leaf, prefetching the random rows (CPU); index_select per
        # leaf elsewhere. Either is a third of the time of TensorDict indexing or less.
        keys = list(data.keys(True, True))
        rows = gather_rows([data.get(key) for key in keys], flat)
        out = TensorDict(dict(zip(keys, rows)), batch_size=[flat.numel()], device=data.device)
        return out.reshape(*index.shape) if index.ndim != 1 else out

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

    def set(self, index: torch.Tensor, data: TensorDictBase, length: int) -> None:
        """Write ``data[i]`` at ``index[i]`` (checked by :meth:`check` first), and record that
        ``length`` items are valid."""
        slots = self._slots(data)
        slots[index.to(slots.device)] = data.to(slots.device)
        self._len = length
        self._written()

    def set_range(self, start: int, data: TensorDictBase, length: int) -> None:
        """Write ``data`` at the slots ``start, start + 1, ...`` (a copy, no scatter; checked
        by :meth:`check` first), and record that ``length`` items are valid."""
        slots = self._slots(data)
        stop = start + data.batch_size[0]
        if not 0 <= start <= stop <= self.capacity:
            raise IndexError(f"slots [{start}, {stop}) are not within [0, {self.capacity})")
        slots[start:stop].update_(data.to(slots.device))
        self._len = length
        self._written()

    def _slots(self, like: TensorDictBase) -> TensorDictBase:
        if self._data is None:
            self._data = self._allocate(like)
        return self._data

    @abc.abstractmethod
    def _allocate(self, like: TensorDictBase) -> TensorDictBase:
        """Zeroed slots ``[capacity]`` with the items of ``like``."""

    def _written(self) -> None:  # noqa: B027  # optional hook: most storages need nothing
        """Called after each write."""

    def empty(self) -> None:
        """Forget every item (the slots stay allocated)."""
        self._len = 0
        self._written()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "len": self._len, "data": self._data}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"the state is of a storage of capacity {state['capacity']}, this one holds "
                f"{self.capacity}"
            )
        data = state["data"]
        self._data = None if data is None else self._adopt(data)
        self._len = int(state["len"])
        self._written()

    def _adopt(self, data: TensorDictBase) -> TensorDictBase:
        """This storage's slots, holding ``data`` (a saved ``[capacity]`` TensorDict)."""
        if data.batch_size != (self.capacity,):
            raise ValueError(
                f"the saved items are of batch {list(data.batch_size)}, not [{self.capacity}]"
            )
        mine = self._data
        if mine is None:
            mine = self._allocate(data)
        else:
            check_layout(mine, data, "load_state_dict")
        mine.update_(data)
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
    """Zeroed slots ``[capacity]`` for the leaves of ``like``; on the CPU on huge pages where
    Linux offers them (:mod:`marlkit.native.memory`: samples read rows at random)."""
    out = TensorDict(batch_size=[capacity], device=device)
    for key, value in like.items(True, True):
        shape = (capacity, *value.shape[1:])
        if device.type == "cpu":
            out.set(key, zeros(shape, value.dtype))
        else:
            out.set(key, torch.zeros(shape, dtype=value.dtype, device=device))
    return out


class MemmapStorage(Storage):
    """Items in memory-mapped files under ``path`` (created if missing), on the CPU.

    The OS pages the files in and out, so ``capacity`` may exceed RAM. The folder holds one file
    per key and ``storage.json`` (capacity and items written, rewritten after each write), so a
    later process can reopen the items with :meth:`open`, also after this one was killed: every
    write that returned is in the files (the OS writes them back even when the process dies).
    Durable, consistent checkpoints of a whole buffer are :meth:`ReplayBuffer.dumps`'s job.

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
        """Reopen the storage a (possibly dead) process left under ``path``.

        Raises:
            FileNotFoundError: no storage there.
        """
        folder = Path(path)
        meta_file = folder / _META
        if not meta_file.exists():
            raise FileNotFoundError(f"{folder} holds no memmap storage ({_META} is missing)")
        meta = json.loads(meta_file.read_text())
        storage = cls.__new__(cls)
        Storage.__init__(storage, int(meta["capacity"]))
        storage.path = folder
        if meta["allocated"]:
            storage._data = TensorDict.load_memmap(folder / "data")
        storage._len = int(meta["len"])
        return storage

    def _allocate(self, like: TensorDictBase) -> TensorDictBase:
        # Contentless memory maps: zero-stride placeholders give memmap_like the shapes and
        # dtypes without allocating them, and the new files are sparse and read as zeros, so
        # no RAM (and little disk) is taken before items are written.
        shapes = TensorDict(batch_size=[self.capacity])
        for key, value in like.items(True, True):
            placeholder = torch.zeros((), dtype=value.dtype)
            shapes.set(key, placeholder.expand(self.capacity, *value.shape[1:]))
        return shapes.memmap_like(self.path / "data")

    def _written(self) -> None:
        meta = {"capacity": self.capacity, "len": self._len, "allocated": self._data is not None}
        tmp = self.path / f"{_META}.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.path / _META)
