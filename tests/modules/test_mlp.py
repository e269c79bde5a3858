"""MultiAgentMLP: equal to a loop over per-agent nn.Sequentials holding the same weights."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from marlkit.modules import MultiAgentMLP, StackedLinear


def loop_reference(mlp: MultiAgentMLP, x: torch.Tensor) -> torch.Tensor:
    """The same maths as a plain Python loop over agents."""
    outs = []
    for i in range(mlp.n_agents):
        net = mlp.agent_network(i)
        inp = x.reshape(*x.shape[:-2], -1) if mlp.centralised else x[..., i, :]
        outs.append(net(inp))
    return torch.stack(outs, -2)


@pytest.mark.parametrize("share_params", [False, True])
@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("batch", [(), (5,), (2, 3), (2, 1, 4)])
def test_matches_per_agent_loop(share_params: bool, centralised: bool, batch: tuple) -> None:
    torch.manual_seed(0)
    mlp = MultiAgentMLP(
        4, 3, 5, centralised=centralised, share_params=share_params, depth=2, num_cells=[16, 8]
    )
    x = torch.randn(*batch, 5, 4)
    out = mlp(x)
    assert out.shape == (*batch, 5, 3)
    torch.testing.assert_close(out, loop_reference(mlp, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("batch", [(24,), (4, 6)])
def test_groups_of_agents_give_the_same_values_and_gradients(
    centralised: bool, batch: tuple
) -> None:
    torch.manual_seed(0)
    whole = MultiAgentMLP(4, 3, 5, centralised=centralised, num_cells=[16, 2])
    whole.cpu_group_bytes = 0
    grouped = copy.deepcopy(whole)
    rows = 24  # the product of the batch dims; widest layer 16 (or 20 inputs when centralised)
    grouped.cpu_group_bytes = 2 * rows * (20 if centralised else 16) * 4  # two agents a group
    assert whole.agents_per_group(rows) == 5 and grouped.agents_per_group(rows) == 2
    x = torch.randn(*batch, 5, 4)
    torch.testing.assert_close(grouped(x), whole(x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grouped(x), loop_reference(grouped, x), rtol=1e-5, atol=1e-6)
    target = torch.randn(*batch, 5, 3)
    for mlp in (whole, grouped):
        ((mlp(x) - target) ** 2).sum().backward()
    for (name, a), b in zip(whole.named_parameters(), grouped.parameters()):
        assert b.grad is not None and a.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_agents_per_group_rule() -> None:
    mlp = MultiAgentMLP(16, 4, 32, num_cells=256)
    assert mlp.cpu_group_bytes == 2 << 20
    assert mlp.agents_per_group(32) == 32  # a rollout's batch: every agent in one call
    assert MultiAgentMLP(16, 4, 256, num_cells=256).agents_per_group(255) == 256  # rows < width
    assert mlp.agents_per_group(1024) == 2  # 1024 rows x 256 floats: 1 MiB an agent
    assert mlp.agents_per_group(10**6) == 1
    assert mlp.agents_per_group(1024, torch.device("meta")) == 32  # not CPU: one call
    shared = MultiAgentMLP(16, 4, 32, share_params=True, num_cells=256)
    assert shared.agents_per_group(10**6) == 1  # one stack
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError)):
        mlp.cpu_group_bytes = bad  # type: ignore[assignment]
        with pytest.raises(error, match="MultiAgentMLP: cpu_group_bytes must be an int >= 0, got"):
            mlp(torch.zeros(1024, 32, 16))


def test_hand_built_sequentials_match() -> None:
    # Independent reference: nn.Sequentials built here, their weights copied into the stacks.
    torch.manual_seed(1)
    mlp = MultiAgentMLP(3, 2, 4, depth=1, num_cells=6, activation=nn.ReLU)
    nets = [nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)) for _ in range(4)]
    with torch.no_grad():
        for i, net in enumerate(nets):
            for layer, lin in zip(mlp.layers, (net[0], net[2])):
                layer.weight[i].copy_(lin.weight.T)
                layer.bias[i, 0].copy_(lin.bias)
    x = torch.randn(7, 4, 3)
    ref = torch.stack([nets[i](x[:, i]) for i in range(4)], 1)
    torch.testing.assert_close(mlp(x), ref)


def test_independent_params_differ_and_gradients_per_agent() -> None:
    mlp = MultiAgentMLP(2, 1, 3, num_cells=4)
    x = torch.randn(6, 3, 2)
    mlp(x)[:, 1].sum().backward()
    grad = mlp.layers[0].weight.grad
    assert grad is not None
    assert grad[1].abs().sum() > 0
    assert grad[0].abs().sum() == 0 and grad[2].abs().sum() == 0


def test_shared_centralised_output_is_the_same_for_every_agent() -> None:
    mlp = MultiAgentMLP(2, 3, 4, centralised=True, share_params=True, num_cells=8)
    out = mlp(torch.randn(5, 4, 2))
    torch.testing.assert_close(out[:, 0], out[:, 3])


@pytest.mark.parametrize(
    ("shape", "got"),
    [((5, 3, 5), r"\[5, 3, 5\]"), ((5, 2, 4), r"\[5, 2, 4\]"), ((4,), r"\[4\]")],
)
def test_wrong_input_shape_names_expected_and_got(shape: tuple, got: str) -> None:
    mlp = MultiAgentMLP(4, 2, 3, num_cells=8)
    with pytest.raises(ValueError, match=r"expected .*n_agents=3, 4\], got " + got):
        mlp(torch.zeros(shape))


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="MultiAgentMLP: n_agents must be an int >= 1, got 0"):
        MultiAgentMLP(4, 2, 0)
    with pytest.raises(
        ValueError, match=r"num_cells must be an int or a sequence of 2 ints >= 1, got \[8\]"
    ):
        MultiAgentMLP(4, 2, 3, depth=2, num_cells=[8])
    with pytest.raises(IndexError, match="agent must be in"):
        MultiAgentMLP(4, 2, 3, num_cells=8).agent_network(3)


@pytest.mark.parametrize("stacks", [1, 3])
def test_narrow_layers_keep_an_out_major_weight_with_the_same_shape_and_values(
    stacks: int,
) -> None:
    """A layer of fewer than StackedLinear.NARROW outputs stores its weight in nn.Linear's order
    (a transposed view), wider ones in-major; shapes, values, gradients and the state_dict are
    those of the in-major layout."""
    torch.manual_seed(0)
    narrow, wide = StackedLinear(stacks, 32, 4), StackedLinear(stacks, 32, 16)
    torch.manual_seed(0)
    values = torch.empty(stacks, 32, 4).uniform_(-(32**-0.5), 32**-0.5)
    assert narrow.weight.shape == (stacks, 32, 4) and narrow.weight.stride() == (128, 1, 32)
    assert wide.weight.is_contiguous()
    torch.testing.assert_close(narrow.weight, values, rtol=0, atol=0)  # the same draw as before

    in_major = copy.deepcopy(narrow)
    in_major.weight = nn.Parameter(narrow.weight.detach().contiguous())
    x = torch.randn(stacks, 10, 32)
    torch.testing.assert_close(narrow(x), in_major(x))
    narrow(x).square().sum().backward()
    in_major(x).square().sum().backward()
    assert narrow.weight.grad is not None and in_major.weight.grad is not None
    # Adam's state follows the weight's layout: the gradient has it too (the stride of a
    # dim of size 1, which orders nothing, aside)
    layout = [st for st, n in zip(narrow.weight.stride(), narrow.weight.shape) if n > 1]
    grad_layout = [st for st, n in zip(narrow.weight.grad.stride(), narrow.weight.shape) if n > 1]
    assert grad_layout == layout
    torch.testing.assert_close(narrow.weight.grad, in_major.weight.grad)

    # checkpoints move between the layouts: a state_dict is shapes and values
    fresh = StackedLinear(stacks, 32, 4)
    fresh.load_state_dict(in_major.state_dict())
    torch.testing.assert_close(fresh.weight, narrow.weight, rtol=0, atol=0)
    assert fresh.weight.stride() == (128, 1, 32)
    buffer = io.BytesIO()
    torch.save(narrow.state_dict(), buffer)
    buffer.seek(0)
    in_major.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(in_major.weight, narrow.weight, rtol=0, atol=0)


def test_fused_adam_on_an_out_major_weight_matches_plain_adam() -> None:
    torch.manual_seed(0)
    fused_mlp = MultiAgentMLP(6, 3, 2, num_cells=8)
    plain_mlp = copy.deepcopy(fused_mlp)
    for layer in plain_mlp.layers:  # every weight contiguous, in-major
        layer.weight = nn.Parameter(layer.weight.detach().contiguous())
    fused = torch.optim.Adam(fused_mlp.parameters(), lr=1e-2, fused=True)
    plain = torch.optim.Adam(plain_mlp.parameters(), lr=1e-2, foreach=False)
    for _ in range(5):
        x = torch.randn(9, 2, 6)
        for mlp, optim in ((fused_mlp, fused), (plain_mlp, plain)):
            optim.zero_grad()
            mlp(x).square().mean().backward()
            optim.step()
    for a, b in zip(fused_mlp.parameters(), plain_mlp.parameters()):
        torch.testing.assert_close(a, b)


def test_an_input_of_another_dtype_is_named() -> None:
    for share in (False, True):
        mlp = MultiAgentMLP(4, 2, 3, share_params=share, num_cells=8)
        with pytest.raises(TypeError, match=r"expected torch\.float32 .*, got torch\.float64"):
            mlp(torch.randn(5, 3, 4, dtype=torch.float64))
        assert mlp.double()(torch.randn(5, 3, 4, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("cells", [8.0, [8.5, 4], "8", [True, 4]])
def test_num_cells_must_be_ints(cells: object) -> None:
    with pytest.raises(TypeError, match="MultiAgentMLP: num_cells must be an int or a sequence of"):
        MultiAgentMLP(4, 2, 3, depth=2, num_cells=cells)  # type: ignore[arg-type]
