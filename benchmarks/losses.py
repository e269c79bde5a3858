"""Loss gradient steps through marlkit's loss modules against hand-written plain-torch steps of
the same networks (the floor); prints one JSON object.

Sections (``--only NAME``, repeatable; default all):

* ``mappo``: one MAPPO gradient step on a minibatch of 400, 3 agents, observation 18 and
  action 2 per agent; actor ``MultiAgentMLP`` 2x256 Tanh -> ``TanhNormal``, centralised critic
  ``MultiAgentMLP`` 2x256 Tanh (shared parameters); Adam, grad-norm clip 1.0.

  - ``marlkit``: ``ClipPPOLoss`` on a TensorDict minibatch (advantage normalisation, clipped
    objective, sampled entropy of the TanhNormal, critic loss, diagnostics), backward, clip,
    Adam step.
  - ``floor``: the same networks and the same terms written by hand on plain tensors (the
    TanhNormal log-prob by its closed form), backward, clip, Adam step.

  Targets: ``marlkit / floor <= 1.2`` and ``<= 10 ms`` per step (TorchRL 0.14.1: 15.6 ms, 1
  thread). ``--compile`` also times the marlkit step with the loss module under
  ``torch.compile``.

Sides alternate round by round; times are medians, the ratio the median of per-round ratios.

    python benchmarks/losses.py
    python benchmarks/losses.py --only mappo --rounds 7 --compile
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict

from _timing import alternate, summary
from marlkit.bench import describe_environment, set_threads
from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
)
from marlkit.objectives import ClipPPOLoss

MINIBATCH, N_AGENTS, OBS, ACT, CELLS = 400, 3, 18, 2, 256
CLIP, ENTROPY_COEF, CRITIC_COEF, MAX_GRAD_NORM = 0.2, 0.01, 1.0, 1.0


# --- section: mappo -------------------------------------------------------------------------------


def _minibatch() -> TensorDict:
    g = torch.Generator().manual_seed(0)
    shape = (MINIBATCH, N_AGENTS)
    group = TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=g),
            "action": torch.rand(*shape, ACT, generator=g) * 1.8 - 0.9,
            "action_log_prob": torch.randn(*shape, generator=g) - 1,
            "advantage": torch.randn(*shape, 1, generator=g),
            "value_target": torch.randn(*shape, 1, generator=g),
            "state_value": torch.randn(*shape, 1, generator=g),
        },
        list(shape),
    )
    return TensorDict({"agents": group}, [MINIBATCH])


def _networks() -> tuple[ProbabilisticActor, StateValueCritic]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        MultiAgentMLP(OBS, 2 * ACT, N_AGENTS, num_cells=CELLS), NormalParamExtractor()
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    critic = StateValueCritic(N_AGENTS, OBS, centralised=True, num_cells=CELLS)
    return actor, critic


def _marlkit_step(compiled: bool) -> Callable[[], None]:
    actor, critic = _networks()
    loss = ClipPPOLoss(
        actor, critic, clip_epsilon=CLIP, entropy_coef=ENTROPY_COEF, critic_coef=CRITIC_COEF
    )
    run: Any = torch.compile(loss) if compiled else loss
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)
    data = _minibatch()

    def step() -> None:
        out = run(data)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optim.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(loss.parameters(), MAX_GRAD_NORM)
        optim.step()

    return step


def _floor_step() -> Callable[[], None]:
    actor, critic = _networks()
    actor_mlp, extractor = actor.module[0].module[0], actor.module[0].module[1]
    critic_mlp = critic.module
    params = [*actor_mlp.parameters(), *critic_mlp.parameters()]
    optim = torch.optim.Adam(params, lr=3e-4)
    d = _minibatch()["agents"]
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


def bench_mappo(args: argparse.Namespace) -> dict[str, Any]:
    sides = {"marlkit": _marlkit_step(False), "floor": _floor_step()}
    if args.compile:
        sides["marlkit_compiled"] = _marlkit_step(True)
    times = alternate(sides, args.rounds, args.round_seconds)
    out: dict[str, Any] = {
        "computes": {
            "marlkit": "ClipPPOLoss forward (TensorDict minibatch [400], group [400, 3]) + "
            "backward + grad-norm clip + Adam step",
            "floor": "the same networks and loss terms on plain tensors, hand-written, + "
            "backward + grad-norm clip + Adam step",
        },
        "targets": {"ratio_marlkit_over_floor": "<= 1.2", "marlkit_ms": "<= 10"},
        **summary(times, "marlkit", "floor"),
    }
    if args.compile:
        out["ratio_compiled_over_eager"] = summary(times, "marlkit_compiled", "marlkit")[
            "ratio_marlkit_compiled_over_marlkit"
        ]
    return out


# --- end section: mappo ---------------------------------------------------------------------------


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"mappo": bench_mappo}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS), default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args()
    set_threads(args.threads)
    out: dict[str, Any] = {"benchmark": "losses", **describe_environment()}
    for name in args.only or sorted(SECTIONS):
        out[name] = SECTIONS[name](args)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
