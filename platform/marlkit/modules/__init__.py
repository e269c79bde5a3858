"""Neural modules for multi-agent policies, critics and mixers, as TensorDict modules: batched
per-agent MLPs and GRUs (with a ``Tanh`` that takes this machine's faster route), action
distributions, probabilistic and Q-value actors, epsilon-greedy and Gaussian exploration,
state-value and state-action-value critics, tanh bounds, value normalisation, and the VDN /
QMIX mixers.

Every module reads and writes group keys (``(group, "observation")`` ``[*B, n_agents, obs]``,
``(group, "action")``, ``(group, "state_value")`` ``[*B, n_agents, 1]``, ...); see
``docs/algorithms.md``. Modules import only ``marlkit.data``, ``marlkit.native``,
``marlkit._utils``, ``marlkit._checks``, torch and tensordict (DESIGN.md).
"""

from __future__ import annotations

from marlkit.modules.activations import (
    ACTIVATIONS,
    Tanh,
    activation_class,
    fast_tanh,
    get_tanh_method,
    set_tanh_method,
)
from marlkit.modules.actors import NormalParamExtractor, ProbabilisticActor, distribution_keys
from marlkit.modules.cnn import MultiAgentCNN
from marlkit.modules.continuous import AdditiveGaussian, StateActionValueCritic, TanhBounds
from marlkit.modules.critics import StateValueCritic, StateWithAgentId, ValueNorm
from marlkit.modules.distributions import Categorical, MaskedCategorical, Normal, TanhNormal
from marlkit.modules.entities import DeepSets, EntityAttention
from marlkit.modules.graph import MultiAgentGNN, full_graph, radius_graph
from marlkit.modules.initialisation import dense_layers, orthogonal_init_
from marlkit.modules.mixers import Mixer, QMixer, VDNMixer
from marlkit.modules.mlp import MultiAgentMLP, StackedLinear
from marlkit.modules.models import ModelConfig, build_model
from marlkit.modules.qvalue import EGreedy, QValueActor, annealing_steps
from marlkit.modules.rnn import MultiAgentGRU, MultiAgentLSTM, recurrent_mode, set_recurrent_mode

__all__ = [
    "ACTIVATIONS",
    "AdditiveGaussian",
    "Categorical",
    "DeepSets",
    "EGreedy",
    "EntityAttention",
    "MaskedCategorical",
    "Mixer",
    "ModelConfig",
    "MultiAgentCNN",
    "MultiAgentGNN",
    "MultiAgentGRU",
    "MultiAgentLSTM",
    "MultiAgentMLP",
    "Normal",
    "NormalParamExtractor",
    "ProbabilisticActor",
    "QMixer",
    "QValueActor",
    "StackedLinear",
    "StateActionValueCritic",
    "StateValueCritic",
    "StateWithAgentId",
    "Tanh",
    "TanhBounds",
    "TanhNormal",
    "VDNMixer",
    "ValueNorm",
    "activation_class",
    "annealing_steps",
    "build_model",
    "dense_layers",
    "distribution_keys",
    "fast_tanh",
    "full_graph",
    "get_tanh_method",
    "orthogonal_init_",
    "radius_graph",
    "recurrent_mode",
    "set_recurrent_mode",
    "set_tanh_method",
]
