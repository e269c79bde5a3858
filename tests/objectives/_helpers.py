"""Tiny transitions and networks for the value-loss tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit.modules import QValueActor


def identity_actor(n_actions: int, group: str = "agents") -> QValueActor:
    """A Q-network ``q = W obs`` with ``W = I`` (so action values are the observation)."""
    linear = torch.nn.Linear(n_actions, n_actions, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(n_actions))
    return QValueActor(linear, group=group, n_actions=n_actions)


def transition(
    obs: list[list[float]],
    action: list[int],
    next_obs: list[list[float]],
    reward: list[float],
    *,
    terminated: bool = False,
    truncated: bool = False,
    group: str = "agents",
) -> TensorDict:
    """One transition ``[1]`` of ``len(action)`` agents (no root reward, as native scenarios)."""
    n = len(action)
    done = torch.tensor([[terminated or truncated]])
    nxt = {
        group: TensorDict(
            {
                "observation": torch.tensor([next_obs]),
                "reward": torch.tensor([reward]).reshape(1, n, 1),
                "terminated": torch.full((1, n, 1), terminated),
            },
            [1, n],
        ),
        "done": done,
        "terminated": torch.tensor([[terminated]]),
        "truncated": torch.tensor([[truncated]]),
    }
    return TensorDict(
        {
            group: TensorDict(
                {"observation": torch.tensor([obs]), "action": torch.tensor([action])}, [1, n]
            ),
            "next": TensorDict(nxt, [1]),
        },
        [1],
    )


def random_batch(
    batch: tuple[int, ...],
    n: int,
    obs_dim: int,
    n_actions: int,
    *,
    group: str = "agents",
    state_dim: int | None = None,
) -> TensorDict:
    """Random transitions ``[*batch]`` with masks, terminations and (optionally) a state."""

    def step() -> dict[str, object]:
        inner = TensorDict(
            {
                "observation": torch.randn(*batch, n, obs_dim),
                "action_mask": torch.ones(*batch, n, n_actions, dtype=torch.bool),
            },
            [*batch, n],
        )
        out: dict[str, object] = {group: inner}
        if state_dim is not None:
            out["state"] = torch.randn(*batch, state_dim)
        return out

    td = TensorDict(step(), list(batch))
    td[group, "action"] = torch.randint(n_actions, (*batch, n))
    nxt = TensorDict(step(), list(batch))
    nxt[group, "reward"] = torch.randn(*batch, n, 1)
    nxt[group, "terminated"] = torch.zeros(*batch, n, 1, dtype=torch.bool)
    nxt["terminated"] = torch.rand(*batch, 1) < 0.2
    nxt["done"] = nxt["terminated"].clone()
    td["next"] = nxt
    return td


# ---------------------------------------------------------------- continuous actions
OBS, KEYS = ("agents", "observation"), ("agents", "action")


class Critic(nn.Module):
    """``Q(o, a) = w . [o, a]`` per agent (no bias)."""

    def __init__(self, w: list[float]):
        super().__init__()
        self.linear = nn.Linear(len(w), 1, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([w]))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([obs, action], -1))


class Central(nn.Module):
    """MADDPG: every agent's value from all agents' observations and actions."""

    def __init__(self, n: int, obs: int, act: int):
        super().__init__()
        self.n = n
        self.net = nn.Linear(n * (obs + act), n)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        joint = torch.cat([obs, action], -1).flatten(-2)
        return self.net(joint).unsqueeze(-1)


def critic(module: nn.Module) -> TensorDictModule:
    return TensorDictModule(
        module, in_keys=[OBS, KEYS], out_keys=[("agents", "state_action_value")]
    )


def continuous_transition(terminated: bool = False) -> TensorDict:
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


def continuous_batch(lead: tuple[int, ...], n: int, obs: int, act: int) -> TensorDict:
    """Random continuous-action transitions ``[*lead]``: actions in ``[-1, 1]``."""

    def step() -> TensorDict:
        return TensorDict({OBS: torch.randn(*lead, n, obs)}, list(lead))

    td = step()
    td[KEYS] = torch.rand(*lead, n, act) * 2 - 1
    td["next"] = step()
    td["next", "agents", "reward"] = torch.randn(*lead, n, 1)
    td["next", "terminated"] = torch.zeros(*lead, 1, dtype=torch.bool)
    return td
