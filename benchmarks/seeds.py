"""Many seeds in one process: ``seeds_in_process=K`` against K sequential runs and K parallel
processes of the same seeds; prints one JSON object.

Sections (``--only NAME``, repeatable; default all): ``mpe`` and ``lbf``, the MAPPO/IPPO
script's recipe (``configs/mappo_ippo.yaml``: 30 epochs of minibatches of 400, lr 3e-4) with
64-unit actor and critic networks, and ``qmix_mpe`` and ``qmix_lbf``, the QMIX/VDN script's
(``configs/qmix_vdn.yaml``: QMIX, 10 epochs of minibatches of 400, a buffer of one batch, soft
target updates, epsilon-greedy from 0.3) with a 64-unit Q-network (its mixer at the recipe's
32-wide embedding); on PettingZoo MPE simple_spread (``env=pettingzoo/mpe2.simple_spread_v3``)
and Level-Based Foraging 8x8, 2 players, 2 foods (``env=lbforaging/foraging_8x8_2p_2f_coop``).
Each at a small frame budget (``--frames-per-batch`` x ``--batches`` per seed, ``--num-envs``
envs per seed), every process with one thread, one evaluation at the end, CSV logs. Three sides
train the same K seeds (``seed, seed + w, ...``, ``w`` the seeds one run's env takes:
:func:`marlkit.train.seeds.run_seeds`) to the same budget:

* ``stacked``: one process, ``seeds_in_process=K`` (the seeds' networks stacked, their envs
  stepped together);
* ``sequential``: K script processes, one after the other;
* ``parallel``: K script processes started at once (the cores shared by the OS).

Reported per side: the wall-clock of the whole side (processes started to last one ended,
imports included; ``--rounds`` rounds, the sides' order flipping every round), and from the
runs' ``metrics.csv``: the seconds per iteration (collection + training, the steady state
without start-up and evaluation) and each seed's final evaluation reward (the stack's seed
``k`` against the same seed's own run). The ratios are sequential / stacked and parallel /
stacked wall-clock (medians over rounds); the issue's target: ``speedup_over_faster`` (the
smaller of the two) >= 2 at K = 8 on two cores.

    python benchmarks/seeds.py --threads 1
    python benchmarks/seeds.py --only mpe --seeds-in-process 4 --batches 2
    python benchmarks/seeds.py --only qmix_mpe --only qmix_lbf --threads 1
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import marlkit
from marlkit.bench import alternate, make_parser, run_sections, timed
from marlkit.record import read_metrics
from marlkit.train.seeds import run_seeds, seed_width

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "sota-implementations"
MPE = ("pettingzoo/mpe2.simple_spread_v3", "PettingZoo MPE simple_spread (mpe2), 3 agents")
LBF = ("lbforaging/foraging_8x8_2p_2f_coop", "LBF 8x8, 2 players, 2 cooperative foods")

#: algorithm -> (script, its recipe's epochs per batch, what it trains)
ALGORITHMS = {
    "mappo": ("mappo_ippo", 30, "MAPPO (configs/mappo_ippo.yaml), 64-unit actor and critic"),
    "qmix": ("qmix_vdn", 10, "QMIX (configs/qmix_vdn.yaml), a 64-unit Q-network"),
}

#: section -> (algorithm, env config, what the env is)
RECIPES = {
    "mpe": ("mappo", *MPE),
    "lbf": ("mappo", *LBF),
    "qmix_mpe": ("qmix", *MPE),
    "qmix_lbf": ("qmix", *LBF),
}


def _script(section: str) -> pathlib.Path:
    name = ALGORITHMS[RECIPES[section][0]][0]
    return SCRIPTS / name / f"{name}.py"


def _epochs(section: str, args: argparse.Namespace) -> int:
    return args.epochs if args.epochs is not None else ALGORITHMS[RECIPES[section][0]][1]


def _overrides(section: str, args: argparse.Namespace) -> list[str]:
    algorithm, env = RECIPES[section][:2]
    return [
        f"env={env}",
        f"env.num_envs={args.num_envs}",
        "policy.num_cells=64",
        *(["critic.num_cells=64"] if algorithm == "mappo" else []),
        f"collector.frames_per_batch={args.frames_per_batch}",
        f"collector.total_frames={args.frames_per_batch * args.batches}",
        f"threads={args.threads}",
        "eval.every=0",
        "eval.video=false",
        f"eval.num_envs={args.eval_envs}",
        f"checkpoint.every={args.batches}",
        f"train.epochs={_epochs(section, args)}",
        f"train.minibatch_size={args.minibatch_size}",
        "logger.backends=[csv]",
    ]


def _command(
    script: pathlib.Path, overrides: list[str], run_dir: pathlib.Path, *extra: str
) -> list[str]:
    return [sys.executable, str(script), *overrides, f"run_dir={run_dir}", *extra]


def _run_all(cmds: list[list[str]], logs: pathlib.Path) -> None:
    """Start every command at once (stderr into ``logs``), wait for all; a failure raises
    ``RuntimeError`` with its stderr."""
    logs.mkdir(parents=True, exist_ok=True)
    files = [open(logs / f"{i}.err", "w+") for i in range(len(cmds))]  # noqa: SIM115
    try:
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, text=True, cwd=ROOT)
            for cmd, f in zip(cmds, files)
        ]
        for proc, cmd, f in zip(procs, cmds, files):
            if proc.wait():
                f.seek(0)
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{f.read()[-4000:]}")
    finally:
        for f in files:
            f.close()


def _per_iteration(folder: pathlib.Path) -> tuple[float, float, float]:
    """Median collection and training seconds per iteration, and the final evaluation reward
    (the first group's), of the run in ``folder``."""
    rows = read_metrics(folder / "metrics.csv")
    collection = statistics.median(float(r["collection_time"]) for r in rows)
    training = statistics.median(float(r["training_time"]) for r in rows)
    final = next(v for k, v in rows[-1].items() if k.startswith("eval/") and "episode_reward" in k)
    return collection, training, float(final)


def _side(
    name: str, script: pathlib.Path, overrides: list[str], seeds: list[int], out: pathlib.Path
) -> Callable[[], dict[str, Any]]:
    counter = iter(range(1_000_000))

    def measure() -> dict[str, Any]:
        where = out / f"{name}-{next(counter)}"
        logs = where / "logs"
        if name == "stacked":
            k, first = f"seeds_in_process={len(seeds)}", f"seed={seeds[0]}"
            cmd = _command(script, overrides, where, k, first)
            _, seconds = timed(lambda: _run_all([cmd], logs))
        else:
            cmds = [_command(script, overrides, where / f"seed_{s}", f"seed={s}") for s in seeds]
            if name == "sequential":
                _, seconds = timed(lambda: [_run_all([c], logs) for c in cmds])
            else:
                _, seconds = timed(lambda: _run_all(cmds, logs))
        folders = [where / f"seed_{s}" for s in seeds]
        runs = [_per_iteration(f) for f in folders]
        shutil.rmtree(where, ignore_errors=True)
        return {
            "seconds": seconds,
            "collection_s_per_iteration": [round(r[0], 3) for r in runs],
            "training_s_per_iteration": [round(r[1], 3) for r in runs],
            "final_reward": [round(r[2], 3) for r in runs],
        }

    return measure


def bench(section: str, args: argparse.Namespace) -> dict[str, Any]:
    algorithm, env_name, what = RECIPES[section]
    overrides = _overrides(section, args)
    from omegaconf import OmegaConf

    env_cfg = OmegaConf.load(ROOT / "sota-implementations" / "configs" / "env" / f"{env_name}.yaml")
    probe = marlkit.make(
        env_cfg.name, num_envs=args.num_envs, seed=0, **OmegaConf.to_container(env_cfg.kwargs)
    )
    seeds = run_seeds(0, args.seeds_in_process, seed_width(probe))
    probe.close()
    out = pathlib.Path(tempfile.mkdtemp(prefix=f"seeds-{section}-"))
    try:
        sides = {
            name: _side(name, _script(section), overrides, seeds, out)
            for name in ("stacked", "sequential", "parallel")
        }
        rounds = alternate(sides, args.rounds)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    wall = {name: [r["seconds"] for r in rs] for name, rs in rounds.items()}
    median = {name: statistics.median(values) for name, values in wall.items()}
    seq = median["sequential"] / median["stacked"]
    par = median["parallel"] / median["stacked"]
    stacked_iter = statistics.median(
        c + t
        for r in rounds["stacked"]
        for c, t in zip(r["collection_s_per_iteration"], r["training_s_per_iteration"])
    )
    alone_iter = statistics.median(
        c + t
        for r in rounds["sequential"]
        for c, t in zip(r["collection_s_per_iteration"], r["training_s_per_iteration"])
    )
    k = args.seeds_in_process
    return {
        "what": what,
        "computes": f"{ALGORITHMS[algorithm][2]} on {env_name}, {args.batches} batches of "
        f"{args.frames_per_batch} frames per seed, {_epochs(section, args)} epochs per batch, "
        f"for K={k} seeds",
        "overrides": overrides,
        "seeds": seeds,
        "seconds": {name: [round(v, 2) for v in values] for name, values in wall.items()},
        "ratio_sequential_over_stacked": round(seq, 3),
        "ratio_parallel_over_stacked": round(par, 3),
        "speedup_over_faster": round(min(seq, par), 3),
        "target": "speedup_over_faster >= 2",
        "target_met": min(seq, par) >= 2,
        "seconds_per_iteration": {
            "stacked_all_seeds": round(stacked_iter, 3),
            "one_seed_alone": round(alone_iter, 3),
            "k_alone_over_stacked": round(k * alone_iter / stacked_iter, 3),
        },
        "training_s_per_iteration": {
            "stacked_all_seeds": rounds["stacked"][0]["training_s_per_iteration"][0],
            "one_seed_alone": statistics.median(
                rounds["sequential"][0]["training_s_per_iteration"]
            ),
        },
        "collection_s_per_iteration": {
            "stacked_all_seeds": rounds["stacked"][0]["collection_s_per_iteration"][0],
            "one_seed_alone": statistics.median(
                rounds["sequential"][0]["collection_s_per_iteration"]
            ),
        },
        "final_reward": {
            name: rounds[name][0]["final_reward"] for name in ("stacked", "sequential", "parallel")
        },
    }


SECTIONS = {name: (lambda args, name=name: bench(name, args)) for name in RECIPES}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=1, threads=1)
    parser.add_argument("--seeds-in-process", type=int, default=8, help="K (default 8)")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per seed (default 8)")
    parser.add_argument(
        "--frames-per-batch", type=int, default=2000, help="frames per batch per seed (2000)"
    )
    parser.add_argument("--batches", type=int, default=2, help="batches per seed (default 2)")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs per batch (the recipe's: 30 MAPPO, 10 QMIX)",
    )
    parser.add_argument(
        "--minibatch-size", type=int, default=400, help="frames per minibatch (the recipe's 400)"
    )
    parser.add_argument("--eval-envs", type=int, default=8, help="envs of the final evaluation")
    args = parser.parse_args(argv)
    if args.seeds_in_process < 2:
        parser.error(f"--seeds-in-process must be at least 2, got {args.seeds_in_process}")
    return run_sections("seeds", SECTIONS, args)


if __name__ == "__main__":
    sys.exit(main())
