"""``marlkit record``: film a rollout of any registered env into an MP4 or a GIF.

``marlkit record ENV [--policy PATH|module:function] [--steps N] [--envs N --tile] [--agents N]
[--env-arg key=value ...] [--seed S] [--fps F] --out rollout.mp4|rollout.gif``

The command line (``marlkit.cli``) adds the subcommand with :func:`add_record_parser`, and builds
the env arguments of ``run`` and ``record`` alike with :func:`flag_env_kwargs`; ``marlkit demo``
films its navigation run with :func:`demo_video`. Errors in what the user gave (an unknown
env, an env that does not render, a bad policy, a bad suffix) exit with status 2 and one line
that says what was wrong; so does a video that cannot be written (a full disk: ``no space left
on the device for '<file>'``), which leaves no file behind.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import pathlib
import signal
import sys
import threading
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tqdm import tqdm

import marlkit
from marlkit.data.keys import ACTION, OBSERVATION
from marlkit.envs import EnvBase, StepCounter, TransformedEnv
from marlkit.envs.registry import agent_count_kwarg
from marlkit.record.recorder import RecordResult, record_rollout
from marlkit.record.video import open_video, prepare_path

__all__ = [
    "add_record_parser",
    "check_positive_flags",
    "demo_video",
    "flag_env_kwargs",
    "load_policy",
    "parse_env_args",
    "run_record",
]

Policy = Callable[[TensorDictBase], TensorDictBase]
_MAX_TILED_ENVS = 64
_SCRIPT_SUFFIXES = {".pt", ".pth", ".ts"}
_EXPORT_SUFFIX = ".pt2"


class RecordError(ValueError):
    """A bad ``marlkit record`` input; the CLI prints it and exits with status 2."""


def parse_env_args(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``--env-arg`` items: ``["n_agents=3", "mode=fast"]`` -> ``{"n_agents": 3,
    "mode": "fast"}``.

    Values are Python literals when they parse as one (``3``, ``0.5``, ``True``, ``None``,
    ``[1, 2]``), strings otherwise.
    """
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise RecordError(f"--env-arg takes key=value with a Python identifier, got {item!r}")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        kwargs[key] = value
    return kwargs


def flag_env_kwargs(
    env: str, flags: Mapping[str, Any], agents: int | None, env_args: Sequence[str]
) -> dict[str, Any]:
    """The keyword arguments of ``marlkit.make(env, ...)`` from the command line: ``flags`` (what
    the command's own flags set, e.g. ``{"num_envs": 4}``), ``--agents`` as the env's own
    agent-count keyword (:func:`~marlkit.envs.registry.agent_count_kwarg`: ``n_agents``, ``N``
    for MPE's simple_spread, ...), then the ``--env-arg`` items, which may not set any of those
    again.

    Raises:
        RecordError: the env has no agent-count keyword, an ``--env-arg`` repeats a flag or is
            not ``key=value``.
    """
    kwargs = dict(flags)
    if agents is not None:
        try:
            kwargs[agent_count_kwarg(env)] = agents
        except ValueError as err:
            raise RecordError(f"--agents: {err}; --env-arg KEY=VALUE sets any of them") from None
    extra = parse_env_args(env_args)
    if "seed" in extra:  # the commands seed the env (and the random actions) with --seed
        raise RecordError("--env-arg seed=...: use --seed, which also seeds the random actions")
    clash = sorted(set(extra) & set(kwargs))
    if clash:
        raise RecordError(f"--env-arg repeats {clash}, already set by their own flags")
    kwargs.update(extra)
    return kwargs


def check_positive_flags(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Refuse an integer flag (``args.<name>``) that is given and below 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise RecordError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


class _ScriptedPolicy:
    """A saved module applied to each group: ``(group, "action") = module(obs)``."""

    def __init__(self, module: Callable[..., Any], groups: Sequence[str], source: str):
        self.module = module
        self.groups = list(groups)
        self.source = source

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        for group in self.groups:
            obs = tensordict.get((group, OBSERVATION), None)
            if not isinstance(obs, torch.Tensor):
                raise RecordError(
                    f"the saved policy {self.source} maps (group, 'observation') tensors "
                    f"to actions, but group {group!r} has "
                    f"{'no observation' if obs is None else 'a nested observation'}; "
                    "use --policy module:function for such envs"
                )
            tensordict.set((group, ACTION), self.module(obs))
        return tensordict


def _load_saved(path: pathlib.Path, env: EnvBase) -> Policy:
    exported = path.suffix.lower() == _EXPORT_SUFFIX
    kind = "torch.export (.pt2)" if exported else "TorchScript"
    if not zipfile.is_zipfile(path):  # both are zip archives; torch would log a long traceback
        raise RecordError(f"--policy {str(path)!r} is not a {kind} file (not a zip archive)")
    try:
        if exported:
            module = torch.export.load(str(path)).module()
        else:
            # TorchScript still loads fine; torch >= 2.10 only warns that it is deprecated.
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=".*is deprecated", category=DeprecationWarning
                )
                module = torch.jit.load(str(path), map_location=env.device)
                module.eval()
    except (RuntimeError, ValueError, OSError, zipfile.BadZipFile) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RecordError(f"--policy {str(path)!r} is not a {kind} file ({first})") from None
    return _ScriptedPolicy(module, env.groups, repr(str(path)))


def _import_policy_module(spec: str, module_name: str) -> Any:
    """The module of ``--policy MODULE:function``: a dotted name (found on ``sys.path`` and in
    the current folder, like ``python -m``) or the path of a ``.py`` file."""
    if module_name.endswith(".py"):
        path = pathlib.Path(module_name)
        if not path.is_file():
            raise RecordError(f"--policy {spec!r}: no such file {module_name!r}")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        if loader_spec is None or loader_spec.loader is None:
            raise RecordError(f"--policy {spec!r}: cannot import {module_name!r}")
        module = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            raise RecordError(
                f"--policy {spec!r}: importing {module_name!r} raised {_first(err)}"
            ) from None
        return module
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        raise RecordError(f"--policy {spec!r}: cannot import {module_name!r} ({err})") from None
    except Exception as err:  # the module itself fails: a SyntaxError, an error at import
        raise RecordError(
            f"--policy {spec!r}: importing {module_name!r} raised {_first(err)}"
        ) from None


def _first(err: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _load_builder(spec: str, env: EnvBase) -> Policy:
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise RecordError(f"--policy {spec!r}: expected module:function, e.g. mypkg.policies:build")
    module = _import_policy_module(spec, module_name)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise RecordError(f"--policy {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise RecordError(f"--policy {spec!r}: {attr!r} is not callable")
    try:
        policy = target(env)
    except Exception as err:  # a builder with another signature, or one that fails
        raise RecordError(f"--policy {spec!r}: {attr}(env) raised {_first(err)}") from err
    if not callable(policy):
        raise RecordError(
            f"--policy {spec!r}: {attr}(env) must return a callable TensorDict -> TensorDict "
            f"policy, got {type(policy).__name__}"
        )
    return policy


def _is_builder(spec: str) -> bool:
    """``MODULE:function`` (the function a dotted name: ``C:\\policy.pt2`` is a file)."""
    _, sep, attr = spec.rpartition(":")
    return bool(sep) and all(part.isidentifier() for part in attr.split("."))


def load_policy(spec: str, env: EnvBase) -> Policy:
    """The policy named by ``--policy``.

    * a saved module, applied to each group's observation ``[*B, n, obs_dim]`` to give its
      action (``[*B, n, act_dim]``, or ``[*B, n]`` class indices for categorical actions): a
      ``torch.export`` program (``.pt2``, ``torch.export.save``; exported for the env's batch
      shape) or a TorchScript file (any other suffix, ``torch.jit.load``);
    * ``module:function``: ``function(env)`` returns a callable that reads the root TensorDict
      and writes the actions into it (e.g. a ``TensorDictModule``). The module is imported from
      ``sys.path`` and the current folder, or is the path of a ``.py`` file
      (``policies/mine.py:build``).

    Raises:
        RecordError: a missing file, a file that does not load, a module that does not import,
            a missing or non-callable function (a ``ValueError``).
    """
    path = pathlib.Path(spec)
    if path.is_file():
        return _load_saved(path, env)
    if _is_builder(spec) or spec.endswith(":"):
        return _load_builder(spec, env)
    if path.suffix.lower() in {*_SCRIPT_SUFFIXES, _EXPORT_SUFFIX} or os.sep in spec:
        raise RecordError(f"--policy {spec!r}: no such file")
    raise RecordError(
        f"--policy {spec!r} is neither an existing TorchScript file nor module:function"
    )


def _make_env(args: argparse.Namespace) -> EnvBase:
    flags = {} if args.envs is None else {"num_envs": args.envs}
    kwargs = flag_env_kwargs(args.env, flags, args.agents, args.env_arg or [])
    env = marlkit.make(args.env, **kwargs)
    if "rgb_array" not in env.render_modes and "render_mode" not in kwargs:
        # Adapters of simulators that choose the render mode at construction (PettingZoo,
        # Gymnasium) render only when asked: ask, and keep the first env if that is refused.
        try:
            rendering = marlkit.make(args.env, **kwargs, render_mode="rgb_array")
        except (TypeError, ValueError, KeyError):
            rendering = None
        if rendering is not None and "rgb_array" in rendering.render_modes:
            env.close()
            env = rendering
        elif rendering is not None:
            rendering.close()
    if args.seed is not None:
        env.set_seed(args.seed)
    if args.max_episode_steps is not None:
        env = TransformedEnv(env, StepCounter(max_steps=args.max_episode_steps))
    return env


def _indices(args: argparse.Namespace, env: EnvBase) -> tuple[list[int], bool]:
    n = env.batch_size.numel()
    if not args.tile:
        return [0], False
    if n > _MAX_TILED_ENVS:
        raise RecordError(
            f"--tile shows every env of the batch, at most {_MAX_TILED_ENVS}; this one has {n} "
            "(use --envs)"
        )
    return list(range(n)), True


class _Interrupted(Exception):
    """Ctrl-C during a rollout: it stopped after its step, and the video was finalised."""


class _StopOnInterrupt:
    """Within ``with``, a first Ctrl-C (SIGINT) asks the rollout to stop after its current step,
    so that the video is finalised (an MP4 whose ffmpeg is killed mid-frame has no index, and
    no player reads it); a second Ctrl-C interrupts at once. A no-op outside the main thread."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def check(self) -> None:
        """Raise :class:`_Interrupted` once a stop was asked for."""
        if self.requested:
            raise _Interrupted

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _partial_path(out: pathlib.Path) -> pathlib.Path:
    """Where a run films when ``out`` already exists: ``out`` is replaced only by a whole
    video (``clip.mp4`` -> ``clip.partial.mp4``; the suffix kept, it names the format)."""
    return out.with_name(f"{out.stem}.partial{out.suffix}")


def run_record(args: argparse.Namespace) -> int:
    """``marlkit record``: see the module docstring. Returns the exit status: 0, or 130 when
    Ctrl-C stopped the rollout (the frames filmed until then are kept). When the rollout fails
    after frames were written, ``args.kept_frames`` says where they are, and the error goes on.

    An existing ``--out`` is replaced only by a finished video: the run films into
    ``<stem>.partial<suffix>`` beside it, which a failed or interrupted run leaves there.
    """
    out = pathlib.Path(args.out)
    args.kept_frames = None
    check_positive_flags(args, ("steps", "envs", "agents", "max_episode_steps"))
    if not args.fps > 0:
        raise RecordError(f"--fps must be > 0, got {args.fps}")
    # An unknown suffix or a missing video extra fails before the env is made (no file yet).
    probe = open_video(out, fps=args.fps)
    probe.close()
    limit = getattr(probe, "max_frames", None)  # a GIF holds its frames in memory
    if limit is not None and args.steps + 1 > limit:
        raise RecordError(
            f"--steps {args.steps} films {args.steps + 1} frames, more than a GIF holds "
            f"({limit}, in memory until it is written): write an .mp4 for longer videos"
        )
    prepare_path(out)  # an unwritable --out fails now, with its reason, not at the first frame
    if args.seed is not None:
        torch.manual_seed(args.seed)
    env = _make_env(args)
    try:
        policy = _Reported(load_policy(args.policy, env), args.policy) if args.policy else None
        indices, tile = _indices(args, env)
    except BaseException:
        env.close()
        raise
    target = _partial_path(out) if out.exists() else out
    done = 0
    try:
        with (
            _StopOnInterrupt() as stop,
            tqdm(
                total=args.steps,
                desc=f"record {args.env}",
                unit="step",
                disable=args.no_progress,
                file=sys.stderr,
            ) as bar,
        ):

            def progress(n: int) -> None:
                nonlocal done
                done += n
                bar.update(n)
                stop.check()

            result = record_rollout(
                env,
                target,
                steps=args.steps,
                policy=policy,
                env_indices=indices,
                tile=tile,
                fps=args.fps,
                progress=progress,
            )
    except _Interrupted:
        kept = f"; the frames filmed are in {target}" if target.is_file() else ""
        left = f" ({out} was left as it was)" if target != out else ""
        print(f"marlkit record: interrupted after {done} steps{kept}{left}", file=sys.stderr)
        return 130
    except BaseException:
        args.kept_frames = target if target.is_file() else None
        raise
    if target != out:
        os.replace(target, out)
    print(_describe(result, len(indices), out))
    return 0


def _describe(result: RecordResult, envs: int, path: pathlib.Path) -> str:
    h, w = result.frame_size
    shown = f"{envs} envs tiled" if envs > 1 else "env 0"
    return (
        f"video written to {path} ({result.frames} frames of {w}x{h}, {result.steps} "
        f"steps, {shown})"
    )


def demo_video(
    path: str | os.PathLike[str], *, steps: int = 200, progress: bool = False
) -> RecordResult:
    """The ``marlkit demo`` video: navigation with 4 agents, 4 envs tiled, random actions,
    episodes of 100 steps, seed 0, 30 frames per second."""
    torch.manual_seed(0)
    base = marlkit.make("navigation", num_envs=4, n_agents=4, seed=0)
    env = TransformedEnv(base, StepCounter(max_steps=100))
    with tqdm(
        total=steps, desc="demo video", unit="step", disable=not progress, file=sys.stderr
    ) as bar:
        return record_rollout(
            env, path, steps=steps, env_indices="all", tile=True, progress=bar.update
        )


class _Reported:
    """A ``--policy`` whose failures (a shape its module was not made for, ...) are a
    :class:`RecordError` that names it: one line and status 2, as any user mistake."""

    def __init__(self, policy: Policy, spec: str):
        self.policy, self.spec = policy, spec

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        try:
            out = self.policy(tensordict)
        except RecordError:
            raise
        except Exception as err:
            text = str(err).strip()
            first = text.splitlines()[0] if text else ""
            raise RecordError(
                f"--policy {self.spec!r} failed on the env's data: {type(err).__name__}: {first}"
            ) from err
        if not isinstance(out, TensorDictBase):
            raise RecordError(
                f"--policy {self.spec!r} returned {type(out).__name__}, not the TensorDict: a "
                "policy writes the actions into the TensorDict it is given and returns it"
            )
        return out


def _cmd(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    try:
        return run_record(args)
    except (KeyError, ValueError, TypeError, ImportError, IndexError, OSError) as err:
        message = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        print(f"marlkit record: error: {message}", file=sys.stderr)
        kept = getattr(args, "kept_frames", None)
        if kept is not None:  # the rollout failed midway: its frames are kept
            left = f" ({out} was left as it was)" if kept != out else ""
            print(
                f"marlkit record: the frames recorded before the error are in {kept}{left}",
                file=sys.stderr,
            )
        return 2


def add_record_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``record`` to the ``marlkit`` subcommands (``sub`` from ``add_subparsers``)."""
    p = sub.add_parser(
        "record",
        help="film a rollout into an MP4 (H.264) or a GIF",
        description="Film a rollout of ENV (random actions unless --policy) into --out.",
    )
    p.add_argument("env", help="registered env name, e.g. navigation or vmas/navigation")
    p.add_argument("--out", required=True, help="the video file: .mp4 (H.264) or .gif")
    p.add_argument(
        "--policy",
        default=None,
        help="a saved module mapping each group's observation to its action (torch.export "
        ".pt2 or TorchScript .pt), or module:function, called as function(env), returning a "
        "TensorDict policy (default: random actions)",
    )
    p.add_argument("--steps", type=int, default=200, help="steps to film (default 200)")
    p.add_argument("--envs", type=int, default=None, help="envs in the batch (num_envs)")
    p.add_argument(
        "--agents",
        type=int,
        default=None,
        help="agents per env, as the env's own agent-count argument (n_agents, N, ...)",
    )
    p.add_argument("--tile", action="store_true", help="show every env of the batch, tiled")
    p.add_argument(
        "--env-arg",
        action="append",
        metavar="KEY=VALUE",
        help="keyword argument for marlkit.make (repeatable; values parsed as Python literals)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the env and torch (default 0)")
    p.add_argument("--fps", type=float, default=30.0, help="frames per second (default 30)")
    p.add_argument(
        "--max-episode-steps", type=int, default=None, help="truncate episodes at this length"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=_cmd)
    return p
