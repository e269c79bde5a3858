"""Reward standardisation by a running mean and variance, as EPyMARL's ``standardise_rewards``
(its ``components/standarize_stream.py``, from fast-marl; exact running moments, where
:class:`~marlkit.modules.ValueNorm` keeps MAPPO's exponential averages of value targets):
every training batch first updates the statistics with its rewards, then its rewards become
``(r - mean) / sqrt(var)``.

:class:`RunningMeanStd` holds the statistics as buffers (``state_dict`` saves them, so a
resumed run goes on with the same scale); :class:`RewardStandardiser` applies one to the reward
entries of a sampled TensorDict before a loss reads them.

Examples:
    >>> import torch
    >>> from marlkit.objectives.standardise import RunningMeanStd
    >>> stats = RunningMeanStd()
    >>> stats.update(torch.tensor([[0.0], [0.0], [1.0], [1.0]]))
    >>> round(float(stats.mean), 3), round(float(stats.var), 3)
    (0.5, 0.333)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_real
from marlkit.data.keys import NestedKey

__all__ = ["RewardStandardiser", "RunningMeanStd"]


class RunningMeanStd(torch.nn.Module):
    """The mean and variance of every value seen so far, per feature of the last ``shape``
    dimensions, merged batch by batch (Chan et al.'s parallel algorithm, EPyMARL's
    ``RunningMeanStd``): the statistics start at mean 0, variance 1 with a weight of
    ``epsilon`` samples, and each batch's variance is the unbiased one (torch's ``var``).

    Args:
        shape: the trailing shape of one sample's features (``(1,)``: the last entry of a
            reward ``[..., 1]``; every leading dimension is pooled).
        epsilon: the weight of the initial statistics, in samples (positive).

    Raises:
        ValueError: a non-positive ``epsilon``, a negative entry of ``shape``.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: Sequence[int] = (1,), epsilon: float = 1e-4):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        if any(s < 1 for s in self.shape):
            raise ValueError(f"RunningMeanStd: shape must have positive entries, got {shape}")
        epsilon = check_real("epsilon", epsilon, low=0.0, owner="RunningMeanStd")  # > 0
        self.register_buffer("mean", torch.zeros(self.shape))
        self.register_buffer("var", torch.ones(self.shape))
        self.register_buffer("count", torch.tensor(float(epsilon), dtype=torch.float64))

    def _samples(self, values: torch.Tensor, name: str) -> torch.Tensor:
        """``values`` ``[..., *shape]`` as ``[N, *shape]``, checked."""
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            raise TypeError(
                f"RunningMeanStd: {name} must be a floating-point tensor, got "
                f"{getattr(values, 'dtype', type(values).__name__)}"
            )
        k = len(self.shape)
        if values.dim() < k + 1 or tuple(values.shape[values.dim() - k :]) != self.shape:
            raise ValueError(
                f"RunningMeanStd: {name} must have shape "
                f"[N, ..., {', '.join(map(str, self.shape))}]"
                f" (trailing {self.shape}), got {tuple(values.shape)}"
            )
        if values.numel() == 0:
            raise ValueError(f"RunningMeanStd: {name} is empty (shape {tuple(values.shape)})")
        if not torch.isfinite(values).all():
            raise ValueError(f"RunningMeanStd: {name} has NaN or infinite entries")
        return values.reshape(-1, *self.shape)

    @torch.no_grad()
    def update(self, values: torch.Tensor) -> None:
        """Merge ``values`` ``[N, ..., *shape]`` (every dimension before ``shape`` pooled) into
        the statistics.

        Raises:
            TypeError: ``values`` not a floating-point tensor.
            ValueError: a trailing shape other than ``shape``; no values; NaN or inf.
        """
        flat = self._samples(values, "values").to(self.mean.dtype)
        n = flat.shape[0]
        batch_mean = flat.mean(0)
        batch_var = flat.var(0, correction=1 if n > 1 else 0)
        count = self.count.to(self.mean.dtype)
        total = count + n
        delta = batch_mean - self.mean
        m2 = self.var * count + batch_var * n + delta.square() * count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.add_(n)

    def normalise(self, values: torch.Tensor) -> torch.Tensor:
        """``(values - mean) / sqrt(var)``, ``values`` ``[..., *shape]`` (no update)."""
        self._samples(values, "values")
        return (values - self.mean) / self.var.sqrt()

    def extra_repr(self) -> str:
        return f"shape={self.shape}, count={float(self.count):.0f}"


class RewardStandardiser(torch.nn.Module):
    """Standardises the reward entries ``keys`` of a batch with one :class:`RunningMeanStd`
    over all of them (EPyMARL's common-reward case: one mean and variance of the team reward;
    every agent's ``[*B, n, 1]`` entry pooled into the same statistics): ``__call__(td)``
    updates the statistics with the batch's rewards, then returns a shallow copy of ``td``
    whose reward entries are standardised (``td`` itself is left as it was). Keys absent from
    a batch are skipped; a batch with none of them is an error.

    Args:
        keys: the reward entries, e.g. ``[("next", "agents", "reward")]``; each ``[..., 1]``.
        epsilon: :class:`RunningMeanStd`'s initial weight.

    Raises:
        ValueError: no keys.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.objectives.standardise import RewardStandardiser
        >>> standardise = RewardStandardiser([("next", "agents", "reward")])
        >>> td = TensorDict({("next", "agents", "reward"): torch.tensor([[[0.0]], [[2.0]]])}, [2])
        >>> [round(r, 4) for r in standardise(td)["next", "agents", "reward"].flatten().tolist()]
        [-0.7071, 0.7071]
    """

    def __init__(self, keys: Sequence[NestedKey], epsilon: float = 1e-4):
        super().__init__()
        self.keys = [k if isinstance(k, str) else tuple(k) for k in keys]
        if not self.keys:
            raise ValueError("RewardStandardiser: keys must name at least one reward entry")
        self.stats = RunningMeanStd((1,), epsilon)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        present = [k for k in self.keys if td.get(k, None) is not None]
        if not present:
            raise KeyError(
                f"RewardStandardiser: the batch has none of the reward entries {self.keys}; "
                f"it has {sorted(map(str, td.keys(True, True)))}"
            )
        rewards = [td.get(k) for k in present]
        for key, value in zip(present, rewards):
            self.stats._samples(value, f"{key!r}")
        self.stats.update(torch.cat([r.reshape(-1, 1) for r in rewards]))
        out = td.copy()
        for key, value in zip(present, rewards):
            out.set(key, self.stats.normalise(value).to(value.dtype))
        return out
