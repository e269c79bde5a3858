"""What the gradient steps of ``benchmarks/losses.py`` work on, shared by its marlkit sides and
its TorchRL peers (``torchrl_ppo_step.py``, ``torchrl_qmix_step.py``, which run without
marlkit): the sizes, the loss settings and the minibatches. Imports only torch and
tensordict."""

from __future__ import annotations

import torch
from tensordict import TensorDict

MINIBATCH, N_AGENTS, OBS, ACT, CELLS = 400, 3, 18, 2, 256
CLIP, ENTROPY_COEF, CRITIC_COEF, MAX_GRAD_NORM = 0.2, 0.01, 1.0, 1.0


QMIX_BATCH, QMIX_AGENTS, QMIX_OBS, QMIX_ACTIONS, QMIX_STATE = 400, 3, 10, 5, 18
QMIX_HIDDEN, QMIX_EMBED, QMIX_GAMMA, QMIX_TAU, QMIX_LR = 256, 32, 0.99, 0.005, 5e-4


def minibatch() -> TensorDict:
    """A minibatch ``[400]`` with group ``"agents"`` ``[400, 3]``: observations, actions in
    ``(-0.9, 0.9)``, their old log-probs, advantages, value targets and old values (seed 0)."""
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


def qmix_minibatch(seed: int = 0) -> TensorDict:
    """A QMIX minibatch ``[400]``: group ``"agents"`` ``[400, 3]`` (observations, actions in
    ``[0, 5)``), the global ``"state"``, and ``"next"`` with the next observations and state,
    per-agent rewards ``[400, 3, 1]`` and ``"terminated"`` ``[400, 1]`` (5 % of them)."""
    g = torch.Generator().manual_seed(seed)
    b, n = QMIX_BATCH, QMIX_AGENTS

    def step() -> TensorDict:
        return TensorDict(
            {
                "agents": TensorDict(
                    {"observation": torch.randn(b, n, QMIX_OBS, generator=g)}, [b, n]
                ),
                "state": torch.randn(b, QMIX_STATE, generator=g),
            },
            [b],
        )

    td = step()
    td["agents", "action"] = torch.randint(QMIX_ACTIONS, (b, n), generator=g)
    nxt = step()
    nxt["agents", "reward"] = torch.randn(b, n, 1, generator=g)
    nxt["terminated"] = torch.rand(b, 1, generator=g) < 0.05
    td["next"] = nxt
    return td
