"""Env-step throughput: native ``navigation`` through ``EnvBase.step`` vs raw VMAS ``navigation``.

Both run in the same process, one after the other, on the same (envs, agents) cells, with
random continuous actions drawn each step. Native goes through the full env API (validation
off): ``step`` then ``step_mdp``, as a rollout does. VMAS is stepped raw: ``vmas.make_env`` and
a list of per-agent action tensors. Prints one JSON object; ratios are what to compare.

    python benchmarks/env_step.py                       # the cells of the issue
    python benchmarks/env_step.py --cells 1024x4 --min-seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch

from marlkit.bench import CellSpec, make_stepper, time_steps
from marlkit.native import extension_available


def bench_native(envs: int, agents: int, args: argparse.Namespace) -> dict:
    backend = args.backend
    if backend == "auto":
        backend = "native" if extension_available() else "torch"
    stepper = make_stepper(CellSpec(backend, "navigation", envs, agents))
    try:
        out = time_steps(
            stepper.step,
            min_seconds=args.min_seconds,
            min_steps=args.min_steps,
            warmup=args.warmup,
        )
    finally:
        stepper.close()
    out["backend"] = stepper.info["kernel"]
    return out


def bench_vmas(envs: int, agents: int, args: argparse.Namespace) -> dict:
    # marlkit.bench grows VMAS's spawning area with sqrt(agents): its default [-1, 1]^2 spawning
    # with a minimum spacing never finishes for 64 agents.
    stepper = make_stepper(CellSpec("vmas", "navigation", envs, agents))
    # VMAS costs grow with agents squared: fewer steps where one step takes long.
    out = time_steps(
        stepper.step,
        min_seconds=args.min_seconds,
        min_steps=max(2, args.min_steps // 10),
        warmup=max(1, args.warmup // 5),
    )
    out["world_spawning"] = stepper.info["world_spawning"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="1024x4,64x64", help="comma list of ENVSxAGENTS")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--min-steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--backend", default="auto", choices=["auto", "native", "torch"])
    parser.add_argument("--no-vmas", action="store_true", help="skip the VMAS side")
    args = parser.parse_args(argv)

    results = []
    for cell in args.cells.split(","):
        envs, agents = (int(x) for x in cell.lower().split("x"))
        row: dict = {"envs": envs, "agents": agents}
        native = bench_native(envs, agents, args)
        native["agent_steps_per_s"] = native["steps_per_s"] * envs * agents
        native["env_steps_per_s"] = native["steps_per_s"] * envs
        row["native"] = native
        if not args.no_vmas:
            raw = bench_vmas(envs, agents, args)
            raw["agent_steps_per_s"] = raw["steps_per_s"] * envs * agents
            raw["env_steps_per_s"] = raw["steps_per_s"] * envs
            row["vmas"] = raw
            row["native_over_vmas"] = native["agent_steps_per_s"] / raw["agent_steps_per_s"]
        results.append(row)
        print(f"{cell}: done", file=sys.stderr)

    report = {
        "benchmark": "env_step",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "results": results,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
