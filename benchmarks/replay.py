"""Replay buffer throughput and memory, side by side in one run; prints one JSON object.

Workload (the replay issue's): capacity 10^6 items, each a 32-float observation, a 4-float
action and a 1-float reward; batches of 4096; alpha 0.6, beta 0.4.

* ``prioritized``: a :class:`ReplayBuffer` with ``PrioritizedSampler`` on the native segment
  trees against the same buffer with the trees' torch backend (a flat priority tensor,
  ``cumsum`` + ``searchsorted`` per sample: the pure-torch prioritized sampler). Both do the
  same work per iteration: ``sample(4096)`` (indices, importance weights, the items gathered
  from the same kind of storage) then ``update_priority`` of those 4096 items. Also ``extend``
  throughput in chunks of 10^4 items, on the first fill and on a refill (overwriting).
  Targets: >= 5x the pure-torch sampler, >= 800 iterations/s, >= 10 M items/s refill.
* ``uniform``: ``sample(4096)`` from 10^6 items with the ``RandomSampler``. Target >= 2,000/s.
* ``gather``: the rows of 4096 fresh random indices out of the 10^6 stored items (all three
  keys): :func:`marlkit.native.gather.gather_rows`'s kernel against its torch twin
  (``index_select`` per key), the copy every ``sample`` above makes.
* ``memory``: the resident memory a ``TensorStorage`` of 10^6 such items adds, against the raw
  bytes of its tensors. Target <= 1.1x.
* ``checksum``: what checksums cost a checkpoint of the 10^6 items (prioritized: the sum and
  min trees go into ``state.pt``): ``dumps`` against the same ``dumps`` with the hash calls
  made no-ops, both into folders on the temporary folder's disk; and the verification of
  every file against the manifest, against a whole ``loads``. Target: checksums <= 10 % of a
  ``dumps``.

Sides alternate round by round; rates are medians over rounds.

    python benchmarks/replay.py
    python benchmarks/replay.py --only prioritized --rounds 7
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

import marlkit._files as marlkit_files
from marlkit._files import verify_manifest
from marlkit.bench import alternate, make_parser, run_sections, seconds_per_call, timed
from marlkit.native.gather import gather_rows, gather_rows_torch
from marlkit.replay import PrioritizedSampler, RandomSampler, ReplayBuffer, TensorStorage

CAPACITY = 1_000_000
BATCH = 4096
CHUNK = 10_000


def _items(n: int, start: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(start)
    return TensorDict(
        {
            "observation": torch.randn(n, 32, generator=generator),
            "action": torch.randn(n, 4, generator=generator),
            "reward": torch.randn(n, 1, generator=generator),
        },
        [n],
    )


def _filled(sampler: Any, capacity: int) -> tuple[ReplayBuffer, dict[str, float]]:
    """A buffer of ``capacity`` items, with the extend rates of its first fill and a refill."""
    rb = ReplayBuffer(TensorStorage(capacity), sampler)
    chunks = [_items(CHUNK, i) for i in range(capacity // CHUNK)]

    def fill() -> None:
        for chunk in chunks:
            rb.extend(chunk)

    rates = {}
    for phase in ("first_fill", "refill"):
        _, seconds = timed(fill)
        rates[f"extend_{phase}_items_per_s"] = capacity / seconds
    return rb, rates


def _iterations_per_s(step: Callable[[], object], seconds: float) -> float:
    """Calls of ``step`` per second over ``seconds``, after one untimed call."""
    return 1.0 / seconds_per_call(step, seconds, warmup=1)


def _prioritized_step(rb: ReplayBuffer) -> Callable[[], None]:
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        sample = rb.sample(BATCH)
        rb.update_priority(sample["index"], torch.rand(BATCH, generator=generator) + 0.01)

    return step


def bench_prioritized(args: argparse.Namespace) -> dict[str, Any]:
    sides = {}
    extend: dict[str, dict[str, float]] = {}
    for name, backend in (("native", "native"), ("torch", "torch")):
        sampler = PrioritizedSampler(args.capacity, 0.6, 0.4, backend=backend, seed=0)
        rb, rates = _filled(sampler, args.capacity)
        sides[name] = _prioritized_step(rb)
        extend[name] = rates
    rounds = alternate(
        {
            name: functools.partial(_iterations_per_s, step, args.round_seconds)
            for name, step in sides.items()
        },
        args.rounds,
    )
    ratios = [a / b for a, b in zip(rounds["native"], rounds["torch"])]
    return {
        "capacity": args.capacity,
        "batch": BATCH,
        "item": "observation [32] float32, action [4] float32, reward [1] float32",
        "work": "both: ReplayBuffer.sample(4096) (indices, importance weights, items gathered "
        "from a TensorStorage, its slots on transparent huge pages where Linux offers them, "
        "alike on both sides) then update_priority(index, 4096 priorities), with the same "
        "checks (index range, finite priorities >= 0) and the same (p + eps) ** alpha into a "
        "sum and a min tree; native: the trees of marlkit._C, each step one kernel call "
        "(prioritized_sample, prioritized_update); torch: the same sampler on the trees' torch "
        "backend, the same steps as torch ops (flat tensors, cumsum + searchsorted per sample)",
        "native_iterations_per_s": statistics.median(rounds["native"]),
        "torch_iterations_per_s": statistics.median(rounds["torch"]),
        "native_over_torch": statistics.median(ratios),
        "rounds": ratios,
        "extend_chunk": CHUNK,
        "native_extend": extend["native"],
        "torch_extend": extend["torch"],
        "targets": {
            "native_over_torch": 5.0,
            "native_iterations_per_s": 800,
            "extend_refill_items_per_s": 10e6,
        },
    }


def _filled_storage(capacity: int, sampler: Any = None) -> ReplayBuffer:
    rb = ReplayBuffer(TensorStorage(capacity), sampler or RandomSampler(seed=0))
    for i in range(capacity // CHUNK):
        rb.extend(_items(CHUNK, i))
    return rb


def bench_uniform(args: argparse.Namespace) -> dict[str, Any]:
    rb = _filled_storage(args.capacity)
    rates = [
        _iterations_per_s(lambda: rb.sample(BATCH), args.round_seconds) for _ in range(args.rounds)
    ]
    return {
        "capacity": args.capacity,
        "batch": BATCH,
        "work": "ReplayBuffer.sample(4096): uniform indices, the items gathered",
        "samples_per_s": statistics.median(rates),
        "rounds": rates,
        "target": 2000,
    }


def bench_gather(args: argparse.Namespace) -> dict[str, Any]:
    rb = _filled_storage(args.capacity)
    data = rb.storage.data
    assert data is not None
    leaves = [data.get(key) for key in data.keys(True, True)]
    generator = torch.Generator().manual_seed(0)
    # Fresh indices per call (1,024 sets of 4096 cover most of the buffer): rows are not cached.
    indices = [torch.randint(0, args.capacity, (BATCH,), generator=generator) for _ in range(1024)]

    def side(gather: Callable[..., Any]) -> Callable[[], float]:
        position = iter(range(10**12))
        return functools.partial(
            _iterations_per_s,
            lambda: gather(leaves, indices[next(position) % len(indices)]),
            args.round_seconds,
        )

    rounds = alternate(
        {"native": side(functools.partial(gather_rows, backend="native")),
         "torch": side(gather_rows_torch)},
        args.rounds,
    )  # fmt: skip
    ratios = [a / b for a, b in zip(rounds["native"], rounds["torch"])]
    return {
        "rows": args.capacity,
        "batch": BATCH,
        "work": "both: the rows at 4096 fresh random indices of observation [32], action [4] "
        "and reward [1] float32 into new tensors; native: one gather_rows kernel call "
        "(prefetching); torch: index_select per key; both read the same TensorStorage tensors "
        "(on transparent huge pages where Linux offers them)",
        "native_calls_per_s": statistics.median(rounds["native"]),
        "torch_calls_per_s": statistics.median(rounds["torch"]),
        "native_over_torch": statistics.median(ratios),
        "rounds": ratios,
    }


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def bench_memory(args: argparse.Namespace) -> dict[str, Any]:
    gc.collect()
    chunk = _items(CHUNK)
    before = _rss()
    storage = TensorStorage(args.capacity)
    rb = ReplayBuffer(storage)
    for _ in range(args.capacity // CHUNK):
        rb.extend(chunk)
    gc.collect()
    added = _rss() - before
    data = storage.data
    raw = 0 if data is None else sum(v.numel() * v.element_size() for v in data.values(True, True))
    return {
        "items": args.capacity,
        "raw_bytes": raw,
        "rss_added_bytes": added,
        "rss_over_raw": added / raw,
        "target": 1.1,
    }


def _timed(call: Callable[[], Any]) -> Callable[[], float]:
    """A measurement of one call of ``call``: its seconds."""
    return functools.partial(seconds_per_call, call, 0.0)


class _NoHash:
    """Stands in for ``xxhash`` in :mod:`marlkit._files`: the same calls, no hashing."""

    class xxh3_128:
        def __init__(self, data: Any = b"") -> None:
            pass

        def update(self, data: Any) -> None:
            pass

        def hexdigest(self) -> str:
            return "0"


@contextlib.contextmanager
def _without_checksums() -> Iterator[None]:
    real = marlkit_files.xxhash
    marlkit_files.xxhash = _NoHash  # type: ignore[assignment]
    try:
        yield
    finally:
        marlkit_files.xxhash = real


def bench_checksum(args: argparse.Namespace) -> dict[str, Any]:
    capacity = args.capacity
    rb = _filled_storage(capacity, PrioritizedSampler(capacity, seed=0))
    hashed, plain = (Path(tempfile.mkdtemp(prefix=f"marlkit-bench-{s}-")) for s in "hp")

    def dumps_plain() -> None:
        with _without_checksums():
            rb.dumps(plain)

    def verify() -> None:
        verify_manifest(hashed / (hashed / "latest").read_text(), "benchmark checkpoint")

    def loads() -> None:
        ReplayBuffer(TensorStorage(capacity), PrioritizedSampler(capacity)).loads(hashed)

    try:
        rb.dumps(hashed)
        dumps_plain()
        rounds = alternate(
            {
                "dumps": _timed(lambda: rb.dumps(hashed)),
                "dumps_without_checksums": _timed(dumps_plain),
                "loads": _timed(loads),
                "verify": _timed(verify),
            },
            args.rounds,
        )
        size = sum(p.stat().st_size for p in hashed.rglob("*") if p.is_file())
    finally:
        for folder in (hashed, plain):
            shutil.rmtree(folder, ignore_errors=True)
    write = [h / p - 1 for h, p in zip(rounds["dumps"], rounds["dumps_without_checksums"])]
    read = [v / t for v, t in zip(rounds["verify"], rounds["loads"])]
    return {
        "items": capacity,
        "checkpoint_bytes": size,
        "work": "dumps: the whole buffer (items, sampler trees, RNG state) written into a new "
        "checkpoint folder on the temporary folder's disk, each file hashed (XXH3-128) as it is "
        "written, fsync-ed, renamed, the old one removed; dumps_without_checksums: the same "
        "code with the hash calls made no-ops (the manifest then lists no real digests); "
        "loads: a new buffer restored from the checkpoint; verify: every file read back and "
        "checked against the manifest, the part of loads the checksums add",
        "dumps_s": statistics.median(rounds["dumps"]),
        "dumps_without_checksums_s": statistics.median(rounds["dumps_without_checksums"]),
        "loads_s": statistics.median(rounds["loads"]),
        "verify_s": statistics.median(rounds["verify"]),
        "checksum_share_of_dumps": statistics.median(write),
        "verify_share_of_loads": statistics.median(read),
        "rounds": {"checksum_share_of_dumps": write, "verify_share_of_loads": read},
        "target": 0.10,
    }


SECTIONS = {
    "checksum": bench_checksum,
    "prioritized": bench_prioritized,
    "uniform": bench_uniform,
    "gather": bench_gather,
    "memory": bench_memory,
}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=5, round_seconds=1.0, threads=1)
    parser.add_argument(
        "--capacity", type=int, default=CAPACITY, help=f"items stored (a multiple of {CHUNK})"
    )
    args = parser.parse_args(argv)
    if args.capacity < CHUNK or args.capacity % CHUNK:
        parser.error(f"--capacity must be a positive multiple of {CHUNK}, got {args.capacity}")
    # memory first: a clean RSS
    return run_sections("replay", SECTIONS, args, ["memory", "prioritized", "uniform", "gather"])


if __name__ == "__main__":
    sys.exit(main())
