"""``benchmarks/analysis/smax_runs.py`` on real SMAX runs of the MAPPO script (issue 38)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from ._scripts import ALGORITHMS, ROOT, run


def _module(name: str = "smax_runs"):
    """``benchmarks/analysis/<name>.py`` as a module."""
    path = ROOT / "benchmarks" / "analysis" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # two short SMAX runs, ~25 s
def test_smax_runs_reads_win_rates_seeds_and_times(tmp_path):
    budget = (*ALGORITHMS["mappo_ippo"].budget, "env=smax/3m", "eval.video=false")
    for seed in (3, 4):
        run("mappo_ippo", tmp_path / f"s{seed}", (*budget, f"seed={seed}",
                                                  "eval.exploration=both"))  # fmt: skip
    (tmp_path / "s3.time").write_text("wall 12.5 user 10.0 sys 1.5 maxrss_kb 1000\n")
    out = tmp_path / "out.json"
    smax = _module()
    smax.main(["--experiment", "e", "--task", "SMAX 3m", "--runs", str(tmp_path / "s3"),
               str(tmp_path / "s4"), "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    first, second = result["runs"]
    assert (first["seed"], second["seed"]) == (3, 4)
    summary = json.loads((tmp_path / "s3" / "summary.json").read_text())
    assert first["greedy_win_rate"] == summary["trained"]["won"]
    assert first["sampled_win_rate"] == summary["trained_random"]["won"]
    assert [f for f, _ in first["train_curve_won"]] == [400.0, 800.0]
    assert (first["wall_s"], first["cpu_s"]) == (12.5, 11.5) and "wall_s" not in second
    assert result["greedy_win_rate"]["values"] == [first["greedy_win_rate"],
                                                   second["greedy_win_rate"]]  # fmt: skip
    # a run that did not finish (no summary), or that is not a SMAX run, is named
    (tmp_path / "s4" / "summary.json").unlink()
    with pytest.raises(SystemExit, match="s4: not a finished SMAX run with a 'won' flag"):
        smax.main(["--experiment", "e", "--task", "t", "--runs", str(tmp_path / "s4")])


@pytest.mark.slow  # a short SMAX run and 8 episodes on each simulator, ~40 s
def test_smax_cross_eval_plays_a_run_on_both_simulators(tmp_path):
    """``benchmarks/analysis/smax_cross_eval.py``: the run's actor on native SMAX and on
    JaxMARL's own (the ``jaxmarl`` adapter); its win rule equals the native ``won`` flag."""
    pytest.importorskip("jaxmarl")
    cross = _module("smax_cross_eval")
    budget = (*ALGORITHMS["mappo_ippo"].budget, "env=smax/3m", "eval.video=false",
              "model.memory=gru", "model.memory_hidden=8", "model.seq_len=10")  # fmt: skip
    run("mappo_ippo", tmp_path / "run", budget)
    out = tmp_path / "cross.json"
    cross.main(["--run", str(tmp_path / "run"), "--episodes", "8", "--out", str(out)])
    (result,) = json.loads(out.read_text())["runs"]
    assert result["map"] == "3m" and result["exploration"] == "deterministic"
    for side in ("native", "jaxmarl"):
        assert result[side]["episodes"] == 8 and 0.0 <= result[side]["won"] <= 1.0
        assert 1 <= result[side]["episode_length"] <= 101
    assert result["native"]["rule_agrees_with_flag"]
    assert "native_won_flag" not in result["jaxmarl"]  # JaxMARL's env has no such flag
    # a run on another env is named
    other = tmp_path / "nav"
    run("mappo_ippo", other, (*ALGORITHMS["mappo_ippo"].budget, "eval.video=false"))
    with pytest.raises(SystemExit, match=r"trained on navigation with .*: not smax/<map>"):
        cross.main(["--run", str(other), "--episodes", "2"])
