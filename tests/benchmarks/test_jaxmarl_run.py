"""benchmarks/peers/jaxmarl_run.py: JaxMARL's own SMAX MAPPO/IPPO baselines as a peer. Its
arguments are checked here; the run itself needs JaxMARL's source tree and the peer's venv
(``$MARLKIT_JAXMARL_PYTHON``, ``$MARLKIT_JAXMARL_SRC``; how to make them: the driver's
docstring), and is skipped where they are absent."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = ROOT / "benchmarks" / "peers" / "jaxmarl_run.py"
PYTHON = pathlib.Path(os.environ.get("MARLKIT_JAXMARL_PYTHON", "/tmp/jaxmarl-peer-venv/bin/python"))
SRC = pathlib.Path(os.environ.get("MARLKIT_JAXMARL_SRC", "/tmp/jaxmarl-src"))


def _driver():
    spec = importlib.util.spec_from_file_location("jaxmarl_run", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv",
    [
        ["--total-timesteps", "0"],
        ["--eval-envs", "0"],
        ["--seed", "-1"],
        ["--num-envs", "-2"],
        ["--alg", "qmix"],
    ],
)
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        _driver().parse(["--jaxmarl", str(SRC), *argv])
    assert "error" in capsys.readouterr().err


def test_a_tree_without_the_baseline_is_refused(tmp_path):
    args = _driver().parse(["--jaxmarl", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"no baselines/MAPPO/mappo_rnn_smax.py there"):
        _driver().run(args)


@pytest.mark.slow  # JaxMARL compiles its whole training loop: ~1 min on 2 cores
@pytest.mark.skipif(
    not (PYTHON.exists() and (SRC / "baselines").is_dir()),
    reason="JaxMARL's peer venv and source tree are not here",
)
def test_the_peer_trains_and_reports_win_rates_and_times():
    argv = [str(PYTHON), str(DRIVER), "--jaxmarl", str(SRC), "--map", "3m", "--num-envs", "4"]
    argv += ["--num-steps", "8", "--total-timesteps", "64", "--eval-envs", "3"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["env_steps"] == 64 and len(record["curve"]) == 2  # 2 updates of 4 x 8 steps
    assert [row[0] for row in record["curve"]] == [32, 64]
    assert 0.0 <= record["greedy_win_rate"] <= 1.0 and record["eval_episodes"] == 3
    assert record["train_s"] > 0 and record["wall_s"] >= record["train_s"]
    assert record["config"]["MAP_NAME"] == "3m" and record["config"]["LR"] == 0.002
    assert len(record["commit"]) == 40
