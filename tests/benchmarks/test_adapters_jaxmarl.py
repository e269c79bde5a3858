"""benchmarks/adapters_jaxmarl.py: jaxmarl/MPE_simple_spread_v3 against JaxMARL's own jitted
step loop (two envs; both sides compile first, hence slow)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("jaxmarl")


@pytest.mark.slow
def test_benchmark_script_prints_one_json_object(
    run_benchmark: Callable[..., dict[str, Any]],
) -> None:
    args = ["--only", "mpe", "--num-envs", "2", "--rounds", "1", "--round-seconds", "0"]
    record = run_benchmark("adapters_jaxmarl.py", *args, "--min-steps", "2", "--threads", "1")
    mpe = record["mpe"]
    assert mpe["env"] == "MPE_simple_spread_v3"
    assert set(mpe["work"]) == {"raw", "adapter"}
    cell = mpe["num_envs=2"]
    assert cell["agents"] == 3
    assert cell["raw_env_steps_per_s"] > 0 and cell["adapter_env_steps_per_s"] > 0
    assert cell["ratio"] > 0 and len(cell["ratio_rounds"]) == 1
    assert 0 < cell["time_in_jax_fraction"] <= 1
    assert "smax" not in record
