"""``DQNLoss``: independent Q-learning (IQL) per agent of a group, double Q by default."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from marlkit.data.keys import DEFAULT_GROUP
from marlkit.modules._checks import check_taken_allowed, chosen_value
from marlkit.objectives._common import DiscreteKeys, LossFunction
from marlkit.objectives._per_agent import AgentTDKeys, AgentTDLoss

__all__ = ["DQNLoss"]


@dataclasses.dataclass
class _DQNKeys(AgentTDKeys, DiscreteKeys):
    """The keys :class:`DQNLoss` reads and writes (``set_keys`` changes them): those of
    :class:`~marlkit.objectives.DiscreteKeys` and :class:`~marlkit.objectives.AgentTDKeys`
    (absent agents are left out of the loss; an agent that terminates does not bootstrap,
    one that leaves the game by truncation does, from its final observation)."""

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (
        *DiscreteKeys.GROUP_FIELDS,
        "reward",
        "terminated",
    )


class DQNLoss(AgentTDLoss):
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
        separate_dims: the first this many batch dims index independent problems (the seeds
            of a stack, :mod:`marlkit.train.seeds`): the terms keep them (``loss`` ``[K]``,
            each seed's own), the means run over the other dims only.

    Returns (``forward``):
        A TensorDict ``[]`` (with ``separate_dims``, those dims) with ``loss``, ``td_error``
        ``[*B]`` (mean over present agents of
        ``|q - y|``, also written into the input under ``priority``), ``q_value`` and
        ``target_value`` (means over present agents), detached.

    Raises:
        KeyError, ValueError (when called): a missing key or a tensor of the wrong shape; the
            message names the key and the expected shape.
    """

    tensor_keys: _DQNKeys
    NEXT_READS: ClassVar[tuple[str, ...]] = (*AgentTDLoss.NEXT_READS, "action_mask")
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
        separate_dims: int = 0,
    ):
        super().__init__(
            _DQNKeys,
            value_network,
            group=group,
            gamma=gamma,
            delay_value=delay_value,
            loss_function=loss_function,
            action_space=action_space,
            separate_dims=separate_dims,
        )
        self.double_dqn = bool(double_dqn)
        self._add_network("value_network", value_network)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions ``[*B]`` (see the class docstring)."""
        keys = self.tensor_keys
        keep = self._check_separate(tensordict)
        action = self._read(tensordict, keys.action, "[*B, n_agents] (or one-hot)")
        td = tensordict.clone(False)
        values = self._action_values(td, self.value_network)
        chosen = chosen_value(values, action, self.action_space, "DQNLoss", keys.action)
        allowed = self._allowed(tensordict, values.shape[-1])
        check_taken_allowed(
            action,
            allowed,
            self.action_space,
            "DQNLoss",
            keys.action,
            keys.action_mask,
            self._present(tensordict, values.shape[-2]),
        )
        with torch.no_grad():
            next_value = self._next_value(
                self._next(td).clone(False), "value_network", self.double_dqn, sequence=td
            )
            target = self._agent_target(self._next(td), next_value)
        return TensorDict(
            self._agent_loss(tensordict, chosen, target), tensordict.batch_size[:keep]
        )
