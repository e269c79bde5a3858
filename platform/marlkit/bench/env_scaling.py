"""The scaling benchmark on any registered env: agent-steps/s and memory as the parameter that
sizes the env grows (``marlkit bench scaling --env magent2/battle_v4 --param
map_size=16,32,64,128``).

A *sweep* is one env and one of its keyword arguments (``map_size``, ``n_agents``, ...) over
integer values; a run holds one sweep or several (``--env A --param ... --env B --param ...``:
MAgent2 battle and native ``swarm`` on one plot). Each value is a *cell*: the env built with
``num_envs=envs`` (default 1) and that value, its agents counted from the built env (the sum of
its group sizes: the agents it starts with, dying ones included), stepped through the env API
with random actions (masks honoured, done envs reset, as a rollout does), and timed as the
navigation sweep times its cells (:class:`~marlkit.bench.cells.TimingSettings`: a probe step, a
budget, the cell skipped with its reason when over it). Every cell runs in its own subprocess,
killed past ``cell_budget_s + startup_allowance_s`` seconds, which also measures its memory:
``rss_before_mb`` (the process's peak resident memory once marlkit and the simulator's package
are imported, before the env is built) and ``peak_rss_mb`` (at the end of the cell); their
difference is what the env and its steps took. Once a sweep's cell is over the budget its
larger values are skipped unrun.

*Retained throughput* is a cell's agent-steps/s over that of its sweep's smallest measured
cell: how much of its per-agent speed an env keeps as it grows.

Examples:
    >>> from marlkit.bench.env_scaling import EnvScalingConfig, EnvSweep, run_env_scaling
    >>> sweep = EnvSweep.parse("swarm", "n_agents=8,32")
    >>> report = run_env_scaling(EnvScalingConfig((sweep,), min_seconds=0.0, min_steps=2),
    ...                          progress=False)
    >>> [(c.value, c.agents, c.status) for c in report.cells]
    [(8, 8, 'ok'), (32, 32, 'ok')]
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import pathlib
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tqdm import tqdm

import marlkit
from marlkit._checks import check_int, check_real, did_you_mean
from marlkit.bench.cells import PhaseCallback, TimingSettings, probe_and_time
from marlkit.bench.environment import describe_environment, load_average
from marlkit.bench.scaling import _run_worker, _si
from marlkit.envs import accepted_kwargs

__all__ = [
    "ENV_SCHEMA_VERSION",
    "EnvCellResult",
    "EnvCellSpec",
    "EnvScalingConfig",
    "EnvScalingReport",
    "EnvSweep",
    "measure_env_cell",
    "run_env_cell",
    "run_env_scaling",
]

#: Version of the JSON layout of :meth:`EnvScalingReport.to_dict`.
ENV_SCHEMA_VERSION = 1
#: Keywords a sweep may not turn or set: the harness sets them.
_RESERVED = ("num_envs", "seed", "validate_actions")


def _mb(kib: float) -> float:
    return round(kib / 1024, 1)


def _peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (``ru_maxrss`` is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return _mb(peak / 1024 if sys.platform == "darwin" else peak)  # bytes on macOS


# ------------------------------------------------------------------------------ what to sweep
@dataclass(frozen=True)
class EnvSweep:
    """One env swept over one keyword argument.

    Attributes:
        env: a registered env (``marlkit list``).
        param: the keyword that sizes it (``map_size``, ``n_agents``, ...); checked against
            the env's keywords where the env says what it takes.
        values: its values, integers >= 1 (sorted, each once).
        kwargs: other keyword arguments, the same in every cell (``state=False``, ...).

    Raises:
        UnknownEnvError: ``env`` is not registered (with the closest names).
        ValueError: ``param`` is not a keyword of the env (with the closest), one the harness
            sets (``num_envs``, ``seed``), or repeated in ``kwargs``; a value below 1.
        TypeError: a value that is not an int.
    """

    env: str
    param: str
    values: tuple[int, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        accepted = accepted_kwargs(self.env)  # UnknownEnvError for a name not registered
        if self.param in _RESERVED:
            raise ValueError(
                f"--param {self.param}: the benchmark sets {self.param} itself (--envs, --seed); "
                f"sweep a keyword that sizes the env"
            )
        for key in (self.param, *self.kwargs):
            if accepted is not None and key not in accepted:
                sizes = [k for k in accepted if k not in _RESERVED]
                raise ValueError(
                    f"{self.env} takes no keyword {key!r}.{did_you_mean(key, sizes)} It takes: "
                    f"{', '.join(sizes)}"
                )
        if self.param in self.kwargs:
            raise ValueError(f"{self.param} is swept: do not set it in the env's kwargs too")
        bad = [k for k in self.kwargs if k in _RESERVED]
        if bad:
            raise ValueError(f"the benchmark sets {bad} itself (--envs, --seed)")
        values = tuple(self.values)
        if not values:
            raise ValueError(f"--param {self.param}: no values to sweep")
        for v in values:
            check_int(f"--param {self.param}", v, low=1)
        object.__setattr__(self, "values", tuple(sorted(set(values))))
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    @classmethod
    def parse(cls, env: str, text: str, kwargs: Mapping[str, Any] | None = None) -> EnvSweep:
        """A sweep from the command line's ``--param``: ``"map_size=16,32,64"``.

        Raises:
            ValueError: not ``NAME=V1,V2,...``, a value that is not an integer; and what the
                constructor raises.
        """
        name, sep, raw = text.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not raw.strip():
            raise ValueError(
                f"--param takes NAME=V1,V2,... (the keyword that sizes the env and its integer "
                f"values, e.g. map_size=16,32,64), got {text!r}"
            )
        values = []
        for part in raw.split(","):
            try:
                values.append(int(part.strip()))
            except ValueError:
                raise ValueError(
                    f"--param {name}: values must be integers >= 1 (e.g. {name}=16,32,64), got "
                    f"{part.strip()!r} in {text!r}"
                ) from None
        return cls(env, name, tuple(values), kwargs or {})

    @property
    def label(self) -> str:
        return f"{self.env} ({self.param})"


@dataclass(frozen=True)
class EnvScalingConfig:
    """Sweeps and how to time their cells.

    Attributes:
        sweeps: one or more :class:`EnvSweep`.
        envs: ``num_envs`` of every cell (the env's batch).
        min_seconds, min_steps, warmup, cell_budget_s: timing of each cell (see
            :class:`~marlkit.bench.cells.TimingSettings`).
        threads: torch and native-kernel threads of the cells (``None``: the defaults).
        seed: seed of every env (its random actions come from the env's generator).
        startup_allowance_s: seconds a cell subprocess may take to start, on top of the budget.
        skip_larger: once a sweep's cell is over the budget, skip its larger values unrun.
    """

    sweeps: tuple[EnvSweep, ...]
    envs: int = 1
    min_seconds: float = 2.0
    min_steps: int = 3
    warmup: int = 1
    cell_budget_s: float = 60.0
    threads: int | None = None
    seed: int = 0
    startup_allowance_s: float = 30.0
    skip_larger: bool = True

    def __post_init__(self) -> None:
        sweeps = tuple(self.sweeps)
        if not sweeps or not all(isinstance(s, EnvSweep) for s in sweeps):
            raise ValueError("sweeps must hold at least one EnvSweep")
        object.__setattr__(self, "sweeps", sweeps)
        check_int("envs", self.envs, low=1)
        check_int("threads", self.threads, low=1, allow_none=True)
        check_real("startup_allowance_s", self.startup_allowance_s, strict=False, finite=False)
        _ = self.timing  # validates min_seconds, min_steps, warmup and cell_budget_s

    @property
    def timing(self) -> TimingSettings:
        return TimingSettings(self.min_seconds, self.min_steps, self.warmup, self.cell_budget_s)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sweeps"] = [
            {"env": s.env, "param": s.param, "values": list(s.values), "kwargs": dict(s.kwargs)}
            for s in self.sweeps
        ]
        if math.isinf(self.cell_budget_s):
            out["cell_budget_s"] = None
        return out


# ------------------------------------------------------------------------------ one cell
@dataclass(frozen=True)
class EnvCellSpec:
    """One cell: ``marlkit.make(env, num_envs=envs, seed=seed, **{param: value}, **kwargs)``."""

    env: str
    param: str
    value: int
    envs: int = 1
    seed: int = 0
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class EnvCellResult:
    """What one cell measured, or why it was skipped or failed.

    Attributes:
        env, param, value, envs: the cell.
        agents: agents per env, counted from the built env (``None`` when never built).
        groups: agents of each group.
        status, reason, setup_s, first_step_s, steps, seconds, steps_per_s, env_steps_per_s,
            agent_steps_per_s, estimated_agent_steps_per_s: as
            :class:`~marlkit.bench.cells.CellResult`.
        rss_before_mb: the cell process's peak resident memory before the env was built (MiB).
        peak_rss_mb: its peak at the end of the cell (MiB); ``None`` when it was killed.
    """

    env: str
    param: str
    value: int
    envs: int
    agents: int | None = None
    groups: dict[str, int] | None = None
    status: Literal["ok", "skipped", "failed"] = "ok"
    reason: str | None = None
    setup_s: float | None = None
    first_step_s: float | None = None
    steps: int = 0
    seconds: float = 0.0
    steps_per_s: float | None = None
    env_steps_per_s: float | None = None
    agent_steps_per_s: float | None = None
    estimated_agent_steps_per_s: float | None = None
    rss_before_mb: float | None = None
    peak_rss_mb: float | None = None

    @classmethod
    def for_spec(cls, spec: EnvCellSpec, **fields: Any) -> EnvCellResult:
        return cls(spec.env, spec.param, spec.value, spec.envs, **fields)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvCellResult:
        """Inverse of :meth:`to_dict`; unknown keys raise ``KeyError`` naming them."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise KeyError(f"unknown EnvCellResult fields {sorted(unknown)}")
        return cls(**data)


def measure_env_cell(
    spec: EnvCellSpec, settings: TimingSettings, on_phase: PhaseCallback | None = None
) -> EnvCellResult:
    """Build, probe and time one cell in this process (run it in a subprocess of its own for
    its memory figures: :func:`run_env_cell`). Errors propagate.

    Each step draws random actions for every group (``env.rand_action``, masks honoured) and
    calls ``env.step_and_maybe_reset``, with action validation off, as a collector steps.
    """
    report = on_phase or (lambda phase, **_: None)
    before = _peak_rss_mb()
    start = time.perf_counter()
    report("constructing")
    kwargs = {**spec.kwargs, spec.param: spec.value}
    env = marlkit.make(spec.env, num_envs=spec.envs, seed=spec.seed, **kwargs)
    try:
        env.validate_actions = False
        state = {"td": env.reset()}

        def step() -> None:
            _, state["td"] = env.step_and_maybe_reset(env.rand_action(state["td"]))

        setup_s = time.perf_counter() - start
        groups = {g: len(agents) for g, agents in env.group_map.items()}
        agents = sum(groups.values())
        report("constructed", setup_s=setup_s, agents=agents)
        result = EnvCellResult.for_spec(
            spec, agents=agents, groups=groups, setup_s=setup_s, rss_before_mb=before
        )
        probe_and_time(
            result,
            step,
            envs=spec.envs,
            agents=agents,
            setup_s=setup_s,
            start=start,
            settings=settings,
            report=report,
        )
    finally:
        env.close()
    if result.status == "ok":
        result.peak_rss_mb = _peak_rss_mb()
    return result


def run_env_cell(
    spec: EnvCellSpec,
    settings: TimingSettings,
    *,
    threads: int | None = None,
    startup_allowance_s: float = 30.0,
) -> EnvCellResult:
    """Measure one cell in a subprocess (``python -m marlkit.bench._worker``) killed past
    ``settings.budget_s + startup_allowance_s`` seconds. Errors in the cell (a missing
    simulator, a bad keyword value, an exception while stepping) give a ``"failed"`` result
    naming them; a killed cell is ``"skipped"`` with where it was."""
    payload = {
        "kind": "env",
        "spec": {**asdict(spec), "kwargs": dict(spec.kwargs)},
        "settings": asdict(settings),
        "threads": threads,
    }
    budget = settings.budget_s
    timeout = None if math.isinf(budget) else budget + startup_allowance_s
    result, phase, fields = _run_worker(payload, timeout)
    if result is not None:
        return EnvCellResult.from_dict(result)
    if fields["status"] == "skipped":  # killed: the agents are known once the env was built
        fields["agents"] = phase.get("agents")
    return EnvCellResult.for_spec(spec, **fields)


# ------------------------------------------------------------------------------ the report
@dataclass
class EnvScalingReport:
    """The cells of a run, in sweep order, with the retained throughput derived from them."""

    config: EnvScalingConfig
    environment: dict[str, Any]
    cells: list[EnvCellResult] = field(default_factory=list)

    def sweep_cells(self, sweep: EnvSweep) -> list[EnvCellResult]:
        return [c for c in self.cells if (c.env, c.param) == (sweep.env, sweep.param)]

    def retained(self, sweep: EnvSweep) -> list[dict[str, Any]]:
        """Per measured cell of ``sweep``: its agent-steps/s over that of the sweep's smallest
        measured cell (``{"value", "agents", "retained"}``)."""
        ok = [c for c in self.sweep_cells(sweep) if c.status == "ok" and c.agent_steps_per_s]
        if not ok:
            return []
        base = ok[0].agent_steps_per_s or 1.0
        return [
            {"value": c.value, "agents": c.agents, "retained": (c.agent_steps_per_s or 0) / base}
            for c in ok
        ]

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the run (layout version :data:`ENV_SCHEMA_VERSION`)."""
        return {
            "benchmark": "scaling",
            "mode": "env",
            "schema": ENV_SCHEMA_VERSION,
            "envs": self.config.envs,
            "sweeps": [
                {
                    "env": s.env,
                    "param": s.param,
                    "values": list(s.values),
                    "kwargs": dict(s.kwargs),
                    "retained": self.retained(s),
                }
                for s in self.config.sweeps
            ],
            "settings": self.config.to_dict(),
            "environment": self.environment,
            "cells": [c.to_dict() for c in self.cells],
            "computes": (
                "each cell: marlkit.make(env, num_envs=envs, seed=seed, param=value, **kwargs), "
                "then per timed step env.rand_action (masks honoured) and "
                "env.step_and_maybe_reset with action validation off; agents = the built env's "
                "group sizes summed; agent-steps/s = steps/s x envs x agents"
            ),
        }

    def table(self) -> str:
        """A plain-text table of the run and its skip notes."""
        cfg, env = self.config, self.environment
        budget = "no budget" if math.isinf(cfg.cell_budget_s) else f"{cfg.cell_budget_s:g} s"
        lines = [
            f"scaling: {cfg.envs} env(s) per cell, budget {budget} per cell (torch "
            f"{env.get('torch')}, {env.get('torch_threads')} torch threads, {env.get('cpus')} "
            f"cpus, load {env.get('load_average')} -> {env.get('load_average_end')})"
        ]
        head = ["env", "param", "agents", "agent-steps/s", "retained", "peak RSS MiB"]
        rows: list[list[str]] = []
        notes: list[str] = []
        for sweep in cfg.sweeps:
            retained = {r["value"]: r["retained"] for r in self.retained(sweep)}
            for c in self.sweep_cells(sweep):
                rate = _si(c.agent_steps_per_s)
                if c.status != "ok":
                    notes.append(f"[{len(notes) + 1}] {c.env} {c.param}={c.value}: {c.reason}")
                    rate = f"{c.status} [{len(notes)}]"
                kept = retained.get(c.value)
                rows.append(
                    [
                        c.env,
                        f"{c.param}={c.value}",
                        "-" if c.agents is None else f"{c.agents:,}",
                        rate,
                        "-" if kept is None else f"{kept:.0%}",
                        "-" if c.peak_rss_mb is None else f"{c.peak_rss_mb:,.0f}",
                    ]
                )
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            lines.append("  ".join(cell.rjust(w) for cell, w in zip(r, widths)))
        lines.extend(notes)
        return "\n".join(lines)

    def write(self, out: str | pathlib.Path, *, plot: bool = True) -> dict[str, pathlib.Path]:
        """Write ``scaling.json`` (and ``scaling.png`` when ``plot``) into ``out``."""
        from marlkit.bench.plot import plot_env_scaling

        folder = pathlib.Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"json": folder / "scaling.json"}
        data = self.to_dict()
        paths["json"].write_text(json.dumps(data, indent=2) + "\n")
        if plot:
            paths["png"] = plot_env_scaling(data, folder / "scaling.png")
        return paths


def _packages(sweeps: Sequence[EnvSweep]) -> dict[str, str | None]:
    """The installed version of each swept adapter family's package (``magent2/battle_v4`` ->
    ``magent2``), where a distribution of that name is installed."""
    out: dict[str, str | None] = {}
    for sweep in sweeps:
        family = sweep.env.partition("/")[0] if "/" in sweep.env else None
        if family is not None and family not in out:
            try:
                out[family] = importlib.metadata.version(family)
            except importlib.metadata.PackageNotFoundError:
                out[family] = None
    return out


def run_env_scaling(config: EnvScalingConfig, *, progress: bool = True) -> EnvScalingReport:
    """Run every sweep of ``config``, cell by cell, each in its own subprocess; a progress bar
    over cells goes to stderr."""
    report = EnvScalingReport(config, describe_environment())
    report.environment["packages"] = _packages(config.sweeps)
    if config.threads is not None:
        report.environment["torch_threads"] = config.threads
        if report.environment.get("native_threads") is not None:
            report.environment["native_threads"] = config.threads
    specs = [
        (sweep, EnvCellSpec(sweep.env, sweep.param, v, config.envs, config.seed, sweep.kwargs))
        for sweep in config.sweeps
        for v in sweep.values
    ]
    over: dict[tuple[str, str], int] = {}  # sweep -> value of its first cell over the budget
    bar = tqdm(specs, desc="scaling", unit="cell", disable=not progress, file=sys.stderr)
    for sweep, spec in bar:
        bar.set_postfix_str(f"{spec.env} {spec.param}={spec.value}")
        key = (sweep.env, sweep.param)
        if config.skip_larger and key in over:
            reason = (
                f"not run: the {spec.param}={over[key]} cell was already over the "
                f"{config.cell_budget_s:g} s budget, and the cost grows with {spec.param}"
            )
            report.cells.append(EnvCellResult.for_spec(spec, status="skipped", reason=reason))
            continue
        result = run_env_cell(
            spec,
            config.timing,
            threads=config.threads,
            startup_allowance_s=config.startup_allowance_s,
        )
        if result.status == "skipped":
            over.setdefault(key, spec.value)
        report.cells.append(result)
    bar.close()
    report.environment["load_average_end"] = load_average()
    return report


def sweeps_from_args(
    envs: Sequence[str], params: Sequence[str], kwargs: Mapping[str, Any] | None = None
) -> tuple[EnvSweep, ...]:
    """Sweeps from the command line: the i-th ``--param`` belongs to the i-th ``--env``;
    ``kwargs`` (``--env-arg``) go to every env.

    Raises:
        ValueError: as many ``--param`` as ``--env`` are needed; and what :meth:`EnvSweep.parse`
            raises.
    """
    if len(envs) != len(params):
        raise ValueError(
            f"each --env needs its --param NAME=V1,V2,... (got {len(envs)} --env and "
            f"{len(params)} --param)"
        )
    return tuple(EnvSweep.parse(e, p, kwargs) for e, p in zip(envs, params))
