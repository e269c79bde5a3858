"""Timing helpers shared by the benchmark scripts: sides measured alternately, round by round."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

from marlkit.bench import alternate as bench_alternate


def seconds_per_call(step: Callable[[], object], seconds: float, warmup: int = 2) -> float:
    """Mean wall time of ``step()`` over about ``seconds`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        step()
    count, start = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / count


def alternate(
    sides: dict[str, Callable[[], object]], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Seconds per call of each side, ``rounds`` times, the sides alternating in each round (the
    order flipping every round, :func:`marlkit.bench.alternate`), so that a change of machine
    load hits every side alike."""
    timed = {
        name: functools.partial(seconds_per_call, step, seconds) for name, step in sides.items()
    }
    return bench_alternate(timed, rounds)


def summary(times: dict[str, list[float]], numerator: str, denominator: str) -> dict[str, object]:
    """Median milliseconds per call of each side and the per-round ratios of two of them."""
    ratios = [a / b for a, b in zip(times[numerator], times[denominator])]
    return {
        **{f"{name}_ms": 1e3 * statistics.median(ts) for name, ts in times.items()},
        f"ratio_{numerator}_over_{denominator}": statistics.median(ratios),
        "ratio_rounds": [round(r, 3) for r in ratios],
    }
