"""Helpers to build the standard multi-agent specs and to walk done levels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from marlkit.data.composite import Composite
from marlkit.data.keys import DONE, DONE_KEYS, REWARD
from marlkit.data.specs import Categorical, ShapeLike, Unbounded

__all__ = ["done_levels", "make_done_spec", "make_reward_spec", "reshape_env_mask"]


def make_done_spec(
    batch_size: ShapeLike,
    groups: Mapping[str, int],
    *,
    device: str | torch.device | None = None,
    keys: Sequence[str] = DONE_KEYS,
    root: bool = True,
) -> Composite:
    """The done spec of the standard layout.

    Root ``done``/``terminated``/``truncated`` are ``[*B, 1]`` bool; each group's are
    ``[*B, n, 1]`` bool.

    Args:
        batch_size: the env batch ``B``.
        groups: ``{group: n_agents}``.
        device: device of the specs.
        keys: the done-like keys to declare at every level.
        root: declare the root level (always wanted by envs; transforms may skip it).
    """
    spec = Composite(shape=batch_size, device=device)
    b = tuple(spec.shape)
    for group, n in groups.items():
        spec[group] = Composite(
            {k: Categorical(2, (*b, n, 1), dtype=torch.bool, device=device) for k in keys},
            shape=(*b, n),
            device=device,
        )
    if root:
        for k in keys:
            spec[k] = Categorical(2, (*b, 1), dtype=torch.bool, device=device)
    return spec


def make_reward_spec(
    batch_size: ShapeLike,
    groups: Mapping[str, int],
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Composite:
    """``(group, "reward")`` of shape ``[*B, n, 1]`` for each group."""
    spec = Composite(shape=batch_size, device=device)
    b = tuple(spec.shape)
    for group, n in groups.items():
        spec[group] = Composite(
            {REWARD: Unbounded((*b, n, 1), dtype=dtype, device=device)},
            shape=(*b, n),
            device=device,
        )
    return spec


def done_levels(done_spec: Composite) -> list[tuple[tuple[str, ...], torch.Size]]:
    """``(prefix, shape)`` of each level holding a ``"done"`` leaf, groups first, root last."""
    levels = []
    for key, spec in done_spec.items(include_nested=True, leaves_only=True):
        path = (key,) if isinstance(key, str) else key
        if path[-1] == DONE:
            levels.append((path[:-1], spec.shape))
    levels.sort(key=lambda level: len(level[0]) == 0)
    return levels


def reshape_env_mask(env_mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Broadcast an env mask ``[*B]`` to an entry of shape ``[*B, ...]``."""
    return env_mask.reshape(*env_mask.shape, *([1] * (len(shape) - env_mask.ndim))).expand(shape)
