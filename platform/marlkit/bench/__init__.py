"""Benchmark harnesses of ``marlkit bench`` and ``benchmarks/``; nothing in marlkit imports them.

- :mod:`marlkit.bench.cells`: one ``(backend, envs, agents)`` cell, timed within a budget; the
  one timing implementation of ``benchmarks/env_step.py`` and the scaling sweep.
- :mod:`marlkit.bench.work`: what each side of a cell computes (``"lidar"``: VMAS's work, the
  default; ``"knn"``: native navigation's defaults) and the JSON ``"work"`` object saying so.
- :mod:`marlkit.bench.scaling`: the scaling sweep (agent-steps/s as agents per env grow), its
  JSON, table and plot (:mod:`marlkit.bench.plot`, matplotlib from the ``bench`` extra).
- :mod:`marlkit.bench.rounds`: alternating rounds and the JSON-printing ``main`` of the
  side-by-side scripts.
"""

from __future__ import annotations

from marlkit.bench.cells import (
    BACKENDS,
    SCENARIOS,
    CellResult,
    CellSpec,
    TimingSettings,
    make_stepper,
    measure_cell,
    time_steps,
)
from marlkit.bench.environment import describe_environment, set_threads
from marlkit.bench.plot import plot_scaling
from marlkit.bench.rounds import alternate, run_sections
from marlkit.bench.scaling import (
    DEFAULT_AGENTS,
    DEFAULT_TOTAL_AGENTS,
    TARGETS,
    ScalingConfig,
    ScalingReport,
    run_cell,
    run_scaling,
)
from marlkit.bench.work import DEFAULT_WORK, WORK_LABELS, WORKS, native_kwargs

__all__ = [
    "BACKENDS",
    "DEFAULT_AGENTS",
    "DEFAULT_TOTAL_AGENTS",
    "DEFAULT_WORK",
    "SCENARIOS",
    "TARGETS",
    "WORKS",
    "WORK_LABELS",
    "CellResult",
    "CellSpec",
    "ScalingConfig",
    "ScalingReport",
    "TimingSettings",
    "alternate",
    "describe_environment",
    "make_stepper",
    "measure_cell",
    "native_kwargs",
    "plot_scaling",
    "run_cell",
    "run_scaling",
    "run_sections",
    "set_threads",
    "time_steps",
]
