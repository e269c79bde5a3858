"""SMAX training runs as one results JSON: each run's final greedy and sampled win rates, its
training win rate along the run, and its time, for docs/results.md's SMAX sections.

    .venv/bin/python benchmarks/analysis/smax_runs.py --experiment mappo-smax-all-options \
        --task "SMAX 3m against SMAX's heuristic enemy" --runs /tmp/smax/s0 /tmp/smax/s1 \
        --does "configs/mappo_smax.yaml with ..." --command "..." \
        --out benchmarks/results/results-mappo-smax-all-options-2026-12-07.json

A run is a run folder of ``mappo_ippo.py`` (or ``qmix_vdn.py``) on a ``smax/...`` env
evaluated with ``eval.exploration=both`` (greedy and sampled) or ``deterministic``: its
``summary.json`` gives the final evaluations' ``won`` (``trained``, ``trained_random``), its
``metrics.csv`` the training episodes' ``won`` per batch (the root flag of the episodes that
ended in the batch), and ``<run>.time`` next to the folder, where ``/usr/bin/time -f "wall %e
user %U sys %S maxrss_kb %M"`` wrote it, the command's wall-clock and CPU seconds. The
training win rate is also given at the batches nearest 213k and 410k frames and as the mean of
the last 5 batches, as the earlier SMAX results report it.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import sys
from typing import Any

import numpy as np

from marlkit.bench.environment import describe_environment
from marlkit.record.plot import bootstrap_ci
from marlkit.train import Checkpointer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from epymarl_side_by_side import emit_results, time_file  # this folder's script

#: training frames at which the SMAX results quote the training win rate
MARKS = (213_000, 410_000)


def smax_run(run: pathlib.Path) -> dict[str, Any]:
    """One run's figures (see the module's notes).

    Raises:
        SystemExit: ``run`` has no ``summary.json``/``metrics.csv`` or no ``won`` in them (not
            a finished run on a SMAX env).
    """
    try:
        summary = json.loads((run / "summary.json").read_text())
        with open(run / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        greedy = summary["trained"]["won"]
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"{run}: not a finished SMAX run with a 'won' flag ({err!r})") from None
    curve = [[float(r["frames"]), float(r["won"])] for r in rows if r.get("won")]
    if not curve:
        raise SystemExit(f"{run}: metrics.csv has no training 'won' column")
    seed = int(Checkpointer(run / "checkpoints").load()["config"]["seed"])  # the run's own
    out: dict[str, Any] = {
        "side": "marlkit",
        "run": str(run),
        "seed": seed,
        "greedy_win_rate": greedy,
        "sampled_win_rate": summary.get("trained_random", {}).get("won"),
        "frames": summary["frames"],
    }
    for mark in MARKS:
        nearest = min(curve, key=lambda p: abs(p[0] - mark))
        out[f"train_won_{mark // 1000}k"] = nearest[1]
    out["train_won_last5"] = float(np.mean([w for _, w in curve[-5:]]))
    timed = time_file(run.parent / f"{run.name}.time")
    if timed:
        out.update(wall_s=timed["wall"], cpu_s=timed["user"] + timed["sys"])
    out["train_curve_won"] = curve
    return out


def _mean_ci(values: list[float]) -> dict[str, Any]:
    ci = bootstrap_ci(np.array(values))
    return {"values": values, "mean": float(ci.mean), "ci95": [float(ci.low), float(ci.high)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--runs", nargs="+", type=pathlib.Path, required=True)
    p.add_argument("--does", default="", help="what marlkit's runs computed (the config)")
    p.add_argument("--command", default="")
    p.add_argument("--compare-with", default="")
    p.add_argument("--note", default="")
    p.add_argument("--out", type=pathlib.Path, default=None)
    args = p.parse_args(argv)
    runs = [smax_run(r) for r in args.runs]
    result: dict[str, Any] = {
        "benchmark": "results",
        "experiment": args.experiment,
        "environment": describe_environment(),
        "task": args.task,
        "marlkit_does": args.does,
        "command": args.command,
        "compare_with": args.compare_with,
        "note": args.note,
        "greedy_win_rate": _mean_ci([r["greedy_win_rate"] for r in runs]),
        "runs": runs,
    }
    sampled = [r["sampled_win_rate"] for r in runs]
    if all(s is not None for s in sampled):
        result["sampled_win_rate"] = _mean_ci(sampled)
    emit_results(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
