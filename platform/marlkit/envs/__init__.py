"""The env API: ``EnvBase``, transforms, spec checks and the registry."""

from __future__ import annotations

from marlkit.envs._spec_utils import done_levels, make_done_spec, make_reward_spec
from marlkit.envs.batched import ParallelEnv, SerialEnv, WorkerError
from marlkit.envs.checks import SpecCheckError, check_env_specs, spec_problems
from marlkit.envs.common import EnvBase, IllegalActions, InvalidActionError, MissingActionError
from marlkit.envs.episodic import make_episodic
from marlkit.envs.registry import (
    AdapterUnavailableError,
    UnknownEnvError,
    accepted_kwargs,
    agent_count_kwarg,
    list_envs,
    make,
    register,
    register_adapter,
    registered,
    registered_adapters,
)
from marlkit.envs.transforms import (
    CommonReward,
    Compose,
    DoubleToFloat,
    EnvSpecs,
    ExcludeKeys,
    InitTracker,
    MissingCarriedError,
    RenameKeys,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
    TruncationAsTermination,
)

__all__ = [
    "AdapterUnavailableError",
    "CommonReward",
    "Compose",
    "DoubleToFloat",
    "EnvBase",
    "EnvSpecs",
    "ExcludeKeys",
    "IllegalActions",
    "InitTracker",
    "InvalidActionError",
    "MissingActionError",
    "MissingCarriedError",
    "ParallelEnv",
    "RenameKeys",
    "RewardSum",
    "SerialEnv",
    "SpecCheckError",
    "StepCounter",
    "Transform",
    "TransformedEnv",
    "TruncationAsTermination",
    "UnknownEnvError",
    "WorkerError",
    "accepted_kwargs",
    "agent_count_kwarg",
    "check_env_specs",
    "done_levels",
    "list_envs",
    "make",
    "make_done_spec",
    "make_episodic",
    "make_reward_spec",
    "register",
    "register_adapter",
    "registered",
    "registered_adapters",
    "spec_problems",
]
