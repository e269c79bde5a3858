"""What one MAPPO gradient step of ``benchmarks/losses.py`` works on, shared by its marlkit side
and its TorchRL peer (``torchrl_ppo_step.py``, which runs without marlkit): the sizes, the loss
settings and the minibatch. Imports only torch and tensordict."""

from __future__ import annotations

import torch
from tensordict import TensorDict

MINIBATCH, N_AGENTS, OBS, ACT, CELLS = 400, 3, 18, 2, 256
CLIP, ENTROPY_COEF, CRITIC_COEF, MAX_GRAD_NORM = 0.2, 0.01, 1.0, 1.0


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
