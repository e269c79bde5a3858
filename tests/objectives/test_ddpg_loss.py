"""DDPGLoss: hand-computed actor and critic losses, gradients kept apart, MADDPG critics."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit.objectives import DDPGLoss, SoftUpdate

from ._helpers import KEYS, OBS, Central, Critic, continuous_batch, continuous_transition, critic


def _actor(weight: float) -> TensorDictModule:
    linear = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        linear.weight.fill_(weight)
    return TensorDictModule(linear, in_keys=[OBS], out_keys=[KEYS])


def _loss() -> DDPGLoss:
    return DDPGLoss(_actor(2.0), critic(Critic([1.0, 3.0])), gamma=0.5)


def test_losses_by_hand() -> None:
    td = continuous_transition()
    out = _loss()(td)
    # Q = [2.5, -1]; target actor a' = [0, 2], Q' = [0, 7]; y = [1, 5.5]
    assert out["loss_value"].item() == pytest.approx((1.5**2 + 6.5**2) / 2)
    assert out["td_error"].tolist() == [pytest.approx(4.0)]
    assert out["target_value"].item() == pytest.approx(3.25)
    # mu(o) = [2, 4]: Q = [7, 14]
    assert out["loss_actor"].item() == pytest.approx(-10.5)
    assert td["td_error"].tolist() == [pytest.approx(4.0)]
    terminated = _loss()(continuous_transition(terminated=True))
    assert terminated["target_value"].item() == pytest.approx(1.5)


def test_actor_loss_reaches_only_the_actor_and_value_loss_only_thecritic() -> None:
    loss = _loss()
    loss(continuous_transition())["loss_actor"].backward()
    (actor_weight,) = loss.actor_network.parameters()
    assert actor_weight.grad.item() == pytest.approx(-(3 * 1 + 3 * 2) / 2)  # -mean(3 o_i)
    assert all(p.grad is None for p in loss.value_network.parameters())
    actor_weight.grad = None
    loss(continuous_transition())["loss_value"].backward()
    assert actor_weight.grad is None
    assert all(p.grad is not None for p in loss.value_network.parameters())
    targets = [*loss.target_actor_network.parameters(), *loss.target_value_network.parameters()]
    assert all(p.grad is None and not p.requires_grad for p in targets)


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_centralised_critic_any_leading_dims_and_soft_update(lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    n, obs, act = 3, 4, 2
    actor = TensorDictModule(nn.Sequential(nn.Linear(obs, act), nn.Tanh()), [OBS], [KEYS])
    loss = DDPGLoss(actor, critic(Central(n, obs, act)))
    td = continuous_batch(lead, n, obs, act)
    out = loss(td)
    assert out["td_error"].shape == lead
    (out["loss_actor"] + out["loss_value"]).backward()
    before = [p.clone() for p in loss.target_value_network.parameters()]
    with torch.no_grad():
        for p in loss.value_network.parameters():
            p.add_(1.0)
    SoftUpdate(loss, tau=0.5).step()
    assert all(
        not torch.equal(a, b) for a, b in zip(before, loss.target_value_network.parameters())
    )


def test_errors_name_keys_and_shapes() -> None:
    with pytest.raises(KeyError, match=r"\('agents', 'action'\).*\[\*B, n_agents, act_dim\]"):
        _loss()(continuous_transition().exclude(KEYS))
    bad = DDPGLoss(
        _actor(1.0),
        TensorDictModule(
            nn.Linear(1, 2), in_keys=[OBS], out_keys=[("agents", "state_action_value")]
        ),
    )
    with pytest.raises(
        ValueError, match=r"'state_action_value'\) must have shape \[\*B, n_agents, 1\]"
    ):
        bad(continuous_transition())
