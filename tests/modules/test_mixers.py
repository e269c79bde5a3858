"""VDNMixer and QMixer: sums, monotonicity, shapes for any batch dims, errors naming keys."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.modules import QMixer, VDNMixer


def _td(values: torch.Tensor, state: torch.Tensor | None = None) -> TensorDict:
    lead = values.shape[:-2]
    data = {("agents", "chosen_action_value"): values}
    if state is not None:
        data["state"] = state
    return TensorDict(data, lead)


def test_vdn_is_the_sum() -> None:
    values = torch.randn(7, 4, 1)
    out = VDNMixer(4)(_td(values))["chosen_action_value"]
    assert out.shape == (7, 1)
    torch.testing.assert_close(out, values.sum(-2))


@pytest.mark.parametrize("lead", [(), (5,), (2, 3)])
def test_qmixer_shapes_any_leading_dims(lead: tuple[int, ...]) -> None:
    mixer = QMixer([6], 8, n_agents=3)
    out = mixer(_td(torch.randn(*lead, 3, 1), torch.randn(*lead, 6)))["chosen_action_value"]
    assert out.shape == (*lead, 1)
    assert VDNMixer(3)(_td(torch.randn(*lead, 3, 1)))["chosen_action_value"].shape == (*lead, 1)


def test_qmixer_is_monotonic_in_every_agent_value() -> None:
    torch.manual_seed(0)
    mixer = QMixer([10], 16, n_agents=4)
    values = torch.randn(256, 4, 1, requires_grad=True)
    out = mixer(_td(values, torch.randn(256, 10)))["chosen_action_value"]
    (grad,) = torch.autograd.grad(out.sum(), values)
    assert bool((grad >= 0).all())
    assert bool((grad > 0).any())


def test_qmixer_on_observations_when_the_env_has_no_state() -> None:
    mixer = QMixer([3, 5], 8, n_agents=3, state_key=("agents", "observation"))
    td = _td(torch.randn(4, 3, 1))
    td["agents", "observation"] = torch.randn(4, 3, 5)
    assert mixer(td)["chosen_action_value"].shape == (4, 1)
    assert ("agents", "observation") in mixer.in_keys


def test_qmixer_matches_the_formula() -> None:
    torch.manual_seed(2)
    mixer = QMixer(4, 3, n_agents=2)
    q, s = torch.randn(5, 2, 1), torch.randn(5, 4)
    w1 = mixer.hyper_w_1(s).abs().view(5, 2, 3)
    hidden = torch.nn.functional.elu((q.transpose(-1, -2) @ w1).squeeze(1) + mixer.hyper_b_1(s))
    expected = (hidden * mixer.hyper_w_final(s).abs()).sum(-1, keepdim=True) + mixer.V(s)
    torch.testing.assert_close(mixer(_td(q, s))["chosen_action_value"], expected)


def test_errors_name_the_key_and_expected_shape() -> None:
    with pytest.raises(KeyError, match=r"\('agents', 'chosen_action_value'\).*\[\*B, 3, 1\]"):
        VDNMixer(3)(TensorDict({}, [2]))
    with pytest.raises(ValueError, match=r"'chosen_action_value'\) must have shape \[\*B, 3, 1\]"):
        VDNMixer(3)(_td(torch.randn(2, 4, 1)))
    mixer = QMixer([6], 8, n_agents=3)
    with pytest.raises(KeyError, match=r"'state'.*\[\*B, 6\]"):
        mixer(_td(torch.randn(2, 3, 1)))
    with pytest.raises(ValueError, match=r"'state' must have shape \[\*B, 6\], got \(2, 5\)"):
        mixer(_td(torch.randn(2, 3, 1), torch.randn(2, 5)))
    td = TensorDict({("agents", "chosen_action_value"): torch.randn(2, 3, 1)}, [])
    td["state"] = torch.randn(4, 6)
    with pytest.raises(ValueError, match="batch dims"):
        mixer(td)
    with pytest.raises(ValueError, match="n_agents must be an int >= 1"):
        VDNMixer(0)
    with pytest.raises(ValueError, match="mixing_embed_dim"):
        QMixer([6], 0, n_agents=2)


def test_qmixer_with_two_layer_hypernetworks_is_monotonic() -> None:
    """EPyMARL's default mixer: ``Linear(state, embed) -> ReLU -> Linear`` for both weight
    hypernetworks; the weights stay non-negative, so dQ_tot / dq_i >= 0 still."""
    torch.manual_seed(0)
    mixer = QMixer([10], 16, n_agents=4, hypernet_layers=2, hypernet_embed=24)
    w1, w_final = mixer.hyper_w_1, mixer.hyper_w_final
    assert isinstance(w1, torch.nn.Sequential) and isinstance(w_final, torch.nn.Sequential)
    assert [tuple(p.shape) for p in w1.parameters()] == [(24, 10), (24,), (64, 24), (64,)]
    assert [tuple(p.shape) for p in w_final.parameters()] == [(24, 10), (24,), (16, 24), (16,)]
    assert isinstance(mixer.hyper_b_1, torch.nn.Linear)  # the bias stays one layer
    values = torch.randn(256, 4, 1, requires_grad=True)
    out = mixer(_td(values, 3 * torch.randn(256, 10)))["chosen_action_value"]
    assert out.shape == (256, 1)
    (grad,) = torch.autograd.grad(out.sum(), values)
    assert bool((grad >= 0).all()) and bool((grad > 0).any())
    lead = (2, 3)
    out = mixer(_td(torch.randn(*lead, 4, 1), torch.randn(*lead, 10)))["chosen_action_value"]
    assert out.shape == (*lead, 1)


def test_qmixer_default_is_the_one_layer_mixer_bit_for_bit() -> None:
    """``hypernet_layers=1`` (the default) builds the layers the QMixer always built, in the
    same order: the same seed gives the same weights (hypernet_embed unused)."""
    nn = torch.nn
    torch.manual_seed(3)
    before = [nn.Linear(6, 8 * 3), nn.Linear(6, 8), nn.Linear(6, 8)]
    before += [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))]
    expected = [t for m in before for t in m.state_dict().values()]
    for kwargs in ({}, {"hypernet_layers": 1, "hypernet_embed": 5}):
        torch.manual_seed(3)
        mixer = QMixer([6], 8, n_agents=3, **kwargs)
        assert list(mixer.state_dict()) == [
            "hyper_w_1.weight", "hyper_w_1.bias", "hyper_w_final.weight", "hyper_w_final.bias",
            "hyper_b_1.weight", "hyper_b_1.bias", "V.0.weight", "V.0.bias", "V.2.weight",
            "V.2.bias",
        ]  # fmt: skip
        for a, b in zip(mixer.state_dict().values(), expected, strict=True):
            assert torch.equal(a, b)


def test_qmixer_refuses_bad_hypernetwork_layers() -> None:
    with pytest.raises(ValueError, match=r"QMixer: hypernet_layers must be an int in \[1, 2\]"):
        QMixer([6], 8, n_agents=2, hypernet_layers=3)
    with pytest.raises(ValueError, match=r"QMixer: hypernet_layers must be an int in \[1, 2\]"):
        QMixer([6], 8, n_agents=2, hypernet_layers=0)
    with pytest.raises(TypeError, match="QMixer: hypernet_layers must be an int"):
        QMixer([6], 8, n_agents=2, hypernet_layers=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="QMixer: hypernet_embed must be an int >= 1, got 0"):
        QMixer([6], 8, n_agents=2, hypernet_layers=2, hypernet_embed=0)


def test_qmixer_state_scale_divides_what_the_hypernetworks_read() -> None:
    torch.manual_seed(4)
    plain = QMixer([6], 8, n_agents=3, hypernet_layers=2)
    scaled = QMixer([6], 8, n_agents=3, hypernet_layers=2, state_scale=7)
    scaled.load_state_dict(plain.state_dict())
    q, s = torch.randn(5, 3, 1), 7 * torch.rand(5, 6)
    torch.testing.assert_close(
        scaled(_td(q, s))["chosen_action_value"], plain(_td(q, s / 7))["chosen_action_value"]
    )
    with pytest.raises(ValueError, match="QMixer: state_scale must be a finite number > 0"):
        QMixer([6], 8, n_agents=3, state_scale=0.0)
    with pytest.raises(ValueError, match="QMixer: state_scale must be a finite number > 0"):
        QMixer([6], 8, n_agents=3, state_scale=float("inf"))
