"""Training checkpoints that survive a killed process, and the RNG states that go in them.

A training run saves, every few iterations, everything it needs to go on: the modules' and
optimisers' ``state_dict``s, the collector's state, the iteration counters, the RNG states
(:func:`rng_state`) and its replay buffers (each through its own ``dumps``).
:class:`Checkpointer` writes all of it into a temporary folder, flushes it to the disk, renames
it to ``step-<n>`` and only then points ``latest`` at it, so a process killed at any moment
leaves ``latest`` naming a complete checkpoint. Each ``state.pt`` is listed with its size and
XXH3 checksum in the checkpoint's ``manifest.json`` and checked before it loads (each replay
buffer checks its own files the same way). Loading goes through
``torch.load(..., weights_only=True)``: a checkpoint holds tensors, numbers, strings and the
containers of them, never pickled objects.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from marlkit._checks import check_int
from marlkit._files import MANIFEST, verify_manifest, write_bytes, write_manifest
from marlkit._utils import fsync_dir, fsync_tree, write_text_atomic

__all__ = ["Checkpointer", "rng_state", "set_rng_state"]

_LATEST = "latest"
_PREFIX = "step-"
_STATE = "state.pt"
_REPLAY = "replay"


class _Dumpable(Protocol):
    def dumps(self, path: str | os.PathLike[str]) -> Any: ...

    def loads(self, path: str | os.PathLike[str]) -> Any: ...


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and, when initialised, CUDA), NumPy and ``random``,
    as tensors and plain containers (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "random": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned.

    Raises:
        KeyError: ``state`` lacks one of ``"torch"``, ``"numpy"``, ``"random"``.
    """
    missing = [k for k in ("torch", "numpy", "random") if k not in state]
    if missing:
        raise KeyError(f"the RNG state has no {missing[0]!r}; keys: {sorted(state)}")
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    r = state["random"]
    random.setstate((r["version"], tuple(r["internal"]), r["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """Numbered checkpoints under one folder, written atomically, the newest ``keep`` kept.

    Layout: ``directory/step-<n>/state.pt`` (the state), ``directory/step-<n>/replay/<name>/``
    (each buffer's own :meth:`~marlkit.replay.ReplayBuffer.dumps`), and ``directory/latest``, a
    text file naming the newest complete checkpoint.

    Args:
        directory: where the checkpoints go (created when missing).
        keep: how many checkpoints to keep (older ones are removed after a save).

    Examples:
        >>> import tempfile, torch
        >>> from marlkit.record import Checkpointer
        >>> ckpt = Checkpointer(tempfile.mkdtemp())
        >>> net = torch.nn.Linear(2, 1)
        >>> path = ckpt.save(3, {"net": net.state_dict(), "iteration": 3})
        >>> ckpt.load()["iteration"]
        3
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 2):
        self.directory = Path(directory)
        self.keep = check_int("keep", keep, low=1)

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        buffers: Mapping[str, _Dumpable] | None = None,
    ) -> Path:
        """Write checkpoint ``step``: ``state`` through ``torch.save`` and each buffer through
        its ``dumps``; returns its folder. A checkpoint of the same step left by a killed run is
        replaced.

        Raises:
            TypeError: ``state`` is not a mapping, or a buffer has no ``dumps``.
            OSError: the disk is full (ENOSPC, naming the file and the bytes it needed) or
                another write failure; nothing of this checkpoint is left, and ``latest`` still
                names the one before.
        """
        step = check_int("step", step, low=0)
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping, got {type(state).__name__}")
        for name, buffer in (buffers or {}).items():
            if not callable(getattr(buffer, "dumps", None)):
                raise TypeError(f"buffer {name!r} ({type(buffer).__name__}) has no dumps()")
        root = self.directory
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{step}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            blob = io.BytesIO()
            torch.save(dict(state), blob)
            view = blob.getbuffer()
            files = {_STATE: (len(view), write_bytes(tmp / _STATE, [view], len(view)))}
            del view, blob
            for name, buffer in (buffers or {}).items():
                buffer.dumps(tmp / _REPLAY / name)
            write_manifest(tmp, files)
            fsync_tree(tmp)
            final = root / f"{_PREFIX}{step:08d}"
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
        write_text_atomic(root / _LATEST, final.name)
        self._prune(final)
        return final

    def _prune(self, newest: Path) -> None:
        done = sorted(self.directory.glob(f"{_PREFIX}*"))
        # Checkpoints numbered past the newest come from a run that was killed and resumed
        # from an earlier one: they describe a future that did not happen.
        for stale in (p for p in done if p.name > newest.name):
            shutil.rmtree(stale, ignore_errors=True)
        kept = [p for p in done if p.name <= newest.name]
        for old in kept[: max(0, len(kept) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.directory.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        for pointer in self.directory.glob(f".{_LATEST}.*.tmp"):  # a killed pointer write's
            pointer.unlink(missing_ok=True)

    def latest(self) -> Path | None:
        """The newest complete checkpoint's folder, or ``None`` when there is none.

        Raises:
            ValueError: ``latest`` names something other than a ``step-<n>`` folder of this
                directory (``../elsewhere``, say).
        """
        pointer = self.directory / _LATEST
        if not pointer.exists():
            return None
        name = pointer.read_text(errors="replace").strip()
        if re.fullmatch(rf"{_PREFIX}\d+", name) is None:
            raise ValueError(
                f"{pointer} names {name[:80]!r}, not a {_PREFIX}<n> checkpoint of "
                f"{self.directory}; nothing was loaded"
            )
        return self.directory / name

    def _resolve(self, path: str | os.PathLike[str] | None) -> Path:
        folder = self.latest() if path is None else Path(path)
        if folder is None:
            raise FileNotFoundError(f"{self.directory} holds no checkpoint ({_LATEST} missing)")
        if not (folder / _STATE).exists():
            raise FileNotFoundError(f"{folder} is not a checkpoint (no {_STATE})")
        return folder

    def _verify(self, folder: Path) -> None:
        """Check ``state.pt`` against the checkpoint's manifest, and that the folder holds
        nothing else but its buffers' folders (each checked by its own ``loads``)."""
        if (folder / MANIFEST).exists():
            verify_manifest(folder, "checkpoint", skip=[_REPLAY])
            return
        extra = sorted(set(os.listdir(folder)) - {_STATE, _REPLAY})
        if extra:
            raise ValueError(f"checkpoint {folder}: {extra[0]} is not part of the format")
        warnings.warn(
            f"checkpoint {folder} was written before marlkit kept checksums ({MANIFEST} "
            "missing): its state.pt is loaded unverified",
            stacklevel=3,
        )

    def load(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        map_location: str | torch.device | None = None,
    ) -> dict[str, Any]:
        """The state saved in checkpoint ``path`` (default: :meth:`latest`), loaded with
        ``weights_only=True``; ``map_location`` as ``torch.load``'s (``"cpu"``: a checkpoint a
        CUDA run wrote, on a machine without one; ``None``: each tensor where it was saved).

        Raises:
            FileNotFoundError: no checkpoint there.
            ValueError: its ``state.pt`` does not match its checksum or does not load
                (truncated, overwritten), or the folder holds a file the format does not
                define; the message names the file and the complete checkpoint before it, if
                any.
            RuntimeError: it holds tensors saved on a device this machine does not have (a
                CUDA run's, without ``map_location``); the message says so.
        """
        folder = self._resolve(path)
        try:
            self._verify(folder)
            return torch.load(folder / _STATE, weights_only=True, map_location=map_location)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as err:
            text = str(err).strip()
            first = text.splitlines()[0] if text else type(err).__name__
            if isinstance(err, RuntimeError) and "deserialize object on a CUDA device" in text:
                raise RuntimeError(
                    f"checkpoint {folder}: {_STATE} holds tensors a CUDA run saved and this "
                    "machine has no CUDA device: load it with map_location='cpu' (a resumed run "
                    "and trained_policy do)"
                ) from None
            prefix = f"checkpoint {folder}: "
            why = (
                first[len(prefix) :].removesuffix("; nothing was loaded")
                if isinstance(err, ValueError) and first.startswith(prefix)
                else f"{_STATE} does not load ({first})"
            )
            raise ValueError(f"{prefix}{why}; it is damaged{self._before(folder)}") from None

    def _before(self, folder: Path) -> str:
        """Where the complete checkpoint before ``folder`` is, for an error message."""
        older = [p for p in sorted(self.directory.glob(f"{_PREFIX}*")) if p.name < folder.name]
        if not older or not (older[-1] / _STATE).exists():
            return ""
        return (
            f"; the checkpoint before it, {older[-1].name}, is in {self.directory}: write its "
            f"name into {self.directory / _LATEST} to go on from there"
        )

    def load_buffers(
        self, buffers: Mapping[str, _Dumpable], path: str | os.PathLike[str] | None = None
    ) -> None:
        """Restore each buffer from checkpoint ``path`` (default: :meth:`latest`).

        Raises:
            FileNotFoundError: no checkpoint there, or it holds no buffer of that name.
        """
        folder = self._resolve(path)
        for name in buffers:
            if not (folder / _REPLAY / name).exists():
                held = sorted(p.name for p in (folder / _REPLAY).glob("*"))
                raise FileNotFoundError(f"{folder} holds no buffer {name!r}; it holds {held}")
        for name, buffer in buffers.items():
            buffer.loads(folder / _REPLAY / name)

    @staticmethod
    def step_of(path: str | os.PathLike[str]) -> int:
        """The step a checkpoint folder was saved at (``step-00000012`` -> 12)."""
        name = Path(path).name
        if not name.startswith(_PREFIX) or not name[len(_PREFIX) :].isdigit():
            raise ValueError(f"{path} is not named {_PREFIX}<n>")
        return int(name[len(_PREFIX) :])

    def __repr__(self) -> str:
        return f"Checkpointer({str(self.directory)!r}, keep={self.keep}, latest={self.latest()})"
