"""benchmarks/collectors.py's two-process sections run, and report the machine's ceilings beside
their ratios (tiny budget)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("section", "ratio_key", "ceilings"),
    [
        ("parallel_env", "parallel_over_serial", ("machine_ceiling", "lockstep_ceiling")),
        ("multisync", "multisync_over_collector", ("machine_ceiling",)),
    ],
)
def test_section_reports_ratio_and_ceilings(
    section: str, ratio_key: str, ceilings: tuple[str, ...]
) -> None:
    script = ROOT / "benchmarks" / "collectors.py"
    args = ["--only", section, "--rounds", "1", "--round-seconds", "0.01", "--mpe-steps", "2"]
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)[section]
    ratio = data[ratio_key]
    assert ratio > 0 and data["rounds"] == [ratio]
    for name in ceilings:
        (ceiling,) = data[f"{name}_rounds"]
        assert data[name] == ceiling > 0
        assert data[f"share_of_{name}"] == pytest.approx(ratio / ceiling)
    if "lockstep_ceiling" not in ceilings:
        assert "lockstep_ceiling" not in data
    assert "no marlkit" in data["ceiling_work"]
