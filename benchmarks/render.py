"""The software renderer, native C++ kernel vs its NumPy twin: one JSON object.

Cells (each timed for both backends in the same run, alternating rounds):

* ``frame``: one ``render_frame`` of ``--size`` pixels with ``--agents`` filled agents and as
  many goal rings, what a native scenario draws (the issue's target: under 2 ms at 256 x 256
  with 64 agents, native).
* ``batch``: ``render_frames`` of ``--envs`` frames at ``--batch-size`` pixels (one per env of a
  batch, spread over the kernel threads), then ``tile_frames`` into one image.
* ``env_render``: ``env.render(0)`` of ``navigation`` with ``--agents`` agents (the renderer plus
  the scenario's layer building), native only.

Times are milliseconds per call over ``--rounds`` alternating rounds of ``--round-seconds`` (and
``--min-steps`` calls) each: the fastest round (other load only slows rounds down) and the
median; ``numpy_over_native`` is the NumPy twin's time over the kernel's.

Example:
    python benchmarks/render.py --size 256 --agents 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import marlkit
from marlkit.bench import alternate_calls, finish, make_parser, start
from marlkit.native.render import Circles, group_color, lighten, render_frames, tile_frames


def _layers(rng: np.random.Generator, agents: int, batch: tuple[int, ...]) -> list[Circles]:
    goals = rng.uniform(-0.9, 0.9, (*batch, agents, 2))
    bodies = rng.uniform(-0.9, 0.9, (*batch, agents, 2))
    return [
        Circles(goals, radius=0.05, color=lighten(group_color(0)), filled=False, name="goals"),
        Circles(bodies, radius=0.05, color=group_color(0), name="agents"),
    ]


def _rounds(calls: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict[str, dict]:
    """Time each call in ``args.rounds`` alternating rounds: fastest and median ms per call."""
    per_call = alternate_calls(
        calls, args.rounds, args.round_seconds, min_calls=args.min_steps, warmup=1
    )
    return {
        name: {"ms": 1e3 * min(times), "ms_median": 1e3 * statistics.median(times)}
        for name, times in per_call.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, rounds=5, round_seconds=0.3)
    parser.add_argument("--size", type=int, default=256, help="frame size of the frame cell")
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--envs", type=int, default=16, help="frames of the batch cell")
    parser.add_argument("--batch-size", type=int, default=128, help="frame size of the batch cell")
    parser.add_argument("--min-steps", type=int, default=5, help="calls per round at least")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = start("render", args)
    rng = np.random.default_rng(args.seed)

    frame_layers = _layers(rng, args.agents, ())
    batch_layers = _layers(rng, args.agents, (args.envs,))

    def frame(backend: str) -> Callable[[], Any]:
        return lambda: render_frames(
            frame_layers, half_extent=1.0, size=args.size, batch_shape=(), backend=backend
        )

    def batch(backend: str) -> Callable[[], Any]:
        return lambda: tile_frames(
            render_frames(batch_layers, half_extent=1.0, size=args.batch_size, backend=backend)
        )

    env = marlkit.make("navigation", num_envs=1, n_agents=args.agents, seed=args.seed)
    env.reset()
    timings = _rounds(
        {
            "frame_native": frame("native"),
            "frame_numpy": frame("numpy"),
            "batch_native": batch("native"),
            "batch_numpy": batch("numpy"),
            "env_render_native": lambda: env.render(0),
        },
        args,
    )
    env.close()
    cells = {
        "frame": {"size": args.size, "agents": args.agents},
        "batch": {"envs": args.envs, "size": args.batch_size, "agents": args.agents},
        "env_render": {"scenario": "navigation", "agents": args.agents, "size": env.render_size},
    }
    for cell, entry in cells.items():
        for backend in ("native", "numpy"):
            if f"{cell}_{backend}" in timings:
                entry[backend] = timings[f"{cell}_{backend}"]
        if "numpy" in entry:
            entry["numpy_over_native"] = entry["numpy"]["ms"] / entry["native"]["ms"]
    report["cells"] = cells
    report["target_frame_ms"] = 2.0
    report["target_met"] = cells["frame"]["native"]["ms"] < 2.0
    return finish(report)


if __name__ == "__main__":
    sys.exit(main())
