"""The ``marlkit`` command: ``list``, ``run``, ``demo``, ``record``, ``bench`` and ``experiment``.

``marlkit run navigation --agents 4 --envs 32 --steps 200`` steps a random policy with a progress
bar and prints env-steps/s, agent-steps/s and the mean episode reward of each group.
``marlkit --import mysim record mysim --out mysim.mp4`` first imports ``mysim`` (from the current
folder too), a module that registers an env of your own.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm import tqdm

import marlkit
from marlkit._files import write_bytes
from marlkit._utils import make_out_folder
from marlkit.bench._cli import add_bench_parser  # --- section: bench
from marlkit.data.keys import DONE, EPISODE_REWARD, NEXT
from marlkit.envs import EnvBase, RewardSum, StepCounter, TransformedEnv
from marlkit.envs._memory import check_on_probe
from marlkit.envs.registry import UnknownEnvError, registered, registered_adapters
from marlkit.record._cli import (
    add_record_parser,
    check_positive_flags,
    demo_video,
    flag_env_kwargs,
)

__all__ = ["RunSummary", "check_memory", "main", "run_random"]


@dataclass
class RunSummary:
    """What ``marlkit run`` measured."""

    env: str
    num_envs: int
    agents: dict[str, int]
    steps: int
    seconds: float
    env_steps_per_s: float
    agent_steps_per_s: float
    episodes: dict[str, int] = field(default_factory=dict)
    mean_episode_reward: dict[str, float] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        lines = [
            f"env            {self.env}  ({self.num_envs} envs, agents {self.agents})",
            f"steps          {self.steps} in {self.seconds:.2f} s",
            f"env-steps/s    {self.env_steps_per_s:,.0f}",
            f"agent-steps/s  {self.agent_steps_per_s:,.0f}",
        ]
        for group, value in self.mean_episode_reward.items():
            episodes = self.episodes.get(group, 0)
            if episodes:
                lines.append(f"mean episode reward [{group}]  {value:.4f}  ({episodes} episodes)")
            else:  # the running returns: not an episode's reward
                lines.append(
                    f"mean episode reward [{group}]  no episode ended in {self.steps} steps "
                    f"(return so far {value:.4f}; more --steps, or --max-episode-steps)"
                )
        return "\n".join(lines)


def check_memory(name: str, seed: int = 0, **env_kwargs: Any) -> None:
    """Refuse a batch of envs that would not fit in memory, before making it.

    Above :data:`~marlkit.envs._memory.PROBE_ENVS` envs, one env of ``name`` is made with the
    same arguments, and what its specs hold per env, times
    :data:`~marlkit.envs._memory.SPEC_FACTOR` (at most what an env takes, measured), is scaled
    to ``num_envs``: more than the memory available now (Linux's ``MemAvailable``, a CUDA
    device's free memory) is refused instead of a run that swaps, or that the kernel's
    out-of-memory killer ends (:func:`~marlkit.envs._memory.check_on_probe`). The native
    scenarios and the adapters check their own batches the same way when they are made.

    Raises:
        ValueError: the estimate exceeds the available memory; the message gives both and the
            most envs that would fit.
    """
    envs = env_kwargs.get("num_envs")
    if isinstance(envs, int):
        probe_kwargs = {**env_kwargs, "num_envs": 1}
        check_on_probe(
            name, envs, lambda: marlkit.make(name, seed=seed, **probe_kwargs), count="--envs"
        )


def run_random(
    name: str,
    *,
    steps: int = 200,
    max_episode_steps: int = 100,
    seed: int = 0,
    progress: bool = True,
    **env_kwargs: Any,
) -> RunSummary:
    """Step a random policy on ``marlkit.make(name, **env_kwargs)`` and measure it.

    Episodes are truncated at ``max_episode_steps``. The mean episode reward of a group is over
    finished episodes (and over the group's agents); when none finished, over the running sums.
    """
    base = marlkit.make(name, seed=seed, **env_kwargs)
    env = TransformedEnv(base, [StepCounter(max_steps=max_episode_steps), RewardSum()])
    env.validate_actions = False
    try:
        return _measure(name, env, steps, progress, env_kwargs)
    finally:
        env.close()


def _measure(
    name: str, env: EnvBase, steps: int, progress: bool, env_kwargs: dict[str, Any]
) -> RunSummary:
    groups = env.groups
    sums = {g: torch.zeros((), dtype=torch.float64) for g in groups}
    counts = dict.fromkeys(groups, 0)
    td = env.reset()
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=name, unit="step", disable=not progress, file=sys.stderr)
    for _ in bar:
        td = env.rand_action(td)
        transition, td = env.step_and_maybe_reset(td)
        done = transition.get((NEXT, DONE)).reshape(env.batch_size)
        if bool(done.any()):
            for g in groups:
                ep = transition.get((NEXT, g, EPISODE_REWARD))[done]
                sums[g] += ep.reshape(ep.shape[0], -1).mean(-1).sum().double()
                counts[g] += int(ep.shape[0])
    seconds = max(time.perf_counter() - start, 1e-9)
    means = {}
    for g in groups:
        if counts[g]:
            means[g] = float(sums[g] / counts[g])
        else:  # no episode finished: report the running sums
            means[g] = float(td.get((g, EPISODE_REWARD)).double().mean())
    num_envs = int(torch.Size(env.batch_size).numel())
    n_agents = sum(len(a) for a in env.group_map.values())
    return RunSummary(
        env=name,
        num_envs=num_envs,
        agents={g: len(a) for g, a in env.group_map.items()},
        steps=steps,
        seconds=seconds,
        env_steps_per_s=steps * num_envs / seconds,
        agent_steps_per_s=steps * num_envs * n_agents / seconds,
        episodes=counts,
        mean_episode_reward=means,
        env_kwargs=env_kwargs,
    )


def _cmd_list(args: argparse.Namespace) -> int:
    entries, adapters = registered(), registered_adapters()
    width = max([len(n) for n in entries] + [len(n) + 2 for n in adapters] + [10])
    print("native scenarios:")
    for name, entry in entries.items():
        print(f"  {name:<{width}}  {entry.description}")
    print("adapters (make('<adapter>/<scenario>')):")
    for name, adapter in adapters.items():
        print(f"  {name + '/':<{width}}  {adapter.description}")
        if not adapter.available:
            print(f"  {'':<{width}}  unavailable: {adapter.install_hint}")
            continue
        scenarios = adapter.list_scenarios()
        shown = scenarios if args.all else scenarios[:12]
        more = (
            f" ... and {len(scenarios) - len(shown)} more (--all)"
            if len(shown) < len(scenarios)
            else ""
        )
        if shown:
            print(f"  {'':<{width}}  {', '.join(shown)}{more}")
    return 0


def _env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {"num_envs": args.envs}
    if args.discrete:
        flags["continuous_actions"] = False
    if args.device:
        flags["device"] = args.device
    return flag_env_kwargs(args.env, flags, args.agents, args.env_arg)


def _summary_path(out: str) -> pathlib.Path:
    """``run --out``: a ``.json`` file, or a folder that gets ``summary.json``; made now, so
    that an unusable one fails before the run."""
    path = pathlib.Path(out)
    if path.suffix.lower() == ".json" and not path.is_dir():
        make_out_folder(path.parent)
        return path
    return make_out_folder(path) / "summary.json"


def _write_summary(summary: RunSummary, path: pathlib.Path) -> pathlib.Path:
    """Write ``summary.json``, its space reserved first: a full disk is an error naming the file
    and the bytes needed (ENOSPC), and leaves no empty file."""
    data = (json.dumps(asdict(summary), indent=2) + "\n").encode()
    write_bytes(path, [memoryview(data)], len(data))
    return path


def _cmd_run(args: argparse.Namespace) -> int:
    target = _summary_path(args.out) if args.out else None
    check_memory(args.env, seed=args.seed, **_env_kwargs(args))
    summary = run_random(
        args.env,
        steps=args.steps,
        max_episode_steps=args.max_episode_steps,
        seed=args.seed,
        progress=not args.no_progress,
        **_env_kwargs(args),
    )
    print(summary.table())
    if target is not None:
        print(f"summary written to {_write_summary(summary, target)}")
    return 0


def _new_run_dir(root: pathlib.Path) -> pathlib.Path:
    """A fresh ``root/<YYYYmmdd-HHMMSS>`` folder; ``-2``, ``-3``, ... for runs in one second,
    so that no run overwrites another's outputs."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    make_out_folder(root)
    for n in range(1, 1000):
        out = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            out.mkdir()
        except FileExistsError:
            continue
        return out
    raise RuntimeError(f"{root} already holds 999 runs stamped {stamp}")


def _cmd_demo(args: argparse.Namespace) -> int:
    out = _new_run_dir(pathlib.Path(args.out))
    summary = run_random(
        "navigation",
        steps=args.steps,
        max_episode_steps=100,
        seed=0,
        progress=not args.no_progress,
        num_envs=32,
        n_agents=4,
    )
    print(summary.table())
    path = _write_summary(summary, out / "summary.json")
    # --- section: record (the demo video)
    try:
        video = demo_video(out / "rollout.mp4", steps=args.steps, progress=not args.no_progress)
    except ImportError as err:  # the video extra is missing: the summary still stands
        print(f"no video: {err}", file=sys.stderr)
        print(f"demo outputs in {out}/ ({path.name})")
        return 0
    print(f"summary: {path}")
    print(f"video:   {video.path} ({video.frames} frames, 4 envs tiled)")
    # --- end section: record
    print(f"demo outputs in {out}/ ({path.name}, {video.path.name})")
    return 0


# --- section: experiment
def _cmd_experiment_run(args: argparse.Namespace) -> int:
    from marlkit.train.experiment import (
        Experiment,
        GridFolderInUse,
        Progress,
        format_progress,
        format_summary,
    )

    exp = Experiment(
        args.grid,
        args.out,
        launcher=args.launcher,
        parallel=args.parallel,
        threads=args.threads,
        ray_address=args.ray_address,
    )
    print(f"grid {exp.grid.name}: {len(exp.grid.runs())} runs in {exp.grid_dir}", flush=True)
    tty = sys.stdout.isatty() and not args.no_progress
    shown: list[Any] = [None, 0.0]  # the counts last printed, and when

    def progress(p: Progress) -> None:
        counts, now = (p.done, p.running, p.failed), time.monotonic()
        if tty:
            print(f"\r{format_progress(p)}\033[K", end="", flush=True)
        elif not args.no_progress and (counts != shown[0] or now - shown[1] > 60):
            print(format_progress(p), flush=True)
            shown[:] = [counts, now]

    try:
        entries = exp.run(progress=progress)
    except GridFolderInUse as err:
        print(f"marlkit: error: {err}", file=sys.stderr)
        return 2
    if tty:
        print()
    print(format_summary(entries, exp.grid_dir))
    return 1 if any(e["status"] != "done" for e in entries) else 0


def _cmd_experiment_status(args: argparse.Namespace) -> int:
    from marlkit.train.experiment import format_summary, read_index

    entries = read_index(args.dir)
    for e in entries:
        print(f"{e['status']:<8} {e['name']}")
    print(format_summary(entries, args.dir))
    return 0


def _cmd_experiment_report(args: argparse.Namespace) -> int:
    from marlkit.train.report import write_report

    print(f"report: {write_report(args.dir)}")
    return 0


def _add_experiment_parser(sub: Any) -> None:
    p_exp = sub.add_parser(
        "experiment", help="task x algorithm x seed grids of training runs (docs/experiments.md)"
    )
    exp = p_exp.add_subparsers(dest="experiment_command", required=True)
    p_run = exp.add_parser(
        "run", help="run a grid's runs not done yet (finished ones skipped, killed ones resumed)"
    )
    p_run.add_argument("grid", help="the grid's YAML file (sota-implementations/grids/)")
    p_run.add_argument(
        "--out", default=None, help="the grid folder (default runs/experiments/<grid name>)"
    )
    p_run.add_argument(
        "--launcher",
        choices=["local", "ray"],
        default="local",
        help="local processes, or one Ray task per run (default local)",
    )
    p_run.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="runs at a time (default: the cores over the threads per run; Ray: its CPUs)",
    )
    p_run.add_argument(
        "--threads", type=int, default=None, help="threads per run (default the grid's, or fit)"
    )
    p_run.add_argument(
        "--ray-address", default=None, help="the Ray cluster (default RAY_ADDRESS, else local)"
    )
    p_run.add_argument("--no-progress", action="store_true", help="hide the progress display")
    p_run.set_defaults(func=_cmd_experiment_run)
    p_status = exp.add_parser("status", help="the runs of a grid folder and where each stands")
    p_status.add_argument("dir", help="the grid folder")
    p_status.set_defaults(func=_cmd_experiment_status)
    p_report = exp.add_parser(
        "report", help="statistics and plots of a grid folder's runs (marlkit.train.report)"
    )
    p_report.add_argument("dir", help="the grid folder")
    p_report.set_defaults(func=_cmd_experiment_report)


# --- end section: experiment


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marlkit", description="TensorDict-first multi-agent RL: run and inspect envs."
    )
    parser.add_argument("--version", action="version", version=f"marlkit {marlkit.__version__}")
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (repeatable; the current folder is searched too): a module "
        "that registers envs of your own with marlkit.register",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser("list", help="list native scenarios and adapters")
    p_list.add_argument("--all", action="store_true", help="every scenario of each adapter")
    p_list.set_defaults(func=_cmd_list)

    p_run = sub.add_parser("run", help="step a random policy and report throughput and rewards")
    p_run.add_argument("env", help="registered env name (see `marlkit list`)")
    p_run.add_argument(
        "--agents",
        type=int,
        default=None,
        help="agents per env, as the env's own agent-count argument (n_agents for native "
        "scenarios and VMAS, N for MPE's simple_spread, ...; default the env's)",
    )
    p_run.add_argument("--envs", type=int, default=32, help="envs in the batch (default 32)")
    p_run.add_argument("--steps", type=int, default=200, help="steps to run (default 200)")
    p_run.add_argument(
        "--max-episode-steps", type=int, default=100, help="truncate episodes (default 100)"
    )
    p_run.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the env and its random actions: the same seed repeats the run (default 0)",
    )
    p_run.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other constructor argument, e.g. --env-arg n_prey=4 (repeatable)",
    )
    p_run.add_argument("--discrete", action="store_true", help="discrete actions")
    p_run.add_argument("--device", default=None, help="torch device (default the env's)")
    p_run.add_argument(
        "--out",
        default=None,
        help="where the summary goes: a .json file, or a folder for summary.json",
    )
    p_run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p_run.set_defaults(func=_cmd_run)

    p_demo = sub.add_parser(
        "demo",
        help="a random policy on native navigation: throughput, episode rewards and a tiled video "
        "in seconds (`make demo` trains a policy)",
    )
    p_demo.add_argument("--out", default="runs", help="parent folder of the run (default runs)")
    p_demo.add_argument("--steps", type=int, default=200, help="steps to run (default 200)")
    p_demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p_demo.set_defaults(func=_cmd_demo)
    add_record_parser(sub)  # --- section: record
    add_bench_parser(sub)  # --- section: bench
    _add_experiment_parser(sub)  # --- section: experiment
    return parser


def _import_modules(modules: Sequence[str]) -> None:
    """Import each of ``modules`` (``--import``), from the current folder too, as ``python -m``
    would.

    Raises:
        ImportError: a module that does not import, or whose code raises at import; the
            message names the flag (and where the module's error was raised).
    """
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ImportError(f"--import {module}: {err}") from err
        except Exception as err:  # the module's own code failed: say what and where
            text = str(err).strip().splitlines()
            where = traceback.extract_tb(err.__traceback__)[-1]
            raise ImportError(
                f"--import {module} raised {type(err).__name__}"
                f"{': ' + text[0] if text else ''} (at {where.filename}:{where.lineno})"
            ) from err


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``marlkit`` command; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _import_modules(args.imports)
        check_positive_flags(args, ("agents", "envs", "steps", "max_episode_steps"))
        return int(args.func(args))
    # UnknownEnvError (a KeyError), bad values, a missing extra, an --out that cannot be
    # written (OSError): one line, status 2
    except (UnknownEnvError, ValueError, TypeError, ImportError, OSError) as err:
        print(f"marlkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
