"""The results of an experiment grid, with the statistics reviewers ask for.

A grid folder (:mod:`marlkit.train.experiment`) holds ``index.json``, one entry per run
(task, algorithm, seed, status, run folder), and each finished run's folder holds the
``metrics.csv`` and ``summary.json`` of its :class:`~marlkit.train.TrainingRun`. This module
reads them and reports:

* :func:`load_results`: a :class:`Results` table, one :class:`RunResult` per run of the index
  (those not done are listed, with no score, never dropped): the final score (the trained
  policy's evaluation in ``summary.json``) and the evaluation curve (``eval/`` columns of
  ``metrics.csv``) of each.
* per task, :func:`task_curves`: the mean evaluation return over seeds against the frames,
  with a stratified-bootstrap band;
* across tasks, on scores normalised per task by a random and a reference score
  (``(score - random) / (reference - random)``): :func:`aggregate_scores` (IQM, mean, median,
  optimality gap with stratified-bootstrap intervals), :func:`performance_profiles` and
  :func:`probability_of_improvement`. All are computed by `rliable
  <https://github.com/google-research/rliable>`_ (Agarwal et al., 2021), the reference
  implementation, from the ``train`` extra.
* :func:`marl_eval_json`: the results in marl-eval's JSON layout (what BenchMARL exports), and
  :func:`write_report`: ``report.md`` with PNGs, ``report.html`` (images embedded) and
  ``marl_eval.json`` written into the grid folder.

A run's score on a task is the task's ``metric`` in ``grid.json`` (``"agents/episode_reward"``
by default: the name the run logs, without ``eval/``), or any name given as ``metric=``;
``"return"`` is the mean over the run's agent groups of their ``<group>/episode_reward``
(BenchMARL's ``return``). The normalisation references (``random``, ``reference``) come from
``grid.json`` too, or from ``references=``.

The index is read as JSON only (nothing is unpickled) and checked entry by entry; a run or log
path that leads outside the grid folder (``..``, an absolute path elsewhere, a symbolic link)
is refused.

See ``docs/statistics.md``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import importlib
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import sys
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from marlkit._checks import check_int, check_real
from marlkit._utils import import_optional
from marlkit.record import read_metrics

__all__ = [
    "AGGREGATES",
    "RETURN",
    "Interval",
    "Results",
    "RunResult",
    "aggregate_scores",
    "load_results",
    "marl_eval_json",
    "performance_profiles",
    "probability_of_improvement",
    "task_curves",
    "write_report",
]

INDEX = "index.json"
GRID_SPEC = "grid.json"
STATUSES = ("pending", "running", "done", "failed")
#: The aggregate metrics of :func:`aggregate_scores`, in order.
AGGREGATES = ("IQM", "Mean", "Median", "Optimality gap")
_EVAL = "eval/"
_REWARD = "/episode_reward"
#: The mean over a run's groups of their ``<group>/episode_reward``.
RETURN = "return"


class Interval(NamedTuple):
    """A point estimate and its confidence interval (numbers, or arrays of one shape)."""

    point: Any
    low: Any
    high: Any


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run of the grid, as the index and its folder describe it.

    Attributes:
        name, task, algorithm, seed, status: the index entry's (``algorithm`` is the method's
            label: the entry's algorithm, followed by ``+<override set>`` when the entry
            names one).
        run_dir: the run's folder (inside the grid folder).
        final: the final evaluation's metrics (``summary.json``'s ``"trained"``:
            ``{"<group>/episode_reward": ..., "return": ..., ...}``); empty unless the run is
            done.
        evaluations: ``(iteration, frames, metrics)`` of each evaluation logged in
            ``metrics.csv`` (the curve), in order; the metrics named without ``eval/``.
        log, returncode, wall_s: the index entry's, where it has them.
    """

    name: str
    task: str
    algorithm: str
    seed: int
    status: str
    run_dir: pathlib.Path
    final: Mapping[str, float] = dataclasses.field(default_factory=dict)
    evaluations: tuple[tuple[int, int, Mapping[str, float]], ...] = ()
    log: pathlib.Path | None = None
    returncode: int | None = None
    wall_s: float | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"

    def score(self, metric: str = RETURN) -> float:
        """The final ``metric`` (raises ``KeyError`` when the run has none: not done, or a
        group it does not have)."""
        if metric not in self.final:
            raise KeyError(
                f"run {self.name!r} ({self.status}) has no final {metric!r}; it has "
                f"{sorted(self.final)}"
            )
        return self.final[metric]


@dataclasses.dataclass(frozen=True)
class Results:
    """The runs of a grid and the per-task normalisation references.

    Attributes:
        grid_dir: the grid folder.
        runs: every run of the index, in its order, done or not.
        references: ``{task: (random, reference)}``: the scores that normalise to 0 and 1.
        metrics: ``{task: metric}``: what each task is scored by (``grid.json``'s); a task
            not in it is scored by :data:`RETURN`.
    """

    grid_dir: pathlib.Path
    runs: tuple[RunResult, ...]
    references: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def metric_of(self, task: str, metric: str | None = None) -> str:
        """``metric``, or the task's own when ``None``."""
        return metric if metric is not None else self.metrics.get(task, RETURN)

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.runs))

    @property
    def algorithms(self) -> list[str]:
        return list(dict.fromkeys(r.algorithm for r in self.runs))

    @property
    def done(self) -> list[RunResult]:
        return [r for r in self.runs if r.done]

    @property
    def not_done(self) -> list[RunResult]:
        return [r for r in self.runs if not r.done]

    def normalise(self, task: str, score: Any) -> Any:
        """``(score - random) / (reference - random)`` with the task's references.

        Raises:
            KeyError: the task has no references (the message names the tasks that lack one).
        """
        if task not in self.references:
            missing = [t for t in self.tasks if t not in self.references]
            raise KeyError(
                f"task {task!r} has no normalisation references: give every task "
                f"{{random: <score>, reference: <score>}} under 'references' of the grid (or "
                f"references= here); missing for {missing}"
            )
        low, high = self.references[task]
        return (np.asarray(score, dtype=np.float64) - low) / (high - low)

    def score_matrices(
        self, metric: str | None = None, *, normalised: bool = True
    ) -> tuple[dict[str, NDArray[np.float64]], dict[str, list[int]]]:
        """Each algorithm's final scores as rliable takes them, ``[runs, tasks]`` (tasks in
        :attr:`tasks` order), over the seeds done on every task; and the seeds left out.
        ``metric``: what every task is scored by (default: each task's own).

        Raises:
            ValueError: no done run, or an algorithm without a seed done on every task.
            KeyError: ``normalised`` and a task without references.
        """
        if not self.done:
            raise ValueError(f"no run of the grid in {str(self.grid_dir)!r} is done yet")
        tasks = self.tasks
        matrices: dict[str, NDArray[np.float64]] = {}
        left_out: dict[str, list[int]] = {}
        for algorithm in self.algorithms:
            by_seed: dict[int, dict[str, float]] = {}
            for run in self.done:
                if run.algorithm == algorithm:
                    score = run.score(self.metric_of(run.task, metric))
                    by_seed.setdefault(run.seed, {})[run.task] = score
            complete = sorted(s for s, scores in by_seed.items() if len(scores) == len(tasks))
            left_out[algorithm] = sorted(
                {r.seed for r in self.runs if r.algorithm == algorithm} - set(complete)
            )
            if not complete:
                raise ValueError(
                    f"algorithm {algorithm!r} has no seed done on every task {tasks}: statistics "
                    f"across tasks need one (runs not done: "
                    f"{[r.name for r in self.not_done if r.algorithm == algorithm]})"
                )
            matrix = np.array([[by_seed[s][t] for t in tasks] for s in complete])
            if normalised:
                matrix = np.stack([self.normalise(t, matrix[:, i]) for i, t in enumerate(tasks)], 1)
            matrices[algorithm] = matrix
        return matrices, left_out


# ----------------------------------------------------------------------------- reading
def _inside(grid: pathlib.Path, value: object, what: str) -> pathlib.Path:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty path string, got {value!r}")
    path = (grid / value).resolve()
    if not path.is_relative_to(grid):
        raise ValueError(
            f"{what} {value!r} leads outside the grid folder {str(grid)!r} (to {str(path)!r}); "
            "the index is refused"
        )
    return path


def _entry(grid: pathlib.Path, i: int, entry: object) -> dict[str, Any]:
    where = f"{INDEX} entry {i}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object, got {type(entry).__name__}")
    for key in ("name", "task", "algorithm", "seed", "status", "run_dir"):
        if key not in entry:
            raise ValueError(f"{where} has no {key!r} (it has {sorted(entry)})")
    for key in ("name", "task", "algorithm"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise ValueError(f"{where}: {key!r} must be a non-empty string, got {entry[key]!r}")
    seed = entry["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{where}: 'seed' must be an int, got {seed!r}")
    if entry["status"] not in STATUSES:
        raise ValueError(f"{where}: 'status' must be one of {STATUSES}, got {entry['status']!r}")
    overrides = entry.get("overrides")
    if overrides is not None and not isinstance(overrides, str):
        raise ValueError(f"{where}: 'overrides' must be an override set's name, got {overrides!r}")
    returncode, wall = entry.get("returncode"), entry.get("wall_s")
    if returncode is not None and (isinstance(returncode, bool) or not isinstance(returncode, int)):
        raise ValueError(f"{where}: 'returncode' must be an int or null, got {returncode!r}")
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float))):
        raise ValueError(f"{where}: 'wall_s' must be a number or null, got {wall!r}")
    log = entry.get("log")
    return {
        "name": entry["name"],
        "task": entry["task"],
        "algorithm": entry["algorithm"],
        "overrides": overrides,
        "seed": seed,
        "status": entry["status"],
        "run_dir": _inside(grid, entry["run_dir"], f"{where}: 'run_dir'"),
        "log": None if log is None else _inside(grid, log, f"{where}: 'log'"),
        "returncode": returncode,
        "wall_s": None if wall is None else float(wall),
    }


def _marl_eval_name(name: str) -> str:
    """marl-eval's (BenchMARL's) name of a metric: ``<group>_return`` for a group's episode
    reward, the others with ``/`` as ``_``."""
    if name.endswith(_REWARD) and name.count("/") == 1:
        return name[: -len(_REWARD)] + "_return"
    return name.replace("/", "_")


def _with_return(metrics: dict[str, float], where: str) -> dict[str, float]:
    groups = [v for k, v in metrics.items() if k.endswith(_REWARD) and k.count("/") == 1]
    if groups:
        metrics[RETURN] = float(np.mean(groups))
    for key, value in metrics.items():
        if not math.isfinite(value):
            raise ValueError(f"{where}: {key!r} is {value}; a score must be a finite number")
    return metrics


def _read_run(entry: Mapping[str, Any]) -> RunResult:
    folder: pathlib.Path = entry["run_dir"]
    evaluations: list[tuple[int, int, Mapping[str, float]]] = []
    final: dict[str, float] = {}
    csv = folder / "metrics.csv"
    if csv.is_file():
        for row in read_metrics(csv):
            metrics = {k[len(_EVAL) :]: v for k, v in row.items() if k.startswith(_EVAL)}
            if metrics and "frames" in row:
                where = f"run {entry['name']!r}: metrics.csv at step {int(row['step'])}"
                evaluations.append(
                    (int(row["step"]), int(row["frames"]), _with_return(metrics, where))
                )
    if entry["status"] == "done":
        summary_path = folder / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(
                f"run {entry['name']!r} is marked done in {INDEX} but {str(summary_path)!r} does "
                "not exist"
            )
        try:
            summary = json.loads(summary_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{str(summary_path)!r} is not valid JSON: {err}") from err
        trained = summary.get("trained") if isinstance(summary, dict) else None
        if not isinstance(trained, dict):
            raise ValueError(f"{str(summary_path)!r} has no 'trained' evaluation")
        final = {
            str(k): float(v)
            for k, v in trained.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if not any(k.endswith(_REWARD) for k in final):
            raise ValueError(
                f"{str(summary_path)!r}: the 'trained' evaluation has no '<group>/episode_reward' "
                f"(it has {sorted(trained)})"
            )
        final = _with_return(final, f"run {entry['name']!r}: summary.json")
    fields = {k: entry[k] for k in ("name", "task", "algorithm", "seed", "status", "run_dir")}
    return RunResult(
        **fields,
        final=final,
        evaluations=tuple(evaluations),
        log=entry["log"],
        returncode=entry["returncode"],
        wall_s=entry["wall_s"],
    )


def _check_references(references: object, where: str) -> dict[str, tuple[float, float]]:
    if not isinstance(references, Mapping):
        raise TypeError(
            f"{where} must be a mapping {{task: {{random, reference}}}}, got {references!r}"
        )
    out: dict[str, tuple[float, float]] = {}
    for task, ref in references.items():
        if not isinstance(ref, Mapping) or set(ref) != {"random", "reference"}:
            raise ValueError(
                f"{where}[{task!r}] must be {{random: <score>, reference: <score>}}, got {ref!r}"
            )
        low = check_real(f"{where}[{task!r}]['random']", ref["random"], low=None)
        high = check_real(f"{where}[{task!r}]['reference']", ref["reference"], low=None)
        if low == high:
            raise ValueError(
                f"{where}[{task!r}]: random and reference are both {low}: they must differ "
                "(they are the scores normalised to 0 and 1)"
            )
        out[str(task)] = (low, high)
    return out


def _grid_tasks(grid: pathlib.Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The references and metrics of ``grid.json``'s tasks (``{}`` without the file)."""
    spec = grid / GRID_SPEC
    if not spec.is_file():
        return {}, {}
    try:
        data = json.loads(spec.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(spec)!r} is not valid JSON: {err}") from err
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict):
        raise ValueError(f"{str(spec)!r} has no 'tasks' mapping")
    references: dict[str, Any] = {}
    metrics: dict[str, str] = {}
    for name, task in tasks.items():
        if not isinstance(task, dict):
            raise ValueError(f"{str(spec)!r}: task {name!r} must be an object, got {task!r}")
        if task.get("random") is not None or task.get("reference") is not None:
            references[name] = {"random": task.get("random"), "reference": task.get("reference")}
        if task.get("metric") is not None:
            if not isinstance(task["metric"], str):
                raise ValueError(f"{str(spec)!r}: task {name!r}: 'metric' must be a string")
            metrics[name] = task["metric"]
    return references, metrics


def load_results(
    grid_dir: str | os.PathLike[str],
    *,
    references: Mapping[str, Mapping[str, float]] | None = None,
) -> Results:
    """Read a grid folder's index and its runs' folders.

    Args:
        grid_dir: the grid folder (holding ``index.json``).
        references: ``{task: {"random": score, "reference": score}}`` normalising each task's
            scores; default: the ``random`` and ``reference`` of the tasks of the grid's
            ``grid.json``, where it gives them.

    A run's algorithm is the index entry's, followed by ``+<override set>`` when the grid has
    more than one override set. Each task's metric is ``grid.json``'s (default :data:`RETURN`).

    Raises:
        FileNotFoundError: no ``index.json``; a run marked done without its ``summary.json``.
        ValueError: an index that is not JSON, not a list of entries, an entry without its keys
            or with a value of the wrong type, a path out of the grid folder, two entries of one
            name or one (task, algorithm, seed); a NaN or infinite score; bad references.
    """
    grid = pathlib.Path(grid_dir).resolve()
    index = grid / INDEX
    if not index.is_file():
        raise FileNotFoundError(
            f"{str(index)!r} does not exist: {str(grid)!r} is not a grid folder (marlkit "
            "experiment writes its index.json)"
        )
    try:
        entries = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(index)!r} is not valid JSON: {err}") from err
    if not isinstance(entries, list):
        raise ValueError(f"{str(index)!r} must hold a list of runs, got {type(entries).__name__}")
    checked = [_entry(grid, i, e) for i, e in enumerate(entries)]
    if len({e["overrides"] for e in checked}) > 1:
        for e in checked:
            e["algorithm"] = f"{e['algorithm']}+{e['overrides']}"
    names, cells = set(), set()
    for e in checked:
        cell = (e["task"], e["algorithm"], e["seed"])
        if e["name"] in names or cell in cells:
            raise ValueError(f"{str(index)!r} lists run {e['name']!r} {cell} twice")
        names.add(e["name"])
        cells.add(cell)
    grid_refs, metrics = _grid_tasks(grid)
    refs = _check_references(
        grid_refs if references is None else references,
        "references" if references is not None else f"{GRID_SPEC}: tasks",
    )
    return Results(grid, tuple(_read_run(e) for e in checked), refs, metrics)


# ----------------------------------------------------------------------------- rliable
def _rliable() -> tuple[types.ModuleType, types.ModuleType]:
    """``(rliable.library, rliable.metrics)``, or the ImportError naming the ``train`` extra.

    rliable 1.2 pins ``arch<8``, and ``arch`` 7's ``__init__`` imports its time-series models,
    which use a private pandas decorator whose signature pandas 3 changed (``import arch``
    raises TypeError). rliable needs only ``arch.bootstrap``, which does not import those
    models: when ``import arch`` fails so, the package is entered without its ``__init__``.
    """
    import_optional("scipy", extra="train", purpose="rliable")
    if "rliable.library" not in sys.modules:
        try:
            importlib.import_module("arch.bootstrap")
        except TypeError:
            spec = importlib.util.find_spec("arch")
            if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
                raise
            for name in [n for n in sys.modules if n == "arch" or n.startswith("arch.")]:
                del sys.modules[name]
            bare = types.ModuleType("arch")
            bare.__path__ = list(spec.submodule_search_locations)
            bare.__spec__ = spec
            sys.modules["arch"] = bare
            importlib.import_module("arch.bootstrap")
        except ImportError as err:
            raise ImportError(
                f"rliable's dependency arch could not be imported ({err}); install it with: "
                "pip install 'marlkit[train]'"
            ) from err
    library = import_optional("rliable.library", extra="train", purpose="grid statistics")
    metrics = import_optional("rliable.metrics", extra="train", purpose="grid statistics")
    return library, metrics


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """rliable's bootstrap draws from NumPy's global generator: seed it for the call (the same
    seed gives the same intervals) and give the caller's state back after."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            # arch >= 7 deprecates the random_state keyword rliable passes (as None).
            warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
            yield
    finally:
        np.random.set_state(state)


def _intervals(point: Mapping[str, Any], ci: Mapping[str, Any]) -> dict[str, Interval]:
    return {
        k: Interval(np.asarray(point[k], dtype=np.float64), *np.asarray(ci[k], dtype=np.float64))
        for k in point
    }


def _check_bootstrap(reps: int, confidence: float, seed: int) -> tuple[int, float, int]:
    return (
        check_int("reps", reps, low=1),
        check_real("confidence", confidence, below=1.0),
        check_int("seed", seed, low=0),
    )


def aggregate_scores(
    results: Results,
    *,
    metric: str | None = None,
    normalised: bool = True,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, dict[str, Interval]]:
    """IQM, mean, median and optimality gap of each algorithm's final scores over runs and
    tasks (rliable's definitions: the IQM and the mean of every (run, task) score, the median
    of the per-task mean scores, the optimality gap ``mean(1 - min(score, 1))``), with
    stratified-bootstrap (percentile) intervals: rliable's
    ``get_interval_estimates`` with ``aggregate_iqm``, ``aggregate_mean``,
    ``aggregate_median`` and ``aggregate_optimality_gap`` (gamma 1).

    Args:
        results: from :func:`load_results`.
        metric: what every task is scored by (a name its runs log without ``eval/``, or
            :data:`RETURN`); default: each task's own (:attr:`Results.metrics`).
        normalised: normalise each task by its references (needed to aggregate across tasks).
        reps: bootstrap resamples.
        confidence: the intervals' coverage.
        seed: the resampling's seed.

    Returns:
        ``{algorithm: {"IQM"|"Mean"|"Median"|"Optimality gap": Interval}}`` (floats).

    Raises:
        KeyError: ``normalised`` and a task without references.
        ValueError: see :meth:`Results.score_matrices`.
    """
    reps, confidence, seed = _check_bootstrap(reps, confidence, seed)
    matrices, _ = results.score_matrices(metric, normalised=normalised)
    library, metrics = _rliable()

    def aggregates(scores: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.array(
            [
                metrics.aggregate_iqm(scores),
                metrics.aggregate_mean(scores),
                metrics.aggregate_median(scores),
                metrics.aggregate_optimality_gap(scores, 1.0),
            ]
        )

    with _seeded(seed):
        point, ci = library.get_interval_estimates(
            matrices, aggregates, reps=reps, confidence_interval_size=confidence
        )
    return {
        algo: {
            name: Interval(float(est.point[i]), float(est.low[i]), float(est.high[i]))
            for i, name in enumerate(AGGREGATES)
        }
        for algo, est in _intervals(point, ci).items()
    }


def performance_profiles(
    results: Results,
    taus: Sequence[float] | NDArray[np.float64] | None = None,
    *,
    metric: str | None = None,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[NDArray[np.float64], dict[str, Interval]]:
    """Score distributions: the fraction of (run, task) normalised scores above each
    threshold tau, with stratified-bootstrap bands (rliable's ``create_performance_profile``).

    Args:
        taus: the thresholds (default: 101 from the lowest score, or 0, to the highest, or 1).

    Returns:
        ``(taus, {algorithm: Interval of arrays [taus]})``.
    """
    reps, confidence, seed = _check_bootstrap(reps, confidence, seed)
    matrices, _ = results.score_matrices(metric, normalised=True)
    if taus is None:
        every = np.concatenate([m.ravel() for m in matrices.values()])
        taus = np.linspace(min(0.0, every.min()), max(1.0, every.max()), 101)
    grid = np.asarray(taus, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0 or not np.isfinite(grid).all():
        raise ValueError(f"taus must be a 1-D sequence of finite numbers, got {taus!r}")
    library, _ = _rliable()
    with _seeded(seed):
        point, ci = library.create_performance_profile(
            matrices, grid, reps=reps, confidence_interval_size=confidence
        )
    return grid, _intervals(point, ci)


def probability_of_improvement(
    results: Results,
    pairs: Sequence[tuple[str, str]] | None = None,
    *,
    metric: str | None = None,
    normalised: bool = True,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[tuple[str, str], Interval]:
    """P(X > Y): the probability that a run of algorithm X scores above a run of Y on a task
    drawn at random (the Mann-Whitney statistic averaged over tasks), with stratified
    independent-bootstrap intervals (rliable's ``probability_of_improvement``).

    Args:
        pairs: ``(X, Y)`` pairs; default: every pair, X before Y in the grid's order.

    Returns:
        ``{(X, Y): Interval}`` (floats).

    Raises:
        KeyError: a pair naming an algorithm the grid does not have.
    """
    reps, confidence, seed = _check_bootstrap(reps, confidence, seed)
    matrices, _ = results.score_matrices(metric, normalised=normalised)
    if pairs is None:
        pairs = list(itertools.combinations(list(matrices), 2))
    for pair in pairs:
        for algo in pair:
            if algo not in matrices:
                raise KeyError(
                    f"pair {pair!r}: no algorithm {algo!r}; the grid has {list(matrices)}"
                )
    library, metrics = _rliable()
    data = {f"{x},{y}": (matrices[x], matrices[y]) for x, y in pairs}
    with _seeded(seed):
        point, ci = library.get_interval_estimates(
            data, metrics.probability_of_improvement, reps=reps, confidence_interval_size=confidence
        )
    return {
        (x, y): Interval(float(point[f"{x},{y}"]), *(float(v) for v in np.ravel(ci[f"{x},{y}"])))
        for x, y in pairs
    }


def task_curves(
    results: Results,
    task: str,
    *,
    metric: str | None = None,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, tuple[NDArray[np.float64], Interval]]:
    """Each algorithm's evaluation curve on one task: the mean over its done seeds at each
    evaluation they all made, with a bootstrap band over the seeds (rliable's
    ``get_interval_estimates`` of the mean, scores ``[seeds, 1, evaluations]``).

    Returns:
        ``{algorithm: (frames [points], Interval of arrays [points])}``; the frames are the
        first seed's.

    Raises:
        KeyError: a task the grid does not have.
        ValueError: a task with no done run that logged an evaluation.
    """
    reps, confidence, seed = _check_bootstrap(reps, confidence, seed)
    if task not in results.tasks:
        raise KeyError(f"no task {task!r}; the grid has {results.tasks}")
    metric = results.metric_of(task, metric)
    data: dict[str, NDArray[np.float64]] = {}
    frames: dict[str, NDArray[np.float64]] = {}
    for algo in results.algorithms:
        runs = [r for r in results.done if r.task == task and r.algorithm == algo and r.evaluations]
        if not runs:
            continue
        steps = set.intersection(*({s for s, _, m in r.evaluations if metric in m} for r in runs))
        order = sorted(steps)
        if not order:
            continue
        curves = [{s: m[metric] for s, _, m in r.evaluations if s in steps} for r in runs]
        data[algo] = np.array([[c[s] for s in order] for c in curves])[:, None, :]
        first = {s: f for s, f, _ in runs[0].evaluations}
        frames[algo] = np.array([first[s] for s in order], dtype=np.float64)
    if not data:
        raise ValueError(f"task {task!r} has no done run with an evaluation of {metric!r}")
    library, _ = _rliable()

    def mean(scores: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(scores[:, 0, :].mean(axis=0))

    with _seeded(seed):
        point, ci = library.get_interval_estimates(
            data, mean, reps=reps, confidence_interval_size=confidence
        )
    return {algo: (frames[algo], est) for algo, est in _intervals(point, ci).items()}


# ----------------------------------------------------------------------------- export
def _env_and_task(task: str) -> tuple[str, str]:
    env, _, name = task.rpartition("/")
    return (env.replace("/", "_") or "marlkit", name)


def marl_eval_json(results: Results) -> dict[str, Any]:
    """The done runs in marl-eval's raw-data layout, as BenchMARL exports it:
    ``{env: {task: {algorithm: {"seed_<seed>": {"step_<iteration>": {"step_count": frames,
    "<metric>": [value]}, ..., "absolute_metrics": {"<metric>": [value]}}}}}}``.

    A task ``"<env>/<name>"`` (``"vmas/balance"``) is env ``<env>``, task ``<name>``; a task
    without ``/`` (marlkit's native scenarios) is env ``"marlkit"``. The metrics are
    ``"return"`` and ``"<group>_return"`` (and any other ``eval/`` column); each list holds the
    evaluation's mean over its episodes (the run folders keep means, not each episode).
    ``absolute_metrics`` is the final evaluation of the trained policy (``summary.json``).
    """
    out: dict[str, Any] = {}
    for run in results.done:
        env, task = _env_and_task(run.task)
        steps: dict[str, Any] = {
            f"step_{step}": {
                "step_count": frames,
                **{_marl_eval_name(k): [v] for k, v in metrics.items()},
            }
            for step, frames, metrics in run.evaluations
        }
        steps["absolute_metrics"] = {_marl_eval_name(k): [v] for k, v in run.final.items()}
        out.setdefault(env, {}).setdefault(task, {}).setdefault(run.algorithm, {})[
            f"seed_{run.seed}"
        ] = steps
    return out


# ----------------------------------------------------------------------------- the report
def _figure(purpose: str) -> tuple[Any, Any]:
    import_optional("matplotlib", extra="train", purpose=purpose)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "x"


def _plot_aggregates(agg: Mapping[str, Mapping[str, Interval]], path: pathlib.Path) -> None:
    figure, _ = _figure("the report")
    figure.set_size_inches(3.0 * len(AGGREGATES), 0.6 * len(agg) + 1.2)
    figure.clear()
    axes = figure.subplots(1, len(AGGREGATES), sharey=True)
    algos = list(agg)
    for ax, name in zip(axes, AGGREGATES):
        for y, algo in enumerate(algos):
            est = agg[algo][name]
            ax.barh(y, est.high - est.low, left=est.low, height=0.6, alpha=0.6, color=f"C{y}")
            ax.vlines(est.point, y - 0.3, y + 0.3, color="k")
        ax.set_title(name)
        ax.set_xlabel("normalised score")
    axes[0].set_yticks(range(len(algos)), algos)
    figure.savefig(path)


def _plot_curves(
    curves: Mapping[str, tuple[NDArray[np.float64], Interval]],
    path: pathlib.Path,
    task: str,
    metric: str,
) -> None:
    figure, ax = _figure("the report")
    for i, (algo, (x, est)) in enumerate(curves.items()):
        # markers and error bars too: a run evaluated only at its end is one point
        ax.errorbar(
            x,
            est.point,
            yerr=[est.point - est.low, est.high - est.point],
            fmt="-o",
            markersize=3,
            capsize=3,
            label=algo,
            color=f"C{i}",
        )
        ax.fill_between(x, est.low, est.high, alpha=0.2, color=f"C{i}")
    ax.set_title(task)
    ax.set_xlabel("frames")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    figure.savefig(path)


def _plot_profiles(
    taus: NDArray[np.float64], profiles: Mapping[str, Interval], path: pathlib.Path
) -> None:
    figure, ax = _figure("the report")
    for i, (algo, est) in enumerate(profiles.items()):
        ax.plot(taus, est.point, label=algo, color=f"C{i}")
        ax.fill_between(taus, est.low, est.high, alpha=0.2, color=f"C{i}")
    ax.set_xlabel(r"normalised score $\tau$")
    ax.set_ylabel(r"fraction of runs with score > $\tau$")
    ax.legend()
    figure.savefig(path)


def _plot_improvement(poi: Mapping[tuple[str, str], Interval], path: pathlib.Path) -> None:
    figure, ax = _figure("the report")
    labels = [f"P({x} > {y})" for x, y in poi]
    for y, est in enumerate(poi.values()):
        ax.barh(y, est.high - est.low, left=est.low, height=0.6, alpha=0.6, color=f"C{y}")
        ax.vlines(est.point, y - 0.3, y + 0.3, color="k")
    ax.axvline(0.5, ls="--", color="grey")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("probability of improvement")
    ax.set_xlim(0, 1)
    figure.savefig(path)


def _fmt(est: Interval) -> str:
    return f"{est.point:.3f} [{est.low:.3f}, {est.high:.3f}]"


def _markdown(
    results: Results,
    tables: list[tuple[str, list[str], list[list[str]]]],
    images: list[tuple[str, str]],
    notes: list[str],
) -> str:
    lines = [f"# Grid report: {results.grid_dir.name}", ""]
    lines += [f"- {n}" for n in notes] + [""]
    for title, header, rows in tables:
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |"]
        lines += ["|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        lines.append("")
    lines += ["## Figures", ""]
    lines += [f"![{alt}]({name})\n" for alt, name in images]
    return "\n".join(lines)


def _html(
    results: Results,
    tables: list[tuple[str, list[str], list[list[str]]]],
    images: list[tuple[str, pathlib.Path]],
    notes: list[str],
) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>Grid report: {e(results.grid_dir.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:72em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>",
        f"</head><body><h1>Grid report: {e(results.grid_dir.name)}</h1><ul>",
        *(f"<li>{e(n)}</li>" for n in notes),
        "</ul>",
    ]
    for title, header, rows in tables:
        parts.append(f"<h2>{e(title)}</h2><table><tr>")
        parts += [f"<th>{e(h)}</th>" for h in header] + ["</tr>"]
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    parts.append("<h2>Figures</h2>")
    for alt, path in images:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'<p><img alt="{e(alt)}" src="data:image/png;base64,{data}"></p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    grid_dir: str | os.PathLike[str],
    *,
    references: Mapping[str, Mapping[str, float]] | None = None,
    normalised: bool | None = None,
    metric: str | None = None,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, pathlib.Path]:
    """Write ``report.md`` (with its PNGs under ``report/``), ``report.html`` (the same, the
    images embedded) and ``marl_eval.json`` into the grid folder.

    The report lists every run not done (with its status and log), each task's final scores
    (mean over seeds with a bootstrap interval) and its curves; with normalisation, the
    aggregates across tasks, the performance profiles and the probabilities of improvement.

    Args:
        grid_dir, references: as :func:`load_results`.
        normalised: aggregate normalised scores across tasks; default: when every task has
            references. ``True`` with a task without references raises.
        metric, reps, confidence, seed: as :func:`aggregate_scores`.

    Returns:
        ``{"markdown": ..., "html": ..., "marl_eval": ..., "figures": <folder>}``.

    Raises:
        the errors of :func:`load_results`; ``KeyError`` for ``normalised=True`` and a task
        without references; ``ValueError`` when no run is done.
    """
    results = load_results(grid_dir, references=references)
    grid = results.grid_dir
    if normalised is None:
        normalised = all(t in results.references for t in results.tasks)
    elif normalised:
        for task in results.tasks:
            results.normalise(task, 0.0)  # the KeyError naming the tasks without references
    if not results.done:
        raise ValueError(f"no run of the grid in {str(grid)!r} is done yet: nothing to report")
    kwargs: dict[str, Any] = {"reps": reps, "confidence": confidence, "seed": seed}
    figures = grid / "report"
    figures.mkdir(exist_ok=True)
    for old in figures.glob("*.png"):  # a previous report's figures (of tasks gone, say)
        if old.name.startswith("curve-") or old.stem in ("aggregates", "profiles", "improvement"):
            old.unlink()
    images: list[tuple[str, str]] = []
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    done, total = len(results.done), len(results.runs)
    notes = [
        f"{done} of {total} runs done; {confidence:.0%} bootstrap intervals ({reps} resamples)"
    ]
    if results.not_done:
        tables.append(_not_done_table(results))
    tables.append(_per_task(results, metric, kwargs, figures, images, notes))
    if normalised:
        _across_tasks(results, metric, kwargs, figures, tables, images, notes)
    else:
        notes.append("no statistics across tasks: not every task has references")

    paths = {
        "markdown": grid / "report.md",
        "html": grid / "report.html",
        "marl_eval": grid / "marl_eval.json",
        "figures": figures,
    }
    paths["markdown"].write_text(_markdown(results, tables, images, notes))
    embedded = [(alt, grid / name) for alt, name in images]
    paths["html"].write_text(_html(results, tables, embedded, notes))
    paths["marl_eval"].write_text(json.dumps(marl_eval_json(results), indent=2) + "\n")
    return paths


def _task_cell(scores: list[float], kwargs: Mapping[str, Any]) -> str:
    library, _ = _rliable()
    data = {"x": np.asarray(scores, dtype=np.float64)[:, None]}
    with _seeded(kwargs["seed"]):
        point, ci = library.get_interval_estimates(
            data,
            lambda s: np.array([s.mean()]),
            reps=kwargs["reps"],
            confidence_interval_size=kwargs["confidence"],
        )
    est = _intervals(point, ci)["x"]
    mean = Interval(float(est.point[0]), float(est.low[0]), float(est.high[0]))
    return f"{_fmt(mean)} ({len(scores)})"


def _not_done_table(results: Results) -> tuple[str, list[str], list[list[str]]]:
    def where(path: pathlib.Path | None) -> str:
        return "-" if path is None else str(path.relative_to(results.grid_dir))

    rows = [
        [r.name, r.task, r.algorithm, str(r.seed), r.status, str(r.returncode), where(r.log)]
        for r in results.not_done
    ]
    header = ["run", "task", "algorithm", "seed", "status", "return code", "log"]
    return ("Runs not done", header, rows)


def _per_task(
    results: Results,
    metric: str | None,
    kwargs: Mapping[str, Any],
    figures: pathlib.Path,
    images: list[tuple[str, str]],
    notes: list[str],
) -> tuple[str, list[str], list[list[str]]]:
    """Each task's final scores (the table returned) and curves (into ``images``)."""
    rows = []
    for i, task in enumerate(results.tasks):
        task_metric = results.metric_of(task, metric)
        row = [task, task_metric]
        for algo in results.algorithms:
            runs = [r for r in results.done if r.task == task and r.algorithm == algo]
            row.append(_task_cell([r.score(task_metric) for r in runs], kwargs) if runs else "-")
        rows.append(row)
        try:
            curves = task_curves(results, task, metric=metric, **kwargs)
        except ValueError as err:
            notes.append(f"no curve for {task}: {err}")
            continue
        name = f"curve-{i}-{_file_name(task)}.png"
        _plot_curves(curves, figures / name, task, task_metric)
        images.append((f"{task}: evaluation {task_metric}, mean over seeds", f"report/{name}"))
    header = ["task", "metric", *results.algorithms]
    return ("Final score per task: mean over seeds [interval] (seeds)", header, rows)


def _across_tasks(
    results: Results,
    metric: str | None,
    kwargs: Mapping[str, Any],
    figures: pathlib.Path,
    tables: list[tuple[str, list[str], list[list[str]]]],
    images: list[tuple[str, str]],
    notes: list[str],
) -> None:
    """The statistics across tasks: tables, figures and notes."""
    try:
        _, left_out = results.score_matrices(metric, normalised=True)
    except ValueError as err:
        notes.append(f"no statistics across tasks: {err}")
        return
    for algo, seeds in left_out.items():
        if seeds:
            notes.append(f"{algo}: seeds {seeds} left out of the statistics across tasks")
    refs = ", ".join(f"{t}: {lo:g} to {hi:g}" for t, (lo, hi) in results.references.items())
    notes.append(f"normalised as (score - random) / (reference - random); {refs}")
    agg = aggregate_scores(results, metric=metric, **kwargs)
    rows = [[a, *(_fmt(agg[a][m]) for m in AGGREGATES)] for a in agg]
    tables.append(("Normalised scores across tasks", ["algorithm", *AGGREGATES], rows))
    _plot_aggregates(agg, figures / "aggregates.png")
    images.append(("aggregate normalised scores", "report/aggregates.png"))
    taus, profiles = performance_profiles(results, metric=metric, **kwargs)
    _plot_profiles(taus, profiles, figures / "profiles.png")
    images.append(("performance profiles", "report/profiles.png"))
    if len(agg) > 1:
        poi = probability_of_improvement(results, metric=metric, **kwargs)
        rows = [[f"P({x} > {y})", _fmt(est)] for (x, y), est in poi.items()]
        tables.append(("Probability of improvement", ["pair", "probability"], rows))
        _plot_improvement(poi, figures / "improvement.png")
        images.append(("probability of improvement", "report/improvement.png"))
