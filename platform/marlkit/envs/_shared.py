"""The leaves of a shared-memory TensorDict, resolved once: copies in and out of the buffer on
the hot path of ``ParallelEnv`` without per-step key lists, ``select`` or ``update_``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit.data._fast import get_entry, unchecked_tensordict
from marlkit.data.keys import NestedKey

__all__ = ["BufferLeaves"]


def _path(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _lookup(key: NestedKey) -> str | tuple[str, ...]:
    """``key`` normalised for :func:`get_entry`: a str, or a tuple of two or more strs."""
    path = _path(key)
    return path[0] if len(path) == 1 else path


class BufferLeaves:
    """Some leaves of a TensorDict buffer (one per key), and the nesting to rebuild it.

    Args:
        buffer: the buffer (``[*B, ...]``, every level a plain TensorDict), e.g. a shared-memory
            TensorDict the workers read and write.
        keys: the leaf keys to copy in and out, in a fixed order.
    """

    def __init__(self, buffer: TensorDictBase, keys: Sequence[NestedKey]):
        self.keys: list[NestedKey] = list(keys)
        self._lookups = [_lookup(k) for k in self.keys]
        self.leaves: list[torch.Tensor] = [buffer.get(k) for k in self.keys]
        self._device = buffer.device
        # The tree of levels: each level's batch size and its entries (leaf index or sub-level).
        self._tree = self._level(buffer, (), [_path(k) for k in self.keys])

    def _level(
        self, td: TensorDictBase, prefix: tuple[str, ...], paths: list[tuple[str, ...]]
    ) -> tuple[torch.Size, dict[str, Any]]:
        entries: dict[str, Any] = {}
        for index, path in enumerate(paths):
            if path[: len(prefix)] != prefix or len(path) <= len(prefix):
                continue
            name = path[len(prefix)]
            if len(path) == len(prefix) + 1:
                entries[name] = index
            elif name not in entries:
                entries[name] = self._level(td.get(name), (*prefix, name), paths)
        return td.batch_size, entries

    def write(self, td: TensorDictBase) -> list[NestedKey]:
        """Copy ``td``'s entries at these keys into the buffer; return the keys ``td`` lacks
        (their buffer leaves are left as they were)."""
        dst, src, missing = [], [], []
        for key, lookup, leaf in zip(self.keys, self._lookups, self.leaves):
            value = get_entry(td, lookup)
            if value is None:
                missing.append(key)
            else:
                dst.append(leaf)
                src.append(value)
        if dst:
            torch._foreach_copy_(dst, src)
        return missing

    def read(self) -> TensorDictBase:
        """A new TensorDict of copies of the leaves (it shares no memory with the buffer, which
        the next command overwrites)."""
        return self._build(self._tree, [leaf.clone() for leaf in self.leaves])

    def view(self) -> TensorDictBase:
        """A new TensorDict over the leaves themselves (no copies): valid until the buffer is
        next written."""
        return self._build(self._tree, list(self.leaves))

    def _build(
        self, level: tuple[torch.Size, dict[str, Any]], values: list[torch.Tensor]
    ) -> TensorDictBase:
        batch_size, entries = level
        built = {
            name: values[item] if isinstance(item, int) else self._build(item, values)
            for name, item in entries.items()
        }
        return unchecked_tensordict(built, batch_size, self._device, nested=False)
