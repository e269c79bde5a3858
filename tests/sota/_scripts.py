"""Running a training script of ``sota-implementations/`` in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

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
    proc = subprocess.run(
        command(name, run_dir, overrides, config),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def kill_after(
    name: str, run_dir: pathlib.Path, overrides: Sequence[str], line: str, timeout: float = 300
) -> str:
    """Start the script, SIGKILL it as soon as its output shows ``line``; returns the output."""
    proc = subprocess.Popen(
        command(name, run_dir, overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env(),
        start_new_session=True,  # kill its worker processes too
    )
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None
        for text in proc.stdout:
            seen.append(text)
            if line in text or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    out = "".join(seen)
    if line not in out:
        raise AssertionError(f"{name} never printed {line!r}:\n{out[-4000:]}")
    return out


def summary(run_dir: pathlib.Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())
