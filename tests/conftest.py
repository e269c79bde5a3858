"""Session-wide test settings."""

from __future__ import annotations

import multiprocessing
import pathlib
import sys

import pytest

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
    "marlkit.replay",
    "marlkit.bench",
]


def pytest_configure(config: pytest.Config) -> None:
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
