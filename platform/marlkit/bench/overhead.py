"""An adapter against its simulator's own loop: the one measurement of ``benchmarks/adapters*``.

A benchmark builds two callables doing equal work, one step each: the raw loop over the
simulator (its own API, its own data) and :func:`collector_loop` over the marlkit env (actions
into the TensorDict, ``step_and_maybe_reset``), and hands them to :func:`measure_overhead`,
which times them in alternating rounds (:func:`~marlkit.bench.rounds.alternate_calls`) and
adds up the adapter's time spent inside the simulator's own calls. Where a script sweeps a size
(envs, map size), :func:`add_sweep` adds its repeatable flag.

Examples:
    >>> from marlkit.bench.overhead import measure_overhead
    >>> result = measure_overhead(lambda: None, lambda: sum(range(100)), rounds=3, seconds=0.0)
    >>> len(result.ratio_rounds), result.ratio > 0, result.inside_fraction
    (3, True, None)
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit.bench.rounds import Stopwatch, alternate_calls, positive, ratio

__all__ = [
    "Overhead",
    "add_sweep",
    "collector_loop",
    "measure_overhead",
    "random_actions",
    "watching",
]


@dataclass(frozen=True)
class Overhead:
    """One adapter against its raw loop (:func:`measure_overhead`).

    Attributes:
        raw_s: median over rounds of the raw loop's seconds per call.
        adapter_s: the same for the adapter's loop.
        ratio: median over rounds of raw seconds / adapter seconds: the share of the raw loop's
            rate the adapter keeps (1.0: no overhead).
        ratio_rounds: that quotient in each round, rounded to 3 decimals.
        inside_fraction: the share of the adapter's time spent inside the watched calls (the
            simulator's own step): the ratio against a loop that costs nothing beyond them,
            insensitive to load; ``None`` where nothing was watched.
    """

    raw_s: float
    adapter_s: float
    ratio: float
    ratio_rounds: list[float]
    inside_fraction: float | None

    def rates(self, per_call: float = 1.0) -> tuple[float, float]:
        """``(raw, adapter)`` rates: ``per_call`` units (env steps of a batch, agents) a second."""
        return per_call / self.raw_s, per_call / self.adapter_s


@contextmanager
def watching(watch: Stopwatch, calls: Sequence[tuple[object, str]]) -> Iterator[None]:
    """Within the block, each ``(obj, name)`` method of ``calls`` is timed by ``watch`` (an
    instance attribute shadowing the method); the instance attributes are removed afterwards
    (an attribute set before is put back)."""
    with ExitStack() as stack:
        for obj, name in calls:
            before = obj.__dict__.get(name, _MISSING)
            setattr(obj, name, watch.wrap(getattr(obj, name)))
            stack.callback(_restore, obj, name, before)
        yield


_MISSING = object()


def _restore(obj: object, name: str, before: object) -> None:
    if before is _MISSING:
        delattr(obj, name)
    else:
        setattr(obj, name, before)


def measure_overhead(
    raw: Callable[[], object],
    adapter: Callable[[], object],
    *,
    rounds: int,
    seconds: float,
    min_calls: int = 1,
    warmup: int = 0,
    inside: Sequence[tuple[object, str]] = (),
) -> Overhead:
    """Time ``raw`` and ``adapter`` (one step each) in ``rounds`` alternating rounds of
    ``seconds`` and at least ``min_calls`` calls per side, after ``warmup`` untimed calls of each
    per round, and the adapter's time inside the ``inside`` methods (``(obj, "step")``:
    :func:`watching`), warmup calls included on both counts.
    """
    in_adapter, in_sim = Stopwatch(), Stopwatch()
    sides = {"raw": raw, "adapter": in_adapter.wrap(adapter)}
    with watching(in_sim, inside):
        times = alternate_calls(sides, rounds, seconds, min_calls=min_calls, warmup=warmup)
    per_round = ratio(times, "raw", "adapter")
    return Overhead(
        raw_s=statistics.median(times["raw"]),
        adapter_s=statistics.median(times["adapter"]),
        ratio=per_round["median"],
        ratio_rounds=[round(r, 3) for r in per_round["rounds"]],
        inside_fraction=in_sim.seconds / in_adapter.seconds if inside else None,
    )


def random_actions(
    env: Any, generator: torch.Generator
) -> Callable[[TensorDictBase], dict[str, torch.Tensor]]:
    """Per call, one ``torch.randint`` per group over its categorical ``(group, "action")``
    spec, drawn from ``generator``: the policy of a benchmark (every action, unmasked; the
    TensorDict it is given is not read)."""
    specs = [(group, env.action_spec[group, "action"]) for group in env.group_map]

    def draw(td: TensorDictBase) -> dict[str, torch.Tensor]:
        return {
            group: torch.randint(0, int(spec.n), tuple(spec.shape), generator=generator)
            for group, spec in specs
        }

    return draw


def collector_loop(
    env: Any, actions: Callable[[TensorDictBase], Mapping[str, torch.Tensor]]
) -> Callable[[], None]:
    """A collector's loop over ``env``, one step a call: ``actions(td)`` (``{group: [*B, n]}``,
    a policy reading the last TensorDict ``td``: masks, who acts) written into
    ``(group, "action")`` of ``td``, then ``step_and_maybe_reset``. The env is reset once,
    here."""
    box = {"td": env.reset()}

    def step() -> None:
        td = box["td"]
        for group, action in actions(td).items():
            td.set((group, "action"), action)
        _, box["td"] = env.step_and_maybe_reset(td)

    return step


class _Sweep(argparse.Action):
    """``append`` whose first use replaces the default list instead of adding to it."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        current = getattr(namespace, self.dest)
        items = [] if current is self.default else list(current)
        setattr(namespace, self.dest, [*items, values])


def add_sweep(
    parser: argparse.ArgumentParser, flag: str, default: Sequence[int], what: str
) -> None:
    """Add the repeatable flag ``flag`` (positive ints; ``default`` until given) sweeping
    ``what`` (``"batch sizes"``), and ``--min-steps`` (calls per side and round, default 5)."""
    parser.add_argument(
        flag,
        type=positive(int),
        action=_Sweep,
        default=list(default),
        metavar="N",
        help=f"{what} to sweep (repeatable; default {', '.join(map(str, default))})",
    )
    parser.add_argument(
        "--min-steps", type=positive(int), default=5, help="steps per side and round, at least"
    )
