"""MultiAgentGNN: shapes, the graphs (all pairs, radius, given), agent permutation
equivariance, absent agents, per-agent parameters, translation invariance, gradients and bad
input."""

from __future__ import annotations

import pytest
import torch

from marlkit.modules import MultiAgentGNN, full_graph, radius_graph

N, F = 5, 6


def _gnn(**kwargs: object) -> MultiAgentGNN:
    torch.manual_seed(0)
    return MultiAgentGNN(F, 3, N, **{"num_cells": 16, **kwargs})  # type: ignore[arg-type]


def test_radius_graph_against_pairwise_distances() -> None:
    pos = torch.rand(4, 2, N, 2)
    adj = radius_graph(pos, 0.5)
    assert adj.shape == (4, 2, N, N) and adj.dtype == torch.bool
    for b in range(4):
        for i in range(N):
            for j in range(N):
                near = float((pos[b, 1, i] - pos[b, 1, j]).norm()) <= 0.5
                assert bool(adj[b, 1, i, j]) == (near and i != j)
    assert (
        full_graph((2,), 3).tolist()
        == [[[False, True, True], [True, False, True]] * 1 + [[True, True, False]]] * 2
    )


@pytest.mark.parametrize("share_params", [True, False])
@pytest.mark.parametrize("aggregation", ["mean", "sum"])
def test_shapes_and_gradients(share_params: bool, aggregation: str) -> None:
    gnn = _gnn(share_params=share_params, aggregation=aggregation, position_dim=2)
    x = torch.randn(2, 3, N, F, requires_grad=True)
    y = gnn(x, positions=torch.rand(2, 3, N, 2))
    assert y.shape == (2, 3, N, 3)
    y.square().sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    for name, p in gnn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_permuting_agents_permutes_outputs_with_shared_parameters() -> None:
    gnn = _gnn(share_params=True, position_dim=2, edge_radius=0.6)
    x, pos = torch.randn(8, N, F), torch.rand(8, N, 2)
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(
        gnn(x[:, perm], positions=pos[:, perm]), gnn(x, positions=pos)[:, perm]
    )


def test_messages_follow_the_graph() -> None:
    gnn = _gnn(share_params=False)
    x = torch.randn(4, N, F)
    adj = torch.zeros(4, N, N, dtype=torch.bool)
    adj[:, 0, 1] = True  # agent 1 sends to agent 0 only
    y = gnn(x, adjacency=adj)
    x2 = x.clone()
    x2[:, 1] += 1.0
    changed = (gnn(x2, adjacency=adj) - y).abs().amax(dim=(0, 2)) > 1e-6
    assert changed.tolist() == [True, True, False, False, False]
    # all pairs by default: every agent hears agent 1
    full = (gnn(x2) - gnn(x)).abs().amax(dim=(0, 2)) > 1e-6
    assert full.all()


def test_radius_decides_who_hears_whom() -> None:
    gnn = _gnn(share_params=True, position_dim=2, edge_radius=0.3)
    x = torch.randn(1, N, F)
    pos = torch.tensor([[[0.0, 0.0], [0.2, 0.0], [5.0, 5.0], [5.1, 5.0], [9.0, 0.0]]])
    y = gnn(x, positions=pos)
    x2 = x.clone()
    x2[:, 0] += 1.0
    changed = (gnn(x2, positions=pos) - y).abs()[0].amax(-1) > 1e-6
    assert changed.tolist() == [True, True, False, False, False]


def test_translation_invariant_in_positions() -> None:
    gnn = _gnn(share_params=False, position_dim=2, edge_radius=1.0)
    x, pos = torch.randn(6, N, F), torch.rand(6, N, 2)
    torch.testing.assert_close(
        gnn(x, positions=pos + torch.tensor([3.0, -7.0])),
        gnn(x, positions=pos),
        atol=1e-5,
        rtol=1e-5,
    )


def test_absent_agents_send_nothing() -> None:
    gnn = _gnn()
    x = torch.randn(4, N, F)
    mask = torch.ones(4, N, dtype=torch.bool)
    mask[:, 2] = False
    x2 = x.clone()
    x2[:, 2] = float("nan")
    a, b = gnn(x, agent_mask=mask), gnn(x2, agent_mask=mask)
    present = [0, 1, 3, 4]
    torch.testing.assert_close(a[:, present], b[:, present])
    assert torch.isfinite(b).all()
    assert not torch.allclose(gnn(x)[:, present], a[:, present])


def test_independent_agent_depends_only_on_its_own_parameters() -> None:
    # one layer: every weight agent 3 owns acts on what agent 3 receives
    gnn = _gnn(share_params=False, depth=1)
    x = torch.randn(4, N, F)
    before = gnn(x)
    with torch.no_grad():
        for p in gnn.parameters():
            p[3] += 0.2
    changed = (gnn(x) - before).abs().amax(dim=(0, 2)) > 1e-6
    assert changed.tolist() == [False, False, False, True, False]
    # two layers: agent 3's first-layer state is a message its neighbours hear, but the
    # last layer and the head are its own
    deep = _gnn(share_params=False, depth=2)
    before = deep(x)
    with torch.no_grad():
        for p in [*deep.layers[1].parameters(), *deep.head.parameters()]:
            p[3] += 0.2
    changed = (deep(x) - before).abs().amax(dim=(0, 2)) > 1e-6
    assert changed.tolist() == [False, False, False, True, False]
    with torch.no_grad():
        for p in deep.layers[0].parameters():
            p[3] += 0.2
    assert bool(((deep(x) - before).abs()[:, 0] > 1e-6).any())


def test_bad_input() -> None:
    gnn = _gnn(position_dim=2)
    x, pos = torch.randn(4, N, F), torch.rand(4, N, 2)
    with pytest.raises(ValueError, match=r"MultiAgentGNN input: expected a tensor of shape"):
        gnn(torch.randn(4, N, F + 1), positions=pos)
    with pytest.raises(TypeError, match=r"expected torch.float32.*got torch.float64"):
        gnn(x.double(), positions=pos)
    with pytest.raises(ValueError, match=r"position_dim=2 needs positions \[\*B, n_agents=5, 2\]"):
        gnn(x)
    with pytest.raises(ValueError, match=r"positions: expected a tensor of shape"):
        gnn(x, positions=torch.rand(4, N, 3))
    with pytest.raises(ValueError, match=r"expected batch dims \[4\]"):
        gnn(x, positions=torch.rand(2, N, 2))
    with pytest.raises(TypeError, match="adjacency must be a bool tensor"):
        gnn(x, positions=pos, adjacency=torch.ones(4, N, N))
    with pytest.raises(ValueError, match=r"adjacency must have shape .*\[4, 5, 5\], got \[4, 5\]"):
        gnn(x, positions=pos, adjacency=torch.ones(4, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="agent mask must have shape"):
        gnn(x, positions=pos, agent_mask=torch.ones(4, N + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions passed, but position_dim=0"):
        _gnn()(x, positions=pos)
    radius = _gnn(position_dim=2, edge_radius=0.5)
    with pytest.raises(ValueError, match="adjacency or set edge_radius, not both"):
        radius(x, positions=pos, adjacency=torch.ones(4, N, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="edge_radius needs positions"):
        _gnn(edge_radius=0.5)
    with pytest.raises(ValueError, match="edge_radius must be"):
        _gnn(position_dim=2, edge_radius=0.0)
