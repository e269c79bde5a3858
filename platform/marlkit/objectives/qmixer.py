"""``QMixerLoss``: QMIX and VDN (by the mixer) on a team TD(0) target, with target networks."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from marlkit._checks import check_one_of
from marlkit.data.keys import (
    CHOSEN_ACTION_VALUE,
    DEFAULT_GROUP,
    NEXT,
    REWARD,
    TERMINATED,
    NestedKey,
)
from marlkit.modules._checks import (
    check_bool,
    check_taken_allowed,
    check_trailing,
    chosen_value,
)
from marlkit.objectives._common import (
    DiscreteKeys,
    LossFunction,
    ValueLoss,
    distance,
    mean_after,
    sample_weights,
    weighted_mean,
)

__all__ = ["QMixerLoss"]


@dataclasses.dataclass
class _QMixerKeys(DiscreteKeys):
    """The keys :class:`QMixerLoss` reads and writes (``set_keys`` changes them): those of
    :class:`~marlkit.objectives.DiscreteKeys` and

    Attributes:
        local_value: each agent's chosen value, ``(group, "chosen_action_value")``
            ``[*B, n, 1]`` (the mixer's input); absent agents enter it as 0.
        global_value: the mixer's output ``[*B, 1]``.
        reward: the root team reward (under ``"next"``) ``[*B, 1]``, used where present.
        group_reward: the agents' rewards (under ``"next"``) ``[*B, n, 1]``, reduced to a team
            reward where there is no root one.
        terminated: the root termination (under ``"next"``) ``[*B, 1]``.
        group_terminated: the agents' (under ``"next"``) ``[*B, n, 1]``: all of them
            terminated ends the team's episode; used where there is no root one.
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (
        *DiscreteKeys.GROUP_FIELDS,
        "local_value",
        "group_reward",
        "group_terminated",
    )

    local_value: NestedKey = CHOSEN_ACTION_VALUE
    global_value: NestedKey = CHOSEN_ACTION_VALUE
    reward: NestedKey = REWARD
    group_reward: NestedKey = REWARD
    terminated: NestedKey = TERMINATED
    group_terminated: NestedKey = TERMINATED


class QMixerLoss(ValueLoss):
    """The QMIX / VDN loss (Rashid et al. 2018; Sunehag et al. 2017) for one agent group.

    For a batch of transitions (any leading batch dims ``B``)::

        Q_tot(s, a)  = mixer(q_i(o_i, a_i) for each present agent i, state)      [*B, 1]
        y            = r + gamma * (1 - terminated) * mixer'(max_a q'_i(o'_i, a), state')
        loss         = mean_B  w * distance(Q_tot, y)

    with ``q'``, ``mixer'`` the target networks (``delay_value``), the max over the next step's
    allowed actions (its ``action_mask``), and ``w`` the importance weights
    (``"priority_weight"`` ``[*B]``) when the sample has them. Episodes that end by truncation
    bootstrap; only termination stops it (``("next", "terminated")``).

    Team reward: the root ``("next", "reward")`` ``[*B, 1]`` when the env gives one; otherwise
    the agents' ``("next", group, "reward")`` ``[*B, n, 1]`` reduced over the present agents by
    ``reward_reduction`` (``"mean"`` by default, as TorchRL's and BenchMARL's QMIX; ``"sum"``
    gives the sum). Native scenarios and VMAS give per-agent rewards only.

    Absent agents (``(group, "mask")`` false) enter the mixer with value 0, at both steps; at
    the next step so do the agents that terminated there (``("next", group, "terminated")``),
    while an agent that leaves by truncation enters with its final observation's value (its
    next ``mask`` is false: PettingZoo's time limit removes every agent at the last step).

    Args:
        local_value_network: writes ``(group, "action_value")`` ``[*B, n, A]`` from the
            group's observations (a :class:`~marlkit.modules.QValueActor`).
        mixer_network: writes the root ``"chosen_action_value"`` ``[*B, 1]`` from
            ``(group, "chosen_action_value")`` (a :class:`~marlkit.modules.QMixer` or
            :class:`~marlkit.modules.VDNMixer`).
        group: the agent group.
        gamma: the discount.
        delay_value: keep target copies of both networks (moved by
            :class:`~marlkit.objectives.SoftUpdate` / :class:`~marlkit.objectives.HardUpdate`);
            without, the online networks give the (detached) target.
        loss_function: ``"l2"``, ``"smooth_l1"`` or ``"l1"``.
        double_dqn: pick the next action with the online network, value it with the target.
        reward_reduction: ``"mean"`` or ``"sum"`` of the agents' rewards (no root reward).
        separate_dims: the first this many batch dims index independent problems (the seeds
            of a stack, :mod:`marlkit.train.seeds`, whose mixer reads ``[K, *B]`` too): the
            terms keep them (``loss`` ``[K]``, each seed's own), the means run over the other
            dims only.

    Returns (``forward``):
        A TensorDict ``[]`` (with ``separate_dims``, those dims) with ``loss`` (scalar,
        differentiable; one per index of ``separate_dims``), ``td_error`` ``[*B]``
        (``|Q_tot - y|``, also written into the input under ``priority``, for
        ``ReplayBuffer.update_priority(sample["index"], sample["td_error"])``),
        ``q_value`` (mean ``Q_tot``) and ``target_value`` (mean ``y``), detached.

    Raises:
        KeyError, ValueError (when called): a missing key or a tensor of the wrong shape; the
            message names the key and the expected shape.
    """

    tensor_keys: _QMixerKeys
    NEXT_READS: ClassVar[tuple[str, ...]] = (
        "action_mask",
        "reward",
        "group_reward",
        "terminated",
        "group_terminated",
    )
    local_value_network: TensorDictModuleBase
    mixer_network: TensorDictModuleBase

    def __init__(
        self,
        local_value_network: TensorDictModuleBase,
        mixer_network: TensorDictModuleBase,
        *,
        group: str = DEFAULT_GROUP,
        gamma: float = 0.99,
        delay_value: bool = True,
        loss_function: LossFunction = "l2",
        double_dqn: bool = False,
        reward_reduction: Literal["mean", "sum"] = "mean",
        action_space: Literal["categorical", "one_hot"] = "categorical",
        separate_dims: int = 0,
    ):
        super().__init__(
            _QMixerKeys,
            local_value_network,
            group=group,
            gamma=gamma,
            delay_value=delay_value,
            loss_function=loss_function,
            action_space=action_space,
            separate_dims=separate_dims,
        )
        check_one_of("reward_reduction", reward_reduction, ("mean", "sum"), owner="QMixerLoss")
        self.double_dqn = bool(double_dqn)
        self.reward_reduction = reward_reduction
        self._add_network("local_value_network", local_value_network)
        self._add_network("mixer_network", mixer_network)

    # ------------------------------------------------------------------ pieces
    def _team_reward(self, nxt: TensorDictBase, present: torch.Tensor | None) -> torch.Tensor:
        keys = self.tensor_keys
        reward = nxt.get(keys.reward, None)
        if reward is not None:
            if tuple(reward.shape) != (*nxt.batch_size, 1):
                raise ValueError(
                    f"QMixerLoss: {(NEXT, keys.reward)!r} (the team reward) must have shape "
                    f"{(*nxt.batch_size, 1)} ([*B, 1]), got {tuple(reward.shape)}"
                )
            return reward
        rewards = self._read_next(nxt, keys.group_reward, "[*B, n_agents, 1] (or a root reward)")
        check_trailing(rewards, (NEXT, keys.group_reward), (1,), "QMixerLoss", "[*B, n, 1]")
        if present is not None:
            rewards = rewards * present
        total = rewards.sum(-2)
        if self.reward_reduction == "sum":
            return total
        count = present.sum(-2) if present is not None else rewards.shape[-2]
        return total / (count.clamp_min(1) if isinstance(count, torch.Tensor) else count)

    def _team_terminated(self, nxt: TensorDictBase) -> torch.Tensor:
        keys = self.tensor_keys
        terminated = nxt.get(keys.terminated, None)
        if terminated is None:
            agents = self._read_next(
                nxt, keys.group_terminated, "[*B, n_agents, 1] bool (or a root terminated)"
            )
            check_bool(agents, (NEXT, keys.group_terminated), "QMixerLoss")
            return agents.all(-2)
        check_trailing(
            terminated, (NEXT, keys.terminated), (1,), "QMixerLoss", "[*B, 1] bool", boolean=True
        )
        return terminated

    def _next_present(
        self, nxt: TensorDictBase, present: torch.Tensor | None, n: int
    ) -> torch.Tensor | None:
        """The agents whose next value enters the target mix ``[*B, n, 1]`` (None: all): those
        present at the step, less those that terminated at it. An agent that leaves by
        truncation keeps its value (its final observation): its next ``mask`` does not decide."""
        key = self.tensor_keys.group_terminated
        terminated = nxt.get(key, None)
        if terminated is None:
            return present
        check_trailing(
            terminated, (NEXT, key), (n, 1), type(self).__name__, f"[*B, {n}, 1] bool", boolean=True
        )
        alive = ~terminated
        return alive if present is None else present & alive

    def _mix(
        self,
        td: TensorDictBase,
        values: torch.Tensor,
        mixer: torch.nn.Module,
        present: torch.Tensor | None,
    ) -> torch.Tensor:
        if present is not None:
            values = values * present
        td.set(self.tensor_keys.local_value, values)
        mixer(td)
        return self._read(td, self.tensor_keys.global_value, "[*B, 1] (the mixer's output)")

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The loss on a batch of transitions ``[*B]`` (see the class docstring)."""
        keys = self.tensor_keys
        keep = self._check_separate(tensordict)
        action = self._read(tensordict, keys.action, "[*B, n_agents] (or one-hot)")
        td = tensordict.clone(False)
        values = self._action_values(td, self.local_value_network)
        chosen = chosen_value(values, action, self.action_space, "QMixerLoss", keys.action)
        present = self._present(td, values.shape[-2])
        check_taken_allowed(
            action,
            self._allowed(tensordict, values.shape[-1]),
            self.action_space,
            "QMixerLoss",
            keys.action,
            keys.action_mask,
            present,
        )
        q_tot = self._mix(td, chosen, self.mixer_network, present)
        lead = tuple(tensordict.batch_size)
        check_trailing(q_tot, keys.global_value, (*lead, 1), "QMixerLoss", f"{[*lead, 1]}")

        nxt = self._next(td)
        with torch.no_grad():
            next_td = nxt.clone(False)
            next_values = self._next_value(
                next_td, "local_value_network", self.double_dqn, sequence=td
            )
            next_q_tot = self._mix(
                next_td,
                next_values,
                self._target("mixer_network"),
                self._next_present(nxt, present, values.shape[-2]),
            )
            reward = self._team_reward(nxt, present)
            not_terminated = (~self._team_terminated(nxt)).to(q_tot.dtype)
            target = reward + self.gamma * not_terminated * next_q_tot

        weight = sample_weights(tensordict, keys.priority_weight, q_tot.shape[:-1], "QMixerLoss")
        dist = distance(q_tot, target, self.loss_function).squeeze(-1)
        loss = weighted_mean(dist, weight, keep)
        td_error = (q_tot.detach() - target).abs().squeeze(-1)
        tensordict.set(keys.priority, td_error)
        return TensorDict(
            {
                "loss": loss,
                "td_error": td_error,
                "q_value": mean_after(q_tot.detach(), keep),
                "target_value": mean_after(target, keep),
            },
            tensordict.batch_size[:keep],
        )
