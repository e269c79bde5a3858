"""``python SCRIPT ARGS...`` (or ``python -m MODULE ARGS...``) as the tests run the project's
commands (training scripts, benchmarks, the ``marlkit`` command), without a new interpreter's
imports: a process forked from the multiprocessing forkserver, which imported torch,
tensordict, hydra and marlkit once for the session (``conftest.py``). A fresh interpreter spends
most of a short command importing them (10 of 13 s of a tiny training run on a slow machine).

``_child.py`` makes the fork the command's own process: ``sys.argv``, ``sys.path[0]``, the
working directory, the environment, its output in files, its own process group, the script or
module as ``__main__``, and the interpreter's exit (threads joined, atexit handlers, the exit
status). What still needs a new interpreter (a setting read at import, an interpreter flag)
runs in a real ``subprocess``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pathlib
import runpy
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

_CHILD = pathlib.Path(__file__).with_name("_child.py")


def start(
    argv: Sequence[str],
    *,
    stdout: pathlib.Path,
    stderr: pathlib.Path,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> multiprocessing.Process:
    """Start ``argv`` (``[python, script, *args]`` or ``[python, "-m", module, *args]``); its
    output goes to the files ``stdout`` and ``stderr`` (the same path merges them). The process
    leads its own process group (:func:`kill_group`)."""
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        raise ValueError(f"expected [python, script, ...] or [python, -m, module, ...], got {argv}")
    child = multiprocessing.get_context("forkserver").Process(
        target=runpy.run_path,
        args=(str(_CHILD),),
        kwargs={
            "run_name": "_child",
            "init_globals": {
                "CHILD": {
                    "argv": [str(a) for a in argv],
                    "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                    "env": dict(env if env is not None else os.environ),
                    "stdout": str(stdout),
                    "stderr": str(stderr),
                }
            },
        },
        name=pathlib.Path(argv[2] if argv[1] == "-m" else argv[1]).stem,
    )
    child.start()
    return child


def kill_group(child: multiprocessing.Process) -> None:
    """SIGKILL the child's process group (it and the workers it started), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(30)


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """As ``subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
    timeout=timeout)``: the exit status and output, unchecked; ``subprocess.TimeoutExpired``
    (the process group killed) past ``timeout`` seconds."""
    logs = pathlib.Path(tempfile.mkdtemp(prefix="marlkit-run-"))
    try:
        stdout, stderr = logs / "stdout", logs / "stderr"
        child = start(argv, stdout=stdout, stderr=stderr, cwd=cwd, env=env)
        child.join(timeout)
        if child.exitcode is None:
            kill_group(child)
            raise subprocess.TimeoutExpired(list(argv), timeout, _read(stdout), _read(stderr))
        assert child.exitcode is not None
        return subprocess.CompletedProcess(list(argv), child.exitcode, _read(stdout), _read(stderr))
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def run_until(
    argv: Sequence[str],
    line: str,
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> str:
    """Start ``argv``, SIGKILL its process group as soon as its output (stdout and stderr,
    merged) shows ``line``, or when it ends or ``timeout`` passes; returns the output."""
    logs = pathlib.Path(tempfile.mkdtemp(prefix="marlkit-run-"))
    output = logs / "output"
    try:
        child = start(argv, stdout=output, stderr=output, cwd=cwd, env=env)
        deadline = time.monotonic() + timeout
        seen = ""
        try:
            while line not in seen and child.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
                seen = _read(output)
        finally:
            kill_group(child)
        return _read(output)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _read(path: pathlib.Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
