"""SACLoss: hand-computed losses with a fixed policy, gradients kept apart, a real
probabilistic actor over any batch dims."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import (
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from torch import distributions as D
from torch import nn

from marlkit.objectives import SACLoss, SoftUpdate

from ._helpers import KEYS, OBS, Central, Critic, continuous_batch, continuous_transition, critic

LOG_PROB = ("agents", "action_log_prob")


class _FixedPolicy(nn.Module):
    """``a = w o`` with a constant log-probability ``c`` per agent."""

    def __init__(self, w: float, c: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))
        self.c = nn.Parameter(torch.tensor(c))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w * obs, self.c.expand(obs.shape[:-1])


def _loss(**kwargs: object) -> SACLoss:
    actor = TensorDictModule(_FixedPolicy(2.0, -0.5), in_keys=[OBS], out_keys=[KEYS, LOG_PROB])
    kwargs.setdefault("num_qvalue_nets", 1)
    return SACLoss(actor, critic(Critic([1.0, 3.0])), gamma=0.5, **kwargs)  # type: ignore[arg-type]


def test_losses_by_hand() -> None:
    out = _loss()(continuous_transition())
    # a' = [0, 2], Q' = [0, 7], soft value Q' + 0.5 = [0.5, 7.5]; y = [1.25, 5.75]; Q = [2.5, -1]
    assert out["loss_value"].item() == pytest.approx((1.25**2 + 6.75**2) / 2)
    assert out["td_error"].tolist() == [pytest.approx((1.25 + 6.75) / 2)]
    # a~ = [2, 4]: Q = [7, 14]; alpha log pi = -0.5
    assert out["loss_actor"].item() == pytest.approx(-11.0)
    assert out["loss_alpha"].item() == pytest.approx(0.0)  # log(alpha) = 0
    assert out["alpha"].item() == pytest.approx(1.0)
    assert out["entropy"].item() == pytest.approx(0.5)


def test_each_loss_trains_only_its_part() -> None:
    loss = _loss(num_qvalue_nets=2)
    q0, q1 = loss.qvalue_network_0, loss.qvalue_network_1
    assert not torch.equal(q0.module.linear.weight, q1.module.linear.weight)  # re-initialised
    actor_params = list(loss.actor_network.parameters())

    def grads() -> dict[str, bool]:
        return {
            "actor": any(p.grad is not None for p in actor_params),
            "q": all(p.grad is not None for p in (*q0.parameters(), *q1.parameters())),
            "alpha": loss.log_alpha.grad is not None,
        }

    for name, expected in (
        ("loss_actor", {"actor": True, "q": False, "alpha": False}),
        ("loss_value", {"actor": False, "q": True, "alpha": False}),
        ("loss_alpha", {"actor": False, "q": False, "alpha": True}),
    ):
        loss.zero_grad(set_to_none=True)
        loss(continuous_transition())[name].backward()
        assert grads() == expected, name
    # d loss_alpha / d log_alpha = -(log pi + target_entropy) = -(-0.5 - 1)
    assert loss.log_alpha.grad.item() == pytest.approx(1.5)
    targets = [
        *loss.target_qvalue_network_0.parameters(),
        *loss.target_qvalue_network_1.parameters(),
    ]
    assert all(p.grad is None for p in targets)
    assert not hasattr(loss, "target_actor_network")


class _TanhNormal(D.TransformedDistribution):
    def __init__(self, loc: torch.Tensor, scale: torch.Tensor):
        super().__init__(D.Independent(D.Normal(loc, scale), 1), [D.TanhTransform(cache_size=1)])


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_probabilistic_actor_centralisedcritic(lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    n, obs, act = 3, 4, 2
    net = TensorDictModule(
        nn.Sequential(nn.Linear(obs, 2 * act), NormalParamExtractor()),
        in_keys=[OBS],
        out_keys=[("agents", "loc"), ("agents", "scale")],
    )
    actor = ProbabilisticTensorDictSequential(
        net,
        ProbabilisticTensorDictModule(
            in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
            out_keys=[KEYS],
            distribution_class=_TanhNormal,
            return_log_prob=True,
            log_prob_key=LOG_PROB,
        ),
    )
    loss = SACLoss(actor, critic(Central(n, obs, act)))
    td = continuous_batch(lead, n, obs, act)
    out = loss(td)
    assert out["td_error"].shape == lead
    total = out["loss_actor"] + out["loss_value"] + out["loss_alpha"]
    assert torch.isfinite(total)
    total.backward()
    assert all(p.grad is not None for p in actor.parameters())
    SoftUpdate(loss, tau=0.5).step()


def test_errors() -> None:
    with pytest.raises(ValueError, match="SACLoss: num_qvalue_nets must be an int >= 1, got 0"):
        _loss(num_qvalue_nets=0)
    with pytest.raises(ValueError, match="alpha_init must be a finite number > 0"):
        _loss(alpha_init=0.0)
    actor = TensorDictModule(nn.Linear(1, 1), in_keys=[OBS], out_keys=[KEYS])  # no log-prob
    loss = SACLoss(actor, critic(Critic([1.0, 3.0])))
    with pytest.raises(KeyError, match=r"\('agents', 'action_log_prob'\).*\[\*B, n_agents\]"):
        loss(continuous_transition())


def test_extra_q_networks_of_multi_agent_mlps_start_apart() -> None:
    from marlkit.modules import StateActionValueCritic

    torch.manual_seed(0)
    actor = TensorDictModule(_FixedPolicy(2.0, -0.5), in_keys=[OBS], out_keys=[KEYS, LOG_PROB])
    value = StateActionValueCritic(2, 1, 1, centralised=True, num_cells=8)
    loss = SACLoss(actor, value, num_qvalue_nets=3)
    nets = [dict(getattr(loss, name).named_parameters()) for name in loss.q_names]
    for other in nets[1:]:
        for name, p in nets[0].items():
            assert not torch.equal(p, other[name]), name  # clipped double Q needs distinct nets
            assert other[name].stride() == p.stride(), name  # the same memory layout


def test_a_q_network_that_cannot_be_reset_is_named() -> None:
    class Raw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
            return (obs * action).sum(-1, keepdim=True) * self.w

    actor = TensorDictModule(_FixedPolicy(2.0, -0.5), in_keys=[OBS], out_keys=[KEYS, LOG_PROB])
    value = TensorDictModule(
        nn.Sequential(Raw()), in_keys=[OBS, KEYS], out_keys=[("agents", "state_action_value")]
    )
    with pytest.raises(TypeError, match=r"value_network\.module\.0 \(Raw\).*reset_parameters"):
        SACLoss(actor, value, num_qvalue_nets=2)
    SACLoss(actor, value, num_qvalue_nets=1)  # one network: nothing to re-initialise


def test_fixed_alpha_has_no_alpha_loss() -> None:
    out = _loss(fixed_alpha=True, alpha_init=0.2)(continuous_transition())
    assert out["loss_alpha"].item() == 0.0 and not out["loss_alpha"].requires_grad
    assert out["alpha"].item() == pytest.approx(0.2)
