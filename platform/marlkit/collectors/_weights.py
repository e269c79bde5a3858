"""Policy weights for the collectors: what a policy takes, the check of what the user gives, and
loading it in place.

Every collector's ``update_policy_weights_`` goes through :class:`WeightsLayout`: the weights
(a ``state_dict`` or a TensorDict of parameters and buffers) are checked against the policy's
names, shapes and dtypes before anything is written, and then copied into the policy's own
tensors, so that an optimizer built on ``policy.parameters()`` keeps training the policy the
collector runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

__all__ = ["Weights", "WeightsLayout", "load_weights_", "policy_tensors"]

#: What ``update_policy_weights_`` takes: a ``state_dict`` (dotted names) or a TensorDict of
#: parameters and buffers (``TensorDict.from_module(policy)``, nested by module).
Weights = Mapping[str, torch.Tensor] | TensorDictBase


def policy_tensors(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's parameters and buffers by ``state_dict`` name (a tied tensor under each of
    its names): its own tensors, not copies."""
    tensors: dict[str, torch.Tensor] = dict(policy.named_parameters(remove_duplicate=False))
    tensors.update(policy.named_buffers(remove_duplicate=False))
    return tensors


def _non_persistent(policy: nn.Module) -> Iterator[str]:
    """The names of the buffers ``state_dict`` leaves out (``persistent=False``)."""
    for prefix, module in policy.named_modules(remove_duplicate=False):
        for name in module._non_persistent_buffers_set:
            yield f"{prefix}.{name}" if prefix else name


def _dotted(key: str | tuple[str, ...]) -> str:
    """A nested key as a ``state_dict`` name: ``("0", "weight")`` -> ``"0.weight"``."""
    return key if isinstance(key, str) else ".".join(key)


def _flat(weights: object) -> dict[str, Any]:
    if isinstance(weights, TensorDictBase):
        return {_dotted(key): value for key, value in weights.items(True, True)}
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"weights must be a state_dict or a TensorDict, got {type(weights).__name__}"
        )
    for key in weights:
        if not isinstance(key, str):
            raise TypeError(f"a state_dict's names are strings, got {key!r}")
    return dict(weights)


class WeightsLayout:
    """The weights a policy takes: its parameters and buffers by ``state_dict`` name, with their
    shapes and dtypes, taken when the layout is made.

    Weights must hold every parameter and persistent buffer; the non-persistent buffers
    (``register_buffer(..., persistent=False)``, which ``state_dict`` leaves out) may be given or
    not (left out, they keep their values).
    """

    def __init__(self, policy: nn.Module):
        tensors = policy_tensors(policy)
        #: ``{name: (shape, dtype)}`` of every parameter and buffer.
        self.specs: dict[str, tuple[torch.Size, torch.dtype]] = {
            name: (tensor.shape, tensor.dtype) for name, tensor in tensors.items()
        }
        #: The names weights may leave out: the non-persistent buffers.
        self.optional = frozenset(_non_persistent(policy)) & self.specs.keys()

    def __bool__(self) -> bool:
        return bool(self.specs)

    def check(self, weights: Weights) -> dict[str, torch.Tensor]:
        """``weights`` by ``state_dict`` name, once every name, shape and dtype is the policy's.

        Raises:
            TypeError: neither a mapping nor a TensorDict, or a value that is not a tensor.
            KeyError: a parameter or persistent buffer is missing, or a name is not the
                policy's (every such name in the message).
            ValueError: shapes or dtypes that are not the policy's (every such weight in the
                message, with the two shapes or dtypes).
        """
        flat = _flat(weights)
        for name, value in flat.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(value).__name__}, not a tensor")
        missing = sorted(self.specs.keys() - self.optional - flat.keys())
        unexpected = sorted(flat.keys() - self.specs.keys())
        if missing or unexpected:
            raise KeyError(
                f"the weights do not match the policy's: missing {missing}, unexpected "
                f"{unexpected} (nothing was loaded)"
            )
        problems = []
        for name, value in flat.items():
            shape, dtype = self.specs[name]
            got, want = [], []
            if value.shape != shape:
                got.append(f"shape {list(value.shape)}")
                want.append(f"shape {list(shape)}")
            if value.dtype != dtype:
                got.append(f"dtype {value.dtype}")
                want.append(f"dtype {dtype}")
            if got:
                problems.append(
                    f"weight {name!r} has {' and '.join(got)}, the policy's has "
                    f"{' and '.join(want)}"
                )
        if problems:
            raise ValueError("; ".join(problems) + " (nothing was loaded)")
        return flat


def load_weights_(policy: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy ``weights`` (checked by :meth:`WeightsLayout.check`) into the policy's own
    parameters and buffers, across devices where they differ."""
    targets = policy_tensors(policy)
    with torch.no_grad():
        for name, value in weights.items():
            targets[name].copy_(value)
