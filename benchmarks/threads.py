"""Native kernel threads: one navigation step on 1 kernel thread against 2, per cell.

Each cell steps native ``navigation`` (like for like with VMAS: its 12-ray LiDAR, through the
env API as a rollout does, ``step`` then ``step_mdp``, fresh random actions) in one process, with
the sides alternating round by round on the same env:

* ``one_thread``: ``set_num_threads(1)``;
* ``two_threads``: ``set_num_threads(2)`` with the default ``min_work_per_thread`` (262,144
  work units: small calls stay on one thread);
* ``two_threads_small_grain``: ``set_num_threads(2)`` with ``min_work_per_thread`` 16,384, the
  grain the kernels used before (every call of these cells split over both threads).

All sides compute the same step (results are bit for bit the same for every setting, tested in
``tests/native``); torch runs on 1 thread throughout. The figure per cell is the median over
rounds of ``one_thread`` time / side time (> 1: the side is faster than one thread).

    python benchmarks/threads.py
    python benchmarks/threads.py --cells 1024x4,16384x4 --rounds 9 --round-seconds 0.5
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from marlkit.bench import (
    CellSpec,
    alternate,
    finish,
    make_parser,
    make_stepper,
    seconds_per_call,
    start,
)
from marlkit.native import get_min_work_per_thread, set_min_work_per_thread, set_num_threads

OLD_GRAIN = 16_384


def _settings(threads: int, grain: int) -> Callable[[], None]:
    def apply() -> None:
        set_num_threads(threads)
        set_min_work_per_thread(grain)

    return apply


def _timed(step: Callable[[], None], apply: Callable[[], None], seconds: float) -> float:
    """Seconds per step, over about ``seconds`` of steps (3 at least) under the side's settings."""
    apply()
    return seconds_per_call(step, seconds, min_calls=3, warmup=1)


def bench_cell(envs: int, agents: int, args: argparse.Namespace, default: int) -> dict[str, Any]:
    stepper = make_stepper(CellSpec("native", "navigation", envs=envs, agents=agents))
    try:
        for _ in range(10):
            stepper.step()
        sides = {
            "one_thread": _settings(1, default),
            "two_threads": _settings(2, default),
            "two_threads_small_grain": _settings(2, OLD_GRAIN),
        }
        rounds = alternate(
            {
                name: functools.partial(_timed, stepper.step, apply, args.round_seconds)
                for name, apply in sides.items()
            },
            args.rounds,
        )
    finally:
        stepper.close()
        set_num_threads(0)
        set_min_work_per_thread(default)
    out: dict[str, Any] = {"envs": envs, "agents": agents, "work": stepper.info["work"]}
    for name, times in rounds.items():
        out[f"{name}_ms"] = 1e3 * statistics.median(times)
        if name != "one_thread":
            ratios = [a / b for a, b in zip(rounds["one_thread"], times)]
            out[f"{name}_speedup"] = statistics.median(ratios)
            out[f"{name}_speedup_rounds"] = [round(r, 3) for r in ratios]
    return out


def main(argv: list[str] | None = None) -> int:
    # No --threads: torch runs on 1 thread, and the kernels' threads are what the sides vary.
    parser = make_parser(__doc__, rounds=9, round_seconds=0.5, threads_flag=False)
    parser.add_argument("--cells", default="1024x4,4096x4,16384x4,64x64")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    default = get_min_work_per_thread()
    cells = [tuple(int(v) for v in cell.split("x")) for cell in args.cells.split(",")]
    out: dict[str, Any] = {
        **start("threads", args),
        "default_min_work_per_thread": default,
        "small_grain": OLD_GRAIN,
        "does": "native navigation (VMAS's work, LiDAR included) step + step_mdp through the env "
        "API, the same env and step on every side; only the kernel thread settings differ",
        "cells": [],
    }
    for envs, agents in cells:
        print(f"cell {envs}x{agents}", file=sys.stderr)
        out["cells"].append(bench_cell(envs, agents, args, default))
    return finish(out)


if __name__ == "__main__":
    raise SystemExit(main())
