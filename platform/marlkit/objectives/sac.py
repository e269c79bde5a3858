"""``SACLoss``: soft actor-critic per agent of a group (MASAC with a centralised critic, ISAC
with a per-agent one), twin Q-networks and automatic temperature."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import ClassVar, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.data.exploration import set_exploration
from marlkit.data.keys import ACTION_LOG_PROB, DEFAULT_GROUP, STATE_ACTION_VALUE, NestedKey
from marlkit.modules._checks import check_trailing
from marlkit.objectives._common import LossFunction
from marlkit.objectives._per_agent import AgentTDKeys, AgentTDLoss

__all__ = ["SACLoss"]


@dataclasses.dataclass
class _SACKeys(AgentTDKeys):
    """The keys :class:`SACLoss` reads and writes (``set_keys`` changes them): those of
    :class:`~marlkit.objectives.AgentTDKeys` (``action`` is continuous, ``[*B, n, act_dim]``)
    and

    Attributes:
        state_action_value: what each Q-network writes, ``[*B, n, 1]``.
        log_prob: what the actor writes with its sample, ``(group, "action_log_prob")``
            ``[*B, n]``.
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (
        *AgentTDKeys.GROUP_FIELDS,
        "state_action_value",
        "log_prob",
    )

    state_action_value: NestedKey = STATE_ACTION_VALUE
    log_prob: NestedKey = ACTION_LOG_PROB


def _reset(module: nn.Module, path: str = "value_network") -> nn.Module:
    """``module`` with freshly initialised parameters: a module with ``reset_parameters``
    draws all of its own (its sub-modules are not reset again, so a recurrent cell keeps its
    own initialisation); the others pass the reset down to their children.

    Raises:
        TypeError: a module holds parameters of its own and cannot reset them; the copy would
            start equal to the original, and the clipped double Q would take the minimum of
            twin networks.
    """
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
        return module
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise TypeError(
            f"SACLoss: {path} ({type(module).__name__}) holds the parameters {own} and has no "
            "reset_parameters(), so the extra Q-networks (num_qvalue_nets > 1) would start as "
            "exact copies of the first; give that module a reset_parameters() method"
        )
    for name, child in module.named_children():
        _reset(child, f"{path}.{name}")
    return module


class SACLoss(AgentTDLoss):
    """SAC (Haarnoja et al. 2018) for the agents of one group, with ``num_qvalue_nets``
    Q-networks (clipped double Q) and a learned temperature ``alpha``.

    For transitions ``[*B]``, each present agent ``i``, ``a' ~ pi(o')`` and ``a~ ~ pi(o)``
    (reparameterised)::

        y_i         = r_i + gamma * (1 - terminated_i) * (min_j Q'_j(o', a') - alpha log pi(a'|o'))
        loss_value  = sum_j mean_{B, i present} w * distance(Q_j(o, a), y_i)
        loss_actor  = mean_{B, i present} alpha log pi(a~|o) - min_j Q_j(o, a~)   (Q detached)
        loss_alpha  = - mean_{B, i present} log(alpha) (log pi(a~|o) + target_entropy)

    ``loss_actor`` trains only the actor, ``loss_value`` only the Q-networks, ``loss_alpha``
    only ``log_alpha``: sum them for one optimiser. Truncated episodes bootstrap.

    Args:
        actor_network: a probabilistic actor writing a reparameterised sample
            ``(group, "action")`` ``[*B, n, act_dim]`` and its ``(group, "action_log_prob")``
            ``[*B, n]`` (e.g. ``tensordict.nn.ProbabilisticTensorDictSequential`` with
            ``return_log_prob=True``); run in exploration mode ``"random"``.
        value_network: writes ``(group, "state_action_value")`` ``[*B, n, 1]`` from
            observations and actions (centralised or not); the other Q-networks are copies of
            it, re-initialised.
        group: the agent group.
        gamma: the discount.
        num_qvalue_nets: Q-networks (>= 1; 2 is SAC's clipped double Q).
        alpha_init: the first temperature (> 0).
        fixed_alpha: keep ``alpha`` fixed (``loss_alpha`` is then 0).
        target_entropy: ``"auto"`` (``-act_dim``) or a number.
        delay_value: target copies of the Q-networks (see :class:`SoftUpdate`).
        loss_function: ``"l2"``, ``"smooth_l1"`` or ``"l1"`` for the Q-networks.

    Returns (``forward``):
        A TensorDict ``[]`` with ``loss_actor``, ``loss_value``, ``loss_alpha``, ``alpha``,
        ``entropy`` (mean ``-log pi``), ``td_error`` ``[*B]`` (of the first Q-network, also
        written into the input under ``priority``), ``q_value`` and ``target_value``.

    Raises:
        ValueError: a bad count or temperature; when called, a tensor of the wrong shape.
        KeyError (when called): a missing key; messages name the key and the expected shape.
    """

    tensor_keys: _SACKeys
    actor_network: TensorDictModuleBase

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        value_network: TensorDictModuleBase,
        *,
        group: str = DEFAULT_GROUP,
        gamma: float = 0.99,
        num_qvalue_nets: int = 2,
        alpha_init: float = 1.0,
        fixed_alpha: bool = False,
        target_entropy: float | Literal["auto"] = "auto",
        delay_value: bool = True,
        loss_function: LossFunction = "l2",
    ):
        super().__init__(
            _SACKeys,
            actor_network,
            group=group,
            gamma=gamma,
            delay_value=delay_value,
            loss_function=loss_function,
            action_space="continuous",
        )
        check_int("num_qvalue_nets", num_qvalue_nets, low=1, owner="SACLoss")
        check_real("alpha_init", alpha_init, owner="SACLoss")
        if target_entropy != "auto" and (
            isinstance(target_entropy, (str, bool))
            or not isinstance(target_entropy, (int, float))
            or not math.isfinite(target_entropy)
        ):
            raise ValueError(
                f"SACLoss: target_entropy must be 'auto' or finite, got {target_entropy!r}"
            )
        self.target_entropy = target_entropy
        self._add_network("actor_network", actor_network, target=False)
        self.q_names = [f"qvalue_network_{j}" for j in range(int(num_qvalue_nets))]
        for j, name in enumerate(self.q_names):
            network = value_network if j == 0 else _reset(copy.deepcopy(value_network))
            self._add_network(name, network)
        log_alpha = torch.tensor(math.log(alpha_init))
        if fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)

    def _sample(self, td: TensorDictBase) -> torch.Tensor:
        """Run the actor on ``td`` (a sample, in mode ``"random"``); its log-prob
        ``[*B, n, 1]``."""
        with set_exploration("random"):
            self.actor_network(td)
        key = self.tensor_keys.log_prob
        log_prob = self._read(td, key, "[*B, n_agents] (the actor's log-probability)")
        n = td.get(self.tensor_keys.action).shape[-2]
        check_trailing(log_prob, key, (n,), "SACLoss", f"[*B, {n}]")
        return log_prob.unsqueeze(-1)

    def _min_q(self, td: TensorDictBase, target: bool, detach: bool = False) -> torch.Tensor:
        values = []
        for name in self.q_names:
            net = self._target(name) if target else getattr(self, name)
            values.append(self._critic_value(td.clone(False), net, detach=detach))
        return torch.stack(values).amin(0)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The actor, Q-network and temperature losses on transitions ``[*B]``."""
        action = self._read(tensordict, self.tensor_keys.action, "[*B, n_agents, act_dim]")
        alpha = self.log_alpha.exp()
        td = tensordict.clone(False)
        q_taken = [self._critic_value(td.clone(False), getattr(self, n)) for n in self.q_names]
        with torch.no_grad():
            nxt = self._next(td).clone(False)
            next_log_prob = self._sample(nxt)
            next_value = self._min_q(nxt, target=True) - alpha * next_log_prob
            target = self._agent_target(nxt, next_value)
        loss_value = torch.zeros((), device=action.device)
        for q in reversed(q_taken):  # the first Q-network's td_error is written last
            terms = self._agent_loss(tensordict, q, target)
            loss_value = loss_value + terms.pop("loss")

        policy_td = tensordict.clone(False)
        log_prob = self._sample(policy_td)
        q_policy = self._min_q(policy_td, target=False, detach=True)
        loss_actor = self._agent_mean(tensordict, alpha.detach() * log_prob - q_policy)
        entropy_target = (
            -float(action.shape[-1])
            if self.target_entropy == "auto"
            else float(self.target_entropy)
        )
        if isinstance(self.log_alpha, nn.Parameter):
            loss_alpha = -self._agent_mean(
                tensordict, self.log_alpha * (log_prob.detach() + entropy_target)
            )
        else:  # fixed_alpha: nothing to train
            loss_alpha = torch.zeros((), dtype=loss_actor.dtype, device=loss_actor.device)
        return TensorDict(
            {
                "loss_actor": loss_actor,
                "loss_value": loss_value,
                "loss_alpha": loss_alpha,
                "alpha": alpha.detach(),
                "entropy": -self._agent_mean(tensordict, log_prob.detach()),
                **terms,
            },
            [],
        )
