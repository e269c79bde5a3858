"""marlkit.native.set_threads: the thread count the training scripts' ``threads=`` and the
benchmarks' ``--threads`` set, for torch and the native kernels alike."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import marlkit.bench
from marlkit.native import set_threads


def test_sets_torch_and_native_threads_and_none_leaves_both() -> None:
    code = textwrap.dedent(
        """
        import torch
        from marlkit.native import get_num_threads, set_threads
        before = (torch.get_num_threads(), get_num_threads())
        set_threads(None)
        assert (torch.get_num_threads(), get_num_threads()) == before, before
        set_threads(1)
        assert (torch.get_num_threads(), get_num_threads()) == (1, 1)
        set_threads(3)
        assert (torch.get_num_threads(), get_num_threads()) == (3, 3)
        """
    )  # a fresh process: the settings are process-wide
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError), ("2", TypeError)],
)
def test_bad_thread_counts_are_named(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"threads must be an int >= 1 or None, got"):
        set_threads(bad)  # type: ignore[arg-type]


def test_the_benchmark_harness_does_not_keep_a_copy() -> None:
    assert not hasattr(marlkit.bench, "set_threads")
