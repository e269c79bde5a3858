"""QMixerLoss: hand-computed values, gradients only into online networks, masks, keys."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.modules import QMixer, QValueActor, VDNMixer
from marlkit.objectives import QMixerLoss

from ._helpers import identity_actor, random_batch, transition

# Agent 0 takes action 1 (q = 2), agent 1 action 2 (q = 3): Q_tot = 5 (VDN).
# Next step: max q = 4 and 2: VDN next = 6. Team reward = mean(1, 5) = 3. gamma = 0.5.
OBS = [[1.0, 2.0, 0.0], [0.0, 1.0, 3.0]]
NEXT_OBS = [[0.0, 4.0, 1.0], [2.0, 0.0, 1.0]]


def _vdn_loss(**kwargs: object) -> QMixerLoss:
    kwargs.setdefault("gamma", 0.5)
    return QMixerLoss(identity_actor(3), VDNMixer(2), **kwargs)  # type: ignore[arg-type]


def test_one_step_by_hand_bootstraps() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    out = _vdn_loss()(td)
    # y = 3 + 0.5 * 6 = 6; (5 - 6)^2 = 1
    assert out["loss"].item() == pytest.approx(1.0)
    assert out["td_error"].tolist() == [pytest.approx(1.0)]
    assert out["q_value"].item() == pytest.approx(5.0)
    assert out["target_value"].item() == pytest.approx(6.0)
    assert td["td_error"].tolist() == [pytest.approx(1.0)]  # written for priorities


def test_termination_stops_bootstrap_truncation_does_not() -> None:
    terminated = _vdn_loss()(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0], terminated=True))
    assert terminated["target_value"].item() == pytest.approx(3.0)
    assert terminated["loss"].item() == pytest.approx(4.0)
    truncated = _vdn_loss()(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0], truncated=True))
    assert truncated["target_value"].item() == pytest.approx(6.0)


def test_reward_reduction_and_root_reward() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    assert _vdn_loss(reward_reduction="sum")(td)["target_value"].item() == pytest.approx(9.0)
    td["next", "reward"] = torch.tensor([[10.0]])
    assert _vdn_loss()(td)["target_value"].item() == pytest.approx(13.0)


def test_next_action_mask_restricts_the_max() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    mask[0, 0, 1] = False  # agent 0 cannot take its best next action (4): max becomes 1
    td["next", "agents", "action_mask"] = mask
    assert _vdn_loss()(td)["target_value"].item() == pytest.approx(3.0 + 0.5 * 3.0)


def test_absent_agents_count_zero_in_the_mix_and_the_reward() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    td["agents", "mask"] = torch.tensor([[True, False]])
    td["next", "agents", "mask"] = torch.tensor([[True, False]])
    out = _vdn_loss()(td)
    assert out["q_value"].item() == pytest.approx(2.0)
    # reward: agent 0 only (1); next: agent 0 only (4)
    assert out["target_value"].item() == pytest.approx(1.0 + 0.5 * 4.0)


def test_agents_leaving_by_truncation_keep_their_next_value_terminated_ones_do_not() -> None:
    # PettingZoo's time limit removes every agent at the last step: next mask false, truncated.
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0], truncated=True)
    td["next", "agents", "mask"] = torch.tensor([[False, False]])
    # reward mean 3; next values from the final observations: 4 and 2
    assert _vdn_loss()(td)["target_value"].item() == pytest.approx(3.0 + 0.5 * 6.0)
    # Agent 1 terminated (the team goes on): its next value leaves the mix.
    td["next", "agents", "terminated"] = torch.tensor([[[False], [True]]])
    assert _vdn_loss()(td)["target_value"].item() == pytest.approx(3.0 + 0.5 * 4.0)
    bad = td.clone()
    bad["next", "agents", "terminated"] = torch.zeros(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\('next', 'agents', 'terminated'\) must have shape"):
        _vdn_loss()(bad)


def test_gradient_by_hand_and_only_into_online_networks() -> None:
    loss = _vdn_loss()
    loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))["loss"].backward()
    weight = loss.local_value_network.module.module.weight
    expected = torch.zeros(3, 3)
    expected[1] = -2.0 * torch.tensor(OBS[0])  # dL/dQ_tot = 2 (5 - 6)
    expected[2] = -2.0 * torch.tensor(OBS[1])
    torch.testing.assert_close(weight.grad, expected)
    for p in loss.target_local_value_network.parameters():
        assert p.grad is None and not p.requires_grad


def test_qmixer_gradients_reach_mixer_not_targets() -> None:
    torch.manual_seed(0)
    actor = QValueActor(torch.nn.Linear(4, 3), n_actions=3)
    loss = QMixerLoss(actor, QMixer([6], 8, n_agents=2), gamma=0.9)
    loss(random_batch((16,), 2, 4, 3, state_dim=6))["loss"].backward()
    assert all(p.grad is not None for p in loss.mixer_network.parameters())
    assert all(p.grad is not None for p in loss.local_value_network.parameters())
    targets = [
        *loss.target_mixer_network.parameters(),
        *loss.target_local_value_network.parameters(),
    ]
    assert targets and all(p.grad is None for p in targets)
    online = {id(p) for p in loss.online_parameters()}
    assert online == {id(p) for p in (*actor.parameters(), *loss.mixer_network.parameters())}


def test_double_q_picks_online_argmax_evaluates_with_target() -> None:
    loss = _vdn_loss(double_dqn=True)
    with torch.no_grad():  # target swaps actions 1 and 2
        loss.target_local_value_network.module.module.weight.copy_(torch.eye(3)[[0, 2, 1]])
    out = loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))
    # online argmax: agent 0 -> 1, agent 1 -> 0; target values there: obs[2] = 1, obs[0] = 2
    assert out["target_value"].item() == pytest.approx(3.0 + 0.5 * 3.0)
    plain = _vdn_loss(double_dqn=False)
    plain.load_state_dict(loss.state_dict())
    # target's own max: agent 0 max(0, 1, 4) = 4, agent 1 max(2, 1, 0) = 2
    assert plain(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))["target_value"].item() == (
        pytest.approx(3.0 + 0.5 * 6.0)
    )


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_any_leading_batch_dims_and_priority_weights(lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    loss = QMixerLoss(QValueActor(torch.nn.Linear(4, 3), n_actions=3), QMixer([6], 8, 2))
    td = random_batch(lead, 2, 4, 3, state_dim=6)
    out = loss(td)
    assert out["td_error"].shape == lead
    weight = torch.zeros(lead)
    weight.view(-1)[0] = 1.0
    td["priority_weight"] = weight
    first = (out["td_error"].reshape(-1)[0] ** 2).item()
    assert loss(td)["loss"].item() == pytest.approx(first, rel=1e-5)


def test_smooth_l1() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0], terminated=True)  # error 2
    assert _vdn_loss(loss_function="smooth_l1")(td)["loss"].item() == pytest.approx(1.5)


def test_group_a_never_touches_group_b() -> None:
    torch.manual_seed(0)
    red = QValueActor(torch.nn.Linear(4, 3), group="red", n_actions=3)
    blue = QValueActor(torch.nn.Linear(4, 3), group="blue", n_actions=3)
    td = random_batch((8,), 2, 4, 3, group="red", state_dim=6)
    other = random_batch((8,), 2, 4, 3, group="blue")
    td["blue"] = other["blue"]
    td["next", "blue"] = other["next", "blue"]
    loss = QMixerLoss(red, QMixer([6], 8, 2, group="red"), group="red")
    out = loss(td)
    out["loss"].backward()
    assert all(p.grad is None for p in blue.parameters())
    td["blue", "observation"] += 100.0
    td["next", "blue", "reward"] += 100.0
    torch.testing.assert_close(loss(td)["loss"], out["loss"])


def test_errors_name_keys_and_shapes() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    with pytest.raises(KeyError, match=r"\('agents', 'action'\).*\[\*B, n_agents\]"):
        _vdn_loss()(td.exclude(("agents", "action")))
    # named as the batch spells it, with its "next" (it said ('agents', 'reward'))
    missing = r"no key \('next', 'agents', 'reward'\).*\[\*B, n_agents, 1\]"
    with pytest.raises(KeyError, match=missing):
        _vdn_loss()(td.exclude(("next", "agents", "reward")))
    bad = td.clone()
    bad["next", "reward"] = torch.zeros(1, 2)
    with pytest.raises(
        ValueError,
        match=r"\('next', 'reward'\) \(the team reward\) must have shape \(1, 1\) \(\[\*B, 1\]\)",
    ):
        _vdn_loss()(bad)
    bad = td.clone()
    bad["agents", "action"] = torch.zeros(1, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"categorical \('agents', 'action'\) must have shape"):
        _vdn_loss()(bad)
    with pytest.raises(KeyError, match="'next' TensorDict"):
        _vdn_loss()(td.exclude("next"))
    with pytest.raises(ValueError, match=r"unknown key name 'rewrd'.*Did you mean: reward"):
        _vdn_loss().set_keys(rewrd="r")
    with pytest.raises(
        ValueError, match=r"QMixerLoss: gamma must be a finite number in \[0, 1\], got 1\.5"
    ):
        _vdn_loss(gamma=1.5)
    with pytest.raises(ValueError, match="loss_function must be one of"):
        _vdn_loss(loss_function="l3")
    with pytest.raises(TypeError, match="TensorDict module"):
        QMixerLoss(torch.nn.Linear(3, 3), VDNMixer(2))  # type: ignore[arg-type]


def test_set_keys_renames_what_is_read() -> None:
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    td["next", "agents", "team_bonus"] = td["next", "agents", "reward"]
    td = td.exclude(("next", "agents", "reward"))
    loss = _vdn_loss().set_keys(group_reward=("agents", "team_bonus"), priority="prio")
    loss(td)
    assert td.get("prio", None) is not None


def test_without_target_networks() -> None:
    loss = _vdn_loss(delay_value=False)
    assert not hasattr(loss, "target_local_value_network")
    assert loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0]))["loss"].item() == pytest.approx(1.0)
    assert isinstance(loss(transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])), TensorDict)


def test_a_taken_action_the_mask_forbids_is_refused() -> None:
    # It learned Q_tot from a move the env never allows, where ClipPPOLoss refused the same.
    td = transition(OBS, [1, 2], NEXT_OBS, [1.0, 5.0])
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    mask[0, 1, 2] = False  # agent 1 took action 2
    td["agents", "action_mask"] = mask
    message = (
        r"QMixerLoss: \('agents', 'action'\) holds actions that \('agents', 'action_mask'\) "
        r"forbids at 1 agent step\(s\) \(first: batch index \[0\], agent 1, action 2\)"
    )
    with pytest.raises(ValueError, match=message):
        _vdn_loss()(td)
    td["agents", "mask"] = torch.tensor([[True, False]])  # agent 1 absent: its action is moot
    td["next", "agents", "mask"] = torch.tensor([[True, False]])
    assert _vdn_loss()(td)["q_value"].item() == pytest.approx(2.0)
    mask[0, 1] = False  # no action allowed at all (a dead agent's row): nothing to refuse
    td["agents", "mask"] = torch.tensor([[True, True]])
    td["agents", "action_mask"] = mask
    assert _vdn_loss()(td)["q_value"].item() == pytest.approx(5.0)
