"""MultiAgentCNN: shapes, per-agent parameters, the grouped, NCHW and vmap routes against
plain per-agent convnets, agent masks, gradients and bad input."""

from __future__ import annotations

import pytest
import torch

from marlkit.modules import MultiAgentCNN

SMALL = {"num_cells": [4, 5], "kernel_sizes": 3, "strides": [1, 2]}


def _cnn(**kwargs: object) -> MultiAgentCNN:
    torch.manual_seed(0)
    return MultiAgentCNN(2, 3, **{**SMALL, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("share_params", [False, True])
@pytest.mark.parametrize(
    "route",
    [{"independent_method": "grouped"}, {"independent_method": "vmap"}, {"channels_last": False}],
    ids=["grouped", "vmap", "nchw"],
)
def test_matches_per_agent_convnets(
    centralised: bool, share_params: bool, route: dict[str, object]
) -> None:
    cnn = _cnn(centralised=centralised, share_params=share_params, **route)
    x = torch.randn(2, 4, 3, 2, 11, 12)  # batch dims [2, 4]
    y = cnn(x)
    assert y.shape == (2, 4, 3, cnn.out_features(11, 12))
    flat = x.reshape(8, 3, 2, 11, 12)
    for i in range(3):
        inp = flat.reshape(8, 6, 11, 12) if centralised else flat[:, i]
        ref = cnn.agent_network(i)(inp).flatten(1).reshape(2, 4, -1)
        torch.testing.assert_close(y[..., i, :], ref, rtol=1e-5, atol=1e-5)


def test_out_features_and_default_sizes() -> None:
    cnn = MultiAgentCNN(3, 8)  # TorchRL's MultiAgentConvNet defaults: 64 -> 30 -> 13 -> 5
    assert cnn.out_features(64, 64) == 32 * 5 * 5
    assert cnn(torch.zeros(1, 8, 3, 64, 64)).shape == (1, 8, 800)
    assert cnn.convs[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_independent_agent_depends_only_on_its_own_parameters() -> None:
    for centralised in (False, True):
        cnn = _cnn(centralised=centralised)
        x = torch.randn(5, 3, 2, 9, 9)
        before = cnn(x)
        with torch.no_grad():
            for conv in cnn.convs:  # agent 1's filters: the middle third of each layer
                out = conv.out_channels // 3
                conv.weight[out : 2 * out] += 0.5
        after = cnn(x)
        changed = (after - before).abs().amax(dim=(0, 2)) > 1e-4
        assert changed.tolist() == [False, True, False]


def test_shared_parameters_are_one_function() -> None:
    cnn = _cnn(share_params=True)
    img = torch.randn(4, 1, 2, 9, 9)
    y = cnn(img.expand(4, 3, 2, 9, 9))
    torch.testing.assert_close(y[:, 0], y[:, 2])
    assert sum(p.numel() for p in cnn.parameters()) * 3 == sum(
        p.numel() for p in _cnn().parameters()
    )


def test_independent_agents_see_only_their_own_image() -> None:
    cnn = _cnn()
    x = torch.randn(4, 3, 2, 9, 9)
    x2 = x.clone()
    x2[:, 0] = torch.randn(4, 2, 9, 9)
    changed = (cnn(x2) - cnn(x)).abs().amax(dim=(0, 2)) > 0
    assert changed.tolist() == [True, False, False]


def test_centralised_mask_hides_absent_agents() -> None:
    cnn = _cnn(centralised=True)
    x = torch.randn(4, 3, 2, 9, 9)
    mask = torch.tensor([True, False, True]).expand(4, 3)
    x2 = x.clone()
    x2[:, 1] = float("nan")  # whatever an absent agent's image holds
    a, b = cnn(x, agent_mask=mask), cnn(x2, agent_mask=mask)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(cnn(x), a)  # without the mask agent 1's image counts


def test_gradients_reach_every_parameter() -> None:
    for kwargs in ({}, {"independent_method": "vmap"}, {"centralised": True}):
        cnn = _cnn(**kwargs)
        x = torch.randn(3, 3, 2, 9, 9, requires_grad=True)
        cnn(x).square().sum().backward()
        assert x.grad is not None and bool(x.grad.abs().sum() > 0)
        for name, p in cnn.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert bool(p.grad.abs().sum() > 0), name


def test_vmap_and_grouped_gradients_agree() -> None:
    a, b = _cnn(), _cnn(independent_method="vmap")
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 3, 2, 9, 9)
    a(x).sum().backward()
    b(x).sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5)


def test_bad_input() -> None:
    cnn = _cnn()
    with pytest.raises(ValueError, match=r"expected images \[\*B, n_agents=3, C=2, H, W\], got"):
        cnn(torch.zeros(4, 3, 24))
    with pytest.raises(ValueError, match=r"n_agents=3.*got \[\*B, 4, 2, 9, 9\]"):
        cnn(torch.zeros(1, 4, 2, 9, 9))
    with pytest.raises(ValueError, match="C=2"):
        cnn(torch.zeros(1, 3, 3, 9, 9))
    with pytest.raises(TypeError, match=r"expected torch.float32 images.*got torch.uint8"):
        cnn(torch.zeros(1, 3, 2, 9, 9, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"images 3x3 are too small for the kernels \(3, 3\)"):
        cnn(torch.zeros(1, 3, 2, 3, 3))
    with pytest.raises(TypeError, match="agent mask must be a bool tensor"):
        cnn(torch.zeros(1, 3, 2, 9, 9), agent_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"agent mask must have shape \[\*B, n_agents\] \[1, 3\]"):
        cnn(torch.zeros(1, 3, 2, 9, 9), agent_mask=torch.ones(1, 4, dtype=torch.bool))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="MultiAgentCNN: n_agents must be an int >= 1"):
        MultiAgentCNN(3, 0)
    with pytest.raises(ValueError, match="kernel_sizes must be an int or a sequence of 2 ints"):
        MultiAgentCNN(3, 2, num_cells=[4, 4], kernel_sizes=[3])
    with pytest.raises(ValueError, match="independent_method must be one of"):
        MultiAgentCNN(3, 2, independent_method="loop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_cells must name at least one layer"):
        MultiAgentCNN(3, 2, num_cells=[])
    with pytest.raises(IndexError, match=r"agent must be in \[0, 2\)"):
        MultiAgentCNN(3, 2).agent_network(2)
