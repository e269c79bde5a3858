"""``GroupReplayBuffers``: one replay buffer per agent group, fed from multi-group batches."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import NEXT
from marlkit.replay._buffer import ReplayBuffer, read_checkpoint

__all__ = ["GroupReplayBuffers"]


class GroupReplayBuffers:
    """One :class:`ReplayBuffer` per agent group, each with its own storage, sampler and
    priorities.

    :meth:`extend` takes a multi-group batch (items along its first batch dim, as
    :meth:`ReplayBuffer.extend`) and stores in each group's buffer that group's subtree plus
    every root key (``"state"``, the root done flags, the collector's ids), at the root and
    under ``"next"``: everything but the other groups. Use it when groups learn apart
    (heterogeneous groups, one loss per group, priorities per group); store whole multi-group
    TensorDicts in a single :class:`ReplayBuffer` when one loss reads every group (a mixer, a
    centralised critic).

    Args:
        groups: the group names (``env.group_map``'s keys).
        make_buffer: ``make_buffer(group)`` builds that group's buffer.

    Examples:
        >>> import marlkit
        >>> from marlkit.replay import GroupReplayBuffers, ReplayBuffer, TensorStorage
        >>> env = marlkit.make("predator_prey", num_envs=4)
        >>> buffers = GroupReplayBuffers(env.group_map, lambda g: ReplayBuffer(TensorStorage(64)))
        >>> _ = buffers.extend(env.rollout(3).reshape(-1))
        >>> sorted(buffers["predator"].sample(8)["next"].keys())
        ['done', 'predator', 'state', 'terminated', 'truncated']
    """

    def __init__(self, groups: Iterable[str], make_buffer: Callable[[str], ReplayBuffer]):
        if isinstance(groups, str):  # list("agents") would make six one-letter groups
            raise TypeError(f"groups must be a list of group names, got the str {groups!r}")
        self.groups = list(groups)
        if not self.groups:
            raise ValueError("GroupReplayBuffers needs at least one group")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError(f"the groups {self.groups} repeat a name")
        self.buffers: dict[str, ReplayBuffer] = {}
        for group in self.groups:
            buffer = make_buffer(group)
            if not isinstance(buffer, ReplayBuffer):
                raise TypeError(
                    f"make_buffer({group!r}) returned {type(buffer).__name__}, not a ReplayBuffer"
                )
            self.buffers[group] = buffer

    def split(self, batch: TensorDictBase) -> dict[str, TensorDictBase]:
        """Each group's part of ``batch``: everything but the other groups' subtrees.

        Raises:
            KeyError: a group is absent from ``batch``.
        """
        if not isinstance(batch, TensorDictBase):
            raise TypeError(f"extend() takes a TensorDict, got {type(batch).__name__}")
        present = set(batch.keys())
        missing = [g for g in self.groups if g not in present]
        if missing:
            raise KeyError(
                f"the batch has no group {missing[0]!r} (groups: {self.groups}; keys: "
                f"{sorted(present)})"
            )
        parts = {}
        for group in self.groups:
            others = [g for g in self.groups if g != group]
            parts[group] = batch.exclude(*others, *((NEXT, g) for g in others))
        return parts

    def extend(self, batch: TensorDictBase) -> dict[str, torch.Tensor]:
        """Store each group's part of ``batch`` in its buffer; returns each group's slots.

        Every part is checked against its buffer's storage first: when one is refused
        (different keys, shapes or dtypes), no buffer is written.
        """
        parts = self.split(batch)
        for group, part in parts.items():
            try:
                self.buffers[group].storage.check(part)
            except (KeyError, ValueError, TypeError) as err:
                raise type(err)(f"group {group!r}: {err}") from None
        return {group: self.buffers[group].extend(part) for group, part in parts.items()}

    def sample(self, group: str, batch_size: int | None = None) -> TensorDictBase:
        """A sample of ``group``'s buffer (see :meth:`ReplayBuffer.sample`)."""
        return self[group].sample(batch_size)

    def __getitem__(self, group: str) -> ReplayBuffer:
        if group not in self.buffers:
            raise KeyError(f"no group {group!r}; groups: {self.groups}")
        return self.buffers[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def lengths(self) -> dict[str, int]:
        """Items stored per group."""
        return {g: len(b) for g, b in self.buffers.items()}

    def empty(self) -> None:
        for buffer in self.buffers.values():
            buffer.empty()

    def state_dict(self) -> dict[str, Any]:
        return {g: b.state_dict() for g, b in self.buffers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, every group's state checked first (see
        :meth:`ReplayBuffer.check_state_dict`): when one is refused, no buffer is loaded.

        Raises:
            KeyError: a group missing from ``state``; or, naming the group, as
                :meth:`ReplayBuffer.load_state_dict` (TypeError, ValueError too).
        """
        missing = [g for g in self.groups if g not in state]
        if missing:
            raise KeyError(f"the state has no group {missing[0]!r}; groups: {sorted(state)}")
        for group, buffer in self.buffers.items():
            try:
                buffer.check_state_dict(state[group])
            except (KeyError, ValueError, TypeError) as err:
                raise type(err)(f"group {group!r}: {err}") from None
        for group, buffer in self.buffers.items():
            buffer.load_state_dict(state[group])

    def dumps(self, path: str | os.PathLike[str]) -> None:
        """One checkpoint per group, ``path/<group>`` (each atomic, see
        :meth:`ReplayBuffer.dumps`)."""
        for group, buffer in self.buffers.items():
            buffer.dumps(Path(path) / group)

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Restore the checkpoints of :meth:`dumps`: every group's is read and checked before
        any buffer is loaded (as :meth:`load_state_dict`).

        Raises:
            FileNotFoundError: a group's checkpoint is missing (nothing loaded).
        """
        states = {group: read_checkpoint(Path(path) / group) for group in self.groups}
        try:
            self.load_state_dict(states)
        except (KeyError, ValueError, TypeError) as err:  # states that do not fit these buffers
            message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
            raise type(err)(f"replay buffer checkpoints {Path(path)}: {message}") from None

    def __repr__(self) -> str:
        return f"GroupReplayBuffers({self.lengths()})"
