"""benchmarks/losses.py runs and prints one JSON object (tiny budget)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_qmix_section_prints_json() -> None:
    script = ROOT / "benchmarks" / "losses.py"
    out = subprocess.run(
        [sys.executable, str(script), "--only", "qmix", "--rounds", "1", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["qmix"]
    assert data["minibatch"] == 400 and data["agents"] == 3
    assert data["marlkit_ms_per_step"] > 0 and data["plain_ms_per_step"] > 0
    assert "QMixerLoss" in data["work"]


def test_mappo_section_prints_json_with_the_activation_side() -> None:
    script = ROOT / "benchmarks" / "losses.py"
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--only",
            "mappo",
            "--rounds",
            "1",
            "--round-seconds",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["mappo"]
    for side in ("marlkit", "floor", "marlkit_torch_tanh"):
        assert data[f"{side}_ms"] > 0
    assert data["ratio_torch_tanh_over_marlkit"] > 0
    assert "torch.nn.Tanh" in data["computes"]["marlkit_torch_tanh"]
