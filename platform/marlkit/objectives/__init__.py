"""Training objectives: value estimators (GAE, TD(lambda), TD(0), n-step TD), the losses of the nine
algorithms (clipped PPO for MAPPO/IPPO; QMIX, VDN, IQL; MADDPG/IDDPG; MASAC/ISAC) and the
target-network updaters. Objectives import modules and data, never envs (DESIGN.md). See
``docs/algorithms.md``.
"""

from __future__ import annotations

from marlkit.objectives._common import DiscreteKeys, ValueKeys, ValueLoss
from marlkit.objectives._per_agent import AgentTDKeys, AgentTDLoss
from marlkit.objectives.ddpg import DDPGLoss
from marlkit.objectives.dqn import DQNLoss
from marlkit.objectives.ppo import ClipPPOLoss, PPOKeys
from marlkit.objectives.qmixer import QMixerLoss
from marlkit.objectives.sac import SACLoss
from marlkit.objectives.target import HardUpdate, SoftUpdate, TargetNetUpdater
from marlkit.objectives.value import (
    GAE,
    TD0,
    EstimatorKeys,
    NStepTD,
    TDLambda,
    ValueEstimator,
    gae,
    nstep_td,
    td0,
    td_lambda,
)

__all__ = [
    "GAE",
    "TD0",
    "AgentTDKeys",
    "AgentTDLoss",
    "ClipPPOLoss",
    "DDPGLoss",
    "DQNLoss",
    "DiscreteKeys",
    "EstimatorKeys",
    "HardUpdate",
    "NStepTD",
    "PPOKeys",
    "QMixerLoss",
    "SACLoss",
    "SoftUpdate",
    "TDLambda",
    "TargetNetUpdater",
    "ValueEstimator",
    "ValueKeys",
    "ValueLoss",
    "gae",
    "nstep_td",
    "td0",
    "td_lambda",
]
