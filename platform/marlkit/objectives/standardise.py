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

from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_real
from marlkit.data.keys import NestedKey

__all__ = ["RewardStandardiser", "RunningMeanStd", "SeedRewardStandardiser"]


def _merge(
    mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, values: torch.Tensor, dim: int
) -> None:
    """Chan et al.'s merge of ``values``' moments along ``dim`` into ``mean``, ``var`` and
    ``count`` (in place; ``count`` has ``mean``'s shape without ``dim``'s trailing features:
    a scalar for one set of statistics, ``[K]`` for one per seed)."""
    n = values.shape[dim]
    batch_mean = values.mean(dim, keepdim=dim > 0)
    batch_var = values.var(dim, correction=1 if n > 1 else 0, keepdim=dim > 0)
    weight = count.to(mean.dtype).reshape(*count.shape, *([1] * (mean.dim() - count.dim())))
    total = weight + n
    delta = batch_mean - mean
    m2 = var * weight + batch_var * n + delta.square() * weight * n / total
    mean.add_(delta * n / total)
    var.copy_(m2 / total)
    count.add_(n)


def _check_values(owner: str, name: str, values: object, fits: bool, shape: str) -> None:
    """Raise naming ``name`` unless ``values`` is a floating-point tensor that ``fits``
    ``shape``, has entries, all finite."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise TypeError(
            f"{owner}: {name} must be a floating-point tensor, got "
            f"{getattr(values, 'dtype', type(values).__name__)}"
        )
    if not fits:
        raise ValueError(f"{owner}: {name} must have shape {shape}, got {tuple(values.shape)}")
    if values.numel() == 0:
        raise ValueError(f"{owner}: {name} is empty (shape {tuple(values.shape)})")
    if not torch.isfinite(values).all():
        raise ValueError(f"{owner}: {name} has NaN or infinite entries")


def _rewards(
    owner: str, keys: Sequence[NestedKey], td: TensorDictBase
) -> tuple[list[NestedKey], list[torch.Tensor]]:
    """The reward entries of ``keys`` that ``td`` holds, and their values; a batch with none of
    them is a ``KeyError`` naming what it holds."""
    present = [k for k in keys if td.get(k, None) is not None]
    if not present:
        raise KeyError(
            f"{owner}: the batch has none of the reward entries {list(keys)}; "
            f"it has {sorted(map(str, td.keys(True, True)))}"
        )
    return present, [td.get(k) for k in present]


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
        k = len(self.shape)
        shape = f"[N, ..., {', '.join(map(str, self.shape))}] (trailing {self.shape})"
        fits = isinstance(values, torch.Tensor) and (
            values.dim() >= k + 1 and tuple(values.shape[values.dim() - k :]) == self.shape
        )
        _check_values("RunningMeanStd", name, values, fits, shape)
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
        _merge(self.mean, self.var, self.count, flat, 0)

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
        present, rewards = _rewards("RewardStandardiser", self.keys, td)
        for key, value in zip(present, rewards):
            self.stats._samples(value, f"{key!r}")
        self.stats.update(torch.cat([r.reshape(-1, 1) for r in rewards]))
        out = td.copy()
        for key, value in zip(present, rewards):
            out.set(key, self.stats.normalise(value).to(value.dtype))
        return out


class SeedRewardStandardiser(torch.nn.Module):
    """:class:`RewardStandardiser` for ``n_seeds`` seeds trained as one stack
    (``seeds_in_process``): batches ``[K, ...]`` whose first dim is the seed, each seed's
    rewards standardised by statistics of its own (seed ``k``'s as its own run's
    :class:`RewardStandardiser` would keep them), merged for every seed at once.

    :meth:`seed_state_dict` / :meth:`load_seed_state_dict` give seed ``k``'s share in the
    layout of a lone run's standardiser (``stats.mean``, ``stats.var``, ``stats.count``), so a
    seed's checkpoint holds what its own run's would.

    Args:
        keys: the reward entries, each ``[K, ..., 1]``.
        n_seeds: ``K``.
        epsilon: each seed's initial weight (:class:`RunningMeanStd`'s).

    Raises:
        ValueError: no keys, ``n_seeds`` below 1, a non-positive ``epsilon``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.objectives.standardise import SeedRewardStandardiser
        >>> standardise = SeedRewardStandardiser([("next", "agents", "reward")], n_seeds=2)
        >>> rewards = torch.tensor([[0.0, 2.0], [0.0, 20.0]]).reshape(2, 2, 1, 1)
        >>> td = TensorDict({("next", "agents", "reward"): rewards}, [2, 2])
        >>> out = standardise(td)["next", "agents", "reward"].reshape(2, 2)
        >>> [[round(r, 3) for r in row] for row in out.tolist()]  # each seed on its own scale
        [[-0.707, 0.707], [-0.707, 0.707]]
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, keys: Sequence[NestedKey], n_seeds: int, epsilon: float = 1e-4):
        super().__init__()
        self.keys = [k if isinstance(k, str) else tuple(k) for k in keys]
        if not self.keys:
            raise ValueError("SeedRewardStandardiser: keys must name at least one reward entry")
        if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
            raise ValueError(
                f"SeedRewardStandardiser: n_seeds must be an int >= 1, got {n_seeds!r}"
            )
        epsilon = check_real("epsilon", epsilon, low=0.0, owner="SeedRewardStandardiser")
        self.n_seeds = n_seeds
        self.register_buffer("mean", torch.zeros(n_seeds, 1))
        self.register_buffer("var", torch.ones(n_seeds, 1))
        self.register_buffer("count", torch.full((n_seeds,), float(epsilon), dtype=torch.float64))

    def _rows(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        """``value`` ``[K, ..., 1]`` as ``[K, N]``, checked."""
        fits = isinstance(value, torch.Tensor) and (
            value.dim() >= 2 and value.shape[0] == self.n_seeds and value.shape[-1] == 1
        )
        shape = f"[{self.n_seeds} seeds, ..., 1]"
        _check_values("SeedRewardStandardiser", f"{key!r}", value, fits, shape)
        return value.reshape(self.n_seeds, -1)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        present, rewards = _rewards("SeedRewardStandardiser", self.keys, td)
        rows = torch.cat([self._rows(k, r) for k, r in zip(present, rewards)], 1)
        with torch.no_grad():  # each seed's row merged into its statistics
            _merge(self.mean, self.var, self.count, rows.to(self.mean.dtype), 1)
        out = td.copy()
        for key, value in zip(present, rewards):
            shape = (self.n_seeds,) + (1,) * (value.dim() - 1)
            scaled = (value - self.mean.view(shape)) / self.var.sqrt().view(shape)
            out.set(key, scaled.to(value.dtype))
        return out

    def seed_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Seed ``k``'s statistics, as its own run's :class:`RewardStandardiser` saves them."""
        return {
            "stats.mean": self.mean[k].clone(),
            "stats.var": self.var[k].clone(),
            "stats.count": self.count[k].clone(),
        }

    def load_seed_state_dict(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Seed ``k``'s statistics from :meth:`seed_state_dict`'s (or a lone run's) layout.

        Raises:
            KeyError: an entry missing. ValueError: an entry of another shape.
        """
        for name, target in (("mean", self.mean), ("var", self.var), ("count", self.count)):
            entry = f"stats.{name}"
            if entry not in state:
                raise KeyError(f"SeedRewardStandardiser: the state has no {entry!r}")
            value = torch.as_tensor(state[entry])
            if value.shape != target[k].shape:
                raise ValueError(
                    f"SeedRewardStandardiser: {entry!r} has shape {tuple(value.shape)}, "
                    f"expected {tuple(target[k].shape)}"
                )
            target[k].copy_(value)

    def extra_repr(self) -> str:
        return f"n_seeds={self.n_seeds}, keys={self.keys}"
