"""Observation transforms: what image, grid and dict observations need before an MLP reads them.

* :class:`FlattenObservation`: the trailing (feature) dims of an entry into one, MAgent2's
  ``[*B, n, 13, 13, 5]`` into ``[*B, n, 845]``;
* :class:`ConcatObservation`: a nested observation (a ``Composite`` of entries, as MeltingPot's
  ``RGB`` next to ``READY_TO_SHOOT``) into one vector ``[*B, n, sum of their sizes]``;
* :class:`ToTensorImage`: pixels from ``HWC`` to ``CHW`` and from ``uint8`` to ``float`` in
  ``[0, 1]``, as a convolutional encoder reads them;
* :class:`AgentIdObservation`: each agent's one-hot index in its group appended to the group's
  observation, ``[*B, n, f]`` into ``[*B, n, f + n]`` (EPyMARL's ``obs_agent_id``), so that one
  network shared by the group's agents can tell them apart.

Each works on every group at once (by default every entry it applies to, found from the specs)
or on the entries named by ``in_keys``, whatever the env's batch (``[*B]``: ``num_envs``,
``[workers, num_envs]`` after ``ParallelEnv``), and changes the specs to match, so that
``check_env_specs`` holds on the transformed env. The feature dims of an entry are those after
the batch dims of the ``Composite`` holding it (``[*B, n]`` in a group, ``[*B]`` at the root).

A step reads actions only, so a step input reaches the inner env without the transformed
entries; a partial reset's input gets them back in the inner env's layout (the envs that are not
reset report what they reported before).

Examples:
    >>> import marlkit
    >>> from marlkit.envs.transforms import FlattenObservation, TransformedEnv
    >>> env = TransformedEnv(
    ...     marlkit.make("magent2/battle_v4", map_size=12, num_envs=2), FlattenObservation()
    ... )
    >>> env.observation_spec["red", "observation"].shape
    torch.Size([2, 2, 845])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_one_of, did_you_mean
from marlkit.data.composite import Composite
from marlkit.data.keys import OBSERVATION, STATE, NestedKey, check_keys, key_path
from marlkit.data.specs import (
    Binary,
    Bounded,
    Categorical,
    TensorSpec,
    Unbounded,
    format_shape,
)
from marlkit.envs.transforms.base import EnvSpecs, Transform
from marlkit.envs.transforms.common import _refuse_contract_leaf

__all__ = ["AgentIdObservation", "ConcatObservation", "FlattenObservation", "ToTensorImage"]

#: Entry names the default keys of :class:`FlattenObservation` and :class:`ConcatObservation`
#: are drawn from: each group's observation and the global state.
_DEFAULT_NAMES = (OBSERVATION, STATE)


def _holder(specs: EnvSpecs, key: NestedKey) -> Composite | None:
    """The Composite (observation or state spec) that holds ``key``, or ``None``."""
    for composite in (specs.observation, specs.state):
        if key in composite:
            return composite
    return None


def _lead(composite: Composite, key: NestedKey) -> int:
    """Batch dims of the entry at ``key``: those of the Composite right above it."""
    parent = key_path(key)[:-1]
    return composite[parent].ndim if parent else composite.ndim


def _entries(specs: EnvSpecs) -> list[tuple[NestedKey, Composite]]:
    """Every observation and state entry (leaves and nested Composites) and its holder."""
    out: list[tuple[NestedKey, Composite]] = []
    for composite in (specs.observation, specs.state):
        out.extend((key, composite) for key in composite.keys(True))
    return out


def _bounds(spec: TensorSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(low, high)`` of ``spec`` at its full shape, or ``None`` when it has none."""
    if isinstance(spec, Bounded):
        return spec.low.expand(spec.shape), spec.high.expand(spec.shape)
    if isinstance(spec, Categorical):
        low = torch.zeros(spec.shape, dtype=torch.int64, device=spec.device)
        return low, torch.full_like(low, spec.n - 1)
    if isinstance(spec, Binary):
        low = torch.zeros(spec.shape, dtype=torch.int64, device=spec.device)
        return low, torch.ones_like(low)
    return None


def _box(
    bounds: tuple[torch.Tensor, torch.Tensor] | None,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
) -> TensorSpec:
    """``Bounded`` with ``bounds`` (already at ``shape``) in ``dtype``, else ``Unbounded``."""
    if bounds is None:
        return Unbounded(shape, dtype, device)
    return Bounded(bounds[0].to(dtype), bounds[1].to(dtype), shape, dtype, device)


def _check_numeric(who: str, key: NestedKey, spec: TensorSpec) -> None:
    if not isinstance(spec, (Bounded, Unbounded, Categorical, Binary)):
        raise TypeError(
            f"{who}: {key!r} has a {type(spec).__name__} spec; it reshapes Bounded, Unbounded, "
            "Categorical and Binary entries"
        )


class _ObservationTransform(Transform):
    """Maps the entries at ``in_keys`` (observation or state entries) one by one, on reset and
    step outputs (``_forward``) and back on a partial reset's input (``_backward``)."""

    changes_done_flags = False

    def __init__(self, in_keys: Sequence[NestedKey] | None = None):
        who = type(self).__name__
        self._in_keys = None if in_keys is None else check_keys(who, "in_keys", in_keys)
        if self._in_keys is not None and not self._in_keys:
            raise ValueError(f"{who}: in_keys is empty; pass None for the default keys")
        for key in self._in_keys or ():
            _refuse_contract_leaf(who, key)
        self.in_keys: list[NestedKey] = []

    # ------------------------------------------------------------------ to implement
    def _wants(self, spec: TensorSpec | Composite, lead: int, key: NestedKey) -> bool:
        """Whether a default key (no ``in_keys``) is the entry ``key``."""
        raise NotImplementedError

    def _plan(
        self, key: NestedKey, spec: TensorSpec | Composite, lead: int
    ) -> TensorSpec | Composite:
        """Record how to map ``key`` and return its new spec; raise naming ``key`` when the
        entry cannot be mapped."""
        raise NotImplementedError

    def _forward(self, key: NestedKey, value: Any) -> Any:
        raise NotImplementedError

    def _backward(self, key: NestedKey, value: Any) -> Any:
        raise NotImplementedError

    _what = "entry"  # what the default keys are, for the message when there is none

    # ------------------------------------------------------------------ the transform
    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        who = type(self).__name__
        if self._in_keys is None:
            keys = [
                (key, holder)
                for key, holder in _entries(specs)
                if self._wants(holder[key], _lead(holder, key), key)
            ]
            if not keys:
                shapes = ", ".join(
                    f"{k!r} {format_shape(h[k].shape)}"
                    for k, h in _entries(specs)
                    if not isinstance(h[k], Composite)
                )
                raise ValueError(
                    f"{who}: the env has no {self._what} to transform (its observation and "
                    f"state entries: {shapes}); name the keys with in_keys, or drop the transform"
                )
        else:
            keys = []
            for key in self._in_keys:
                holder = _holder(specs, key)
                if holder is None:
                    known = [str(k) for k, _ in _entries(specs)]
                    raise KeyError(
                        f"{who}: {key!r} is neither an observation nor a state key; they are "
                        f"{[k for k, _ in _entries(specs)]}.{did_you_mean(str(key), known)}"
                    )
                keys.append((key, holder))
        for key, holder in keys:
            holder[key] = self._plan(key, holder[key], _lead(holder, key))
        self.in_keys = [key for key, _ in keys]
        return specs

    def _apply(self, tensordict: TensorDictBase, fn: Callable[[NestedKey, Any], Any]) -> None:
        for key in self.in_keys:
            value = tensordict.get(key, None)
            if value is not None:
                tensordict.del_(key)  # the entry may change kind (a TensorDict to a tensor)
                tensordict.set(key, fn(key, value))

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        self._apply(tensordict_reset, self._forward)
        return tensordict_reset

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self._apply(next_tensordict, self._forward)
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        # A step reads actions: the inner env gets the input without the mapped entries (which
        # no longer fit its specs), and no time is spent mapping them back.
        present = [key for key in self.in_keys if tensordict.get(key, None) is not None]
        return tensordict.exclude(*present) if present else tensordict

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        present = [key for key in self.in_keys if tensordict.get(key, None) is not None]
        if not present:
            return tensordict
        out = tensordict.clone(False)
        self._apply(out, self._backward)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(in_keys={self.in_keys or self._in_keys})"


class FlattenObservation(_ObservationTransform):
    """Flatten the feature dims of observation entries into one: ``[*B, n, 13, 13, 5]`` ->
    ``[*B, n, 845]`` (C order: the last dim varies fastest), so that an MLP reads an image or
    grid observation. Bounds follow the entries.

    Args:
        in_keys: the entries to flatten; default every group's ``"observation"`` and the
            ``"state"`` with more than one feature dim. Named in ``env.transforms`` of a
            training config as ``flatten_observation``.

    Raises:
        KeyError: an ``in_keys`` entry the env does not have (when attached).
        ValueError: an entry that is already flat, or no entry to flatten by default.

    Examples:
        >>> import marlkit
        >>> from marlkit.envs.transforms import FlattenObservation, TransformedEnv
        >>> env = marlkit.make("magent2/battle_v4", map_size=12, num_envs=2, state=False)
        >>> env = TransformedEnv(env, FlattenObservation(in_keys=[("blue", "observation")]))
        >>> env.rollout(3)["blue", "observation"].shape, env.rollout(3)["red", "observation"].shape
        (torch.Size([2, 3, 2, 845]), torch.Size([2, 3, 2, 13, 13, 5]))
    """

    _what = "observation or state with more than one feature dim"

    def __init__(self, in_keys: Sequence[NestedKey] | None = None):
        super().__init__(in_keys)
        self._features: dict[NestedKey, torch.Size] = {}

    def _wants(self, spec: TensorSpec | Composite, lead: int, key: NestedKey) -> bool:
        return (
            not isinstance(spec, Composite)
            and key_path(key)[-1] in _DEFAULT_NAMES
            and spec.ndim - lead > 1
        )

    def _plan(
        self, key: NestedKey, spec: TensorSpec | Composite, lead: int
    ) -> TensorSpec | Composite:
        if isinstance(spec, Composite):
            raise ValueError(
                f"FlattenObservation: {key!r} is a nested observation (entries "
                f"{spec.keys(True, True)}); join its entries with ConcatObservation "
                "(concat_observation)"
            )
        features = spec.shape[lead:]
        if len(features) <= 1:
            raise ValueError(
                f"FlattenObservation: {key!r} {format_shape(spec.shape)} has "
                f"{len(features)} feature dim after its batch dims "
                f"{format_shape(spec.shape[:lead])}: there is nothing to flatten"
            )
        _check_numeric("FlattenObservation", key, spec)
        self._features[key] = features
        shape = (*spec.shape[:lead], math.prod(features))
        if isinstance(spec, Categorical):  # each element stays a category
            return Categorical(spec.n, shape, spec.dtype, spec.device)
        if isinstance(spec, Binary):
            return Binary(shape[-1], shape, spec.dtype, spec.device)
        bounds = _bounds(spec)
        if bounds is not None:
            bounds = (bounds[0].reshape(shape), bounds[1].reshape(shape))
        return _box(bounds, shape, spec.dtype, spec.device)

    def _forward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(-len(self._features[key]))

    def _backward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        return value.unflatten(-1, self._features[key])


class ConcatObservation(_ObservationTransform):
    """Join the entries of a nested observation (a ``Composite``, e.g. ``(group,
    "observation")`` holding ``"RGB"`` ``[*B, n, 88, 88, 3]`` uint8 and ``"READY_TO_SHOOT"``
    ``[*B, n]``) into one vector at the same key, ``[*B, n, sum of their sizes]``: each entry
    flattened, in the order of the spec's keys (:attr:`layout` lists them), cast to one float
    dtype (float32, or a wider float dtype of an entry). The spec is ``Bounded`` when every
    entry has bounds, ``Unbounded`` otherwise.

    Args:
        in_keys: the nested observations to join; default every one named ``"observation"``
            or ``"state"``. Named in ``env.transforms`` as ``concat_observation``.

    Raises:
        KeyError: an ``in_keys`` entry the env does not have (when attached).
        ValueError: an entry that is not nested, or no nested observation by default.
        TypeError: an entry of a spec it cannot flatten.
    """

    _what = "nested observation (a Composite named 'observation' or 'state')"

    def __init__(self, in_keys: Sequence[NestedKey] | None = None):
        super().__init__(in_keys)
        #: Per joined key: ``[(entry, feature shape, dtype), ...]`` in the vector's order.
        self.layout: dict[NestedKey, list[tuple[NestedKey, torch.Size, torch.dtype]]] = {}
        self._dtypes: dict[NestedKey, torch.dtype] = {}

    def _wants(self, spec: TensorSpec | Composite, lead: int, key: NestedKey) -> bool:
        return isinstance(spec, Composite) and key_path(key)[-1] in _DEFAULT_NAMES

    def _plan(
        self, key: NestedKey, spec: TensorSpec | Composite, lead: int
    ) -> TensorSpec | Composite:
        if not isinstance(spec, Composite):
            raise ValueError(
                f"ConcatObservation: {key!r} is a single entry {format_shape(spec.shape)}, not "
                "a nested observation (a Composite of entries); for feature dims, use "
                "FlattenObservation (flatten_observation)"
            )
        # items(True, True) yields leaves only: TensorSpecs
        leaves = [(k, v) for k, v in spec.items(True, True) if isinstance(v, TensorSpec)]
        if not leaves:
            raise ValueError(f"ConcatObservation: {key!r} holds no entries")
        batch = spec.shape  # the nested Composite's batch dims ([*B, n] in a group)
        layout: list[tuple[NestedKey, torch.Size, torch.dtype]] = []
        lows: list[torch.Tensor] = []
        highs: list[torch.Tensor] = []
        bounded = True
        for sub, leaf in leaves:
            _check_numeric("ConcatObservation", (*key_path(key), *key_path(sub)), leaf)
            features = leaf.shape[spec.ndim :]
            layout.append((sub, features, leaf.dtype))
            bounds = _bounds(leaf)
            bounded = bounded and bounds is not None
            if bounds is not None:
                lows.append(bounds[0].reshape(*batch, -1).double())
                highs.append(bounds[1].reshape(*batch, -1).double())
        floats = [leaf.dtype for _, leaf in leaves if leaf.dtype.is_floating_point]
        dtype = functools.reduce(torch.promote_types, floats, torch.float32)
        self.layout[key], self._dtypes[key] = layout, dtype
        size = sum(math.prod(f) for _, f, _ in layout)
        shape = (*batch, size)
        box = (torch.cat(lows, -1), torch.cat(highs, -1)) if bounded else None
        device = spec.device if spec.device is not None else leaves[0][1].device
        return _box(box, shape, dtype, device)

    def _forward(self, key: NestedKey, value: TensorDictBase) -> torch.Tensor:
        dtype = self._dtypes[key]
        parts = []
        for sub, features, _ in self.layout[key]:
            x = value.get(sub)
            x = x.flatten(-len(features)) if features else x.unsqueeze(-1)
            parts.append(x.to(dtype))
        return torch.cat(parts, -1)

    def _backward(self, key: NestedKey, value: torch.Tensor) -> TensorDictBase:
        layout = self.layout[key]
        sizes = [math.prod(features) for _, features, _ in layout]
        out = TensorDict({}, batch_size=value.shape[:-1], device=value.device)
        for (sub, features, dtype), part in zip(layout, value.split(sizes, -1)):
            x = part.unflatten(-1, features) if features else part.squeeze(-1)
            if dtype == torch.bool:
                x = x > 0.5
            elif not dtype.is_floating_point:
                x = x.round()
            out.set(sub, x.to(dtype))
        return out


class ToTensorImage(_ObservationTransform):
    """Pixels as a convolutional encoder reads them: ``[..., H, W, C]`` -> ``[..., C, H, W]``
    and ``uint8`` in ``[0, 255]`` -> ``float`` in ``[0, 1]`` (other dtypes are cast, not
    scaled), as TorchRL's ``ToTensorImage``.

    Args:
        in_keys: the image entries; default every observation and state entry with three
            feature dims (``H, W, C``), nested ones included (MeltingPot's ``RGB``).
        layout: ``"CHW"`` (channels first, the default) or ``"HWC"`` (only cast and scale).
        dtype: the float dtype of the output (``"float32"`` or a ``torch.dtype``).

    Named in ``env.transforms`` as ``pixels`` (``{name: pixels, layout: HWC}``).

    Raises:
        KeyError: an ``in_keys`` entry the env does not have (when attached).
        ValueError: an entry without three feature dims, or none by default.
    """

    _what = "image entry (three feature dims, H, W, C)"

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        *,
        layout: Literal["CHW", "HWC"] = "CHW",
        dtype: torch.dtype | str = torch.float32,
    ):
        super().__init__(in_keys)
        self.layout = check_one_of("layout", layout, ("CHW", "HWC"), owner="ToTensorImage")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)  # type: ignore[assignment]
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                f"ToTensorImage: dtype must be a float dtype (float32, float16, ...), got {dtype!r}"
            )
        self.dtype = dtype
        self._inner: dict[NestedKey, torch.dtype] = {}

    def _wants(self, spec: TensorSpec | Composite, lead: int, key: NestedKey) -> bool:
        return not isinstance(spec, Composite) and spec.ndim - lead == 3

    def _plan(
        self, key: NestedKey, spec: TensorSpec | Composite, lead: int
    ) -> TensorSpec | Composite:
        if isinstance(spec, Composite) or spec.ndim - lead != 3:
            got = (
                "a nested observation"
                if isinstance(spec, Composite)
                else (
                    f"{format_shape(spec.shape)}: {spec.ndim - lead} feature dims after its batch "
                    f"dims {format_shape(spec.shape[:lead])}"
                )
            )
            raise ValueError(
                f"ToTensorImage: {key!r} is not an image [..., H, W, C] (it is {got}); name "
                "image entries in in_keys"
            )
        _check_numeric("ToTensorImage", key, spec)
        self._inner[key] = spec.dtype
        bounds = _bounds(spec)
        if spec.dtype == torch.uint8:
            bounds = (
                torch.zeros(spec.shape, dtype=self.dtype, device=spec.device),
                torch.ones(spec.shape, dtype=self.dtype, device=spec.device),
            )
        if bounds is not None:
            bounds = (self._permute(bounds[0]), self._permute(bounds[1]))
        shape = self._permute(torch.empty(spec.shape, device="meta")).shape
        return _box(bounds, shape, self.dtype, spec.device)

    def _permute(self, x: torch.Tensor) -> torch.Tensor:
        return x.movedim(-1, -3) if self.layout == "CHW" else x

    def _forward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        x = value.to(self.dtype)
        if value.dtype == torch.uint8:
            x = x.div_(255.0)
        return self._permute(x)

    def _backward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        x = value.movedim(-3, -1) if self.layout == "CHW" else value
        dtype = self._inner[key]
        if dtype == torch.uint8:
            return (x * 255.0).round_().clamp_(0, 255).to(torch.uint8)
        return x.round().to(dtype) if not dtype.is_floating_point else x.to(dtype)

    def __repr__(self) -> str:
        keys = self.in_keys or self._in_keys
        return f"ToTensorImage(in_keys={keys}, layout={self.layout!r}, dtype={self.dtype})"


class AgentIdObservation(_ObservationTransform):
    """Append each agent's one-hot index in its group to the group's observation, as EPyMARL's
    ``obs_agent_id: True`` does (its default for MAPPO, IPPO, QMIX, VDN and IQL): ``(group,
    "observation")`` ``[*B, n, f]`` -> ``[*B, n, f + n]``, agent ``i`` of the group with a 1 at
    column ``f + i`` and 0 in the other ``n - 1`` id columns, the same for every batch entry. One
    network shared by the group's agents (``share_params=True``) can then tell them apart.

    A floating observation keeps its dtype; an integer or bool one (a ``Categorical``, a
    ``Binary``, ``uint8`` counts) is cast to ``float32``, values unchanged, as
    :class:`ConcatObservation` casts (its bounds kept; a partial reset's input is rounded back to
    the simulator's dtype). The spec is ``Bounded`` (the entry's bounds, then ``[0, 1]`` for the
    id columns) where the entry has bounds, ``Unbounded`` otherwise. A partial reset's input
    gets the id columns stripped off; a step input reaches the inner env without the entry.

    Args:
        in_keys: the group observations to extend; default every group's ``"observation"``
            (not the root ``"state"``: it has no agents' dim). Named in ``env.transforms`` as
            ``agent_id``; an image or grid observation is flattened first (``[flatten_observation,
            agent_id]``), a nested one joined first (``[concat_observation, agent_id]``).

    Raises:
        KeyError: an ``in_keys`` entry the env does not have (when attached).
        ValueError: an entry outside a group (no agents' dim), a nested observation (use
            ``concat_observation`` first), one with other than one feature dim (use
            ``flatten_observation`` first), or no group observation by default.
        TypeError: an entry of a spec it cannot extend (``OneHot``, ``MultiCategorical``).

    Examples:
        >>> import marlkit
        >>> from marlkit.envs.transforms import AgentIdObservation, TransformedEnv
        >>> env = marlkit.make("navigation", num_envs=2, n_agents=3)
        >>> env = TransformedEnv(env, AgentIdObservation())
        >>> env.reset()["agents", "observation"][0, :, -3:]
        tensor([[1., 0., 0.],
                [0., 1., 0.],
                [0., 0., 1.]])
    """

    _what = "group observation (a group's 'observation' [*B, n, f])"

    def __init__(self, in_keys: Sequence[NestedKey] | None = None):
        super().__init__(in_keys)
        self._root_ndim = 0
        #: Per key: the id columns ``[n, n]`` (an eye in the output dtype), expanded each step.
        self._eyes: dict[NestedKey, torch.Tensor] = {}
        #: Per key: the inner env's feature size ``f`` and dtype (a partial reset's input).
        self._inner: dict[NestedKey, tuple[int, torch.dtype]] = {}

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        self._root_ndim = specs.observation.ndim  # a group's entries have one dim more
        return super().transform_specs(specs)

    def _wants(self, spec: TensorSpec | Composite, lead: int, key: NestedKey) -> bool:
        path = key_path(key)
        return len(path) == 2 and path[-1] == OBSERVATION and lead == self._root_ndim + 1

    def _plan(
        self, key: NestedKey, spec: TensorSpec | Composite, lead: int
    ) -> TensorSpec | Composite:
        who = "AgentIdObservation"
        if isinstance(spec, Composite):
            raise ValueError(
                f"{who}: {key!r} is a nested observation (entries {spec.keys(True, True)}); join "
                "its entries into one vector first: env.transforms: [concat_observation, "
                "agent_id] (ConcatObservation, then AgentIdObservation)"
            )
        if lead != self._root_ndim + 1:
            raise ValueError(
                f"{who}: {key!r} {format_shape(spec.shape)} is not a group's entry (no agents' "
                f"dim after the env's batch dims {format_shape(spec.shape[: self._root_ndim])}); "
                "it appends each agent's index to a group's observation [*B, n, f]"
            )
        features = spec.shape[lead:]
        if len(features) != 1:
            fix = (
                "flatten them first: env.transforms: [flatten_observation, agent_id] "
                "(FlattenObservation, then AgentIdObservation)"
                if features
                else "it extends a vector per agent"
            )
            raise ValueError(
                f"{who}: {key!r} {format_shape(spec.shape)} has {len(features)} feature dims "
                f"after its batch dims {format_shape(spec.shape[:lead])}, not one; {fix}"
            )
        _check_numeric(who, key, spec)
        n, f = spec.shape[lead - 1], features[0]
        dtype = spec.dtype if spec.dtype.is_floating_point else torch.float32
        self._eyes[key] = torch.eye(n, dtype=dtype, device=spec.device)
        self._inner[key] = (f, spec.dtype)
        shape = (*spec.shape[:lead], f + n)
        bounds = _bounds(spec)
        if bounds is not None:
            ids = torch.zeros((*spec.shape[:lead], n), dtype=dtype, device=spec.device)
            bounds = (
                torch.cat((bounds[0].to(dtype), ids), -1),
                torch.cat((bounds[1].to(dtype), ids + 1), -1),
            )
        return _box(bounds, shape, dtype, spec.device)

    def _forward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        eye = self._eyes[key]
        if eye.device != value.device:  # the env's output on another device than its spec
            eye = self._eyes[key] = eye.to(value.device)
        if value.dtype != eye.dtype:
            value = value.to(eye.dtype)
        return torch.cat((value, eye.expand(*value.shape[:-1], eye.shape[-1])), -1)

    def _backward(self, key: NestedKey, value: torch.Tensor) -> torch.Tensor:
        f, dtype = self._inner[key]
        n = self._eyes[key].shape[-1]
        if value.shape[-1] != f + n:
            raise ValueError(
                f"AgentIdObservation: {key!r} of a partial reset's input has "
                f"{value.shape[-1]} features, expected {f + n} ({f} of the env's observation "
                f"and {n} id columns): {format_shape(value.shape)}"
            )
        x = value[..., :f]
        if dtype == torch.bool:
            return x > 0.5
        return x if dtype.is_floating_point else x.round().to(dtype)
