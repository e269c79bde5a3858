"""Mixed precision (``train.precision=bf16``) against fp32, in the same run; prints one JSON
object.

Sections (``--only NAME``, repeatable; default both):

* ``step``: one gradient step through :func:`marlkit.train.gradient_steps` (the scripts' update
  path: the loss under :func:`marlkit.train.precision.autocast_scope`, backward, grad-norm
  clip, fused Adam step), fp32 and bf16 sides alternating round by round on the same
  minibatch, for three recipes' network and minibatch sizes:

  - ``mappo``: the MAPPO tutorial recipe on VMAS navigation (``configs/mappo_ippo.yaml``): 3
    agents, observation 18, action 2, actor and centralised critic ``MultiAgentMLP`` 2 x 256
    Tanh shared by the agents, minibatch 400 (``benchmarks/peers/step_spec.py``'s minibatch);
  - ``mappo_fast``: ``configs/mappo_fast.yaml``'s sizes, the same but 2 x 64 and minibatch 1200;
  - ``qmix``: the QMIX recipe (``configs/qmix_vdn.yaml``): a shared ``MultiAgentMLP`` 2 x 256
    Q-network of 3 agents (observation 10, 5 actions), a ``QMixer`` of embed 32 over an 18-wide
    state, target copies, a soft target update after the step, minibatch 400.

  Each bf16 side is the fp32 side's deep copy (the same weights) with
  :func:`~marlkit.train.precision.set_precision` ``"bf16"``. With ``--torchrl-python PY`` the
  TorchRL steps of ``benchmarks/losses.py`` (fp32: TorchRL has no precision option) join the
  same alternation for ``mappo`` and ``qmix`` (``peers/torchrl_ppo_step.py``,
  ``peers/torchrl_qmix_step.py``, one subprocess per round). Also reported: how far the bf16
  step's loss terms are from fp32's on the same weights and minibatch.

* ``runs``: whole training runs of the scripts (``benchmarks/results.py``'s experiments:
  default ``mappo-vmas`` and ``qmix-vmas``, the MAPPO and QMIX VMAS navigation recipes), 3
  seeds (``--seeds``) in fp32 and in bf16, the two alternating seed by seed: each run's final
  reward (the experiment's measure), wall-clock, collection and training seconds; per
  precision the mean reward with a 95 % bootstrap interval; the bf16/fp32 wall-clock and
  training-time ratios per seed pair and their medians; whether the intervals overlap. The
  issue's target: the same reward (overlapping intervals) in <= 0.6 x fp32's wall-clock. With
  ``--torchrl-runs`` (and ``--torchrl-python``) the experiment's TorchRL peer run joins the
  alternation (its own full recipe, fp32).

    python benchmarks/precision.py --only step --rounds 7 --torchrl-python /tmp/trl/bin/python
    python benchmarks/precision.py --only runs --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import copy
import functools
import pathlib
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.bench import alternate, make_parser, run_sections, seconds_per_call
from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    QMixer,
    QValueActor,
    StateValueCritic,
    TanhNormal,
    get_tanh_method,
)
from marlkit.objectives import ClipPPOLoss, QMixerLoss, SoftUpdate
from marlkit.train import gradient_steps
from marlkit.train.precision import autocast_scope, bf16_supported, set_precision

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/results.py and benchmarks/losses.py, as modules

import losses as loss_bench  # noqa: E402
import results  # noqa: E402
from peers.step_spec import (  # noqa: E402
    ACT,
    CLIP,
    CRITIC_COEF,
    ENTROPY_COEF,
    MAX_GRAD_NORM,
    N_AGENTS,
    OBS,
    QMIX_ACTIONS,
    QMIX_AGENTS,
    QMIX_EMBED,
    QMIX_GAMMA,
    QMIX_HIDDEN,
    QMIX_LR,
    QMIX_OBS,
    QMIX_STATE,
    QMIX_TAU,
    minibatch,
    qmix_minibatch,
)

Step = Callable[[], dict[str, float]]


# ---------------------------------------------------------------------------- step
def _ppo_loss(cells: int) -> ClipPPOLoss:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        MultiAgentMLP(OBS, 2 * ACT, N_AGENTS, share_params=True, num_cells=cells),
        NormalParamExtractor(),
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    critic = StateValueCritic(N_AGENTS, OBS, centralised=True, num_cells=cells)
    return ClipPPOLoss(
        actor, critic, clip_epsilon=CLIP, entropy_coef=ENTROPY_COEF, critic_coef=CRITIC_COEF
    )


def _ppo_objective(terms: TensorDictBase) -> torch.Tensor:
    return terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]


def _qmix_loss() -> QMixerLoss:
    torch.manual_seed(0)
    q_net = MultiAgentMLP(
        QMIX_OBS, QMIX_ACTIONS, QMIX_AGENTS, share_params=True, num_cells=QMIX_HIDDEN
    )
    mixer = QMixer([QMIX_STATE], QMIX_EMBED, QMIX_AGENTS)
    actor = QValueActor(q_net, n_actions=QMIX_ACTIONS)
    return QMixerLoss(actor, mixer, gamma=QMIX_GAMMA, delay_value=True)


def _stepper(
    loss: torch.nn.Module,
    data: TensorDict,
    lr: float,
    objective: Callable[[TensorDictBase], torch.Tensor] | None,
    soft: bool,
) -> Step:
    """One optimiser step of ``loss`` on ``data`` as the scripts take it (gradient_steps)."""
    params = getattr(loss, "online_parameters", loss.parameters)()
    optim = torch.optim.Adam(params, lr=lr, fused=True)
    updater = SoftUpdate(loss, tau=QMIX_TAU) if soft else None  # type: ignore[arg-type]
    extra: dict[str, Any] = {} if objective is None else {"objective": objective}
    return functools.partial(
        gradient_steps,
        loss,
        optim,
        lambda: data,
        1,
        max_grad_norm=MAX_GRAD_NORM if objective is not None else 10.0,
        after_step=None if updater is None else updater.step,
        **extra,
    )


def _recipes() -> dict[str, tuple[torch.nn.Module, TensorDict, float, Any, bool]]:
    """Per recipe: the fp32 loss, its minibatch, lr, PPO objective (None: ``"loss"``), soft
    target update."""
    fast = minibatch()
    fast = torch.cat([fast, fast, fast])  # 1200, configs/mappo_fast.yaml's minibatch
    return {
        "mappo": (_ppo_loss(256), minibatch(), 3e-4, _ppo_objective, False),
        "mappo_fast": (_ppo_loss(64), fast, 3e-3, _ppo_objective, False),
        "qmix": (_qmix_loss(), qmix_minibatch(), QMIX_LR, None, True),
    }


def _agreement(fp32: torch.nn.Module, bf16: torch.nn.Module, data: TensorDict) -> dict[str, Any]:
    """The loss terms of both sides on the same weights and minibatch, before any step: the
    largest relative difference of a scalar term."""
    with torch.no_grad():
        ref = fp32(data.clone())
        with autocast_scope():
            low = bf16(data.clone())
    diffs = {
        name: abs(float(low[name]) - float(value)) / max(abs(float(value)), 1e-6)
        for name, value in ref.items()
        if isinstance(value, torch.Tensor) and value.numel() == 1 and name.startswith("loss")
    }
    return {"loss_terms_relative_difference": diffs}


def bench_step(args: argparse.Namespace) -> dict[str, Any]:
    sides: dict[str, Callable[[], float]] = {}
    out: dict[str, Any] = {}
    for name, (loss, data, lr, objective, soft) in _recipes().items():
        low = copy.deepcopy(loss)
        precision = set_precision(low, "bf16")
        out[name] = {"bf16_ran_as": precision, **_agreement(loss, low, data)}
        for side, module in (("fp32", loss), ("bf16", low)):
            step = _stepper(module, data, lr, objective, soft)
            sides[f"{name}_{side}"] = functools.partial(
                seconds_per_call, step, args.round_seconds, warmup=2
            )
    if args.torchrl_python:
        options = ["--threads", str(args.threads)]
        sides["mappo_torchrl"] = loss_bench._peer_round(
            args.torchrl_python,
            "torchrl_ppo_step.py",
            [*options, "--round-seconds", str(args.round_seconds), "--adam", "fused"],
            "seconds_per_step",
        )
        steps = max(5, int(args.round_seconds / 0.02))  # the QMIX peer counts steps
        qmix_peer = loss_bench._peer_round(
            args.torchrl_python,
            "torchrl_qmix_step.py",
            [*options, "--steps", str(steps)],
            "ms_per_step",
        )
        sides["qmix_torchrl"] = lambda: qmix_peer() / 1e3
    times = alternate(sides, args.rounds)
    for name in out:
        fp32, bf16 = times[f"{name}_fp32"], times[f"{name}_bf16"]
        per_round = [b / a for a, b in zip(fp32, bf16)]
        out[name].update(
            {
                "fp32_ms": 1e3 * statistics.median(fp32),
                "bf16_ms": 1e3 * statistics.median(bf16),
                "ratio_bf16_over_fp32": statistics.median(per_round),
                "ratio_rounds": [round(r, 3) for r in per_round],
            }
        )
        if f"{name}_torchrl" in times:
            peer = times[f"{name}_torchrl"]
            out[name]["torchrl_fp32_ms"] = 1e3 * statistics.median(peer)
            for side, own in (("fp32", fp32), ("bf16", bf16)):
                out[name][f"ratio_{side}_over_torchrl"] = statistics.median(
                    a / b for a, b in zip(own, peer)
                )
    return {
        "computes": "per recipe, one gradient_steps step (loss forward, backward, grad-norm "
        "clip, Adam(fused=True), QMIX's soft target update) on a fixed minibatch; fp32: the "
        "loss as built; bf16: its deep copy with set_precision('bf16') (the MultiAgentMLPs "
        "under bf16 autocast, outputs, loss maths, QMixer, weights and Adam in fp32); torchrl "
        "(with --torchrl-python): the same step of benchmarks/losses.py's TorchRL peers, fp32",
        "recipes": {
            "mappo": "3 agents, obs 18, act 2, actor + centralised critic MLP 2x256 Tanh "
            "shared, minibatch 400 (configs/mappo_ippo.yaml on VMAS navigation)",
            "mappo_fast": "the same with 2x64 and minibatch 1200 (configs/mappo_fast.yaml)",
            "qmix": "3 agents, obs 10, 5 actions, Q-network MLP 2x256 Tanh shared, QMixer "
            "embed 32 over an 18-wide state, target copies, minibatch 400",
        },
        "bf16_hardware": bf16_supported("cpu"),
        "tanh_method": get_tanh_method(),
        **out,
    }


# ---------------------------------------------------------------------------- runs
def _runs_of(name: str, args: argparse.Namespace) -> dict[str, Any]:
    exp = results.EXPERIMENTS[name]
    out = pathlib.Path(args.out) / name
    seeds = [int(s) for s in args.seeds.split(",")]
    iters = {side: iter(seeds) for side in ("fp32", "bf16", "torchrl")}

    def ours(precision: str) -> Callable[[], dict[str, Any]]:
        extra = [*args.override, f"train.precision={precision}"]
        return lambda: results.run_ours(
            exp, next(iters[precision]), out / precision, extra, args.threads
        )

    sides: dict[str, Callable[[], dict[str, Any]]] = {"fp32": ours("fp32"), "bf16": ours("bf16")}
    if args.torchrl_runs and args.torchrl_python and exp.peer:
        sides["torchrl"] = lambda: results.run_peer(
            exp, next(iters["torchrl"]), args.torchrl_python, args.threads
        )
    runs = alternate(sides, len(seeds))
    report: dict[str, Any] = {"what": exp.what, "measure": exp.measure, "seeds": seeds}
    for side, side_runs in runs.items():
        report[side] = {
            "final": results._ci([r["final"] for r in side_runs]),
            "seconds": [round(r["seconds"], 1) for r in side_runs],
            **{
                key: [round(r[key], 1) for r in side_runs]
                for key in ("training_s", "collection_s")
                if key in side_runs[0]
            },
            "runs": [{k: v for k, v in r.items() if k != "curve"} for r in side_runs],
        }
    fp32, bf16 = runs["fp32"], runs["bf16"]
    wall = [b["seconds"] / a["seconds"] for a, b in zip(fp32, bf16)]
    train = [b["training_s"] / a["training_s"] for a, b in zip(fp32, bf16)]
    low, high = report["fp32"]["final"], report["bf16"]["final"]
    overlap = low["low"] <= high["high"] and high["low"] <= low["high"]
    report.update(
        {
            "ratio_bf16_over_fp32_seconds": statistics.median(wall),
            "ratio_bf16_over_fp32_seconds_per_seed": [round(r, 3) for r in wall],
            "ratio_bf16_over_fp32_training_s": statistics.median(train),
            "ratio_bf16_over_fp32_training_s_per_seed": [round(r, 3) for r in train],
            "intervals_overlap": overlap,
            "target": "intervals overlap and ratio_bf16_over_fp32_seconds <= 0.6",
            "target_met": bool(overlap and statistics.median(wall) <= 0.6),
        }
    )
    if "torchrl" in runs:
        report["ratio_bf16_over_torchrl_seconds"] = statistics.median(
            b["seconds"] / t["seconds"] for b, t in zip(bf16, runs["torchrl"])
        )
    return report


def bench_runs(args: argparse.Namespace) -> dict[str, Any]:
    names = args.experiments.split(",")
    for name in names:
        if name not in results.EXPERIMENTS:
            raise SystemExit(
                f"--experiments: unknown experiment {name!r}; one of {sorted(results.EXPERIMENTS)}"
            )
    return {
        "computes": "each experiment's script run to its end (benchmarks/results.py's "
        "run_ours: the recipe, one final evaluation, threads as --threads) with "
        "train.precision=fp32 and =bf16, seed by seed, alternating; the TorchRL peer's own "
        "recipe (fp32) with --torchrl-runs",
        **{name: _runs_of(name, args) for name in names},
    }


SECTIONS = {"step": bench_step, "runs": bench_runs}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=5, round_seconds=1.0, threads=1)
    parser.add_argument("--torchrl-python", default=None, help="a Python with torchrl")
    parser.add_argument(
        "--torchrl-runs", action="store_true", help="runs: the TorchRL peer's runs too"
    )
    parser.add_argument("--experiments", default="mappo-vmas,qmix-vmas", help="runs: which")
    parser.add_argument("--seeds", default="0,1,2", help="runs: the seeds")
    parser.add_argument("--out", default=str(results.ROOT / "runs" / "precision"))
    parser.add_argument("--override", action="append", default=[], help="runs: extra overrides")
    args = parser.parse_args(argv)
    return run_sections("precision", SECTIONS, args)


if __name__ == "__main__":
    sys.exit(main())
