"""Large CPU tensors read at random, on transparent huge pages where Linux offers them.

A replay storage of 10^6 items spans hundreds of MB, and a sample reads a few thousand random
rows of it: with 4 KiB pages each row costs a TLB miss and a page walk besides its cache miss.
Backed by 2 MiB pages, the whole storage fits the TLB. Linux backs memory with huge pages when
the region is advised (``madvise(MADV_HUGEPAGE)``, the only way under the common ``madvise``
setting of ``/sys/kernel/mm/transparent_hugepage/enabled``) before its pages are first touched.
:func:`zeros` maps a fresh region of its own for large tensors (2 MiB-aligned, advised, then
faulted in; unmapped when the tensor is freed); ``TensorStorage`` allocates its CPU slots with
it. Memory from the allocator would not do: glibc serves a large block from a free chunk of its
heap when one fits, and those pages were touched long before (seen in a long test run, where a
64 MiB tensor came out of ``[heap]`` with no huge page). Measured on ``benchmarks/replay.py``'s
storage (10^6 rows of 37 floats, 4096 random rows gathered): 250 -> 193 us on 1 thread,
205 -> 150-163 us on 2 (``docs/benchmarks.md``).

The advice only changes speed: values, shapes and strides are those of ``torch.zeros``. Where
it cannot apply (another OS, ``enabled`` set to ``never``, tensors under 4 MiB, the extension
not built) the tensor is an ordinary ``torch.zeros``. The kernel grants huge pages where it has
free 2 MiB blocks; where it has none the tensor runs on 4 KiB pages, and ``khugepaged`` may
merge them later in the background.

Example:
    >>> import torch
    >>> from marlkit.native.memory import zeros
    >>> slots = zeros((1000, 8), torch.float32)
    >>> bool(slots.eq(0).all()), slots.shape
    (True, torch.Size([1000, 8]))
"""

from __future__ import annotations

import functools
import math
import pathlib
import sys
from collections.abc import Sequence

import torch

from marlkit.native._loader import extension_available, load_extension

__all__ = ["HUGE_PAGES_FROM", "advise_huge_pages", "huge_pages_possible", "zeros"]

#: Tensors from this many bytes up are advised (smaller ones hold no or one huge page).
HUGE_PAGES_FROM = 4 << 20

_THP_SETTING = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def advise_huge_pages(tensor: torch.Tensor) -> int:
    """Advise Linux to back ``tensor``'s whole 2 MiB pages with huge pages; returns the bytes
    advised (0 where it cannot: not Linux, no transparent huge pages, no whole huge page in the
    tensor, the extension not built). Pages already touched keep 4 KiB pages, so advise a fresh
    ``torch.empty`` and write it afterwards, as :func:`zeros` does.

    Raises:
        TypeError: ``tensor`` is not a tensor.
        ValueError: it is not a contiguous CPU tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"advise_huge_pages: expected a tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(
            f"advise_huge_pages: expected a contiguous CPU tensor, got one on {tensor.device} "
            f"with strides {tensor.stride()}"
        )
    if tensor.numel() == 0 or not extension_available():
        return 0
    raw = tensor.detach().view(-1).view(torch.uint8)  # every dtype, as its bytes
    return int(load_extension().advise_huge_pages(raw.numpy()))


def huge_pages_possible() -> bool:
    """Whether :func:`zeros` maps its large tensors for huge pages here: Linux, transparent
    huge pages not set to ``never``, and the extension built."""
    return _thp_enabled() and extension_available()


@functools.cache
def _thp_enabled() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        setting = _THP_SETTING.read_text()
    except OSError:  # a kernel without THP
        return False
    return "[never]" not in setting


def zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype)`` on the CPU; from :data:`HUGE_PAGES_FROM` bytes, in a
    fresh mapping advised for huge pages where Linux offers them (the module's notes).

    Raises:
        MemoryError: the kernel cannot map the tensor's bytes.
    """
    shape = tuple(shape)
    probe = torch.empty(0, dtype=dtype)  # checks the dtype, and gives its element size
    nbytes = math.prod(shape) * probe.element_size()
    if nbytes < HUGE_PAGES_FROM or min(shape) < 0 or not huge_pages_possible():
        return torch.zeros(shape, dtype=dtype)  # which names a bad shape
    try:
        mapped = load_extension().huge_zeros(nbytes)  # uint8 [nbytes], owns its mapping
    except MemoryError as err:
        raise MemoryError(
            f"zeros: the kernel cannot map {nbytes} bytes for a {dtype} tensor of shape "
            f"{list(shape)}"
        ) from err
    return torch.from_numpy(mapped).view(dtype).view(shape)
