"""benchmarks/gpu_check.py: on this machine (no CUDA) it says so and exits 0; with
``--device cpu`` the same code runs every section on the cpu (the training scripts through
their device settings, the native twin against the kernels, VMAS on both sides)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import torch

TINY = ("--frames-per-batch", "200", "--iterations", "2", "--epochs", "1", "--threads", "1")
STEPS = ("--num-envs", "16", "--rounds", "1", "--round-seconds", "0.1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_and_exits_0(run_benchmark: Callable[..., dict[str, Any]]) -> None:
    record = run_benchmark("gpu_check.py")
    assert record["cuda"] is False
    assert record["skipped"].startswith("no CUDA on this machine")
    assert not set(record) & {"mappo", "qmix", "vmas", "native"}


def test_the_simulation_sections_on_the_cpu(run_benchmark: Callable[..., dict[str, Any]]) -> None:
    record = run_benchmark(
        "gpu_check.py", "--device", "cpu", "--only", "native", "--only", "vmas", *STEPS
    )
    assert "device side: torch, cpu side: native" in record["native"]["computes"]
    for name in ("native", "vmas"):
        rates = record[name]["env_steps_per_s"]
        assert rates["device"] > 0 and rates["cpu"] > 0
        assert record[name]["ratio_cpu_over_device"] > 0


@pytest.mark.slow  # four training runs of the scripts: ~15-25 s
def test_the_training_sections_on_the_cpu(run_benchmark: Callable[..., dict[str, Any]]) -> None:
    record = run_benchmark(
        "gpu_check.py", "--device", "cpu", "--only", "mappo", "--only", "qmix", *TINY
    )
    for name in ("mappo", "qmix"):
        for side in ("device", "cpu"):
            assert record[name][side]["ok"] is True, record[name][side]
            assert record[name][side]["frames"] == 400 and record[name][side]["frames_per_s"] > 0
        assert record[name]["ratio_device_over_cpu"] > 0
    assert "failed" not in record


def test_a_failing_run_is_reported_and_the_exit_status_is_1(
    run_script: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    # meta is a torch device, but no device to train on: the script refuses it (its config
    # check) and the check says so, with the script's error, beside the cpu side that ran
    out = run_script("gpu_check.py", "--device", "meta", "--only", "qmix", *TINY, timeout=300)
    assert out.returncode == 1, out.stderr
    record = json.loads(out.stdout)
    assert record["failed"] == ["qmix"]
    assert record["qmix"]["device"]["ok"] is False
    assert (
        "device=meta: training and simulation run on cpu, cuda or mps"
        in (record["qmix"]["device"]["error"])
    )
    assert record["qmix"]["cpu"]["ok"] is True and "ratio_device_over_cpu" not in record["qmix"]


def test_a_bad_device_is_refused(
    run_script: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    out = run_script("gpu_check.py", "--device", "gpu")
    assert out.returncode == 2 and "--device 'gpu' is not a torch device" in out.stderr
