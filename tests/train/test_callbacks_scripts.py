"""Callbacks and devices named in a training script's config (``callbacks:``, ``device``,
``env.device``, ``collector.device`` of ``configs/run.yaml``), run as a user runs the scripts."""

from __future__ import annotations

import pytest
import torch

import _forked
from marlkit.record import read_metrics
from marlkit.train import Checkpointer
from sota._scripts import ALGORITHMS, ROOT, command, env, run, summary

#: Five iterations of 400 frames, unless a callback stops the run.
FIVE = ("collector.total_frames=2000", "eval.video=false")
#: Stop once 800 frames are collected (iteration 2), and log a custom metric.
CALLBACKS = (
    "callbacks=[{_target_:EarlyStopping,metric:frames,threshold:800},"
    "{_target_:MetricRatio,name:train_per_collect,numerator:training_time,"
    "denominator:collection_time}]"
)


@pytest.mark.parametrize("name", ["mappo_ippo", "qmix_vdn"])
def test_callbacks_from_the_config_stop_a_script_cleanly(tmp_path, name):
    run_dir = tmp_path / "run"
    out = run(name, run_dir, (*ALGORITHMS[name].budget, *FIVE, CALLBACKS)).stdout
    assert "iteration 2:" in out and "iteration 3:" not in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train_per_collect"] > 0 for r in rows)
    info = summary(run_dir)
    assert info["stopped"] == "EarlyStopping: frames = 800 reached the threshold 800"
    assert info["frames"] == 800 and info["iterations"] == 2
    assert Checkpointer(run_dir / "checkpoints").load()["iteration"] == 2


def test_devices_named_explicitly_train_through_the_device_code(tmp_path):
    """device, env.device and collector.device all ``cpu``, given: the env gets its device
    argument, the collector its device, the run moves batches (none elsewhere here)."""
    name = "mappo_ippo"
    run_dir = tmp_path / "run"
    overrides = (*ALGORITHMS[name].budget, "device=cpu", "env.device=cpu", "collector.device=cpu")
    run(name, run_dir, (*overrides, "eval.video=false"))
    assert summary(run_dir)["frames"] == 800


def _refused(tmp_path, overrides):
    run_dir = tmp_path / "run"
    name = "mappo_ippo"
    argv = command(name, run_dir, (*ALGORITHMS[name].budget, *overrides))
    proc = _forked.run(argv, cwd=ROOT, env=env(), timeout=120)
    assert proc.returncode != 0
    assert not (run_dir / "metrics.csv").exists()  # refused before the run started
    return proc.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("callbacks=[EarlyStoping]", "callbacks[0]: unknown callback 'EarlyStoping'"),
        (
            "callbacks=[{_target_:EarlyStopping,metric:frames,patiense:2}]",
            "got an unexpected keyword argument 'patiense'",
        ),
        ("device=gpu", "device must be a torch device (cpu, cuda, cuda:<index>, mps), got 'gpu'"),
    ],
)
def test_a_bad_callback_or_device_in_the_config_is_refused_before_the_run(
    tmp_path, override, message
):
    assert message in _refused(tmp_path, (override,))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("key", ["device", "env.device", "collector.device"])
def test_cuda_on_a_machine_without_it_says_so(tmp_path, key):
    err = _refused(tmp_path, (f"{key}=cuda",))
    assert f"{key}=cuda: CUDA is not available on this machine" in err
