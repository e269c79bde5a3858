"""Training curves as images, and confidence intervals over seeds.

:func:`plot_curves` draws metrics logged by a :class:`~marlkit.record.CSVLogger` (the rows of
:func:`~marlkit.record.read_metrics`) against one of them; :func:`bootstrap_ci` and
:func:`plot_with_bands` summarise a result over seeds as a mean and a percentile-bootstrap
confidence band. The plots are drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas
(no ``pyplot``: the global backend and any open figures are left alone). Needs the ``train``
extra (matplotlib); :func:`bootstrap_ci` needs only NumPy.

Example:
    >>> import numpy as np
    >>> from marlkit.record import bootstrap_ci
    >>> mean, low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    >>> float(mean), bool(low < mean < high)
    (2.5, True)
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from marlkit._checks import check_int, check_real
from marlkit._utils import import_optional

__all__ = ["ConfidenceInterval", "bootstrap_ci", "plot_curves", "plot_with_bands"]


class ConfidenceInterval(NamedTuple):
    """The mean over seeds and its confidence interval, each of shape ``values.shape[1:]``
    (0-d for values ``[seeds]``: ``float(ci.mean)`` is a number)."""

    mean: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]


def bootstrap_ci(
    values: ArrayLike,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> ConfidenceInterval:
    """Percentile-bootstrap confidence interval of the mean over seeds.

    The seeds are resampled with replacement ``n_resamples`` times (all at once, as counts),
    and the interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of
    the resampled means. Identical values give an interval of zero width; NaN values give NaN.

    Args:
        values: ``[seeds]`` (one number per seed) or ``[seeds, points]`` (a curve per seed,
            say), any trailing shape; axis 0 is the seeds.
        confidence: the coverage, in (0, 1).
        n_resamples: bootstrap resamples, >= 1.
        seed: seed of the resampling (the same seed gives the same interval).

    Returns:
        ``(mean, low, high)``, each of shape ``values.shape[1:]``.

    Raises:
        ValueError: no values (or a 0-d array), or ``confidence`` outside (0, 1).
    """
    data = np.asarray(values, dtype=np.float64)
    if data.ndim == 0 or data.shape[0] < 1:
        raise ValueError(
            f"bootstrap_ci needs values of shape [seeds, ...] with at least one seed, got shape "
            f"{list(data.shape)}"
        )
    confidence = check_real("confidence", confidence, below=1.0)
    n_resamples = check_int("n_resamples", n_resamples, low=1)
    n_seeds = data.shape[0]
    rng = np.random.default_rng(seed)
    # How often each seed is drawn in each resample: [n_resamples, seeds].
    counts = rng.multinomial(n_seeds, np.full(n_seeds, 1.0 / n_seeds), size=n_resamples)
    # Means as the first seed's value plus the mean deviation from it: identical values give
    # deviations of exactly zero, so the mean and every resampled mean are that value.
    origin = data[0]
    deviations = (data - origin).reshape(n_seeds, -1)  # [seeds, points]
    mean = origin + deviations.mean(axis=0).reshape(origin.shape)
    means = origin.reshape(-1) + (counts @ deviations) / n_seeds  # [n_resamples, points]
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    shape = data.shape[1:]
    return ConfidenceInterval(np.asarray(mean), low.reshape(shape), high.reshape(shape))


def _matplotlib(purpose: str) -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``, or the ImportError naming the ``train`` extra."""
    import_optional("matplotlib", extra="train", purpose=purpose)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def _save(figure: Any, canvas_type: Any, path: str | os.PathLike[str]) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas_type(figure)
    figure.savefig(path)
    return path


def plot_curves(
    rows: Sequence[Mapping[str, float]],
    path: str | os.PathLike[str],
    *,
    x: str = "frames",
    y: Sequence[str] | str,
    title: str | None = None,
) -> pathlib.Path:
    """Draw logged metrics against one of them, one line per metric.

    Args:
        rows: the logged rows, ``[{name: value, ...}, ...]`` (e.g. ``CSVLogger.rows()``); a row
            without ``x`` or without a metric is left out of that metric's line.
        path: the image, PNG (or another format matplotlib knows by the suffix); its folder is
            created.
        x: the metric on the x axis (``"step"`` for a CSV logger's step column).
        y: the metrics to draw (a name or a sequence of names).
        title: the title of the plot.

    Returns:
        ``path``.

    Raises:
        ValueError: ``x`` or a ``y`` is in no row (the message lists the names present), or
            ``y`` is empty.
        ImportError: matplotlib is not installed (the ``train`` extra).
    """
    names = [y] if isinstance(y, str) else list(y)
    if not names:
        raise ValueError("plot_curves needs at least one metric in y")
    present = list(dict.fromkeys(k for row in rows for k in row))
    for key in (x, *names):
        if key not in present:
            raise ValueError(
                f"metric {key!r} is in no row; the rows hold: {', '.join(present) or 'nothing'}"
            )
    Figure, canvas_type = _matplotlib("plot_curves")
    figure = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for name in names:
        points = [(row[x], row[name]) for row in rows if x in row and name in row]
        xs, ys = zip(*points) if points else ((), ())
        # A line through one point draws nothing: few points get markers.
        axes.plot(xs, ys, label=name, marker="o" if len(points) <= 10 else None)
    axes.set_xlabel(x)
    if len(names) == 1:
        axes.set_ylabel(names[0])
    else:
        axes.legend()
    axes.grid(alpha=0.3)
    if title is not None:
        axes.set_title(title)
    return _save(figure, canvas_type, path)


def plot_with_bands(
    curves: Mapping[str, tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
) -> pathlib.Path:
    """Draw mean curves with shaded confidence bands (results over seeds, say).

    Args:
        curves: ``{label: (x, mean, low, high)}``, four arrays ``[points]`` each (e.g. ``x`` the
            frames and ``bootstrap_ci(returns)`` for ``returns [seeds, points]``).
        path: the image, PNG (or another format matplotlib knows by the suffix); its folder is
            created.
        xlabel: the x axis' label.
        ylabel: the y axis' label.
        title: the title of the plot.

    Returns:
        ``path``.

    Raises:
        ValueError: no curves, or a curve whose arrays are not 1-D of one length.
        ImportError: matplotlib is not installed (the ``train`` extra).
    """
    if not curves:
        raise ValueError("plot_with_bands needs at least one curve")
    arrays: dict[str, list[NDArray[np.float64]]] = {}
    for label, curve in curves.items():
        if len(curve) != 4:
            raise ValueError(
                f"curve {label!r} must be (x, mean, low, high), got {len(curve)} arrays"
            )
        parts = [np.asarray(a, dtype=np.float64) for a in curve]
        shapes = [list(a.shape) for a in parts]
        if any(a.ndim != 1 for a in parts) or len({a.shape for a in parts}) != 1:
            raise ValueError(
                f"curve {label!r}: x, mean, low and high must be 1-D arrays of one length, got "
                f"shapes {shapes}"
            )
        arrays[label] = parts
    Figure, canvas_type = _matplotlib("plot_with_bands")
    figure = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for label, (xs, mean, low, high) in arrays.items():
        (line,) = axes.plot(xs, mean, label=label)
        axes.fill_between(xs, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.legend()
    axes.grid(alpha=0.3)
    if title is not None:
        axes.set_title(title)
    return _save(figure, canvas_type, path)
