"""Collector and batched-env throughput, side by side in one run; prints one JSON object.

Sections (``--only`` picks some):

* ``single``: ``Collector`` over native ``navigation`` (1024 envs x 4 agents, random actions)
  against a bare loop doing the same work (``rand_action``, ``step_and_maybe_reset``, the
  transitions stacked into one batch ``[*B, T]``), on twin envs, validation off on both, timed
  batch against batch in alternating pairs (the median of the per-pair overheads); then the
  collector with a 2 x 256 Tanh MLP policy, with the time split between policy and env.
  Target: the collector's overhead over the bare loop <= 10 %.
* ``parallel_env``: ``ParallelEnv(2)`` against ``SerialEnv(2)`` on ``mpe2.simple_spread_v3``
  (a CPU-bound Python env), the same batch ``[2, num_envs]`` stepped with random actions.
  Target: >= 1.6x on 2 cores. Timed twice: workers placed by the OS (the default), and pinned
  one per CPU (``worker_cpus="auto"``). Beside them, in the same rounds, two ceilings measured with
  PettingZoo's own loop in two plain processes (no marlkit, no torch): unsynchronised
  (``machine_ceiling``, what this machine gives two processes at that moment) and in lock-step
  (``lockstep_ceiling``, one command and answer per step, as any ``ParallelEnv`` must), each
  with the share of it that the ratio reached.
* ``multisync``: ``MultiSyncCollector`` with 2 workers (``num_envs`` MPE envs each) against a
  ``Collector`` over one env of ``2 * num_envs`` MPE envs, the same frames per batch, random
  actions on both. Target: >= 1.6x on 2 cores. Beside it the unsynchronised ceiling, as above.
* ``buffer``: what writing into a replay buffer costs a ``MultiSyncCollector`` (2 workers of
  native ``navigation``, 256 envs x 4 agents each, random actions): the collector with
  ``replay_buffer=`` (the parent writes each stacked batch into a ``TensorStorage``) against
  the same collector without one, and the buffer's ``extend`` timed alone. It measures whether
  workers writing straight into a shared storage could save anything worth its protocol.

Every section alternates its sides round by round (the order flips each round) so that load from
other processes hits them alike, and reports the median of the per-round ratios. Each side's
``"work"`` says what it computes.

    python benchmarks/collectors.py
    python benchmarks/collectors.py --only single --rounds 9
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import statistics
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict.nn import TensorDictModule
from torch import nn

import marlkit
from marlkit.bench import (
    Stopwatch,
    alternate_calls,
    make_parser,
    paired,
    ratio,
    run_sections,
    seconds_per_call,
)
from marlkit.collectors import Collector, MultiSyncCollector
from marlkit.data._fast import stack_tensordicts
from marlkit.envs import EnvBase, ParallelEnv, SerialEnv
from marlkit.replay import ReplayBuffer, TensorStorage


def _warm_and_alternate(
    sides: Mapping[str, Callable[[], object]],
    args: argparse.Namespace,
    close: list[Callable[[], None]],
) -> dict[str, list[float]]:
    """One warm-up call of each side, then each side's calls per second in ``--rounds``
    alternating rounds of ``--round-seconds`` (one call per round at least); ``close`` runs
    whatever happens."""
    try:
        for side in sides.values():
            side()
        times = alternate_calls(sides, args.rounds, args.round_seconds)
        return {name: [1.0 / t for t in ts] for name, ts in times.items()}
    finally:
        for fn in close:
            fn()


# --- section: single --------------------------------------------------------------------------
def _navigation(envs: int, agents: int) -> EnvBase:
    env = marlkit.make("navigation", num_envs=envs, n_agents=agents, seed=0)
    env.validate_actions = False  # the same on both sides: the bare loop does not validate
    return env


def _bare_loop(env: EnvBase, steps: int) -> Callable[[], None]:
    """What a user writes without a collector: random actions, step_and_maybe_reset, stack."""
    state = {"td": env.reset()}

    def batch() -> None:
        td, transitions = state["td"], []
        for _ in range(steps):
            transition, td = env.step_and_maybe_reset(env.rand_action(td))
            transitions.append(transition)
        stack_tensordicts(transitions, len(env.batch_size))
        state["td"] = td

    return batch


def _mlp_policy(obs_dim: int, hidden: int = 256) -> TensorDictModule:
    net = nn.Sequential(
        nn.Linear(obs_dim, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 2),
        nn.Tanh(),
    )
    return TensorDictModule(
        net, in_keys=[("agents", "observation")], out_keys=[("agents", "action")]
    )


def bench_single(args: argparse.Namespace) -> dict[str, Any]:
    envs, agents, steps = 1024, 4, args.steps
    frames = envs * steps
    bare_env, collector_env = _navigation(envs, agents), _navigation(envs, agents)
    collector = Collector(collector_env, None, frames_per_batch=frames)
    bare = _bare_loop(bare_env, steps)
    bare(), collector.next()  # warm-up batches
    pairs = paired(bare, collector.next, min_pairs=args.pairs)
    overhead = sorted(c / b - 1.0 for b, c in pairs)
    out: dict[str, Any] = {
        "env": "navigation",
        "num_envs": envs,
        "n_agents": agents,
        "frames_per_batch": frames,
        "work": {
            "bare_loop": "rand_action, step_and_maybe_reset (validation off), transitions "
            "stacked into [*B, T]",
            "collector": "the same, plus trajectory ids, a check of the first step's actions, "
            "the exploration block and frame accounting",
        },
        "pairs": len(pairs),
        "bare_loop_frames_per_s": frames / statistics.median(b for b, _ in pairs),
        "collector_frames_per_s": frames / statistics.median(c for _, c in pairs),
        "collector_overhead": statistics.median(overhead),
        "collector_overhead_quartiles": [
            overhead[len(overhead) // 4],
            overhead[3 * len(overhead) // 4],
        ],
        "target_overhead": 0.10,
    }
    collector.shutdown()
    out["mlp_policy"] = _mlp_split(collector_env, args)
    bare_env.close()
    collector_env.close()
    return out


def _mlp_split(env: EnvBase, args: argparse.Namespace) -> dict[str, Any]:
    """The collector with a 2 x 256 MLP: where its time goes, policy against the rest."""
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    module = _mlp_policy(obs_dim)
    in_policy = Stopwatch()

    @in_policy.wrap
    def policy(td: Any) -> Any:
        with torch.no_grad():
            return module(td)

    frames = env.batch_size.numel() * args.steps
    collector = Collector(env, policy, frames_per_batch=frames)
    collector.next()
    in_policy.seconds = 0.0
    per_batch = seconds_per_call(collector.next, 0.0, min_calls=args.rounds)
    total = per_batch * args.rounds
    collector.shutdown()
    return {
        "policy": "2 x 256 Tanh MLP per agent, shared parameters, torch.no_grad",
        "frames_per_s": frames / per_batch,
        "policy_share": in_policy.seconds / total,
        "env_and_collector_share": 1.0 - in_policy.seconds / total,
    }


# --- the machine's own ceiling for two processes -----------------------------------------------
def _raw_mpe_worker(conn: multiprocessing.connection.Connection, num_envs: int, seed: int) -> None:
    """PettingZoo's own ``simple_spread_v3`` (no marlkit, no torch), ``num_envs`` of them, stepped
    with random actions on command: ``conn.recv()`` gives a step count, ``conn.send`` answers."""
    import numpy as np
    from mpe2 import simple_spread_v3

    rng = np.random.default_rng(seed)
    envs = [simple_spread_v3.parallel_env(N=3) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=seed * 1000 + i)
    conn.send("ready")
    while (steps := conn.recv()) is not None:
        for _ in range(steps):
            for env in envs:
                env.step({agent: int(rng.integers(5)) for agent in env.agents})
                if not env.agents:
                    env.reset()
        conn.send_bytes(b"done")


class _RawCeiling:
    """Two processes stepping raw MPE loops, exchanging no data: one alone (``one``), both at
    once without synchronising (``both``: each runs all its steps on one command), and both in
    lock-step (``lockstep``: one command and one answer per step, as a ``ParallelEnv`` steps).
    ``2 * rate(both) / rate(one)`` is what this machine gives two processes of this work at that
    moment; ``2 * rate(lockstep) / rate(one)`` what it gives any design that waits for both
    workers at every step, before any data moves."""

    def __init__(self, num_envs: int, steps: int, start_method: str = "spawn"):
        ctx = multiprocessing.get_context(start_method)
        self.steps = steps
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs = []
        for seed in range(2):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_raw_mpe_worker, args=(child, num_envs, seed), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            if not conn.poll(120) or conn.recv() != "ready":
                self.close()
                raise RuntimeError("a raw MPE worker did not start")

    def _run(self, workers: list[int], steps: int) -> None:
        for i in workers:
            self.conns[i].send(steps)
        for i in workers:
            if not self.conns[i].poll(120):
                raise RuntimeError(f"raw MPE worker {i} did not answer")
            self.conns[i].recv_bytes()

    def one(self) -> None:
        self._run([0], self.steps)

    def both(self) -> None:
        self._run([0, 1], self.steps)

    def lockstep(self) -> None:
        for _ in range(self.steps):
            self._run([0, 1], 1)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def _ceiling_sides(raw: _RawCeiling, lockstep: bool) -> dict[str, Callable[[], None]]:
    sides = {"raw_one": raw.one, "raw_both": raw.both}
    if lockstep:
        sides["raw_lockstep"] = raw.lockstep
    return sides


def _ceiling_report(rates: dict[str, list[float]], ratio_rounds: list[float]) -> dict[str, Any]:
    """The ceilings of :class:`_RawCeiling`, per round and as medians, and the share of each
    that the measured ratio reached (the median of the per-round shares)."""
    out: dict[str, Any] = {
        "ceiling_work": "PettingZoo's own simple_spread_v3 loop (random actions, no marlkit, "
        "no torch) in two processes, in the same alternating rounds: one alone; both at once "
        "unsynchronised (machine_ceiling = 2 x rate(both) / rate(one)); both in lock-step, "
        "one command and answer per step (lockstep_ceiling = 2 x rate(lockstep) / rate(one))",
    }
    for name, side in (("machine_ceiling", "raw_both"), ("lockstep_ceiling", "raw_lockstep")):
        if side not in rates:
            continue
        ceiling = [2 * b / a for a, b in zip(rates["raw_one"], rates[side])]
        out[name] = statistics.median(ceiling)
        out[f"{name}_rounds"] = ceiling
        out[f"share_of_{name}"] = statistics.median(r / c for r, c in zip(ratio_rounds, ceiling))
    return out


# --- section: parallel_env --------------------------------------------------------------------
def bench_parallel_env(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {"name": "pettingzoo/mpe2.simple_spread_v3", "N": 3, "num_envs": args.mpe_envs}
    serial = SerialEnv(2, marlkit.make, kwargs)
    parallel = ParallelEnv(2, marlkit.make, kwargs, start_method=args.start_method)
    pinned = ParallelEnv(
        2, marlkit.make, kwargs, start_method=args.start_method, worker_cpus="auto"
    )
    raw = _RawCeiling(args.mpe_envs, args.mpe_steps, args.start_method)
    for env in (serial, parallel, pinned):
        env.set_seed(0)
        env.validate_actions = False
    steps = args.mpe_steps

    def loop(env: EnvBase) -> Callable[[], None]:
        state = {"td": env.reset()}

        def run() -> None:
            td = state["td"]
            for _ in range(steps):
                _, td = env.step_and_maybe_reset(env.rand_action(td))
            state["td"] = td

        return run

    sides = {
        "serial": loop(serial),
        "parallel": loop(parallel),
        "parallel_pinned": loop(pinned),
        **_ceiling_sides(raw, lockstep=True),
    }
    closes = [serial.close, parallel.close, pinned.close, raw.close]
    rates = _warm_and_alternate(sides, args, closes)
    frames = 2 * args.mpe_envs * steps
    over_serial = ratio(rates, "parallel", "serial")
    pinned_over_serial = ratio(rates, "parallel_pinned", "serial")
    return {
        "env": "pettingzoo/mpe2.simple_spread_v3",
        "N": 3,
        "batch": [2, args.mpe_envs],
        "work": "all three: rand_action and step_and_maybe_reset over the same [2, num_envs] "
        "batch; serial steps the two workers' envs in this process, parallel and "
        "parallel_pinned in two worker processes (1 torch thread each) through shared memory; "
        "parallel_pinned pins worker i to CPU i (worker_cpus='auto'), parallel leaves them to "
        "the OS (the default)",
        "serial_frames_per_s": statistics.median(rates["serial"]) * frames,
        "parallel_frames_per_s": statistics.median(rates["parallel"]) * frames,
        "parallel_pinned_frames_per_s": statistics.median(rates["parallel_pinned"]) * frames,
        "parallel_over_serial": over_serial["median"],
        "rounds": over_serial["rounds"],
        "pinned_over_serial": pinned_over_serial["median"],
        "pinned_rounds": pinned_over_serial["rounds"],
        "target": 1.6,
        "start_method": args.start_method,
        **_ceiling_report(rates, over_serial["rounds"]),
    }


# --- section: multisync -----------------------------------------------------------------------
def _mpe(num_envs: int) -> Callable[[], EnvBase]:
    def make() -> EnvBase:
        env = marlkit.make("pettingzoo/mpe2.simple_spread_v3", N=3, num_envs=num_envs, seed=0)
        env.validate_actions = False  # the same on both sides (each checks its first actions)
        return env

    return make


def bench_multisync(args: argparse.Namespace) -> dict[str, Any]:
    per_worker, steps = args.mpe_envs, args.mpe_steps
    frames = 2 * per_worker * steps
    single = Collector(_mpe(2 * per_worker), None, frames_per_batch=frames)
    multi = MultiSyncCollector(
        [_mpe(per_worker), _mpe(per_worker)],
        None,
        frames_per_batch=frames,
        torch_threads=1,
        start_method=args.start_method,
    )
    raw = _RawCeiling(per_worker, steps, args.start_method)
    sides = {
        "collector": single.next,
        "multisync": multi.next,
        **_ceiling_sides(raw, lockstep=False),
    }
    rates = _warm_and_alternate(sides, args, [single.shutdown, multi.shutdown, raw.close])
    over_single = ratio(rates, "multisync", "collector")
    return {
        "env": "pettingzoo/mpe2.simple_spread_v3",
        "N": 3,
        "frames_per_batch": frames,
        "work": {
            "collector": f"one env of {2 * per_worker} MPE envs in this process: random "
            "actions, step_and_maybe_reset, trajectory ids, the batch stacked",
            "multisync": f"the same in 2 worker processes of {per_worker} MPE envs each (1 "
            "torch thread), each batch written to shared memory and stacked by the parent "
            "into [2, num_envs, T]",
        },
        "collector_frames_per_s": statistics.median(rates["collector"]) * frames,
        "multisync_frames_per_s": statistics.median(rates["multisync"]) * frames,
        "multisync_over_collector": over_single["median"],
        "rounds": over_single["rounds"],
        "target": 1.6,
        "start_method": args.start_method,
        **_ceiling_report(rates, over_single["rounds"]),
    }


def _navigation_factory(envs: int, agents: int) -> Callable[[], EnvBase]:
    return functools.partial(marlkit.make, "navigation", num_envs=envs, n_agents=agents)


def bench_buffer(args: argparse.Namespace) -> dict[str, Any]:
    envs, agents, steps = 256, 4, 50
    frames = 2 * envs * steps
    make = _navigation_factory(envs, agents)
    rb = ReplayBuffer(TensorStorage(20 * frames))
    common = {"frames_per_batch": frames, "torch_threads": 1, "start_method": args.start_method}
    plain = MultiSyncCollector([make, make], None, **common)
    storing = MultiSyncCollector([make, make], None, replay_buffer=rb, **common)
    try:
        batch = plain.next().clone()  # a batch as the collector yields it, for extend alone
    except BaseException:
        plain.shutdown()
        storing.shutdown()
        raise
    sides = {"without_buffer": plain.next, "with_buffer": storing.next}
    rates = _warm_and_alternate(sides, args, [plain.shutdown, storing.shutdown])
    with_over_without = ratio(rates, "with_buffer", "without_buffer")
    extend_s = seconds_per_call(
        lambda: rb.extend(batch.reshape(-1)), args.round_seconds, min_calls=3
    )
    per_batch_s = 1.0 / statistics.median(rates["without_buffer"])
    return {
        "env": "navigation",
        "workers": 2,
        "envs_x_agents_per_worker": f"{envs} x {agents}",
        "start_method": args.start_method,
        "frames_per_batch": frames,
        "batch_bytes": int(sum(v.numel() * v.element_size() for v in batch.values(True, True))),
        "work": {
            "without_buffer": "MultiSyncCollector.next(): both workers collect 50 steps into "
            "shared memory, the parent stacks them",
            "with_buffer": "the same, then the parent writes the stacked batch into a "
            "ReplayBuffer(TensorStorage) as transitions (checks, round-robin slots, copy)",
        },
        "with_over_without_batches_per_s": with_over_without["median"],
        "rounds": with_over_without["rounds"],
        "batch_s": per_batch_s,
        "extend_s": extend_s,
        "extend_share_of_batch": extend_s / per_batch_s,
    }


SECTIONS = {
    "single": bench_single,
    "parallel_env": bench_parallel_env,
    "multisync": bench_multisync,
    "buffer": bench_buffer,
}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=7, round_seconds=1.0, threads=1)
    parser.add_argument("--steps", type=int, default=32, help="steps per batch (single)")
    parser.add_argument("--pairs", type=int, default=60, help="batch pairs timed (single)")
    parser.add_argument("--mpe-envs", type=int, default=4, help="envs per worker (parallel_env)")
    parser.add_argument("--mpe-steps", type=int, default=50, help="steps per round unit")
    parser.add_argument(
        "--start-method",
        choices=["spawn", "forkserver", "fork"],
        default="spawn",
        help="how the worker processes start (spawn: the library's default); the rates are "
        "timed after the start",
    )
    return run_sections("collectors", SECTIONS, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
