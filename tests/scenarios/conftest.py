"""Shared by the single-group native scenario tests (navigation, swarm)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from marlkit.envs import EnvBase


def _rollout_with(env: EnvBase, actions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Step with the given ``("agents", "action")`` values; returns the stacked observations,
    rewards and states."""
    td = env.reset()
    obs, rew, state = [td["agents", "observation"]], [], [td["state"]]
    for action in actions:
        td["agents", "action"] = action
        td = env.step(td)
        obs.append(td["next", "agents", "observation"])
        rew.append(td["next", "agents", "reward"])
        state.append(td["next", "state"])
        td = env._step_mdp(td)
    return [torch.stack(obs), torch.stack(rew), torch.stack(state)]


@pytest.fixture
def rollout_with() -> Callable[[EnvBase, list[torch.Tensor]], list[torch.Tensor]]:
    return _rollout_with
