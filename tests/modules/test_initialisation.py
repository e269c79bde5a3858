"""``orthogonal_init_``: the PPO references' initialisation of dense layers (issue 38)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from marlkit.modules import (
    MultiAgentCNN,
    MultiAgentGRU,
    MultiAgentMLP,
    StackedLinear,
    dense_layers,
    orthogonal_init_,
)
from marlkit.modules.rnn import recurrent_network


def _matrices(layer: nn.Module) -> list[torch.Tensor]:
    """Each stack's ``[out, in]`` weight matrix (a conv's ``[out, in * k * k]`` per group)."""
    if isinstance(layer, StackedLinear):
        return [w.T for w in layer.weight.detach()]
    return list(layer.weight.detach().flatten(1).chunk(getattr(layer, "groups", 1)))


def _assert_orthogonal(layer: nn.Module, gain: float) -> None:
    for w in _matrices(layer):
        rows, cols = w.shape
        # the smaller side's Gram matrix is gain^2 I (orthonormal rows or columns)
        gram = w @ w.T if rows <= cols else w.T @ w
        torch.testing.assert_close(gram, gain**2 * torch.eye(min(rows, cols)), atol=1e-5, rtol=0)
    assert torch.count_nonzero(layer.bias) == 0


def test_every_stack_of_a_per_agent_mlp_is_orthogonal_with_its_gain():
    torch.manual_seed(0)
    mlp = MultiAgentMLP(7, 5, n_agents=3, centralised=False, share_params=False, depth=2,
                        num_cells=16)  # fmt: skip
    layout = [layer.weight.stride() for layer in mlp.layers]
    orthogonal_init_(mlp, output_gain=0.01)
    hidden, output = mlp.layers[:-1], mlp.layers[-1]
    for layer in hidden:
        _assert_orthogonal(layer, math.sqrt(2.0))
    _assert_orthogonal(output, 0.01)
    # each agent's stack drawn on its own, not one matrix copied three times
    first = mlp.layers[0].weight.detach()
    assert not torch.allclose(first[0], first[1])
    # the out-major memory of the narrow output layer (StackedLinear's notes) is kept
    assert [layer.weight.stride() for layer in mlp.layers] == layout


def test_a_recurrent_network_keeps_its_cell_and_draws_its_head_with_the_head_gain():
    """JaxMARL's SMAX actor: Dense-ReLU, GRU, Dense-ReLU (gain 2), Dense (gain 0.01)."""
    torch.manual_seed(0)
    net = recurrent_network(
        6, 4, n_agents=2, share_params=True, hidden_size=8, memory="gru", depth=0, num_cells=8,
        head_depth=1, out_keys=["logits"], activation=nn.ReLU,
    )  # fmt: skip
    cell = next(m for m in net.modules() if isinstance(m, MultiAgentGRU))
    gates = {k: v.clone() for k, v in cell.state_dict().items()}
    layers = dense_layers(net)
    assert [after for _, after in layers] == [False, True, True]
    orthogonal_init_(net, output_gain=0.01, head_gain=2.0)
    (encoder, _), (head, _), (output, _) = layers
    _assert_orthogonal(encoder, math.sqrt(2.0))
    _assert_orthogonal(head, 2.0)
    _assert_orthogonal(output, 0.01)
    for key, value in cell.state_dict().items():  # the cell's gates as torch drew them
        torch.testing.assert_close(value, gates[key], rtol=0, atol=0)


@pytest.mark.parametrize("share_params", [True, False])
def test_convolutions_are_drawn_too_and_the_draw_follows_the_seed(share_params):
    """A per-agent CNN is one grouped convolution: each agent's filters orthogonal apart."""

    def build(seed: int) -> MultiAgentCNN:
        torch.manual_seed(seed)
        cnn = MultiAgentCNN(2, n_agents=3, share_params=share_params, num_cells=[4, 4],
                            kernel_sizes=3, strides=1)  # fmt: skip
        return orthogonal_init_(cnn, output_gain=0.5)

    cnn = build(0)
    convs = [m for m in cnn.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 2 and [id(m) for m, _ in dense_layers(cnn)] == [id(c) for c in convs]
    assert convs[0].groups == (1 if share_params else 3)
    _assert_orthogonal(convs[0], math.sqrt(2.0))
    _assert_orthogonal(convs[1], 0.5)
    again, other = build(0), build(1)
    for a, b in zip(cnn.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, c) for a, c in zip(cnn.parameters(), other.parameters()))


def test_a_module_without_dense_layers_and_a_bad_gain_are_refused():
    with pytest.raises(ValueError, match="orthogonal_init_: ReLU has no linear or convolutional"):
        orthogonal_init_(nn.ReLU())
    mlp = MultiAgentMLP(3, 2, n_agents=2, centralised=False, share_params=True, depth=1,
                        num_cells=4)  # fmt: skip
    with pytest.raises(ValueError, match="output_gain must be a finite number > 0, got 0"):
        orthogonal_init_(mlp, output_gain=0.0)
    with pytest.raises(ValueError, match="head_gain must be a finite number > 0, got nan"):
        orthogonal_init_(mlp, head_gain=float("nan"))
