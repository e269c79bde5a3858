"""DDPGLoss: hand-computed actor and critic losses, gradients kept apart, MADDPG critics."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit.objectives import DDPGLoss, SoftUpdate

OBS, KEYS = ("agents", "observation"), ("agents", "action")


class _Critic(nn.Module):
    """``Q(o, a) = w . [o, a]`` per agent (no bias)."""

    def __init__(self, w: list[float]):
        super().__init__()
        self.linear = nn.Linear(len(w), 1, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([w]))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([obs, action], -1))


class _Central(nn.Module):
    """MADDPG: every agent's value from all agents' observations and actions."""

    def __init__(self, n: int, obs: int, act: int):
        super().__init__()
        self.n = n
        self.net = nn.Linear(n * (obs + act), n)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        joint = torch.cat([obs, action], -1).flatten(-2)
        return self.net(joint).unsqueeze(-1)


def _actor(weight: float) -> TensorDictModule:
    linear = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        linear.weight.fill_(weight)
    return TensorDictModule(linear, in_keys=[OBS], out_keys=[KEYS])


def _critic(module: nn.Module) -> TensorDictModule:
    return TensorDictModule(
        module, in_keys=[OBS, KEYS], out_keys=[("agents", "state_action_value")]
    )


def _transition(terminated: bool = False) -> TensorDict:
    return TensorDict(
        {
            "agents": TensorDict(
                {
                    "observation": torch.tensor([[[1.0], [2.0]]]),
                    "action": torch.tensor([[[0.5], [-1.0]]]),
                },
                [1, 2],
            ),
            "next": TensorDict(
                {
                    "agents": TensorDict(
                        {
                            "observation": torch.tensor([[[0.0], [1.0]]]),
                            "reward": torch.tensor([[[1.0], [2.0]]]),
                        },
                        [1, 2],
                    ),
                    "terminated": torch.tensor([[terminated]]),
                },
                [1],
            ),
        },
        [1],
    )


def _loss() -> DDPGLoss:
    return DDPGLoss(_actor(2.0), _critic(_Critic([1.0, 3.0])), gamma=0.5)


def test_losses_by_hand() -> None:
    td = _transition()
    out = _loss()(td)
    # Q = [2.5, -1]; target actor a' = [0, 2], Q' = [0, 7]; y = [1, 5.5]
    assert out["loss_value"].item() == pytest.approx((1.5**2 + 6.5**2) / 2)
    assert out["td_error"].tolist() == [pytest.approx(4.0)]
    assert out["target_value"].item() == pytest.approx(3.25)
    # mu(o) = [2, 4]: Q = [7, 14]
    assert out["loss_actor"].item() == pytest.approx(-10.5)
    assert td["td_error"].tolist() == [pytest.approx(4.0)]
    terminated = _loss()(_transition(terminated=True))
    assert terminated["target_value"].item() == pytest.approx(1.5)


def test_actor_loss_reaches_only_the_actor_and_value_loss_only_the_critic() -> None:
    loss = _loss()
    loss(_transition())["loss_actor"].backward()
    (actor_weight,) = loss.actor_network.parameters()
    assert actor_weight.grad.item() == pytest.approx(-(3 * 1 + 3 * 2) / 2)  # -mean(3 o_i)
    assert all(p.grad is None for p in loss.value_network.parameters())
    actor_weight.grad = None
    loss(_transition())["loss_value"].backward()
    assert actor_weight.grad is None
    assert all(p.grad is not None for p in loss.value_network.parameters())
    targets = [*loss.target_actor_network.parameters(), *loss.target_value_network.parameters()]
    assert all(p.grad is None and not p.requires_grad for p in targets)


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_centralised_critic_any_leading_dims_and_soft_update(lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    n, obs, act = 3, 4, 2
    actor = TensorDictModule(nn.Sequential(nn.Linear(obs, act), nn.Tanh()), [OBS], [KEYS])
    loss = DDPGLoss(actor, _critic(_Central(n, obs, act)))
    step = lambda: TensorDict({OBS: torch.randn(*lead, n, obs)}, list(lead))  # noqa: E731
    td = step()
    td[KEYS] = torch.rand(*lead, n, act) * 2 - 1
    td["next"] = step()
    td["next", "agents", "reward"] = torch.randn(*lead, n, 1)
    td["next", "terminated"] = torch.zeros(*lead, 1, dtype=torch.bool)
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
        _loss()(_transition().exclude(KEYS))
    bad = DDPGLoss(
        _actor(1.0),
        TensorDictModule(
            nn.Linear(1, 2), in_keys=[OBS], out_keys=[("agents", "state_action_value")]
        ),
    )
    with pytest.raises(
        ValueError, match=r"'state_action_value'\) must have shape \[\*B, n_agents, 1\]"
    ):
        bad(_transition())
