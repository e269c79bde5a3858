"""The data model: specs, key names, group maps and ``step_mdp``."""

from __future__ import annotations

from marlkit.data import keys
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, agent_type, make_group_map
from marlkit.data.keys import NestedKey, unravel_key
from marlkit.data.mdp import step_mdp
from marlkit.data.specs import (
    Binary,
    Bounded,
    Categorical,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "GroupMapLike",
    "MultiCategorical",
    "NestedKey",
    "OneHot",
    "TensorSpec",
    "Unbounded",
    "agent_type",
    "keys",
    "make_group_map",
    "step_mdp",
    "unravel_key",
]
