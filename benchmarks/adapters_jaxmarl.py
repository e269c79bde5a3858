"""JaxMARL adapter overhead: ``jaxmarl/<env>`` against JaxMARL's own jitted, vmapped step loop.

Prints one JSON object (the header of :mod:`marlkit.bench.rounds`, then a section per env with
one entry per batch size). Equal work on both sides, per step of ``num_envs`` envs:

* the same random actions: a pool of 16 batches drawn once with ``torch.randint`` (every
  action of the action space, unmasked), cycled through on both sides;
* raw: one call of ``jax.jit`` over ``jax.vmap(env.step)`` (JaxMARL's step *with* its
  autoreset: every env's next state and a fresh reset, selected by ``__all__``), the actions
  split per agent inside the jit (SMAX: ``get_avail_actions`` of the new states too, which a
  masked policy needs and the adapter returns), and ``block_until_ready`` on what it returns;
* adapter: the actions written into the TensorDict (torch), ``step_and_maybe_reset``
  (validation off): one jitted ``vmap(env.step_env)`` (no autoreset) returning observations,
  rewards, done flags (and SMAX's action masks, alive masks, world state) in the group layout,
  and, in the same call where an env is done, a reset of every env (``vmap(env.reset)``) kept
  pending with the observations shown once the done envs are reset; all handed to torch
  through DLPack, the done rule, ``step_mdp``, and the reset of the done envs (no JAX call:
  their states are swapped in at the next step's start).

The two sides alternate over ``--rounds`` rounds of ``--round-seconds`` each (the order flipping
every round), medians over rounds; ``ratio`` is raw seconds per step over the adapter's (the
share of the raw rate the adapter keeps; target >= 0.8 at 1,024 envs).
``time_in_jax_fraction`` is the share of the adapter's time inside its jitted calls (step and
reset, blocking until ready): the rest is the bridge and the env API.

    python benchmarks/adapters_jaxmarl.py                         # 1, 64, 1024 envs
    python benchmarks/adapters_jaxmarl.py --num-envs 1024 --rounds 5 --only mpe
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

from marlkit.bench import make_parser, run_sections
from marlkit.bench.overhead import add_sweep, collector_loop, measure_overhead

POOL = 16
#: Untimed steps of each side first: compilation, and past the end of MPE's first episode.
WARMUP = 30


def _raw_loop(
    env: Any, num_envs: int, pool: list[torch.Tensor], seed: int, avail: bool
) -> Callable[[], None]:
    """JaxMARL's own loop: ``jit(vmap(env.step))`` with its autoreset, blocking each step."""
    import jax

    agents = list(env.agents)

    def step(key: jax.Array, state: Any, actions: jax.Array) -> Any:
        key, sub = jax.random.split(key)
        acts = {a: actions[:, i] for i, a in enumerate(agents)}
        out = jax.vmap(env.step)(jax.random.split(sub, num_envs), state, acts)
        if avail:
            out = (*out, jax.vmap(env.get_avail_actions)(out[1]))
        return key, out

    jitted = jax.jit(step)
    key = jax.random.PRNGKey(seed)
    _, state = jax.jit(jax.vmap(env.reset))(jax.random.split(key, num_envs))
    actions = [jax.numpy.asarray(a.to(torch.int32).numpy()) for a in pool]
    box = {"key": key, "state": state, "i": 0}

    def run() -> None:
        i = box["i"]
        box["key"], out = jitted(box["key"], box["state"], actions[i % POOL])
        jax.block_until_ready(out)
        box["state"] = out[1]
        box["i"] = i + 1

    return run


def _pool_actions(env: Any, pool: list[torch.Tensor]) -> Callable[[Any], dict[str, torch.Tensor]]:
    """The pool's batches in turn, each cut into the groups' actions (agents in group order)."""
    slices, start = [], 0
    for group, agents in env.group_map.items():
        slices.append((group, start, start + len(agents)))
        start += len(agents)
    box = {"i": 0}

    def draw(td: Any) -> dict[str, torch.Tensor]:
        actions = pool[box["i"] % POOL]
        box["i"] += 1
        return {group: actions[:, lo:hi] for group, lo, hi in slices}

    return draw


def _bench(args: argparse.Namespace, scenario: str, kwargs: dict[str, Any], avail: bool) -> dict:
    import marlkit

    out: dict[str, Any] = {
        "env": scenario,
        "kwargs": {k: str(v) for k, v in kwargs.items()},
        "work": {
            "raw": "jax.jit(vmap(env.step)) with JaxMARL's autoreset (a reset of every env "
            "computed and selected by __all__ each step), actions split per agent in the jit"
            + (", get_avail_actions of the new states" if avail else "")
            + ", block_until_ready; actions from a pool of 16 torch.randint batches",
            "adapter": "the same actions into the TensorDict, step_and_maybe_reset (validation "
            "off): jit(vmap(env.step_env)) outputs in the group layout"
            + (" (action masks, alive masks, world state)" if avail else "")
            + " and, in the same call when an env is done, vmap(env.reset) of every env kept "
            "pending; to torch through DLPack, the done rule, step_mdp, the done envs reset from "
            "the pending states (no JAX call; states swapped in at the next step)",
        },
    }
    for num_envs in args.num_envs:
        env = marlkit.make(
            f"jaxmarl/{scenario}", num_envs=num_envs, seed=0, validate_actions=False, **kwargs
        )
        n_actions = [int(env.action_spec[g, "action"].n) for g in env.group_map]
        sizes = [len(a) for a in env.group_map.values()]
        if len(set(n_actions)) != 1:
            raise ValueError(f"{scenario}: agents with different action counts {n_actions}")
        gen = torch.Generator().manual_seed(0)
        shape = (num_envs, sum(sizes))
        pool = [torch.randint(0, n_actions[0], shape, generator=gen) for _ in range(POOL)]
        raw = _raw_loop(env.jaxmarl_env, num_envs, pool, 0, avail)
        adapter = collector_loop(env, _pool_actions(env, pool))
        for _ in range(WARMUP):  # compiles, and runs past the end of a first episode
            raw()
            adapter()
        result = measure_overhead(
            raw,
            adapter,
            rounds=args.rounds,
            seconds=args.round_seconds,
            min_calls=args.min_steps,
            inside=[(env._batch, "step"), (env._batch, "reset")],
        )
        n_agents = sum(sizes)
        raw_rate, rate = result.rates(num_envs)
        out[f"num_envs={num_envs}"] = {
            "agents": n_agents,
            "raw_env_steps_per_s": raw_rate,
            "adapter_env_steps_per_s": rate,
            "adapter_agent_steps_per_s": n_agents * rate,
            "ratio": result.ratio,
            "ratio_rounds": result.ratio_rounds,
            "time_in_jax_fraction": result.inside_fraction,
        }
        env.close()
    return out


def bench_mpe(args: argparse.Namespace) -> dict:
    """``jaxmarl/MPE_simple_spread_v3`` (3 agents, episodes of 25 steps)."""
    return _bench(args, "MPE_simple_spread_v3", {}, avail=False)


def bench_smax(args: argparse.Namespace) -> dict:
    """``jaxmarl/SMAX`` on map ``3m`` (3 allies against 3 enemies, both controlled)."""
    return _bench(args, "SMAX", {"map_name": "3m"}, avail=True)


SECTIONS = {"mpe": bench_mpe, "smax": bench_smax}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=7, round_seconds=0.5)
    add_sweep(parser, "--num-envs", (1, 64, 1024), "batch sizes")
    return run_sections("adapters_jaxmarl", SECTIONS, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
