"""``marlkit bench scaling``: the scaling benchmark as a command.

``marlkit bench scaling [--scenario navigation] [--agents 4,16,64,...] [--envs N |
--total-agents N] [--backends native,vmas] [--work lidar|knn] [--out DIR]`` shows a progress
bar over cells (stderr), prints a table and writes ``DIR/scaling.json`` and ``DIR/scaling.png``.
With ``--json`` the JSON goes to stdout instead of the table (which then goes to stderr), as
``benchmarks/`` scripts print.

``marlkit bench scaling --env magent2/battle_v4 --param map_size=16,32,64 [--env swarm --param
n_agents=...] [--envs N] [--env-arg [ENV:]KEY=VALUE]`` sweeps any registered env over the
keyword that sizes it instead (:mod:`marlkit.bench.env_scaling`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from marlkit._utils import make_out_folder
from marlkit.bench.cells import BACKENDS, SCENARIOS
from marlkit.bench.env_scaling import EnvScalingConfig, run_env_scaling, sweeps_from_args
from marlkit.bench.rounds import positive
from marlkit.bench.scaling import (
    DEFAULT_AGENTS,
    DEFAULT_TOTAL_AGENTS,
    ScalingConfig,
    run_scaling,
)
from marlkit.bench.work import DEFAULT_WORK, WORKS
from marlkit.record._cli import parse_env_args

__all__ = ["add_bench_parser", "cmd_scaling", "parse_agents", "parse_backends"]

DEFAULT_OUT = "runs/scaling"


def parse_agents(text: str) -> tuple[int, ...]:
    """``"4,16,64"`` -> ``(4, 16, 64)``; every value an int >= 1 (argparse's ``type``)."""
    values = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma list of ints >= 1 (e.g. 4,16,64), got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"agents per env must be >= 1, got {value} in {text!r}"
            )
        values.append(value)
    return tuple(values)


def parse_backends(text: str) -> tuple[str, ...]:
    """``"native,vmas"`` -> ``("native", "vmas")``, each one of :data:`BACKENDS`."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {unknown or [text]}; choose from {', '.join(BACKENDS)}"
        )
    return names


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` (with its ``scaling`` sub-command) to the ``marlkit`` sub-parsers."""
    p_bench = sub.add_parser("bench", help="benchmarks (`marlkit bench scaling`)")
    bench_sub = p_bench.add_subparsers(dest="benchmark", required=True, metavar="{scaling}")
    p = bench_sub.add_parser(
        "scaling",
        help="agent-steps/s as agents per env grow: native vs VMAS, JSON + PNG plot",
        description=(
            "Agent-steps/s for each agents-per-env value and backend, with envs x agents ~= "
            "--total-agents (default) or a fixed --envs. Cells over --cell-budget seconds are "
            "skipped with the reason. Writes OUT/scaling.json and OUT/scaling.png."
        ),
    )
    p.add_argument(
        "--env",
        dest="env_names",
        action="append",
        default=[],
        metavar="NAME",
        help="sweep this registered env instead of navigation's backends (repeatable, each "
        "with its --param); cells in subprocesses, agents counted from the built env",
    )
    p.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="the keyword that sizes the --env before it and its integer values, e.g. "
        "map_size=16,32,64 (magent2), n_agents=64,1024 (native scenarios)",
    )
    p.add_argument(
        "--env-arg",
        dest="env_args",
        action="append",
        default=[],
        metavar="[ENV:]KEY=VALUE",
        help="another keyword of every --env, or of ENV only, e.g. magent2/battle_v4:state=False",
    )
    p.add_argument(
        "--scenario",
        default=None,
        choices=sorted(SCENARIOS),
        help="native scenario to scale (default navigation)",
    )
    p.add_argument(
        "--agents",
        dest="agent_counts",
        type=parse_agents,
        default=None,
        metavar="LIST",
        help=f"agents per env, comma list (default {','.join(map(str, DEFAULT_AGENTS))})",
    )
    sizing = p.add_mutually_exclusive_group()
    sizing.add_argument(
        "--envs",
        dest="fixed_envs",
        type=positive(int),
        metavar="N",
        help="fixed envs per cell (with --env: num_envs of every cell, default 1)",
    )
    sizing.add_argument(
        "--total-agents",
        type=positive(int),
        metavar="N",
        help=f"envs = total / agents per cell (default {DEFAULT_TOTAL_AGENTS:,})",
    )
    p.add_argument(
        "--backends",
        type=parse_backends,
        default=None,
        metavar="LIST",
        help=f"comma list of {', '.join(BACKENDS)} (default native,vmas)",
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, metavar="DIR", help=f"output folder (default {DEFAULT_OUT})"
    )
    p.add_argument(
        "--min-seconds",
        type=positive(float, zero=True),
        default=2.0,
        metavar="S",
        help="timed seconds (default 2)",
    )
    p.add_argument(
        "--min-steps", type=positive(int), default=3, metavar="N", help="timed steps (default 3)"
    )
    p.add_argument(
        "--warmup",
        type=positive(int),
        default=1,
        metavar="N",
        help="untimed steps, the probe step included (default 1)",
    )
    p.add_argument(
        "--cell-budget",
        type=positive(float, finite=False),
        default=60.0,
        metavar="S",
        help="seconds per cell; cells estimated over it are skipped (default 60; inf: none)",
    )
    p.add_argument(
        "--startup-allowance",
        type=positive(float, zero=True),
        default=30.0,
        metavar="S",
        help="seconds a cell subprocess may take to start, on top of the budget (default 30)",
    )
    p.add_argument(
        "--isolate",
        choices=("peers", "all", "none"),
        default=None,
        help="cells run in a subprocess killed past the budget (default peers: all but native)",
    )
    p.add_argument(
        "--threads", type=positive(int), metavar="N", help="torch and native-kernel threads"
    )
    p.add_argument(
        "--work",
        choices=WORKS,
        default=None,
        help=(
            "what the native side computes: lidar (VMAS navigation's work, its 12-ray LiDAR "
            "included; the default) or knn (native defaults: different work)"
        ),
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of every env and its random actions (default 0)"
    )
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")
    p.add_argument("--json", action="store_true", help="print the JSON (table to stderr)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_scaling)


#: Options of navigation's backend sweep, with no meaning for a sweep of any env (--env).
_BACKEND_OPTIONS = {
    "scenario": "--scenario",
    "agent_counts": "--agents",
    "total_agents": "--total-agents",
    "backends": "--backends",
    "work": "--work",
    "isolate": "--isolate",
}


def _env_sweeps(args: argparse.Namespace) -> tuple[EnvScalingConfig, str]:
    """The config of ``--env`` sweeps, and what its table calls it."""
    given = [flag for dest, flag in _BACKEND_OPTIONS.items() if getattr(args, dest) is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)}: options of navigation's backend sweep; with --env the cells "
            "are the --param values (--envs sets num_envs of each)"
        )
    shared: list[str] = []
    only: dict[str, list[str]] = {}
    for item in args.env_args:
        head, eq, _ = item.partition("=")
        env, colon, key = head.rpartition(":")
        if eq and colon:
            if env not in args.env_names:
                raise ValueError(f"--env-arg {item!r} names {env!r}, which is not an --env")
            only.setdefault(env, []).append(f"{key}={item.partition('=')[2]}")
        else:
            shared.append(item)
    kwargs = {
        e: {**parse_env_args(shared), **parse_env_args(only.get(e, []))} for e in args.env_names
    }
    sweeps = sweeps_from_args(args.env_names, args.params)
    sweeps = tuple(type(s)(s.env, s.param, s.values, kwargs[s.env]) for s in sweeps)
    config = EnvScalingConfig(
        sweeps,
        envs=args.fixed_envs or 1,
        min_seconds=args.min_seconds,
        min_steps=args.min_steps,
        warmup=args.warmup,
        cell_budget_s=args.cell_budget,
        threads=args.threads,
        seed=args.seed,
        startup_allowance_s=args.startup_allowance,
    )
    return config, ", ".join(s.label for s in sweeps)


def cmd_scaling(args: argparse.Namespace) -> int:
    """Run ``marlkit bench scaling``; returns the exit status."""
    report: Any
    if args.env_names or args.params or args.env_args:
        if not args.env_names:
            raise ValueError("--param and --env-arg go with --env NAME (the env to sweep)")
        env_config, _ = _env_sweeps(args)
        out = make_out_folder(args.out)  # an unusable --out fails now, not after the run
        report = run_env_scaling(env_config, progress=not args.no_progress)
    else:
        config = ScalingConfig(
            scenario=args.scenario or "navigation",
            agents=args.agent_counts or DEFAULT_AGENTS,
            total_agents=args.total_agents,
            envs=args.fixed_envs,
            backends=args.backends or ("native", "vmas"),
            min_seconds=args.min_seconds,
            min_steps=args.min_steps,
            warmup=args.warmup,
            cell_budget_s=args.cell_budget,
            threads=args.threads,
            seed=args.seed,
            work=args.work or DEFAULT_WORK,
            isolate=args.isolate or "peers",
            startup_allowance_s=args.startup_allowance,
        )
        out = make_out_folder(args.out)  # an unusable --out fails now, not after the run
        report = run_scaling(config, progress=not args.no_progress)
    print(report.table(), file=sys.stderr if args.json else sys.stdout)
    paths = report.write(out, plot=not args.no_plot)
    written = ", ".join(str(p) for p in paths.values())
    if args.json:
        print(f"written: {written}", file=sys.stderr)
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"written: {written}")
    return 0
