"""benchmarks/smax.py: smax/5m_vs_6m against JaxMARL's jitted SMAX (tiny budget)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("jaxmarl")


@pytest.mark.slow  # JaxMARL compiles its SMAX step for 20-40 s
def test_benchmark_script_prints_one_json_object(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--only", "5m_vs_6m", "--num-envs", "4", "--rounds", "2", "--round-seconds", "0"]
    record = run_benchmark("smax.py", *args, "--min-steps", "2", "--threads", "1")
    entry = record["5m_vs_6m"]
    assert set(entry["work"]) == {"jaxmarl", "marlkit"}
    assert entry["num_envs"] == 4 and entry["units"] == {"allies": 5, "enemies": 6}
    assert entry["jaxmarl_env_steps_per_s"] > 0 and entry["marlkit_env_steps_per_s"] > 0
    assert entry["speedup"] > 0 and len(entry["speedup_rounds"]) == 2
    assert record["settings"]["threads"] == 1
