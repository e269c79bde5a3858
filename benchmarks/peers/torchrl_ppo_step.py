"""The peer side of ``benchmarks/losses.py --only mappo --torchrl-python PY``: one MAPPO gradient
step through TorchRL's ``ClipPPOLoss``.

Runs under a Python that has TorchRL (0.14) installed, not marlkit's venv:

    /path/to/torchrl-venv/bin/python benchmarks/peers/torchrl_ppo_step.py --round-seconds 2

The same step as the ``marlkit`` side of ``benchmarks/losses.py``'s ``mappo`` section: a
minibatch of 400 of 3 agents, observation 18 and action 2 per agent; actor TorchRL
``MultiAgentMLP`` 2 x 256 ``nn.Tanh`` (shared parameters) -> ``NormalParamExtractor`` ->
``TanhNormal``; centralised critic ``MultiAgentMLP`` 2 x 256 ``nn.Tanh`` (shared parameters);
``ClipPPOLoss`` (clip 0.2, entropy 0.01 from one sample, squared-error critic loss of weight 1,
advantage normalisation), the three terms summed, backward, gradient norm clipped at 1,
``torch.optim.Adam(fused=True)`` (as marlkit's side; ``--adam default``: torch's default Adam,
per-parameter on CPU, as TorchRL's tutorial leaves it), ``zero_grad(set_to_none=True)``. Prints
one JSON line: the seconds per step of each round (each round ``--round-seconds`` of steps after
a warm-up).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from step_spec import (  # this folder: the marlkit side's sizes, settings and minibatch
    ACT,
    CELLS,
    CLIP,
    CRITIC_COEF,
    ENTROPY_COEF,
    MAX_GRAD_NORM,
    N_AGENTS,
    OBS,
    minibatch,
)
from tensordict.nn import TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
from torchrl.objectives import ClipPPOLoss


def make_step(fused: bool):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    actor_net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=OBS,
            n_agent_outputs=2 * ACT,
            n_agents=N_AGENTS,
            centralised=False,
            share_params=True,
            depth=2,
            num_cells=CELLS,
            activation_class=nn.Tanh,
        ),
        NormalParamExtractor(),
    )
    policy = ProbabilisticActor(
        TensorDictModule(
            actor_net,
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "loc"), ("agents", "scale")],
        ),
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[("agents", "action")],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -torch.ones(ACT), "high": torch.ones(ACT)},
        return_log_prob=True,
        log_prob_key=("agents", "action_log_prob"),
    )
    critic = TensorDictModule(
        MultiAgentMLP(
            n_agent_inputs=OBS,
            n_agent_outputs=1,
            n_agents=N_AGENTS,
            centralised=True,
            share_params=True,
            depth=2,
            num_cells=CELLS,
            activation_class=nn.Tanh,
        ),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "state_value")],
    )
    loss = ClipPPOLoss(
        actor_network=policy,
        critic_network=critic,
        clip_epsilon=CLIP,
        entropy_coeff=ENTROPY_COEF,
        critic_coeff=CRITIC_COEF,
        loss_critic_type="l2",
        normalize_advantage=True,
    )
    loss.set_keys(
        action=("agents", "action"),
        sample_log_prob=("agents", "action_log_prob"),
        value=("agents", "state_value"),
        advantage=("agents", "advantage"),
        value_target=("agents", "value_target"),
    )
    params = list(loss.parameters())  # built once, as on marlkit's side
    optim = torch.optim.Adam(params, lr=3e-4, fused=fused or None)
    data = minibatch()

    def step() -> None:
        terms = loss(data)
        total = terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]
        optim.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optim.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--round-seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--adam", choices=["fused", "default"], default="fused")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    step = make_step(args.adam == "fused")
    for _ in range(args.warmup):
        step()
    rounds = []
    for _ in range(args.rounds):
        count, start = 0, time.perf_counter()
        while True:
            step()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= args.round_seconds:
                break
        rounds.append(elapsed / count)
    import torchrl

    print(
        json.dumps(
            {
                "side": "torchrl",
                "torchrl": torchrl.__version__,
                "torch": torch.__version__,
                "seconds_per_step": rounds,
                "does": "TorchRL ClipPPOLoss (clip 0.2, entropy 0.01 from one sample, l2 critic "
                "loss, advantage normalisation) on the marlkit side's minibatch, networks "
                "torchrl.modules.MultiAgentMLP 2 x 256 nn.Tanh (shared; critic centralised), "
                f"backward, grad-norm clip 1, Adam ({args.adam})",
            }
        )
    )


if __name__ == "__main__":
    main()
