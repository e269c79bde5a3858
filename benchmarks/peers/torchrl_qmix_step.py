"""The peer side of ``benchmarks/losses.py --only qmix --torchrl-python PY``: one QMIX gradient
step through TorchRL's ``QMixerLoss``.

Runs under a Python that has TorchRL (0.14) installed, not marlkit's venv:

    /path/to/torchrl-venv/bin/python benchmarks/peers/torchrl_qmix_step.py --steps 50

The same step as the ``marlkit`` side of ``benchmarks/losses.py``'s ``qmix`` section, on the
same minibatch (``step_spec.qmix_minibatch``: 400 transitions of 3 agents, observation 10, 5
actions, state 18): a Q-network 10-256-256-5 (ReLU) shared by the agents behind TorchRL's
``QValueModule``, TorchRL's ``QMixer`` (embed 32) over the state, target copies of both
(``delay_value=True``), TD(0) with gamma 0.99 on the team reward (the mean of the agents',
written at the root once, outside the timed step, as TorchRL's own script does per batch),
``torch.optim.Adam(fused=True)`` (as marlkit's side), ``SoftUpdate`` (tau 0.005). Prints one JSON
line: the milliseconds per step of each round (each round ``--steps`` steps after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from step_spec import (  # this folder: the marlkit side's sizes, settings and minibatch
    QMIX_ACTIONS,
    QMIX_AGENTS,
    QMIX_EMBED,
    QMIX_GAMMA,
    QMIX_HIDDEN,
    QMIX_LR,
    QMIX_OBS,
    QMIX_STATE,
    QMIX_TAU,
    qmix_minibatch,
)
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import QMixer, QValueModule, SafeSequential
from torchrl.objectives import QMixerLoss, SoftUpdate, ValueEstimators


def make_step():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(QMIX_OBS, QMIX_HIDDEN),
        nn.ReLU(),
        nn.Linear(QMIX_HIDDEN, QMIX_HIDDEN),
        nn.ReLU(),
        nn.Linear(QMIX_HIDDEN, QMIX_ACTIONS),
    )
    qnet = SafeSequential(
        TensorDictModule(
            net, in_keys=[("agents", "observation")], out_keys=[("agents", "action_value")]
        ),
        QValueModule(
            action_value_key=("agents", "action_value"),
            out_keys=[
                ("agents", "action"),
                ("agents", "action_value"),
                ("agents", "chosen_action_value"),
            ],
            action_space="categorical",
        ),
    )
    mixer = TensorDictModule(
        QMixer(
            state_shape=(QMIX_STATE,),
            mixing_embed_dim=QMIX_EMBED,
            n_agents=QMIX_AGENTS,
            device="cpu",
        ),
        in_keys=[("agents", "chosen_action_value"), "state"],
        out_keys=["chosen_action_value"],
    )
    loss = QMixerLoss(qnet, mixer, delay_value=True, action_space="categorical")
    loss.set_keys(
        action_value=("agents", "action_value"),
        local_value=("agents", "chosen_action_value"),
        global_value="chosen_action_value",
        action=("agents", "action"),
    )
    loss.make_value_estimator(ValueEstimators.TD0, gamma=QMIX_GAMMA)
    updater = SoftUpdate(loss, eps=1 - QMIX_TAU)
    optim = torch.optim.Adam(loss.parameters(), lr=QMIX_LR, fused=True)
    data = qmix_minibatch()
    data["next", "reward"] = data["next", "agents", "reward"].mean(-2)
    del data["next", "agents", "reward"]
    data["next", "done"] = data["next", "terminated"].clone()

    def step() -> None:
        out = loss(data)
        optim.zero_grad()
        out["loss"].backward()
        optim.step()
        updater.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    step = make_step()
    for _ in range(args.warmup):
        step()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rounds.append(1e3 * (time.perf_counter() - start) / args.steps)
    import torchrl

    print(
        json.dumps(
            {
                "side": "torchrl",
                "torchrl": torchrl.__version__,
                "torch": torch.__version__,
                "ms_per_step": rounds,
                "does": "TorchRL QMixerLoss (QValueModule over a shared 10-256-256-5 ReLU "
                "Q-network, QMixer embed 32 over the state, target copies, TD(0) gamma 0.99 on "
                "the root team reward) on the marlkit side's minibatch, backward, "
                "Adam(fused=True), SoftUpdate tau 0.005",
            }
        )
    )


if __name__ == "__main__":
    main()
