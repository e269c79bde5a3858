"""``ReplayBuffer``: a storage, a writer and a sampler, with atomic checkpoints."""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int
from marlkit._files import (
    MANIFEST,
    flock,
    lock_folder,
    verify_manifest,
    write_bytes,
    write_manifest,
)
from marlkit._utils import fsync_dir, fsync_tree, write_text_atomic
from marlkit.replay._memmap import read_items, write_items
from marlkit.replay._samplers import (
    PrioritizedSampler,
    RandomSampler,
    RoundRobinWriter,
    Sampler,
    SamplerWithoutReplacement,
    expand_to,
)
from marlkit.replay._storage import Storage, as_index

__all__ = ["ReplayBuffer"]

#: The entry of a sample holding the slots it read.
INDEX = "index"
_LATEST = "latest"
_PREFIX = "checkpoint-"
_STATE = "state.pt"
#: Held by the process writing checkpoints into a folder (its pid inside).
_LOCK = ".lock"
#: Shared by readers while they read a checkpoint; a writer takes it to remove old ones.
_READERS = ".readers.lock"


class ReplayBuffer:
    """Items written by a writer into a storage, sampled by a sampler.

    Items go along the first batch dim of what :meth:`extend` gets; the other batch dims stay
    part of each item (``batch.reshape(-1)`` stores a collector batch ``[*B, T]`` as
    transitions, env after env; ``extend(batch)`` of a ``[E, T]`` batch stores ``E`` items of
    ``[T]``). Nested keys (agent groups, ``"next"``) are kept as they are, with their own batch
    dims: a sample of ``B`` items is ``[B, *item]``, its group ``[B, *item, n_agents]``. Items
    are stored as plain data, without the autograd history of what was written.

    A buffer built on a storage that already holds items (a reopened :class:`MemmapStorage`)
    writes on at the storage's cursor, and its sampler takes the stored items as new ones
    (a :class:`PrioritizedSampler` gives them its largest priority so far: 1 when new).

    Args:
        storage: a :class:`TensorStorage` or :class:`MemmapStorage`.
        sampler: :class:`RandomSampler` (default), :class:`SamplerWithoutReplacement`,
            :class:`PrioritizedSampler` or :class:`SliceSampler`.
        writer: :class:`RoundRobinWriter` (default).
        batch_size: the default size of :meth:`sample` (and of iteration).
        transform: applied to every sample (a callable on TensorDicts).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.replay import ReplayBuffer, TensorStorage
        >>> rb = ReplayBuffer(TensorStorage(1000), batch_size=32)
        >>> rb.extend(TensorDict({"obs": torch.randn(100, 4)}, [100])).shape
        torch.Size([100])
        >>> len(rb), rb.sample().batch_size
        (100, torch.Size([32]))
    """

    def __init__(
        self,
        storage: Storage,
        sampler: Sampler | None = None,
        writer: RoundRobinWriter | None = None,
        batch_size: int | None = None,
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
    ):
        if not isinstance(storage, Storage):
            raise TypeError(f"storage must be a Storage, got {type(storage).__name__}")
        self.storage = storage
        self.sampler = sampler if sampler is not None else RandomSampler()
        if not isinstance(self.sampler, Sampler):
            raise TypeError(f"sampler must be a Sampler, got {type(self.sampler).__name__}")
        capacity = getattr(self.sampler, "capacity", storage.capacity)
        if capacity != storage.capacity:
            raise ValueError(f"the sampler has capacity {capacity}, the storage {storage.capacity}")
        self.writer = writer if writer is not None else RoundRobinWriter()
        self.batch_size = check_int("batch_size", batch_size, low=1, allow_none=True)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.transform = transform
        if len(storage):  # a reopened storage: write on after its items, sample them
            self.writer.resume(storage)
            self.sampler.extend(storage.stored_index())

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Store the items of ``data`` (along its first batch dim); returns their slots.

        Raises:
            TypeError, KeyError, ValueError: ``data`` is not a TensorDict with a batch dim, or
                its keys, item shapes or dtypes differ from the stored ones (nothing is
                written).
        """
        index = self.writer.extend(self.storage, data)
        self.sampler.extend(index)
        return index

    def add(self, item: TensorDictBase) -> int:
        """Store one item (a TensorDict whose batch is one item's); returns its slot."""
        if not isinstance(item, TensorDictBase):
            raise TypeError(f"add() takes a TensorDict, got {type(item).__name__}")
        return int(self.extend(item.unsqueeze(0))[0])

    def empty(self) -> None:
        """Forget every item (and the priorities)."""
        self.storage.empty()
        self.writer.empty()
        self.sampler.empty()

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.storage)

    def __getitem__(self, index: int | slice | torch.Tensor) -> TensorDictBase:
        """The stored items at ``index``: an int (one item, ``[*item]``), a slice or integer
        positions (``[*index.shape, *item]``). Positions are slots, ``0 <= i < len(self)``;
        negative ones count from ``len(self)`` as in a Python sequence (``rb[-1]`` is the last
        slot: once the storage wrapped around, not the newest item).

        Raises:
            IndexError: a position outside ``[-len, len)``.
            TypeError: a bool mask or float positions.
        """
        if isinstance(index, slice):
            slots = range(len(self))[index]  # Python's slice rules: negative steps too
            if not slots:
                return self.storage.get(torch.empty(0, dtype=torch.int64))
            return self.storage.get(torch.arange(slots.start, slots.stop, slots.step))
        positions = as_index(index)
        if positions.numel() and bool((positions < 0).any()):
            low = int(positions.min())
            if low < -len(self):
                raise IndexError(f"index {low} is out of range for {len(self)} stored items")
            positions = torch.where(positions < 0, positions + len(self), positions)
        return self.storage.get(positions)

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """A sample of ``batch_size`` items (default: the buffer's), with ``"index"`` (their
        slots) and whatever the sampler adds (``"priority_weight"``, a mask).

        Raises:
            RuntimeError: the buffer is empty.
            ValueError: no batch size, here or at construction.
        """
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise ValueError("sample() needs a batch_size (here or in the constructor)")
        size = check_int("batch_size", size, low=1)
        if len(self) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; extend it first")
        index, info = self.sampler.sample(self.storage, size)
        batch = self.sampler.annotate(self.storage.get(index), info)
        batch.set(INDEX, expand_to(index, batch.batch_size))
        if self.transform is not None:
            batch = self.transform(batch)
        return batch

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Samples of ``batch_size``: with a sampler that has epochs, up to the end of the
        current epoch (a whole one when none is under way; after ``sample()`` calls began one,
        its rest), else ``len(self) // batch_size`` samples."""
        if self.batch_size is None:
            raise ValueError("iterating a replay buffer needs the batch_size of its constructor")
        if len(self) == 0:
            return
        if isinstance(self.sampler, SamplerWithoutReplacement):
            while True:
                yield self.sample()
                if self.sampler.ran_out:
                    return
        for _ in range(max(1, len(self) // self.batch_size)):
            yield self.sample()

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor | float) -> None:
        """Set the priorities of the slots ``index`` (e.g. a sample's ``"index"``) to
        ``priority`` (``[len(index)]`` or a scalar; for items with their own batch dims, one
        per item ``[B]`` against the sample's ``"index"`` ``[B, *item]``). A priority that
        requires grad (a TD error) is detached.

        Raises:
            TypeError: the sampler is not prioritized.
            IndexError, ValueError: as :meth:`PrioritizedSampler.update_priority`; nothing is
                updated.
        """
        if not isinstance(self.sampler, PrioritizedSampler):
            raise TypeError(
                f"update_priority needs a PrioritizedSampler; this buffer samples with "
                f"{self.sampler!r}"
            )
        self.sampler.update_priority(torch.as_tensor(index), torch.as_tensor(priority), len(self))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Storage (items included), writer and sampler (priorities and RNG state included)."""
        return {
            "storage": self.storage.state_dict(),
            "writer": self.writer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "types": self._types(),
        }

    def _types(self) -> dict[str, str]:
        return {
            "storage": type(self.storage).__name__,
            "writer": type(self.writer).__name__,
            "sampler": type(self.sampler).__name__,
        }

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` would raise for ``state``; loads nothing.

        Raises:
            KeyError: a part or an entry missing.
            TypeError: a state saved from a buffer with another kind of storage, writer or
                sampler (states saved before the kinds were recorded are not checked).
            ValueError: a storage or sampler of another capacity.
        """
        for part in ("storage", "writer", "sampler"):
            if part not in state:
                raise KeyError(f"the replay buffer state has no {part!r}; keys: {sorted(state)}")
        saved, mine = state.get("types"), self._types()
        if saved is not None and saved != mine:
            differ = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
            raise TypeError(
                "the replay buffer state was saved from a buffer with another "
                + ", ".join(
                    f"{k} ({was}, this buffer has {now})" for k, (was, now) in differ.items()
                )
                + "; build the buffer as it was saved"
            )
        self.storage.check_state(state["storage"])
        self.writer.check_state(state["writer"])
        self.sampler.check_state(state["sampler"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. Stored items of other keys, shapes or batch dims
        are replaced by the state's.

        Raises:
            KeyError, TypeError, ValueError: as :meth:`check_state_dict`, before anything is
                loaded (a buffer is never left half-loaded).
        """
        self.check_state_dict(state)
        # States saved before the storage recorded the cursor: the writer's.
        storage = {"cursor": state["writer"]["cursor"], **state["storage"]}
        self.storage.load_state_dict(storage)
        self.writer.load_state_dict(state["writer"])
        self.sampler.load_state_dict(state["sampler"])

    def dumps(self, path: str | os.PathLike[str]) -> Path:
        """Write a checkpoint of the whole buffer under the folder ``path``, atomically.

        The checkpoint is written into a temporary folder (each file's space reserved before it
        is written, its XXH3 checksum in ``manifest.json``), flushed to the disk (fsync),
        renamed to ``checkpoint-<n>``, and only then named by ``path/latest`` (replaced
        atomically); older checkpoints are removed afterwards. A process killed at any moment
        leaves ``latest`` naming a complete checkpoint: the last one whose ``dumps`` returned,
        or the one being written if it got as far as renaming ``latest``. One process writes
        into ``path`` at a time (it holds ``path/.lock``). Returns the checkpoint's folder.

        Raises:
            FolderInUse: another process is writing a checkpoint into ``path``.
            OSError: the disk is full (ENOSPC, naming the file and the bytes it needed) or
                another write failure; the temporary folder is removed and the checkpoints
                already there are untouched.
        """
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        lock = lock_folder(
            root,
            _LOCK,
            what="process writing replay buffer checkpoints",
            advice="two writers in one folder would overwrite each other's checkpoints; give "
            "each buffer its own folder",
        )
        try:
            final = self._write_checkpoint(root)
            with flock(root / _READERS, shared=False):  # readers of the old ones are done
                for old in (*root.glob(f"{_PREFIX}*"), *root.glob(".tmp-*")):
                    if old != final:
                        shutil.rmtree(old, ignore_errors=True)
        finally:
            if lock is not None:
                lock.close()
        return final

    def _write_checkpoint(self, root: Path) -> Path:
        numbers = [int(p.name[len(_PREFIX) :]) for p in root.glob(f"{_PREFIX}*") if _named(p.name)]
        number = max(numbers, default=-1) + 1
        tmp = root / f".tmp-{number}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            state = self.state_dict()
            data = state["storage"].pop("data")
            files: dict[str, tuple[int, str]] = {}
            if data is not None:
                items = write_items(data, tmp / "items")
                files.update((f"items/{name}", entry) for name, entry in items.items())
            blob = io.BytesIO()
            torch.save(state, blob)
            view = blob.getbuffer()
            files[_STATE] = (len(view), write_bytes(tmp / _STATE, [view], len(view)))
            del view
            write_manifest(tmp, files)
            fsync_tree(tmp)
            final = root / f"{_PREFIX}{number:06d}"
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
        write_text_atomic(root / _LATEST, final.name)
        return final

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore the checkpoint ``path/latest`` names (see :meth:`dumps`), after checking every
        file against its checksum.

        Raises:
            FileNotFoundError: no checkpoint under ``path``.
            ValueError: a damaged or crafted checkpoint (see :func:`read_checkpoint`); the
                buffer is left as it was.
        """
        state = read_checkpoint(path)
        try:
            self.check_state_dict(state)
        except (KeyError, ValueError, TypeError) as err:  # a state that does not fit this buffer
            message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
            raise type(err)(f"replay buffer checkpoint {Path(path)}: {message}") from None
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(storage={self.storage!r}, sampler={self.sampler!r}, "
            f"batch_size={self.batch_size})"
        )


def _named(name: str) -> bool:
    return re.fullmatch(rf"{_PREFIX}\d{{6,}}", name) is not None


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state of the checkpoint ``path/latest`` names (see :meth:`ReplayBuffer.dumps`), its
    items memory-mapped (with their batch dims; a checkpoint written before they were kept holds
    items ``[capacity]``, which load as such), after checking every file against
    ``manifest.json``. Nothing is unpickled: ``state.pt`` loads with ``weights_only=True``
    (onto the CPU, so a CUDA run's checkpoint loads on a machine without CUDA), and the items
    through :func:`marlkit.replay._memmap.read_items`.

    A checkpoint written before marlkit kept checksums (no ``manifest.json``) loads with a
    warning after its files' sizes are checked.

    Raises:
        FileNotFoundError: no checkpoint under ``path``.
        ValueError: a damaged or crafted checkpoint, naming it and the file: a ``latest`` that
            names no checkpoint of this folder, a file that is missing, unexpected (not part of
            the format: an ``other.pickle``, say), a link, or of another size or checksum, a
            ``meta.json`` that declares anything but tensors, a ``state.pt`` that does not load.
    """
    root = Path(path)
    pointer = root / _LATEST
    if not pointer.exists():
        raise FileNotFoundError(f"{root} holds no replay buffer checkpoint ({_LATEST} missing)")
    what = "replay buffer checkpoint"
    # Shared before `latest` is read: dumps removes no checkpoint while a reader holds it, so
    # the one `latest` names now is there until the read ends.
    with flock(root / _READERS, shared=True):
        name = pointer.read_text(errors="replace").strip()
        if not _named(name):
            raise ValueError(
                f"replay buffer checkpoint folder {root}: {_LATEST} names {name[:80]!r}, not a "
                f"{_PREFIX}<n> folder of its own; nothing was loaded"
            )
        folder = root / name
        if not folder.is_dir():
            raise ValueError(
                f"{what} {folder}: named by {pointer}, but missing; nothing was loaded"
            )
        if (folder / MANIFEST).exists():
            verify_manifest(folder, what)
        else:
            _check_unverified(folder, what)
        try:
            # onto the CPU: a CUDA run's state (a sampler's tensors) loads on any machine, and
            # load_state_dict puts each part where this buffer keeps it
            state: dict[str, Any] = torch.load(
                folder / _STATE, weights_only=True, map_location="cpu"
            )
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(
                f"{what} {folder}: {_STATE} does not load ({first}); the checkpoint is damaged"
            ) from None
        if not isinstance(state, dict) or not isinstance(state.get("storage"), dict):
            raise ValueError(f"{what} {folder}: {_STATE} holds no replay buffer state")
        expected = state.pop("item_files", None)  # checkpoints written before the manifest
        if expected is not None:
            _check_sizes(folder / "items", expected, f"{what} {folder}")
        items = folder / "items"
        state["storage"]["data"] = (
            read_items(items, f"{what} {folder}", writable=False) if items.exists() else None
        )
    return state


def _check_unverified(folder: Path, what: str) -> None:
    """A checkpoint written before checksums: it holds ``state.pt`` and ``items/`` only."""
    extra = sorted(set(os.listdir(folder)) - {_STATE, "items"})
    if extra:
        raise ValueError(
            f"{what} {folder}: {extra[0]} is not part of the format; nothing was loaded"
        )
    warnings.warn(
        f"{what} {folder} was written before marlkit kept checksums ({MANIFEST} missing): only "
        "its files' sizes are checked; save it again (dumps) to checksum it",
        stacklevel=3,
    )


def _check_sizes(items: Path, expected: Any, what: str) -> None:
    found = _item_files(items) if items.exists() else {}
    if not isinstance(expected, dict):
        raise ValueError(f"{what}: {_STATE} records item files as {type(expected).__name__}")
    damaged = [
        f"{name} ({'missing' if name not in found else f'{found[name]} bytes'}, expected {size})"
        for name, size in sorted(expected.items())
        if found.get(name) != size
    ]
    if damaged:
        raise ValueError(f"{what} is damaged: item files {damaged}; the buffer was left as it was")


def _item_files(items: Path) -> dict[str, int]:
    """The memory-mapped item files under ``items``: relative path -> size in bytes."""
    return {str(f.relative_to(items)): f.stat().st_size for f in sorted(items.rglob("*.memmap"))}
