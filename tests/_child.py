"""The first code of a command started by ``_forked.py``: a forkserver child (torch,
tensordict, hydra and marlkit already imported) becomes ``python SCRIPT ARGS...`` (or ``python
-m MODULE ARGS...``) run from ``cwd`` with ``env``, its output in files, in a process group of
its own.

Run with ``runpy.run_path`` and ``init_globals={"CHILD": {...}}`` holding ``argv``, ``cwd``,
``env``, ``stdout`` and ``stderr`` (file paths; the same path merges them). Stdlib only.
"""

import atexit
import os
import runpy
import sys
import threading
import traceback
import warnings

SETTINGS = globals()["CHILD"]
ARGV: list[str] = SETTINGS["argv"]
CWD: str = SETTINGS["cwd"]
ENV: dict[str, str] = SETTINGS["env"]
STDOUT: str = SETTINGS["stdout"]
STDERR: str = SETTINGS["stderr"]


def _redirect() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    paths = {STDOUT: -1, STDERR: -1}
    for path in paths:
        paths[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(paths[STDOUT], 1)
    os.dup2(paths[STDERR], 2)
    for fd in paths.values():
        os.close(fd)


def _exit_code(stop: SystemExit) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _run() -> int:
    os.setsid()  # one group with the workers it starts: the tests kill it as one
    _redirect()
    os.environ.clear()
    os.environ.update(ENV)
    os.chdir(CWD)
    if "ignore::DeprecationWarning" in ENV.get("PYTHONWARNINGS", ""):
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        if ARGV[1] == "-m":  # sys.argv[0] becomes the module's file, as `python -m` makes it
            sys.argv = ARGV[2:]
            sys.path[0] = CWD
            runpy.run_module(ARGV[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ARGV[1:]
            sys.path[0] = os.path.dirname(os.path.abspath(ARGV[1]))  # as `python script` sets it
            runpy.run_path(ARGV[1], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop)
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: wait for threads, run the atexit handlers, flush.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


os._exit(_run())
