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
from torch import nn
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all

__all__ = ["Categorical", "MaskedCategorical", "Normal", "TanhNormal"]

_LOG2 = math.log(2.0)
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))  # torch's Normal.log_prob constant


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


class TanhNormal(D.Distribution):
    """A Gaussian squashed by ``tanh`` into ``[low, high]``, independent over the last dim.

    The log-prob includes the change of variables. ``entropy`` has no closed form: losses
    estimate it from a sample (``-log_prob(rsample())``).

    The values are torch's ``Independent(TransformedDistribution(Normal(loc, scale),
    [TanhTransform(), AffineTransform(...)]), 1)`` bit for bit (the same samples for the same
    random state, the same log-probs), computed in closed form: without the transform objects,
    their caches and the per-call dispatch, a log-prob costs less than half as much (it runs at
    every PPO update). The affine map is left out for ``[-1, 1]`` given as numbers, where it is
    the identity.

    Args:
        loc: mean of the Gaussian before squashing ``[*B, n_agents, act_dim]``.
        scale: its standard deviation, the same shape (positive).
        low, high: the action bounds (floats or tensors broadcastable to ``loc``).
        validate_args: check ``loc`` (not NaN) and ``scale`` (positive) here, and the values
            given to :meth:`log_prob` (not NaN); ``None``: torch's default (on).
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
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
        self.loc, self.scale = broadcast_all(loc, scale)
        self.low = torch.as_tensor(low, dtype=loc.dtype, device=loc.device)
        self.high = torch.as_tensor(high, dtype=loc.dtype, device=loc.device)
        self._unit = unit
        if not unit:  # y = mid + half * tanh(u)
            self._half = (self.high - self.low) / 2
            self._mid = self.low + self._half
        self._sampled: torch.Tensor | None = None  # the last sample and its pre-tanh value
        self._pre: torch.Tensor | None = None
        shape = self.loc.shape
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)

    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.interval(self.low, self.high), 1)

    def _squash(self, u: torch.Tensor) -> torch.Tensor:
        y = u.tanh()
        if not self._unit:
            y = self._mid + self._half * y
        self._sampled, self._pre = y, u
        return y

    def rsample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        eps = torch.empty(shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
        return self._squash(self.loc + eps * self.scale)

    def sample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = ()) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        with torch.no_grad():
            return self._squash(torch.normal(self.loc.expand(shape), self.scale.expand(shape)))

    def _log_prob_of(self, u: torch.Tensor) -> torch.Tensor:
        """The log-prob of pre-``tanh`` values ``u``, summed over the action dims, in torch's
        order of operations."""
        if self._validate_args and not bool((u == u).all()):
            raise ValueError(
                f"TanhNormal.log_prob: the value maps to NaN before tanh (shape "
                f"{tuple(u.shape)}): is the action NaN?"
            )
        log_prob: torch.Tensor | float = 0.0
        if not self._unit:  # AffineTransform's log |det J|, expanded over the value
            log_prob = log_prob - torch.abs(self._half).log().expand(u.shape)
        log_prob = log_prob - 2.0 * (_LOG2 - u - nn.functional.softplus(-2.0 * u))
        var = self.scale**2
        normal = -((u - self.loc) ** 2) / (2 * var) - self.scale.log() - _LOG_SQRT_2PI
        return (log_prob + normal).sum(-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-prob ``[*B, n_agents]`` of ``value`` ``[*B, n_agents, act_dim]``.

        The last sample of this distribution is scored from its own pre-``tanh`` value (exact
        and with the right gradient even where ``tanh`` rounds to the bound, beyond about 8 in
        float32). Any other value is mapped back through ``atanh``: values on the bounds (or
        rounded a few ulps past them) are moved just inside, and values beyond the bounds,
        which the distribution never gives, have log-prob ``-inf``.
        """
        if value is self._sampled and self._pre is not None:
            return self._log_prob_of(self._pre)
        eps = torch.finfo(value.dtype).eps
        span = self.high - self.low
        inside = value.clamp(self.low + eps * span, self.high - eps * span)
        unit = inside if self._unit else (inside - self._mid) / self._half
        log_prob = self._log_prob_of(torch.atanh(unit))
        slack = 4 * eps * span
        outside = ((value < self.low - slack) | (value > self.high + slack)).any(-1)
        return log_prob.masked_fill(outside, -math.inf)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The squashed mean of the Gaussian ``[*B, n_agents, act_dim]``."""
        out = torch.tanh(self.loc)
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
