"""Minibatches of sequences for policies with memory: a collected batch ``[*B, T]`` cut into
windows of ``burn_in + seq_len`` steps, each step of the batch counted by the loss in exactly
one window.

A recurrent actor or critic run over a window in recurrent mode
(:class:`~marlkit.modules.set_recurrent_mode`) starts from the state its first step was
collected with (``(group, "rnn_state_in")``) and zeroes its state at every episode start inside
the window (``"is_init"``): before any update, it gives back the log-probs and values of the
rollout. After updates the stored first state is stale; ``burn_in`` steps before each window's
counted steps let the network warm its state up on the new weights (R2D2's burn-in) without
those steps entering the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int
from marlkit.data.keys import COLLECTOR_MASK, NestedKey
from marlkit.modules.rnn import MEMORIES
from marlkit.train import config

__all__ = ["MemoryConfig", "sequence_windows", "split_sequences"]


@dataclass
class MemoryConfig:
    """``model`` of the training scripts: memory in the networks (none by default: the MLPs of
    ``policy``/``critic``). Every field has a default, so a config that leaves the section out
    composes to the networks without memory."""

    memory: str = "none"
    """``none``, ``gru`` or ``lstm``: ``policy.depth`` hidden layers, then the cell, then a
    linear head (EPyMARL's agent with ``policy.depth=0``; ``head_depth`` puts hidden layers
    before it)."""
    memory_hidden: int = 128
    """The cell's state features per agent (EPyMARL: 128 for PPO, 64 for Q-learning); a
    ``model.kind`` other than ``mlp`` passes it to :class:`~marlkit.modules.ModelConfig` as its
    ``hidden_size`` (the one width of the cell, under the scripts' name)."""
    seq_len: int = 20
    """Steps of each training window; ``train.minibatch_size`` counts steps, so a minibatch
    holds ``minibatch_size // seq_len`` windows."""
    burn_in: int = 0
    """Steps before each window that only warm the state up (outside the loss)."""
    head_depth: int = 0
    """Hidden layers between the cell and the output layer, each followed by the network's
    activation (``policy.activation``, ``critic.activation``): JaxMARL's SMAX actor and critic
    have one (``Dense``-ReLU after the GRU); 0, the default: a linear head, the networks as
    before the key. It applies to every network with a cell: the actor, the critic with
    ``critic_memory``, the Q-network, a ``kind`` encoder's network. Needs ``memory`` (without a
    cell the MLP's ``policy.depth``/``critic.depth`` are its hidden layers)."""
    head_cells: int | None = None
    """Units of each of those layers (``None``: ``memory_hidden``, JaxMARL's ``GRU_HIDDEN_DIM``)."""

    def __post_init__(self) -> None:
        config.check_choice("memory", self.memory, ("none", *MEMORIES))
        config.check_int("memory_hidden", self.memory_hidden, low=1)
        config.check_int("seq_len", self.seq_len, low=1)
        config.check_int("burn_in", self.burn_in, low=0)
        config.check_int("head_depth", self.head_depth, low=0)
        config.check_int("head_cells", self.head_cells, low=1, allow_none=True)
        if self.head_depth and self.memory == "none":
            raise config.ConfigError(
                f"head_depth={self.head_depth} adds hidden layers between the recurrent cell "
                "and the output layer: it needs model.memory (gru or lstm), got none. Without "
                "memory the network is one MLP whose hidden layers are policy.depth and "
                "critic.depth: set those, or model.head_depth=0"
            )


def sequence_windows(
    steps: int, seq_len: int, burn_in: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the windows of a row of ``steps`` steps start, and which of their steps count.

    Window ``k`` counts the steps ``[k * seq_len, min((k + 1) * seq_len, steps))``, and starts
    ``burn_in`` steps before them where the row allows (the first window starts at step 0 and
    counts its first ``seq_len`` steps; a last, shorter chunk is counted at the end of a window
    that overlaps the one before it).

    Returns:
        ``(index, counted)``, each ``[K, burn_in + seq_len]``: the row's step of each window
        position (int64) and whether the loss counts it (bool); every step is counted once.

    Raises:
        ValueError: ``seq_len`` below 1, ``burn_in`` below 0, or a window longer than the row.

    Examples:
        >>> index, counted = sequence_windows(5, 2, burn_in=1)
        >>> index.tolist()
        [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
        >>> counted.int().tolist()
        [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    """
    seq_len = check_int("seq_len", seq_len, low=1)
    burn_in = check_int("burn_in", burn_in, low=0)
    width = burn_in + seq_len
    if width > steps:
        raise ValueError(
            f"a window of burn_in + seq_len = {burn_in} + {seq_len} = {width} steps is longer "
            f"than the batch's {steps} time steps: collect more steps per env "
            "(collector.frames_per_batch / env.num_envs) or shorten the window"
        )
    k = torch.arange(-(-steps // seq_len))
    starts = (k * seq_len - burn_in).clamp(min=0).clamp(max=steps - width)  # [K]
    index = starts[:, None] + torch.arange(width)  # [K, W]
    first, end = k * seq_len, ((k + 1) * seq_len).clamp(max=steps)
    counted = (index >= first[:, None]) & (index < end[:, None])
    return index, counted


def split_sequences(
    batch: TensorDictBase,
    seq_len: int,
    burn_in: int = 0,
    *,
    mask_key: NestedKey = COLLECTOR_MASK,
) -> TensorDictBase:
    """Cut ``batch`` ``[*B, T]`` (time last, as collectors return it; compute advantages before)
    into windows ``[N, burn_in + seq_len]``, ``N = prod(B) * ceil(T / seq_len)``
    (:func:`sequence_windows`), with ``mask_key`` ``[N, burn_in + seq_len]`` True on the steps
    the loss counts (and where the batch's own ``mask_key``, padded trajectories, was True):
    :class:`~marlkit.objectives.ClipPPOLoss` averages over those steps only.

    Args:
        batch: a batch ``[*B, T]``.
        seq_len: the counted steps of a window.
        burn_in: steps before them that only warm a recurrent state up.
        mask_key: the bool key of the counted steps (``("collector", "mask")``, which the losses
            read).

    Raises:
        ValueError: a batch without a time dim, a bad ``seq_len``/``burn_in`` or a window longer
            than ``T``; a ``mask_key`` entry that is not a bool ``[*B, T]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"x": torch.arange(10).reshape(2, 5)}, [2, 5])
        >>> out = split_sequences(batch, 2, burn_in=1)
        >>> out.batch_size, out["x"][:3].tolist()
        (torch.Size([6, 3]), [[0, 1, 2], [1, 2, 3], [2, 3, 4]])
    """
    if batch.batch_dims < 1:
        raise ValueError("split_sequences: the batch needs a time dim ([*B, T])")
    steps = batch.batch_size[-1]
    index, counted = sequence_windows(steps, seq_len, burn_in)
    own = batch.get(mask_key, None)
    if own is not None and (own.dtype != torch.bool or own.shape != batch.batch_size):
        raise ValueError(
            f"split_sequences: {mask_key!r} must be a bool [*B, T] {list(batch.batch_size)}, got "
            f"{own.dtype} {list(own.shape)}"
        )
    rows = batch.reshape(-1, steps)
    k, width = index.shape
    windows = rows[:, index.reshape(-1).to(rows.device)].reshape(-1, width)  # [R * K, W]
    mask = counted.to(rows.device).expand(rows.batch_size[0], k, width).reshape(-1, width)
    if own is not None:
        mask = mask & windows.get(mask_key)
    windows.set(mask_key, mask)
    return windows
