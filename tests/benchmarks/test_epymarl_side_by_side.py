"""``benchmarks/analysis/epymarl_side_by_side.py``: marlkit's run folders beside EPyMARL's JSON
lines, and a comparison grown by a seed from an earlier results JSON (``--previous``)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module():
    path = ROOT / "benchmarks" / "analysis" / "epymarl_side_by_side.py"
    spec = importlib.util.spec_from_file_location("_epymarl_side_by_side", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _marlkit_seed(stack: pathlib.Path, seed: int, final: float) -> pathlib.Path:
    """A seed's folder of a ``seeds_in_process`` stack as the scripts write it: metrics.csv
    with the greedy evaluations (``eval/``) and summary.json with the last one."""
    run = stack / f"seed_{seed}"
    run.mkdir(parents=True)
    rows = ["frames,step,agents/episode_reward,eval/agents/episode_reward"]
    rows += [f"{k * 50000},{k},0.01,{final * k / 4}" for k in range(1, 5)]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    summary = {
        "frames": 200000,
        "trained": {"agents/episode_reward": final},
        "random": {"agents/episode_reward": 0.0},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def _epymarl(folder: pathlib.Path, seed: int, final: float) -> pathlib.Path:
    """``benchmarks/peers/epymarl_run.py``'s JSON line for one seed."""
    path = folder / f"qmix-s{seed}.json"
    info = {
        "seed": seed,
        "final": final,
        "final_t_env": 200050,
        "t_max": 200000,
        "commit": "cbc38c09588064eab978501d0f12c2cf58fa7fc2",
        "command": f"python src/main.py --config=qmix seed={seed}",
        "does": "greedy tests",
        "curve": [[50, 0.0], [100050, final / 2], [200050, final]],
        "train_curve": [[50, 0.0], [200050, final]],
        "seconds": 100.0 + seed,
    }
    path.write_text("some log line\n" + json.dumps(info) + "\n")
    return path


def test_a_comparison_grows_by_a_seed_from_its_earlier_results(tmp_path):
    sbs = _module()
    stack = tmp_path / "stack"
    marlkit = [str(_marlkit_seed(stack, s, f)) for s, f in ((0, 0.2), (8, 0.4))]
    epymarl = [str(_epymarl(tmp_path, s, f)) for s, f in ((0, 0.1), (1, 0.3))]
    first = tmp_path / "first.json"
    common = ["--experiment", "qmix-test", "--task", "LBF"]
    sbs.main([*common, "--marlkit", *marlkit, "--epymarl", *epymarl, "--out", str(first)])
    before = json.loads(first.read_text())
    assert before["epymarl"]["seeds"] == [0, 1] and before["marlkit"]["seeds"] == [0, 8]

    # the first runs' folders are gone (a new machine); EPyMARL's seed 2 is added
    for s in (0, 8):
        for f in (stack / f"seed_{s}").iterdir():
            f.unlink()
    grown = tmp_path / "grown.json"
    third = str(_epymarl(tmp_path, 2, 0.5))
    figure = tmp_path / "grown.png"
    sbs.main([*common, "--previous", str(first), "--epymarl", third, "--out", str(grown),
              "--figure", str(figure)])  # fmt: skip
    after = json.loads(grown.read_text())
    assert after["epymarl"]["seeds"] == [0, 1, 2]
    assert after["epymarl"]["finals"] == [0.1, 0.3, 0.5]
    assert after["epymarl"]["mean"] == pytest.approx(0.3)
    assert after["marlkit"] == before["marlkit"]  # read back from the earlier runs, unchanged
    assert after["runs"][:2] == before["runs"][:2]
    assert figure.stat().st_size > 0  # the curves of the earlier runs are drawn too

    # another marlkit recipe beside the same EPyMARL runs: only EPyMARL's are taken
    other = [str(_marlkit_seed(tmp_path / "relu", s, f)) for s, f in ((0, 0.6), (8, 0.7))]
    beside = tmp_path / "beside.json"
    sbs.main([*common, "--previous", str(grown), "--previous-sides", "epymarl", "--marlkit",
              *other, "--out", str(beside)])  # fmt: skip
    again = json.loads(beside.read_text())
    assert again["epymarl"] == after["epymarl"] and again["marlkit"]["finals"] == [0.6, 0.7]
    assert [r["run"] for r in again["runs"] if r["side"] == "marlkit"] == other

    # a seed given again, a file that is no results JSON, another evaluation mode: refused
    with pytest.raises(SystemExit, match=r"epymarl seed\(s\) \[2\] are already in --previous"):
        sbs.main([*common, "--previous", str(grown), "--epymarl", third])
    damaged = tmp_path / "damaged.json"
    damaged.write_text(first.read_text()[:200])
    with pytest.raises(SystemExit, match="not a results JSON of this script"):
        sbs.main([*common, "--previous", str(damaged)])
    with pytest.raises(SystemExit, match=r"were read with --marlkit-eval \['deterministic'\]"):
        sbs.main([*common, "--previous", str(first), "--marlkit-eval", "random"])
    with pytest.raises(SystemExit, match="no EPyMARL run: give --epymarl or --previous"):
        sbs.main([*common, "--marlkit", str(_marlkit_seed(tmp_path / "other", 3, 0.1))])
