"""Key and shape checks, and the discrete-action helpers value-based modules and losses share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_one_of
from marlkit.data.keys import NestedKey, unravel_key
from marlkit.data.specs import Categorical, OneHot, TensorSpec

__all__ = [
    "ActionSpace",
    "action_space_of",
    "check_bool",
    "check_some_allowed",
    "check_trailing",
    "chosen_value",
    "encode_action",
    "get_tensor",
    "key_name",
    "masked_greedy",
]

ActionSpace = Literal["categorical", "one_hot"]


def key_name(key: Any) -> Any:
    """``key`` as messages print it: nested tuples flattened (``("next", ("a", "b"))`` ->
    ``("next", "a", "b")``)."""
    try:
        return unravel_key(key)
    except (TypeError, ValueError):
        return key


def get_tensor(
    td: TensorDictBase, key: NestedKey, owner: str, expected: str, shown: Any = None
) -> torch.Tensor:
    """``td[key]``, or a ``KeyError`` naming the key, the owner and the expected shape.

    Args:
        td: the TensorDict read.
        key: the key.
        owner: who reads it (for the message), e.g. ``"QMixer"``.
        expected: the expected shape in words, e.g. ``"[*B, n_agents, 1]"``.
        shown: the key as messages name it (default ``key``), e.g. with the ``"next"`` of a
            sub-TensorDict ``td`` is.

    Raises:
        KeyError: ``key`` is missing.
    """
    name = key_name(key if shown is None else shown)
    value = td.get(key, None)
    if value is None:
        raise KeyError(f"{owner}: the input has no key {name!r} (expected a tensor {expected})")
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{owner}: {name!r} must be a tensor {expected}, got {type(value).__name__}"
        )
    return value


def check_trailing(
    tensor: torch.Tensor,
    key: Any,
    trailing: Sequence[int],
    owner: str,
    expected: str,
    *,
    boolean: bool = False,
) -> None:
    """Raise a ``ValueError`` naming ``key`` unless ``tensor``'s last dims are ``trailing``
    (and, with ``boolean``, its dtype is ``torch.bool``: masks and done flags).

    Raises:
        ValueError: other trailing dims (the message gives the expected and the actual shape),
            or another dtype where a bool tensor is expected.
    """
    k = len(trailing)
    if tensor.dim() < k or tuple(tensor.shape[tensor.dim() - k :]) != tuple(trailing):
        raise ValueError(
            f"{owner}: {key_name(key)!r} must have shape {expected}, got {tuple(tensor.shape)}"
        )
    if boolean:
        check_bool(tensor, key, owner)


def check_bool(tensor: torch.Tensor, key: Any, owner: str) -> None:
    """Raise a ``ValueError`` naming ``key`` unless ``tensor`` is a bool tensor (a mask or a
    done flag: other dtypes would be silently reinterpreted, or fail deep inside torch)."""
    if tensor.dtype != torch.bool:
        raise ValueError(
            f"{owner}: {key_name(key)!r} must be a bool tensor, got {tensor.dtype} "
            f"(convert it with .bool())"
        )


def action_space_of(
    spec: TensorSpec | None, n_actions: int | None, action_space: ActionSpace | None, owner: str
) -> tuple[int | None, ActionSpace]:
    """The number of actions and the encoding, from a spec or from explicit arguments.

    Raises:
        TypeError: a spec that is neither ``Categorical`` nor ``OneHot``.
        ValueError: ``n_actions`` that disagrees with the spec, or an unknown encoding.
    """
    if spec is not None:
        if isinstance(spec, Categorical):
            n, space = spec.n, "categorical"
        elif isinstance(spec, OneHot):
            n, space = spec.n, "one_hot"
        else:
            raise TypeError(
                f"{owner}: the action spec must be Categorical or OneHot, got {type(spec).__name__}"
            )
        if n_actions is not None and n_actions != n:
            raise ValueError(f"{owner}: n_actions={n_actions} but the spec has {n} actions")
        if action_space is not None and action_space != space:
            raise ValueError(f"{owner}: action_space={action_space!r} but the spec is {space!r}")
        return n, space  # type: ignore[return-value]
    if n_actions is not None:
        check_int("n_actions", n_actions, low=1, owner=owner)
    space = action_space if action_space is not None else "categorical"
    check_one_of("action_space", space, ("categorical", "one_hot"), owner=owner)
    return n_actions, space


def masked_greedy(
    action_value: torch.Tensor, action_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy action among the allowed ones and its value.

    Args:
        action_value: ``[*B, n, A]``.
        action_mask: ``[*B, n, A]`` bool (True: allowed) or ``None``.

    Returns:
        ``(index [*B, n] int64, value [*B, n, 1])``. A row with no allowed action gets
        action 0 and value ``-inf`` (losses mask such agents out; actors that must act call
        :func:`check_some_allowed` first).
    """
    if action_mask is not None:
        action_value = action_value.masked_fill(~action_mask, -torch.inf)
    value, index = action_value.max(-1, keepdim=True)
    return index.squeeze(-1), value


def check_some_allowed(action_mask: torch.Tensor, key: Any, owner: str) -> None:
    """Raise a ``ValueError`` naming ``key`` when a row of ``action_mask`` ``[*B, n, A]``
    allows no action (an actor would have to choose a forbidden one)."""
    empty = ~action_mask.any(-1)
    if bool(empty.any()):
        where = empty.nonzero()[0].tolist()
        raise ValueError(
            f"{owner}: a row of {key_name(key)!r} allows no action (at index {where}); "
            "every acting agent needs at least one allowed action"
        )


def encode_action(
    index: torch.Tensor, n_actions: int, action_space: ActionSpace, dtype: torch.dtype | None
) -> torch.Tensor:
    """Action indices ``[*B, n]`` as the env spells them: the indices (categorical) or one-hot
    ``[*B, n, A]``."""
    if action_space == "categorical":
        return index if dtype is None else index.to(dtype)
    one_hot = torch.nn.functional.one_hot(index, n_actions)
    return one_hot if dtype is None else one_hot.to(dtype)


def chosen_value(
    action_value: torch.Tensor,
    action: torch.Tensor,
    action_space: ActionSpace,
    owner: str,
    key: Any,
) -> torch.Tensor:
    """The value of the taken action.

    Args:
        action_value: ``[*B, n, A]``.
        action: ``[*B, n]`` (or ``[*B, n, 1]``) int indices, or one-hot ``[*B, n, A]``.

    Returns:
        ``[*B, n, 1]``.

    Raises:
        ValueError: an action whose shape does not fit ``action_value`` (names ``key``).
    """
    lead = tuple(action_value.shape[:-1])
    if action_space == "one_hot":
        if tuple(action.shape) != tuple(action_value.shape):
            raise ValueError(
                f"{owner}: the one-hot {key_name(key)!r} must have shape "
                f"{tuple(action_value.shape)} (like the action values), got {tuple(action.shape)}"
            )
        return (action_value * action.to(action_value.dtype)).sum(-1, keepdim=True)
    if tuple(action.shape) == lead:
        action = action.unsqueeze(-1)
    elif tuple(action.shape) != (*lead, 1):
        raise ValueError(
            f"{owner}: the categorical {key_name(key)!r} must have shape {lead} "
            f"([*B, n_agents]), got {tuple(action.shape)}"
        )
    if action.dtype.is_floating_point or action.dtype == torch.bool:
        raise ValueError(
            f"{owner}: the categorical {key_name(key)!r} must hold integer indices, got "
            f"{action.dtype}"
        )
    n_actions = action_value.shape[-1]
    if action.numel() and bool(((action < 0) | (action >= n_actions)).any()):
        bad = action[(action < 0) | (action >= n_actions)]
        raise ValueError(
            f"{owner}: the categorical {key_name(key)!r} must hold indices in [0, {n_actions}) "
            f"(n_actions={n_actions}), got {bad.unique()[:8].tolist()}"
        )
    return action_value.gather(-1, action.long())


def check_taken_allowed(
    action: torch.Tensor,
    allowed: torch.Tensor | None,
    action_space: ActionSpace,
    owner: str,
    key: Any,
    mask_key: Any,
    present: torch.Tensor | None = None,
) -> None:
    """Refuse a stored action that the step's action mask forbids (its value is then learned
    from a move the env never allows), for agents present whose mask allows some action.

    Args:
        action: ``[*B, n]`` or ``[*B, n, 1]`` indices, or one-hot ``[*B, n, A]`` (checked by
            :func:`chosen_value` first).
        allowed: the mask ``[*B, n, A]`` bool, or ``None`` (nothing to check).
        present: ``[*B, n, 1]`` bool, the agents present (``None``: all).

    Raises:
        ValueError: names both keys, how many agent steps and the first of them.
    """
    if allowed is None:
        return
    if action_space == "one_hot":
        index = action.argmax(-1, keepdim=True)
    else:
        index = action if action.dim() == allowed.dim() else action.unsqueeze(-1)
    ok = allowed.gather(-1, index.long()) | ~allowed.any(-1, keepdim=True)
    if present is not None:
        ok = ok | ~present
    if bool(ok.all()):
        return
    bad = (~ok).squeeze(-1).nonzero()
    first = bad[0].tolist()
    taken = int(index[tuple(first)].item())
    raise ValueError(
        f"{owner}: {key_name(key)!r} holds actions that {key_name(mask_key)!r} forbids at "
        f"{len(bad)} agent step(s) (first: batch index {first[:-1]}, agent {first[-1]}, action "
        f"{taken}); a value would be learned for a move the env never allows: the policy that "
        "collected them must respect the mask"
    )
