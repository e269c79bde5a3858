"""MAgent2 adapter overhead: ``magent2/battle_v4`` against a raw MAgent2 parallel loop.

Prints one JSON object (the header of :mod:`marlkit.bench.rounds`, then a section per task with
one entry per map size). Equal work on both sides: one env (``num_envs=1``), the same torch call
drawing one random action per agent (``torch.randint`` over the 21 actions, a generator each),
one MAgent2 ``step`` of the agents in the game, a reset when the episode ends (``max_cycles``).
The raw loop hands MAgent2 a dict of the live agents' actions and keeps what ``step`` returns
(dicts of NumPy arrays); the adapter's loop is a collector's: write the actions into the
TensorDict, ``step_and_maybe_reset`` (validation off), which returns every agent's observation,
reward and done flags as tensors ``[1, n, ...]``. ``adapter`` leaves the global state out
(``state=False``) against the raw loop as is; ``adapter_with_state`` returns it (the default,
for centralised critics) against a raw loop that also calls ``state()``.

The two sides of a pair alternate over ``--rounds`` rounds of ``--round-seconds`` each (the
order flipping every round), medians over rounds; ``ratio`` is raw seconds per step over the
adapter's (the share of the raw loop's rate the adapter keeps; target >= 0.85).
``time_in_simulator_fraction`` is the share of the adapter's time inside MAgent2's ``step``
(the ratio against a loop that costs nothing beyond it).

    python benchmarks/adapters_magent2.py                       # map sizes 16, 32, 64
    python benchmarks/adapters_magent2.py --map-size 16 --map-size 128 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

from marlkit.bench import make_parser, run_sections
from marlkit.bench.overhead import add_sweep, collector_loop, measure_overhead, random_actions

MAX_CYCLES = 100


def _raw_loop(raw: Any, gen: torch.Generator, with_state: bool) -> Callable[[], None]:
    """MAgent2's own loop: random actions of the live agents, ``step``, reset at the end."""

    def step() -> None:
        agents = raw.agents
        actions = torch.randint(0, 21, (len(agents),), generator=gen).tolist()
        raw.step(dict(zip(agents, actions)))
        if with_state:
            raw.state()
        if not raw.agents:
            raw.reset()
            if with_state:
                raw.state()

    return step


def bench_battle(args: argparse.Namespace) -> dict:
    """``magent2/battle_v4`` (validation off) against ``battle_v4.parallel_env``."""
    from magent2.environments import battle_v4

    import marlkit

    out: dict[str, Any] = {
        "task": "battle_v4",
        "max_cycles": MAX_CYCLES,
        "work": {
            "raw": "one random action per live agent (torch.randint), battle_v4.parallel_env"
            ".step on a dict of them, its dicts of NumPy arrays kept; reset at max_cycles; "
            "with_state: state() too",
            "adapter": "the same actions written into the TensorDict, step_and_maybe_reset "
            "(validation off): every agent's observation, reward, done flags and mask as "
            "tensors [1, n, ...]; with_state: the global state as well",
        },
    }
    for map_size in args.map_size:
        entry: dict[str, Any] = {}
        for name, with_state in (("adapter", False), ("adapter_with_state", True)):
            raw = battle_v4.parallel_env(map_size=map_size, max_cycles=MAX_CYCLES)
            raw.reset(seed=1)
            env = marlkit.make(
                "magent2/battle_v4",
                map_size=map_size,
                max_cycles=MAX_CYCLES,
                seed=0,  # MAgent2 seed 1, as the raw env's
                state=with_state,
                validate_actions=False,
            )
            entry["agents"] = sum(len(agents) for agents in env.group_map.values())
            gen = torch.Generator().manual_seed(0)
            result = measure_overhead(
                _raw_loop(raw, torch.Generator().manual_seed(0), with_state),
                collector_loop(env, random_actions(env, gen)),
                rounds=args.rounds,
                seconds=args.round_seconds,
                min_calls=args.min_steps,
                warmup=5,
                inside=[(env.simulators[0], "step")],
            )
            raw_rate, rate = result.rates()
            entry[f"{name}_raw_steps_per_s"] = raw_rate
            entry[f"{name}_steps_per_s"] = rate
            entry[f"{name}_agent_steps_per_s"] = entry["agents"] * rate
            entry[f"{name}_ratio"] = result.ratio
            entry[f"{name}_ratio_rounds"] = result.ratio_rounds
            entry[f"{name}_time_in_simulator_fraction"] = result.inside_fraction
            env.close()
            raw.close()
        out[f"map_size={map_size}"] = entry
    return out


SECTIONS = {"battle": bench_battle}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=9, round_seconds=0.5)
    add_sweep(parser, "--map-size", (16, 32, 64), "map sizes")
    return run_sections("adapters_magent2", SECTIONS, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
