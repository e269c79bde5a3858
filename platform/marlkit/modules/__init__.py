"""Neural modules for multi-agent policies and critics: batched per-agent MLPs and GRUs,
action distributions, probabilistic actors, state-value critics and value normalisation.

Every module reads and writes group keys (``(group, "observation")`` ``[*B, n_agents, obs]``,
``(group, "action")``, ``(group, "state_value")`` ``[*B, n_agents, 1]``, ...); see
``docs/algorithms.md``.
"""

from __future__ import annotations

from marlkit.modules.actors import NormalParamExtractor, ProbabilisticActor, distribution_keys
from marlkit.modules.critics import StateValueCritic, ValueNorm
from marlkit.modules.distributions import Categorical, MaskedCategorical, Normal, TanhNormal
from marlkit.modules.mlp import MultiAgentMLP, StackedLinear
from marlkit.modules.rnn import MultiAgentGRU, recurrent_mode, set_recurrent_mode

__all__ = [
    "Categorical",
    "MaskedCategorical",
    "MultiAgentGRU",
    "MultiAgentMLP",
    "Normal",
    "NormalParamExtractor",
    "ProbabilisticActor",
    "StackedLinear",
    "StateValueCritic",
    "TanhNormal",
    "ValueNorm",
    "distribution_keys",
    "recurrent_mode",
    "set_recurrent_mode",
]
