"""Transforms and ``TransformedEnv``."""

from __future__ import annotations

from marlkit.envs.transforms.base import Compose, EnvSpecs, Transform, TransformedEnv
from marlkit.envs.transforms.common import (
    CommonReward,
    DoubleToFloat,
    ExcludeKeys,
    InitTracker,
    MissingCarriedError,
    RenameKeys,
    RewardSum,
    StepCounter,
    TruncationAsTermination,
)
from marlkit.envs.transforms.named import TRANSFORMS, make_transform, make_transforms
from marlkit.envs.transforms.observation import (
    AgentIdObservation,
    ConcatObservation,
    FlattenObservation,
    ToTensorImage,
)

__all__ = [
    "TRANSFORMS",
    "AgentIdObservation",
    "CommonReward",
    "Compose",
    "ConcatObservation",
    "DoubleToFloat",
    "EnvSpecs",
    "ExcludeKeys",
    "FlattenObservation",
    "InitTracker",
    "MissingCarriedError",
    "RenameKeys",
    "RewardSum",
    "StepCounter",
    "ToTensorImage",
    "Transform",
    "TransformedEnv",
    "TruncationAsTermination",
    "make_transform",
    "make_transforms",
]
