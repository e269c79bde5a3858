"""benchmarks/losses.py runs and prints one JSON object (tiny budget)."""

from __future__ import annotations

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
    for side in ("marlkit", "floor", "marlkit_torch_tanh", "marlkit_in_major"):
        assert data[f"{side}_ms"] > 0
    assert data["ratio_torch_tanh_over_marlkit"] > 0 and data["ratio_in_major_over_marlkit"] > 0
    assert "torch.nn.Tanh" in data["computes"]["marlkit_torch_tanh"]
