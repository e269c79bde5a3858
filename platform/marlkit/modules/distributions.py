"""Action distributions for probabilistic actors, each with a ``deterministic_sample`` (what
``tensordict.nn.ProbabilisticTensorDictModule`` returns in ``"deterministic"`` mode).

Every distribution's event is one agent's action, so ``log_prob`` of an action
``[*B, n_agents, act_dim]`` (continuous) or ``[*B, n_agents]`` (categorical) is
``[*B, n_agents]``: one log-prob per agent.
"""

from __future__ import annotations

import math

import torch
from torch import distributions as D

__all__ = ["Categorical", "MaskedCategorical", "Normal", "TanhNormal"]


class Normal(D.Independent):
    """A diagonal Gaussian, independent over the last dim (the action dims).

    Args:
        loc: mean ``[*B, n_agents, act_dim]``.
        scale: standard deviation, the same shape (positive).
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, validate_args: bool | None = None):
        super().__init__(D.Normal(loc, scale, validate_args=validate_args), 1, validate_args)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The mean ``[*B, n_agents, act_dim]``."""
        return self.base_dist.mean


class TanhNormal(D.Independent):
    """A Gaussian squashed by ``tanh`` into ``[low, high]``, independent over the last dim.

    The log-prob includes the change of variables. ``entropy`` has no closed form: losses
    estimate it from a sample (``-log_prob(rsample())``).

    Args:
        loc: mean of the Gaussian before squashing ``[*B, n_agents, act_dim]``.
        scale: its standard deviation, the same shape (positive).
        low, high: the action bounds (floats or tensors broadcastable to ``loc``).
    """

    has_rsample = True

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor,
        low: float | torch.Tensor = -1.0,
        high: float | torch.Tensor = 1.0,
        validate_args: bool | None = None,
    ):
        # Float bounds are checked in Python: no tensor-to-bool sync (nor a torch.compile
        # graph break) on every call.
        if isinstance(low, (int, float)) and isinstance(high, (int, float)):
            if not high > low:
                raise ValueError(f"TanhNormal needs high > low, got low={low}, high={high}")
            unit = low == -1 and high == 1
        else:
            if bool((torch.as_tensor(high) <= torch.as_tensor(low)).any()):
                raise ValueError(f"TanhNormal needs high > low, got low={low}, high={high}")
            unit = False
        low_t = torch.as_tensor(low, dtype=loc.dtype, device=loc.device)
        high_t = torch.as_tensor(high, dtype=loc.dtype, device=loc.device)
        self.low, self.high = low_t, high_t
        transforms: list[D.Transform] = [D.TanhTransform(cache_size=1)]
        if not unit:
            half = (high_t - low_t) / 2
            transforms.append(D.AffineTransform(low_t + half, half, cache_size=1))
        base = D.TransformedDistribution(
            D.Normal(loc, scale, validate_args=validate_args), transforms, validate_args=False
        )
        self._loc = loc
        super().__init__(base, 1, validate_args=False)

    def rsample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        self._sampled = super().rsample(torch.Size(sample_shape))
        return self._sampled

    def sample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        self._sampled = super().sample(torch.Size(sample_shape))
        return self._sampled

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-prob ``[*B, n_agents]`` of ``value`` ``[*B, n_agents, act_dim]``.

        The last sample of this distribution is scored from its own pre-``tanh`` value (exact
        and with the right gradient even where ``tanh`` rounds to the bound, beyond about 8 in
        float32). Any other value is mapped back through ``atanh``: values on the bounds (or
        rounded a few ulps past them) are moved just inside, and values beyond the bounds,
        which the distribution never gives, have log-prob ``-inf``.
        """
        if value is getattr(self, "_sampled", None):
            return super().log_prob(value)
        eps = torch.finfo(value.dtype).eps
        span = self.high - self.low
        inside = value.clamp(self.low + eps * span, self.high - eps * span)
        log_prob = super().log_prob(inside)
        slack = 4 * eps * span
        outside = ((value < self.low - slack) | (value > self.high + slack)).any(-1)
        return log_prob.masked_fill(outside, -math.inf)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The squashed mean of the Gaussian ``[*B, n_agents, act_dim]``."""
        out = torch.tanh(self._loc)
        return self.low + (out + 1) * (self.high - self.low) / 2

    @property
    def mean(self) -> torch.Tensor:
        """Not the true mean (no closed form): the deterministic sample, as TorchRL returns."""
        return self.deterministic_sample

    def entropy(self) -> torch.Tensor:
        raise NotImplementedError("TanhNormal has no closed-form entropy; estimate it by sampling")


class Categorical(D.Categorical):
    """A categorical over ``n_actions``, one per agent.

    Args:
        logits: ``[*B, n_agents, n_actions]``; actions are ``[*B, n_agents]`` int64.
    """

    def __init__(
        self,
        logits: torch.Tensor | None = None,
        probs: torch.Tensor | None = None,
        validate_args: bool | None = None,
    ):
        super().__init__(probs=probs, logits=logits, validate_args=validate_args)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The most likely action ``[*B, n_agents]``."""
        return self.probs.argmax(-1)


class MaskedCategorical(Categorical):
    """A categorical whose masked-out actions have probability zero: never sampled, and the
    log-probs of the others are renormalised over the allowed actions.

    Args:
        logits: ``[*B, n_agents, n_actions]``.
        mask: ``[*B, n_agents, n_actions]`` bool, True where the action is allowed (the env's
            ``(group, "action_mask")``); every row needs at least one allowed action.

    Raises:
        ValueError: a mask of another shape or dtype, or a row with no allowed action.
    """

    def __init__(
        self,
        logits: torch.Tensor,
        mask: torch.Tensor,
        validate_args: bool | None = None,
    ):
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                "MaskedCategorical: mask must be a bool tensor [*B, n_agents, n_actions] (the "
                f"env's (group, 'action_mask')), got {type(mask).__name__}; is the action mask "
                "in the actor's input?"
            )
        if mask.dtype != torch.bool:
            raise ValueError(f"MaskedCategorical: mask must be bool, got {mask.dtype}")
        try:
            mask = mask.expand_as(logits)
        except RuntimeError:
            raise ValueError(
                f"MaskedCategorical: mask of shape {list(mask.shape)} does not match logits "
                f"{list(logits.shape)} ([*B, n_agents, n_actions])"
            ) from None
        if not bool(mask.any(-1).all()):
            raise ValueError("MaskedCategorical: a row of the mask allows no action")
        self.mask = mask
        neg = torch.finfo(logits.dtype).min
        super().__init__(logits=logits.masked_fill(~mask, neg), validate_args=validate_args)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-prob ``[*B, n_agents]`` of ``value`` ``[*B, n_agents]``; ``-inf`` for a masked
        action."""
        out = super().log_prob(value)
        # The mask broadcast to the value's shape: a value may carry sample dims in front.
        mask = self.mask.expand(*out.shape, self.mask.shape[-1])
        allowed = mask.gather(-1, value.long().expand(out.shape).unsqueeze(-1)).squeeze(-1)
        return out.masked_fill(~allowed, float("-inf"))

    def entropy(self) -> torch.Tensor:
        """Entropy ``[*B, n_agents]`` over the allowed actions."""
        p_log_p = torch.where(self.mask, self.probs * self.logits, torch.zeros_like(self.probs))
        return -p_log_p.sum(-1)
