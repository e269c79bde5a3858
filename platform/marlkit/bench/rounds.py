"""What the side-by-side scripts of ``benchmarks/`` share: rounds that alternate the sides, and
the ``main`` that runs the chosen sections and prints one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from marlkit.bench.environment import describe_environment, set_threads

__all__ = ["alternate", "run_sections"]

T = TypeVar("T")


def alternate(measure: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """One measurement of each side per round, the order flipping every round (so a drift in
    machine load hits every side alike). Returns each side's measurements, in round order."""
    results: dict[str, list[T]] = {name: [] for name in measure}
    order = list(measure)
    for _ in range(rounds):
        for name in order:
            results[name].append(measure[name]())
        order.reverse()
    return results


def run_sections(
    benchmark: str,
    sections: Mapping[str, Callable[[argparse.Namespace], dict[str, Any]]],
    args: argparse.Namespace,
    default: Sequence[str] | None = None,
) -> int:
    """Run ``args.only`` (or ``default``, or every section) with ``args.threads`` threads and
    print ``{"benchmark": ..., <environment>, <section>: <its JSON>}`` to stdout; progress goes
    to stderr. Returns the exit status (0)."""
    set_threads(args.threads)
    out: dict[str, Any] = {"benchmark": benchmark, **describe_environment()}
    for name in args.only or default or list(sections):
        out[name] = sections[name](args)
        print(f"{name}: done", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0
