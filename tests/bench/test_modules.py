"""benchmarks/modules.py runs and prints one JSON object (tiny budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Run = Callable[..., dict[str, Any]]


def test_layout_and_activation_sections_print_json(run_benchmark: Run) -> None:
    args = ("--only", "layout", "--only", "activation", "--rounds", "1", "--round-seconds", "0.02")
    data = run_benchmark("modules.py", *args)
    layout = data["layout"]
    assert [(r["stacks"], r["rows"], r["out"]) for r in layout] == [
        (s, rows, out) for s, rows in ((1, 1200), (3, 400)) for out in (1, 4, 9)
    ]
    for row in layout:
        assert row["in_major_ms"] > 0 and row["out_major_ms"] > 0
        assert row["ratio_in_major_over_out_major"] > 0
    assert "out-major" in data["computes"]["layout"]
    activation = data["activation"]
    assert activation["sigmoid_max_abs_error_vs_float64"] < 2e-7
    assert activation["auto_method"] == data["tanh_method"] in ("torch", "sigmoid")
    assert activation["faster_here_forward_backward"] in ("torch", "sigmoid")
    assert activation["forward_backward"]["sigmoid_forward_backward_ms"] > 0
    assert "results" not in data  # the MLP section did not run
