"""benchmarks/mpe_reference.py: PettingZoo MPE's reference levels, one JSON object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def test_mpe_reference_levels_print_json(run_benchmark: Callable[..., dict[str, Any]]) -> None:
    out = run_benchmark("mpe_reference.py", "--episodes", "3", timeout=120)
    assert out["episodes"] == 3
    # the rule heads for the landmarks and beats random actions (seeded: the same episodes)
    assert out["own_landmark_rule"]["mean"] > out["random"]["mean"]
