"""marlkit beside EPyMARL: one results JSON (and a figure) from marlkit's run folders and
``benchmarks/peers/epymarl_run.py``'s JSON lines, the same task, algorithm and budget a side.

Each side's test return (EPyMARL's protocol: 100 episodes, greedy for QMIX/VDN/IQL, sampled for
MAPPO/IPPO, whose ``soft_policies`` selector samples in its tests: ``--marlkit-eval random``
reads marlkit's sampled evaluations, ``eval_random/``) at each evaluation and at the end, the
mean over seeds with a 95 % bootstrap interval (``marlkit.record.bootstrap_ci``),
and, where a run has a ``<run>.time`` (marlkit: next to its folder) or ``<json stem>.time``
(EPyMARL) file written by ``/usr/bin/time -f "wall %e user %U sys %S maxrss_kb %M"``, its
whole command's wall-clock and CPU seconds (children included: EPyMARL's env processes)::

    .venv/bin/python benchmarks/analysis/epymarl_side_by_side.py --marlkit-eval random \
        --experiment mappo-lbf-epymarl-sampled --at 900000 \
        --task "LBF Foraging-8x8-2p-2f-coop-v3, time limit 50: MAPPO" \
        --marlkit /tmp/mk/mappo2-lbf8-s0 /tmp/mk/mappo2-lbf8-s1 \
        --epymarl /tmp/ep/mappo-lbf8-s0.json /tmp/ep/mappo-lbf8-s1.json \
        --out benchmarks/results/results-mappo-lbf-epymarl-sampled-2026-12-07.json \
        --figure docs/img/results-mappo-lbf-epymarl-sampled.png

``--previous`` adds the runs of an earlier results JSON of this script (each run's curve,
final return and times are in its ``runs``): a comparison grows by a seed without the first
runs' folders, which a new machine no longer has; a run given again (same side and seed) is
refused. ``--previous-sides epymarl`` takes only EPyMARL's runs from it: another marlkit recipe
set beside the same EPyMARL runs.

A marlkit run is a run folder, or a seed's folder of a ``seeds_in_process`` stack
(``<stack>/seed_<s>``: its seed read from the name; the stack's ``.time`` is the stack's, not
read per seed). A marlkit run's curve is its ``eval/<group>/episode_reward`` column of
``metrics.csv`` (the agents' summed reward per episode with ``common_reward``, as EPyMARL's
``test_return_mean``),
its final figure ``summary.json``'s ``trained`` (the last evaluation after training). An
EPyMARL run's are its JSON's ``curve`` and ``final``. ``--at`` cuts both sides' curves at that
many steps and compares their evaluations there: EPyMARL's loop stops at ``t_max`` without a
last test (a 1M run's last is at ~900k), and a longer run whose tests fall at the same steps as
a shorter one's has that run as its prefix.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import pathlib
import platform
import sys
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from marlkit.record.plot import bootstrap_ci, plot_with_bands


def time_file(path: pathlib.Path) -> dict[str, float]:
    """``/usr/bin/time``'s figures (``wall``, ``user``, ``sys``, ``maxrss_kb``), or {}."""
    if not path.exists():
        return {}
    words = path.read_text().split()
    pairs = dict(zip(words[::2], words[1::2]))
    try:
        return {k: float(pairs[k]) for k in ("wall", "user", "sys", "maxrss_kb")}
    except (KeyError, ValueError):
        return {}  # a killed command's file holds its message instead


def emit_results(result: dict[str, Any], out: pathlib.Path | None) -> None:
    """Print a results JSON on one line, and write it to ``out`` too where given (the file of
    ``benchmarks/results/``)."""
    text = json.dumps(result)
    if out is not None:
        out.write_text(text + "\n")
    print(text)


#: ``--marlkit-eval``: the evaluation columns' prefix and ``summary.json``'s entry of each mode
#: (``eval.exploration=both`` logs the greedy one as ``eval/``, the sampled one as
#: ``eval_random/``)
EVALS = {"deterministic": ("eval/", "trained"), "random": ("eval_random/", "trained_random")}


def marlkit_run(run: pathlib.Path, exploration: str = "deterministic") -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, Any] = {}
    for mode, (prefix, entry) in EVALS.items():
        column = next(
            (k for k in rows[0] if k.startswith(prefix) and k.endswith("episode_reward")), None
        )
        if column is None or entry not in summary:
            if mode == exploration:
                raise SystemExit(
                    f"{run}: no {prefix}...episode_reward column or summary {entry!r}: was it "
                    f"evaluated with eval.exploration={mode} (or both)?"
                )
            continue
        key = column.removeprefix(prefix)  # the training episodes' column, summary's entry
        curve = [[float(r["frames"]), float(r[column])] for r in rows if r.get(column)]
        name = "" if mode == exploration else f"{mode}_"
        out[f"{name}curve"], out[f"{name}final"] = curve, summary[entry][key]
    training = [[float(r["frames"]), float(r[key])] for r in rows if r.get(key)]
    if (run / ".hydra").is_dir():
        seed = OmegaConf.load(run / ".hydra" / "config.yaml").seed
    else:  # a seed of a seeds_in_process stack: <stack>/seed_<s>/, the stack's config above
        seed = int(run.name.removeprefix("seed_"))
    return {
        "side": "marlkit",
        "run": str(run),
        "seed": int(seed),
        "evaluation": exploration,
        **out,
        "random": summary["random"][key],
        "frames": summary["frames"],
        "train_curve": training,
        **time_file(run.parent / f"{run.name}.time"),
    }


def epymarl_run(path: pathlib.Path) -> dict[str, Any]:
    info = json.loads(path.read_text().strip().splitlines()[-1])
    return {
        "side": "epymarl",
        "run": str(path),
        "seed": info["seed"],
        "final": info["final"],
        "final_t_env": info["final_t_env"],
        "t_max": info["t_max"],
        "commit": info["commit"],
        "command": info["command"],
        "does": info.get("does"),
        "curve": info["curve"],
        "train_curve": info["train_curve"],
        "epymarl_seconds": info["seconds"],
        **time_file(path.with_suffix(".time")),
    }


def previous_runs(
    path: pathlib.Path,
    exploration: str,
    marlkit: list[dict[str, Any]],
    epymarl: list[dict[str, Any]],
    sides: str = "both",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``marlkit`` and ``epymarl`` with the runs of the earlier results JSON at ``path`` first,
    those of ``sides`` (``both``, ``epymarl`` or ``marlkit``; its marlkit runs only if they
    were read with the same ``--marlkit-eval``).

    Raises:
        SystemExit: ``path`` is not a results JSON of this script; its marlkit runs were read
            in another evaluation mode; a run (side and seed) is both in it and given.
    """
    try:
        old = json.loads(path.read_text())
        runs = old["runs"]
        found = {r["side"] for r in runs}
    except (OSError, ValueError, KeyError, TypeError) as err:
        message = f"--previous {path}: not a results JSON of this script ({err!r})"
        raise SystemExit(message) from None
    if old.get("benchmark") != "results" or not found <= {"marlkit", "epymarl"}:
        raise SystemExit(f"--previous {path}: not a results JSON of this script")
    runs = [r for r in runs if sides in ("both", r["side"])]
    modes = {r.get("evaluation") for r in runs if r["side"] == "marlkit"}
    if modes - {exploration}:
        raise SystemExit(
            f"--previous {path}: its marlkit runs were read with --marlkit-eval "
            f"{sorted(m for m in modes if m)}, this comparison with {exploration}"
        )
    out = {"marlkit": [], "epymarl": []}
    for r in runs:
        out[r["side"]].append(r)
    for side, given in (("marlkit", marlkit), ("epymarl", epymarl)):
        taken = {r["seed"] for r in out[side]}
        again = sorted(r["seed"] for r in given if r["seed"] in taken)
        if again:
            raise SystemExit(f"{side} seed(s) {again} are already in --previous {path}")
        out[side].extend(given)
    return out["marlkit"], out["epymarl"]


def at_steps(run: dict[str, Any], steps: int) -> dict[str, Any]:
    """``run`` with its curves cut at ``steps`` (an evaluation up to a batch of episodes later
    counts: EPyMARL tests once ``t_env`` has passed the interval) and its ``final`` the last
    evaluation kept."""
    curve = [p for p in run["curve"] if p[0] <= steps + SLACK]
    return {
        **run,
        "curve": curve,
        "train_curve": [p for p in run["train_curve"] if p[0] <= steps + SLACK],
        "final": curve[-1][1],
        "final_t_env": curve[-1][0],
        "final_at": steps,
    }


#: How far past ``--at`` an evaluation may lie: EPyMARL tests once the interval has passed since
#: its last test, at the end of a batch of episodes, so its test times drift later by up to a
#: batch each (900k's test of a 1M LBF run came at 902,075).
SLACK = 5000


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    finals = np.array([r["final"] for r in runs])
    ci = bootstrap_ci(finals)
    out: dict[str, Any] = {
        "seeds": [r["seed"] for r in runs],
        "finals": finals.tolist(),
        "mean": float(ci.mean),
        "ci95": [float(ci.low), float(ci.high)],
    }
    for key in ("wall", "user"):
        if all(key in r for r in runs):
            out[f"{key}_s"] = [r[key] for r in runs]
    return out


def _curves(runs: list[dict[str, Any]]) -> tuple[np.ndarray, ...] | None:
    """Mean and band over seeds at the steps every run evaluated (nearest 1,000 steps)."""
    steps = [{round(x / 1000): y for x, y in r["curve"]} for r in runs]
    common = sorted(set.intersection(*(set(s) for s in steps)))
    if not common:
        return None
    values = np.array([[s[c] for c in common] for s in steps])
    ci = bootstrap_ci(values)
    return np.array(common) * 1000.0, ci.mean, ci.low, ci.high


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--marlkit", nargs="*", type=pathlib.Path, default=[])
    p.add_argument("--epymarl", nargs="*", type=pathlib.Path, default=[])
    p.add_argument(
        "--previous",
        type=pathlib.Path,
        default=None,
        help="an earlier results JSON of this script whose runs are added to those given",
    )
    p.add_argument(
        "--previous-sides",
        choices=["both", "epymarl", "marlkit"],
        default="both",
        help="which side's runs --previous contributes",
    )
    p.add_argument(
        "--at",
        type=int,
        default=None,
        help="compare at these steps: each run's curve cut there, its final the last evaluation "
        "up to it (default: marlkit's summary and EPyMARL's last test)",
    )
    p.add_argument(
        "--marlkit-eval",
        choices=sorted(EVALS),
        default="deterministic",
        help="marlkit's evaluations to set beside EPyMARL's tests: random for MAPPO and IPPO "
        "(EPyMARL's soft_policies selector samples in its tests), deterministic for QMIX/VDN/IQL",
    )
    p.add_argument("--marlkit-does", default="")
    p.add_argument("--note", default="")
    p.add_argument("--out", type=pathlib.Path, default=None)
    p.add_argument("--figure", type=pathlib.Path, default=None)
    args = p.parse_args(argv)
    mk = [marlkit_run(r, args.marlkit_eval) for r in args.marlkit]
    ep = [epymarl_run(j) for j in args.epymarl]
    if args.previous is not None:
        mk, ep = previous_runs(args.previous, args.marlkit_eval, mk, ep, args.previous_sides)
    for side, runs in (("marlkit", mk), ("EPyMARL", ep)):
        if not runs:
            raise SystemExit(f"no {side} run: give --{side.lower()} or --previous")
    if args.at is not None:
        mk, ep = [at_steps(r, args.at) for r in mk], [at_steps(r, args.at) for r in ep]
    result: dict[str, Any] = {
        "benchmark": "results",
        "experiment": args.experiment,
        "environment": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "task": args.task,
        "marlkit_does": args.marlkit_does,
        "epymarl_does": ep[0]["does"],
        "note": args.note,
        "marlkit": _side(mk),
        "epymarl": _side(ep),
        "runs": mk + ep,
    }
    pairs = [
        (a, b) for a in mk for b in ep if a["seed"] == b["seed"] and "wall" in a and "wall" in b
    ]
    if pairs:
        result["wall_ratio_marlkit_over_epymarl"] = {
            str(a["seed"]): a["wall"] / b["wall"] for a, b in pairs
        }
    emit_results(result, args.out)
    if args.figure is not None:
        curves = {}
        for label, runs in (("marlkit", mk), ("EPyMARL", ep)):
            band = _curves(runs)
            if band is not None:
                curves[f"{label} ({len(runs)} seeds)"] = band
        plot_with_bands(
            curves,
            args.figure,
            xlabel="environment steps",
            ylabel=f"{'sampled' if args.marlkit_eval == 'random' else 'greedy'} return "
            "(100 episodes)",
            title=args.task,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
