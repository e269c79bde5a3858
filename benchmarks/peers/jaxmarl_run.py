"""The JaxMARL peer: runs JaxMARL's own SMAX baselines (``baselines/MAPPO/mappo_rnn_smax.py``,
``baselines/IPPO/ippo_rnn_smax.py``; its repository at a pinned commit, in its own venv, not
marlkit's) for one map and seed, and prints its win rates and wall-clock as one JSON line.

The venv (CPU jax; JaxMARL's ``algs`` extra: flax, optax, distrax, hydra-core, wandb, ...)::

    # the source tree at the pinned commit (fetch github:FLAIROx/JaxMARL, then)
    mkdir -p /tmp/jaxmarl-src && git -C <mirror> archive c793d095618c6d3edfb5632802348f57b70a4b94 \
        jaxmarl baselines pyproject.toml README.md LICENSE | tar -x -C /tmp/jaxmarl-src
    python3.11 -m venv /tmp/jaxmarl-peer-venv
    /tmp/jaxmarl-peer-venv/bin/pip install "jax[cpu]" -e "/tmp/jaxmarl-src[algs]"

The run (one thread: XLA's intra-op pool of one, Eigen single-threaded)::

    /tmp/jaxmarl-peer-venv/bin/python benchmarks/peers/jaxmarl_run.py \
        --jaxmarl /tmp/jaxmarl-src --alg mappo --map 3m --seed 0 --total-timesteps 1000000

The baseline runs as its ``main`` would: its config file (``config/mappo_homogenous_rnn_smax
.yaml`` or ``config/ippo_rnn_smax.yaml``: 128 envs x 128 steps a batch, a 128-unit GRU actor
and critic, 4 epochs of 4 minibatches, Adam with the learning rate annealed to 0, SMAX's
heuristic enemy with ``see_enemy_actions``, ``walls_cause_death``, ``attack_mode: closest``),
changed only in ``MAP_NAME``, ``SEED``, ``TOTAL_TIMESTEPS`` (env steps: one step of every
agent of one env), ``WANDB_MODE: disabled`` and, with ``--num-envs``/``--num-steps``, the batch;
``make_train(config)`` jitted whole and called once (compilation included in ``train_s``). Its
``wandb.log`` callback (once per update) is read instead of being sent: the training
episodes' win rate (``win_rate``: episodes whose last step's reward was >= 1, the win bonus;
actions sampled) and returns, at ``env_step``.

Then a greedy evaluation of the trained actor (JaxMARL's baselines have none): ``--eval-envs``
envs of the same map and env options, seeded apart from training, each played to its first
episode's end (at most SMAX's 101 steps) with the actor's most likely allowed action, its GRU
reset at the episode start; won as JaxMARL's log wrapper says (the last step's reward >= 1).

Prints one JSON line: ``final_win_rate`` (the last update's training episodes),
``greedy_win_rate``, the curve ``[[env_step, win_rate, return], ...]``, ``train_s`` (the
jitted train call, compile included), ``first_update_s`` (until the first update's callback:
mostly compilation), ``wall_s`` (the whole command), the config it ran and the commit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

SCRIPTS = {
    "mappo": ("baselines/MAPPO/mappo_rnn_smax.py", "mappo_homogenous_rnn_smax.yaml"),
    "ippo": ("baselines/IPPO/ippo_rnn_smax.py", "ippo_rnn_smax.yaml"),
}
#: the flax module of each baseline that holds the actor (IPPO's actor and critic share one)
ACTORS = {"mappo": "ActorRNN", "ippo": "ActorCriticRNN"}
PINNED = "c793d095618c6d3edfb5632802348f57b70a4b94"  # JaxMARL's main, 2026-07-21
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jaxmarl", required=True, help="JaxMARL's source tree (has baselines/)")
    p.add_argument("--alg", choices=sorted(SCRIPTS), default="mappo")
    p.add_argument("--map", default="3m", help="SMAX's MAP_NAME: 3m, 2s3z, 5m_vs_6m, ...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=1_000_000, help="env steps")
    p.add_argument("--num-envs", type=int, default=0, help="0: the config's (128)")
    p.add_argument("--num-steps", type=int, default=0, help="0: the config's (128)")
    p.add_argument("--eval-envs", type=int, default=100, help="greedy episodes at the end")
    p.add_argument("--threads", type=int, default=1, help="1: XLA single-threaded; 0: default")
    p.add_argument("--commit", default=PINNED, help="the commit of the source tree given")
    args = p.parse_args(argv)
    if args.total_timesteps < 1 or args.eval_envs < 1 or args.threads < 0 or args.seed < 0:
        p.error("--total-timesteps and --eval-envs must be >= 1, --threads and --seed >= 0")
    if args.num_envs < 0 or args.num_steps < 0:
        p.error("--num-envs and --num-steps must be >= 0")
    return args


def _commit(root: pathlib.Path, given: str) -> str:
    """The checkout's commit where ``root`` is a git checkout, else ``given``."""
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else given


def _load(path: pathlib.Path) -> Any:
    """The baseline script as a module (its ``main`` is not called)."""
    spec = importlib.util.spec_from_file_location(f"jaxmarl_baseline_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Log:
    """Stands for the ``wandb`` module inside the baseline: keeps what it logs, with the time."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.times: list[float] = []

    def log(self, row: dict[str, Any]) -> None:
        self.times.append(time.perf_counter())
        self.rows.append({k: float(v) for k, v in row.items()})


def _greedy_win_rate(
    module: Any, alg: str, config: dict[str, Any], params: Any, seed: int, n: int
) -> float:
    """The fraction of ``n`` first episodes won by the trained actor's greedy actions."""
    import jax
    import jax.numpy as jnp

    env = module.HeuristicEnemySMAX(
        scenario=module.map_name_to_scenario(config["MAP_NAME"]), **config["ENV_KWARGS"]
    )
    actors = env.num_agents * n
    actor = getattr(module, ACTORS[alg])(env.action_space(env.agents[0]).n, config=config)

    def play(key: Any) -> Any:
        key, reset_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, n))
        hidden = module.ScannedRNN.initialize_carry(actors, config["GRU_HIDDEN_DIM"])
        carry0 = (
            obs,
            state,
            hidden,
            jnp.ones(actors, bool),
            jnp.zeros(n, bool),
            jnp.zeros(n, bool),
            key,
        )

        def step(carry: Any, _: Any) -> Any:
            obs, state, hidden, starts, ended, won, key = carry
            avail = module.batchify(jax.vmap(env.get_avail_actions)(state), env.agents, actors)
            x = (module.batchify(obs, env.agents, actors)[None], starts[None], avail)
            out = actor.apply(params, hidden, x)
            hidden, pi = out[0], out[1]  # IPPO's actor returns its value too
            action = jnp.argmax(pi.logits, axis=-1)
            acts = module.unbatchify(action, env.agents, n, env.num_agents)
            key, step_key = jax.random.split(key)
            obs, state, reward, done, _ = jax.vmap(env.step)(
                jax.random.split(step_key, n), state, {k: v.squeeze(-1) for k, v in acts.items()}
            )
            first = done["__all__"] & ~ended
            won = won | (first & (reward[env.agents[0]] >= 1.0))
            ended = ended | done["__all__"]
            starts = jnp.zeros(actors, bool)  # only the first episode counts
            return (obs, state, hidden, starts, ended, won, key), None

        (_, _, _, _, ended, won, _), _ = jax.lax.scan(step, carry0, None, env.max_steps + 1)
        return won.mean(), ended.mean()

    won, ended = jax.jit(play)(jax.random.PRNGKey(seed))
    if float(ended) < 1.0:
        raise RuntimeError(f"only {float(ended):.2f} of the greedy episodes ended")
    return float(won)


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    root = pathlib.Path(args.jaxmarl).resolve()
    script, config_file = SCRIPTS[args.alg]
    path = root / script
    if not path.is_file():
        raise SystemExit(f"--jaxmarl {root}: no {script} there (JaxMARL's source tree)")
    if args.threads == 1:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_THREAD_XLA}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["WANDB_MODE"] = "disabled"
    sys.path.insert(0, str(root))
    import jax
    from omegaconf import OmegaConf

    module = _load(path)
    config = OmegaConf.to_container(OmegaConf.load(path.parent / "config" / config_file))
    assert isinstance(config, dict)
    config.update(
        MAP_NAME=args.map,
        SEED=args.seed,
        TOTAL_TIMESTEPS=args.total_timesteps,
        WANDB_MODE="disabled",
        ENTITY="",
    )
    if args.num_envs:
        config["NUM_ENVS"] = args.num_envs
    if args.num_steps:
        config["NUM_STEPS"] = args.num_steps
    asked = dict(config)
    log = _Log()
    module.wandb = log
    train = jax.jit(module.make_train(config))  # fills NUM_UPDATES, NUM_ACTORS, ... in config
    began = time.perf_counter()
    out = train(jax.random.PRNGKey(args.seed))
    jax.block_until_ready(out)
    train_s = time.perf_counter() - began
    states = out["runner_state"][0][0]  # ((train states, env state, ...), update_steps)
    actor_state = states[0] if isinstance(states, tuple) else states  # MAPPO: (actor, critic)
    # the training's figures first (stderr), so that a failing evaluation does not lose them
    print(json.dumps({"train_s": train_s, "log": log.rows}), file=sys.stderr, flush=True)
    greedy = _greedy_win_rate(
        module, args.alg, config, actor_state.params, args.seed + 10_000, args.eval_envs
    )
    steps_per_update = config["NUM_ENVS"] * config["NUM_STEPS"]
    # an update logs the env steps before its batch: the curve says those after it
    curve = [[int(r["env_step"]) + steps_per_update, r["win_rate"], r["returns"]] for r in log.rows]
    return {
        "peer": "jaxmarl",
        "alg": args.alg,
        "script": script,
        "map": args.map,
        "seed": args.seed,
        "env_steps": int(config["NUM_UPDATES"]) * steps_per_update,
        "final_win_rate": curve[-1][1] if curve else None,
        "final_return": curve[-1][2] if curve else None,
        "greedy_win_rate": greedy,
        "eval_episodes": args.eval_envs,
        "curve": curve,
        "train_s": train_s,
        "first_update_s": (log.times[0] - began) if log.times else None,
        "wall_s": time.perf_counter() - start,
        "threads": args.threads,
        "config": {k: v for k, v in asked.items() if k not in ("ENTITY", "PROJECT")},
        "jax": jax.__version__,
        "commit": _commit(root, args.commit),
    }


def main(argv: list[str] | None = None) -> None:
    print(json.dumps(run(parse(argv))))


if __name__ == "__main__":
    main()
