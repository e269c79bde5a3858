"""Env-step throughput: native ``navigation`` through ``EnvBase.step`` vs raw VMAS ``navigation``.

Like for like by default: native navigation computes VMAS navigation's work (its 12-ray LiDAR
against the other agents, its 18-value observation, agent radius 0.1, 2 substeps, a box as wide
as VMAS's spawning square; see ``marlkit.bench.work``), and VMAS runs its defaults. The old
native figure (k nearest neighbours, no LiDAR, radius 0.05, 4 substeps) is measured too, as
``native_knn``: different work, kept to compare with earlier runs.

Every cell runs its sides in the same process, in alternating rounds (the order flips each
round), so that load from other processes hits them alike; each side is timed for about
``--round-seconds`` per round, and the ratios are the medians of the per-round ratios. Native
goes through the whole env API (validation off): ``step`` then ``step_mdp``, as a rollout does;
VMAS is stepped raw (``vmas.make_env`` and a list of per-agent action tensors). Fresh random
actions every step. Prints one JSON object; each side's ``"work"`` says what it computed.

    python benchmarks/env_step.py                        # cells 1024x4 and 64x64
    python benchmarks/env_step.py --threads 1            # both sides on 1 thread (loaded machine)
    python benchmarks/env_step.py --cells 1024x4 --rounds 9 --vmas-extras
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from typing import Any

from marlkit.bench import (
    CellSpec,
    alternate,
    finish,
    make_parser,
    make_stepper,
    ratio,
    start,
    time_steps,
)
from marlkit.bench.cells import Stepper
from marlkit.native import extension_available

#: The issue's targets, in agent-steps/s: native (like for like) over VMAS, per (envs, agents).
TARGETS = {(1024, 4): 10.0, (64, 64): 100.0}


def _native_backend(choice: str) -> str:
    if choice == "auto":
        return "native" if extension_available() else "torch"
    return choice


def _sides(envs: int, agents: int, args: argparse.Namespace) -> dict[str, Stepper]:
    backend = _native_backend(args.backend)
    sides = {"native": make_stepper(CellSpec(backend, "navigation", envs, agents, work="lidar"))}
    if not args.no_knn:
        sides["native_knn"] = make_stepper(
            CellSpec(backend, "navigation", envs, agents, work="knn")
        )
    if not args.no_vmas:
        sides["vmas"] = make_stepper(CellSpec("vmas", "navigation", envs, agents))
        if args.vmas_extras:
            # A diagnostic, never the headline: VMAS with its agents' rotation switched off
            # times the work (always 0 here) that the native side does not do.
            stepper = make_stepper(CellSpec("vmas", "navigation", envs, agents))
            for agent in stepper.env.world.agents:
                agent._rotatable = False
            sides["vmas_no_rotation"] = stepper
    return sides


def _round(step: Any, name: str, args: argparse.Namespace) -> dict[str, float]:
    # VMAS steps take up to seconds where agents are many: at least one step per round.
    min_steps = 1 if name.startswith("vmas") else args.min_steps
    return time_steps(step, min_seconds=args.round_seconds, min_steps=min_steps)


def _summary(rounds: list[dict[str, float]], envs: int, agents: int) -> dict[str, Any]:
    rate = statistics.median(r["steps_per_s"] for r in rounds)
    return {
        "steps": sum(int(r["steps"]) for r in rounds),
        "seconds": sum(r["seconds"] for r in rounds),
        "steps_per_s": rate,
        "env_steps_per_s": rate * envs,
        "agent_steps_per_s": rate * envs * agents,
        "rounds_steps_per_s": [r["steps_per_s"] for r in rounds],
    }


def bench_cell(envs: int, agents: int, args: argparse.Namespace) -> dict[str, Any]:
    sides = _sides(envs, agents, args)
    try:
        for name, stepper in sides.items():
            warmup = max(1, args.warmup // 5) if name.startswith("vmas") else args.warmup
            for _ in range(warmup):
                stepper.step()
        rounds = alternate(
            {
                name: functools.partial(_round, stepper.step, name, args)
                for name, stepper in sides.items()
            },
            args.rounds,
        )
    finally:
        for stepper in sides.values():
            stepper.close()
    row: dict[str, Any] = {"envs": envs, "agents": agents}
    for name, stepper in sides.items():
        row[name] = {**_summary(rounds[name], envs, agents), **stepper.info}
    rates = {name: [r["steps_per_s"] for r in runs] for name, runs in rounds.items()}
    if "vmas" in sides:
        like = ratio(rates, "native", "vmas")
        row["native_over_vmas"] = like["median"]
        row["native_over_vmas_rounds"] = like["rounds"]
        if "native_knn" in sides:
            row["native_knn_over_vmas"] = ratio(rates, "native_knn", "vmas")["median"]
            row["native_knn_note"] = "different work: no LiDAR on the native side"
        if "vmas_no_rotation" in sides:
            share = 1.0 - ratio(rates, "vmas", "vmas_no_rotation")["median"]
            row["vmas_rotation_share_of_step"] = share
            # A lower bound: VMAS without the rotation work the native side does not do.
            bound = ratio(rates, "native", "vmas_no_rotation")["median"]
            row["native_over_vmas_no_rotation"] = bound
    return row


def _targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for (envs, agents), threshold in TARGETS.items():
        row = next((r for r in results if (r["envs"], r["agents"]) == (envs, agents)), None)
        value = None if row is None else row.get("native_over_vmas")
        out.append(
            {
                "cell": f"{envs}x{agents}",
                "description": f"native >= {threshold:g}x VMAS at {envs} envs x {agents} agents, "
                "like for like, in agent-steps/s",
                "threshold": threshold,
                "value": value,
                "met": None if value is None else value >= threshold,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, rounds=5, round_seconds=0.5)
    parser.add_argument("--cells", default="1024x4,64x64", help="comma list of ENVSxAGENTS")
    parser.add_argument("--min-steps", type=int, default=5, help="native steps per round")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--backend", default="auto", choices=["auto", "native", "torch"])
    parser.add_argument("--no-vmas", action="store_true", help="skip the VMAS side")
    parser.add_argument("--no-knn", action="store_true", help="skip the native knn figure")
    parser.add_argument(
        "--vmas-extras",
        action="store_true",
        help="also time VMAS with its agents' rotation off: the share of its step the native "
        "side does not compute (a diagnostic)",
    )
    args = parser.parse_args(argv)
    if args.min_steps < 1 or args.warmup < 1:
        parser.error("--min-steps and --warmup must be >= 1")
    report = start("env_step", args)
    report["headline"] = "native_over_vmas: like for like (native computes VMAS's LiDAR)"
    results = []
    for cell in args.cells.split(","):
        envs, agents = (int(x) for x in cell.lower().split("x"))
        results.append(bench_cell(envs, agents, args))
        print(f"{cell}: done", file=sys.stderr)
    report["results"] = results
    report["targets"] = _targets(results) if not args.no_vmas else []
    return finish(report)


if __name__ == "__main__":
    sys.exit(main())
