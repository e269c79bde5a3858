"""Running a training script of ``sota-implementations/`` as a user would, ``python SCRIPT
ARGS...`` in a process of its own (forked with the heavy imports done: ``tests/_forked.py``)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import _forked

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "sota-implementations"

#: Overrides that shrink any script to seconds: few envs, short episodes, CSV logs only.
TINY = (
    "threads=1",
    "eval.num_envs=2",
    "eval.fps=10",
    "logger.backends=[csv]",
)


def script(name: str) -> pathlib.Path:
    """``sota-implementations/<name>/<name>.py``."""
    return SCRIPTS / name / f"{name}.py"


def command(
    name: str, run_dir: pathlib.Path, overrides: Sequence[str], config: str | None = None
) -> list[str]:
    """The script's command line; ``config`` picks another file of ``configs/`` (--config-name)."""
    head = [sys.executable, str(script(name)), *(("--config-name", config) if config else ())]
    return [*head, *TINY, f"run_dir={run_dir}", *overrides]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.setdefault("MUJOCO_GL", "egl")
    out["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    out["WANDB_MODE"] = "offline"
    out["HYDRA_FULL_ERROR"] = "1"
    return out


def run(
    name: str,
    run_dir: pathlib.Path,
    overrides: Sequence[str],
    timeout: float = 300,
    config: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the script to the end; raise with its output when it fails."""
    argv = command(name, run_dir, overrides, config)
    proc = _forked.run(argv, cwd=ROOT, env=env(), timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def kill_after(
    name: str, run_dir: pathlib.Path, overrides: Sequence[str], line: str, timeout: float = 300
) -> str:
    """Start the script, SIGKILL it (and its workers) as soon as its output shows ``line``;
    returns the output."""
    out = _forked.run_until(
        command(name, run_dir, overrides), line, cwd=ROOT, env=env(), timeout=timeout
    )
    if line not in out:
        raise AssertionError(f"{name} never printed {line!r}:\n{out[-4000:]}")
    return out


def activation_types(module: Any) -> set[type]:
    """The classes of the activation layers in ``module`` (a script's actor, critic or
    Q-network): ``nn.Tanh`` (marlkit's ``Tanh`` is one), ``nn.ReLU``, ``nn.ELU``,
    ``nn.LeakyReLU``."""
    from torch import nn

    kinds = (nn.Tanh, nn.ReLU, nn.ELU, nn.LeakyReLU)
    return {type(m) for m in module.modules() if isinstance(m, kinds)}


def summary(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


class _Decreasing:
    """Equal to a sequence whose values never rise (a learned temperature)."""

    def __eq__(self, values: object) -> bool:
        return isinstance(values, list) and values == sorted(values, reverse=True)

    def __repr__(self) -> str:
        return "<values that never rise>"


DECREASING = _Decreasing()


@dataclass(frozen=True)
class Algorithm:
    """What the shared end-to-end tests (``test_scripts.py``) expect of one training script."""

    name: str
    #: Overrides for two iterations of 8 envs x 25 steps on native navigation (3 agents).
    budget: tuple[str, ...]
    #: ``summary.json``'s ``variant`` of the default config.
    variant: str
    #: The loss terms logged per group, ``train/<group>/<term>``.
    losses: tuple[str, ...]
    #: Other per-group training metrics, ``train/<group>/<name>``.
    logged: tuple[str, ...] = ()
    #: Other metrics columns.
    columns: tuple[str, ...] = ()
    #: Columns over the two iterations of ``budget`` (a value compares with ``==``).
    two_iterations: Mapping[str, Any] = field(default_factory=dict)
    #: Where the latest checkpoint holds the replay buffer of group ``agents``.
    checkpoint_replay: str | None = None
    #: ``replay/<group>/size`` after two iterations on predator_prey (None: no buffer).
    group_replay: int | None = None
    #: Overrides for the killed-and-resumed run of five iterations.
    resume_budget: tuple[str, ...] = ()
    #: Columns over those five iterations: what the checkpoint carries across the kill.
    resumed: Mapping[str, Any] = field(default_factory=dict)
    #: An env override of the wrong action kind, and the message that refuses it.
    wrong_actions: tuple[str, str] | None = None
    #: Whether its ``collector=multisync`` and ``collector=ray`` runs are tested (slow; every
    #: script builds its collector with ``marlkit.train.scripts.make_config_collector``, and
    #: MASAC's buffer and random frames are MADDPG's).
    other_collectors: bool = True


_BASE = ("env.num_envs=8", "env.max_steps=25", "collector.frames_per_batch=400")
_ON_POLICY = (*_BASE, "collector.total_frames=800", "train.epochs=2", "train.minibatch_size=200")
_OFF_POLICY = (
    *_BASE,
    "collector.total_frames=800",
    "collector.init_random_frames=400",  # the first iteration acts at random
    "buffer.size=4000",
    "train.num_updates=4",
    "train.minibatch_size=64",
)
_CELLS = ("policy.num_cells=32",)
_CRITIC = ("critic.num_cells=32",)
_Q_COLUMNS = ("eps", "replay/agents/size")
_Q_LOGGED = ("q_value", "target_value", "grad_norm")
#: eps 0.3 -> 0 over half the 800 frames: the second batch is collected greedily.
_EPS_TWO = [pytest.approx(0.3), pytest.approx(0.0, abs=1e-6)]
#: Five iterations with a two-batch buffer: eps 0.3 -> 0 over the first 1000 frames, and
#: the restored buffer is full at the first resumed iteration.
_Q_RESUMED = {
    "replay/agents/size": [400, 800, 800, 800, 800],
    "eps": pytest.approx([0.3, 0.18, 0.06, 0.0, 0.0], abs=1e-6),
}
_DISCRETE = (
    "+env.kwargs.continuous_actions=true",
    r"discrete actions are needed.*Bounded actions \(continuous_actions=True in its keyword",
)
_CONTINUOUS = (
    "+env.kwargs.continuous_actions=false",
    r"continuous actions are needed.* has Categorical actions \(continuous_actions=False",
)
_GROWING = [400, 800, 1200, 1600, 2000]  # a buffer larger than the run's frames

#: Every training script of ``sota-implementations/``, by name.
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "iql",
            (*_ON_POLICY, *_CELLS, "eval.every=1"),
            "IQL",
            losses=("loss",),
            logged=_Q_LOGGED,
            columns=_Q_COLUMNS,
            two_iterations={"replay/agents/size": [400, 400], "eps": _EPS_TWO},
            checkpoint_replay="replay/replay/agents/latest",
            group_replay=400,
            resume_budget=("buffer.capacity=800",),
            resumed=_Q_RESUMED,
            wrong_actions=_DISCRETE,
        ),
        Algorithm(
            "maddpg_iddpg",
            (*_OFF_POLICY, "exploration.annealing_fraction=1.0", *_CELLS, *_CRITIC, "eval.every=1"),
            "MADDPG",
            losses=("loss_actor", "loss_value"),
            logged=("q_value", "grad_norm", "sigma"),
            columns=("replay/agents/size",),
            two_iterations={
                "replay/agents/size": [400, 800],
                "train/agents/sigma": pytest.approx([1.0, 0.55]),
            },
            group_replay=800,
            resume_budget=("exploration.annealing_fraction=2.0",),  # 4000 frames
            resumed={
                "replay/agents/size": _GROWING,
                "train/agents/sigma": pytest.approx([1.0, 0.91, 0.82, 0.73, 0.64]),
            },
            wrong_actions=_CONTINUOUS,
        ),
        Algorithm(
            "mappo_ippo",
            (*_ON_POLICY, *_CELLS, *_CRITIC, "eval.every=1"),
            "MAPPO",
            losses=("loss_objective", "loss_critic"),
        ),
        Algorithm(
            "masac_isac",
            (*_OFF_POLICY, *_CELLS, *_CRITIC, "eval.every=1"),
            "MASAC",
            losses=("loss_actor", "loss_value", "loss_alpha"),
            logged=("alpha", "entropy", "grad_norm"),
            columns=("replay/agents/size",),
            two_iterations={"replay/agents/size": [400, 800]},
            group_replay=800,
            # log(alpha) and its optimiser come back too: the temperature goes on falling
            resumed={"replay/agents/size": _GROWING, "train/agents/alpha": DECREASING},
            wrong_actions=_CONTINUOUS,
            other_collectors=False,
        ),
        Algorithm(
            "qmix_vdn",
            (*_ON_POLICY, *_CELLS, "loss.mixing_embed_dim=8", "eval.every=1"),
            "QMIX",
            losses=("loss",),
            logged=_Q_LOGGED,
            columns=_Q_COLUMNS,
            two_iterations={"replay/agents/size": [400, 400], "eps": _EPS_TWO},
            checkpoint_replay="replay/replay/agents/latest",
            group_replay=400,
            resume_budget=("buffer.capacity=800",),
            resumed=_Q_RESUMED,
            wrong_actions=_DISCRETE,
        ),
    )
}


@dataclass(frozen=True)
class Finished:
    """A run of a script's ``budget`` to its end, with evaluations and videos."""

    run_dir: pathlib.Path
    stdout: str


_FINISHED: dict[str, Finished] = {}


def finished(name: str, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The finished run of ``ALGORITHMS[name].budget``, run once per test process: the shared
    end-to-end test checks it, a per-algorithm test reads what is its algorithm's own. Tests
    that write into a run (a resume) work on a copy (:func:`copy_run`)."""
    if name not in _FINISHED:
        run_dir = tmp_path_factory.mktemp(f"{name}-finished") / "run"
        _FINISHED[name] = Finished(run_dir, run(name, run_dir, ALGORITHMS[name].budget).stdout)
    return _FINISHED[name]


def copy_run(run_dir: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
    shutil.copytree(run_dir, to, symlinks=True)
    return to
