"""``Composite``: a nested mapping of specs that describes a whole TensorDict.

A Composite's ``shape`` is the batch shape of the TensorDict it describes; every child's shape
starts with it. A group sub-spec has the group's batch shape ``[*B, n_agents]``::

    Composite(
        agents=Composite(observation=Unbounded((1024, 4, 14)), shape=(1024, 4)),
        shape=(1024,),
    )
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.data.keys import NestedKey, unravel_key
from marlkit.data.specs import (
    DeviceLike,
    ShapeLike,
    TensorSpec,
    _as_device,
    _as_size,
    format_shape,
)

__all__ = ["Composite", "SpecLike"]

SpecLike = Union[TensorSpec, "Composite"]


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    key = unravel_key(key)
    return (key,) if isinstance(key, str) else key


def _out_key(path: tuple[str, ...]) -> NestedKey:
    return path[0] if len(path) == 1 else path


class Composite:
    """Specs under (nested) keys, mirroring a TensorDict.

    Args:
        specs: mapping of key to spec (a leaf spec, a Composite, or a plain mapping that becomes
            a Composite of the same shape). Keyword arguments are added too.
        shape: the batch shape of the described TensorDict.
        device: optional device every child is moved to.
    """

    def __init__(
        self,
        specs: Mapping[str, SpecLike | Mapping[str, Any]] | None = None,
        *,
        shape: ShapeLike = (),
        device: DeviceLike | None = None,
        **kwargs: SpecLike,
    ):
        self.shape = _as_size(shape)
        self.device = None if device is None else _as_device(device)
        self._specs: dict[str, SpecLike] = {}
        for key, spec in {**(dict(specs) if specs else {}), **kwargs}.items():
            self[key] = spec

    # ------------------------------------------------------------------ mapping
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype every leaf shares, or ``None`` when the leaves mix dtypes (or there are
        none), as in TorchRL."""
        dtypes = {spec.dtype for _, spec in self.items(include_nested=True, leaves_only=True)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def _child(self, key: str) -> SpecLike:
        try:
            return self._specs[key]
        except KeyError:
            raise KeyError(f"no spec under key {key!r}; keys here: {sorted(self._specs)}") from None

    def __getitem__(self, key: NestedKey) -> SpecLike:
        path = _as_tuple(key)
        node: SpecLike = self
        for i, part in enumerate(path):
            if not isinstance(node, Composite):
                raise KeyError(f"{_out_key(path[:i])!r} is a leaf spec, so {key!r} does not exist")
            node = node._child(part)
        return node

    def get(self, key: NestedKey, default: Any = None) -> Any:
        """The spec at ``key``, or ``default`` when absent."""
        return self[key] if key in self else default  # noqa: SIM401 (self.get would recurse)

    def __setitem__(self, key: NestedKey, spec: SpecLike | Mapping[str, Any]) -> None:
        path = _as_tuple(key)
        node = self
        created: tuple[Composite, str] | None = None  # the first intermediate made here
        for part in path[:-1]:
            if part not in node._specs:
                node._specs[part] = Composite(shape=node.shape, device=node.device)
                created = created or (node, part)
            child = node._specs[part]
            if not isinstance(child, Composite):
                raise KeyError(f"cannot set {key!r}: {part!r} holds a leaf spec")
            node = child
        try:
            node._set_direct(path[-1], spec, key)
        except (TypeError, ValueError):
            if created is not None:  # a rejected spec leaves no empty intermediate behind
                del created[0]._specs[created[1]]
            raise

    def _set_direct(
        self, name: str, spec: SpecLike | Mapping[str, Any], full_key: NestedKey
    ) -> None:
        if isinstance(spec, Mapping) and not isinstance(spec, Composite):
            spec = Composite(spec, shape=self.shape, device=self.device)
        if not isinstance(spec, (TensorSpec, Composite)):
            raise TypeError(f"the spec for {full_key!r} must be a spec, got {type(spec).__name__}")
        if spec.shape[: self.ndim] != self.shape:
            raise ValueError(
                f"the spec for {full_key!r} has shape {format_shape(spec.shape)}, which does not "
                f"start with the Composite's shape {format_shape(self.shape)}"
            )
        if self.device is not None and spec.device != self.device:
            spec = spec.to(self.device)
        self._specs[name] = spec

    def __delitem__(self, key: NestedKey) -> None:
        path = _as_tuple(key)
        parent = self[path[:-1]] if len(path) > 1 else self
        if not isinstance(parent, Composite) or path[-1] not in parent._specs:
            raise KeyError(f"no spec under key {key!r}")
        del parent._specs[path[-1]]

    def pop(self, key: NestedKey, *default: Any) -> Any:
        """Remove and return the spec at ``key`` (or ``default`` when given and absent)."""
        if key not in self:
            if default:
                return default[0]
            raise KeyError(f"no spec under key {key!r}")
        spec = self[key]
        del self[key]
        return spec

    def __contains__(self, key: object) -> bool:
        try:
            path = _as_tuple(key)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        node: SpecLike = self
        for part in path:
            if not isinstance(node, Composite) or part not in node._specs:
                return False
            node = node._specs[part]
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def is_empty(self) -> bool:
        """True when no leaf spec lives anywhere below."""
        return not self.keys(include_nested=True, leaves_only=True)

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list[NestedKey]:
        """Keys in insertion order; nested ones as tuples when ``include_nested``."""
        return [k for k, _ in self.items(include_nested, leaves_only)]

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> list[SpecLike]:
        return [v for _, v in self.items(include_nested, leaves_only)]

    def items(
        self, include_nested: bool = False, leaves_only: bool = False
    ) -> list[tuple[NestedKey, SpecLike]]:
        """``(key, spec)`` pairs; nested keys are tuples."""
        out: list[tuple[NestedKey, SpecLike]] = []
        for name, spec in self._specs.items():
            is_comp = isinstance(spec, Composite)
            if not (leaves_only and is_comp):
                out.append((name, spec))
            if include_nested and isinstance(spec, Composite):
                for sub, sub_spec in spec.items(True, leaves_only):
                    out.append(((name, *_as_tuple(sub)), sub_spec))
        return out

    def _leaf_items(self) -> list[tuple[NestedKey, TensorSpec]]:
        """``(key, leaf spec)`` for every leaf, nested keys as tuples."""
        return [
            (key, spec)
            for key, spec in self.items(include_nested=True, leaves_only=True)
            if not isinstance(spec, Composite)
        ]

    def update(self, other: Composite | Mapping[str, SpecLike]) -> Composite:
        """Set every leaf of ``other`` here (nested keys merged); returns ``self``."""
        if isinstance(other, Composite):
            # Parents come before their children: a new sub-Composite keeps its own (group)
            # shape instead of being auto-created with the parent's.
            for key, spec in other.items(include_nested=True):
                if not isinstance(spec, Composite):
                    self[key] = spec
                elif key not in self:
                    self[key] = Composite(shape=spec.shape, device=spec.device)
        else:
            for key, spec in other.items():
                self[key] = spec
        return self

    def select(self, *keys: NestedKey) -> Composite:
        """A new Composite with only ``keys`` (each must exist)."""
        out = Composite(shape=self.shape, device=self.device)
        for key in keys:
            spec = self[key]
            for i in range(1, len(_as_tuple(key))):
                prefix = _as_tuple(key)[:i]
                if prefix not in out:
                    sub = self[prefix]
                    out[prefix] = Composite(shape=sub.shape, device=sub.device)
            out[key] = spec.clone()
        return out

    def exclude(self, *keys: NestedKey) -> Composite:
        """A copy without ``keys`` (absent keys are ignored)."""
        out = self.clone()
        for key in keys:
            if key in out:
                del out[key]
        return out

    # ------------------------------------------------------------------ data
    def rand(
        self, shape: ShapeLike = (), *, generator: torch.Generator | None = None
    ) -> TensorDictBase:
        """A TensorDict of batch ``[*shape, *self.shape]`` with a random value per leaf."""
        lead = _as_size(shape)
        return self._build(lead, lambda spec: spec.rand(lead, generator=generator))

    def zero(self, shape: ShapeLike = ()) -> TensorDictBase:
        """A TensorDict of batch ``[*shape, *self.shape]`` with each leaf's zero element."""
        lead = _as_size(shape)
        return self._build(lead, lambda spec: spec.zero(lead))

    def _build(self, lead: torch.Size, leaf: Any) -> TensorDictBase:
        data: dict[str, Any] = {}
        for name, spec in self._specs.items():
            data[name] = spec._build(lead, leaf) if isinstance(spec, Composite) else leaf(spec)
        return TensorDict(data, batch_size=lead + self.shape, device=self.device)

    def explain(
        self, td: Any, *, strict: bool = False, leading_dims: bool = False
    ) -> list[tuple[NestedKey, str]]:
        """Every ``(key, reason)`` for which ``td`` disagrees with this spec (empty when in spec).

        Args:
            td: the TensorDict to check.
            strict: also report leaves of ``td`` that no spec describes.
            leading_dims: accept extra leading dims on every entry (e.g. time).
        """
        if not isinstance(td, TensorDictBase):
            return [((), f"expected a TensorDict, got {type(td).__name__}")]
        problems: list[tuple[NestedKey, str]] = []
        for key, spec in self._leaf_items():
            value = td.get(key, None)
            if value is None:
                problems.append((key, f"missing (expected {spec!r})"))
                continue
            reason = spec.explain(value, leading_dims=leading_dims)
            if reason is not None:
                problems.append((key, reason))
        if strict:
            known = set(self.keys(include_nested=True, leaves_only=True))
            for key in td.keys(include_nested=True, leaves_only=True):
                if key not in known:
                    problems.append((key, "present in the data but absent from the spec"))
        return problems

    def is_in(self, td: Any) -> bool:
        """Whether every leaf spec finds a value of ``td`` inside it."""
        return not self.explain(td)

    def project(self, td: TensorDictBase) -> TensorDictBase:
        """A new TensorDict with each described leaf of ``td`` projected onto its spec."""
        out = td.clone(False)
        for key, spec in self._leaf_items():
            if key in td.keys(include_nested=True):
                out.set(key, spec.project(td.get(key)))
        return out

    # ------------------------------------------------------------------ transforms
    def expand(self, *shape: int | Sequence[int]) -> Composite:
        """A Composite of batch shape ``shape``, which must end with ``self.shape``."""
        target = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        new_shape = _as_size(target)  # type: ignore[arg-type]
        if len(new_shape) < self.ndim or new_shape[len(new_shape) - self.ndim :] != self.shape:
            raise ValueError(
                f"cannot expand a Composite of shape {format_shape(self.shape)} to "
                f"{format_shape(new_shape)}: the new shape must end with the old one"
            )
        lead = new_shape[: len(new_shape) - self.ndim]
        return Composite(
            {name: spec.expand(lead + spec.shape) for name, spec in self._specs.items()},
            shape=new_shape,
            device=self.device,
        )

    def to(self, device: DeviceLike) -> Composite:
        """A copy with every child on ``device``."""
        return Composite(
            {name: spec.to(device) for name, spec in self._specs.items()},
            shape=self.shape,
            device=device,
        )

    def clone(self) -> Composite:
        """A deep copy."""
        return Composite(
            {name: spec.clone() for name, spec in self._specs.items()},
            shape=self.shape,
            device=self.device,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Composite):
            return NotImplemented
        return (
            self.shape == other.shape
            and self.device == other.device
            and self._specs.keys() == other._specs.keys()
            and all(spec == other._specs[k] for k, spec in self._specs.items())
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for name, spec in self._specs.items():
            child = repr(spec).replace("\n", "\n    ")
            lines.append(f"    {name}: {child},")
        device = f", device={self.device}" if self.device is not None else ""
        lines.append(f"    shape={format_shape(self.shape)}{device})")
        return "\n".join(lines)
