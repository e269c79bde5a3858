"""The scaling benchmark: agent-steps/s as agents per env grow, native against its peers.

A sweep runs one cell per ``(agents, backend)``: agents per env from ``config.agents`` and either
a fixed number of envs (``envs``) or as many envs as keep ``envs x agents ~= total_agents``
(default 65,536). By default each cell runs in its own subprocess, killed past
``cell_budget_s + startup_allowance_s`` seconds, so a simulator whose construction never ends
cannot hang the sweep; a killed cell, or one whose estimate (construction plus a probe step)
exceeds the budget, is recorded as skipped with the reason, and once a backend is over the
budget its larger cells are skipped without running (their cost only grows with agents).
Native (and torch) cells compute ``config.work``: by default VMAS navigation's work, its 12-ray
LiDAR included (:mod:`marlkit.bench.work`), so that the native/VMAS ratios compare equal work.

Examples:
    >>> from marlkit.bench import ScalingConfig, run_scaling
    >>> report = run_scaling(ScalingConfig(agents=(2, 4), total_agents=16, backends=("native",),
    ...                                    min_seconds=0.0, min_steps=2),
    ...                      progress=False)
    >>> [(c.envs, c.agents, c.status) for c in report.cells]
    [(8, 2, 'ok'), (4, 4, 'ok')]
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tqdm import tqdm

from marlkit._checks import check_int, check_one_of, check_real
from marlkit._utils import get_logger, has_module
from marlkit.bench.cells import (
    BACKENDS,
    SCENARIOS,
    CellResult,
    CellSpec,
    TimingSettings,
    measure_cell,
)
from marlkit.bench.environment import describe_environment, load_average
from marlkit.bench.plot import plot_scaling
from marlkit.bench.work import DEFAULT_WORK, WORK_LABELS, WORKS
from marlkit.native import load_extension, set_threads

__all__ = [
    "DEFAULT_AGENTS",
    "DEFAULT_TOTAL_AGENTS",
    "SCHEMA_VERSION",
    "TARGETS",
    "ScalingConfig",
    "ScalingReport",
    "Target",
    "run_cell",
    "run_scaling",
]

#: Agents per env of the issue's sweep.
DEFAULT_AGENTS: tuple[int, ...] = (4, 16, 64, 256, 1024, 4096)
#: envs x agents of the default (total-agents) sweep.
DEFAULT_TOTAL_AGENTS = 65_536
#: Version of the JSON layout written by :meth:`ScalingReport.to_dict`.
SCHEMA_VERSION = 1
#: The reference backend whose ratios to the others are reported.
REFERENCE = "native"

_log = get_logger("bench.scaling")


@dataclass(frozen=True)
class Target:
    """A goal of the issue: ``numerator / denominator >= threshold``.

    Attributes:
        id: stable name in the JSON.
        description: what it says, for people.
        numerator, denominator: ``(backend, agents per env)`` cells.
        threshold: the least acceptable ratio.
    """

    id: str
    description: str
    numerator: tuple[str, int]
    denominator: tuple[str, int]
    threshold: float


#: The issue's targets (stated for the total-agents sweep).
TARGETS: tuple[Target, ...] = (
    Target("native_over_vmas_4", "native >= 10x VMAS at 4 agents", ("native", 4), ("vmas", 4), 10),
    Target(
        "native_1024_over_native_16",
        "native at 1024 agents keeps >= 50% of its agent-steps/s at 16 agents",
        ("native", 1024),
        ("native", 16),
        0.5,
    ),
    Target(
        "native_over_vmas_1024",
        "native >= 50x VMAS at 1024 agents",
        ("native", 1024),
        ("vmas", 1024),
        50,
    ),
)


@dataclass(frozen=True)
class ScalingConfig:
    """What to sweep and how to time it.

    Attributes:
        scenario: a scenario both marlkit and the peers have (``"navigation"``).
        agents: agents per env, one cell per value and backend (sorted ascending).
        total_agents: envs per cell = ``max(1, round(total_agents / agents))``; the default mode
            (65,536) when ``envs`` is not given. Exclusive with ``envs``.
        envs: a fixed number of envs for every cell (the fixed-envs variant).
        backends: some of ``"native"`` (C++ kernels), ``"torch"`` (the twin), ``"vmas"``.
        min_seconds, min_steps, warmup: timing of each cell (see
            :class:`~marlkit.bench.cells.TimingSettings`).
        cell_budget_s: wall-clock budget of one cell; cells estimated over it are skipped.
        threads: torch and native-kernel threads (``None``: the defaults).
        seed: seed of every env and of the random actions.
        work: what the native and torch cells compute (:mod:`marlkit.bench.work`): ``"lidar"``
            (the default: VMAS navigation's work, its LiDAR included) or ``"knn"`` (native
            navigation's defaults: different work). VMAS cells always run VMAS's defaults.
        isolate: which cells run in a subprocess killed past its budget: ``"peers"`` (every
            backend but native, the default: VMAS's construction may never end, and the torch
            twin's pairwise tensors may exhaust memory), ``"all"`` or ``"none"``. In-process
            cells start faster (no interpreter start-up per cell) but cannot be killed.
        startup_allowance_s: seconds a cell subprocess may take to start, on top of the budget.
        skip_larger: once a backend's cell is over the budget, skip its larger cells unrun.
    """

    scenario: str = "navigation"
    agents: tuple[int, ...] = DEFAULT_AGENTS
    total_agents: int | None = None
    envs: int | None = None
    backends: tuple[str, ...] = ("native", "vmas")
    min_seconds: float = 2.0
    min_steps: int = 3
    warmup: int = 1
    cell_budget_s: float = 60.0
    threads: int | None = None
    seed: int = 0
    work: str = DEFAULT_WORK
    isolate: Literal["peers", "all", "none"] = "peers"
    startup_allowance_s: float = 30.0
    skip_larger: bool = True

    def __post_init__(self) -> None:
        check_one_of("scenario", self.scenario, sorted(SCENARIOS))
        agents = tuple(self.agents)
        if not agents:
            raise ValueError("agents must name at least one agents-per-env value")
        for a in agents:
            check_int("agents per env", a, low=1)
        object.__setattr__(self, "agents", tuple(sorted(set(agents))))
        backends = tuple(dict.fromkeys(self.backends))
        if not backends:
            raise ValueError(f"backends must name at least one of {list(BACKENDS)}")
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown backends {unknown}; choose from {list(BACKENDS)}")
        object.__setattr__(self, "backends", backends)
        if self.envs is not None and self.total_agents is not None:
            raise ValueError(
                f"give envs or total_agents, not both (got envs={self.envs}, "
                f"total_agents={self.total_agents})"
            )
        if self.envs is None and self.total_agents is None:
            object.__setattr__(self, "total_agents", DEFAULT_TOTAL_AGENTS)
        if self.envs is not None:
            check_int("envs", self.envs, low=1)
        else:
            check_int("total_agents", self.total_agents, low=1)
        check_int("threads", self.threads, low=1, allow_none=True)
        check_one_of("work", self.work, list(WORKS))
        check_one_of("isolate", self.isolate, ("peers", "all", "none"))
        check_real("startup_allowance_s", self.startup_allowance_s, strict=False, finite=False)
        _ = self.timing  # validates min_seconds, min_steps, warmup and cell_budget_s

    @property
    def mode(self) -> Literal["total_agents", "fixed_envs"]:
        """``"fixed_envs"`` when ``envs`` is given, else ``"total_agents"``."""
        return "fixed_envs" if self.envs is not None else "total_agents"

    @property
    def timing(self) -> TimingSettings:
        """The per-cell timing settings."""
        return TimingSettings(self.min_seconds, self.min_steps, self.warmup, self.cell_budget_s)

    def envs_for(self, agents: int) -> int:
        """Envs of the cells with ``agents`` agents per env."""
        if self.envs is not None:
            return self.envs
        return max(1, round((self.total_agents or DEFAULT_TOTAL_AGENTS) / agents))

    def isolates(self, backend: str) -> bool:
        """Whether ``backend``'s cells run in a subprocess."""
        return self.isolate == "all" or (self.isolate == "peers" and backend != REFERENCE)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (an infinite budget becomes ``None``)."""
        out = asdict(self)
        out["agents"], out["backends"] = list(self.agents), list(self.backends)
        if math.isinf(self.cell_budget_s):
            out["cell_budget_s"] = None
        return out


# ------------------------------------------------------------------------------ one cell
def _parse_worker_output(text: str) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """``(last phase with its figures merged, result, error)`` from the worker's stdout."""
    phase: dict[str, Any] = {}
    result, error = None, None
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a library printed on stdout: not ours
        if not isinstance(obj, dict):
            continue
        if "phase" in obj:
            phase.update(obj)
        elif "result" in obj:
            result = obj["result"]
        elif "error" in obj:
            error = str(obj["error"])
    return phase, result, error


def _killed_reason(timeout: float, phase: dict[str, Any]) -> str:
    where = {
        None: "before the env was constructed (process start-up)",
        "constructing": "while constructing and resetting the env",
        "constructed": f"during its first step (construction took {phase.get('setup_s', 0):.1f} s)",
    }.get(phase.get("phase"), "while timing its steps")
    return f"killed after {timeout:.3g} s {where}"


def _text(stream: str | bytes | None) -> str:
    if isinstance(stream, bytes):
        return stream.decode(errors="replace")
    return stream or ""


def _run_isolated(
    spec: CellSpec, settings: TimingSettings, threads: int | None, timeout: float | None
) -> CellResult:
    payload = {
        "spec": asdict(spec),
        "settings": asdict(settings),
        "threads": threads,
    }
    result, _, fields = _run_worker(payload, timeout)
    if result is not None:
        return CellResult.from_dict(result)
    return CellResult.for_spec(spec, **fields)


def _run_worker(
    payload: dict[str, Any], timeout: float | None
) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """Runs one cell in ``python -m marlkit.bench._worker`` and reads what it reported.

    Returns ``(result, phase, fields)``: the cell's result as a dict when the worker finished,
    else ``None``; the last phase it reported (``agents``, ``setup_s``, ...); and, without a
    result, the ``status`` and ``reason`` (and the timings reached) of a killed or failed cell.
    """
    cmd = [sys.executable, "-m", "marlkit.bench._worker", json.dumps(payload)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        phase, _, _ = _parse_worker_output(_text(err.stdout))
        return (
            None,
            phase,
            {
                "status": "skipped",
                "reason": _killed_reason(err.timeout, phase),
                "setup_s": phase.get("setup_s"),
                "first_step_s": phase.get("first_step_s"),
            },
        )
    phase, result, error = _parse_worker_output(proc.stdout)
    if result is not None:
        return result, phase, {}
    if proc.returncode < 0:  # killed by a signal (the kernel's OOM killer sends SIGKILL)
        reason = f"killed by signal {-proc.returncode} (out of memory?)"
        return None, phase, {"status": "skipped", "reason": reason}
    tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return None, phase, {"status": "failed", "reason": error or tail[0]}


def run_cell(
    spec: CellSpec,
    settings: TimingSettings,
    *,
    isolate: bool = True,
    threads: int | None = None,
    startup_allowance_s: float = 30.0,
) -> CellResult:
    """Measure one cell, in a subprocess killed past its budget (``isolate``) or in this process.

    Errors inside the cell (a missing simulator, an exception while stepping) give a
    ``"failed"`` result naming them, never an exception.
    """
    if isolate:
        budget = settings.budget_s
        timeout = None if math.isinf(budget) else budget + startup_allowance_s
        return _run_isolated(spec, settings, threads, timeout)
    set_threads(threads)
    try:
        return measure_cell(spec, settings)
    except Exception as err:  # one broken cell must not lose the sweep
        _log.warning("cell %s failed: %s", spec, err)
        return CellResult.for_spec(spec, status="failed", reason=f"{type(err).__name__}: {err}")


# ------------------------------------------------------------------------------ the report
def _si(x: float | None) -> str:
    if x is None:
        return "-"
    for factor, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}"
    return f"{x:.3g}"


@dataclass
class ScalingReport:
    """The cells of one sweep, with the ratios and targets derived from them."""

    config: ScalingConfig
    environment: dict[str, Any]
    cells: list[CellResult] = field(default_factory=list)

    def cell(self, backend: str, agents: int) -> CellResult | None:
        """The cell of ``backend`` at ``agents`` agents per env, if the sweep has it."""
        for c in self.cells:
            if c.backend == backend and c.agents == agents:
                return c
        return None

    def _rate(self, backend: str, agents: int) -> float | None:
        c = self.cell(backend, agents)
        return c.agent_steps_per_s if c is not None and c.status == "ok" else None

    def ratios(self) -> list[dict[str, Any]]:
        """Per agents value: ``native_over_<peer>`` (``None`` where either side is missing).

        Without ``"native"`` among the backends, the rows hold only ``agents`` and ``envs``.
        """
        peers = [b for b in self.config.backends if b != REFERENCE]
        if REFERENCE not in self.config.backends:
            peers = []
        rows = []
        for agents in self.config.agents:
            row: dict[str, Any] = {"agents": agents, "envs": self.config.envs_for(agents)}
            ref = self._rate(REFERENCE, agents)
            for peer in peers:
                other = self._rate(peer, agents)
                row[f"{REFERENCE}_over_{peer}"] = ref / other if ref and other else None
            rows.append(row)
        return rows

    def _why_missing(self, backend: str, agents: int) -> str:
        c = self.cell(backend, agents)
        if c is None:
            return f"no {backend} cell at {agents} agents in this sweep"
        return f"{backend} {c.envs}x{c.agents} {c.status}: {c.reason}"

    def targets(self) -> list[dict[str, Any]]:
        """Each of :data:`TARGETS` with its value, ``met`` (``None`` if unmeasured) and a note."""
        out = []
        for t in TARGETS:
            num, den = self._rate(*t.numerator), self._rate(*t.denominator)
            value = num / den if num and den else None
            note = None
            if value is None:
                missing = t.numerator if num is None else t.denominator
                note = self._why_missing(*missing)
            out.append(
                {
                    "id": t.id,
                    "description": t.description,
                    "numerator": list(t.numerator),
                    "denominator": list(t.denominator),
                    "threshold": t.threshold,
                    "value": value,
                    "met": None if value is None else value >= t.threshold,
                    "note": note,
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the sweep (layout version :data:`SCHEMA_VERSION`)."""
        cfg = self.config
        return {
            "benchmark": "scaling",
            "schema": SCHEMA_VERSION,
            "scenario": cfg.scenario,
            "mode": cfg.mode,
            "total_agents": cfg.total_agents,
            "envs": cfg.envs,
            "agents": list(cfg.agents),
            "backends": list(cfg.backends),
            "settings": cfg.to_dict(),
            "environment": self.environment,
            "cells": [c.to_dict() for c in self.cells],
            "ratios": self.ratios(),
            "targets": self.targets(),
        }

    def table(self) -> str:
        """A plain-text table of the sweep, its skip notes and the targets."""
        cfg = self.config
        env = self.environment
        sizing = (
            f"{cfg.envs} envs per cell"
            if cfg.envs is not None
            else f"envs x agents ~= {cfg.total_agents:,}"
        )
        budget = "no budget" if math.isinf(cfg.cell_budget_s) else f"{cfg.cell_budget_s:g} s"
        lines = [
            f"scaling: {cfg.scenario}, {sizing}, budget {budget} per cell "
            f"(torch {env.get('torch')}, {env.get('torch_threads')} torch threads, "
            f"{env.get('native_threads')} native threads, {env.get('cpus')} cpus, "
            f"load {env.get('load_average')} -> {env.get('load_average_end')})",
            f"native work: {cfg.work} ({WORK_LABELS[cfg.work]})",
        ]
        peers = [b for b in cfg.backends if b != REFERENCE and REFERENCE in cfg.backends]
        head = ["agents", "envs", *(f"{b} agent-steps/s" for b in cfg.backends)]
        head += [f"{REFERENCE}/{p}" for p in peers]
        rows: list[list[str]] = []
        notes: list[str] = []
        for ratio in self.ratios():
            agents = ratio["agents"]
            row = [str(agents), str(ratio["envs"])]
            for b in cfg.backends:
                c = self.cell(b, agents)
                if c is None:
                    row.append("-")
                elif c.status == "ok":
                    row.append(_si(c.agent_steps_per_s))
                else:
                    notes.append(f"[{len(notes) + 1}] {b} {c.envs}x{c.agents}: {c.reason}")
                    row.append(f"{c.status} [{len(notes)}]")
            for p in peers:
                value = ratio[f"{REFERENCE}_over_{p}"]
                row.append("-" if value is None else f"{value:.1f}x")
            rows.append(row)
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            lines.append("  ".join(cell.rjust(w) for cell, w in zip(r, widths)))
        lines.extend(notes)
        lines.append("targets:")
        for t in self.targets():
            if t["value"] is None:
                lines.append(f"  {t['description']}: not measured ({t['note']})")
            else:
                verdict = "met" if t["met"] else "MISSED"
                lines.append(f"  {t['description']}: {t['value']:.3g} -> {verdict}")
        return "\n".join(lines)

    def write(self, out: str | pathlib.Path, *, plot: bool = True) -> dict[str, pathlib.Path]:
        """Write ``scaling.json`` (and ``scaling.png`` when ``plot``) into ``out``.

        Returns:
            ``{"json": path, "png": path}`` of what was written.
        """
        folder = pathlib.Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"json": folder / "scaling.json"}
        data = self.to_dict()
        paths["json"].write_text(json.dumps(data, indent=2) + "\n")
        if plot:
            paths["png"] = plot_scaling(data, folder / "scaling.png")
        return paths


# ------------------------------------------------------------------------------ the sweep
def _cells(config: ScalingConfig) -> Iterable[CellSpec]:
    for agents in config.agents:
        for backend in config.backends:
            envs = config.envs_for(agents)
            yield CellSpec(backend, config.scenario, envs, agents, config.seed, config.work)


def _over_budget(result: CellResult) -> bool:
    return result.status == "skipped"


def _check_available(backends: Sequence[str]) -> None:
    if REFERENCE in backends:
        load_extension()  # a missing or stale build: ExtensionError saying how to rebuild
    if "vmas" in backends and not has_module("vmas"):
        raise ImportError(
            "The optional dependency 'vmas' is needed for the vmas backend. "
            "Install it with: pip install 'marlkit[bench]'"
        )


def run_scaling(config: ScalingConfig, *, progress: bool = True) -> ScalingReport:
    """Run the sweep of ``config``; a progress bar over cells goes to stderr.

    Raises:
        ImportError: a requested backend's simulator is not installed (names the extra), or
            the native extension is missing or stale (says how to rebuild).
    """
    _check_available(config.backends)
    report = ScalingReport(config, describe_environment())
    if config.threads is not None:  # record what the cells will use
        report.environment["torch_threads"] = config.threads
        if report.environment["native_threads"] is not None:
            report.environment["native_threads"] = config.threads
    over: dict[str, int] = {}  # backend -> agents of its first cell over the budget
    specs = list(_cells(config))
    bar = tqdm(specs, desc="scaling", unit="cell", disable=not progress, file=sys.stderr)
    for spec in bar:
        bar.set_postfix_str(f"{spec.backend} {spec.envs}x{spec.agents}")
        if config.skip_larger and spec.backend in over:
            reason = (
                f"not run: the {over[spec.backend]}-agent cell was already over the "
                f"{config.cell_budget_s:g} s budget, and the cost grows with agents"
            )
            report.cells.append(CellResult.for_spec(spec, status="skipped", reason=reason))
            continue
        result = run_cell(
            spec,
            config.timing,
            isolate=config.isolates(spec.backend),
            threads=config.threads,
            startup_allowance_s=config.startup_allowance_s,
        )
        if _over_budget(result):
            over.setdefault(spec.backend, spec.agents)
        report.cells.append(result)
    bar.close()
    report.environment["load_average_end"] = load_average()
    return report
