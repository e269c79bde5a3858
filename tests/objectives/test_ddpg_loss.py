"""DDPGLoss: hand-computed actor and critic losses, gradients kept apart, MADDPG critics."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit.modules import TanhBounds
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


# ---------------------------------------------------------------- against a saturated tanh actor
PREACT = ("agents", "action_preact")


def _tanh_actor(weight: float) -> TensorDictModule:
    """``a = tanh(w o)`` in [-1, 1], writing ``u = w o`` under ``action_preact``."""
    linear = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        linear.weight.fill_(weight)
    module = nn.Sequential(linear, TanhBounds(-1.0, 1.0, preact=True))
    return TensorDictModule(module, in_keys=[OBS], out_keys=[KEYS, PREACT])


def test_the_preact_penalty_pulls_a_saturated_actor_back() -> None:
    # o = [1, 2], w = 5: u = [5, 10], tanh saturated; Q = o + 3 a
    grads = {}
    for c in (0.0, 0.01):
        loss = DDPGLoss(_tanh_actor(5.0), critic(Critic([1.0, 3.0])), actor_preact_penalty=c)
        out = loss(continuous_transition())
        out["loss_actor"].backward()
        (weight,) = loss.actor_network.parameters()
        grads[c] = weight.grad.item()
        if c:
            assert out["loss_preact"].item() == pytest.approx(c * (25 + 100) / 2)
            assert out["preact_abs"].item() == pytest.approx(7.5)
            with torch.no_grad():  # one gradient step: the pre-tanh outputs shrink
                weight -= 1.0 * weight.grad
            assert loss.actor_network(continuous_transition())[PREACT].abs().max() < 10.0
        else:
            assert "loss_preact" not in out
    # the critic's pull through tanh'(u) is below 1e-3: the penalty's c * mean(2 u o) = 25 c
    assert abs(grads[0.0]) < 1e-3
    assert grads[0.01] - grads[0.0] == pytest.approx(0.01 * 25)
    # an actor that does not write its pre-tanh output is named
    loss = DDPGLoss(_actor(1.0), critic(Critic([1.0, 3.0])), actor_preact_penalty=0.01)
    with pytest.raises(KeyError, match="action_preact"):
        loss(continuous_transition())


def test_target_policy_smoothing_clips_the_noise_and_stays_in_bounds() -> None:
    # linear target actor a' = 2 o' = [0, 2]; bounds [-1, 1], noise std 10 clipped to 0.3:
    # a'_0 in [-0.3, 0.3], a'_1 = clamp(2 + noise) = 1; y = r + 0.5 (o' + 3 a') with r = [1, 2]
    torch.manual_seed(0)
    loss = DDPGLoss(
        _actor(2.0),
        critic(Critic([1.0, 3.0])),
        gamma=0.5,
        target_policy_noise=10.0,
        target_noise_clip=0.3,
        action_bounds=(-1.0, 1.0),
    )
    y0 = torch.tensor(
        [2 * loss(continuous_transition())["target_value"].item() - 4 for _ in range(200)]
    )
    # y_1 = 2 + 0.5 * 4 = 4 exactly (a'_1 clamped to the bound); y_0 = 1 + 1.5 a'_0
    assert y0.min() == pytest.approx(1 - 1.5 * 0.3, abs=1e-5)
    assert y0.max() == pytest.approx(1 + 1.5 * 0.3, abs=1e-5)
    assert 1 - 1.5 * 0.3 < y0.median() < 1 + 1.5 * 0.3
    # asymmetric bounds: the noise is a fraction of half the range, the action kept in them
    wide = DDPGLoss(
        _actor(2.0),
        critic(Critic([1.0, 3.0])),
        target_policy_noise=10.0,
        target_noise_clip=0.3,
        action_bounds=(torch.tensor([[0.0]]), torch.tensor([[4.0]])),
    )
    smoothed = wide._smoothed(torch.tensor([[0.0], [2.0], [4.0]]).expand(3, 100).reshape(300, 1, 1))
    assert smoothed.min() == 0.0 and smoothed.max() == 4.0
    assert (
        smoothed.reshape(3, 100) - torch.tensor([[0.0], [2.0], [4.0]])
    ).abs().max() == pytest.approx(0.6)


def test_the_delayed_actor_moves_every_dth_step_only() -> None:
    torch.manual_seed(0)
    n, obs, act = 3, 4, 2
    actor = TensorDictModule(nn.Sequential(nn.Linear(obs, act), nn.Tanh()), [OBS], [KEYS])
    loss = DDPGLoss(actor, critic(Central(n, obs, act)), actor_delay=3)
    optim = torch.optim.Adam(loss.online_parameters(), lr=0.1, fused=True)  # as the scripts
    moved = []
    for _ in range(7):
        before = [p.clone() for p in (*actor.parameters(), *loss.value_network.parameters())]
        out = loss(continuous_batch((8,), n, obs, act))
        optim.zero_grad()
        (out["loss_actor"] + out["loss_value"]).backward()
        optim.step()
        after = [*actor.parameters(), *loss.value_network.parameters()]
        changed = [not torch.equal(a, b) for a, b in zip(before, after)]
        assert all(changed[2:])  # the critic: every step
        moved.append(any(changed[:2]))
    assert moved == [True, False, False, True, False, False, True]
    assert int(loss.state_dict()["actor_calls"]) == 7  # checkpointed: a resume keeps the phase
    assert "actor_calls" not in DDPGLoss(actor, critic(Central(n, obs, act))).state_dict()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"actor_preact_penalty": -1.0}, ValueError, "actor_preact_penalty"),
        ({"target_policy_noise": float("nan")}, ValueError, "target_policy_noise"),
        ({"target_noise_clip": -0.1}, ValueError, "target_noise_clip"),
        ({"actor_delay": 0}, ValueError, "actor_delay must be an int >= 1"),
        ({"actor_delay": 1.5}, TypeError, "actor_delay"),
        ({"target_policy_noise": 0.2}, ValueError, "needs action_bounds"),
        ({"target_policy_noise": 0.2, "action_bounds": (1.0, -1.0)}, ValueError, "low < high"),
    ],
)
def test_bad_options_are_named(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        DDPGLoss(_actor(1.0), critic(Critic([1.0, 3.0])), **kwargs)
