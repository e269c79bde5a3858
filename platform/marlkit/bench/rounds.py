"""The one timing helper of ``benchmarks/``: the clock, alternating rounds, medians, and the
command line and JSON header every script shares.

A script builds its command line with :func:`make_parser` (the same flags, spelled the same:
``--only``, ``--rounds``, ``--round-seconds``, ``--threads``), times its sides with
:func:`alternate` (one measurement of each side per round, the order flipping every round),
:func:`alternate_calls` (the same, in seconds per call) or :func:`paired` (calls back to back),
and prints one JSON object through :func:`run_sections` (or :func:`start` then :func:`finish`),
whose header is ``{"benchmark", "environment", "settings"}``.

Examples:
    >>> from marlkit.bench.rounds import alternate_calls, ratio
    >>> sides = {"a": lambda: None, "b": lambda: sum(range(100))}
    >>> times = alternate_calls(sides, rounds=3, seconds=0.0)  # seconds per call, per round
    >>> len(times["a"]), len(ratio(times, "b", "a")["rounds"])
    (3, 3)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from marlkit.bench.environment import describe_environment, load_average
from marlkit.native import set_threads

__all__ = [
    "Stopwatch",
    "alternate",
    "alternate_calls",
    "finish",
    "make_parser",
    "paired",
    "positive",
    "ratio",
    "run_sections",
    "seconds_per_call",
    "start",
    "summary",
    "time_steps",
    "timed",
]

T = TypeVar("T")
Section = Callable[[argparse.Namespace], Any]


# --- the clock ---------------------------------------------------------------------------------
def time_steps(
    step: Callable[[], object],
    *,
    min_seconds: float,
    min_steps: int,
    warmup: int = 0,
    deadline: float = math.inf,
) -> dict[str, float]:
    """Run ``warmup`` untimed steps, then time steps until ``min_steps`` and ``min_seconds``.

    After ``min_steps``, stops early rather than start a step expected to end past ``deadline``
    (a ``time.perf_counter()`` value). Returns ``{"steps", "seconds", "steps_per_s"}``.
    """
    for _ in range(warmup):
        step()
    steps, start = 0, time.perf_counter()
    now = start
    while steps < min_steps or now - start < min_seconds:
        if steps >= min_steps and now + (now - start) / steps > deadline:
            break
        step()
        steps += 1
        now = time.perf_counter()
    seconds = max(now - start, 1e-12)
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


def seconds_per_call(
    step: Callable[[], object], seconds: float, *, min_calls: int = 1, warmup: int = 0
) -> float:
    """Mean wall time of ``step()`` over at least ``min_calls`` calls and ``seconds`` seconds,
    after ``warmup`` untimed calls."""
    run = time_steps(step, min_seconds=seconds, min_steps=min_calls, warmup=warmup)
    return run["seconds"] / run["steps"]


def timed(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result and its wall time in seconds (one call: a fill, a subprocess)."""
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


class Stopwatch:
    """Adds up the seconds spent inside the callables it wraps (a simulator's ``step`` inside an
    adapter, a policy inside a collector): what share of a side's time they take.

    Examples:
        >>> watch = Stopwatch()
        >>> double = watch.wrap(lambda x: 2 * x)
        >>> double(3), watch.seconds > 0
        (6, True)
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` with the time of each call added to :attr:`seconds`."""

        def call(*args: Any, **kwargs: Any) -> T:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return call


# --- rounds --------------------------------------------------------------------------------------
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


def alternate_calls(
    sides: Mapping[str, Callable[[], object]],
    rounds: int,
    seconds: float,
    *,
    min_calls: int = 1,
    warmup: int = 0,
) -> dict[str, list[float]]:
    """Seconds per call of each side (:func:`seconds_per_call` over ``seconds`` and at least
    ``min_calls`` calls, after ``warmup`` untimed ones), in ``rounds`` :func:`alternate` rounds."""
    return alternate(
        {
            name: functools.partial(
                seconds_per_call, step, seconds, min_calls=min_calls, warmup=warmup
            )
            for name, step in sides.items()
        },
        rounds,
    )


def paired(
    a: Callable[[], object], b: Callable[[], object], *, min_pairs: int, min_seconds: float = 0.0
) -> list[tuple[float, float]]:
    """Seconds of one call of ``a`` and one of ``b``, back to back in alternating order (``a``
    first in even pairs), for at least ``min_pairs`` pairs and ``min_seconds`` seconds: load
    from other processes hits both calls of a pair alike. Returns ``[(a_s, b_s), ...]``."""
    pairs: list[tuple[float, float]] = []

    def pair() -> None:
        first, second = (a, b) if len(pairs) % 2 == 0 else (b, a)
        _, t_first = timed(first)
        _, t_second = timed(second)
        pairs.append((t_first, t_second) if first is a else (t_second, t_first))

    time_steps(pair, min_seconds=min_seconds, min_steps=min_pairs)
    return pairs


def ratio(rounds: Mapping[str, Sequence[float]], num: str, den: str) -> dict[str, Any]:
    """Per-round ratios ``rounds[num][i] / rounds[den][i]`` and their median:
    ``{"median": ..., "rounds": [...]}``."""
    per_round = [a / b for a, b in zip(rounds[num], rounds[den])]
    return {"median": statistics.median(per_round), "rounds": per_round}


def summary(
    times: Mapping[str, Sequence[float]], numerator: str, denominator: str
) -> dict[str, Any]:
    """Median milliseconds per call of each side (``<side>_ms``) and the median of the
    per-round ratios of two of them (``ratio_<num>_over_<den>``, rounds in ``ratio_rounds``)."""
    per_round = ratio(times, numerator, denominator)
    return {
        **{f"{name}_ms": 1e3 * statistics.median(ts) for name, ts in times.items()},
        f"ratio_{numerator}_over_{denominator}": per_round["median"],
        "ratio_rounds": [round(r, 3) for r in per_round["rounds"]],
    }


# --- the command line and the JSON -------------------------------------------------------------
def positive(kind: type, *, zero: bool = False, finite: bool = True) -> Any:
    """An argparse ``type``: a ``kind`` > 0 (>= 0 with ``zero``), finite unless not ``finite``
    (``inf``: no limit); argparse names the flag in its error (``argument --rounds: must be a
    finite number > 0, got 0``)."""
    bound = f"{'a finite number' if finite else 'a number'} {'>= 0' if zero else '> 0'}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            name = kind.__name__
            article = "an" if name[0] in "aeiou" else "a"
            raise argparse.ArgumentTypeError(f"expected {article} {name}, got {text!r}") from None
        if not (value >= 0 if zero else value > 0) or (finite and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = f"{'non-negative' if zero else 'positive'} {kind.__name__}"
    return parse


def make_parser(
    doc: str | None,
    *,
    sections: Iterable[str] = (),
    rounds: int | None = None,
    round_seconds: float | None = None,
    threads: int | None = None,
    threads_flag: bool = True,
) -> argparse.ArgumentParser:
    """The command line every script of ``benchmarks/`` starts from; the script adds its own.

    Args:
        doc: the script's docstring; its first line is the description.
        sections: the script's sections: ``--only NAME`` (repeatable) runs some of them.
        rounds: the default of ``--rounds`` (alternating rounds); ``None``: no such flag.
        round_seconds: the default of ``--round-seconds`` (seconds each side is timed per
            round); ``None``: no such flag.
        threads: the default of ``--threads`` (torch's and the native kernels' threads,
            :func:`marlkit.native.set_threads`); ``None``: leave both as they are.
        threads_flag: ``False`` for a script that sets threads itself (no ``--threads``).
    """
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    names = sorted(sections)
    if names:
        parser.add_argument(
            "--only",
            action="append",
            choices=names,
            default=None,
            metavar="NAME",
            help=f"run this section only (repeatable): {', '.join(names)}",
        )
    if rounds is not None:
        parser.add_argument(
            "--rounds",
            type=positive(int),
            default=rounds,
            metavar="N",
            help=f"rounds, the sides' order flipping every round; medians over them "
            f"(default {rounds})",
        )
    if round_seconds is not None:
        parser.add_argument(
            "--round-seconds",
            type=positive(float, zero=True),
            default=round_seconds,
            metavar="S",
            help=f"seconds each side is timed per round (default {round_seconds:g})",
        )
    if threads_flag:
        parser.add_argument(
            "--threads",
            type=positive(int),
            default=threads,
            metavar="N",
            help="torch and native-kernel threads (default "
            f"{threads if threads is not None else 'as they are'})",
        )
    return parser


def start(benchmark: str, args: argparse.Namespace) -> dict[str, Any]:
    """Apply ``args.threads`` (where the script has the flag) and return the JSON header:
    ``{"benchmark": benchmark, "environment": ..., "settings": <the command line>}``."""
    set_threads(getattr(args, "threads", None))
    return {
        "benchmark": benchmark,
        "environment": describe_environment(),
        "settings": dict(vars(args)),
    }


def finish(report: dict[str, Any], *, indent: int | None = 2) -> int:
    """Note the load average at the end in ``report["environment"]`` and print ``report`` as
    one JSON object on stdout. Returns the exit status (0)."""
    report["environment"]["load_average_end"] = load_average()
    print(json.dumps(report, indent=indent), flush=True)
    return 0


def run_sections(
    benchmark: str,
    sections: Mapping[str, Section],
    args: argparse.Namespace,
    default: Sequence[str] | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Run ``args.only`` (or ``default``, or every section) after :func:`start` and print
    ``{<header>, **extra, <section>: <its JSON>}`` (:func:`finish`); progress goes to stderr.
    Returns the exit status (0)."""
    out = {**start(benchmark, args), **(extra or {})}
    for name in getattr(args, "only", None) or default or list(sections):
        out[name] = sections[name](args)
        print(f"{name}: done", file=sys.stderr)
    return finish(out)
