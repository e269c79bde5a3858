"""Orthogonal initialisation of a network's dense layers, as CleanRL's, JaxMARL's and MAPPO's
reference PPO implementations initialise their actors and critics.

PyTorch (and marlkit by default) draws a linear layer's weights uniform in
``+-1/sqrt(in_features)``; the PPO references draw each layer's weight matrix orthogonal times a
gain (``sqrt(2)`` for hidden layers followed by a ReLU or Tanh, ``0.01`` for the actor's output
layer, so that the first policy is near uniform, ``1.0`` for the critic's) with zero biases.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from marlkit._checks import check_real
from marlkit.modules.mlp import StackedLinear
from marlkit.modules.rnn import _MultiAgentRNN

__all__ = ["dense_layers", "orthogonal_init_"]

#: The layers :func:`orthogonal_init_` draws (a recurrent cell's gates are not among them).
DENSE = (StackedLinear, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def dense_layers(module: nn.Module) -> list[tuple[nn.Module, bool]]:
    """``module``'s dense (linear and convolutional) layers in the order they were registered,
    each with whether it comes after a recurrent cell (a head on the cell's output), each layer
    once; the gates of :class:`~marlkit.modules.MultiAgentGRU` /
    :class:`~marlkit.modules.MultiAgentLSTM` are left out."""
    found: list[tuple[nn.Module, bool]] = []
    seen: set[int] = set()
    after_cell = False

    def walk(m: nn.Module) -> None:
        nonlocal after_cell
        if id(m) in seen:
            return
        seen.add(id(m))
        if isinstance(m, _MultiAgentRNN):
            after_cell = True
            return
        if isinstance(m, DENSE):
            found.append((m, after_cell))
            return
        for child in m.children():
            walk(child)

    walk(module)
    return found


def _orthogonal(layer: nn.Module, gain: float) -> None:
    """``layer``'s weight orthogonal times ``gain`` (per stack of a :class:`StackedLinear`,
    each stack's ``[out, in]`` matrix; a convolution's ``[out, in * k...]``, per group of a
    grouped one: each agent's filters of :class:`~marlkit.modules.MultiAgentCNN`), its bias
    zero."""
    with torch.no_grad():
        if isinstance(layer, StackedLinear):
            drawn = torch.empty(
                layer.n_stacks, layer.out_features, layer.in_features, dtype=layer.weight.dtype
            )
            for s in range(layer.n_stacks):  # at set-up only: one draw per stack
                nn.init.orthogonal_(drawn[s], gain=gain)
            layer.weight.copy_(drawn.transpose(1, 2))  # [S, in, out], whatever its layout
        else:
            weight = cast(torch.Tensor, layer.weight)
            groups = int(getattr(layer, "groups", 1))
            shape = tuple(weight.shape)
            drawn = torch.empty(groups, shape[0] // groups, *shape[1:], dtype=weight.dtype)
            for g in range(groups):  # nn.init.orthogonal_ flattens the trailing dims
                nn.init.orthogonal_(drawn[g], gain=gain)
            weight.copy_(drawn.view(shape))
        bias = getattr(layer, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.zero_()


def orthogonal_init_(
    module: nn.Module,
    *,
    gain: float = math.sqrt(2.0),
    output_gain: float = 1.0,
    head_gain: float | None = None,
) -> nn.Module:
    """Draw every dense layer of ``module`` orthogonal, in place, biases zero: the hidden layers
    with ``gain``, the last layer registered (the output layer) with ``output_gain``, hidden
    layers after a recurrent cell with ``head_gain`` (``None``: ``gain``; JaxMARL's recurrent
    MAPPO draws its post-GRU layer with 2). Recurrent cells keep their initialisation.

    Each seed's networks are drawn from torch's generator, as the default initialisation is;
    parameters keep their memory layout (:class:`StackedLinear`'s out-major output layers).

    Example:
        >>> import torch
        >>> from marlkit.modules import MultiAgentMLP, orthogonal_init_
        >>> _ = torch.manual_seed(0)
        >>> mlp = MultiAgentMLP(6, 5, n_agents=3, centralised=False, share_params=True,
        ...                     depth=2, num_cells=32)
        >>> _ = orthogonal_init_(mlp, output_gain=0.01)
        >>> w = mlp.layers[0].weight[0]  # [in, out] of the first stack
        >>> torch.allclose(w.T @ w, 2.0 * torch.eye(32), atol=1e-5)  # 6 < 32: columns span
        False
        >>> torch.allclose(w @ w.T, 2.0 * torch.eye(6), atol=1e-5)
        True

    Raises:
        ValueError: ``module`` has no dense layer; a gain that is not a finite number > 0.
    """
    gain = check_real("gain", gain)
    output_gain = check_real("output_gain", output_gain)
    head = gain if head_gain is None else check_real("head_gain", head_gain)
    layers = dense_layers(module)
    if not layers:
        raise ValueError(
            f"orthogonal_init_: {type(module).__name__} has no linear or convolutional layer"
        )
    for i, (layer, after_cell) in enumerate(layers):
        if i == len(layers) - 1:
            _orthogonal(layer, output_gain)
        else:
            _orthogonal(layer, head if after_cell else gain)
    return module
