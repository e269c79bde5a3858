"""DQNLoss (IQL): per-agent targets by hand, double Q, masks, batch dims, errors."""

from __future__ import annotations

import pytest
import torch

from marlkit.objectives import DQNLoss

from ._helpers import identity_actor, random_batch, transition

OBS = [[1.0, 2.0, 0.0], [0.0, 1.0, 3.0]]
NEXT_OBS = [[0.0, 4.0, 1.0], [2.0, 0.0, 1.0]]


def _loss(**kwargs: object) -> DQNLoss:
    kwargs.setdefault("gamma", 0.5)
    return DQNLoss(identity_actor(3), **kwargs)  # type: ignore[arg-type]


def test_per_agent_targets_by_hand() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    out = _loss()(td)
    # agent 0: q 2, y = 1 + 0.5 * 4 = 3; agent 1: q 3, y = 5 + 0.5 * 2 = 6
    assert out["loss"].item() == pytest.approx((1.0 + 9.0) / 2)
    assert out["td_error"].tolist() == [pytest.approx(2.0)]
    assert out["q_value"].item() == pytest.approx(2.5)
    assert out["target_value"].item() == pytest.approx(4.5)


def test_double_q_online_argmax_target_value() -> None:
    loss = _loss()
    assert loss.double_dqn
    with torch.no_grad():
        loss.target_value_network.module.module.weight.copy_(torch.eye(3)[[0, 2, 1]])
    out = loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))
    # online argmax 1 and 0; the target's values there: 1 and 2
    assert out["target_value"].item() == pytest.approx(((1 + 0.5) + (5 + 1.0)) / 2)
    plain = _loss(double_dqn=False)
    plain.load_state_dict(loss.state_dict())
    out = plain(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))
    assert out["target_value"].item() == pytest.approx(((1 + 2.0) + (5 + 1.0)) / 2)


def test_termination_per_agent_and_truncation() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0], truncated=True)
    assert _loss()(td)["target_value"].item() == pytest.approx(4.5)
    td["next", "agents", "terminated"] = torch.tensor([[[True], [False]]])
    assert _loss()(td)["target_value"].item() == pytest.approx((1.0 + 6.0) / 2)
    td = td.exclude(("next", "agents", "terminated"))
    td["next", "terminated"] = torch.tensor([[True]])  # root termination for every agent
    assert _loss()(td)["target_value"].item() == pytest.approx(3.0)


def test_absent_agents_are_left_out() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    td["agents", "mask"] = torch.tensor([[True, False]])
    out = _loss()(td)
    assert out["loss"].item() == pytest.approx(1.0)
    assert out["td_error"].tolist() == [pytest.approx(1.0)]
    # Agent 0 leaves the game at this step. By truncation (PettingZoo's time limit removes
    # every agent): it bootstraps from its final observation, its next mask does not decide.
    td["agents", "mask"] = torch.tensor([[True, True]])
    td["next", "agents", "mask"] = torch.tensor([[False, True]])
    td["next", "agents", "truncated"] = torch.tensor([[[True], [False]]])
    assert _loss()(td)["target_value"].item() == pytest.approx((3.0 + 6.0) / 2)
    # By termination: no bootstrap.
    td["next", "agents", "terminated"] = torch.tensor([[[True], [False]]])
    assert _loss()(td)["target_value"].item() == pytest.approx((1.0 + 6.0) / 2)


def test_gradients_only_into_the_online_network() -> None:
    loss = _loss()
    loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))["loss"].backward()
    weight = loss.value_network.module.module.weight
    expected = torch.zeros(3, 3)
    expected[1] = 2 * (2 - 3) / 2 * torch.tensor(OBS[0])
    expected[2] = 2 * (3 - 6) / 2 * torch.tensor(OBS[1])
    torch.testing.assert_close(weight.grad, expected)
    assert all(p.grad is None for p in loss.target_value_network.parameters())


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_any_leading_batch_dims(lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    out = DQNLoss(identity_actor(3))(random_batch(lead, 4, 3, 3))
    assert out["td_error"].shape == lead
    assert out["loss"].shape == ()


def test_errors_name_keys_and_shapes() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    bad = td.clone()
    bad["next", "agents", "reward"] = torch.zeros(1, 2, 2)
    with pytest.raises(ValueError, match=r"\('next', 'agents', 'reward'\) must have shape"):
        _loss()(bad)
    with pytest.raises(KeyError, match=r"'terminated'.*\[\*B, 1\] bool"):
        _loss()(td.exclude(("next", "agents", "terminated"), ("next", "terminated")))
    bad = td.clone()
    bad["agents", "mask"] = torch.ones(1, 2, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\('agents', 'mask'\) must have shape \[\*B, 2\] bool"):
        _loss()(bad)
    bad = td.clone()
    bad["next", "agents", "action_mask"] = torch.ones(1, 2, 4, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"'action_mask'\) must have shape \[\*B, n(_agents)?, 3\]"
    ):
        _loss()(bad)


def test_a_taken_action_the_mask_forbids_is_refused() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    mask[0, 0, 1] = False  # agent 0 took action 1
    td["agents", "action_mask"] = mask
    with pytest.raises(ValueError, match=r"DQNLoss: .* forbids at 1 agent step\(s\) .*agent 0"):
        _loss()(td)
    mask[0, 0, 1] = True
    _loss()(td)  # allowed now
