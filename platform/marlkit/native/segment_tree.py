"""Segment trees for prioritized replay: :class:`SumSegmentTree` and :class:`MinSegmentTree`.

A sum tree samples indices in proportion to their priority (``scan_lower_bound`` on uniform
masses in ``[0, total)``); a min tree gives the smallest priority, for importance weights.

Two backends with one contract:

* ``"native"``: the C++ kernels of ``marlkit._C`` (``csrc/include/marlkit/segment_tree.h``):
  leaves in 16-value blocks (one cache line of float32) under a 16-ary tree whose sum nodes
  hold their children's running sums, so a sample compares 16 sums at once per level;
  about 1.13 values per leaf for sum trees and 1.07 for min trees (453 MB in float32 at
  capacity ``10**8``).
  ``update`` and ``scan_lower_bound`` are ``O(B log capacity)`` per batch of ``B``, indexing
  ``O(B)``, ``query`` ``O(log capacity)``, ``total()`` / ``min()`` ``O(1)``. CPU only.
* ``"torch"``: a flat ``[capacity]`` tensor; reductions are tensor reductions and
  ``scan_lower_bound`` is ``cumsum`` + ``searchsorted`` (``O(capacity)`` per call). It runs on any
  device and is the agreement oracle of the native kernels.

``backend="auto"`` (the default) picks the native kernels on CPU and the torch twin elsewhere;
on CPU without a usable extension it logs a warning and uses the torch twin.

Contract (both backends):

* Indices are integers in ``[0, capacity)``; others raise ``IndexError`` naming the index, its
  position in the (flattened) batch and the capacity. No negative-index wrap-around.
* Priorities are finite and ``>= 0``; a negative, NaN or infinite priority raises ``ValueError``
  naming the value and its position. Values are converted to the tree's dtype first, so a
  float64 value beyond the float32 range is reported as ``inf`` by a float32 tree.
* Every batch is validated whole before anything is written: after an error the tree is
  unchanged.
* Within one ``update`` a repeated index keeps the value of its last occurrence.
* Leaves never written hold the neutral element: ``0`` in a sum tree, ``+inf`` in a min tree
  (so ``min()`` of an empty min tree is ``inf``). Users may not write ``inf`` themselves.

Prioritized replay's two steps on a (sum, min) pair, :func:`prioritized_update` (check, then
write ``(priority + eps) ** alpha`` into both trees) and :func:`prioritized_sample` (indices and
importance weights), are one kernel call each when both trees are native.

Thread safety: the native trees lock internally (updates exclusive, reads shared), so calls from
several Python threads are safe; the torch twin has no lock.

Example:
    >>> import torch
    >>> from marlkit.native.segment_tree import MinSegmentTree, SumSegmentTree
    >>> tree = SumSegmentTree(8)
    >>> tree.update(torch.tensor([0, 3, 5]), torch.tensor([1.0, 2.0, 1.0]))
    >>> tree.total()
    4.0
    >>> tree.scan_lower_bound(torch.tensor([0.0, 0.99, 1.0, 2.5, 3.0]))
    tensor([0, 0, 3, 3, 5])
    >>> tree.query(0, 4)
    3.0
    >>> lowest = MinSegmentTree(8)
    >>> lowest.update([2, 6], 0.5)
    >>> lowest.min(), lowest.query(3, 6)
    (0.5, inf)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, TypeGuard

import numpy as np
import torch

from marlkit._checks import check_int, check_one_of
from marlkit.native._loader import load_extension, native_or_fallback

__all__ = [
    "MAX_CAPACITY",
    "MinSegmentTree",
    "SegmentTreeBackend",
    "SumSegmentTree",
    "prioritized_sample",
    "prioritized_update",
]

#: Largest capacity a segment tree accepts (both backends).
MAX_CAPACITY = 100_000_000

#: Backend names accepted by the constructors.
SegmentTreeBackend = Literal["auto", "native", "torch"]

IndexLike = torch.Tensor | np.ndarray | Sequence[int] | int
ValueLike = torch.Tensor | np.ndarray | Sequence[float] | float

_Op = Literal["sum", "min"]
_DTYPES = (torch.float32, torch.float64)
_NATIVE_CLASSES = {
    ("sum", torch.float32): "SumSegmentTreeFp32",
    ("sum", torch.float64): "SumSegmentTreeFp64",
    ("min", torch.float32): "MinSegmentTreeFp32",
    ("min", torch.float64): "MinSegmentTreeFp64",
}


# --------------------------------------------------------------------------------------------
# Checks and messages shared with the C++ kernels (the texts match csrc/.../segment_tree.h).
# --------------------------------------------------------------------------------------------


def _format_stored(value: torch.Tensor) -> str:
    """Shortest round-trip text of one element in its own dtype, as the kernels write it:
    ``0.1`` for float32 0.1 (not ``0.10000000149011612``), ``nan``, ``inf``, ``1e-05``."""
    item = float(value.detach().cpu().reshape(()).item())
    if value.dtype == torch.float32:
        item = float(str(np.float32(item)))
    return repr(item)


def _index_error(index: int, position: int, capacity: int) -> IndexError:
    return IndexError(
        f"index {index} at position {position} is out of range for a segment tree of capacity "
        f"{capacity} (expected 0 <= index < {capacity})"
    )


def _check_indices(indices: torch.Tensor, capacity: int) -> None:
    bad = (indices < 0) | (indices >= capacity)
    if bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        raise _index_error(int(indices[position]), position, capacity)


def _first_invalid(values: torch.Tensor) -> int | None:
    bad = ~torch.isfinite(values) | (values < 0)
    if bool(bad.any()):
        return int(bad.nonzero()[0, 0])
    return None


def _check_priorities(values: torch.Tensor) -> None:
    position = _first_invalid(values)
    if position is not None:
        raise ValueError(
            f"priority {_format_stored(values[position])} at position {position} is invalid: "
            "priorities must be finite and >= 0"
        )


def _check_masses(values: torch.Tensor) -> None:
    position = _first_invalid(values)
    if position is not None:
        raise ValueError(
            f"prefix-sum value {_format_stored(values[position])} at position {position} is "
            "invalid: expected a finite value >= 0"
        )


def _check_query_range(start: int, end: int, capacity: int) -> None:
    if not 0 <= start < capacity:
        raise IndexError(
            f"query start {start} is out of range for a segment tree of capacity {capacity} "
            f"(expected 0 <= start < {capacity})"
        )
    if not 0 < end <= capacity:
        raise IndexError(
            f"query end {end} is out of range for a segment tree of capacity {capacity} "
            f"(expected 0 < end <= {capacity}, end exclusive)"
        )
    if start >= end:
        raise ValueError(
            f"query range [{start}, {end}) is empty: expected start < end (end is exclusive)"
        )


def _zero_total_error(total: torch.Tensor) -> ValueError:
    return ValueError(
        "scan_lower_bound needs a positive total priority, but the tree's total is "
        f"{_format_stored(total)} (every priority is zero)"
    )


# --------------------------------------------------------------------------------------------
# Input conversion: anything index-like or value-like to a flat contiguous tensor.
# --------------------------------------------------------------------------------------------


def _to_tensor(data: Any, what: str) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data.detach()
    if isinstance(data, (bool, np.bool_)):
        raise TypeError(f"{what} must be numbers, got a bool")
    array = np.asarray(data)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be numbers, got a numpy array of dtype {array.dtype}")
    if array.size == 0:
        array = array.astype(np.int64)  # an empty list reads as float64 in numpy
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = array.copy(order="C")  # torch.from_numpy warns on read-only memory
    return torch.from_numpy(array)


def _as_indices(indices: IndexLike, device: torch.device) -> torch.Tensor:
    """``indices`` (any shape) as a tensor of int64 on ``device``, its original shape kept."""
    tensor = _to_tensor(indices, "indices")
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise TypeError(f"indices must be integers, got dtype {tensor.dtype}")
    return tensor.to(device=device, dtype=torch.int64)


def _as_values(
    values: ValueLike, dtype: torch.dtype, device: torch.device, what: str
) -> torch.Tensor:
    """``values`` (any shape) as a tensor of ``dtype`` on ``device``, its original shape kept."""
    tensor = _to_tensor(values, what)
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{what} must be real numbers, got dtype {tensor.dtype}")
    return tensor.to(device=device, dtype=dtype)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).contiguous()


def _plain_vector(data: Any, dtype: torch.dtype) -> TypeGuard[torch.Tensor]:
    """True for a 1-D contiguous CPU tensor of exactly ``dtype`` outside autograd: the native
    kernels can take its memory as it is. (The fast path of the native trees: about 1 us of
    checks instead of several torch calls for conversion and reshaping.)"""
    return (
        type(data) is torch.Tensor
        and data.dtype == dtype
        and data.dim() == 1
        and data.is_cpu
        and not data.requires_grad
        and data.is_contiguous()
    )


# --------------------------------------------------------------------------------------------
# Backends: flat [N] tensors in, flat tensors out.
# --------------------------------------------------------------------------------------------


class _NativeImpl:
    """The ``marlkit._C`` tree; takes contiguous CPU tensors and shares their memory."""

    name: Literal["native", "torch"] = "native"
    tree: Any  # the extension object (SumSegmentTreeFp32, ...)

    def __init__(self, capacity: int, dtype: torch.dtype, op: _Op) -> None:
        extension = load_extension()
        self.tree = getattr(extension, _NATIVE_CLASSES[(op, dtype)])(capacity)
        self._reduce_all = self.tree.total if op == "sum" else self.tree.min

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        self.tree.update(indices.numpy(), values.numpy())

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.tree.get(indices.numpy()))

    def query(self, start: int, end: int) -> float:
        return float(self.tree.query(start, end))

    def reduce_all(self) -> float:
        return float(self._reduce_all())

    def scan(self, values: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.tree.scan_lower_bound(values.numpy()))


class _TorchImpl:
    """Pure-torch twin: one flat ``[capacity]`` tensor on any device."""

    name: Literal["native", "torch"] = "torch"

    def __init__(self, capacity: int, dtype: torch.dtype, op: _Op, device: torch.device) -> None:
        self._capacity = capacity
        self._op = op
        neutral = 0.0 if op == "sum" else float("inf")
        self._values = torch.full((capacity,), neutral, dtype=dtype, device=device)

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        _check_indices(indices, self._capacity)
        _check_priorities(values)
        if indices.numel() == 0:
            return
        indices, values = _last_write_wins(indices, values)
        self._values[indices] = values

    def get(self, indices: torch.Tensor) -> torch.Tensor:
        _check_indices(indices, self._capacity)
        return self._values[indices]

    def query(self, start: int, end: int) -> float:
        _check_query_range(start, end, self._capacity)
        segment = self._values[start:end]
        return float(segment.sum() if self._op == "sum" else segment.min())

    def reduce_all(self) -> float:
        return float(self._values.sum() if self._op == "sum" else self._values.min())

    def scan(self, values: torch.Tensor) -> torch.Tensor:
        _check_masses(values)
        if values.numel() == 0:
            return torch.empty(0, dtype=torch.int64, device=values.device)
        cumulative = torch.cumsum(self._values, 0)
        total = cumulative[-1]
        if not bool(total > 0):
            raise _zero_total_error(total)
        # Smallest i with cumulative[i] > v; such an i has a nonzero priority.
        found = torch.searchsorted(cumulative, values, right=True)
        beyond = found >= self._capacity  # v >= total
        if bool(beyond.any()):
            last_nonzero = self._values.nonzero()[-1, 0]
            found = torch.where(beyond, last_nonzero, found)
        return found


def _last_write_wins(
    indices: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop all but the last occurrence of each repeated index (``index_put_`` leaves the winner
    of duplicates unspecified)."""
    unique, inverse = torch.unique(indices, return_inverse=True)
    if unique.numel() == indices.numel():
        return indices, values
    positions = torch.arange(indices.numel(), device=indices.device)
    last = torch.full_like(unique, -1).scatter_reduce_(0, inverse, positions, reduce="amax")
    return unique, values[last]


# --------------------------------------------------------------------------------------------
# Public classes.
# --------------------------------------------------------------------------------------------


class _SegmentTree:
    """Shared front end of :class:`SumSegmentTree` and :class:`MinSegmentTree`."""

    _op: ClassVar[_Op]

    def __init__(
        self,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        backend: SegmentTreeBackend = "auto",
        device: torch.device | str = "cpu",
    ) -> None:
        capacity = check_int("capacity", capacity)
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(
                f"segment tree capacity must be in [1, {MAX_CAPACITY}], got {capacity}"
            )
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        device = torch.device(device)
        self._capacity = capacity
        self._dtype = dtype
        self._device = device
        self._impl = self._make_impl(backend)
        # The extension object itself, for the fast paths of plain 1-D CPU tensors.
        self._native = self._impl.tree if isinstance(self._impl, _NativeImpl) else None

    def _make_impl(self, backend: str) -> _NativeImpl | _TorchImpl:
        on_cpu = self._device.type == "cpu"
        if backend == "native":
            if not on_cpu:
                raise ValueError(
                    f"backend='native' runs on CPU only, got device {self._device}; "
                    "use backend='torch' or 'auto' there"
                )
            return _NativeImpl(self._capacity, self._dtype, self._op)
        if backend == "torch":
            return _TorchImpl(self._capacity, self._dtype, self._op, self._device)
        check_one_of("backend", backend, ("auto", "native", "torch"), owner=type(self).__name__)
        if on_cpu and native_or_fallback(type(self).__name__):
            return _NativeImpl(self._capacity, self._dtype, self._op)
        return _TorchImpl(self._capacity, self._dtype, self._op, self._device)

    @property
    def capacity(self) -> int:
        """Number of leaves (valid indices are ``0 <= i < capacity``)."""
        return self._capacity

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the stored priorities (``torch.float32`` or ``torch.float64``)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Device of the returned tensors (and of the storage, for the torch twin)."""
        return self._device

    @property
    def backend(self) -> Literal["native", "torch"]:
        """The backend in use, after resolving ``"auto"``."""
        return self._impl.name

    def __len__(self) -> int:
        return self._capacity

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, dtype={self._dtype}, "
            f"backend={self.backend!r}, device={str(self._device)!r})"
        )

    def update(self, indices: IndexLike, values: ValueLike) -> None:
        """Set the priorities of ``indices`` to ``values``.

        Args:
            indices: int ``[*B]`` (tensor, array, list or int), each in ``[0, capacity)``.
            values: real ``[*B]`` (the same shape as ``indices``) or a scalar (0-d) broadcast to
                every index; converted to :attr:`dtype`; each finite and ``>= 0``. A repeated
                index keeps the value of its last occurrence (in flattened order).

        Raises:
            IndexError: an index outside ``[0, capacity)``.
            ValueError: a negative, NaN or infinite value, or shapes that differ.
            TypeError: non-integer indices or non-real values.

        The batch is checked whole first; on any error nothing is written.
        """
        native = self._native
        if (
            native is not None
            and _plain_vector(indices, torch.int64)
            and _plain_vector(values, self._dtype)
            and indices.numel() == values.numel()
        ):
            native.update(indices.numpy(), values.numpy())  # the kernel checks every item
            return
        index = _as_indices(indices, self._impl_device)
        value = _as_values(values, self._dtype, self._impl_device, "values")
        if value.dim() == 0:
            value = value.expand(index.shape)
        elif value.shape != index.shape:
            raise ValueError(
                f"indices and values must have the same shape (or values a scalar), got "
                f"indices {tuple(index.shape)} and values {tuple(value.shape)}"
            )
        self._impl.update(_flat(index), _flat(value))

    def __setitem__(self, indices: IndexLike, values: ValueLike) -> None:
        """``tree[indices] = values`` is :meth:`update`."""
        self.update(indices, values)

    def __getitem__(self, indices: IndexLike) -> torch.Tensor:
        """Priorities at ``indices`` (int ``[*B]``), as :attr:`dtype` ``[*B]``.

        Raises:
            IndexError: an index outside ``[0, capacity)`` (no negative wrap-around).
        """
        native = self._native
        if native is not None and _plain_vector(indices, torch.int64):
            return torch.from_numpy(native.get(indices.numpy()))  # the kernel checks each index
        index = _as_indices(indices, self._impl_device)
        out = self._impl.get(_flat(index))
        return out.reshape(index.shape).to(self._device)

    def query(self, start: int = 0, end: int | None = None) -> float:
        """The reduction (sum or min) of the priorities in ``[start, end)``, end exclusive.

        Args:
            start: first index, ``0 <= start < capacity``.
            end: one past the last index, ``start < end <= capacity``; ``None`` means capacity.

        Raises:
            IndexError: ``start`` or ``end`` out of range.
            ValueError: an empty range (``start >= end``).
        """
        start = check_int("start", start)
        end = self._capacity if end is None else check_int("end", end)
        return self._impl.query(start, end)

    @property
    def _impl_device(self) -> torch.device:
        return torch.device("cpu") if isinstance(self._impl, _NativeImpl) else self._device


class SumSegmentTree(_SegmentTree):
    """Sum tree over ``capacity`` priorities, for sampling in proportion to priority.

    Args:
        capacity: number of leaves, ``1 <= capacity <= 10**8``. The native tree holds about
            1.13 values per leaf (453 MB in float32 at ``10**8``).
        dtype: ``torch.float32`` or ``torch.float64``.
        backend: ``"native"`` (C++, CPU), ``"torch"`` (flat tensor + cumsum/searchsorted, any
            device) or ``"auto"`` (native on CPU when the extension loads, else torch).
        device: where returned tensors live (and the storage of the torch twin).

    Every leaf starts at 0. See the module docstring for the error contract.
    """

    _op = "sum"

    def total(self) -> float:
        """Sum of all priorities (``O(1)`` native, ``O(capacity)`` torch)."""
        return self._impl.reduce_all()

    def scan_lower_bound(self, values: ValueLike) -> torch.Tensor:
        """Indices whose prefix sums bracket each mass: the sampling step of prioritized replay.

        For each mass ``v``, returns the smallest index ``i`` with
        ``priority[0] + ... + priority[i] > v`` (inclusive prefix sum strictly above ``v``), that
        is ``prefix(i - 1) <= v < prefix(i)``; such an ``i`` always has a nonzero priority, so a
        zero-priority item is never sampled. Masses ``v >= total()`` (e.g. ``u * total()`` that
        rounded up) give the last index with a nonzero priority. Sampling in proportion to
        priority is ``scan_lower_bound(torch.rand(B) * tree.total())``.

        Args:
            values: masses ``[*B]``, each finite and ``>= 0``, converted to :attr:`dtype`.

        Returns:
            int64 ``[*B]`` indices in ``[0, capacity)``.

        Raises:
            ValueError: a negative, NaN or infinite mass, or a total of 0 with ``B > 0``.

        Prefix sums are the tree's own (native: node and block sums; torch: ``cumsum``), so with
        float32 the two backends can differ for masses within rounding of a boundary.
        """
        native = self._native
        if native is not None and _plain_vector(values, self._dtype):
            return torch.from_numpy(native.scan_lower_bound(values.numpy()))
        mass = _as_values(values, self._dtype, self._impl_device, "values")
        out = self._impl.scan(_flat(mass))
        return out.reshape(mass.shape).to(self._device)


class MinSegmentTree(_SegmentTree):
    """Min tree over ``capacity`` priorities, for the smallest priority (importance weights).

    Args:
        capacity: number of leaves, ``1 <= capacity <= 10**8``. The native tree holds about
            1.07 values per leaf.
        dtype: ``torch.float32`` or ``torch.float64``.
        backend: ``"native"`` (C++, CPU), ``"torch"`` (flat tensor, any device) or ``"auto"``.
        device: where returned tensors live (and the storage of the torch twin).

    Every leaf starts at ``+inf``, the neutral element of ``min``; writing ``inf`` is an error
    like any non-finite priority. See the module docstring for the error contract.
    """

    _op = "min"

    def min(self) -> float:
        """Smallest priority (``inf`` while nothing was written); ``O(1)`` native."""
        return self._impl.reduce_all()


# --------------------------------------------------------------------------------------------
# Prioritized replay's two steps on a (sum, min) pair, each one native call when both are native.
# --------------------------------------------------------------------------------------------


def _native_pair(total: SumSegmentTree, lowest: MinSegmentTree) -> tuple[Any, Any] | None:
    if total._native is None or lowest._native is None or total.dtype != lowest.dtype:
        return None
    return total._native, lowest._native


def prioritized_update(
    total: SumSegmentTree,
    lowest: MinSegmentTree,
    indices: torch.Tensor,
    priorities: torch.Tensor,
    *,
    length: int,
    eps: float,
    alpha: float,
) -> float:
    """Write ``(priorities + eps) ** alpha`` at ``indices`` into both trees: prioritized
    replay's priority update.

    Args:
        total, lowest: the sum and min trees of one sampler (same capacity and dtype).
        indices: int64 ``[B]``, each in ``[0, length)``.
        priorities: ``[B]`` in the trees' dtype, each finite and ``>= 0``.
        length: how many slots hold items.
        eps, alpha: the sampler's ``eps`` and ``alpha``.

    Returns:
        The largest priority of the batch (``-inf`` for an empty one).

    Raises:
        IndexError: an index outside ``[0, length)``.
        ValueError: a negative, NaN or infinite priority, or lengths that differ.
        Nothing is written when any of these is raised.
    """
    pair = _native_pair(total, lowest)
    if (
        pair is not None
        and _plain_vector(indices, torch.int64)
        and _plain_vector(priorities, total.dtype)
    ):
        extension = load_extension()
        return float(
            extension.prioritized_update(
                *pair, indices.numpy(), priorities.numpy(), length, eps, alpha
            )
        )
    if priorities.numel() != indices.numel():
        raise ValueError(
            f"update_priority: {indices.numel()} indices but {priorities.numel()} priorities"
        )
    if not indices.numel():
        return -math.inf
    low, high = (int(v) for v in torch.aminmax(indices))
    if low < 0 or high >= length:
        raise IndexError(
            f"update_priority: index {low if low < 0 else high} is out of range for {length} "
            "stored items (nothing was updated)"
        )
    low_p, high_p = torch.aminmax(priorities)  # one pass; a NaN anywhere makes both NaN
    if not (bool(low_p >= 0) and bool(high_p < math.inf)):
        bad = ~(priorities >= 0) | (priorities == math.inf)  # NaN compares False
        where = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(
            f"priority {float(priorities.reshape(-1)[where])} at position {where} is not a "
            "finite number >= 0 (nothing was updated)"
        )
    value = (priorities.to(total.dtype) + eps).pow_(alpha)
    total.update(indices, value)
    lowest.update(indices, value)
    return float(high_p)


def prioritized_sample(
    total: SumSegmentTree, lowest: MinSegmentTree, uniforms: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample in proportion to priority: prioritized replay's sampling step.

    Args:
        total, lowest: the sum and min trees of one sampler.
        uniforms: ``[B]`` in ``[0, 1)`` of the trees' dtype (the sampler's random draws).
        beta: how much the importance weights correct.

    Returns:
        ``index`` int64 ``[B]`` (``total.scan_lower_bound(uniforms * total.total())``) and
        ``weight`` float32 ``[B]``: ``(N p_i / sum)^-beta`` over its largest possible value
        ``(N min(p) / sum)^-beta``, that is ``(p_i / min(p))^-beta``, in ``(0, 1]``.

    Raises:
        ValueError: as :meth:`SumSegmentTree.scan_lower_bound` (a total of 0).
    """
    pair = _native_pair(total, lowest)
    if pair is not None and _plain_vector(uniforms, total.dtype):
        index, weight = load_extension().prioritized_sample(*pair, uniforms.numpy(), beta)
        return torch.from_numpy(index), torch.from_numpy(weight)
    index = total.scan_lower_bound(uniforms * total.total())
    weight = total[index].div_(lowest.min()).pow_(-beta)
    return index, weight.to(torch.float32)
