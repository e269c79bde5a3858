"""``ClipPPOLoss``: the clipped PPO objective for one agent group (MAPPO and IPPO differ only by
the critic they are given)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_one_of, check_real
from marlkit.data.keys import (
    ACTION,
    ACTION_LOG_PROB,
    ADVANTAGE,
    COLLECTOR_MASK,
    DEFAULT_GROUP,
    MASK,
    STATE_VALUE,
    VALUE_TARGET,
    NestedKey,
)
from marlkit.modules._checks import check_bool
from marlkit.modules.critics import StateValueCritic, ValueNorm
from marlkit.objectives._keys import replace_keys

__all__ = ["ClipPPOLoss", "PPOKeys"]


@dataclass
class PPOKeys:
    """The keys :class:`ClipPPOLoss` reads (TorchRL's ``_AcceptedKeys``); full nested keys,
    defaults under the loss's group. Change them with :meth:`ClipPPOLoss.set_keys`.

    Attributes:
        advantage: ``(group, "advantage")`` ``[*B, n_agents, 1]``.
        value_target: ``(group, "value_target")`` ``[*B, n_agents, 1]``.
        value: ``(group, "state_value")`` ``[*B, n_agents, 1]``: the critic's output key, and in
            the batch the value at collection time (used by ``clip_value``).
        action: ``(group, "action")``.
        sample_log_prob: ``(group, "action_log_prob")`` ``[*B, n_agents]``, at collection.
        mask: ``(group, "mask")`` ``[*B, n_agents]`` bool, present agents (optional entry).
        collector_mask: ``("collector", "mask")`` ``[*B]`` bool, real steps of padded
            trajectories (optional entry).
    """

    advantage: NestedKey
    value_target: NestedKey
    value: NestedKey
    action: NestedKey
    sample_log_prob: NestedKey
    mask: NestedKey
    collector_mask: NestedKey = COLLECTOR_MASK

    @classmethod
    def for_group(cls, group: str) -> PPOKeys:
        return cls(
            advantage=(group, ADVANTAGE),
            value_target=(group, VALUE_TARGET),
            value=(group, STATE_VALUE),
            action=(group, ACTION),
            sample_log_prob=(group, ACTION_LOG_PROB),
            mask=(group, MASK),
        )


def _masked_mean(x: torch.Tensor, w: torch.Tensor | None, keep: int = 0) -> torch.Tensor:
    """The mean of ``x`` over present agents (``w``), within each slice of its first ``keep``
    dims (``[*x.shape[:keep]]``; a scalar for 0)."""
    if keep == 0:
        if w is None:
            return x.mean()
        return (x * w).sum() / w.sum().clamp(min=1.0)
    dims = tuple(range(keep, x.dim()))
    if w is None:
        return x.mean(dims)
    return (x * w).sum(dims) / w.expand_as(x).sum(dims).clamp(min=1.0)


def _coefficient(
    name: str, value: object, torchrl_name: str, torchrl_value: object, default: float
) -> float:
    """A loss coefficient given under marlkit's name or TorchRL's (``None``: not given)."""
    if value is not None and torchrl_value is not None:
        raise TypeError(
            f"ClipPPOLoss: {name}={value!r} and {torchrl_name}={torchrl_value!r} are one "
            "coefficient under two names (marlkit's and TorchRL's): pass only one"
        )
    if torchrl_value is not None:
        return check_real(torchrl_name, torchrl_value, low=0.0, strict=False)
    return check_real(name, default if value is None else value, low=0.0, strict=False)


#: A stored action the actor gives probability 0 (the log-ratio would be inf).
_IMPOSSIBLE = (
    "ClipPPOLoss: the actor gives {key!r} probability 0{where} (an action the action mask "
    "forbids, or outside the distribution's support): were these actions taken by this actor, "
    "with the same masks?"
)


class ClipPPOLoss(TensorDictModuleBase):
    """Clipped PPO (Schulman et al. 2017) for one group: MAPPO with a centralised critic,
    IPPO with a local one.

    With ``r = exp(log_prob - sample_log_prob)`` per agent and ``A`` the advantage, each
    ``[*B, n_agents, 1]``: ``loss_objective = -mean(min(r A, clip(r, 1 - eps, 1 + eps) A))``,
    ``loss_critic = critic_coef * mean(distance(V, value_target))`` (with ``clip_value``, the
    larger of the clipped and unclipped distances, as TorchRL), ``loss_entropy =
    -entropy_coef * mean(entropy)``. Means run over present agents and real steps only
    (``(group, "mask")``, ``("collector", "mask")``): absent agents contribute nothing. The
    objective and the entropy move only the actor, the critic loss only the critic; the sum of
    the three ``loss_*`` entries is what to back-propagate.

    Args:
        actor: a :class:`tensordict.nn.ProbabilisticTensorDictSequential` (a
            :class:`marlkit.modules.ProbabilisticActor`): its ``get_dist`` gives the
            distribution whose ``log_prob`` of the action is ``[*B, n_agents]``.
        critic: writes ``(group, "state_value")`` ``[*B, n_agents, 1]``.
        group: the group whose keys are read; no other group's entry is touched.
        clip_epsilon: the ratio clip.
        entropy_coef: weight of the entropy bonus (``None``: 0.01).
        critic_coef: weight of the critic loss (``None``: 1.0).
        clip_value: clip the new value to ``old ± clip_value`` (``None``: no clipping).
        normalize_advantage: standardise advantages over the minibatch (present agents).
        normalize_advantage_per_agent: standardise each agent's advantages separately.
        refresh_advantage: the advantage is ``value_target - V`` with ``V`` the critic's value
            computed in this call (detached), not the batch's ``advantage`` entry (not read):
            each epoch's advantages follow the critic as it learns, as EPyMARL's MAPPO and
            IPPO (its ``ppo_learner`` recomputes its TD error at each epoch; with
            :class:`~marlkit.objectives.NStepTD` targets from a target critic). Absent agents'
            advantages are 0.
        loss_critic_type: ``"l2"`` (squared error), ``"smooth_l1"`` or ``"l1"``.
        value_norm: the critic predicts values normalised by it; targets are normalised
            before the comparison (update it yourself once per batch, see ``docs/algorithms.md``).
        entropy_samples: samples for the entropy estimate of distributions without a closed
            form (``TanhNormal``).
        separate_dims: the first this many batch dims index independent problems (the seeds
            of :mod:`marlkit.train.seeds`, ``[K, *B]``): every mean and the advantages'
            standardisation run within each of their slices, and every term has those dims
            (``[K]``), so the sum of the terms over the seeds gives each seed's networks the
            gradient of its own loss.
        entropy_coeff, critic_coeff: TorchRL 0.14's names of ``entropy_coef`` and
            ``critic_coef``, accepted so that code ported from TorchRL runs unchanged; give each
            weight under one name (TorchRL's per-head ``entropy_coeff`` mapping is not taken).

    Returns (from ``forward``):
        A TensorDict (no batch dims; with ``separate_dims``, those dims) with
        ``loss_objective``, ``loss_critic``, ``loss_entropy``, ``entropy`` and the detached
        diagnostics ``clip_fraction`` (share of ratios outside the clip range), ``kl_approx``
        (``mean((r - 1) - log r)``, Schulman's unbiased, non-negative estimator of
        ``KL(old || new)``) and ``explained_variance`` (``1 - Var(target - V) / Var(target)``).

    Raises:
        TypeError: an actor without ``get_dist``; a weight given under both its names
            (``entropy_coef`` and ``entropy_coeff``, ``critic_coef`` and ``critic_coeff``).
        ValueError: a bad coefficient or option; at call time, an entry of the wrong shape
            (the message names the key, the expected and the received shape).
        KeyError: at call time, a missing entry (named).
    """

    def __init__(
        self,
        actor: ProbabilisticTensorDictSequential,
        critic: nn.Module,
        *,
        group: str = DEFAULT_GROUP,
        clip_epsilon: float = 0.2,
        entropy_coef: float | None = None,
        critic_coef: float | None = None,
        clip_value: float | None = None,
        normalize_advantage: bool = True,
        normalize_advantage_per_agent: bool = False,
        refresh_advantage: bool = False,
        loss_critic_type: Literal["l2", "smooth_l1", "l1"] = "l2",
        value_norm: ValueNorm | None = None,
        entropy_samples: int = 1,
        separate_dims: int = 0,
        entropy_coeff: float | None = None,
        critic_coeff: float | None = None,
    ):
        super().__init__()
        if not hasattr(actor, "get_dist"):
            raise TypeError(
                "ClipPPOLoss: actor must be a ProbabilisticTensorDictSequential (with get_dist), "
                f"got {type(actor).__name__}"
            )
        check_real("clip_epsilon", clip_epsilon, owner="ClipPPOLoss")
        if clip_value is not None:
            check_real("clip_value", clip_value, owner="ClipPPOLoss")
        check_one_of("loss_critic_type", loss_critic_type, ("l2", "smooth_l1", "l1"))
        self.actor_network = actor
        self.critic_network = critic
        self.group = group
        self.clip_epsilon = float(clip_epsilon)
        # a negative critic_coef would ascend the critic's error; NaN would make every loss NaN
        self.entropy_coef = _coefficient(
            "entropy_coef", entropy_coef, "entropy_coeff", entropy_coeff, 0.01
        )
        self.critic_coef = _coefficient(
            "critic_coef", critic_coef, "critic_coeff", critic_coeff, 1.0
        )
        self.clip_value = clip_value
        self.normalize_advantage = normalize_advantage
        self.normalize_advantage_per_agent = normalize_advantage_per_agent
        self.refresh_advantage = bool(refresh_advantage)
        self.loss_critic_type = loss_critic_type
        self.value_norm = value_norm
        self.entropy_samples = check_int("entropy_samples", entropy_samples, low=1)
        self.separate_dims = check_int("separate_dims", separate_dims, low=0)
        self.tensor_keys = PPOKeys.for_group(group)
        self._refresh_keys()

    # ------------------------------------------------------------------ keys
    def set_keys(self, **keys: NestedKey) -> ClipPPOLoss:
        """Change keys by name (see :class:`PPOKeys`); returns ``self``.

        Raises:
            ValueError: an unknown name.
        """
        replace_keys(self.tensor_keys, "ClipPPOLoss", keys)
        self._refresh_keys()
        return self

    def _refresh_keys(self) -> None:
        k = self.tensor_keys
        actor_in = list(getattr(self.actor_network, "in_keys", []))
        critic_in = list(getattr(self.critic_network, "in_keys", []))
        keys = [*actor_in, *critic_in, k.action, k.sample_log_prob, k.value_target]
        if not self.refresh_advantage:
            keys.append(k.advantage)
        keys += [k.mask, k.collector_mask]  # read where present
        if self.clip_value is not None:  # the values the batch was collected with
            keys.append(k.value)
        self.in_keys = cast(Any, list(dict.fromkeys(keys)))
        self.out_keys = ["loss_objective", "loss_critic", "loss_entropy"]

    # ------------------------------------------------------------------ checks
    def _get(self, td: TensorDictBase, key: NestedKey, what: str) -> torch.Tensor:
        value = td.get(key, None)
        if value is None:
            raise KeyError(
                f"ClipPPOLoss: missing {what} {key!r} (set_keys({what}=...) to change it)"
            )
        return value

    def _check_shape(self, value: torch.Tensor, key: NestedKey, shape: tuple[int, ...]) -> None:
        if tuple(value.shape) != shape:
            raise ValueError(
                f"ClipPPOLoss: {key!r} must have shape {list(shape)} ([*B, n_agents, 1] or "
                f"[*B, n_agents] for log-probs), got {list(value.shape)}"
            )

    def _weights(self, td: TensorDictBase, shape: tuple[int, ...]) -> torch.Tensor | None:
        """Present agents at real steps, ``[*B, n_agents, 1]`` float, or ``None`` (all)."""
        k = self.tensor_keys
        w: torch.Tensor | None = None
        mask = td.get(k.mask, None)
        if mask is not None:
            self._check_shape(mask, k.mask, shape[:-1])
            check_bool(mask, k.mask, "ClipPPOLoss")
            w = mask.unsqueeze(-1)
        steps = td.get(k.collector_mask, None)
        if steps is not None:
            check_bool(steps, k.collector_mask, "ClipPPOLoss")
            if tuple(steps.shape) != shape[:-2]:
                raise ValueError(
                    f"ClipPPOLoss: {k.collector_mask!r} must have shape {list(shape[:-2])} "
                    f"([*B]), got {list(steps.shape)}"
                )
            s = steps[..., None, None].expand(shape)
            w = s if w is None else w & s
        return None if w is None else w.to(torch.get_default_dtype())

    # ------------------------------------------------------------------ terms
    def _advantage(self, adv: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        if not self.normalize_advantage:
            return adv
        ones = torch.ones_like(adv) if w is None else w
        keep = self.separate_dims
        if self.normalize_advantage_per_agent:
            dims = (*tuple(range(keep, adv.dim() - 2)), adv.dim() - 1)
        else:
            dims = tuple(range(keep, adv.dim()))
        count = ones.sum(dims, keepdim=True).clamp(min=1.0)
        mean = (adv * ones).sum(dims, keepdim=True) / count
        var = (((adv - mean) ** 2) * ones).sum(dims, keepdim=True) / (count - 1).clamp(min=1.0)
        return (adv - mean) / (var.sqrt() + 1e-8)

    def _entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        try:
            return dist.entropy()
        except NotImplementedError:
            sample = dist.rsample((self.entropy_samples,))
            return -dist.log_prob(sample).mean(0)

    def _distance(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.loss_critic_type == "l2":
            return (a - b) ** 2
        if self.loss_critic_type == "l1":
            return (a - b).abs()
        return nn.functional.smooth_l1_loss(a, b, reduction="none")

    def _critic_loss(
        self, td: TensorDictBase, target: torch.Tensor, w: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.tensor_keys
        critic = self.critic_network
        if isinstance(critic, StateValueCritic) and critic.out_keys[0] == k.value:
            value = critic.value(td)  # the same values, without the module's key bookkeeping
        else:
            keys = [key for key in getattr(critic, "in_keys", []) if key in td.keys(True)]
            out = critic(td.select(*keys) if keys else td.copy())
            value = self._get(out, k.value, "value")
        self._check_shape(value, k.value, tuple(target.shape))
        goal = self.value_norm.normalize(target) if self.value_norm is not None else target
        dist = self._distance(value, goal)
        if self.clip_value is not None:
            old = self._get(td, k.value, "value")
            self._check_shape(old, k.value, tuple(target.shape))
            clipped = old + (value - old).clamp(-self.clip_value, self.clip_value)
            dist = torch.maximum(dist, self._distance(clipped, goal))
        return self.critic_coef * _masked_mean(dist, w, self.separate_dims), value

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The loss terms for a batch of any leading dims ``[*B]`` (group batch
        ``[*B, n_agents]``)."""
        k = self.tensor_keys
        # the entry that sets the shapes: the advantage, or the target it is refreshed from
        lead, what = (k.advantage, "advantage")
        if self.refresh_advantage:
            lead, what = k.value_target, "value_target"
        first = self._get(tensordict, lead, what)
        if first.dim() < 2 or first.shape[-1] != 1:
            raise ValueError(
                f"ClipPPOLoss: {lead!r} must have shape [*B, n_agents, 1], got {list(first.shape)}"
            )
        shape = tuple(first.shape)
        keep = self.separate_dims
        if first.dim() - 2 < keep:
            raise ValueError(
                f"ClipPPOLoss: separate_dims={keep} needs {keep} batch dims before the agents', "
                f"got {lead!r} of shape {list(shape)}"
            )
        target = self._get(tensordict, k.value_target, "value_target")
        self._check_shape(target, k.value_target, shape)
        old_lp = self._get(tensordict, k.sample_log_prob, "sample_log_prob")
        self._check_shape(old_lp, k.sample_log_prob, shape[:-1])
        action = self._get(tensordict, k.action, "action")
        w = self._weights(tensordict, shape)

        dist = self.actor_network.get_dist(tensordict.copy())
        expected = (*dist.batch_shape, *dist.event_shape)
        if tuple(action.shape) != expected:  # log_prob would broadcast [*B, n, 1] silently
            raise ValueError(
                f"ClipPPOLoss: {k.action!r} must have shape {expected} (the actor's actions), "
                f"got {tuple(action.shape)}"
            )
        log_prob = dist.log_prob(action)
        self._check_shape(log_prob, f"log_prob of {k.action!r}", shape[:-1])
        impossible = torch.isneginf(log_prob)
        if w is not None:
            impossible &= w.squeeze(-1) != 0
        if torch.compiler.is_compiling():
            # reading the data here would break the graph: the assert runs inside it instead
            # (RuntimeError when the compiled forward runs, with this fixed message)
            torch._assert_async(~impossible.any(), _IMPOSSIBLE.format(key=k.action, where=""))
        elif bool(impossible.any()):
            where = f" at {int(impossible.sum())} present agent steps"
            raise ValueError(_IMPOSSIBLE.format(key=k.action, where=where))
        log_ratio = (log_prob - old_lp).unsqueeze(-1)
        if w is not None:  # absent agents: any action, ratio 1 (they are weighted out anyway)
            log_ratio = log_ratio.masked_fill(w == 0, 0.0)
        ratio = log_ratio.exp()
        loss_critic, value = self._critic_loss(tensordict, target, w)
        if self.refresh_advantage:  # the critic's value now, not at collection
            now = self.value_norm.denormalize(value) if self.value_norm is not None else value
            adv = (target - now).detach()
            if w is not None:
                adv = adv.masked_fill(w == 0, 0.0)
        else:
            adv = first
        a = self._advantage(adv, w)
        gain = torch.minimum(
            ratio * a, ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon) * a
        )
        entropy = self._entropy(dist).unsqueeze(-1)
        if w is not None:
            entropy = entropy.masked_fill(w == 0, 0.0)
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > self.clip_epsilon).to(ratio.dtype)
            kl = (ratio - 1) - log_ratio
            pred = (
                self.value_norm.denormalize(value) if self.value_norm is not None else value
            ).detach()
            ones = torch.ones_like(target) if w is None else w
            dims = tuple(range(keep, target.dim()))  # every dim without separate_dims
            count = ones.sum(dims, keepdim=True).clamp(min=1.0)
            t_mean = (target * ones).sum(dims, keepdim=True) / count
            var_t = (((target - t_mean) ** 2) * ones).sum(dims) / count.reshape(shape[:keep])
            err = target - pred
            e_mean = (err * ones).sum(dims, keepdim=True) / count
            var_e = (((err - e_mean) ** 2) * ones).sum(dims) / count.reshape(shape[:keep])
            explained = 1 - var_e / var_t.clamp(min=1e-8)
        entropy_mean = _masked_mean(entropy, w, keep)
        return TensorDict(
            {
                "loss_objective": -_masked_mean(gain, w, keep),
                "loss_critic": loss_critic,
                "loss_entropy": -self.entropy_coef * entropy_mean,
                "entropy": entropy_mean.detach(),
                "clip_fraction": _masked_mean(clipped, w, keep),
                "kl_approx": _masked_mean(kl, w, keep),
                "explained_variance": explained,
            },
            batch_size=shape[:keep],
        )
