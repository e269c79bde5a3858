"""Row gathers for replay sampling: ``[t[index] for t in tensors]`` in one kernel call.

A replay buffer's sample reads a few thousand random rows out of tensors much larger than the
cache, one tensor per key. ``torch.index_select`` copies them one cache miss at a time; the C++
kernel of ``marlkit._C`` (``csrc/include/marlkit/gather.h``) prefetches the rows it will copy a
few iterations later, so that many misses are in flight together: 2.2x the calls per second of
``index_select`` on 4096 random rows of three 10^6-row tensors (``docs/benchmarks.md``). It
copies rows as raw bytes, so it serves every dtype.

Two backends with one contract: ``"native"`` (CPU tensors, contiguous rows) and ``"torch"``
(``index_select`` per tensor, any device; the fallback and the oracle of the agreement tests).
``"auto"`` takes the kernel where it applies.

Example:
    >>> import torch
    >>> from marlkit.native.gather import gather_rows
    >>> obs, reward = torch.arange(10.0).reshape(5, 2), torch.tensor([0, 1, 2, 3, 4])
    >>> rows = gather_rows([obs, reward], torch.tensor([4, 0]))
    >>> rows[0].tolist(), rows[1].tolist()
    ([[8.0, 9.0], [0.0, 1.0]], [4, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from marlkit._checks import check_one_of
from marlkit.native._loader import load_extension, native_or_fallback

__all__ = ["gather_rows", "gather_rows_torch"]

GatherBackend = Literal["auto", "native", "torch"]


def _check_index(index: object) -> torch.Tensor:
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.dim() != 1:
        got = (
            f"{index.dtype} {list(index.shape)}"
            if isinstance(index, torch.Tensor)
            else type(index).__name__
        )
        raise TypeError(f"gather_rows: index must be an int64 tensor [B], got {got}")
    return index


def _check_rows(tensors: Sequence[torch.Tensor]) -> int:
    """The number of rows every tensor has (-1 for no tensors), or TypeError / ValueError."""
    rows = -1
    for position, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
            raise TypeError(
                f"gather_rows: tensors[{position}] must be a tensor with rows along dim 0"
            )
        if rows < 0:
            rows = tensor.shape[0]
        elif tensor.shape[0] != rows:
            raise ValueError(
                f"gather_rows: tensors[{position}] has {tensor.shape[0]} rows, tensors[0] {rows}"
            )
    return rows


def _check_range(index: torch.Tensor, rows: int) -> None:
    if index.numel() and rows >= 0:
        low, high = (int(v) for v in torch.aminmax(index))
        if low < 0 or high >= rows:
            position = int(((index < 0) | (index >= rows)).nonzero()[0, 0])
            raise IndexError(
                f"index {int(index[position])} at position {position} is out of range for "
                f"{rows} rows"
            )


def gather_rows_torch(tensors: Sequence[torch.Tensor], index: torch.Tensor) -> list[torch.Tensor]:
    """The torch twin of :func:`gather_rows`: ``index_select`` along dim 0 per tensor."""
    _check_range(_check_index(index), _check_rows(tensors))
    return [torch.index_select(t, 0, index.to(t.device)) for t in tensors]


# Dtypes NumPy lacks, crossed as an integer dtype of the same size (the kernel copies bytes).
_AS_NUMPY = {torch.bfloat16: torch.int16}
_NUMPY_DTYPES = {
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
}  # fmt: skip


def _as_array(tensor: torch.Tensor) -> np.ndarray | None:
    """A zero-copy NumPy view of a contiguous CPU tensor, or None where the kernel cannot take
    it (other devices, strides, autograd, a dtype with no NumPy twin)."""
    if tensor.device.type != "cpu" or tensor.requires_grad or not tensor.is_contiguous():
        return None
    if tensor.dtype in _NUMPY_DTYPES:
        return tensor.numpy()
    same_size = _AS_NUMPY.get(tensor.dtype)
    return None if same_size is None else tensor.view(same_size).numpy()


def gather_rows(
    tensors: Sequence[torch.Tensor], index: torch.Tensor, backend: GatherBackend = "auto"
) -> list[torch.Tensor]:
    """``[t[index] for t in tensors]``: new tensors of ``index.numel()`` rows each.

    Args:
        tensors: tensors with the same number of rows along dim 0 (any dtypes and feature
            shapes).
        index: int64 ``[B]``, each in ``[0, rows)``.
        backend: ``"native"`` (the C++ kernel: contiguous CPU tensors), ``"torch"``
            (``index_select``) or ``"auto"`` (the kernel where it applies, else torch).

    Raises:
        IndexError: an index outside ``[0, rows)``, naming it and its position.
        TypeError / ValueError: a non-int64 or non-1-D index, tensors with different numbers of
            rows, or ``backend="native"`` on tensors the kernel does not take.
    """
    check_one_of("backend", backend, ("auto", "native", "torch"), owner="gather_rows")
    if backend == "torch":
        return gather_rows_torch(tensors, index)
    _check_rows(tensors)
    arrays = [_as_array(t) for t in tensors]
    applies = _check_index(index).device.type == "cpu" and all(a is not None for a in arrays)
    if backend == "native" and not applies:
        raise ValueError(
            "gather_rows: backend='native' needs contiguous CPU tensors (not requiring grad) "
            "of a dtype NumPy has, or bfloat16"
        )
    if not applies or (backend == "auto" and not native_or_fallback("gather_rows")):
        return gather_rows_torch(tensors, index)
    count = index.numel()
    outputs = [torch.empty((count, *t.shape[1:]), dtype=t.dtype) for t in tensors]
    # The kernel checks every index (IndexError with the twin's message) before it copies.
    load_extension().gather_rows(
        arrays, index.contiguous().numpy(), [_as_array(o) for o in outputs]
    )
    return outputs
