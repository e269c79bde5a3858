"""Per-agent TD learning (IQL's DQN, MADDPG / IDDPG's critic): each agent its own reward,
termination and target, absent agents left out."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import NEXT, REWARD, TERMINATED, NestedKey
from marlkit.modules._checks import check_trailing
from marlkit.objectives._common import (
    ValueKeys,
    ValueLoss,
    distance,
    sample_weights,
    sum_after,
)

__all__ = ["AgentTDKeys", "AgentTDLoss"]


@dataclasses.dataclass
class AgentTDKeys(ValueKeys):
    """:class:`ValueKeys` and those of per-agent targets.

    Attributes:
        reward: the agents' rewards (under ``"next"``) ``[*B, n, 1]``.
        terminated: the agents' termination (under ``"next"``) ``[*B, n, 1]`` bool; where
            missing, ``root_terminated`` ``[*B, 1]`` for every agent.
        root_terminated: ``"terminated"`` (under ``"next"``).
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (*ValueKeys.GROUP_FIELDS, "reward", "terminated")

    reward: NestedKey = REWARD
    terminated: NestedKey = TERMINATED
    root_terminated: NestedKey = TERMINATED


class AgentTDLoss(ValueLoss):
    """A value loss whose TD targets are per agent (subclasses implement ``forward``)."""

    NEXT_READS: ClassVar[tuple[str, ...]] = ("reward", "terminated", "root_terminated")

    def _terminated(self, nxt: TensorDictBase, n: int) -> torch.Tensor:
        keys = self.tensor_keys
        name = type(self).__name__
        terminated = nxt.get(keys.terminated, None)
        if terminated is None:
            root = self._read_next(
                nxt, keys.root_terminated, f"[*B, 1] bool (or {keys.terminated!r} [*B, n, 1])"
            )
            check_trailing(
                root, (NEXT, keys.root_terminated), (1,), name, "[*B, 1] bool", boolean=True
            )
            return root.unsqueeze(-2).expand(*root.shape[:-1], n, 1)
        check_trailing(
            terminated, (NEXT, keys.terminated), (n, 1), name, f"[*B, {n}, 1] bool", boolean=True
        )
        return terminated

    @torch.no_grad()
    def _agent_target(self, nxt: TensorDictBase, next_value: torch.Tensor) -> torch.Tensor:
        """``r_i + gamma * bootstrap_i * next_value_i`` ``[*B, n, 1]``: no bootstrap where the
        agent terminated.

        Truncation bootstraps, also when the agent leaves the game with it: an agent present
        at a step has a next observation (its final one when it leaves), so its next step's
        ``mask`` does not decide; PettingZoo's time limit removes every agent at the last step,
        and that step's targets bootstrap from the final observations. Agents absent at the
        step itself are left out of the loss."""
        n = next_value.shape[-2]
        reward = self._read_next(nxt, self.tensor_keys.reward, f"[*B, {n}, 1]")
        check_trailing(
            reward, (NEXT, self.tensor_keys.reward), (n, 1), type(self).__name__, f"[*B, {n}, 1]"
        )
        bootstrap = ~self._terminated(nxt, n)
        return reward + self.gamma * bootstrap.to(next_value.dtype) * next_value

    def _critic_value(
        self, td: TensorDictBase, critic: torch.nn.Module, *, detach: bool = False
    ) -> torch.Tensor:
        """Run ``critic`` on ``td`` (in place) and return its ``state_action_value`` key
        ``[*B, n, 1]`` (losses with a critic). ``detach``: with the critic's parameters
        detached, so that a gradient through it reaches only its inputs (the actor)."""
        if detach:
            params = {name: p.detach() for name, p in critic.named_parameters()}
            torch.func.functional_call(critic, params, (td,))
        else:
            critic(td)
        key = self.tensor_keys.state_action_value
        value = self._read(td, key, "[*B, n_agents, 1]")
        check_trailing(value, key, (1,), type(self).__name__, "[*B, n_agents, 1]")
        return value

    def _agent_mean(self, tensordict: TensorDictBase, values: torch.Tensor) -> torch.Tensor:
        """The mean of ``values`` ``[*B, n, 1]`` over the present agents of ``tensordict``."""
        present = self._present(tensordict, values.shape[-2])
        if present is None:
            return values.mean()
        mask = present.to(values.dtype)
        return (values * mask).sum() / mask.sum().clamp_min(1.0)

    def _agent_loss(
        self, tensordict: TensorDictBase, pred: torch.Tensor, target: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The loss over present agents (importance-weighted per sample), and ``td_error``
        ``[*B]`` (mean over present agents, written into ``tensordict``), ``q_value``,
        ``target_value`` (means over present agents); with ``separate_dims``, one of each of
        the terms but ``td_error`` per index of those dims.

        Args:
            pred: ``[*B, n, 1]``, differentiable.
            target: ``[*B, n, 1]``.
        """
        keys = self.tensor_keys
        present = self._present(tensordict, pred.shape[-2])
        mask = torch.ones_like(pred) if present is None else present.to(pred.dtype)
        weight = mask
        sample_weight = sample_weights(
            tensordict, keys.priority_weight, pred.shape[:-2], type(self).__name__
        )
        if sample_weight is not None:
            weight = weight * sample_weight.to(pred.dtype)[..., None, None]
        keep = self._check_separate(tensordict)  # with separate_dims, the terms keep them
        dist = distance(pred, target, self.loss_function)
        loss = sum_after(dist * weight, keep) / sum_after(weight, keep).clamp_min(1e-12)
        with torch.no_grad():
            per_sample = mask.sum((-2, -1)).clamp_min(1.0)
            td_error = ((pred - target).abs() * mask).sum((-2, -1)) / per_sample
            count = sum_after(mask, keep).clamp_min(1.0)
            q_value = sum_after(pred * mask, keep) / count
            target_value = sum_after(target * mask, keep) / count
        tensordict.set(keys.priority, td_error)
        return {
            "loss": loss,
            "td_error": td_error,
            "q_value": q_value,
            "target_value": target_value,
        }
