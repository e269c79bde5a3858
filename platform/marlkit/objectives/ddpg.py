"""``DDPGLoss``: deterministic policy gradients per agent of a group, MADDPG (a centralised
critic) or IDDPG (a per-agent one) by the critic."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from marlkit.data.keys import DEFAULT_GROUP, STATE_ACTION_VALUE, NestedKey
from marlkit.objectives._common import LossFunction
from marlkit.objectives._per_agent import AgentTDKeys, AgentTDLoss

__all__ = ["DDPGLoss"]


@dataclasses.dataclass
class _DDPGKeys(AgentTDKeys):
    """The keys :class:`DDPGLoss` reads and writes (``set_keys`` changes them): those of
    :class:`~marlkit.objectives.AgentTDKeys` (``action`` is the continuous
    ``[*B, n, act_dim]`` the actor writes) and

    Attributes:
        state_action_value: what the critic writes, ``(group, "state_action_value")``
            ``[*B, n, 1]``.
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (*AgentTDKeys.GROUP_FIELDS, "state_action_value")

    state_action_value: NestedKey = STATE_ACTION_VALUE


class DDPGLoss(AgentTDLoss):
    """DDPG (Lillicrap et al. 2016) for the agents of one group: MADDPG (Lowe et al. 2017) when
    the critic sees every agent's observation and action, IDDPG when it sees each agent's own.

    For transitions ``[*B]`` with each present agent ``i``::

        y_i          = r_i + gamma * (1 - terminated_i) * Q'_i(o', mu'(o'))
        loss_value   = mean_{B, i present} w * distance(Q_i(o, a), y_i)
        loss_actor   = - mean_{B, i present} Q_i(o, mu(o))     (critic parameters detached)

    with ``mu'``, ``Q'`` the target networks (``delay_value``) and ``w`` the importance weights
    (``"priority_weight"`` ``[*B]``) when present. Truncated episodes bootstrap; only
    termination stops it. ``loss_actor`` gives gradients only to the actor, ``loss_value`` only
    to the critic: sum them for one optimiser, or use one per network.

    Args:
        actor_network: writes ``(group, "action")`` ``[*B, n, act_dim]`` from the group's
            observations (deterministic; exploration noise belongs to the collecting policy).
        value_network: writes ``(group, "state_action_value")`` ``[*B, n, 1]`` from
            observations and ``(group, "action")`` (centralised or not: its choice).
        group: the agent group.
        gamma: the discount.
        delay_value: keep target copies of both networks (see :class:`SoftUpdate`).
        loss_function: ``"l2"``, ``"smooth_l1"`` or ``"l1"`` for the critic.

    Returns (``forward``):
        A TensorDict ``[]`` with ``loss_actor``, ``loss_value``, ``td_error`` ``[*B]`` (also
        written into the input under ``priority``), ``q_value`` and ``target_value``.

    Raises:
        KeyError, ValueError (when called): a missing key or a tensor of the wrong shape; the
            message names the key and the expected shape.
    """

    tensor_keys: _DDPGKeys
    actor_network: TensorDictModuleBase
    value_network: TensorDictModuleBase

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        value_network: TensorDictModuleBase,
        *,
        group: str = DEFAULT_GROUP,
        gamma: float = 0.99,
        delay_value: bool = True,
        loss_function: LossFunction = "l2",
    ):
        super().__init__(
            _DDPGKeys,
            actor_network,
            group=group,
            gamma=gamma,
            delay_value=delay_value,
            loss_function=loss_function,
            action_space="continuous",
        )
        self._add_network("actor_network", actor_network)
        self._add_network("value_network", value_network)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The actor and critic losses on a batch of transitions ``[*B]``."""
        self._read(tensordict, self.tensor_keys.action, "[*B, n_agents, act_dim]")
        td = tensordict.clone(False)
        q = self._critic_value(td, self.value_network)
        with torch.no_grad():
            nxt = self._next(td).clone(False)
            self._target("actor_network")(nxt)
            next_value = self._critic_value(nxt, self._target("value_network"))
            target = self._agent_target(nxt, next_value)
        terms = self._agent_loss(tensordict, q, target)

        # The actor's loss through the critic with its parameters detached: its gradient
        # reaches the actor only.
        policy_td = tensordict.clone(False)
        self.actor_network(policy_td)
        q_policy = self._critic_value(policy_td, self.value_network, detach=True)
        loss_actor = -self._agent_mean(tensordict, q_policy)
        return TensorDict(
            {
                "loss_actor": loss_actor,
                "loss_value": terms.pop("loss"),
                **terms,
            },
            [],
        )
