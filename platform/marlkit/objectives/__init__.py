"""Training objectives: value estimators (GAE, TD(lambda), TD(0)) and the clipped PPO loss
behind MAPPO and IPPO. See ``docs/algorithms.md``."""

from __future__ import annotations

from marlkit.objectives.ppo import ClipPPOLoss, PPOKeys
from marlkit.objectives.value import (
    GAE,
    TD0,
    EstimatorKeys,
    TDLambda,
    ValueEstimator,
    gae,
    td0,
    td_lambda,
)

__all__ = [
    "GAE",
    "TD0",
    "ClipPPOLoss",
    "EstimatorKeys",
    "PPOKeys",
    "TDLambda",
    "ValueEstimator",
    "gae",
    "td0",
    "td_lambda",
]
