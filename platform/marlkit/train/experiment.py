"""``Experiment``: a grid of training runs (tasks x algorithms x seeds x named override sets)
from one YAML file, run by the existing scripts of ``sota-implementations/``, each in its own
run folder, on local processes or a Ray cluster; resumable and fault-isolated.

A grid file::

    name: smoke                        # the grid folder's default name: runs/experiments/<name>
    tasks:                             # env configs (configs/env/<task>.yaml)
      navigation:
        random: -0.25                  # normalisation references for the report (optional)
        reference: 1.0
        overrides: [env.num_envs=8]    # only this task's runs (optional)
    algorithms:                        # top configs (configs/<config>.yaml)
      mappo: mappo_ippo
      ippo: {config: mappo_ippo, overrides: [critic.centralised=false]}
      masac: {config: masac_isac, tasks: [navigation]}   # only these tasks
      qmix:
        config: qmix_vdn
        per_task:                      # on a task: another top config of the same script
          navigation: {config: qmix_mpe, overrides: [train.lr=1e-3]}  # (and overrides after
                                       # the algorithm's): a recipe tuned for that task
    seeds: [0, 1, 2]                   # or a count: 3
    overrides:                         # named override sets (default: one, "default", empty)
      default: []
      small: [policy.num_cells=32]
    common: [eval.video=false]         # every run
    metric: agents/episode_reward      # what the report normalises (a task may set its own)
    threads: 1                         # per run (default: the cores shared by the parallel runs)

Each run is ``python <script> --config-name <config> env=<task> algorithm=<algorithm>
<overrides...> seed=<seed> threads=<threads> run_dir=<grid>/runs/<name>``; its output goes to
``<grid>/logs/<name>.log``. The grid folder holds:

* ``grid.yaml``: the grid file as given; ``grid.json``: the grid as checked (:meth:`Grid.to_dict`:
  every task's ``env``, ``random``, ``reference``, ``metric`` and ``overrides``; the algorithms'
  configs and scripts; the seeds and override sets), for the report;
* ``index.json``: one entry per run (:data:`INDEX_KEYS`), rewritten atomically at every change;
* ``runs/<name>/``: each run's folder (``metrics.csv``, ``summary.json``, ``checkpoints/``, ...);
* ``logs/<name>.log``: each run's output, every attempt appended.

Starting a grid again skips its finished runs (``done`` with a ``summary.json``), resumes the
others that left a run in their folder (``resume=<run_dir>``: their latest checkpoint) and
starts the rest; a failed run is logged and the others go on (and it is tried again on the next
start). One launcher at a time holds the grid folder (``.marlkit-grid.lock``). A run's process
dies with the launcher (Linux), so a killed launcher leaves no run behind to finish twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, Literal

from marlkit._checks import check_int, check_one_of, did_you_mean
from marlkit._files import FolderInUse, lock_folder
from marlkit._utils import get_logger
from marlkit.train.run import _folder_holds_a_run

__all__ = [
    "INDEX_KEYS",
    "STATUSES",
    "Algorithm",
    "Experiment",
    "Grid",
    "GridFolderInUse",
    "Progress",
    "RunSpec",
    "Task",
    "find_scripts",
    "format_progress",
    "format_summary",
    "read_index",
]

_logger = get_logger("train.experiment")

#: The keys of each entry of ``<grid>/index.json``, in order.
INDEX_KEYS = (
    "name",
    "task",
    "algorithm",
    "overrides",
    "seed",
    "run_dir",
    "status",
    "log",
    "returncode",
    "wall_s",
)
#: A run's ``status`` in the index.
STATUSES = ("pending", "running", "done", "failed")
Status = Literal["pending", "running", "done", "failed"]
Launcher = Literal["local", "ray"]

_GRID_KEYS = (
    "name",
    "tasks",
    "algorithms",
    "seeds",
    "overrides",
    "common",
    "metric",
    "threads",
    "scripts",
)
_TASK_KEYS = ("random", "reference", "overrides", "metric")
_ALGORITHM_KEYS = ("config", "overrides", "tasks", "per_task")
_PER_TASK_KEYS = ("config", "overrides")
_INDEX = "index.json"
_LOCK = ".marlkit-grid.lock"
_DEFAULT_METRIC = "agents/episode_reward"
#: Overrides the launcher sets itself: a grid that sets them would be overruled.
_OWN = ("seed", "threads", "run_dir", "resume", "algorithm", "env")


class GridFolderInUse(FolderInUse):
    """Another launcher runs the grid in this folder (it holds the folder's lock)."""


# ---------------------------------------------------------------------------- the grid
@dataclasses.dataclass(frozen=True)
class Task:
    """An env config (``configs/env/<env>.yaml``) with its references for the report."""

    name: str
    #: The normalisation references: a score ``(x - random) / (reference - random)``.
    random: float | None = None
    reference: float | None = None
    metric: str = _DEFAULT_METRIC
    overrides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """A named top config (``configs/<config>.yaml``), run by ``script`` with ``overrides``."""

    name: str
    config: str
    script: str
    overrides: tuple[str, ...] = ()
    #: The tasks it runs on (``None``: all).
    tasks: tuple[str, ...] | None = None
    #: Per task, another top config of the same script and overrides after ``overrides``:
    #: ``(task, config, overrides)`` (a recipe tuned for that task, as ``qmix_lbf``).
    per_task: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def on(self, task: str) -> tuple[str, tuple[str, ...]]:
        """The top config and the overrides of this algorithm's runs on ``task``."""
        for name, config, extra in self.per_task:
            if name == task:
                return config, (*self.overrides, *extra)
        return self.config, self.overrides


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a grid."""

    name: str
    task: str
    algorithm: str
    overrides: str  # the override set's name
    seed: int
    #: The script's file and config, and its Hydra overrides (without seed, threads, run_dir).
    script: pathlib.Path
    config: str
    args: tuple[str, ...]

    def argv(self, run_dir: pathlib.Path, threads: int, *, resume: bool) -> list[str]:
        """The command line of this run (``python`` first)."""
        where = [f"run_dir={run_dir}", *((f"resume={run_dir}",) if resume else ())]
        return [
            sys.executable,
            str(self.script),
            "--config-name",
            self.config,
            *self.args,
            f"seed={self.seed}",
            f"threads={threads}",
            *where,
        ]


def _where(source: str, key: str) -> str:
    return f"grid {source}: {key}"


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping, got {type(value).__name__}: {value!r}")
    return value


def _unknown_keys(value: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    for key in value:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise ValueError(f"{what}: unknown key {key!r}.{hint} It takes: {', '.join(allowed)}")


def _overrides(value: object, what: str) -> tuple[str, ...]:
    """A list of Hydra overrides ``key=value`` (``None``: none)."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a list of overrides key=value, got {value!r}")
    out = []
    for item in value:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"{what}: {item!r} is not a Hydra override key=value")
        key = item.split("=", 1)[0].lstrip("+~")
        if key in _OWN:
            raise ValueError(
                f"{what}: {item!r} sets {key!r}, which the grid sets for each run (tasks, "
                "algorithms, seeds, threads and run folders are the grid's own keys)"
            )
        out.append(item)
    return tuple(out)


def _real(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{what} must be a finite number or null, got {value!r}")
    return float(value)


def find_scripts(start: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The ``sota-implementations/`` folder: above ``start`` (a grid file's folder), above the
    current folder, or next to the installed package (a checkout).

    Raises:
        FileNotFoundError: none found; the message says to set ``scripts:`` in the grid.
    """
    here = pathlib.Path(__file__).resolve()
    places = [pathlib.Path(start).resolve()] if start is not None else []
    places += [pathlib.Path.cwd(), here.parents[3]]
    for place in places:
        for folder in (place, *place.parents):
            for candidate in (folder, folder / "sota-implementations"):
                if candidate.name == "sota-implementations" and (candidate / "configs").is_dir():
                    return candidate
    raise FileNotFoundError(
        "cannot find sota-implementations/ (the training scripts and their configs) above "
        f"{', '.join(map(str, places))}: set scripts: <its path> in the grid"
    )


def _yaml() -> Any:
    """PyYAML (Hydra's dependency: the scripts' extra)."""
    try:
        return importlib.import_module("yaml")  # no type stubs: Any
    except ImportError as err:
        raise ImportError(
            "grids need PyYAML, as the scripts do: pip install 'marlkit[train]'"
        ) from err


def _top_configs(scripts: pathlib.Path) -> dict[str, Mapping[str, Any]]:
    """``{name: yaml}`` of the top configs of ``scripts/configs/`` (``run.yaml`` aside)."""
    yaml = _yaml()
    out = {}
    for path in sorted((scripts / "configs").glob("*.yaml")):
        if path.stem != "run":
            out[path.stem] = yaml.safe_load(path.read_text()) or {}
    return out


def _top_config(config: str, configs: Mapping[str, Any], scripts: pathlib.Path, where: str) -> str:
    """``config`` if it is a top config, else a ValueError naming ``where`` and the closest."""
    if config not in configs:
        raise ValueError(
            f"{where}: no top config {config!r} in {scripts / 'configs'}."
            f"{did_you_mean(config, configs)}".rstrip(".")
        )
    return config


def _script_of(config: str, configs: Mapping[str, Mapping[str, Any]], scripts: pathlib.Path) -> str:
    """The script that runs top config ``config``: its own name, or that of the top config its
    defaults list builds on (``mappo_fast`` -> ``mappo_ippo``)."""
    seen = set()
    name = config
    while name not in seen:
        seen.add(name)
        if (scripts / name / f"{name}.py").is_file():
            return name
        parents = [
            d
            for d in configs.get(name, {}).get("defaults", [])
            if isinstance(d, str) and d in configs
        ]
        if not parents:
            break
        name = parents[0]
    raise ValueError(
        f"top config {config!r} names no script: neither {config}/{config}.py nor a top config "
        "in its defaults list with one"
    )


def _env_configs(scripts: pathlib.Path) -> list[str]:
    root = scripts / "configs" / "env"
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def _seeds(value: object, what: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(range(check_int(what, value, low=1)))
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise TypeError(f"{what} must be a count (an int >= 1) or a list of ints, got {value!r}")
    seeds = tuple(check_int(f"{what}[{i}]", s, low=0) for i, s in enumerate(value))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{what} lists a seed twice: {list(seeds)}")
    return seeds


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)


@dataclasses.dataclass(frozen=True)
class Grid:
    """A checked grid: tasks x algorithms x seeds x named override sets (see the module's
    docstring for the YAML layout). Build it with :meth:`from_yaml` or :meth:`from_dict`."""

    name: str
    tasks: tuple[Task, ...]
    algorithms: tuple[Algorithm, ...]
    seeds: tuple[int, ...]
    override_sets: Mapping[str, tuple[str, ...]]
    common: tuple[str, ...]
    scripts: pathlib.Path
    threads: int | None = None
    #: The metric the report normalises (a task may name its own).
    metric: str = _DEFAULT_METRIC
    #: The grid file's text (``grid.yaml`` of the grid folder), when it came from one.
    source: str | None = None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Grid:
        """The grid of a YAML file; its ``scripts:`` is relative to the file's folder.

        Raises:
            FileNotFoundError: no such file.
            ValueError, TypeError: a bad grid (see :meth:`from_dict`).
        """
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"grid file {str(path)!r}: no such file")
        text = path.read_text()
        yaml = _yaml()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"grid {path}: not YAML: {err}") from None
        return cls.from_dict(
            _mapping(data, f"grid {path}"),
            base=path.parent,
            source=text,
            default_name=path.stem,
            label=str(path),
        )

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        base: str | os.PathLike[str] | None = None,
        source: str | None = None,
        default_name: str = "grid",
        label: str = "",
    ) -> Grid:
        """The grid of a mapping laid out as the YAML file.

        Raises:
            ValueError: an unknown key (with the closest known ones), an unknown task (env
                config) or top config (with the closest ones), an override that is not
                ``key=value`` or that sets a key the grid sets itself (``seed``, ``threads``,
                ``run_dir``, ``resume``, ``algorithm``, ``env``), an algorithm's ``tasks``
                naming a task not in the grid, a reference equal to its random score, a seed
                listed twice, run names that collide.
            TypeError: a value of the wrong type (the message names its key).
        """
        src = label or str(data.get("name", default_name))
        _unknown_keys(data, _GRID_KEYS, f"grid {src}")
        for key in ("tasks", "algorithms"):
            if not data.get(key):
                raise ValueError(
                    f"{_where(src, key)}: at least one is needed, got {data.get(key)!r}"
                )
        here = pathlib.Path(base) if base is not None else None
        if data.get("scripts") is not None:
            scripts = pathlib.Path(str(data["scripts"]))
            scripts = (here / scripts if here is not None else scripts).resolve()
            if not (scripts / "configs").is_dir():
                raise FileNotFoundError(f"{_where(src, 'scripts')}: {scripts} holds no configs/")
        else:
            scripts = find_scripts(here)
        metric = data.get("metric", _DEFAULT_METRIC)
        if not isinstance(metric, str):
            raise TypeError(f"{_where(src, 'metric')} must be a str, got {metric!r}")
        tasks = cls._tasks(data["tasks"], scripts, metric, src)
        algorithms = cls._algorithms(data["algorithms"], scripts, [t.name for t in tasks], src)
        sets_raw = data.get("overrides") or {"default": []}
        sets = {
            str(k): _overrides(v, _where(src, f"overrides.{k}"))
            for k, v in _mapping(sets_raw, _where(src, "overrides")).items()
        }
        name = data.get("name", default_name)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{_where(src, 'name')} must be a non-empty str, got {name!r}")
        grid = cls(
            name=name,
            tasks=tasks,
            algorithms=algorithms,
            seeds=_seeds(data.get("seeds", [0]), _where(src, "seeds")),
            override_sets=sets,
            common=_overrides(data.get("common"), _where(src, "common")),
            scripts=scripts,
            threads=check_int(_where(src, "threads"), data.get("threads"), low=1, allow_none=True),
            metric=metric,
            source=source,
        )
        names = [r.name for r in grid.runs()]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"grid {src}: run names collide once made file-safe: {twice}")
        return grid

    @staticmethod
    def _tasks(raw: object, scripts: pathlib.Path, metric: str, src: str) -> tuple[Task, ...]:
        known = _env_configs(scripts)
        if isinstance(raw, Sequence) and not isinstance(raw, str):
            raw = {t: None for t in raw}
        out = []
        for name, spec in _mapping(raw, _where(src, "tasks")).items():
            where = _where(src, f"tasks.{name}")
            if name not in known:
                raise ValueError(
                    f"{where}: no env config {name!r} in {scripts / 'configs' / 'env'}."
                    f"{did_you_mean(name, known)}".rstrip(".")
                )
            spec = _mapping(spec if spec is not None else {}, where)
            _unknown_keys(spec, _TASK_KEYS, where)
            task = Task(
                name=str(name),
                random=_real(spec.get("random"), f"{where}.random"),
                reference=_real(spec.get("reference"), f"{where}.reference"),
                metric=str(spec.get("metric", metric)),
                overrides=_overrides(spec.get("overrides"), f"{where}.overrides"),
            )
            if (task.random is None) != (task.reference is None):
                raise ValueError(
                    f"{where}: random and reference go together (the scores normalised to 0 "
                    f"and 1), got random={task.random}, reference={task.reference}"
                )
            if task.random is not None and task.random == task.reference:
                raise ValueError(
                    f"{where}: reference equals random ({task.random}): no score range to "
                    "normalise by"
                )
            out.append(task)
        return tuple(out)

    @staticmethod
    def _algorithms(
        raw: object, scripts: pathlib.Path, tasks: Sequence[str], src: str
    ) -> tuple[Algorithm, ...]:
        configs = _top_configs(scripts)
        if isinstance(raw, Sequence) and not isinstance(raw, str):
            raw = {a: a for a in raw}
        out = []
        for name, spec in _mapping(raw, _where(src, "algorithms")).items():
            where = _where(src, f"algorithms.{name}")
            spec = {"config": spec} if isinstance(spec, str) else _mapping(spec, where)
            _unknown_keys(spec, _ALGORITHM_KEYS, where)
            config = _top_config(spec.get("config", name), configs, scripts, where)
            only = spec.get("tasks")
            if only is not None:
                if isinstance(only, str) or not isinstance(only, Sequence):
                    raise TypeError(
                        f"{where}.tasks must be a list of the grid's tasks, got {only!r}"
                    )
                for task in only:
                    check_one_of(f"{where}.tasks", task, tasks)
            script = _script_of(config, configs, scripts)
            runs_on = list(only) if only is not None else list(tasks)
            per_task = []
            for task, task_spec in _mapping(
                spec.get("per_task") or {}, f"{where}.per_task"
            ).items():
                at = f"{where}.per_task.{task}"
                check_one_of(f"{where}.per_task", task, runs_on)
                task_spec = (
                    {"config": task_spec} if isinstance(task_spec, str) else _mapping(task_spec, at)
                )
                _unknown_keys(task_spec, _PER_TASK_KEYS, at)
                task_config = _top_config(task_spec.get("config", config), configs, scripts, at)
                task_script = _script_of(task_config, configs, scripts)
                if task_script != script:
                    raise ValueError(
                        f"{at}: config {task_config!r} runs {task_script}.py, the algorithm's "
                        f"config {config!r} runs {script}.py: one algorithm, one script"
                    )
                extra = _overrides(task_spec.get("overrides"), f"{at}.overrides")
                per_task.append((str(task), task_config, extra))
            out.append(
                Algorithm(
                    name=str(name),
                    config=config,
                    script=script,
                    overrides=_overrides(spec.get("overrides"), f"{where}.overrides"),
                    tasks=tuple(only) if only is not None else None,
                    per_task=tuple(per_task),
                )
            )
        return tuple(out)

    def runs(self) -> list[RunSpec]:
        """Every run, tasks outermost, then algorithms, override sets and seeds."""
        out = []
        for task in self.tasks:
            for alg in self.algorithms:
                if alg.tasks is not None and task.name not in alg.tasks:
                    continue
                for set_name, extra in self.override_sets.items():
                    for seed in self.seeds:
                        parts = [task.name, alg.name]
                        if len(self.override_sets) > 1:
                            parts.append(set_name)
                        name = _safe("_".join(parts)) + f"_s{seed}"
                        config, alg_overrides = alg.on(task.name)
                        args = (
                            f"env={task.name}",
                            f"algorithm={alg.name}",
                            *self.common,
                            *task.overrides,
                            *alg_overrides,
                            *extra,
                        )
                        script = self.scripts / alg.script / f"{alg.script}.py"
                        out.append(
                            RunSpec(name, task.name, alg.name, set_name, seed, script, config, args)
                        )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The checked grid as JSON-ready data (``grid.json``)."""
        return {
            "name": self.name,
            "tasks": {
                t.name: {
                    "env": t.name,
                    "random": t.random,
                    "reference": t.reference,
                    "metric": t.metric,
                    "overrides": list(t.overrides),
                }
                for t in self.tasks
            },
            "algorithms": {
                a.name: {
                    "config": a.config,
                    "script": a.script,
                    "overrides": list(a.overrides),
                    "tasks": list(a.tasks) if a.tasks is not None else None,
                    "per_task": {
                        task: {"config": config, "overrides": list(extra)}
                        for task, config, extra in a.per_task
                    },
                }
                for a in self.algorithms
            },
            # what the report normalises by: the tasks that declare both references
            "references": {
                t.name: {"random": t.random, "reference": t.reference}
                for t in self.tasks
                if t.random is not None and t.reference is not None
            },
            "metric": self.metric,
            "seeds": list(self.seeds),
            "overrides": {k: list(v) for k, v in self.override_sets.items()},
            "common": list(self.common),
            "threads": self.threads,
            "scripts": str(self.scripts),
        }


# ---------------------------------------------------------------------------- the index
def read_index(grid_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of ``<grid_dir>/index.json`` (one per run, the keys of :data:`INDEX_KEYS`;
    ``run_dir`` and ``log`` relative to the grid folder: ``runs/<name>``, ``logs/<name>.log``).

    Raises:
        FileNotFoundError: the folder holds no grid (no ``index.json``).
    """
    path = pathlib.Path(grid_dir) / _INDEX
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(grid_dir)!r} holds no experiment grid (no {_INDEX}): start one with "
            "`marlkit experiment run GRID.yaml --out DIR`"
        )
    entries = json.loads(path.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of runs, got {type(entries).__name__}")
    return entries


def _write_json(path: pathlib.Path, data: Any) -> None:
    """Write ``data`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a grid stands: runs per status, the time since the launcher started and an
    estimate of the time left (``None`` until a run has ended in this launch)."""

    total: int
    done: int
    running: int
    failed: int
    pending: int
    elapsed_s: float = 0.0
    eta_s: float | None = None

    @classmethod
    def of(cls, entries: Sequence[Mapping[str, Any]], **kwargs: Any) -> Progress:
        count = {s: sum(e["status"] == s for e in entries) for s in STATUSES}
        return cls(
            len(entries),
            count["done"],
            count["running"],
            count["failed"],
            count["pending"],
            **kwargs,
        )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def format_progress(progress: Progress) -> str:
    """``"3/8 done, 2 running, 1 failed, 2 pending | 1m05s, ETA 2m10s"``."""
    p = progress
    head = f"{p.done}/{p.total} done, {p.running} running, {p.failed} failed, {p.pending} pending"
    eta = "ETA ?" if p.eta_s is None else f"ETA {_duration(p.eta_s)}"
    return f"{head} | {_duration(p.elapsed_s)}, {eta}"


def format_summary(
    entries: Sequence[Mapping[str, Any]], grid_dir: str | os.PathLike[str] | None = None
) -> str:
    """What a grid's runs came to: the counts, the runs' total time and each failed run's log
    (its path in ``grid_dir`` when given)."""
    where = pathlib.Path(grid_dir) if grid_dir is not None else pathlib.Path()
    p = Progress.of(entries)
    wall = sum(e["wall_s"] or 0.0 for e in entries)
    lines = [
        f"{p.done}/{p.total} runs done, {p.failed} failed, {p.pending + p.running} not finished; "
        f"{_duration(wall)} of run time in all"
    ]
    for e in entries:
        if e["status"] == "failed":
            lines.append(
                f"  failed: {e['name']} (returncode {e['returncode']}), log: {where / e['log']}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- processes
def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    """In the child before ``exec``: be killed when the launcher dies (Linux), and exit at once
    if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HYDRA_FULL_ERROR", "1")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _popen(argv: Sequence[str], cwd: pathlib.Path, log: IO[str], threads: int) -> subprocess.Popen:
    parent = os.getpid()
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=_child_env(threads),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=(lambda: _die_with_parent(parent)) if sys.platform == "linux" else None,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _open_log(path: pathlib.Path, argv: Sequence[str]) -> IO[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a")  # noqa: SIM115 - closed when the run ends
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"\n# marlkit experiment {stamp}: {' '.join(argv)}\n")
    log.flush()
    return log


def _run_command(argv: Sequence[str], cwd: str, log_path: str, threads: int) -> tuple[int, float]:
    """Run a grid's run to its end where this function runs (a Ray task): the script with this
    interpreter, its output appended to ``log_path``; its return code and wall-clock."""
    argv = [sys.executable, *argv[1:]]
    start = time.perf_counter()
    with _open_log(pathlib.Path(log_path), argv) as log:
        proc = _popen(argv, pathlib.Path(cwd), log, threads)
        try:
            return proc.wait(), time.perf_counter() - start
        finally:
            _stop(proc)


# ---------------------------------------------------------------------------- the experiment
class Experiment:
    """A grid's runs in a grid folder: :meth:`run` starts (or goes on with) them, :meth:`index`
    says where they stand.

    Args:
        grid: a :class:`Grid` or the path of a grid YAML file.
        out: the grid folder (default ``runs/experiments/<grid name>``).
        launcher: ``"local"`` (processes of this machine) or ``"ray"`` (one Ray task per run,
            on the cluster at ``ray_address``; the grid folder must be on a file system every
            node sees).
        parallel: runs at a time (local default: ``os.cpu_count() // threads``, or every core
            with one thread each; Ray default: the cluster's CPUs // threads).
        threads: torch threads per run (default the grid's ``threads``, else the cores over the
            parallel runs, at least 1).
        ray_address: ``ray.init``'s address (``None``: ``RAY_ADDRESS``, else a local Ray);
            unused when Ray is already initialised.
        poll_s: how often the launcher looks at its runs.

    Raises:
        ValueError: an unknown launcher (with the closest), ``parallel`` or ``threads`` below 1.
        TypeError: ``parallel`` or ``threads`` that is not an int.

    Example::

        exp = Experiment("sota-implementations/grids/smoke.yaml", "runs/smoke", parallel=2)
        entries = exp.run(progress=lambda p: print(format_progress(p)))
    """

    def __init__(
        self,
        grid: Grid | str | os.PathLike[str],
        out: str | os.PathLike[str] | None = None,
        *,
        launcher: Launcher = "local",
        parallel: int | None = None,
        threads: int | None = None,
        ray_address: str | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self.grid = grid if isinstance(grid, Grid) else Grid.from_yaml(grid)
        self.launcher = check_one_of("launcher", launcher, ("local", "ray"))
        parallel = check_int("parallel", parallel, low=1, allow_none=True)
        threads = check_int("threads", threads, low=1, allow_none=True)
        threads = threads if threads is not None else self.grid.threads
        self._parallel, self._threads = parallel, threads
        if launcher == "local":
            self._parallel, self._threads = self._local_slots(parallel, threads)
        out = out if out is not None else pathlib.Path("runs", "experiments", self.grid.name)
        self.grid_dir = pathlib.Path(out).resolve()
        self.ray_address = ray_address
        self.poll_s = poll_s
        self._entries: list[dict[str, Any]] = []
        self._specs = {spec.name: spec for spec in self.grid.runs()}
        self._started = 0.0
        self._walls: list[float] = []
        self._since: dict[str, float] = {}

    @staticmethod
    def _local_slots(parallel: int | None, threads: int | None) -> tuple[int, int]:
        cores = os.cpu_count() or 1
        if parallel is None:
            parallel = max(1, cores // (threads or 1))
        if threads is None:
            threads = max(1, cores // parallel)
        if parallel * threads > cores:
            _logger.warning(
                "%d runs at a time x %d threads each = %d threads on %d cores: the runs will "
                "slow each other down",
                parallel,
                threads,
                parallel * threads,
                cores,
            )
        return parallel, threads

    @property
    def parallel(self) -> int | None:
        """Runs at a time (``None`` for Ray until it knows the cluster)."""
        return self._parallel

    @property
    def threads(self) -> int:
        """Torch threads per run."""
        return self._threads or 1

    def index(self) -> list[dict[str, Any]]:
        """The grid folder's ``index.json`` (:func:`read_index`)."""
        return read_index(self.grid_dir)

    # ---------------------------------------------------------------- bookkeeping
    def _paths(self, name: str) -> tuple[pathlib.Path, pathlib.Path]:
        return self.grid_dir / "runs" / name, self.grid_dir / "logs" / f"{name}.log"

    def _prepare(self) -> list[str]:
        """Write the grid's files, merge the index with the grid's runs; the names to run."""
        self.grid_dir.mkdir(parents=True, exist_ok=True)
        if self.grid.source is not None:
            (self.grid_dir / "grid.yaml").write_text(self.grid.source)
        _write_json(self.grid_dir / "grid.json", self.grid.to_dict())
        old = {}
        if (self.grid_dir / _INDEX).is_file():
            old = {e["name"]: e for e in read_index(self.grid_dir)}
        dropped = sorted(set(old) - set(self._specs))
        if dropped:
            _logger.info("runs no longer in the grid left out of the index: %s", dropped)
        todo = []
        self._entries = []
        for name, spec in self._specs.items():
            run_dir, log = self._paths(name)
            entry = {
                "name": name,
                "task": spec.task,
                "algorithm": spec.algorithm,
                "overrides": spec.overrides,
                "seed": spec.seed,
                "run_dir": run_dir.relative_to(self.grid_dir).as_posix(),
                "status": "pending",
                "log": log.relative_to(self.grid_dir).as_posix(),
                "returncode": None,
                "wall_s": None,
            }
            before = old.get(name)
            if before is not None:
                entry.update(returncode=before.get("returncode"), wall_s=before.get("wall_s"))
                if before.get("status") == "done" and (run_dir / "summary.json").is_file():
                    entry["status"] = "done"
            self._entries.append(entry)
            if entry["status"] != "done":
                todo.append(name)
        self._save()
        return todo

    def _save(self) -> None:
        _write_json(self.grid_dir / _INDEX, self._entries)

    def _entry(self, name: str) -> dict[str, Any]:
        return next(e for e in self._entries if e["name"] == name)

    def _argv(self, name: str) -> list[str]:
        run_dir, _ = self._paths(name)
        # a folder that holds a run (checkpoints, metrics, even only its lock) goes on from it
        return self._specs[name].argv(run_dir, self.threads, resume=_folder_holds_a_run(run_dir))

    def _began(self, name: str) -> None:
        self._entry(name)["status"] = "running"
        self._since[name] = time.perf_counter()
        self._save()

    def _ended(self, name: str, returncode: int | None, wall: float) -> None:
        entry = self._entry(name)
        run_dir, log = self._paths(name)
        ok = returncode == 0 and (run_dir / "summary.json").is_file()
        entry.update(
            status="done" if ok else "failed",
            returncode=returncode,
            wall_s=(entry["wall_s"] or 0.0) + wall,
        )
        self._since.pop(name, None)
        self._walls.append(wall)
        self._save()
        if not ok:
            _logger.warning("run %s failed (returncode %s): see %s", name, returncode, log)

    def _progress(self, slots: int) -> Progress:
        now = time.perf_counter()
        eta = None
        if self._walls:
            mean = sum(self._walls) / len(self._walls)
            pending = sum(e["status"] == "pending" for e in self._entries)
            left = sum(max(mean - (now - t), 0.0) for t in self._since.values()) + pending * mean
            eta = left / max(1, slots)
        return Progress.of(self._entries, elapsed_s=now - self._started, eta_s=eta)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.grid_dir.mkdir(parents=True, exist_ok=True)
        try:
            handle = lock_folder(
                self.grid_dir,
                _LOCK,
                what="experiment launcher",
                advice="one launcher at a time runs a grid: wait for it to end, or stop it and "
                "start again (finished runs are skipped, killed ones resumed)",
            )
        except FolderInUse as err:
            raise GridFolderInUse(str(err)) from None
        try:
            yield
        finally:
            if handle is not None:
                handle.close()

    # ---------------------------------------------------------------- running
    def run(self, progress: Callable[[Progress], None] | None = None) -> list[dict[str, Any]]:
        """Run every run of the grid not done yet (resuming those that left a run in their
        folder), ``parallel`` at a time; returns the index's entries at the end.

        ``progress`` is called with a :class:`Progress` when a run starts or ends, and about
        once a second. A failed run is logged (its log's path) and the others go on. When the
        launcher is interrupted (``KeyboardInterrupt``), its runs are stopped and left
        ``pending``: the next start resumes them.

        Raises:
            GridFolderInUse: another launcher runs this grid folder.
            ImportError: ``launcher="ray"`` without Ray (``pip install marlkit[ray]``).
        """
        with self._locked():
            todo = self._prepare()
            self._started = time.perf_counter()
            self._walls = []
            if todo:
                if self.launcher == "ray":
                    self._run_ray(todo, progress)
                else:
                    self._run_local(todo, progress)
            if progress is not None:
                progress(self._progress(1))
            return [dict(e) for e in self._entries]

    def _tick(
        self, progress: Callable[[Progress], None] | None, slots: int, changed: bool, last: float
    ) -> float:
        now = time.perf_counter()
        if progress is not None and (changed or now - last >= 1.0):
            progress(self._progress(slots))
            return now
        return last

    def _interrupted(self, names: Sequence[str]) -> None:
        for name in names:
            self._entry(name)["status"] = "pending"
            self._since.pop(name, None)
        self._save()

    def _run_local(self, todo: list[str], progress: Callable[[Progress], None] | None) -> None:
        slots = self._parallel or 1
        queue = list(todo)
        active: dict[str, tuple[subprocess.Popen, IO[str], float]] = {}
        cwd = self.grid.scripts.parent
        last = 0.0
        try:
            while queue or active:
                changed = False
                while queue and len(active) < slots:
                    name = queue.pop(0)
                    argv = self._argv(name)
                    log = _open_log(self._paths(name)[1], argv)
                    active[name] = (_popen(argv, cwd, log, self.threads), log, time.perf_counter())
                    self._began(name)
                    changed = True
                for name, (proc, log, start) in list(active.items()):
                    if proc.poll() is not None:
                        log.close()
                        del active[name]
                        self._ended(name, proc.returncode, time.perf_counter() - start)
                        changed = True
                last = self._tick(progress, slots, changed, last)
                if not changed:
                    time.sleep(self.poll_s)
        finally:
            for proc, log, _ in active.values():
                _stop(proc)
                log.close()
            if active:
                self._interrupted(list(active))

    def _run_ray(self, todo: list[str], progress: Callable[[Progress], None] | None) -> None:
        try:
            import ray
        except ImportError as err:
            raise ImportError("launcher='ray' needs Ray: pip install 'marlkit[ray]'") from err
        started = False
        if not ray.is_initialized():
            ray.init(address=self.ray_address, include_dashboard=False, log_to_driver=False)
            started = True
        try:
            threads = self.threads
            slots = self._parallel or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
            task = ray.remote(_run_command).options(num_cpus=threads, max_retries=0)
            cwd = str(self.grid.scripts.parent)
            queue = list(todo)
            refs: dict[Any, str] = {}
            last = 0.0
            try:
                while queue or refs:
                    changed = False
                    while queue and len(refs) < slots:
                        name = queue.pop(0)
                        log = str(self._paths(name)[1])
                        refs[task.remote(self._argv(name), cwd, log, threads)] = name
                        self._began(name)
                        changed = True
                    ready, _ = ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
                    for ref in ready:
                        name = refs.pop(ref)
                        try:
                            code, wall = ray.get(ref)
                        except Exception as err:  # the task itself failed (a lost node)
                            _logger.warning("Ray task of run %s failed: %s", name, err)
                            code, wall = None, time.perf_counter() - self._since[name]
                        self._ended(name, code, wall)
                        changed = True
                    last = self._tick(progress, slots, changed, last)
            finally:
                for ref in refs:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)
                if refs:
                    self._interrupted(list(refs.values()))
        finally:
            if started:
                ray.shutdown()

    # ---------------------------------------------------------------- reading
    @staticmethod
    def status(grid_dir: str | os.PathLike[str]) -> Progress:
        """The runs of the grid folder per status (``elapsed_s`` 0, no ETA)."""
        return Progress.of(read_index(grid_dir))
