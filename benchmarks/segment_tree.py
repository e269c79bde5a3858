"""Prioritized-replay segment trees, native `marlkit._C` vs pure torch: one JSON object.

Three implementations of one workload (capacity ``C`` priorities, batches of ``B``):

* ``native``: :class:`marlkit.native.segment_tree.SumSegmentTree` with ``backend="native"``
  (the public Python face over the C++ tree, input checks included).
* ``torch``: the plain torch recipe the issue names as the peer: a flat ``[C]`` tensor,
  ``p[idx] = v`` for updates and ``cumsum`` + ``searchsorted`` for every sample batch, no checks.
* ``torch_twin``: the same class with ``backend="torch"`` (the library's fallback: input checks,
  last-write-wins for repeated indices, ``total()`` as its own reduction).

Both torch implementations run at each of ``--torch-threads`` (default: 1 and all cores; on a
small or busy machine one thread can be the faster); ratios compare native with the fastest.
Native runs on ``--threads`` kernel threads (default: all cores).

Measured per implementation, each over ``--rounds`` rounds of ``--repeats`` batches; the rate of
the fastest round is reported (as ``timeit`` does: other load on the machine only slows rounds
down), and the median round as ``*_median``:

* ``updates_per_s``: priorities written per second (``update(idx [B], values [B])``).
* ``samples_per_s``: indices sampled per second (``scan_lower_bound(u [B] * total)``) on a tree
  that does not change between batches.
* ``cycles_per_s``: prioritized-replay iterations per second, each one update of ``B`` priorities
  followed by one sample of ``B`` indices (what a training loop does every step); also given as
  ``cycle_items_per_s`` (``B`` per cycle).

``same_index_fraction_native_vs_torch`` is the share of one batch of masses for which native and
the torch recipe pick the same index from the same priorities: below 1 in float32 because a
sequential float32 ``cumsum`` over ``C`` values drifts (the tree's blocked sums do not).

Example:
    python benchmarks/segment_tree.py --capacity 1000000 --batch 4096 --repeats 50
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from marlkit.bench import alternate_calls, finish, make_parser, start
from marlkit.native.segment_tree import SumSegmentTree

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Args:
    """Command-line options."""

    capacity: int
    """Number of priorities in the tree."""
    batch: int
    """Indices per update and per sample batch."""
    repeats: int
    """Batches per timed round."""
    rounds: int
    """Timed rounds per measurement; the fastest and the median round are reported."""
    dtype: str
    """Priority dtype: float32 or float64."""
    torch_threads: list[int]
    """torch intra-op thread counts (set explicitly) the torch implementations run at."""
    threads: int | None
    """marlkit._C kernel threads (``None``: as they are, all hardware threads by default)."""
    seed: int
    """Seed of the generated priorities, indices and masses."""


class Runner(Protocol):
    """What the benchmark times: a batched update and a batched proportional sample."""

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None: ...

    def sample(self, uniform: torch.Tensor) -> torch.Tensor: ...


class TorchPeer:
    """The plain torch recipe: flat priorities, cumsum + searchsorted, no input checks."""

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.priorities = torch.zeros(capacity, dtype=dtype)

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        self.priorities[indices] = values

    def sample(self, uniform: torch.Tensor) -> torch.Tensor:
        cumulative = torch.cumsum(self.priorities, 0)
        found = torch.searchsorted(cumulative, uniform * cumulative[-1], right=True)
        return found.clamp_max_(self.priorities.numel() - 1)


class FaceRunner:
    """Adapter of :class:`SumSegmentTree` (either backend) to the benchmark's two calls."""

    def __init__(self, capacity: int, dtype: torch.dtype, backend: str) -> None:
        self.tree = SumSegmentTree(capacity, dtype=dtype, backend=backend)  # type: ignore[arg-type]

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        self.tree.update(indices, values)

    def sample(self, uniform: torch.Tensor) -> torch.Tensor:
        return self.tree.scan_lower_bound(uniform * self.tree.total())


def _default_torch_threads() -> list[int]:
    return sorted({1, os.cpu_count() or 1})


def _parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__, rounds=7)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=50, help="batches per round")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--torch-threads",
        type=int,
        nargs="+",
        default=_default_torch_threads(),
        help="torch thread counts to measure the torch implementations at (default: 1 and all "
        "cores); native is compared with the fastest",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _check(parser: argparse.ArgumentParser, args: Args) -> None:
    for name in ("capacity", "batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.torch_threads) < 1:
        parser.error(f"--torch-threads must all be >= 1, got {args.torch_threads}")


def _rates(
    fn: Callable[[int], object], repeats: int, rounds: int, items: int
) -> tuple[float, float]:
    """Items processed per second in the fastest and in the median round of ``repeats`` batches;
    ``fn(k)`` runs batch ``k``."""
    fn(0)  # warm-up (first touch, lazy allocations)
    batches = itertools.cycle(range(repeats))
    rounds_s = alternate_calls({"batch": lambda: fn(next(batches))}, rounds, 0.0, min_calls=repeats)
    rates = [items / seconds for seconds in rounds_s["batch"]]
    return max(rates), statistics.median(rates)


METRICS = ("updates_per_s", "samples_per_s", "cycles_per_s")


def _measure(runner: Runner, workload: Workload, args: Args) -> dict[str, float]:
    def update(k: int) -> None:
        runner.update(workload.indices[k], workload.values[k])

    def sample(k: int) -> None:
        runner.sample(workload.uniform[k])

    def cycle(k: int) -> None:
        runner.update(workload.indices[k], workload.values[k])
        runner.sample(workload.uniform[k])

    result: dict[str, float] = {}
    for metric, fn, items in zip(METRICS, (update, sample, cycle), (args.batch, args.batch, 1)):
        best, median = _rates(fn, args.repeats, args.rounds, items)
        result[metric] = best
        result[f"{metric}_median"] = median
    result["cycle_items_per_s"] = result["cycles_per_s"] * args.batch
    return result


@dataclass
class Workload:
    """Pre-generated inputs: the same for every implementation, generated outside the timing."""

    initial: torch.Tensor  # [C] starting priorities
    indices: list[torch.Tensor]  # repeats x int64 [B]
    values: list[torch.Tensor]  # repeats x [B] new priorities
    uniform: list[torch.Tensor]  # repeats x [B] in [0, 1), scaled by the total to sample


def _workload(args: Args, dtype: torch.dtype) -> Workload:
    generator = torch.Generator().manual_seed(args.seed)
    return Workload(
        initial=torch.rand(args.capacity, generator=generator, dtype=dtype),
        indices=[
            torch.randint(0, args.capacity, (args.batch,), generator=generator)
            for _ in range(args.repeats)
        ],
        values=[
            torch.rand(args.batch, generator=generator, dtype=dtype) for _ in range(args.repeats)
        ],
        uniform=[
            torch.rand(args.batch, generator=generator, dtype=dtype) for _ in range(args.repeats)
        ],
    )


def _filled(runner: Runner, workload: Workload) -> Runner:
    runner.update(torch.arange(workload.initial.numel()), workload.initial)
    return runner


def run(args: Args) -> dict:
    """Fill every implementation with the same priorities and time it; the JSON record."""
    dtype = DTYPES[args.dtype]
    workload = _workload(args, dtype)
    results: dict[str, dict[str, float]] = {}

    torch.set_num_threads(args.torch_threads[0])
    native = _filled(FaceRunner(args.capacity, dtype, "native"), workload)
    # Same priorities and masses: how often do native and torch pick the same index?
    peer = _filled(TorchPeer(args.capacity, dtype), workload)
    same = native.sample(workload.uniform[0]) == peer.sample(workload.uniform[0])
    agreement = float(same.double().mean())
    del peer
    results["native"] = _measure(native, workload, args)
    del native
    peers: dict[str, list[str]] = {"torch": [], "torch_twin": []}
    for threads in args.torch_threads:
        torch.set_num_threads(threads)
        for peer_name, make in (
            ("torch", lambda: TorchPeer(args.capacity, dtype)),
            ("torch_twin", lambda: FaceRunner(args.capacity, dtype, "torch")),
        ):
            runner = _filled(make(), workload)
            name = f"{peer_name}[threads={threads}]"
            results[name] = _measure(runner, workload, args)
            peers[peer_name].append(name)
            del runner

    ratios: dict[str, dict[str, float | str]] = {}
    for peer, names in peers.items():
        for metric in METRICS:
            fastest = max(names, key=lambda name, metric=metric: results[name][metric])
            ratios.setdefault(f"native_over_{peer}", {})[metric] = (
                results["native"][metric] / results[fastest][metric]
            )
            ratios.setdefault(f"fastest_{peer}", {})[metric] = fastest
    return {
        "capacity": args.capacity,
        "batch": args.batch,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "dtype": args.dtype,
        "torch_threads": args.torch_threads,
        "results": results,
        "ratios": ratios,
        "target_native_over_torch_5x": {
            metric: ratios["native_over_torch"][metric] >= 5.0 for metric in METRICS
        },
        "same_index_fraction_native_vs_torch": agreement,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one JSON object to stdout."""
    parser = _parser()
    namespace = parser.parse_args(argv)
    args = Args(**vars(namespace))
    _check(parser, args)
    report = start("segment_tree", namespace)  # sets the kernels' --threads
    return finish({**report, **run(args)})


if __name__ == "__main__":
    raise SystemExit(main())
