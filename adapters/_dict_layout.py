"""How per-agent spaces map to batched tensors: the layout behind
:class:`~marlkit.adapters._dict_env.DictEnv` (:mod:`~marlkit.adapters._dict_writer` fills it).

* :func:`space_from_spec`: a per-agent marlkit spec as a Gymnasium space (the reverse of
  :func:`~marlkit.adapters._spaces.spec_from_space`), so that spaces and specs take one path.
* ``Leaf``: one observation entry (a leaf of a ``Dict``/``Tuple`` space), where it sits in an
  agent's value and under its group; ``GroupLayout``: a group's leaves, action space and mask.
* ``Arrays`` / ``Frame``: the NumPy arrays ``[E, n, ...]`` the env fills, one set per output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marlkit._utils import import_optional
from marlkit.adapters._spaces import GIVEN_SPEC, box_dtype, describe, numpy_dtype, spec_from_space
from marlkit.data.composite import Composite
from marlkit.data.keys import ACTION_MASK, OBSERVATION
from marlkit.data.specs import (
    Binary,
    Bounded,
    Categorical,
    MultiCategorical,
    TensorSpec,
    Unbounded,
)

__all__ = [
    "Arrays",
    "Frame",
    "GroupLayout",
    "Leaf",
    "as_space",
    "describe",
    "gym_spaces",
    "observation_leaves",
    "space_from_spec",
    "space_leaves",
]

Key = tuple[str, ...]


def gym_spaces() -> Any:
    """``gymnasium.spaces``, imported on first use (an ImportError names the extra)."""
    return import_optional("gymnasium", extra="gymnasium", purpose="per-agent spaces").spaces


def space_from_spec(spec: TensorSpec | Composite) -> Any:
    """The Gymnasium space of a per-agent marlkit spec (no batch dims): the reverse of
    :func:`~marlkit.adapters._spaces.spec_from_space`.

    Raises:
        TypeError: a spec without a Gymnasium equivalent (``OneHot``: use ``Categorical``).
    """
    spaces = gym_spaces()
    if isinstance(spec, Composite):
        return spaces.Dict({k: space_from_spec(spec[k]) for k in spec})
    space = _leaf_space(spec, spaces)
    # The space remembers the spec it was made from: the env declares that spec as given (its
    # type and dtype), where the space alone would say MultiBinary int8 for a bool Binary, a
    # MultiDiscrete for a Categorical with a shape, a Bounded box for an integer Unbounded.
    setattr(space, GIVEN_SPEC, spec)
    return space


def _leaf_space(spec: TensorSpec, spaces: Any) -> Any:
    shape = tuple(spec.shape)
    dtype = numpy_dtype(spec.dtype)
    if isinstance(spec, Bounded):
        return spaces.Box(spec.low.cpu().numpy(), spec.high.cpu().numpy(), shape, dtype)
    if isinstance(spec, Unbounded):
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            return spaces.Box(int(info.min), int(info.max), shape, dtype)
        return spaces.Box(-np.inf, np.inf, shape, dtype)
    if isinstance(spec, Categorical):
        if shape:
            return spaces.MultiDiscrete(np.full(shape, spec.n, dtype=np.int64))
        return spaces.Discrete(spec.n)
    if isinstance(spec, MultiCategorical):
        # nvec is per last dim, the same for the leading ones: spread over the spec's shape
        return spaces.MultiDiscrete(np.broadcast_to(spec.nvec.cpu().numpy(), shape).copy())
    if isinstance(spec, Binary):
        return spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    raise TypeError(
        f"a per-agent {type(spec).__name__} spec has no Gymnasium space; use Unbounded, Bounded, "
        "Categorical, MultiCategorical, Binary or a Composite of them"
    )


def as_space(value: Any, what: str) -> Any:
    """``value`` (a Gymnasium space or a per-agent marlkit spec) as a Gymnasium space."""
    if isinstance(value, (TensorSpec, Composite)):
        return space_from_spec(value)
    if isinstance(value, gym_spaces().Space):
        return value
    raise TypeError(f"{what} must be a Gymnasium space or a marlkit spec, got {value!r}")


@dataclass(frozen=True)
class Leaf:
    """One observation entry: where it sits in an agent's value and under the group."""

    key: Key  # under the group, e.g. ("observation",) or ("observation", "pos")
    path: tuple[Any, ...]  # into the agent's value, e.g. () or ("observation",)
    space: Any
    value_shape: tuple[int, ...]  # what the simulator gives
    store_shape: tuple[int, ...]  # per agent in the tensor
    dtype: np.dtype
    start: Any  # subtracted (Discrete/MultiDiscrete start), or None
    floating: bool


def space_leaves(space: Any, key: Key, path: tuple[Any, ...]) -> list[Leaf]:
    """The leaves of ``space`` (``Dict``/``Tuple`` walked), under ``key``, at ``path``."""
    spaces = gym_spaces()
    if isinstance(space, spaces.Dict):
        leaves: list[Leaf] = []
        for name, sub in space.spaces.items():
            leaves += space_leaves(sub, (*key, str(name)), (*path, name))
        return leaves
    if isinstance(space, spaces.Tuple):
        leaves = []
        for position, sub in enumerate(space.spaces):
            leaves += space_leaves(sub, (*key, str(position)), (*path, position))
        return leaves
    spec = spec_from_space(space, ())  # raises TypeError for unsupported spaces
    store = tuple(spec.shape)
    start: Any = None
    if isinstance(space, spaces.Box):
        value_shape, dtype = tuple(space.shape), box_dtype(space)
    elif isinstance(space, spaces.Discrete):
        value_shape, dtype, start = (), np.dtype(np.int64), int(space.start)
        start = start or None
    elif isinstance(space, spaces.MultiDiscrete):
        value_shape, dtype = tuple(space.nvec.shape), np.dtype(np.int64)
        start = np.asarray(space.start).reshape(-1) if np.any(space.start) else None
    else:  # MultiBinary
        value_shape, dtype = tuple(space.shape), np.dtype(np.int8)
    given = getattr(space, GIVEN_SPEC, None)
    if given is not None:  # stored in the dtype of the given spec
        dtype = numpy_dtype(given.dtype)
    floating = bool(np.issubdtype(dtype, np.floating))
    return [Leaf(key, path, space, value_shape, store, dtype, start, floating)]


@dataclass
class GroupLayout:
    """How a group's agents map to tensors (all agents of a group share their spaces)."""

    agents: list[str]
    leaves: list[Leaf]
    mask_path: tuple[Any, ...] | None  # action mask inside the observation, e.g. ("action_mask",)
    action_space: Any
    n_actions: int | None  # Discrete action spaces
    action_start: int
    masked: bool  # declares (group, "action_mask")
    turn_based: bool
    box: bool  # Box action space (the fast path for continuous actions)
    batch: torch.Size  # [*B, n]
    simple: bool = False  # one leaf, the agent's whole observation (the fast path)
    flat: bool = False  # every observation key is one level deep

    def __post_init__(self) -> None:
        self.flat = all(len(leaf.key) == 1 for leaf in self.leaves)
        leaf = self.leaves[0]
        self.simple = (
            len(self.leaves) == 1
            and not leaf.path
            and leaf.start is None
            and leaf.store_shape == leaf.value_shape
        )


@dataclass
class Arrays:
    """A group's observation-like arrays for the whole batch (``E`` envs, ``n`` agents)."""

    observations: list[np.ndarray]  # one [E, n, ...] per leaf
    mask: np.ndarray  # [E, n] bool
    action_mask: np.ndarray | None  # [E, n, A] bool
    acting: np.ndarray | None  # [E, n] bool

    @classmethod
    def blank(cls, layout: GroupLayout, num_envs: int) -> Arrays:
        lead = (num_envs, len(layout.agents))
        return cls(
            [np.zeros((*lead, *leaf.store_shape), leaf.dtype) for leaf in layout.leaves],
            np.zeros(lead, bool),
            np.ones((*lead, layout.n_actions or 0), bool) if layout.masked else None,
            np.zeros(lead, bool) if layout.turn_based else None,
        )

    def copy(self) -> Arrays:
        return Arrays(
            [leaf.copy() for leaf in self.observations],
            self.mask.copy(),
            None if self.action_mask is None else self.action_mask.copy(),
            None if self.acting is None else self.acting.copy(),
        )

    def zero_agent(self, env_index: int, agent_index: int) -> None:
        for leaf in self.observations:
            leaf[env_index, agent_index] = 0
        if self.action_mask is not None:
            self.action_mask[env_index, agent_index] = True


@dataclass
class Frame:
    """What the env last reported: per group arrays and the state ``[E, ...]``."""

    groups: dict[str, Arrays]
    state: np.ndarray | None

    def copy(self) -> Frame:
        state = None if self.state is None else self.state.copy()
        return Frame({group: arrays.copy() for group, arrays in self.groups.items()}, state)


def observation_leaves(space: Any) -> tuple[list[Leaf], tuple[Any, ...] | None]:
    """Leaves of an observation space, with ``Dict(observation=..., action_mask=...)`` split."""
    spaces = gym_spaces()
    if isinstance(space, spaces.Dict) and ACTION_MASK in space.spaces:
        rest = {name: sub for name, sub in space.spaces.items() if name != ACTION_MASK}
        if set(rest) == {OBSERVATION}:
            return space_leaves(rest[OBSERVATION], (OBSERVATION,), (OBSERVATION,)), (ACTION_MASK,)
        leaves: list[Leaf] = []
        for name, sub in rest.items():
            leaves += space_leaves(sub, (OBSERVATION, str(name)), (name,))
        return leaves, (ACTION_MASK,)
    return space_leaves(space, (OBSERVATION,), ()), None
