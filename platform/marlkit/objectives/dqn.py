"""``DQNLoss``: independent Q-learning (IQL) per agent of a group, double Q by default."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from marlkit.data.keys import DEFAULT_GROUP, NEXT, REWARD, TERMINATED, NestedKey
from marlkit.modules._checks import check_trailing, chosen_value
from marlkit.objectives._common import LossFunction, ValueKeys, ValueLoss, distance

__all__ = ["DQNLoss"]


@dataclasses.dataclass
class _DQNKeys(ValueKeys):
    """The keys :class:`DQNLoss` reads and writes (``set_keys`` changes them): those of
    :class:`~marlkit.objectives.ValueKeys` (absent agents are left out of the loss, and an
    agent absent at the next step does not bootstrap) and

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


class DQNLoss(ValueLoss):
    """Per-agent DQN on one group: independent Q-learning (IQL) with a shared or per-agent
    Q-network, double Q (van Hasselt et al. 2016) by default.

    For each present agent ``i`` of each transition (any leading batch dims ``B``)::

        y_i   = r_i + gamma * (1 - terminated_i) * q'_i(o'_i, argmax_a q_i(o'_i, a))
        loss  = sum_{B, i present} w * distance(q_i(o_i, a_i), y_i) / sum_{B, i present} w

    with ``q'`` the target network (``delay_value``), the argmax over the next step's allowed
    actions, and ``w`` the importance weights (``"priority_weight"`` ``[*B]``) when present.
    ``double_dqn=False`` takes ``max_a q'`` instead. Truncated episodes bootstrap; only
    termination stops it.

    Args:
        value_network: writes ``(group, "action_value")`` ``[*B, n, A]`` (a
            :class:`~marlkit.modules.QValueActor`).
        group: the agent group.
        gamma: the discount.
        delay_value: keep a target copy of the network (see :class:`SoftUpdate`).
        double_dqn: online argmax, target evaluation.
        loss_function: ``"l2"``, ``"smooth_l1"`` or ``"l1"``.

    Returns (``forward``):
        A TensorDict ``[]`` with ``loss``, ``td_error`` ``[*B]`` (mean over present agents of
        ``|q - y|``, also written into the input under ``priority``), ``q_value`` and
        ``target_value`` (means over present agents), detached.

    Raises:
        KeyError, ValueError (when called): a missing key or a tensor of the wrong shape; the
            message names the key and the expected shape.
    """

    tensor_keys: _DQNKeys
    value_network: TensorDictModuleBase

    def __init__(
        self,
        value_network: TensorDictModuleBase,
        *,
        group: str = DEFAULT_GROUP,
        gamma: float = 0.99,
        delay_value: bool = True,
        double_dqn: bool = True,
        loss_function: LossFunction = "l2",
        action_space: Literal["categorical", "one_hot"] = "categorical",
    ):
        super().__init__(
            _DQNKeys,
            value_network,
            group=group,
            gamma=gamma,
            delay_value=delay_value,
            loss_function=loss_function,
            action_space=action_space,
        )
        self.double_dqn = bool(double_dqn)
        self._add_network("value_network", value_network)

    def _terminated(self, nxt: TensorDictBase, n: int) -> torch.Tensor:
        keys = self.tensor_keys
        terminated = nxt.get(keys.terminated, None)
        if terminated is None:
            root = self._read(
                nxt, keys.root_terminated, f"[*B, 1] bool (or {keys.terminated!r} [*B, n, 1])"
            )
            check_trailing(root, (NEXT, keys.root_terminated), (1,), "DQNLoss", "[*B, 1] bool")
            return root.unsqueeze(-2).expand(*root.shape[:-1], n, 1)
        check_trailing(terminated, (NEXT, keys.terminated), (n, 1), "DQNLoss", f"[*B, {n}, 1]")
        return terminated

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions ``[*B]`` (see the class docstring)."""
        keys = self.tensor_keys
        action = self._read(tensordict, keys.action, "[*B, n_agents] (or one-hot)")
        td = tensordict.clone(False)
        values = self._action_values(td, self.value_network)
        chosen = chosen_value(values, action, self.action_space, "DQNLoss", keys.action)
        n = values.shape[-2]
        nxt = self._next(td)
        with torch.no_grad():
            next_value = self._next_value(nxt.clone(False), "value_network", self.double_dqn)
            reward = self._read(nxt, keys.reward, f"[*B, {n}, 1]")
            check_trailing(reward, (NEXT, keys.reward), (n, 1), "DQNLoss", f"[*B, {n}, 1]")
            bootstrap = ~self._terminated(nxt, n)
            next_present = self._present(nxt, n)
            if next_present is not None:
                bootstrap = bootstrap & next_present
            target = reward + self.gamma * bootstrap.to(chosen.dtype) * next_value

        present = self._present(tensordict, n)
        weight = torch.ones_like(chosen) if present is None else present.to(chosen.dtype)
        per_sample = weight.sum((-2, -1)).clamp_min(1.0)  # present agents per transition [*B]
        sample_weight = tensordict.get(keys.priority_weight, None) if keys.priority_weight else None
        if sample_weight is not None:
            weight = weight * sample_weight.to(chosen.dtype)[..., None, None]
        dist = distance(chosen, target, self.loss_function)
        loss = (dist * weight).sum() / weight.sum().clamp_min(1e-12)
        with torch.no_grad():
            mask = torch.ones_like(chosen) if present is None else present.to(chosen.dtype)
            td_error = ((chosen - target).abs() * mask).sum((-2, -1)) / per_sample
            count = mask.sum().clamp_min(1.0)
            q_value = (chosen * mask).sum() / count
            target_value = (target * mask).sum() / count
        tensordict.set(keys.priority, td_error)
        return TensorDict(
            {"loss": loss, "td_error": td_error, "q_value": q_value, "target_value": target_value},
            [],
        )
