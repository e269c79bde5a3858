"""benchmarks/modules.py runs and prints one JSON object (tiny budget)."""

from __future__ import annotations

import pathlib
import shutil
import sys
from collections.abc import Callable
from typing import Any

import pytest

import _forked

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


def test_gru_section_prints_json(run_benchmark: Run) -> None:
    args = ("--only", "gru", "--rounds", "1", "--round-seconds", "0")
    data = run_benchmark("modules.py", *args)
    rows = data["gru"]
    assert [(r["case"], r["steps"], r["n_agents"]) for r in rows] == [
        ("lbf_mappo", 50, 2),
        ("smax_3m_8_rows", 128, 3),
        ("smax_3m_minibatch", 128, 3),
    ]
    assert [r["default_path"] for r in rows] == ["fused", "fused", "unrolled"]
    assert rows[0]["restarts_in_rows"] == 0 and rows[0]["torch_gru_calls"] == 1
    assert rows[1]["restarts_in_rows"] > 0 and rows[1]["torch_gru_calls"] > 1
    for row in rows:
        assert row["ratio_unrolled_over_fused"] > 0 and row["ratio_torch_nn_gru_over_fused"] > 0
    assert "_gru_sequence" in data["computes"]["gru"] and "mlp" not in data


def test_cnn_section_prints_json(run_benchmark: Run) -> None:
    args = ("--only", "cnn", "--cnn-batch", "2", "--cnn-agents", "2", "--cnn-size", "32")
    data = run_benchmark("modules.py", *args, "--rounds", "1", "--round-seconds", "0")
    cnn = data["cnn"]
    assert (cnn["batch"], cnn["n_agents"], cnn["image"]) == (2, 2, [3, 32, 32])
    assert cnn["output_features"] == 32  # 32 x 32 -> 14 -> 5 -> 1 x 1, 32 channels
    for side in ("grouped", "grouped_nchw", "vmap", "loop"):
        assert cnn[f"{side}_ms"] > 0
    for side in ("grouped_nchw", "vmap", "loop"):
        assert cnn[f"ratio_{side}_over_grouped"] > 0
    assert "torchrl_ms" not in cnn  # no --torchrl-python
    assert "MultiAgentConvNet" in data["computes"]["cnn"] and "mlp" not in data


def test_cnn_peer_without_torchrl_fails_with_a_message() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "modules.py"), "--only", "cnn"]
    cmd += ["--cnn-batch", "1", "--cnn-agents", "1", "--cnn-size", "32", "--rounds", "1"]
    # a "Python" that fails at once (a real one without torchrl fails the same way, slower)
    false = shutil.which("false")
    assert false is not None
    cmd += ["--round-seconds", "0", "--torchrl-python", false]
    out = _forked.run(cmd)
    assert out.returncode != 0
    assert "the TorchRL peer failed" in out.stderr
    assert "must be a Python with torchrl installed" in out.stderr


@pytest.mark.slow  # each cell is a spawned process that imports torch afresh
def test_attention_section_prints_json(run_benchmark: Run) -> None:
    args = ("--only", "attention", "--entities", "4", "--attention-rows", "2")
    data = run_benchmark("modules.py", *args, "--rounds", "1", "--round-seconds", "0")
    rows = data["attention"]
    assert [(r["entities"], r["depth"]) for r in rows] == [(4, 1), (4, 0)]
    for row in rows:
        assert row["ms"] > 0 and row["peak_mib"] >= 0 and row["rows"] == 2
