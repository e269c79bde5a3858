"""Every training script honours ``train.precision=bf16``: it trains (finite losses) and says in
its summary which precision it trained in (subprocesses, the tiny budget of
``tests/sota/_scripts.py``)."""

from __future__ import annotations

import math

import pytest

from marlkit.record import read_metrics
from marlkit.train.precision import bf16_supported
from sota._scripts import ALGORITHMS, run, summary


@pytest.mark.skipif(not bf16_supported("cpu"), reason="this CPU has no bf16 hardware")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_script_trains_in_bf16(tmp_path, name):
    algorithm = ALGORITHMS[name]
    overrides = (*algorithm.budget, "eval.video=false", "train.precision=bf16")
    run(name, tmp_path / "run", overrides)
    assert summary(tmp_path / "run")["precision"] == "bf16"
    last = read_metrics(tmp_path / "run" / "metrics.csv")[-1]
    for term in algorithm.losses:
        value = last[f"train/agents/{term}"]
        assert math.isfinite(value), (term, value)


def test_a_bad_precision_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(
        AssertionError, match=r"train\.precision must be one of \['fp32', 'bf16'\], got 'fp16'"
    ):
        run("mappo_ippo", tmp_path / "run", ("train.precision=fp16",))
    assert not (tmp_path / "run" / "metrics.csv").exists()
