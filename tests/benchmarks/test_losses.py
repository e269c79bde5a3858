"""benchmarks/losses.py runs and prints one JSON object (tiny budget)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

Run = Callable[..., dict[str, Any]]


def test_qmix_section_prints_json(run_benchmark: Run) -> None:
    data = run_benchmark("losses.py", "--only", "qmix", "--rounds", "1", "--steps", "1")["qmix"]
    assert data["minibatch"] == 400 and data["agents"] == 3
    assert data["marlkit_ms_per_step"] > 0 and data["plain_ms_per_step"] > 0
    assert "QMixerLoss" in data["work"]


def test_mappo_section_prints_json_with_the_activation_side(run_benchmark: Run) -> None:
    args = ("--only", "mappo", "--rounds", "1", "--round-seconds", "0.05")
    data = run_benchmark("losses.py", *args)["mappo"]
    sides = ("marlkit", "floor", "marlkit_torch_tanh", "marlkit_sigmoid_tanh", "marlkit_in_major")
    for side in sides:
        assert data[f"{side}_ms"] > 0
    for key in ("torch_tanh", "sigmoid_tanh", "in_major"):
        assert data[f"ratio_{key}_over_marlkit"] > 0
    assert data["tanh_method"] in ("torch", "sigmoid")
    assert "torch.nn.Tanh" in data["computes"]["marlkit_torch_tanh"]


def test_torchrl_side_without_torchrl_fails_naming_the_option(
    run_script: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    # marlkit's venv has no TorchRL: the peer's subprocess fails, and the error says so
    args = ("--only", "mappo", "--rounds", "1", "--round-seconds", "0.02")
    out = run_script("losses.py", *args, "--torchrl-python", sys.executable)
    assert out.returncode != 0
    assert "the TorchRL peer failed" in out.stderr
    assert "--torchrl-python must be a Python with torchrl installed" in out.stderr
    assert "No module named 'torchrl'" in out.stderr
