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
