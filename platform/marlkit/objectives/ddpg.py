"""``DDPGLoss``: deterministic policy gradients per agent of a group, MADDPG (a centralised
critic) or IDDPG (a per-agent one) by the critic."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from marlkit._checks import check_int, check_real
from marlkit.data.keys import ACTION_PREACT, DEFAULT_GROUP, STATE_ACTION_VALUE, NestedKey
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
        action_preact: what the actor writes before its tanh, ``(group, "action_preact")``
            ``[*B, n, act_dim]`` (read with ``actor_preact_penalty > 0`` only).
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (
        *AgentTDKeys.GROUP_FIELDS,
        "state_action_value",
        "action_preact",
    )

    state_action_value: NestedKey = STATE_ACTION_VALUE
    action_preact: NestedKey = ACTION_PREACT


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

    Three options against a deterministic tanh actor saturating at its bounds (each off by
    default, which is TorchRL's DDPG):

    * ``actor_preact_penalty=c``: ``loss_actor += c * mean_{B, i present, dims} u^2`` with ``u``
      the actor's pre-tanh output (``(group, "action_preact")``, written by
      :class:`~marlkit.modules.TanhBounds` with ``preact=True``): a gradient toward ``u = 0``
      that a saturated tanh no longer blocks.
    * ``target_policy_noise=s`` (TD3's target policy smoothing, Fujimoto et al. 2018): the
      target action is ``clamp(mu'(o') + clamp(s * N(0, 1), -c, c) * h, low, high)`` with
      ``c = target_noise_clip`` and ``h = (high - low) / 2``; noise and clip are fractions of
      half the action range, as the exploration noise's sigma (needs ``action_bounds``).
    * ``actor_delay=d`` (TD3's delayed policy updates): ``loss_actor`` has a gradient on every
      ``d``-th call of ``forward`` only (the 1st, ``d+1``-th, ...: calls are counted in the
      buffer ``actor_calls``); on the others it (and the penalty's terms) is a constant 0 and
      the actor is not run, so an optimiser leaves the actor's parameters alone (their
      gradient is ``None``); means of the terms over calls are diluted by ``1/d``. The target
      networks still follow every step (TD3 delays them too).

    Args:
        actor_network: writes ``(group, "action")`` ``[*B, n, act_dim]`` from the group's
            observations (deterministic; exploration noise belongs to the collecting policy).
        value_network: writes ``(group, "state_action_value")`` ``[*B, n, 1]`` from
            observations and ``(group, "action")`` (centralised or not: its choice).
        group: the agent group.
        gamma: the discount.
        delay_value: keep target copies of both networks (see :class:`SoftUpdate`).
        loss_function: ``"l2"``, ``"smooth_l1"`` or ``"l1"`` for the critic.
        actor_preact_penalty: the coefficient ``c >= 0`` of the pre-tanh penalty (0: none).
        target_policy_noise: the std ``s >= 0`` of the target action's noise (0: none).
        target_noise_clip: the clip ``c >= 0`` of that noise.
        actor_delay: ``d >= 1``, the actor trained on every ``d``-th call (1: every call).
        action_bounds: ``(low, high)``, numbers or tensors broadcastable to ``[n, act_dim]``
            (the actor's :class:`~marlkit.modules.TanhBounds`); needed with
            ``target_policy_noise > 0``.

    Returns (``forward``):
        A TensorDict ``[]`` with ``loss_actor``, ``loss_value``, ``td_error`` ``[*B]`` (also
        written into the input under ``priority``), ``q_value`` and ``target_value``; with
        ``actor_preact_penalty > 0`` also ``preact_abs`` (the mean ``|u|``) and ``loss_preact``
        (the penalty, included in ``loss_actor``).

    Raises:
        TypeError, ValueError: an option out of range or of the wrong type (the message names
            it); ``target_policy_noise > 0`` without ``action_bounds``.
        KeyError, ValueError (when called): a missing key or a tensor of the wrong shape; the
            message names the key and the expected shape.
    """

    tensor_keys: _DDPGKeys
    actor_network: TensorDictModuleBase
    value_network: TensorDictModuleBase
    action_low: torch.Tensor  # buffers: the bounds with target_policy_noise > 0
    action_high: torch.Tensor
    actor_calls: torch.Tensor  # a buffer with actor_delay > 1: forward calls so far

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        value_network: TensorDictModuleBase,
        *,
        group: str = DEFAULT_GROUP,
        gamma: float = 0.99,
        delay_value: bool = True,
        loss_function: LossFunction = "l2",
        actor_preact_penalty: float = 0.0,
        target_policy_noise: float = 0.0,
        target_noise_clip: float = 0.5,
        actor_delay: int = 1,
        action_bounds: tuple[torch.Tensor | float, torch.Tensor | float] | None = None,
    ):
        name = type(self).__name__
        penalty = check_real("actor_preact_penalty", actor_preact_penalty, strict=False, owner=name)
        noise = check_real("target_policy_noise", target_policy_noise, strict=False, owner=name)
        clip = check_real("target_noise_clip", target_noise_clip, strict=False, owner=name)
        delay = check_int("actor_delay", actor_delay, low=1, owner=name)
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
        self.actor_preact_penalty, self.actor_delay = penalty, delay
        self.target_policy_noise, self.target_noise_clip = noise, clip
        if self.target_policy_noise > 0:
            low, high = _check_bounds(action_bounds, name)
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)
        if self.actor_delay > 1:  # a buffer only then: the default's state_dict is unchanged
            self.register_buffer("actor_calls", torch.zeros((), dtype=torch.int64))

    def _smoothed(self, action: torch.Tensor) -> torch.Tensor:
        """``action`` ``[*B, n, act_dim]`` with clipped Gaussian noise, clamped into the bounds
        (TD3's target policy smoothing)."""
        half = (self.action_high - self.action_low) / 2
        noise = torch.randn_like(action) * self.target_policy_noise
        noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip) * half
        return torch.maximum(torch.minimum(action + noise, self.action_high), self.action_low)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The actor and critic losses on a batch of transitions ``[*B]``."""
        self._read(tensordict, self.tensor_keys.action, "[*B, n_agents, act_dim]")
        td = tensordict.clone(False)
        q = self._critic_value(td, self.value_network)
        with torch.no_grad():
            nxt = self._next(td).clone(False)
            self._target("actor_network")(nxt)
            if self.target_policy_noise > 0:
                key = self.tensor_keys.action
                nxt.set(key, self._smoothed(self._read(nxt, key, "[*B, n_agents, act_dim]")))
            next_value = self._critic_value(nxt, self._target("value_network"))
            target = self._agent_target(nxt, next_value)
        terms = self._agent_loss(tensordict, q, target)

        return TensorDict(
            {**self._actor_terms(tensordict, q), "loss_value": terms.pop("loss"), **terms}, []
        )

    def _actor_turn(self) -> bool:
        """Whether this call trains the actor (every ``actor_delay``-th call, the first
        included)."""
        if self.actor_delay == 1:
            return True
        turn = int(self.actor_calls) % self.actor_delay == 0
        self.actor_calls += 1
        return turn

    def _actor_terms(self, tensordict: TensorDictBase, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """``loss_actor`` (and the penalty's terms): the actor's loss through the critic with
        its parameters detached, so that its gradient reaches the actor only."""
        penalty = self.actor_preact_penalty > 0
        if not self._actor_turn():
            zero = q.new_zeros(()).detach()
            return {"loss_actor": zero} | (
                {"loss_preact": zero, "preact_abs": zero.clone()} if penalty else {}
            )
        policy_td = tensordict.clone(False)
        self.actor_network(policy_td)
        q_policy = self._critic_value(policy_td, self.value_network, detach=True)
        loss_actor = -self._agent_mean(tensordict, q_policy)
        if not penalty:
            return {"loss_actor": loss_actor}
        key = self.tensor_keys.action_preact
        preact = self._read(policy_td, key, "[*B, n_agents, act_dim] (the actor's pre-tanh)")
        if preact.shape != q_policy.shape[:-1] + preact.shape[-1:]:
            raise ValueError(
                f"{type(self).__name__}: {key!r} must have shape [*B, n_agents, act_dim] with "
                f"[*B, n_agents] = {list(q_policy.shape[:-1])}, got {list(preact.shape)}"
            )
        loss_preact = self.actor_preact_penalty * self._agent_mean(
            tensordict, preact.pow(2).mean(-1, keepdim=True)
        )
        with torch.no_grad():
            preact_abs = self._agent_mean(tensordict, preact.abs().mean(-1, keepdim=True))
        return {
            "loss_actor": loss_actor + loss_preact,
            "loss_preact": loss_preact.detach(),
            "preact_abs": preact_abs,
        }


def _check_bounds(
    bounds: tuple[torch.Tensor | float, torch.Tensor | float] | None, owner: str
) -> tuple[torch.Tensor, torch.Tensor]:
    if bounds is None:
        raise ValueError(
            f"{owner}: target_policy_noise > 0 needs action_bounds=(low, high), the actor's "
            "action bounds"
        )
    low, high = (torch.as_tensor(b, dtype=torch.float32).clone() for b in bounds)
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()) or (low >= high).any():
        raise ValueError(
            f"{owner}: action_bounds must be finite with low < high everywhere, got "
            f"low={low.tolist()}, high={high.tolist()}"
        )
    return low, high
