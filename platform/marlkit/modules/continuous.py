"""Parts for continuous-action off-policy methods (MADDPG/IDDPG, MASAC/ISAC).

* :class:`StateActionValueCritic`: ``Q(o, a)`` per agent, ``(group, "state_action_value")``
  ``[*B, n, 1]``, reading each agent's observation and action (IDDPG, ISAC) or every agent's
  (``centralised=True``: MADDPG, MASAC).
* :class:`TanhBounds`: the last layer of a deterministic actor, ``tanh`` into the action
  bounds (TorchRL's ``TanhDelta``).
* :class:`AdditiveGaussian`: exploration for a deterministic actor: Gaussian noise on the
  action while collecting (exploration mode ``"random"``), none in ``"deterministic"`` mode,
  its scale annealed by :meth:`AdditiveGaussian.step` like :class:`~marlkit.modules.EGreedy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.data.exploration import exploration_mode
from marlkit.data.keys import (
    ACTION,
    DEFAULT_GROUP,
    OBSERVATION,
    STATE_ACTION_VALUE,
    NestedKey,
)
from marlkit.modules._checks import get_tensor, key_name
from marlkit.modules.activations import Tanh
from marlkit.modules.mlp import MultiAgentMLP

__all__ = ["AdditiveGaussian", "StateActionValueCritic", "TanhBounds"]


def _bounds(low: torch.Tensor | float, high: torch.Tensor | float) -> tuple[torch.Tensor, ...]:
    lo = torch.as_tensor(low, dtype=torch.float32).clone()
    hi = torch.as_tensor(high, dtype=torch.float32).clone()
    if lo.dim() > 2 or hi.dim() > 2:  # an env-batched spec's bounds: [num_envs, n, act_dim]
        raise ValueError(
            "the action bounds must broadcast to one env's [n_agents, act_dim], got shapes "
            f"{list(lo.shape)} and {list(hi.shape)}: pass one env's bounds (spec.low[0], "
            "spec.high[0] for a batch of envs)"
        )
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        raise ValueError("the action bounds must be finite")
    if (lo >= hi).any():
        raise ValueError(f"need low < high everywhere, got low={lo.tolist()}, high={hi.tolist()}")
    return lo, hi


class TanhBounds(nn.Module):
    """``x`` ``[*B, n, act_dim]`` -> ``low + (tanh(x) + 1) (high - low) / 2``: into the bounds.

    Args:
        low, high: the action bounds, numbers or tensors broadcastable to ``[n, act_dim]``
            (e.g. one env's ``spec.low`` / ``spec.high``).
        preact: return ``(action, x)``: the pre-tanh input too, for a module with two
            out_keys, ``(group, "action")`` and ``(group, "action_preact")`` (what
            :class:`~marlkit.objectives.DDPGLoss`'s ``actor_preact_penalty`` reads).

    Raises:
        ValueError: bounds that are not finite or not ``low < high``.
    """

    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self, low: torch.Tensor | float, high: torch.Tensor | float, *, preact: bool = False
    ):
        super().__init__()
        lo, hi = _bounds(low, high)
        self.register_buffer("low", lo)
        self.register_buffer("high", hi)
        self.preact = bool(preact)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        action = self.low + (torch.tanh(x) + 1) * (self.high - self.low) / 2
        return (action, x) if self.preact else action


class _ObsAction(nn.Module):
    def __init__(self, mlp: MultiAgentMLP, act_dim: int):
        super().__init__()
        self.mlp = mlp
        self.act_dim = act_dim

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        if action.shape[-1] != self.act_dim or action.shape[:-1] != observation.shape[:-1]:
            raise ValueError(
                f"StateActionValueCritic: expected actions [*B, n, {self.act_dim}] next to the "
                f"observations {list(observation.shape)}, got {list(action.shape)}"
            )
        return self.mlp(torch.cat([observation, action], -1))


class StateActionValueCritic(TensorDictModule):
    """``Q(o, a)`` per agent: reads ``(group, "observation")`` ``[*B, n, obs_dim]`` and
    ``(group, "action")`` ``[*B, n, act_dim]``, writes ``(group, "state_action_value")``
    ``[*B, n, 1]`` (what :class:`~marlkit.objectives.DDPGLoss` and
    :class:`~marlkit.objectives.SACLoss` read).

    Args:
        n_agents, obs_dim, act_dim: the group's size, one agent's observation and action.
        group: the agent group.
        centralised: each agent's value reads every agent's observation and action
            (MADDPG, MASAC) instead of its own (IDDPG, ISAC).
        share_params: one network for all agents (``False``: one per agent, batched).
        depth, num_cells, activation: the :class:`MultiAgentMLP`.
    """

    def __init__(
        self,
        n_agents: int,
        obs_dim: int,
        act_dim: int,
        *,
        group: str = DEFAULT_GROUP,
        centralised: bool = False,
        share_params: bool = True,
        depth: int = 2,
        num_cells: int | Sequence[int] = 256,
        activation: type[nn.Module] = Tanh,
    ):
        mlp = MultiAgentMLP(
            obs_dim + act_dim,
            1,
            n_agents,
            centralised=centralised,
            share_params=share_params,
            depth=depth,
            num_cells=num_cells,
            activation=activation,
        )
        super().__init__(
            _ObsAction(mlp, act_dim),
            in_keys=[(group, OBSERVATION), (group, ACTION)],
            out_keys=[(group, STATE_ACTION_VALUE)],
        )


class AdditiveGaussian(TensorDictModuleBase):
    """Gaussian exploration noise for a deterministic policy.

    In exploration mode ``"random"`` (what collectors use) the action becomes
    ``clamp(a + sigma * (high - low) / 2 * N(0, 1), low, high)``; in ``"deterministic"`` mode
    (evaluation) it is left alone. ``sigma`` goes linearly from ``sigma_init`` to ``sigma_end``
    over ``annealing_num_steps`` steps counted by :meth:`step` (computed from the count, so it
    lands on ``sigma_end``); ``sigma`` and the count are buffers, so they travel with the
    policy's weights to collector workers and into checkpoints.

    Args:
        action_key: the action to perturb, ``[*B, n, act_dim]``.
        low, high: the action bounds (broadcastable to ``[n, act_dim]``).
        sigma_init, sigma_end: the noise scale, as a fraction of half the action range.
        annealing_num_steps: steps (frames) from ``sigma_init`` to ``sigma_end``.

    Raises:
        ValueError: ``sigma`` values negative, ``annealing_num_steps < 1``, bad bounds.
    """

    sigma: torch.Tensor
    steps_done: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        low: torch.Tensor | float,
        high: torch.Tensor | float,
        *,
        action_key: NestedKey = (DEFAULT_GROUP, ACTION),
        sigma_init: float = 1.0,
        sigma_end: float = 0.1,
        annealing_num_steps: int = 1000,
    ):
        super().__init__()
        owner = "AdditiveGaussian"
        sigma_init = check_real("sigma_init", sigma_init, strict=False, owner=owner)
        sigma_end = check_real("sigma_end", sigma_end, strict=False, owner=owner)
        steps = check_int("annealing_num_steps", annealing_num_steps, low=1, owner=owner)
        lo, hi = _bounds(low, high)
        self.action_key = action_key
        keys: list[Any] = [action_key]
        self.in_keys, self.out_keys = keys, list(keys)
        self.sigma_init, self.sigma_end = sigma_init, sigma_end
        self.annealing_num_steps = steps
        self.register_buffer("low", lo)
        self.register_buffer("high", hi)
        self.register_buffer("sigma", torch.tensor(self.sigma_init))
        self.register_buffer("steps_done", torch.tensor(0, dtype=torch.int64))

    def step(self, frames: int = 1) -> None:
        """Anneal ``sigma`` by ``frames`` steps.

        Raises:
            TypeError, ValueError: ``frames`` that is not an int ``>= 0``.
        """
        self.steps_done += check_int(f"{type(self).__name__}.step frames", frames, low=0)
        done = min(int(self.steps_done) / self.annealing_num_steps, 1.0)
        self.sigma.fill_(self.sigma_init + (self.sigma_end - self.sigma_init) * done)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if exploration_mode() != "random" or float(self.sigma) == 0.0:
            return tensordict
        action = get_tensor(tensordict, self.action_key, "AdditiveGaussian", "[*B, n, act_dim]")
        if not action.dtype.is_floating_point:
            raise ValueError(
                f"AdditiveGaussian: {key_name(self.action_key)!r} must be continuous (a float "
                f"tensor), got {action.dtype}: noise is for continuous actions"
            )
        try:
            torch.broadcast_shapes(action.shape, self.low.shape)
        except RuntimeError:  # bounds of another action size: torch's broadcast error before
            raise ValueError(
                f"AdditiveGaussian: {key_name(self.action_key)!r} of shape {list(action.shape)} "
                f"does not fit the bounds of shape {list(self.low.shape)} ([n, act_dim])"
            ) from None
        half = (self.high - self.low) / 2
        noisy = action + torch.randn_like(action) * self.sigma * half
        tensordict.set(self.action_key, torch.maximum(torch.minimum(noisy, self.high), self.low))
        return tensordict

    def extra_repr(self) -> str:
        return (
            f"action_key={self.action_key!r}, sigma={float(self.sigma):.3g} "
            f"({self.sigma_init} -> {self.sigma_end} over {self.annealing_num_steps})"
        )
