"""Benchmark harnesses of ``marlkit bench`` and ``benchmarks/``; nothing in marlkit imports them.

- :mod:`marlkit.bench.rounds`: the one timing helper of ``benchmarks/``: the clock
  (:func:`time_steps`, :func:`seconds_per_call`), alternating rounds (:func:`alternate`,
  :func:`paired`), medians and ratios, and the command line and JSON header every script shares
  (:func:`make_parser`, :func:`run_sections`).
- :mod:`marlkit.bench.overhead`: an adapter against its simulator's own loop (a collector's
  loop, alternating rounds, the time inside the simulator): ``benchmarks/adapters*``.
- :mod:`marlkit.bench.cells`: one ``(backend, envs, agents)`` cell, timed within a budget; the
  one cell implementation of ``benchmarks/env_step.py`` and the scaling sweep.
- :mod:`marlkit.bench.work`: what each side of a cell computes (``"lidar"``: VMAS's work, the
  default; ``"knn"``: native navigation's defaults) and the JSON ``"work"`` object saying so.
- :mod:`marlkit.bench.scaling`: the scaling sweep (agent-steps/s as agents per env grow), its
  JSON, table and plot (:mod:`marlkit.bench.plot`, matplotlib from the ``bench`` extra).
- :mod:`marlkit.bench.env_scaling`: the same on any registered env, swept over the keyword
  that sizes it (``map_size``, ``n_agents``), with each cell's memory.
- :mod:`marlkit.bench.environment`: where a benchmark ran (the JSON header's ``environment``).
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
)
from marlkit.bench.env_scaling import (
    EnvCellResult,
    EnvCellSpec,
    EnvScalingConfig,
    EnvScalingReport,
    EnvSweep,
    run_env_scaling,
)
from marlkit.bench.environment import describe_environment
from marlkit.bench.plot import plot_env_scaling, plot_scaling
from marlkit.bench.rounds import (
    Stopwatch,
    alternate,
    alternate_calls,
    finish,
    make_parser,
    paired,
    ratio,
    run_sections,
    seconds_per_call,
    start,
    summary,
    time_steps,
    timed,
)
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
    "EnvCellResult",
    "EnvCellSpec",
    "EnvScalingConfig",
    "EnvScalingReport",
    "EnvSweep",
    "ScalingConfig",
    "ScalingReport",
    "Stopwatch",
    "TimingSettings",
    "alternate",
    "alternate_calls",
    "describe_environment",
    "finish",
    "make_parser",
    "make_stepper",
    "measure_cell",
    "native_kwargs",
    "paired",
    "plot_env_scaling",
    "plot_scaling",
    "ratio",
    "run_cell",
    "run_env_scaling",
    "run_scaling",
    "run_sections",
    "seconds_per_call",
    "start",
    "summary",
    "time_steps",
    "timed",
]
