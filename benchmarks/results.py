"""Learning results of the training scripts over seeds, side by side with TorchRL where it has
the same recipe; prints one JSON object per experiment and draws its curves.

    python benchmarks/results.py mappo-vmas --seeds 0,1,2 --torchrl-python /path/to/venv/bin/python
    python benchmarks/results.py qmix-native masac-balance --seeds 0,1,2
    python benchmarks/results.py throughput-native

Prints one JSON object per experiment and line (the shared header, then the experiment's
figures). Each seed runs the script as a user would (a subprocess, the same command as in
``docs/results.md``); the wall-clock is that command's, imports included, on both sides. With
``--torchrl-python`` (a venv with TorchRL 0.14 and VMAS, not marlkit's), the peer's side of the
experiments that have one runs for the same seeds, alternating with ours seed by seed, so that
a change of machine load hits both sides alike. The mean and a 95 % percentile-bootstrap
interval over the seeds are reported for the final reward and the wall-clock, and the curves
(mean and band over seeds) are drawn into ``--img`` (``docs/img/results-<experiment>.png``).
``--threads N`` (default 1) gives both sides N torch threads (the scripts' ``threads=N``, the
peers' ``--threads N``): 1 compares the code on one core, 2 the machine's default on two.
``--out`` is the folder of the runs themselves (default ``runs/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import numpy as np

from marlkit.bench import alternate, finish, make_parser, start, timed
from marlkit.modules import get_tanh_method
from marlkit.record import bootstrap_ci, plot_with_bands, read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "sota-implementations"
PEERS = ROOT / "benchmarks" / "peers"
QUIET = ("eval.every=0", "logger.backends=[csv]")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One learning result: a script, its overrides, the metric it is judged by."""

    script: str
    overrides: tuple[str, ...]
    #: "train": the last iteration's mean training episode reward of ``group`` (TorchRL's
    #: tutorial's measure); "eval": the final evaluation with exploration off (summary.json).
    measure: str = "eval"
    group: str = "agents"
    peer: str | None = None
    what: str = ""
    #: the Hydra config (``--config-name``); None: the script's own (``configs/<script>.yaml``)
    config: str | None = None


EXPERIMENTS: dict[str, Experiment] = {
    "mappo-vmas": Experiment(
        "mappo_ippo",
        ("env=vmas/navigation", "eval.video=false"),
        measure="train",
        peer="torchrl_mappo.py",
        what="MAPPO, TorchRL's multi-agent PPO tutorial recipe, VMAS navigation, 3 agents",
    ),
    "mappo-vmas-compiled": Experiment(
        "mappo_ippo",
        ("env=vmas/navigation", "eval.video=false", "train.compile=true"),
        measure="train",
        what="MAPPO, TorchRL's multi-agent PPO tutorial recipe, VMAS navigation, 3 agents, the "
        "loss through torch.compile (its compilation included in the wall-clock)",
    ),
    "qmix-vmas": Experiment(
        "qmix_vdn",
        # The peer's final greedy rollout covers 60 envs: ours too.
        ("env=vmas/navigation", "eval.video=false", "eval.num_envs=60"),
        peer="torchrl_qmix.py",
        what="QMIX, TorchRL's qmix_vdn recipe at a CPU budget, VMAS navigation, 3 agents",
    ),
    "vdn-vmas": Experiment(
        "qmix_vdn",
        ("env=vmas/navigation", "loss.mixer=vdn", "eval.video=false"),
        what="VDN, the QMIX recipe with the sum mixer, VMAS navigation, 3 agents",
    ),
    "mappo-native": Experiment(
        "mappo_ippo",
        ("env=navigation", "env.kwargs.n_agents=4", "eval.video=false"),
        measure="train",
        what="MAPPO, the same recipe, native navigation, 4 agents",
    ),
    "mappo-native-fast": Experiment(
        "mappo_ippo",
        ("env=navigation", "env.kwargs.n_agents=4", "eval.video=false", "eval.num_envs=60"),
        measure="train",
        config="mappo_fast",
        what="MAPPO, the recipe sized for a cheap simulator (configs/mappo_fast.yaml), "
        "native navigation, 4 agents",
    ),
    "mappo-vmas-fast": Experiment(
        "mappo_ippo",
        ("env=vmas/navigation", "eval.video=false", "eval.num_envs=60"),
        measure="train",
        config="mappo_fast",
        what="MAPPO, the recipe sized for a cheap simulator (configs/mappo_fast.yaml), "
        "VMAS navigation, 3 agents",
    ),
    "qmix-native": Experiment(
        "qmix_vdn",
        ("env=navigation", "eval.video=false", "eval.num_envs=60"),
        what="QMIX, the same recipe, native navigation with discrete actions, 3 agents",
    ),
    "qmix-mpe": Experiment(
        "qmix_vdn",
        ("eval.video=false",),
        config="qmix_mpe",
        what="QMIX on PettingZoo MPE simple_spread (mpe2), 3 agents, the recipe of "
        "configs/qmix_mpe.yaml (a 60k buffer, eps 1.0 -> 0.05, 240k frames)",
    ),
    "qmix-mpe-default": Experiment(
        "qmix_vdn",
        ("env=pettingzoo/mpe2.simple_spread_v3", "eval.video=false", "eval.num_envs=32"),
        what="QMIX on PettingZoo MPE simple_spread (mpe2), 3 agents, qmix_vdn.yaml's recipe",
    ),
    "masac-balance": Experiment(
        "masac_isac",
        ("env=vmas/balance", "eval.video=false", "eval.num_envs=16"),
        what="MASAC on VMAS balance, 3 agents",
    ),
    "maddpg-balance": Experiment(
        "maddpg_iddpg",
        ("env=vmas/balance", "eval.video=false", "eval.num_envs=16"),
        what="MADDPG on VMAS balance, 3 agents",
    ),
    "mappo-ant": Experiment(
        "mappo_ippo",
        ("env=mujoco/ant_2x4", "eval.video=false", "eval.num_envs=16"),
        what="MAPPO on multi-agent MuJoCo Ant 2x4 (reward: forward velocity)",
    ),
    "mappo-predator-prey": Experiment(
        "mappo_ippo",
        ("env=predator_prey", "eval.video=false", "eval.num_envs=16"),
        group="predator",
        what="MAPPO with one policy, critic and loss per group, native predator_prey",
    ),
}


def run_ours(
    exp: Experiment, seed: int, out: pathlib.Path, extra: list[str], threads: int = 1
) -> dict[str, Any]:
    run_dir = out / f"seed{seed}"
    if run_dir.exists():  # this harness's own output of an earlier run: a fresh run, not a resume
        shutil.rmtree(run_dir)
    cmd = [
        sys.executable,
        str(SCRIPTS / exp.script / f"{exp.script}.py"),
        *(("--config-name", exp.config) if exp.config else ()),
        *exp.overrides,
        *QUIET,
        f"threads={threads}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        *extra,
    ]
    _, seconds = _run(cmd)
    rows = read_metrics(run_dir / "metrics.csv")
    summary = json.loads((run_dir / "summary.json").read_text())
    key = f"{exp.group}/episode_reward"
    curve = [[r["frames"], r[key]] for r in rows if key in r]
    final = curve[-1][1] if exp.measure == "train" else summary["trained"][key]
    return {
        "seed": seed,
        "final": final,
        "random": summary["random"][key],
        "greedy": summary["trained"][key],
        "seconds": seconds,
        "collection_s": sum(r["collection_time"] for r in rows),
        "training_s": sum(r["training_time"] for r in rows),
        "curve": curve,
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
        "does": f"{exp.what}: the script's recipe (configs/{exp.config or exp.script}.yaml with "
        "the overrides in 'command'), one final evaluation with exploration off and one of a "
        "random policy, the reward.png curve (summary.json; the TorchRL peers do neither of the "
        "last two), no videos; hidden activation marlkit.modules.Tanh (the MLPs' default) by "
        f"this machine's tanh method {get_tanh_method()!r} (torch: torch.tanh; sigmoid: "
        "2 sigmoid(2x) - 1), torch.optim.Adam(fused=True); MAPPO's TanhNormal given uniform "
        "action bounds as numbers ([-1, 1] on VMAS: no affine map, which is the identity there "
        "and which TorchRL's tensor bounds compute: the same values)",
    }


def run_peer(exp: Experiment, seed: int, python: str, threads: int = 1) -> dict[str, Any]:
    assert exp.peer is not None
    cmd = [python, str(PEERS / exp.peer), "--seed", str(seed), "--threads", str(threads)]
    proc, seconds = _run(cmd)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "final": result["final_episode_reward"], "seconds": seconds}


def _env() -> dict[str, str]:
    return {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "WANDB_MODE": "offline"}


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``cmd`` from the repository root (its output captured); it and its wall-clock, the
    whole command's, imports included. A failure raises ``RuntimeError`` with its stderr."""
    proc, seconds = timed(
        lambda: subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env())
    )
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return proc, seconds


def _ci(values: list[float]) -> dict[str, float]:
    ci = bootstrap_ci(np.asarray(values, dtype=float))
    return {"mean": float(ci.mean), "low": float(ci.low), "high": float(ci.high)}


def _band(runs: list[dict[str, Any]]) -> tuple[Any, Any, Any, Any]:
    n = min(len(r["curve"]) for r in runs)
    x = np.asarray([p[0] for p in runs[0]["curve"][:n]], dtype=float)
    ys = np.asarray([[p[1] for p in r["curve"][:n]] for r in runs], dtype=float)
    ci = bootstrap_ci(ys)
    return x, ci.mean, ci.low, ci.high


def report(
    name: str, sides: dict[str, list[dict[str, Any]]], img: pathlib.Path, threads: int = 1
) -> dict:
    exp = EXPERIMENTS[name]
    out: dict[str, Any] = {"experiment": name, "what": exp.what, "measure": exp.measure}
    out["threads"] = threads  # torch's threads on both sides
    for side, runs in sides.items():
        out[side] = {
            "final_reward": _ci([r["final"] for r in runs]),
            "seconds": _ci([r["seconds"] for r in runs]),
            "per_seed": [
                {k: v for k, v in r.items() if k not in ("command", "does")} for r in runs
            ],
        }
        if "random" in runs[0]:
            out[side]["random_reward"] = _ci([r["random"] for r in runs])
        if "greedy" in runs[0]:
            out[side]["greedy_reward"] = _ci([r["greedy"] for r in runs])
    out["command"] = sides["marlkit"][0]["command"]
    if "torchrl" in sides:
        out["seconds_ratio_marlkit_over_torchrl"] = [
            a["seconds"] / b["seconds"] for a, b in zip(sides["marlkit"], sides["torchrl"])
        ]
        out["torchrl_does"] = sides["torchrl"][0].get("does")
    out["marlkit_does"] = sides["marlkit"][0]["does"]
    curves = {side: _band(runs) for side, runs in sides.items() if all(r["curve"] for r in runs)}
    if curves:
        path = plot_with_bands(
            curves,
            img / f"results-{name}.png",
            xlabel="frames",
            ylabel=f"{exp.group} mean episode reward (training batches)",
            title=f"{name} ({len(sides['marlkit'])} seeds, mean and 95% bootstrap band)",
        )
        out["curve_png"] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return out


def throughput(out: pathlib.Path) -> dict[str, Any]:
    """End-to-end frames/s of MAPPO on native navigation, 1024 envs x 4 agents."""
    run_dir = out / "throughput"
    overrides = [
        "env=navigation",
        "env.num_envs=1024",
        "env.kwargs.n_agents=4",
        "collector.frames_per_batch=102400",
        "collector.total_frames=307200",
        "train.epochs=1",
        "train.minibatch_size=4096",
        "eval.video=false",
        "eval.num_envs=4",
    ]
    cmd = [
        sys.executable,
        str(SCRIPTS / "mappo_ippo" / "mappo_ippo.py"),
        *overrides,
        *QUIET,
        "threads=2",
        f"run_dir={run_dir}",
    ]
    _run(cmd)
    rows = read_metrics(run_dir / "metrics.csv")[1:]  # the first iteration warms up
    frames = 102400 * len(rows)
    collect = sum(r["collection_time"] for r in rows)
    train = sum(r["training_time"] for r in rows)
    return {
        "experiment": "throughput-native",
        "what": "MAPPO end to end on native navigation, 1024 envs x 4 agents, 100-step batches, "
        "1 epoch of minibatches of 4096 per batch, 2 threads",
        "frames_per_s": frames / (collect + train),
        "collection_frames_per_s": frames / collect,
        "training_frames_per_s": frames / train,
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
    }


def run_experiment(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every seed of experiment ``name`` on each side, the sides alternating seed by seed (the
    order flipping every seed: machine load hits both alike); the experiment's JSON."""
    out = pathlib.Path(args.out) / name
    if name == "throughput-native":
        return throughput(out)
    exp = EXPERIMENTS[name]
    seeds = [int(s) for s in args.seeds.split(",")]
    ours, peers = iter(seeds), iter(seeds)
    sides: dict[str, Any] = {
        "marlkit": lambda: run_ours(exp, next(ours), out, args.override, args.threads)
    }
    if exp.peer and args.torchrl_python:
        sides["torchrl"] = lambda: run_peer(exp, next(peers), args.torchrl_python, args.threads)
    return report(name, alternate(sides, len(seeds)), pathlib.Path(args.img), args.threads)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, threads=1)
    parser.add_argument("experiments", nargs="+", choices=[*EXPERIMENTS, "throughput-native"])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--torchrl-python", default=None)
    parser.add_argument("--out", default=str(ROOT / "runs" / "results"), help="runs folder")
    parser.add_argument("--img", default=str(ROOT / "docs" / "img"))
    parser.add_argument("--override", action="append", default=[], help="extra overrides")
    args = parser.parse_args(argv)
    for name in args.experiments:
        header = start("results", args)  # this process's torch threads: args.threads
        finish({**header, **run_experiment(name, args)}, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
