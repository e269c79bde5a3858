"""Transforms and ``TransformedEnv``."""

from __future__ import annotations

from marlkit.envs.transforms.base import Compose, EnvSpecs, Transform, TransformedEnv
from marlkit.envs.transforms.common import (
    DoubleToFloat,
    ExcludeKeys,
    InitTracker,
    MissingCarriedError,
    RenameKeys,
    RewardSum,
    StepCounter,
)

__all__ = [
    "Compose",
    "DoubleToFloat",
    "EnvSpecs",
    "ExcludeKeys",
    "InitTracker",
    "MissingCarriedError",
    "RenameKeys",
    "RewardSum",
    "StepCounter",
    "Transform",
    "TransformedEnv",
]
