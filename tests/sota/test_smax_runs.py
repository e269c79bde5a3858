"""``benchmarks/analysis/smax_runs.py`` on real SMAX runs of the MAPPO script (issue 38)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from ._scripts import ALGORITHMS, ROOT, run


def _module():
    path = ROOT / "benchmarks" / "analysis" / "smax_runs.py"
    spec = importlib.util.spec_from_file_location("_smax_runs", path)
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
