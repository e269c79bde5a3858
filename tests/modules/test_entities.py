"""DeepSets and EntityAttention: shapes, permutation invariance (hypothesis), masked entities
change nothing, per-agent parameters, empty sets, gradients, bad input and a learning check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlkit.modules import DeepSets, EntityAttention

K, F, N = 7, 5, 3
ENCODERS = {
    "deepsets_sum": lambda share: DeepSets(F, 4, N, share_params=share, num_cells=16),
    "deepsets_mean": lambda share: DeepSets(
        F, 4, N, share_params=share, num_cells=16, pooling="mean"
    ),
    "deepsets_max": lambda share: DeepSets(
        F, 4, N, share_params=share, num_cells=16, pooling="max"
    ),
    "attention": lambda share: EntityAttention(
        F, 4, N, share_params=share, embed_dim=16, num_heads=2
    ),
    "attention_depth2": lambda share: EntityAttention(
        F, 4, N, share_params=share, embed_dim=16, num_heads=2, depth=2
    ),
    "attention_pool_only": lambda share: EntityAttention(
        F, 4, N, share_params=share, embed_dim=16, num_heads=4, depth=0
    ),
}


def _make(name: str, share: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return ENCODERS[name](share)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, N, K, F, generator=g)
    mask = torch.rand(2, 4, N, K, generator=g) > 0.3
    mask[0, 0, 1] = False  # an agent that sees nothing
    return x, mask


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.parametrize("share", [False, True])
@settings(max_examples=5, deadline=None)
@given(perm=st.permutations(list(range(K))))
def test_permutation_invariant(name: str, share: bool, perm: list[int]) -> None:
    enc = _make(name, share)
    x, mask = _data()
    y = enc(x, mask)
    assert y.shape == (2, 4, N, 4)
    torch.testing.assert_close(enc(x[..., perm, :], mask[..., perm]), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.parametrize("share", [False, True])
def test_masked_entities_change_nothing(name: str, share: bool) -> None:
    enc = _make(name, share)
    x, mask = _data()
    mask[1, 2] = mask[1, 2, 0]  # one row where every agent sees the same entities
    y = enc(x, mask)
    x2 = x.clone()
    x2[~mask] = float("nan")  # whatever a masked entity's features hold
    y2 = enc(x2, mask)
    torch.testing.assert_close(y2, y)
    # dropping the masked entities altogether: the same output for a row with a full set
    keep = mask[1, 2, 0]
    sub = enc(x[1, 2][:, keep])  # only the present entities, no mask
    torch.testing.assert_close(sub, y[1, 2], rtol=1e-5, atol=1e-5)
    y2.sum().backward()
    for p in enc.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", ["deepsets_sum", "attention"])
def test_no_mask_means_every_entity(name: str) -> None:
    enc = _make(name, False)
    x, _ = _data()
    torch.testing.assert_close(enc(x), enc(x, torch.ones(x.shape[:-1], dtype=torch.bool)))


@pytest.mark.parametrize("name", ["deepsets_sum", "deepsets_max", "attention"])
def test_empty_set_is_the_empty_encoding(name: str) -> None:
    enc = _make(name, True)
    x, mask = _data()
    y = enc(x, mask)
    other = enc(torch.randn_like(x), mask)
    torch.testing.assert_close(y[0, 0, 1], other[0, 0, 1])  # sees nothing either way
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", ["deepsets_mean", "attention"])
def test_independent_agent_depends_only_on_its_own_parameters(name: str) -> None:
    enc = _make(name, False)
    x, mask = _data()
    before = enc(x, mask)
    with torch.no_grad():
        for p in enc.parameters():
            if p.dim() >= 1 and p.shape[0] == N:  # a stacked parameter: perturb agent 2's
                p[2] += 0.3
    changed = (enc(x, mask) - before).abs().amax(dim=(0, 1, 3)) > 1e-5
    assert changed.tolist() == [False, False, True]


@pytest.mark.parametrize("name", ["deepsets_sum", "attention"])
def test_shared_parameters_are_one_function(name: str) -> None:
    enc = _make(name, True)
    x, mask = _data()
    x[:, :, 1], mask[:, :, 1] = x[:, :, 0], mask[:, :, 0]
    y = enc(x, mask)
    torch.testing.assert_close(y[:, :, 0], y[:, :, 1])


def test_bad_input() -> None:
    enc = EntityAttention(F, 4, N, embed_dim=8, num_heads=2)
    x, mask = _data()
    with pytest.raises(ValueError, match=r"expected entities \[\*B, n_agents=3, k, features=5\]"):
        enc(torch.zeros(2, N, F))
    with pytest.raises(ValueError, match=r"got \[2, 4, 3, 7, 6\]"):
        enc(torch.zeros(2, 4, N, K, 6))
    with pytest.raises(TypeError, match=r"expected torch.float32 entities.*got torch.float64"):
        enc(x.double(), mask)
    with pytest.raises(TypeError, match=r"entity mask must be a bool tensor.*got torch.float32"):
        enc(x, mask.float())
    with pytest.raises(ValueError, match=r"entity mask must have shape \[\*B, n_agents, k\]"):
        enc(x, mask[..., :-1])
    ds = DeepSets(F, 4, N)
    with pytest.raises(ValueError, match=r"entity mask must have shape .*\[2, 4, 3, 7\], got"):
        ds(x, mask[0])
    with pytest.raises(ValueError, match="embed_dim must be a multiple of num_heads=3"):
        EntityAttention(F, 4, N, embed_dim=8, num_heads=3)
    with pytest.raises(ValueError, match="pooling must be one of"):
        DeepSets(F, 4, N, pooling="median")  # type: ignore[arg-type]


def test_deepsets_learns_a_masked_sum() -> None:
    """A cheap sanity check: the sum of the first feature over the present entities."""
    torch.manual_seed(0)
    enc = DeepSets(2, 1, 2, num_cells=16, embed_dim=16, pooling="sum")
    opt = torch.optim.Adam(enc.parameters(), lr=2e-2)
    x, mask = torch.randn(128, 2, 6, 2), torch.rand(128, 2, 6) > 0.4
    target = (x[..., 0] * mask).sum(-1, keepdim=True)

    def loss() -> torch.Tensor:
        return (enc(x, mask) - target).square().mean()

    start = loss().item()
    for _ in range(80):
        opt.zero_grad()
        value = loss()
        value.backward()
        opt.step()
    assert loss().item() < 0.1 * start
