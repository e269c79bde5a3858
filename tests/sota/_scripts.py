"""Running a training script of ``sota-implementations/`` as a user would, ``python SCRIPT
ARGS...`` in a process of its own (forked with the heavy imports done: ``tests/_forked.py``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence

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


def summary(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
