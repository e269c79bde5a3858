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
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable

import torch

import marlkit


def _time(step: Callable[[], None], min_seconds: float, min_steps: int, warmup: int) -> dict:
    for _ in range(warmup):
        step()
    steps, start = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - start < min_seconds:
        step()
        steps += 1
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


def bench_native(envs: int, agents: int, args: argparse.Namespace) -> dict:
    env = marlkit.make("navigation", num_envs=envs, n_agents=agents, seed=0, backend=args.backend)
    env.validate_actions = False
    state = {"td": env.reset()}
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        td = state["td"]
        td.set(("agents", "action"), torch.rand(envs, agents, 2, generator=gen) * 2 - 1)
        state["td"] = env._step_mdp(env.step(td))

    out = _time(step, args.min_seconds, args.min_steps, args.warmup)
    out["backend"] = env.backend
    env.close()
    return out


def bench_vmas(envs: int, agents: int, args: argparse.Namespace) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vmas

        # VMAS spawns with a minimum spacing in [-1, 1]^2 by default, which never finishes for
        # 64 agents: grow its spawning area with sqrt(agents), as the native world grows.
        spawn = max(1.0, 0.5 * math.sqrt(agents))
        env = vmas.make_env(
            "navigation",
            num_envs=envs,
            device="cpu",
            continuous_actions=True,
            n_agents=agents,
            seed=0,
            world_spawning_x=spawn,
            world_spawning_y=spawn,
        )
    env.reset()
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        actions = [torch.rand(envs, 2, generator=gen) * 2 - 1 for _ in range(agents)]
        env.step(actions)

    # VMAS costs grow with agents squared: fewer steps where one step takes long.
    out = _time(step, args.min_seconds, max(2, args.min_steps // 10), max(1, args.warmup // 5))
    out["world_spawning"] = spawn
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
