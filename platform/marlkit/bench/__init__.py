"""Benchmark harnesses of ``marlkit bench`` and ``benchmarks/``; nothing in marlkit imports them.

- :mod:`marlkit.bench.cells`: one ``(backend, envs, agents)`` cell, timed within a budget; the
  one timing implementation of ``benchmarks/env_step.py`` and the scaling sweep.
- :mod:`marlkit.bench.scaling`: the scaling sweep (agent-steps/s as agents per env grow), its
  JSON, table and plot (:mod:`marlkit.bench.plot`, matplotlib from the ``bench`` extra).
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
from marlkit.bench.scaling import (
    DEFAULT_AGENTS,
    DEFAULT_TOTAL_AGENTS,
    TARGETS,
    ScalingConfig,
    ScalingReport,
    run_cell,
    run_scaling,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_AGENTS",
    "DEFAULT_TOTAL_AGENTS",
    "SCENARIOS",
    "TARGETS",
    "CellResult",
    "CellSpec",
    "ScalingConfig",
    "ScalingReport",
    "TimingSettings",
    "describe_environment",
    "make_stepper",
    "measure_cell",
    "plot_scaling",
    "run_cell",
    "run_scaling",
    "set_threads",
    "time_steps",
]
