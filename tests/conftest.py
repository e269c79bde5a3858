"""Session-wide test settings."""

from __future__ import annotations

import multiprocessing
import pathlib
import random
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

# The tests' shared helpers (_forked.py) import as top-level modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))

#: What the multiprocessing forkserver imports once, for every process the tests start from it:
#: the collectors' workers (``start_method="forkserver"``) and the runs of the training scripts,
#: the benchmarks and the ``marlkit`` command (``_forked.py``), each of which would otherwise
#: spend seconds importing torch, tensordict and hydra. Nothing here starts a thread at import
#: (NumPy's OpenBLAS pool, which is fork-safe, aside), so forking is safe.
FORKSERVER_PRELOAD = [
    "pytest",  # the children re-import the parent's __main__ (python -m pytest)
    "torch",
    "tensordict",
    "tensordict.nn",
    "omegaconf",
    "hydra",
    "marlkit.collectors",
    "marlkit.envs",
    "marlkit.modules",
    "marlkit.objectives",
    "marlkit.record",
    "marlkit.train",
    "marlkit.replay",
    "marlkit.bench",
]


def pytest_configure(config: pytest.Config) -> None:
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)


@pytest.fixture(autouse=True)
def _same_random_state() -> None:
    """Every test starts from the same global random state, whichever tests ran before it in
    its process: `make test` hands tests to two xdist processes in no fixed order, and a test's
    unseeded draws must not depend on that order."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _starts_ray(nodeid: str) -> bool:
    """Whether a test may start a local Ray: test_ray.py, a training script's ``collector=ray``
    run (``[ray]``, ``[<script>-ray]``), and docs/collectors.md, run as a page
    (``[docs/collectors.md]``) or block by block as scripts (``[docs/collectors.md:<line>]``)."""
    return (
        "/collectors/test_ray.py::" in nodeid
        or nodeid.endswith(("[ray]", "-ray]"))
        or "[docs/collectors.md" in nodeid
    )


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (`make test` runs on -n 2)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Balance tests one by one over the xdist processes (as ``--dist load``), except those that
    start a Ray: one process runs them all, one after the other, so one Ray runs at a time and
    test_ray.py's module-wide Ray starts once. (``--dist loadgroup`` would do it with marks, but
    it renames node ids, which pytest 9.2 no longer lets a plugin do.)"""
    if config.getvalue("dist") != "load":  # another --dist asked for: xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RayTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "ray" if _starts_ray(nodeid) else nodeid

    return RayTogether(config, log)  # type: ignore[arg-type]


@pytest.fixture
def small_fs(tmp_path: pathlib.Path) -> Iterator[Callable[[int], pathlib.Path]]:
    """``small_fs(size)``: a new folder on a tmpfs of ``size`` bytes (rounded up to pages), for
    tests of a full disk; unmounted afterwards. Skipped where this process cannot mount one
    (not root, or a container without the capability)."""
    mounts: list[pathlib.Path] = []

    def make(size: int) -> pathlib.Path:
        point = tmp_path / f"small-fs-{len(mounts)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            why = done.stderr.strip() or done.returncode
            pytest.skip(f"cannot mount a small tmpfs here: {why}")
        mounts.append(point)
        return point

    yield make
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
