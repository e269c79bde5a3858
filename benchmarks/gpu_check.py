"""A one-shot check of marlkit on an accelerator: training and simulation on ``cuda``, as JSON.

Run it wherever a GPU is at hand; on a machine without CUDA it prints a JSON object saying so
(``"cuda": false``, no sections) and exits 0.

Sections (``--only``):

* ``mappo``, ``qmix``: the training scripts ``sota-implementations/{mappo_ippo,qmix_vdn}``
  run as a user runs them, on native navigation, with ``device=<device> env.device=<device>``
  (modules, losses, optimisers, buffers and the env's torch twin on the device; the collector's
  policy on the training device), ``--iterations`` batches of ``--frames-per-batch`` frames,
  ``--epochs`` epochs; and the same command with ``device=cpu env.device=cpu`` (native kernels).
  Each side reports the median ``frames_per_s`` of ``metrics.csv`` over the iterations after
  the first (collection + training, each batch's frames over its time; the first pays CUDA's
  start-up), the run's wall time, and ``ratio_device_over_cpu`` of the medians. A run that fails
  is reported with the end of its error output, and the script exits 1.
* ``vmas``, ``native``: ``vmas/navigation`` and native ``navigation`` (its torch twin,
  ``backend="torch"``) stepped with random actions, ``--num-envs`` envs, on the device and on
  the cpu (VMAS's torch on the cpu; native navigation's C++ kernels on the cpu), in
  ``--rounds`` alternating rounds of ``--round-seconds`` each: env steps per second of each side
  (``num_envs`` per call) and the median per-round ratio. Each device step ends with
  ``torch.cuda.synchronize()``, so that the time is the step's, not its launch's.

Examples:
    python benchmarks/gpu_check.py                       # everything, on cuda
    python benchmarks/gpu_check.py --only vmas --num-envs 4096
    python benchmarks/gpu_check.py --device cpu --only native   # the same code path on the cpu
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

import marlkit
from marlkit.bench import alternate_calls, finish, make_parser, start, summary, timed
from marlkit.bench.rounds import positive
from marlkit.record import read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTIONS = ("mappo", "qmix", "vmas", "native")
#: The training sections' scripts and the overrides that size them alike.
SCRIPTS = {"mappo": "mappo_ippo", "qmix": "qmix_vdn"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- training
def _train(
    name: str, side: str, device: str, args: argparse.Namespace, folder: pathlib.Path
) -> dict:
    """One run of the script of section ``name`` on ``device``: its rate and wall time."""
    script = SCRIPTS[name]
    run_dir = folder / f"{script}-{side}"
    envs = max(1, args.frames_per_batch // 100)  # 100-step episodes
    command = [
        sys.executable,
        str(ROOT / "sota-implementations" / script / f"{script}.py"),
        f"run_dir={run_dir}",
        f"device={device}",
        f"env.device={device}",
        f"env.num_envs={envs}",
        "env.max_steps=100",
        f"collector.frames_per_batch={envs * 100}",
        f"collector.total_frames={envs * 100 * args.iterations}",
        f"train.epochs={args.epochs}",
        "eval.every=0",
        "eval.num_envs=4",
        "eval.video=false",
        "logger.backends=[csv]",
        "checkpoint.every=1000",
        f"train.minibatch_size={min(400, envs * 100)}",  # the recipes' 400, or one batch
        *([f"buffer.capacity={envs * 100}"] if name == "qmix" else []),  # one batch, as the recipe
        *([f"threads={args.threads}"] if args.threads is not None else []),
    ]
    proc, seconds = timed(lambda: subprocess.run(command, capture_output=True, text=True))
    if proc.returncode != 0:
        return {"ok": False, "seconds": seconds, "error": proc.stderr[-3000:]}
    rows = read_metrics(run_dir / "metrics.csv")
    later = [r["frames_per_s"] for r in rows[1:]] or [r["frames_per_s"] for r in rows]
    return {
        "ok": True,
        "seconds": seconds,
        "frames": rows[-1]["frames"],
        "frames_per_s": statistics.median(later),
        "training_time_s": statistics.median(r["training_time"] for r in rows),
        "collection_time_s": statistics.median(r["collection_time"] for r in rows),
    }


def _training(name: str) -> Callable[[argparse.Namespace], dict]:
    def section(args: argparse.Namespace) -> dict:
        with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
            sides = {
                "device": _train(name, "device", args.device, args, pathlib.Path(folder)),
                "cpu": _train(name, "cpu", "cpu", args, pathlib.Path(folder)),
            }
        out: dict[str, Any] = {
            "computes": f"{SCRIPTS[name]} on native navigation (3 agents): collection, GAE or "
            "targets, epochs of minibatches, the same config on both sides but device and "
            "env.device",
            **sides,
        }
        if sides["device"]["ok"] and sides["cpu"]["ok"]:
            out["ratio_device_over_cpu"] = (
                sides["device"]["frames_per_s"] / sides["cpu"]["frames_per_s"]
            )
        return out

    return section


# --------------------------------------------------------------------------- simulation
def _stepper(name: str, side: str, device: str, num_envs: int) -> Callable[[], object]:
    """One random-action step of every env of ``name`` on ``device``, synchronised."""
    if name == "vmas":
        env = marlkit.make("vmas/navigation", num_envs=num_envs, seed=0, device=device)
    else:  # the device side: the torch twin (what runs on cuda); the cpu side: the kernels
        backend = "torch" if side == "device" else "auto"
        env = marlkit.make("navigation", num_envs=num_envs, seed=0, device=device, backend=backend)
    where = torch.device(device)
    state = {"td": env.reset()}

    def step() -> object:
        td = env.rand_action(state["td"])
        _, state["td"] = env.step_and_maybe_reset(td)
        _sync(where)
        return None

    step.env = env  # type: ignore[attr-defined]
    return step


def _simulation(name: str) -> Callable[[argparse.Namespace], dict]:
    def section(args: argparse.Namespace) -> dict:
        sides = {
            "device": _stepper(name, "device", args.device, args.num_envs),
            "cpu": _stepper(name, "cpu", "cpu", args.num_envs),
        }
        times = alternate_calls(sides, args.rounds, args.round_seconds, min_calls=3, warmup=3)
        backend = getattr(sides["device"].env, "backend", "torch")  # type: ignore[attr-defined]
        cpu_backend = getattr(sides["cpu"].env, "backend", "torch")  # type: ignore[attr-defined]
        for step in sides.values():
            step.env.close()  # type: ignore[attr-defined]
        rates = {k: args.num_envs / statistics.median(v) for k, v in times.items()}
        return {
            "computes": f"{'vmas/navigation' if name == 'vmas' else 'navigation'}, "
            f"{args.num_envs} envs, random actions, a step and the resets of done envs; "
            f"device side: {backend}, cpu side: {cpu_backend}",
            "env_steps_per_s": rates,
            **summary(times, "cpu", "device"),  # ratio > 1: the device is faster
        }

    return section


def main() -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=3, round_seconds=1.0)
    parser.add_argument(
        "--device", default="cuda", help="the accelerator (default cuda; cpu runs the same code)"
    )
    parser.add_argument(
        "--num-envs", type=positive(int), default=1024, help="envs of the simulation sections"
    )
    parser.add_argument(
        "--frames-per-batch",
        type=positive(int),
        default=6000,
        help="frames per training batch (envs x 100 steps; default 6000)",
    )
    parser.add_argument(
        "--iterations", type=positive(int), default=3, help="training batches (default 3)"
    )
    parser.add_argument(
        "--epochs", type=positive(int), default=5, help="epochs per batch (default 5)"
    )
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a torch device")
    report = start("gpu_check", args)
    report["cuda"] = torch.cuda.is_available()
    if device.type == "cuda" and not torch.cuda.is_available():
        report["skipped"] = (
            f"no CUDA on this machine (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}, torch.cuda.is_available() is False): nothing was run"
        )
        return finish(report)
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    sections: dict[str, Callable[[argparse.Namespace], dict]] = {
        **{name: _training(name) for name in SCRIPTS},
        "vmas": _simulation("vmas"),
        "native": _simulation("native"),
    }
    failed = []
    for name in args.only or SECTIONS:
        report[name] = sections[name](args)
        if any(isinstance(v, dict) and v.get("ok") is False for v in report[name].values()):
            failed.append(name)
        print(f"{name}: done", file=sys.stderr)
    if failed:
        report["failed"] = failed
    finish(report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
