"""Loss gradient steps through marlkit's loss modules against hand-written plain-torch steps of
the same networks (the floor), in the same run; prints one JSON object.

Sections (``--only NAME``, repeatable; default all):

* ``mappo``: one MAPPO gradient step on a minibatch of 400, 3 agents, observation 18 and
  action 2 per agent; actor ``MultiAgentMLP`` 2x256 Tanh -> ``TanhNormal``, centralised critic
  ``MultiAgentMLP`` 2x256 Tanh, both with parameters shared by the agents (as the MAPPO recipe
  and the TorchRL peer); Adam (``fused=True``, as the training
  scripts use it), grad-norm clip 1.0.

  - ``marlkit``: ``ClipPPOLoss`` on a TensorDict minibatch (advantage normalisation, clipped
    objective, sampled entropy of the TanhNormal, critic loss, diagnostics), backward, clip,
    Adam step.
  - ``floor``: the same networks and the same terms written by hand on plain tensors (the
    TanhNormal log-prob by its closed form), backward, clip, Adam step.

  Targets: ``marlkit / floor <= 1.2`` and ``<= 10 ms`` per step (TorchRL 0.14.1: 15.6 ms, 1
  thread). Every side runs the MLPs' default ``marlkit.modules.Tanh`` by this machine's
  ``"auto"`` tanh method (``marlkit.modules.get_tanh_method``, in the JSON) but two:
  ``marlkit_torch_tanh``, the marlkit step with ``torch.nn.Tanh``, and
  ``marlkit_sigmoid_tanh``, the marlkit step with the ``"sigmoid"`` method (``2 sigmoid(2x) -
  1``): what the choice of method saves. A fifth, ``marlkit_in_major``, is the marlkit
  step with the output layers' weights contiguous in-major instead of ``StackedLinear``'s
  out-major order for narrow layers. ``--compile`` (here and in ``qmix``)
  also times the marlkit step with the loss module under ``torch.compile``. With
  ``--torchrl-python PY`` (a Python with TorchRL 0.14 installed), two more sides run in that
  Python, one subprocess per round in the same alternation: ``torchrl``, the same step through
  TorchRL's ``ClipPPOLoss`` and ``MultiAgentMLP``s with the same fused Adam
  (``benchmarks/peers/torchrl_ppo_step.py``), and ``torchrl_default_adam``, the same with
  torch's default Adam as TorchRL's tutorial leaves it.

* ``qmix``: one QMIX gradient step on a minibatch of 400 transitions of 3 agents (native
  ``navigation`` sizes: observation 10, 5 discrete actions, state 18): a Q-network of two
  hidden layers of 256 shared by the agents, a ``QMixer`` of embed 32, target copies of both,
  Adam (fused), a soft target update (tau 0.005). ``marlkit``: ``QMixerLoss(QValueActor,
  QMixer)`` + ``SoftUpdate``; ``plain``: the same networks (deep copies of the same initial weights)
  called as tensors by a hand-written QMIX step. Both compute, per step: the online Q-values
  and the taken actions' values, the mixed ``Q_tot``, the target networks' greedy next values
  and ``Q_tot'`` under no_grad, the mean team reward, ``y = r + gamma (1 - terminated) Q_tot'``,
  the squared-error loss, ``|Q_tot - y|`` per sample, backward, ``Adam.step`` and the Polyak
  update of every target tensor. The minibatch is fixed (no replay sampling on either side).
  Target: marlkit <= 1.2x the plain step. With ``--torchrl-python PY``, a ``torchrl`` side runs
  the same step through TorchRL's ``QMixerLoss`` in that Python, one subprocess per round
  (``benchmarks/peers/torchrl_qmix_step.py``).

Sides alternate round by round; times are medians, ratios the medians of per-round ratios.

    python benchmarks/losses.py
    python benchmarks/losses.py --only mappo --rounds 7 --compile
    python benchmarks/losses.py --only qmix --rounds 7
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from marlkit.bench import alternate, make_parser, run_sections, seconds_per_call, summary
from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    QMixer,
    QValueActor,
    StackedLinear,
    StateValueCritic,
    Tanh,
    TanhNormal,
    get_tanh_method,
    set_tanh_method,
)
from marlkit.objectives import ClipPPOLoss, QMixerLoss, SoftUpdate
from peers.step_spec import (
    ACT,
    CELLS,
    CLIP,
    CRITIC_COEF,
    ENTROPY_COEF,
    MAX_GRAD_NORM,
    N_AGENTS,
    OBS,
    QMIX_ACTIONS,
    QMIX_AGENTS,
    QMIX_BATCH,
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

PEERS = pathlib.Path(__file__).resolve().parent / "peers"


# --- section: mappo -------------------------------------------------------------------------------


def _networks(
    activation: type[nn.Module] = Tanh,
) -> tuple[ProbabilisticActor, StateValueCritic]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        MultiAgentMLP(  # shared, as the MAPPO recipe and the TorchRL peer
            OBS, 2 * ACT, N_AGENTS, share_params=True, num_cells=CELLS, activation=activation
        ),
        NormalParamExtractor(),
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    critic = StateValueCritic(
        N_AGENTS, OBS, centralised=True, num_cells=CELLS, activation=activation
    )
    return actor, critic


def _in_major(module: nn.Module) -> None:
    """Every ``StackedLinear`` weight of ``module`` made contiguous (in-major), the layout
    narrow layers had before they kept ``nn.Linear``'s order; the same values."""
    for layer in module.modules():
        if isinstance(layer, StackedLinear):
            layer.weight = nn.Parameter(layer.weight.detach().contiguous())


def _marlkit_step(
    compiled: bool,
    activation: type[nn.Module] = Tanh,
    in_major: bool = False,
    tensor_bounds: bool = False,
) -> Callable[[], None]:
    actor, critic = _networks(activation)
    if tensor_bounds:  # the same network, the [-1, 1] bounds given as [n, act] tensors
        bounds = {
            "low": torch.full((N_AGENTS, ACT), -1.0),
            "high": torch.full((N_AGENTS, ACT), 1.0),
        }
        actor = ProbabilisticActor(
            actor.module[0],
            group="agents",
            distribution_class=TanhNormal,
            distribution_kwargs=bounds,
        )
    if in_major:
        _in_major(actor)
        _in_major(critic)
    loss = ClipPPOLoss(
        actor, critic, clip_epsilon=CLIP, entropy_coef=ENTROPY_COEF, critic_coef=CRITIC_COEF
    )
    run: Any = torch.compile(loss) if compiled else loss
    params = list(loss.parameters())  # as the training script: the list built once
    optim = torch.optim.Adam(params, lr=3e-4, fused=True)
    data = minibatch()

    def step() -> None:
        out = run(data)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optim.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optim.step()

    return step


def _floor_step() -> Callable[[], None]:
    actor, critic = _networks()
    actor_mlp, extractor = actor.module[0].module[0], actor.module[0].module[1]
    critic_mlp = critic.module
    params = [*actor_mlp.parameters(), *critic_mlp.parameters()]
    optim = torch.optim.Adam(params, lr=3e-4, fused=True)
    d = minibatch()["agents"]
    obs, act, old_lp = d["observation"], d["action"], d["action_log_prob"]
    adv, target = d["advantage"], d["value_target"]
    log2 = math.log(2.0)

    def tanh_normal_log_prob(loc, scale, u):  # type: ignore[no-untyped-def]
        base = -((u - loc) ** 2) / (2 * scale**2) - scale.log() - 0.5 * math.log(2 * math.pi)
        jac = 2 * (log2 - u - torch.nn.functional.softplus(-2 * u))  # log(1 - tanh(u)^2)
        return (base - jac).sum(-1)

    def step() -> None:
        loc, scale = extractor(actor_mlp(obs))
        eps = torch.finfo(act.dtype).eps
        u = torch.atanh(act.clamp(-1 + eps, 1 - eps))
        lp = tanh_normal_log_prob(loc, scale, u)
        log_ratio = (lp - old_lp).unsqueeze(-1)
        ratio = log_ratio.exp()
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        gain = torch.minimum(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a)
        sample_u = loc + scale * torch.randn_like(loc)
        entropy = -tanh_normal_log_prob(loc, scale, sample_u).mean()
        value = critic_mlp(obs)
        loss_critic = CRITIC_COEF * ((value - target) ** 2).mean()
        with torch.no_grad():  # the diagnostics the loss module reports
            ((ratio - 1).abs() > CLIP).float().mean()
            ((ratio - 1) - log_ratio).mean()
            1 - (target - value).var() / target.var()
        total = -gain.mean() + loss_critic - ENTROPY_COEF * entropy
        optim.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optim.step()

    return step


def _with_tanh(method: str, step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with ``fast_tanh``'s method set first (a global: the sides alternate)."""

    def run() -> None:
        set_tanh_method(method)
        step()

    return run


def _peer_round(python: str, script: str, options: list[str], key: str) -> Callable[[], float]:
    """One round of a TorchRL peer (``benchmarks/peers/<script>`` run by ``python``, a
    subprocess): the first value of its JSON's ``key``."""
    cmd = [python, str(PEERS / script), *options]

    def run() -> float:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(
                f"the TorchRL peer failed ({' '.join(cmd)}; --torchrl-python must be a Python "
                f"with torchrl installed):\n{proc.stderr[-2000:]}"
            )
        return float(json.loads(proc.stdout.strip().splitlines()[-1])[key][0])

    return run


def bench_mappo(args: argparse.Namespace) -> dict[str, Any]:
    auto = get_tanh_method()
    sides = {
        "marlkit": _marlkit_step(False),
        "floor": _floor_step(),
        "marlkit_torch_tanh": _marlkit_step(False, nn.Tanh),
        "marlkit_in_major": _marlkit_step(False, in_major=True),
        "marlkit_tensor_bounds": _marlkit_step(False, tensor_bounds=True),
    }
    if args.compile:
        sides["marlkit_compiled"] = _marlkit_step(True)
    sides = {name: _with_tanh(auto, step) for name, step in sides.items()}
    sides["marlkit_sigmoid_tanh"] = _with_tanh("sigmoid", _marlkit_step(False))
    rounds: dict[str, Callable[[], float]] = {
        name: functools.partial(seconds_per_call, step, args.round_seconds, warmup=2)
        for name, step in sides.items()
    }
    peers = ("torchrl", "torchrl_default_adam") if args.torchrl_python else ()
    for name, adam in zip(peers, ("fused", "default")):
        options = ["--round-seconds", str(args.round_seconds), "--threads", str(args.threads)]
        rounds[name] = _peer_round(
            args.torchrl_python,
            "torchrl_ppo_step.py",
            [*options, "--adam", adam],
            "seconds_per_step",
        )
    times = alternate(rounds, args.rounds)
    set_tanh_method(auto)
    out: dict[str, Any] = {
        "computes": {
            "marlkit": "ClipPPOLoss forward (TensorDict minibatch [400], group [400, 3]) + "
            "backward + grad-norm clip + Adam step",
            "floor": "the same networks and loss terms on plain tensors, hand-written, + "
            "backward + grad-norm clip + Adam step",
            "marlkit_torch_tanh": "marlkit's step with torch.nn.Tanh instead of the MLPs' "
            "default marlkit.modules.Tanh",
            "marlkit_sigmoid_tanh": "marlkit's step with marlkit.modules.Tanh's 'sigmoid' "
            "method (2 sigmoid(2x) - 1) whatever this machine's auto method",
            **(
                {
                    "torchrl": "the same step through TorchRL's ClipPPOLoss (clip 0.2, "
                    "entropy 0.01 from one sample, l2 critic loss, advantage normalisation) "
                    "and torchrl.modules.MultiAgentMLP 2 x 256 nn.Tanh networks, backward, "
                    "grad-norm clip, Adam(fused=True); in --torchrl-python, one process per "
                    "round (benchmarks/peers/torchrl_ppo_step.py)",
                    "torchrl_default_adam": "the torchrl side with torch's default Adam "
                    "(per-parameter on CPU), as TorchRL's tutorial leaves it",
                }
                if peers
                else {}
            ),
            "marlkit_in_major": "marlkit's step with the output layers' weights stored "
            "in-major ([1, 256, 4] and [1, 256, 1] contiguous) instead of StackedLinear's "
            "out-major default below 16 outputs: what the weight layout saves",
            "marlkit_tensor_bounds": "marlkit's step with the TanhNormal bounds given as [3, 2] "
            "tensors of -1 and 1 instead of the numbers -1.0 and 1.0 (the same values; the "
            "tensors add an identity affine map and a tensor check per update): what the MAPPO "
            "script saves since 2026-12-05 by passing uniform bounds as numbers",
        },
        "tanh_method": auto,
        "targets": {"ratio_marlkit_over_floor": "<= 1.2", "marlkit_ms": "<= 10"},
        **summary(times, "marlkit", "floor"),
    }
    for side, key in (
        ("marlkit_torch_tanh", "torch_tanh"),
        ("marlkit_sigmoid_tanh", "sigmoid_tanh"),
        ("marlkit_in_major", "in_major"),
        ("marlkit_tensor_bounds", "tensor_bounds"),
    ):
        out[f"ratio_{key}_over_marlkit"] = summary(times, side, "marlkit")[
            f"ratio_{side}_over_marlkit"
        ]
    if args.compile:
        out["ratio_compiled_over_eager"] = summary(times, "marlkit_compiled", "marlkit")[
            "ratio_marlkit_compiled_over_marlkit"
        ]
    for side in peers:
        out[f"ratio_marlkit_over_{side}"] = summary(times, "marlkit", side)[
            f"ratio_marlkit_over_{side}"
        ]
    return out


# --- end section: mappo ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------- qmix
def _qmix_networks() -> tuple[nn.Sequential, QMixer]:
    torch.manual_seed(0)
    q_net = nn.Sequential(
        nn.Linear(QMIX_OBS, QMIX_HIDDEN),
        nn.ReLU(),
        nn.Linear(QMIX_HIDDEN, QMIX_HIDDEN),
        nn.ReLU(),
        nn.Linear(QMIX_HIDDEN, QMIX_ACTIONS),
    )
    return q_net, QMixer([QMIX_STATE], QMIX_EMBED, QMIX_AGENTS)


def _qmix_marlkit(
    q_net: nn.Module, mixer: QMixer, batch: TensorDict, compiled: bool = False
) -> Callable[[], None]:
    loss = QMixerLoss(
        QValueActor(q_net, n_actions=QMIX_ACTIONS), mixer, gamma=QMIX_GAMMA, delay_value=True
    )
    run: Any = torch.compile(loss) if compiled else loss
    optim = torch.optim.Adam(loss.online_parameters(), lr=QMIX_LR, fused=True)
    updater = SoftUpdate(loss, tau=QMIX_TAU)

    def step() -> None:
        out = run(batch)
        optim.zero_grad()
        out["loss"].backward()
        optim.step()
        updater.step()

    return step


def _plain_mix(mixer: QMixer, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """QMIX's mixing by hand on ``mixer``'s layers: ``q [b, n, 1]``, ``s [b, S]`` -> ``[b, 1]``."""
    w1 = mixer.hyper_w_1(s).abs().view(-1, QMIX_AGENTS, QMIX_EMBED)
    b1 = mixer.hyper_b_1(s).view(-1, 1, QMIX_EMBED)
    hidden = nn.functional.elu(torch.bmm(q.view(-1, 1, QMIX_AGENTS), w1) + b1)
    w2 = mixer.hyper_w_final(s).abs().view(-1, QMIX_EMBED, 1)
    return (torch.bmm(hidden, w2) + mixer.V(s).view(-1, 1, 1)).view(-1, 1)


def _qmix_plain(q_net: nn.Module, mixer: QMixer, batch: TensorDict) -> Callable[[], None]:
    target_q, target_mixer = copy.deepcopy(q_net), copy.deepcopy(mixer)
    for p in (*target_q.parameters(), *target_mixer.parameters()):
        p.requires_grad_(False)
    online = [*q_net.parameters(), *mixer.parameters()]
    target = [*target_q.parameters(), *target_mixer.parameters()]
    optim = torch.optim.Adam(online, lr=QMIX_LR, fused=True)
    obs, action = batch["agents", "observation"], batch["agents", "action"]
    state, next_state = batch["state"], batch["next", "state"]
    next_obs, reward = batch["next", "agents", "observation"], batch["next", "agents", "reward"]
    terminated = batch["next", "terminated"]

    def step() -> None:
        chosen = q_net(obs).gather(-1, action.unsqueeze(-1))
        q_tot = _plain_mix(mixer, chosen, state)
        with torch.no_grad():
            next_q = target_q(next_obs).max(-1, keepdim=True).values
            next_tot = _plain_mix(target_mixer, next_q, next_state)
            y = reward.mean(-2) + QMIX_GAMMA * (~terminated).float() * next_tot
        loss = (q_tot - y).pow(2).mean()
        (q_tot.detach() - y).abs().squeeze(-1)  # the per-sample TD error, as the loss writes it
        optim.zero_grad()
        loss.backward()
        optim.step()
        with torch.no_grad():
            torch._foreach_lerp_(target, online, QMIX_TAU)

    return step


def _ms_per_step(step: Callable[[], None], steps: int) -> float:
    return 1e3 * seconds_per_call(step, 0.0, min_calls=steps)


def bench_qmix(args: argparse.Namespace) -> dict[str, Any]:
    batch = qmix_minibatch()
    q_net, mixer = _qmix_networks()
    sides = {
        "marlkit": _qmix_marlkit(copy.deepcopy(q_net), copy.deepcopy(mixer), batch.clone()),
        "plain": _qmix_plain(copy.deepcopy(q_net), copy.deepcopy(mixer), batch.clone()),
    }
    if args.compile:
        sides["marlkit_compiled"] = _qmix_marlkit(
            copy.deepcopy(q_net), copy.deepcopy(mixer), batch.clone(), compiled=True
        )
    for step in sides.values():  # warm-up (and the compilation)
        _ms_per_step(step, 5)
    measure: dict[str, Callable[[], float]] = {
        name: functools.partial(_ms_per_step, step, args.steps) for name, step in sides.items()
    }
    if args.torchrl_python:
        options = ["--steps", str(args.steps), "--threads", str(args.threads)]
        measure["torchrl"] = _peer_round(
            args.torchrl_python, "torchrl_qmix_step.py", options, "ms_per_step"
        )
    rounds = alternate(measure, args.rounds)
    ratios = [a / b for a, b in zip(rounds["marlkit"], rounds["plain"])]
    peer: dict[str, Any] = {}
    if args.torchrl_python:
        peer = {
            "torchrl_does": "the same step through TorchRL's QMixerLoss (QValueModule, QMixer "
            "over the state, delay_value, TD(0)) and SoftUpdate with Adam(fused=True), on the "
            "same minibatch and network sizes; in --torchrl-python, one process per round "
            "(benchmarks/peers/torchrl_qmix_step.py)",
            "torchrl_ms_per_step": statistics.median(rounds["torchrl"]),
            "marlkit_over_torchrl": statistics.median(
                a / b for a, b in zip(rounds["marlkit"], rounds["torchrl"])
            ),
        }
    compiled: dict[str, Any] = {}
    if args.compile:
        compiled = {
            "marlkit_compiled_does": "the marlkit step's work with the QMixerLoss module under "
            "torch.compile (compiled in the warm-up, not timed)",
            "marlkit_compiled_ms_per_step": statistics.median(rounds["marlkit_compiled"]),
            "compiled_over_eager": statistics.median(
                a / b for a, b in zip(rounds["marlkit_compiled"], rounds["marlkit"])
            ),
        }
    return {
        "minibatch": QMIX_BATCH,
        "agents": QMIX_AGENTS,
        "observation": QMIX_OBS,
        "actions": QMIX_ACTIONS,
        "state": QMIX_STATE,
        "q_network": f"MLP {QMIX_OBS}-{QMIX_HIDDEN}-{QMIX_HIDDEN}-{QMIX_ACTIONS}, shared",
        "mixer": f"QMixer embed {QMIX_EMBED}",
        "work": "both, per step: online Q-values and taken-action values, Q_tot by the mixer, "
        "target Q-network greedy next values and target mixer Q_tot' under no_grad, mean team "
        "reward, y = r + gamma (1 - terminated) Q_tot', squared-error loss, |Q_tot - y| per "
        "sample, backward, Adam.step, Polyak update (tau 0.005) of every target tensor; marlkit: "
        "QMixerLoss(QValueActor, QMixer) + SoftUpdate on a TensorDict; plain: the same networks "
        "called on tensors by a hand-written step; fixed minibatch, no replay sampling",
        "steps_per_round": args.steps,
        "marlkit_ms_per_step": statistics.median(rounds["marlkit"]),
        "plain_ms_per_step": statistics.median(rounds["plain"]),
        "marlkit_over_plain": statistics.median(ratios),
        "rounds": ratios,
        "target": {"marlkit_over_plain": 1.2},
        **compiled,
        **peer,
    }


SECTIONS = {"mappo": bench_mappo, "qmix": bench_qmix}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=5, round_seconds=2.0, threads=1)
    parser.add_argument("--steps", type=int, default=50, help="steps per side per round (qmix)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument(
        "--torchrl-python",
        default=None,
        help="a Python with TorchRL installed: also time TorchRL's steps (mappo, qmix)",
    )
    return run_sections("losses", SECTIONS, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
