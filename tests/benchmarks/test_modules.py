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
    assert "mlp" not in data  # the MLP section did not run


def test_mlp_section_prints_json(run_benchmark: Run) -> None:
    args = ("--only", "mlp", "--agents", "2", "--cells", "8", "--batch", "4", "--rounds", "1")
    data = run_benchmark("modules.py", *args, "--round-seconds", "0")
    (row,) = data["mlp"]
    assert (row["n_agents"], row["num_cells"], row["batch"]) == (2, 8, 4)
    assert row["ratio_loop_over_batched"] > 0 and row["ratio_batched_one_call_over_batched"] > 0
    assert data["allocator"] == "glibc defaults" and "activation" not in data
