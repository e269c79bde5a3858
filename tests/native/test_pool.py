"""The kernels' thread pool, tested on its own: ``pool_stress.cpp`` drives ``parallel_for`` with
many short jobs (shorter than a pooled thread takes to wake, so workers often come late),
exceptions, nesting and two callers at once, and checks that every task ran exactly once. It is
built from the same header the extension uses, under ThreadSanitizer when the compiler has it
(a data race in the pool's lock-free job handover then fails the test), and once optimised."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = pathlib.Path(__file__).with_name("pool_stress.cpp")


def _compiler() -> str:
    cxx = (sysconfig.get_config_var("CXX") or "").split()
    for candidate in (*cxx[:1], "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    pytest.skip("no C++ compiler on PATH (the extension's build needs one too)")


def _build(tmp_path: pathlib.Path, name: str, flags: list[str]) -> pathlib.Path | None:
    exe = tmp_path / name
    cmd = [_compiler(), "-std=c++17", "-pthread", f"-I{ROOT / 'csrc' / 'include'}", *flags]
    done = subprocess.run(
        [*cmd, str(SOURCE), "-o", str(exe)], capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        if "-fsanitize=thread" in flags:
            return None  # no ThreadSanitizer runtime here
        raise AssertionError(f"building {SOURCE.name} failed:\n{done.stderr[-3000:]}")
    return exe


def _run(exe: pathlib.Path, divide: int = 1) -> None:
    """Run the stress test, its job counts divided by ``divide``."""
    done = subprocess.run(
        [str(exe), str(divide)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"{exe.name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )


def test_pool_optimised(tmp_path: pathlib.Path) -> None:
    exe = _build(tmp_path, "pool_o2", ["-O2"])
    assert exe is not None
    _run(exe)


@pytest.mark.slow
def test_pool_under_thread_sanitizer(tmp_path: pathlib.Path) -> None:
    exe = _build(tmp_path, "pool_tsan", ["-O1", "-g", "-fsanitize=thread"])
    if exe is None:
        pytest.skip("the compiler cannot build with -fsanitize=thread here")
    _run(exe, divide=4)  # ThreadSanitizer's 10x slowdown: a quarter of the jobs, ~15 s
