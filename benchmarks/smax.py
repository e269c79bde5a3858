"""SMAX env steps per second: ``smax/<scenario>`` (native C++) against JaxMARL's SMAX, jitted.

Prints one JSON object (the header of :mod:`marlkit.bench.rounds`, then a section per
scenario). Equal work on both sides, per step of ``num_envs`` battles, allies against SMAX's
heuristic enemy, on the CPU with the same threads:

* JaxMARL: one call of ``jax.jit`` over: random valid ally actions (``jax.random.categorical``
  over the log of the action masks of the previous step), ``vmap(HeuristicEnemySMAX.step)``
  (the heuristic enemy's actions from its unit-list observations, 8 world ticks, the allies'
  observations and the world state, rewards, dones, and JaxMARL's autoreset: a reset of every
  env computed and selected by ``__all__``), ``vmap(get_avail_actions)`` of the new states;
  ``block_until_ready``.
* marlkit: random valid ally actions (the argmax of uniform draws over ``action_mask``), then
  ``step_and_maybe_reset`` through the full env API (validation off): the heuristic enemy, 8
  world ticks, the allies' observations (flat, and as entities with their mask), the action and
  alive masks, the world state, rewards, the won flag, the done rule, ``step_mdp``, and a reset of
  the envs that are done.

XLA is pinned to one thread with ``--threads 1`` (``XLA_FLAGS``, set before jax is imported);
with more, XLA uses its own default pool. The two sides alternate over ``--rounds`` rounds of
``--round-seconds`` each, medians over rounds; ``speedup`` is JaxMARL's seconds per step over
marlkit's (target >= 5 at 1 thread).

    python benchmarks/smax.py --threads 1                     # 5m_vs_6m, 27m_vs_30m, 256 vs 256
    python benchmarks/smax.py --threads 1 --only 5m_vs_6m --num-envs 64
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from marlkit.bench import alternate_calls, make_parser, run_sections, summary
from marlkit.bench.rounds import positive

#: Untimed steps of each side first: compilation, and past the first episodes' ends.
WARMUP = 3


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2 for a while: importing jaxmarl replaces ``sys.stdout`` and then
    prints, which ``contextlib.redirect_stdout`` alone does not catch."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _jaxmarl_loop(
    name: str, kwargs: dict[str, Any], num_envs: int, seed: int
) -> Callable[[], None]:
    import jax
    import jax.numpy as jnp

    with _stdout_to_stderr():  # jaxmarl prints on import; stdout is the JSON
        from jaxmarl.environments.smax import HeuristicEnemySMAX, Scenario, map_name_to_scenario

    if name == "custom":
        n = kwargs["allies"] + kwargs["enemies"]
        scenario = Scenario(
            jnp.zeros((n,), jnp.uint8), kwargs["allies"], kwargs["enemies"], False, False
        )
    else:
        scenario = map_name_to_scenario(name)
    env = HeuristicEnemySMAX(scenario=scenario)
    agents = list(env.agents)

    def step(key: jax.Array, state: Any, avail: jax.Array) -> Any:
        key, act_key, step_key = jax.random.split(key, 3)
        logits = jnp.where(avail, 0.0, -jnp.inf)
        actions = jax.random.categorical(act_key, logits)  # [E, A]
        acts = {a: actions[:, i] for i, a in enumerate(agents)}
        obs, state, rew, dones, _info = jax.vmap(env.step)(
            jax.random.split(step_key, num_envs), state, acts
        )
        masks = jax.vmap(env.get_avail_actions)(state)
        avail = jnp.stack([masks[a] for a in agents], 1).astype(bool)
        return key, state, avail, (obs, rew, dones)

    jitted = jax.jit(step)
    key = jax.random.PRNGKey(seed)
    _, state = jax.jit(jax.vmap(env.reset))(jax.random.split(key, num_envs))
    masks = jax.jit(jax.vmap(env.get_avail_actions))(state)
    box = {"key": key, "state": state, "avail": jnp.stack([masks[a] for a in agents], 1) > 0}

    def run() -> None:
        box["key"], box["state"], box["avail"], out = jitted(box["key"], box["state"], box["avail"])
        jax.block_until_ready(out)

    return run


def _marlkit_loop(
    name: str, kwargs: dict[str, Any], num_envs: int, seed: int
) -> Callable[[], None]:
    import marlkit

    env = marlkit.make(
        f"smax/{name}", num_envs=num_envs, seed=seed, validate_actions=False, **kwargs
    )
    box = {"td": env.reset()}
    gen = torch.Generator().manual_seed(seed)

    def run() -> None:
        td = box["td"]
        mask = td.get(("ally", "action_mask"))
        # A uniform valid action: the argmax of uniform draws over the allowed ones (what
        # jax.random.categorical does over the log of the mask, with Gumbel draws).
        draws = torch.rand(mask.shape, generator=gen)
        td.set(("ally", "action"), torch.where(mask, draws, -1.0).argmax(-1))
        _, box["td"] = env.step_and_maybe_reset(td)

    return run


def _bench(args: argparse.Namespace, name: str, kwargs: dict[str, Any], num_envs: int) -> dict:
    num_envs = args.num_envs or num_envs
    sides = {
        "jaxmarl": _jaxmarl_loop(name, kwargs, num_envs, 0),
        "marlkit": _marlkit_loop(name, kwargs, num_envs, 0),
    }
    for _ in range(WARMUP):
        for run in sides.values():
            run()
    times = alternate_calls(sides, args.rounds, args.round_seconds, min_calls=args.min_steps)
    result = summary(times, "jaxmarl", "marlkit")
    import marlkit

    env = marlkit.make(f"smax/{name}", num_envs=1, **kwargs)
    a, m = env.rules.n_allies, env.rules.n_enemies
    return {
        "scenario": name,
        "kwargs": kwargs,
        "num_envs": num_envs,
        "units": {"allies": a, "enemies": m},
        "backend": env.backend,
        "work": {
            "jaxmarl": "jax.jit of: random valid ally actions (categorical over the log of the "
            "previous action masks), vmap(HeuristicEnemySMAX.step) (heuristic enemy from its "
            "unit-list observations, 8 ticks, ally observations and world state, rewards, dones, "
            "autoreset: a reset of every env computed and selected by __all__), "
            "vmap(get_avail_actions); block_until_ready",
            "marlkit": "random valid ally actions (argmax of torch.rand over the action mask), "
            "step_and_maybe_reset "
            "(validation off): heuristic enemy, 8 ticks, ally observations (flat and as "
            "entities with their mask), action and alive masks, world state, rewards, won, the "
            "done rule, step_mdp, a reset of the done envs",
        },
        "jaxmarl_env_steps_per_s": num_envs * 1e3 / result["jaxmarl_ms"],
        "marlkit_env_steps_per_s": num_envs * 1e3 / result["marlkit_ms"],
        "speedup": result["ratio_jaxmarl_over_marlkit"],
        "speedup_rounds": result["ratio_rounds"],
    }


def bench_5m_vs_6m(args: argparse.Namespace) -> dict:
    """5 marines against 6, 1,024 envs."""
    return _bench(args, "5m_vs_6m", {}, 1024)


def bench_27m_vs_30m(args: argparse.Namespace) -> dict:
    """27 marines against 30, 1,024 envs."""
    return _bench(args, "27m_vs_30m", {}, 1024)


def bench_custom_256(args: argparse.Namespace) -> dict:
    """256 marines against 256 (smax/custom), 16 envs: JaxMARL's [E, N, 13 (N - 1)] observations
    of 512 units hold 14 GB at 1,024 envs."""
    return _bench(args, "custom", {"allies": 256, "enemies": 256}, 16)


SECTIONS = {
    "5m_vs_6m": bench_5m_vs_6m,
    "27m_vs_30m": bench_27m_vs_30m,
    "custom_256": bench_custom_256,
}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=5, round_seconds=1.0)
    parser.add_argument(
        "--num-envs",
        type=positive(int),
        default=None,
        metavar="N",
        help="battles per step (default: 1,024; 16 for custom_256)",
    )
    parser.add_argument("--min-steps", type=positive(int), default=3, help="steps per round")
    args = parser.parse_args(argv)
    if getattr(args, "threads", None) == 1:
        # Before jax is first imported: XLA's CPU client reads it once.
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    torch.manual_seed(0)
    peer = {dist: importlib.metadata.version(dist) for dist in ("jax", "jaxlib", "jaxmarl")}
    return run_sections("smax", SECTIONS, args, extra={"peer": peer})


if __name__ == "__main__":
    sys.exit(main())
