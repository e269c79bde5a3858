"""benchmarks/results.py runs an experiment's seeds and prints one JSON object (tiny budget)."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

import _forked

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = (
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "train.epochs=1",
    "train.minibatch_size=200",
    "eval.num_envs=2",
)


@pytest.mark.slow
def test_an_experiment_with_its_own_config_prints_json(
    tmp_path: pathlib.Path, check_header: Callable[[dict[str, Any], str], None]
) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "results.py"),
        "mappo-native-fast",
        "--seeds",
        "0,1",
        "--out",
        str(tmp_path / "out"),
        "--img",
        str(tmp_path / "img"),
        *(f"--override={o}" for o in TINY),
    ]
    proc = _forked.run(cmd, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.strip().splitlines()  # one JSON object per experiment and line
    out = json.loads(line)
    check_header(out, "results")
    assert out["settings"]["seeds"] == "0,1" and out["settings"]["threads"] == 1
    assert out["experiment"] == "mappo-native-fast" and out["measure"] == "train"
    assert "--config-name mappo_fast" in out["command"] and "mappo_fast.yaml" in out["marlkit_does"]
    seeds = out["marlkit"]["per_seed"]
    assert [s["seed"] for s in seeds] == [0, 1]
    for s in seeds:
        assert s["final"] == s["curve"][-1][1] and len(s["curve"]) == 2
        assert s["seconds"] > s["training_s"] > 0
    lo, mean, hi = (out["marlkit"]["greedy_reward"][k] for k in ("low", "mean", "high"))
    assert lo <= mean <= hi
    assert (tmp_path / "img" / "results-mappo-native-fast.png").stat().st_size > 0
    # run again into the same folders: the earlier seeds' runs are replaced, not resumed
    again = _forked.run([*cmd[:4], "0", *cmd[5:]], timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads(again.stdout.strip().splitlines()[-1])["marlkit"]["per_seed"]
    assert [s["seed"] for s in rerun] == [0] and rerun[0]["curve"] == seeds[0]["curve"]
