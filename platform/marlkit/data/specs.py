"""Leaf tensor specs: shape, dtype, device and domain of one entry of a TensorDict.

Every spec's ``shape`` is the *full* shape of the entry, batch dimensions included (TorchRL's
convention): a per-agent continuous action of an env with 1024 envs and 4 agents has
``shape == (1024, 4, 2)``. :class:`~marlkit.data.composite.Composite` groups specs under keys.

Each spec answers ``rand()`` (a sample inside the domain), ``zero()`` (a fixed element inside the
domain), ``is_in(value)``, ``explain(value)`` (why a value is *not* in the spec, or ``None``),
``project(value)`` (the nearest-ish element of the domain), ``expand()``, ``to()``, ``clone()``,
``==`` and a readable ``repr``. Floating values that are NaN or infinite are never in a spec.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any

import torch

from marlkit._checks import check_int

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "MultiCategorical",
    "OneHot",
    "ShapeLike",
    "TensorSpec",
    "Unbounded",
    "format_shape",
]

ShapeLike = int | Sequence[int] | torch.Size
DeviceLike = str | torch.device | int


def _as_size(shape: ShapeLike, what: str = "shape") -> torch.Size:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        size = torch.Size([int(s) for s in shape])  # type: ignore[union-attr]
    except (TypeError, ValueError) as err:
        raise TypeError(f"{what} must be a sequence of ints, got {shape!r}") from err
    if any(s < 0 for s in size):
        raise ValueError(f"{what} must have non-negative sizes, got {list(size)}")
    return size


def _as_device(device: DeviceLike | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    device = torch.device(device)
    if device.type == "cpu":  # "cpu:0": tensors made there report "cpu"
        return torch.device("cpu")
    if device.index is None and device.type != "meta":
        # "cuda" -> "cuda:0" (the current one): tensors report an index, and a spec on "cuda"
        # must accept the tensors it creates itself.
        device = torch.empty(0, device=device).device
    return device


def format_shape(shape: Sequence[int]) -> str:
    """``torch.Size([2, 3])`` -> ``"[2, 3]"``, for messages."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


#: int spans from which a Bounded spec samples in float64 (below it, exact int64 offsets)
_EXACT_SPAN = float(2**53)
_BELOW_2_63 = float(2**63 - 2**10)  # the largest float64 below 2**63


def _short(value: torch.Tensor, limit: int = 6) -> str:
    flat = value.detach().reshape(-1)
    items = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:limit].tolist())
    return f"[{items}{', ...' if flat.numel() > limit else ''}]"


class TensorSpec(abc.ABC):
    """Base class of leaf specs.

    Args:
        shape: full shape of the entry, batch dimensions included.
        dtype: dtype of the entry.
        device: device of the entry (default cpu).
    """

    def __init__(self, shape: ShapeLike, dtype: torch.dtype, device: DeviceLike | None = None):
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.shape = _as_size(shape)
        self.dtype = dtype
        self.device = _as_device(device)

    # ----------------------------------------------------------------- to implement
    @abc.abstractmethod
    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        """A sample of shape ``shape`` (already ``leading + self.shape``)."""

    @abc.abstractmethod
    def _zero(self, shape: torch.Size) -> torch.Tensor:
        """A fixed element of the domain, of shape ``shape``."""

    @abc.abstractmethod
    def _explain_domain(self, value: torch.Tensor) -> str | None:
        """Why ``value`` (right shape, dtype and device, finite) is outside the domain."""

    @abc.abstractmethod
    def _project(self, value: torch.Tensor) -> torch.Tensor:
        """Map ``value`` (right shape, cast to ``dtype``) into the domain."""

    @abc.abstractmethod
    def _params(self) -> dict[str, Any]:
        """Constructor arguments besides shape/dtype/device (tensors shaped like ``shape``)."""

    # ----------------------------------------------------------------- public API
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def rand(
        self, shape: ShapeLike = (), *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A random element, of shape ``[*shape, *self.shape]``."""
        return self._rand(_as_size(shape) + self.shape, generator)

    def zero(self, shape: ShapeLike = ()) -> torch.Tensor:
        """A fixed element inside the domain (zeros where zero is allowed)."""
        return self._zero(_as_size(shape) + self.shape)

    def explain(self, value: Any, *, leading_dims: bool = False) -> str | None:
        """Say why ``value`` is not in this spec, or return ``None`` when it is.

        Args:
            value: the candidate tensor.
            leading_dims: accept extra leading dimensions (e.g. a time dimension).
        """
        if not isinstance(value, torch.Tensor):
            return f"expected a torch.Tensor, got {type(value).__name__}"
        shape_ok = (
            value.shape[value.ndim - self.ndim :] == self.shape and value.ndim >= self.ndim
            if leading_dims
            else value.shape == self.shape
        )
        if not shape_ok:
            return f"shape {format_shape(value.shape)} != spec shape {format_shape(self.shape)}"
        if value.dtype != self.dtype:
            return f"dtype {_dtype_name(value.dtype)} != spec dtype {_dtype_name(self.dtype)}"
        if value.device != self.device:
            return f"device {value.device} != spec device {self.device}"
        if value.is_floating_point():
            bad = ~torch.isfinite(value)
            if bad.any():
                idx = bad.nonzero()[0].tolist()
                return f"non-finite value {value[tuple(idx)].item()} at index {idx}"
        return self._explain_domain(value)

    def is_in(self, value: Any) -> bool:
        """Whether ``value`` has this spec's shape, dtype, device and lies in its domain."""
        return self.explain(value) is None

    def project(self, value: torch.Tensor) -> torch.Tensor:
        """Return ``value`` cast to the spec's dtype/device and mapped into the domain.

        NaN becomes the spec's zero element; shapes must already match (leading dims allowed).
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"project expects a torch.Tensor, got {type(value).__name__}")
        if value.shape[value.ndim - self.ndim :] != self.shape or value.ndim < self.ndim:
            raise ValueError(
                f"cannot project a value of shape {format_shape(value.shape)} onto a spec of "
                f"shape {format_shape(self.shape)}"
            )
        if value.is_floating_point():
            zero = self._zero(value.shape).to(value.dtype)
            value = torch.where(torch.isnan(value), zero.to(value.device), value)
        return self._project(value.to(self.device))

    def expand(self, *shape: int | Sequence[int]) -> TensorSpec:
        """A spec of shape ``shape``, which must end with ``self.shape`` (leading dims added)."""
        target = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        new_shape = _as_size(target)  # type: ignore[arg-type]
        if len(new_shape) < self.ndim or new_shape[len(new_shape) - self.ndim :] != self.shape:
            raise ValueError(
                f"cannot expand a spec of shape {format_shape(self.shape)} to "
                f"{format_shape(new_shape)}: the new shape must end with the old one"
            )
        params = {
            k: v.expand(new_shape[: len(new_shape) - self.ndim] + v.shape).clone()
            if isinstance(v, torch.Tensor)
            and v.shape[: self.ndim] == self.shape
            and self._shaped(k)
            else v
            for k, v in self._params().items()
        }
        return type(self)(shape=new_shape, dtype=self.dtype, device=self.device, **params)

    def to(self, device: DeviceLike) -> TensorSpec:
        """A copy on ``device``."""
        device = torch.device(device)
        params = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self._params().items()
        }
        return type(self)(shape=self.shape, dtype=self.dtype, device=device, **params)

    def clone(self) -> TensorSpec:
        """A deep copy."""
        params = {
            k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self._params().items()
        }
        return type(self)(shape=self.shape, dtype=self.dtype, device=self.device, **params)

    def _shaped(self, name: str) -> bool:
        """Whether parameter ``name`` is a tensor laid out like ``shape`` (expanded with it)."""
        return name in ("low", "high", "mask")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, TensorSpec)  # narrowed by the type check above
        if (self.shape, self.dtype, self.device) != (other.shape, other.dtype, other.device):
            return False
        mine, theirs = self._params(), other._params()
        for key, value in mine.items():
            other_value = theirs[key]
            if isinstance(value, torch.Tensor) or isinstance(other_value, torch.Tensor):
                if not (
                    isinstance(value, torch.Tensor)
                    and isinstance(other_value, torch.Tensor)
                    and value.shape == other_value.shape
                    and torch.equal(value, other_value)
                ):
                    return False
            elif value != other_value:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def _repr_param(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            if value.numel() > 0 and bool((value == value.reshape(-1)[0]).all()):
                return repr(value.reshape(-1)[0].item())
            return f"tensor(shape={format_shape(value.shape)})"
        return repr(value)

    def __repr__(self) -> str:
        parts = [f"shape={format_shape(self.shape)}", f"dtype={_dtype_name(self.dtype)}"]
        parts.append(f"device={self.device}")
        parts += [f"{k}={self._repr_param(v)}" for k, v in self._params().items() if v is not None]
        return f"{type(self).__name__}({', '.join(parts)})"


class Unbounded(TensorSpec):
    """Any finite value of the given shape and dtype.

    Args:
        shape: full shape, batch dims included (e.g. ``[*B, n_agents, obs_dim]``).
        dtype: default float32.
        device: default cpu.
    """

    def __init__(
        self,
        shape: ShapeLike = (),
        dtype: torch.dtype = torch.float32,
        device: DeviceLike | None = None,
    ):
        super().__init__(shape, dtype, device)

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return torch.randn(shape, generator=generator, device=self.device, dtype=self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator, device=self.device).bool()
        return torch.randint(-100, 101, shape, generator=generator, device=self.device).to(
            self.dtype
        )

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return torch.nan_to_num(value.to(self.dtype))
        if self.dtype == torch.bool:
            return value.to(self.dtype)
        # An integer dtype: saturate at its range (a cast wraps 300 to 44 in int8, and gives
        # inf no defined value), NaN to 0, as floats project.
        info = torch.iinfo(self.dtype)
        if value.is_floating_point():
            value = torch.nan_to_num(value.double().round(), nan=0.0)
            low, high = float(info.min), float(info.max)
            # float64 rounds int64's max up to 2**63: values there saturate in integers below.
            big = value >= high
            value = value.clamp(min=low, max=high).to(torch.int64)
            value = torch.where(big, torch.full_like(value, info.max), value)
            return value.to(self.dtype)
        return value.long().clamp(min=info.min, max=info.max).to(self.dtype)

    def _params(self) -> dict[str, Any]:
        return {}


def _broadcast_bound(
    bound: float | torch.Tensor,
    shape: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    name: str,
) -> torch.Tensor:
    raw = torch.as_tensor(bound, device=device)
    if raw.is_floating_point() and not torch.isfinite(raw).all():
        raise ValueError(
            f"Bounded needs finite low and high, got {name}={_short(raw)}; use Unbounded for an "
            "open domain"
        )
    if not dtype.is_floating_point and raw.numel() > 0:
        info = torch.iinfo(dtype)
        if (raw < info.min).any() or (raw > info.max).any():
            raise ValueError(
                f"{name}={_short(raw)} does not fit in dtype {_dtype_name(dtype)} "
                f"([{info.min}, {info.max}])"
            )
    if not dtype.is_floating_point and raw.is_floating_point():
        # The integers inside [low, high]: a cast would truncate toward zero (-2.5 -> -2 for a
        # high, taking -2 in; 0.5 -> 0 for a low, letting 0 in).
        raw = raw.ceil() if name == "low" else raw.floor()
    tensor = raw.to(dtype)
    try:
        return tensor.expand(shape).clone()
    except RuntimeError as err:
        raise ValueError(
            f"{name} of shape {format_shape(tensor.shape)} does not broadcast to the spec shape "
            f"{format_shape(shape)}"
        ) from err


class Bounded(TensorSpec):
    """Values in the closed box ``[low, high]`` (element-wise).

    Args:
        low: lower bound, a number or a tensor broadcastable to ``shape``.
        high: upper bound, likewise; ``low <= high`` everywhere, both finite.
        shape: full shape, batch dims included (e.g. ``[*B, n_agents, act_dim]``).
        dtype: float or integer dtype (default float32).
        device: default cpu.
    """

    def __init__(
        self,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        shape: ShapeLike = (),
        dtype: torch.dtype = torch.float32,
        device: DeviceLike | None = None,
    ):
        super().__init__(shape, dtype, device)
        if dtype == torch.bool:
            raise TypeError("Bounded does not take dtype bool; use Binary or Categorical(2)")
        self.low = _broadcast_bound(low, self.shape, dtype, self.device, "low")
        self.high = _broadcast_bound(high, self.shape, dtype, self.device, "high")
        if self.dtype.is_floating_point and not (
            torch.isfinite(self.low).all() and torch.isfinite(self.high).all()
        ):
            raise ValueError("Bounded needs finite low and high; use Unbounded for an open domain")
        if (self.low > self.high).any():
            rounded = "" if dtype.is_floating_point else " (integers: low rounded up, high down)"
            raise ValueError(
                f"Bounded needs low <= high everywhere, got low={_short(self.low)}, "
                f"high={_short(self.high)}{rounded}"
            )

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        low, high = self.low.expand(shape), self.high.expand(shape)
        if self.dtype.is_floating_point:
            u = torch.rand(shape, generator=generator, device=self.device, dtype=self.dtype)
            # low * (1 - u) + high * u never forms high - low, which overflows for wide boxes.
            return (low * (1 - u) + high * u).clamp_(min=low, max=high)
        # Offsets in int64, so that high - low cannot wrap around in a narrow dtype.
        u = torch.rand(shape, generator=generator, device=self.device, dtype=torch.float64)
        low64, high64 = low.long(), high.long()
        low_f, high_f = low64.double(), high64.double()
        if bool((high_f - low_f < _EXACT_SPAN).all()):
            span = (high64 - low64).to(torch.float64) + 1.0
            offset = torch.minimum(torch.floor(u * span).long(), high64 - low64)
            return (low64 + offset).clamp(min=low64, max=high64).to(self.dtype)
        # A span of 2**53 or more (an int64 box, e.g. a Gymnasium int Box with the int64 limits
        # as bounds) does not fit in int64 offsets: drawn in float64 between the bounds, on a
        # grid of span / 2**53, kept below 2**63 so that it converts back to int64.
        x = torch.floor(low_f + u * (high_f - low_f + 1.0))
        x = torch.minimum(x.clamp(min=low_f), high_f.clamp(max=_BELOW_2_63))
        return x.long().clamp(min=low64, max=high64).to(self.dtype)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        zeros = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return zeros.clamp(min=self.low.expand(shape), max=self.high.expand(shape))

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        low, high = self.low.expand(value.shape), self.high.expand(value.shape)
        bad = (value < low) | (value > high)
        if bad.any():
            idx = tuple(bad.nonzero()[0].tolist())
            return (
                f"value {value[idx].item()} at index {list(idx)} is outside "
                f"[{low[idx].item()}, {high[idx].item()}]"
            )
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        low, high = self.low.expand(value.shape), self.high.expand(value.shape)
        if value.is_floating_point() and not self.dtype.is_floating_point:
            value = value.round()
        # Clamp before casting: a cast first wraps (int) or overflows (inf -> int) the value.
        common = torch.promote_types(value.dtype, self.dtype)
        value = value.to(common).clamp(min=low.to(common), max=high.to(common))
        return value.to(self.dtype).clamp(min=low, max=high)

    def _params(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high}


def _check_mask(
    mask: torch.Tensor | None, shape: torch.Size, n: int, device: torch.device
) -> torch.Tensor | None:
    return None if mask is None else _expand_mask(mask, shape, n, device).clone()


def _expand_mask(
    mask: torch.Tensor, shape: torch.Size, n: int, device: torch.device
) -> torch.Tensor:
    """``mask`` checked and broadcast (a view) to ``[*shape, n]``."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask))}")
    expected = torch.Size([*shape, n])
    try:
        return mask.to(device).expand(expected)
    except RuntimeError as err:
        raise ValueError(
            f"mask of shape {format_shape(mask.shape)} does not broadcast to "
            f"{format_shape(expected)} (spec shape + [n])"
        ) from err


def _check_classes_fit(n: int, dtype: torch.dtype, what: str) -> None:
    """Raise when class ``n - 1`` is not representable in the integer ``dtype``."""
    if dtype != torch.bool and n - 1 > torch.iinfo(dtype).max:
        raise ValueError(
            f"{what} has classes up to {n - 1}, which do not fit in dtype {_dtype_name(dtype)} "
            f"(max {torch.iinfo(dtype).max})"
        )


def _sample_masked(
    mask: torch.Tensor, generator: torch.Generator | None, what: str
) -> torch.Tensor:
    """Uniform index among the True entries of ``mask`` [..., n] -> [...] int64."""
    flat = mask.reshape(-1, mask.shape[-1])
    if flat.shape[0] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.long, device=mask.device)
    _refuse_empty_rows(flat, what)
    idx = torch.multinomial(flat.float(), 1, generator=generator).squeeze(-1)
    return idx.reshape(mask.shape[:-1])


def _refuse_empty_rows(mask: torch.Tensor, what: str) -> None:
    """Raise a ValueError naming the first row of ``mask`` [..., n] that allows nothing (a meta
    mask holds no values to check)."""
    if mask.device.type == "meta":
        return
    empty = ~mask.any(-1)
    if empty.any():
        row = int(empty.reshape(-1).nonzero()[0].item())
        raise ValueError(f"{what}: the action mask allows no action at flat index {row}")


def _first_allowed(mask: torch.Tensor, what: str) -> torch.Tensor:
    """The first True index of each row of ``mask`` [..., n] -> [...] int64.

    Raises:
        ValueError: a row allows nothing (as :func:`_sample_masked`).
    """
    _refuse_empty_rows(mask, what)
    return mask.int().argmax(-1)


class Categorical(TensorSpec):
    """Integer classes in ``[0, n)``, one per element of ``shape`` (e.g. ``[*B, n_agents]``).

    Done flags use ``Categorical(2, shape, dtype=torch.bool)``.

    Args:
        n: number of classes.
        shape: full shape, batch dims included.
        dtype: integer dtype (default int64) or bool (then ``n == 2``).
        device: default cpu.
        mask: optional bool ``[*shape, n]`` of allowed classes (``rand`` samples among them).
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike = (),
        dtype: torch.dtype = torch.int64,
        device: DeviceLike | None = None,
        mask: torch.Tensor | None = None,
    ):
        super().__init__(shape, dtype, device)
        check_int("n", n, low=1, owner="Categorical")
        if dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"Categorical needs an integer or bool dtype, got {dtype}")
        if dtype == torch.bool and n != 2:
            raise ValueError(f"a bool Categorical has n == 2, got n={n}")
        _check_classes_fit(n, dtype, "Categorical")
        self.n = n
        self.mask = _check_mask(mask, self.shape, n, self.device)

    def update_mask(self, mask: torch.Tensor | None) -> None:
        """Set (or clear with ``None``) the mask of allowed classes, ``[*shape, n]`` bool."""
        self.mask = _check_mask(mask, self.shape, self.n, self.device)

    def rand(
        self,
        shape: ShapeLike = (),
        *,
        generator: torch.Generator | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A random class per element; ``mask`` ([*shape, *self.shape, n] bool) overrides the
        spec's own mask for this call."""
        full = _as_size(shape) + self.shape
        mask = self.mask if mask is None else mask
        if mask is None:
            return self._rand(full, generator)
        mask = _expand_mask(mask, full, self.n, self.device)
        return _sample_masked(mask, generator, "Categorical.rand").to(self.dtype)

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        if self.mask is not None:
            mask = self.mask.expand(*shape, self.n)
            return _sample_masked(mask, generator, "Categorical.rand").to(self.dtype)
        out = torch.randint(0, self.n, shape, generator=generator, device=self.device)
        return out.to(self.dtype)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        if self.mask is not None:
            return _first_allowed(self.mask.expand(*shape, self.n), "Categorical.zero").to(
                self.dtype
            )
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        if self.dtype != torch.bool:
            # In int64: n may not fit the dtype (n = 256 in uint8), and a comparison with it
            # would wrap there.
            bad = (value < 0) | (value.long() >= self.n)
            if bad.any():
                idx = bad.nonzero()[0].tolist()
                return f"class {value[tuple(idx)].item()} at index {idx} is outside [0, {self.n})"
        if self.mask is not None:
            allowed = self.mask.expand(*value.shape, self.n).gather(-1, value.long().unsqueeze(-1))
            if not allowed.all():
                idx = (~allowed.squeeze(-1)).nonzero()[0].tolist()
                return f"class {value[tuple(idx)].item()} at index {idx} is masked out"
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        if value.is_floating_point():
            value = value.round()
        value = value.clamp(0, self.n - 1).to(self.dtype)
        if self.mask is not None:
            mask = self.mask.expand(*value.shape, self.n)
            ok = mask.gather(-1, value.long().unsqueeze(-1)).squeeze(-1)
            first = _first_allowed(mask, "Categorical.project").to(self.dtype)
            value = torch.where(ok, value, first)
        return value

    def _params(self) -> dict[str, Any]:
        return {"n": self.n, "mask": self.mask}

    def _shaped(self, name: str) -> bool:
        return name == "mask"


class OneHot(TensorSpec):
    """One-hot vectors over ``n`` classes; ``shape[-1] == n``.

    Args:
        n: number of classes.
        shape: full shape, default ``[n]`` (e.g. ``[*B, n_agents, n]``).
        dtype: default bool.
        device: default cpu.
        mask: optional bool ``shape`` of allowed classes.
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.bool,
        device: DeviceLike | None = None,
        mask: torch.Tensor | None = None,
    ):
        shape = (n,) if shape is None else shape
        super().__init__(shape, dtype, device)
        check_int("n", n, low=1, owner="OneHot")
        if not self.shape or self.shape[-1] != n:
            raise ValueError(f"OneHot shape must end with n={n}, got {format_shape(self.shape)}")
        self.n = n
        self.mask = _check_mask(mask, self.shape[:-1], n, self.device)

    def update_mask(self, mask: torch.Tensor | None) -> None:
        """Set (or clear with ``None``) the mask of allowed classes (shaped like ``shape``)."""
        self.mask = _check_mask(mask, self.shape[:-1], self.n, self.device)

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        if self.mask is not None:
            idx = _sample_masked(self.mask.expand(shape), generator, "OneHot.rand")
        else:
            idx = torch.randint(0, self.n, shape[:-1], generator=generator, device=self.device)
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        idx = (
            _first_allowed(self.mask.expand(shape), "OneHot.zero")
            if self.mask is not None
            else torch.zeros(shape[:-1], dtype=torch.long, device=self.device)
        )
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        binary = (value == 0) | (value == 1)
        if not binary.all():
            idx = (~binary).nonzero()[0].tolist()
            return f"value {value[tuple(idx)].item()} at index {idx} is not 0 or 1"
        counts = value.long().sum(-1)
        if (counts != 1).any():
            idx = (counts != 1).nonzero()[0].tolist()
            return f"the vector at index {idx} has {counts[tuple(idx)].item()} ones, expected 1"
        if self.mask is not None and not (value.bool() <= self.mask.expand(value.shape)).all():
            return "a one-hot value selects a masked-out class"
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        # Finite scores, so that a masked class (-inf) never ties with an allowed one.
        scores = torch.nan_to_num(value.double())
        if self.mask is not None:
            mask = self.mask.expand(value.shape)
            _refuse_empty_rows(mask, "OneHot.project")
            scores = scores.masked_fill(~mask, -math.inf)
        return torch.nn.functional.one_hot(scores.argmax(-1), self.n).to(self.dtype)

    def _params(self) -> dict[str, Any]:
        return {"n": self.n, "mask": self.mask}

    def _shaped(self, name: str) -> bool:
        return name == "mask"


class MultiCategorical(TensorSpec):
    """Several categorical variables side by side: ``value[..., k]`` in ``[0, nvec[k])``.

    Args:
        nvec: number of classes of each variable, ``[K]``.
        shape: full shape, default ``[K]``; ``shape[-1] == K``.
        dtype: integer dtype (default int64).
        device: default cpu.
    """

    def __init__(
        self,
        nvec: Sequence[int] | torch.Tensor,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.int64,
        device: DeviceLike | None = None,
    ):
        nvec_t = torch.as_tensor(nvec, dtype=torch.int64).reshape(-1)
        shape = (nvec_t.numel(),) if shape is None else shape
        super().__init__(shape, dtype, device)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"MultiCategorical needs an integer dtype, got {dtype}")
        if nvec_t.numel() == 0 or (nvec_t < 1).any():
            raise ValueError(f"MultiCategorical needs nvec entries >= 1, got {nvec_t.tolist()}")
        if not self.shape or self.shape[-1] != nvec_t.numel():
            raise ValueError(
                f"MultiCategorical shape must end with len(nvec)={nvec_t.numel()}, got "
                f"{format_shape(self.shape)}"
            )
        _check_classes_fit(int(nvec_t.max()), dtype, "MultiCategorical")
        self.nvec = nvec_t.to(self.device)

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        u = torch.rand(shape, generator=generator, device=self.device, dtype=torch.float64)
        nvec = self.nvec.expand(shape)
        return torch.minimum(torch.floor(u * nvec).long(), nvec - 1).to(self.dtype)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        nvec = self.nvec.expand(value.shape)
        bad = (value < 0) | (value >= nvec)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            return (
                f"value {value[tuple(idx)].item()} at index {idx} is outside "
                f"[0, {nvec[tuple(idx)].item()})"
            )
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        nvec = self.nvec.expand(value.shape)
        if value.is_floating_point():  # clamp before the cast: inf -> long is undefined
            value = torch.minimum(value.round().clamp(min=0), (nvec - 1).to(value.dtype))
        return torch.minimum(value.long().clamp(min=0), nvec - 1).to(self.dtype)

    def _params(self) -> dict[str, Any]:
        return {"nvec": self.nvec}


class Binary(TensorSpec):
    """``n`` independent binary flags; ``shape[-1] == n``.

    Args:
        n: number of flags.
        shape: full shape, default ``[n]``.
        dtype: default int8 (bool and other integer or float dtypes work too).
        device: default cpu.
    """

    def __init__(
        self,
        n: int,
        shape: ShapeLike | None = None,
        dtype: torch.dtype = torch.int8,
        device: DeviceLike | None = None,
    ):
        shape = (n,) if shape is None else shape
        super().__init__(shape, dtype, device)
        check_int("n", n, low=1, owner="Binary")
        if not self.shape or self.shape[-1] != n:
            raise ValueError(f"Binary shape must end with n={n}, got {format_shape(self.shape)}")
        self.n = n

    def _rand(self, shape: torch.Size, generator: torch.Generator | None) -> torch.Tensor:
        return torch.randint(0, 2, shape, generator=generator, device=self.device).to(self.dtype)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _explain_domain(self, value: torch.Tensor) -> str | None:
        if value.dtype == torch.bool:
            return None
        bad = (value != 0) & (value != 1)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            return f"value {value[tuple(idx)].item()} at index {idx} is not 0 or 1"
        return None

    def _project(self, value: torch.Tensor) -> torch.Tensor:
        return (value > 0.5).to(self.dtype) if value.dtype != torch.bool else value.to(self.dtype)

    def _params(self) -> dict[str, Any]:
        return {"n": self.n}
