"""Probabilistic multi-agent actors, built on ``tensordict.nn``'s probabilistic modules.

An actor is a :class:`tensordict.nn.ProbabilisticTensorDictSequential`: a network writing the
distribution's parameters under the group (``(group, "loc")``/``(group, "scale")`` or
``(group, "logits")``), then a :class:`tensordict.nn.ProbabilisticTensorDictModule` that
builds the distribution, writes ``(group, "action")`` and, with ``return_log_prob``,
``(group, "action_log_prob")`` ``[*B, n_agents]``: one log-prob per agent (summed over the
action dims). Losses line it up with the per-agent advantages ``[*B, n_agents, 1]``
themselves; no reshaping on the user's side.

The actor follows marlkit's exploration mode (:mod:`marlkit.data.exploration`): it samples in
``"random"`` mode (also outside any ``set_exploration`` block) and takes the distribution's
``deterministic_sample`` (the mean, the squashed mean, the most likely action) in
``"deterministic"`` mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    interaction_type,
    set_interaction_type,
)
from torch import nn

from marlkit.data.keys import (
    ACTION,
    ACTION_LOG_PROB,
    ACTION_MASK,
    DEFAULT_GROUP,
    LOC,
    LOGITS,
    OBSERVATION,
    SCALE,
    NestedKey,
    join_key,
)
from marlkit.modules._checks import get_tensor
from marlkit.modules.distributions import Categorical, MaskedCategorical, Normal, TanhNormal

__all__ = ["NormalParamExtractor", "ProbabilisticActor", "distribution_keys"]


class NormalParamExtractor(nn.Module):
    """Split a network's output ``[*B, n_agents, 2 * act_dim]`` into ``loc`` and a positive
    ``scale`` (each ``[*B, n_agents, act_dim]``).

    ``scale = softplus(raw + b) + min_scale`` with ``b = log(expm1(init_scale - min_scale))``,
    so that a raw output of 0 gives ``init_scale``: a freshly initialised network (outputs near
    0) starts exploring with that standard deviation.

    TorchRL's ``NormalParamExtractor`` (tensordict's, which ``torchrl.modules`` re-exports) maps
    with ``"biased_softplus_1.0"`` by default: ``softplus(raw + inv_softplus(1.0 - 0.01)) +
    0.01``, then a floor ``scale_lb=1e-4`` that never binds. So its scale floor is 0.01, where
    marlkit's ``min_scale`` is 1e-4: ``NormalParamExtractor(min_scale=0.01)`` is TorchRL's
    default mapping. In general ``NormalParamExtractor(min_scale=m, init_scale=s)`` is TorchRL's
    ``NormalParamExtractor(scale_mapping=f"biased_softplus_{s}_{m}")`` (with ``scale_lb <=
    m``), marlkit's default its ``scale_mapping="biased_softplus_1.0_0.0001"``; the scales agree
    to float32 rounding (TorchRL computes the shift ``b`` in float32, marlkit in float64).
    Unlike TorchRL, an odd last dim is an error, not a ``loc`` one entry longer than ``scale``.

    Args:
        min_scale: a floor on the scale, so log-probs stay finite (1e-4; TorchRL's default
            mapping floors at 0.01: pass ``min_scale=0.01`` to match it exactly).
        init_scale: the scale of a raw output of 0 (``> min_scale``).

    Raises:
        ValueError: ``init_scale <= min_scale``; at call time, an odd last dim.
    """

    def __init__(self, min_scale: float = 1e-4, init_scale: float = 1.0):
        super().__init__()
        self.min_scale = float(min_scale)
        if not init_scale > self.min_scale:
            raise ValueError(
                f"NormalParamExtractor: init_scale must exceed min_scale {min_scale}, got "
                f"{init_scale}"
            )
        self.init_scale = float(init_scale)
        # softplus(b) = init_scale - min_scale  =>  b = log(expm1(init_scale - min_scale))
        self.bias = math.log(math.expm1(self.init_scale - self.min_scale))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[-1] % 2:
            raise ValueError(
                "NormalParamExtractor: expected an even last dim (2 * act_dim), got "
                f"{list(x.shape)}"
            )
        loc, raw = x.chunk(2, -1)
        return loc, nn.functional.softplus(raw + self.bias) + self.min_scale

    def extra_repr(self) -> str:
        return f"min_scale={self.min_scale}, init_scale={self.init_scale}"


def distribution_keys(distribution_class: type, group: str) -> dict[str, NestedKey]:
    """The default parameter keys of ``distribution_class`` under ``group``.

    ``Normal``/``TanhNormal``: ``{"loc": (group, "loc"), "scale": (group, "scale")}``;
    ``Categorical``: ``{"logits": (group, "logits")}``; ``MaskedCategorical`` adds
    ``{"mask": (group, "action_mask")}``.

    Raises:
        ValueError: another class (pass ``dist_keys`` explicitly then).
    """
    if issubclass(distribution_class, (Normal, TanhNormal)):
        return {LOC: (group, LOC), SCALE: (group, SCALE)}
    if issubclass(distribution_class, MaskedCategorical):
        return {LOGITS: (group, LOGITS), "mask": (group, ACTION_MASK)}
    if issubclass(distribution_class, Categorical):
        return {LOGITS: (group, LOGITS)}
    raise ValueError(
        f"no default keys for {distribution_class.__name__}: pass dist_keys={{kwarg: key}}"
    )


class ProbabilisticActor(ProbabilisticTensorDictSequential):
    """A network that writes distribution parameters, then the sampling module.

    Args:
        network: a ``TensorDictModule`` writing the parameters at ``dist_keys``' keys, or a
            plain ``nn.Module`` (then it reads ``in_keys`` and returns the parameters in the
            order of ``dist_keys``).
        group: the agent group whose keys are used.
        distribution_class: a class of :mod:`marlkit.modules.distributions` (or any
            ``torch.distributions`` class whose event is one agent's action).
        dist_keys: ``{distribution kwarg: key}``; defaults from :func:`distribution_keys`.
        in_keys: what a plain ``network`` reads (default ``[(group, "observation")]``).
        action_key: where the action goes (default ``(group, "action")``).
        return_log_prob: also write the log-prob ``(group, "action_log_prob")``
            ``[*B, n_agents]`` when acting.
        distribution_kwargs: fixed extra arguments of the distribution (``low``/``high`` of a
            ``TanhNormal``, say).

    Raises:
        TypeError: a network that is neither a ``TensorDictModuleBase`` nor an ``nn.Module``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor
        >>> from marlkit.modules import TanhNormal
        >>> net = torch.nn.Sequential(MultiAgentMLP(4, 2 * 2, 3, num_cells=8),
        ...                           NormalParamExtractor())
        >>> actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal,
        ...                            return_log_prob=True)
        >>> td = TensorDict({"agents": TensorDict({"observation": torch.zeros(5, 3, 4)},
        ...                                       batch_size=[5, 3])}, batch_size=[5])
        >>> actor(td)["agents", "action_log_prob"].shape
        torch.Size([5, 3])
    """

    def __init__(
        self,
        network: nn.Module,
        *,
        group: str = DEFAULT_GROUP,
        distribution_class: type = TanhNormal,
        dist_keys: Mapping[str, NestedKey] | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        action_key: NestedKey | None = None,
        return_log_prob: bool = True,
        distribution_kwargs: Mapping[str, Any] | None = None,
    ):
        keys = (
            dict(dist_keys)
            if dist_keys is not None
            else distribution_keys(distribution_class, group)
        )
        action = action_key if action_key is not None else join_key(group, ACTION)
        if isinstance(network, TensorDictModuleBase):
            head = network
        elif isinstance(network, nn.Module):
            params = [k for name, k in keys.items() if name != "mask"]
            head = TensorDictModule(
                network,
                in_keys=list(in_keys) if in_keys is not None else [(group, OBSERVATION)],
                out_keys=cast(Any, params),
            )
        else:
            raise TypeError(
                f"network must be an nn.Module or a TensorDictModule, got {type(network).__name__}"
            )
        action_path = (action,) if isinstance(action, str) else tuple(action)
        sampler = ProbabilisticTensorDictModule(
            in_keys=cast(Any, keys),
            out_keys=[action],
            distribution_class=distribution_class,
            distribution_kwargs=dict(distribution_kwargs or {}),
            return_log_prob=return_log_prob,
            log_prob_key=join_key(action_path[:-1], ACTION_LOG_PROB),
            # marlkit's mode outside any set_exploration block is "random"; inside one,
            # set_exploration sets tensordict's interaction type and that wins.
            default_interaction_type=InteractionType.RANDOM,
        )
        super().__init__(head, sampler)
        self.group = group
        self.action_key = action
        self.log_prob_key_: NestedKey = join_key(action_path[:-1], ACTION_LOG_PROB)
        # the head is ours, around a plain network: get_dist calls it directly (a tuple, not
        # registered again as submodules; indexing the ModuleList costs more than the call)
        self._plain_head = (head, sampler) if head is not network else None
        self._who = f"ProbabilisticActor (group {group!r})"

    def get_dist(
        self,
        tensordict: TensorDictBase,
        tensordict_out: TensorDictBase | None = None,
        **kwargs: Any,
    ) -> torch.distributions.Distribution:
        """The distribution for ``tensordict``, its parameters written into it, as
        ``ProbabilisticTensorDictSequential.get_dist``.

        With a plain ``network`` (not a ``TensorDictModule``), the network is called on the
        ``in_keys`` entries directly, without the generic sequence machinery (which walks the
        modules and copies entries at every call): the same parameters, written to the same
        keys, in about a third of the Python time; a loss calls this at every update.
        """
        generic = tensordict_out is not None or kwargs or self.return_composite
        if self._plain_head is None or generic:
            return super().get_dist(tensordict, tensordict_out, **kwargs)
        head, sampler = self._plain_head
        ins = [get_tensor(tensordict, k, self._who, "that the network reads") for k in head.in_keys]
        mode = interaction_type()
        with set_interaction_type(mode if mode is not None else sampler.default_interaction_type):
            out = cast(nn.Module, head.module)(*ins)
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != len(head.out_keys):
            raise RuntimeError(
                f"ProbabilisticActor: the network returned {len(outs)} tensors for the "
                f"{len(head.out_keys)} parameter keys {head.out_keys}"
            )
        for key, value in zip(head.out_keys, outs):
            tensordict.set(key, value)
        return sampler.get_dist(tensordict)
