"""Tiny transitions and networks for the value-loss tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict

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
