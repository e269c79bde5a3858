"""benchmarks/render.py: the renderer's kernel against its NumPy twin (tiny frames)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_render_benchmark_prints_both_backends(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--size", "32", "--agents", "4", "--envs", "2", "--batch-size", "16"]
    args += ["--rounds", "1", "--round-seconds", "0", "--min-steps", "1", "--threads", "1"]
    data = run_benchmark("render.py", *args)
    cells = data["cells"]
    for cell in ("frame", "batch"):
        assert cells[cell]["native"]["ms"] > 0 and cells[cell]["numpy_over_native"] > 0
    assert cells["env_render"]["native"]["ms"] > 0 and cells["env_render"]["agents"] == 4
    assert data["environment"]["native_threads"] in (1, None)  # None: no extension built
